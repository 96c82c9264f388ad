"""The module d3fleet.fleet.state_files (the d3_state role's records: drain records and lease on a router, the rollout
marker on a host) run in this process: root-owned files written atomically only when they differ, removed, the
directory made and kept, check mode and diff that tell the truth, bad arguments refused before anything is written."""

from __future__ import annotations

import importlib
import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest
from testkit import run_module

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "collections/ansible_collections/d3fleet/fleet/plugins/modules"))
state_files = importlib.import_module("state_files")

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the files are root's (chown 0:0)")


def run(capsys: pytest.CaptureFixture[str], **args: Any) -> dict[str, Any]:
    return run_module(state_files, capsys, **args)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_files_are_written_root_only_then_left_alone_until_they_differ(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "drains"
    d.mkdir(mode=0o700)
    files = [{"name": "be_a--h1-a.json", "content": '{"a": 1}\n'}, {"name": "be_b--h1-b.json", "content": "b"}]
    first = run(capsys, dir=str(d), files=files)
    assert first["changed"] and first["written"] == [str(d / "be_a--h1-a.json"), str(d / "be_b--h1-b.json")]
    assert first["removed"] == [] and "diff" not in first
    assert (d / "be_a--h1-a.json").read_text() == '{"a": 1}\n' and (d / "be_b--h1-b.json").read_text() == "b"
    assert {(p.name, mode(p), p.stat().st_uid, p.stat().st_gid) for p in d.iterdir()} == {
        ("be_a--h1-a.json", 0o600, 0, 0), ("be_b--h1-b.json", 0o600, 0, 0)}  # no temporary file left
    again = run(capsys, dir=str(d), files=files)
    assert (again["changed"], again["written"]) == (False, [])
    os.chmod(d / "be_b--h1-b.json", 0o644)  # the mode alone differs
    (d / "be_a--h1-a.json").write_text('{"a": 2}\n')  # the content alone differs
    fixed = run(capsys, dir=str(d), files=files)
    assert fixed["changed"] and sorted(fixed["written"]) == [str(d / "be_a--h1-a.json"), str(d / "be_b--h1-b.json")]
    assert (d / "be_a--h1-a.json").read_text() == '{"a": 1}\n' and mode(d / "be_b--h1-b.json") == 0o600
    assert mode(d) == 0o700  # no dir_mode: the directory is left as it is


def test_a_file_of_another_owner_is_written_again(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "lease.json"
    path.write_text("x")
    os.chmod(path, 0o600)
    for owner in ((1, 0), (0, 1)):
        os.chown(path, *owner)
        result = run(capsys, dir=str(tmp_path), files=[{"name": "lease.json", "content": "x"}])
        assert result["written"] == [str(path)] and (path.stat().st_uid, path.stat().st_gid) == (0, 0)


def test_the_mode_given_is_the_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = run(capsys, dir=str(tmp_path), files=[{"name": "rollout-in-progress", "content": "{}"}], mode="0644")
    assert result["changed"] and mode(tmp_path / "rollout-in-progress") == 0o644
    assert not run(capsys, dir=str(tmp_path), files=[{"name": "rollout-in-progress", "content": "{}"}], mode="0644")["changed"]


def test_dir_mode_makes_the_directory_and_keeps_its_mode_and_owner(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "var" / "lib" / "d3"
    files = [{"name": "rollout-lease.json", "content": "{}\n"}]
    made = run(capsys, dir=str(d), dir_mode="0755", files=files)
    assert made["changed"] and mode(d) == 0o755 and (d / "rollout-lease.json").read_text() == "{}\n"
    assert not run(capsys, dir=str(d), dir_mode="0755", files=files)["changed"]
    os.chmod(d, 0o777)
    assert run(capsys, dir=str(d), dir_mode="0755", files=files)["changed"] and mode(d) == 0o755
    assert run(capsys, dir=str(d), dir_mode="0755", files=files)["changed"] is False
    os.chown(d, 1, 1)
    assert run(capsys, dir=str(d), dir_mode="0755", files=files)["changed"] and (d.stat().st_uid, d.stat().st_gid) == (0, 0)
    os.chown(d, 0, 1)
    assert run(capsys, dir=str(d), dir_mode="0755", files=files)["changed"] and d.stat().st_gid == 0
    # nothing to write, only the directory: it is made too
    e = tmp_path / "router-drains"
    assert run(capsys, dir=str(e), dir_mode="0700", files=[])["changed"] and mode(e) == 0o700


def test_without_dir_mode_a_missing_directory_fails_and_nothing_is_made(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "router-drains"
    result = run(capsys, dir=str(d), files=[{"name": "a.json", "content": "{}"}])
    assert result["failed"] and f"{d} does not exist: create it first, or give dir_mode" in result["msg"]
    assert not d.exists()
    # removing from a missing directory: nothing to remove
    gone = run(capsys, dir=str(d), files=[{"name": "a.json"}], state="absent")
    assert (gone.get("failed"), gone["changed"], gone["removed"]) == (None, False, [])
    assert not d.exists()


def test_absent_removes_what_exists_and_leaves_the_rest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a.json").write_text("A")
    (tmp_path / "keep.json").write_text("K")
    os.chmod(tmp_path, 0o700)
    result = run(capsys, dir=str(tmp_path), files=[{"name": "a.json"}, {"name": "b.json"}], state="absent", _ansible_diff=True)
    assert result["changed"] and result["removed"] == [str(tmp_path / "a.json")] and result["written"] == []
    assert result["diff"] == [{"before_header": str(tmp_path / "a.json"), "after_header": str(tmp_path / "a.json"),
                               "before": "A", "after": ""}]  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.json"] and mode(tmp_path) == 0o700
    assert not run(capsys, dir=str(tmp_path), files=[{"name": "a.json"}], state="absent")["changed"]
    # absent with dir_mode keeps the directory right, and makes it when missing
    assert run(capsys, dir=str(tmp_path), files=[], state="absent", dir_mode="0755")["changed"] and mode(tmp_path) == 0o755
    d = tmp_path / "new"
    assert run(capsys, dir=str(d), files=[], state="absent", dir_mode="0700")["changed"] and mode(d) == 0o700


def test_check_mode_reports_with_its_diff_and_changes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "old.json").write_text("before")
    os.chmod(tmp_path / "old.json", 0o600)
    d = tmp_path / "new"
    common = {"_ansible_check_mode": True, "_ansible_diff": True}
    made = run(capsys, dir=str(d), dir_mode="0700", files=[{"name": "x", "content": "y"}], **common)
    assert made["changed"] and made["written"] == [str(d / "x")] and not d.exists()
    assert made["diff"] == [{"before_header": str(d / "x"), "after_header": str(d / "x"), "before": "", "after": "y"}]
    write = run(capsys, dir=str(tmp_path), files=[{"name": "old.json", "content": "after"}], **common)
    assert write["changed"] and write["diff"][0]["before"] == "before" and write["diff"][0]["after"] == "after"
    assert (tmp_path / "old.json").read_text() == "before"
    os.chmod(tmp_path, 0o777)
    only_dir = run(capsys, dir=str(tmp_path), dir_mode="0755", files=[{"name": "old.json", "content": "before"}], **common)
    assert (only_dir["changed"], only_dir["written"], only_dir["diff"]) == (True, [], []) and mode(tmp_path) == 0o777
    remove = run(capsys, dir=str(tmp_path), files=[{"name": "old.json"}], state="absent", **common)
    assert remove["removed"] == [str(tmp_path / "old.json")] and (tmp_path / "old.json").exists()
    same = run(capsys, dir=str(tmp_path), files=[{"name": "old.json", "content": "before"}], **common)
    assert (same["changed"], same["diff"]) == (False, [])


def test_a_link_or_a_directory_where_a_file_goes_fails_before_any_write(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "target"
    target.write_text("t")
    (tmp_path / "link.json").symlink_to(target)
    (tmp_path / "sub.json").mkdir()
    for name in ("link.json", "sub.json"):
        for state in ("present", "absent"):
            files = [{"name": "first.json", "content": "1"}, {"name": name, "content": "2"}]
            result = run(capsys, dir=str(tmp_path), files=files, state=state)
            assert result["failed"] and f"{tmp_path / name} exists and is not a regular file" in result["msg"], result
            assert result["msg"].startswith(f"state_files in {tmp_path}: ")
    assert not (tmp_path / "first.json").exists() and target.read_text() == "t" and (tmp_path / "link.json").is_symlink()


def test_a_file_where_the_directory_goes_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "d").write_text("")
    for dir_mode in (None, "0755"):
        result = run(capsys, dir=str(tmp_path / "d"), dir_mode=dir_mode, files=[{"name": "a", "content": "b"}])
        assert result["failed"] and f"{tmp_path / 'd'} exists and is not a directory" in result["msg"]


def test_a_write_that_fails_leaves_no_temporary_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*_: Any) -> None:
        raise PermissionError("fchown refused")

    monkeypatch.setattr(state_files.os, "fchown", refuse)
    result = run(capsys, dir=str(tmp_path), files=[{"name": "a.json", "content": "x"}])
    assert result["failed"] and result["msg"] == (f"state_files in {tmp_path}: fchown refused Run it as root (become: true): "
                                                  "the files are root's.")  # fmt: skip
    assert (result["changed"], result["written"], result["removed"]) == (False, [], [])
    assert list(tmp_path.iterdir()) == []


def test_a_failure_part_way_says_what_was_written_before_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    real = os.fsync
    calls: list[int] = []

    def second_fails(fd: int) -> None:
        calls.append(fd)
        if len(calls) == 2:
            raise OSError(27, "File too large")
        real(fd)

    monkeypatch.setattr(state_files.os, "fsync", second_fails)
    (tmp_path / "gone.json").write_text("g")
    result = run(capsys, dir=str(tmp_path), files=[{"name": "a.json", "content": "A"}, {"name": "b.json", "content": "B"}])
    assert result["failed"] and result["msg"] == f"state_files in {tmp_path}: [Errno 27] File too large"
    assert (result["changed"], result["written"], result["removed"]) == (True, [str(tmp_path / "a.json")], [])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "gone.json"]
    # a removal that fails after another: the one removed is named
    real_unlink = os.unlink

    def refuse_b(path: str) -> None:
        if path.endswith("b.json"):
            raise PermissionError(13, "Permission denied")
        real_unlink(path)

    (tmp_path / "b.json").write_text("B")
    monkeypatch.setattr(state_files.os, "unlink", refuse_b)
    result = run(capsys, dir=str(tmp_path), files=[{"name": "a.json"}, {"name": "b.json"}], state="absent")
    assert (result["failed"], result["changed"], result["removed"]) == (True, True, [str(tmp_path / "a.json")])
    assert result["msg"].endswith("Permission denied Run it as root (become: true): the files are root's.")


def test_absent_takes_any_name_that_stays_in_the_directory_once_and_a_file_gone_meanwhile(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A drain record written by hand (its server name with a space) is removed or simply not there; a name given
    twice counts once; a file another run removed between the read and the unlink is gone, as asked."""
    (tmp_path / "be_d3-lite--old host3.json").write_text("{}")
    (tmp_path / "s1").write_text("1")
    (tmp_path / "s2").write_text("2")
    names = ["s2", "be_d3-lite--old host3.json", "never there", "s1", "s1"]
    real_unlink = os.unlink

    def s2_gone_meanwhile(path: str) -> None:
        real_unlink(path)
        if path.endswith("s2"):
            raise FileNotFoundError(2, "No such file or directory")

    monkeypatch.setattr(state_files.os, "unlink", s2_gone_meanwhile)
    result = run(capsys, dir=str(tmp_path), files=[{"name": n} for n in names], state="absent")
    assert result["removed"] == [str(tmp_path / "be_d3-lite--old host3.json"), str(tmp_path / "s1")] and result["changed"]
    assert list(tmp_path.iterdir()) == []
    for bad in ("a/b", "..", ".", "", "x" * 256, "a\0b"):
        refused = run(capsys, dir=str(tmp_path), files=[{"name": bad}], state="absent")
        assert refused["failed"] and "want a plain file name" in refused["msg"], bad
    assert run(capsys, dir=str(tmp_path), files=[{"name": "x" * 255}, {"name": ".hidden"}], state="absent")["changed"] is False
    # present keeps the strict names, and a name given twice is written once, with the last content
    assert "want a plain file name" in run(capsys, dir=str(tmp_path), files=[{"name": "a b", "content": ""}])["msg"]
    twice = run(capsys, dir=str(tmp_path), files=[{"name": "t", "content": "1"}, {"name": "t", "content": "2"}])
    assert twice["written"] == [str(tmp_path / "t")] and (tmp_path / "t").read_text() == "2"


def test_a_link_to_a_directory_is_followed_and_missing_levels_get_the_mode(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """/var/lib/d3 moved to a data disk behind a link: written through it, its target kept right; each missing level is
    made with dir_mode, whatever the umask (as the file module makes them)."""
    disk = tmp_path / "disk"
    disk.mkdir(mode=0o755)
    os.chmod(disk, 0o755)
    (tmp_path / "d3").symlink_to(disk)
    result = run(capsys, dir=str(tmp_path / "d3"), dir_mode="0755", files=[{"name": "lease.json", "content": "{}"}])
    assert result["written"] == [str(tmp_path / "d3" / "lease.json")] and (disk / "lease.json").read_text() == "{}"
    assert (tmp_path / "d3").is_symlink() and mode(disk) == 0o755
    assert run(capsys, dir=str(tmp_path / "d3"), files=[{"name": "lease.json"}], state="absent")["changed"]
    os.umask(old := os.umask(0o077))
    try:
        os.umask(0o077)
        made = run(capsys, dir=str(tmp_path / "new" / "srv" / "d3"), dir_mode="0755", files=[])
    finally:
        os.umask(old)
    levels = [tmp_path / p for p in ("new", "new/srv", "new/srv/d3")]
    assert made["changed"] and [(mode(p), p.stat().st_uid, p.stat().st_gid) for p in levels] == [(0o755, 0, 0)] * 3
    # a level made meanwhile by another run is taken as it is, then given the mode
    real_mkdir = os.mkdir

    def made_meanwhile(path: str, mode: int = 0o777) -> None:
        real_mkdir(path, 0o700)
        raise FileExistsError(17, "File exists")

    monkeypatch.setattr(state_files.os, "mkdir", made_meanwhile)
    assert run(capsys, dir=str(tmp_path / "other"), dir_mode="0750", files=[])["changed"] and mode(tmp_path / "other") == 0o750


def test_a_fifo_where_a_file_goes_is_refused_without_waiting(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    os.mkfifo(tmp_path / "pipe.json")
    result = run(capsys, dir=str(tmp_path), files=[{"name": "pipe.json", "content": "x"}])
    assert result["failed"] and f"{tmp_path / 'pipe.json'} exists and is not a regular file" in result["msg"]


@pytest.mark.parametrize(("args", "message"), [
    ({"dir": "relative/dir"}, "dir = 'relative/dir': want an absolute path without . or .. components."),
    ({"dir": "/var/lib/../etc"}, "dir = '/var/lib/../etc': want an absolute path"),
    ({"dir": "/var/./lib"}, "dir = '/var/./lib': want an absolute path"),
    ({"mode": "600"}, "mode = '600': want 4 octal digits as a string, such as '0600'."),
    ({"mode": "0600\n"}, "mode = '0600\\n': want 4 octal digits"),
    ({"mode": "0800"}, "mode = '0800': want 4 octal digits"),
    ({"mode": "1600"}, "mode = '1600': want 4 octal digits"),
    ({"dir_mode": "755"}, "dir_mode = '755': want 4 octal digits"),
    ({"files": [{"name": "../etc/passwd", "content": "x"}]}, "files[0].name = '../etc/passwd': want a plain file name"),
    ({"files": [{"name": ".hidden", "content": "x"}]}, "files[0].name = '.hidden': want a plain file name"),
    ({"files": [{"name": "a/b", "content": "x"}]}, "files[0].name = 'a/b': want a plain file name"),
    ({"files": [{"name": "a\n", "content": "x"}]}, "files[0].name = 'a\\n': want a plain file name"),
    ({"files": [{"name": "a" * 201, "content": "x"}]}, "files[0].name = 'aaaa"),
    ({"files": [{"content": "x"}]}, "files[0].name = None: want a plain file name"),
    ({"files": [{"name": 5, "content": "x"}]}, "files[0].name = 5: want a plain file name"),
    ({"files": [{"name": "ok"}]}, "files[0] (ok): content must be a string."),
    ({"files": [{"name": "ok", "content": 5}]}, "files[0] (ok): content must be a string."),
    ({"files": [{"name": "ok", "content": "x", "mode": "0777"}]}, "files[0]: unknown keys ['mode']; want name and content."),
])  # fmt: skip
def test_bad_arguments_are_refused_naming_them_before_anything_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: dict[str, Any], message: str
) -> None:
    params = {"dir": str(tmp_path / "d"), "dir_mode": "0700", "files": [{"name": "ok", "content": "x"}], **args}
    result = run(capsys, **params)
    assert result["failed"] and message in result["msg"], result["msg"]
    assert list(tmp_path.iterdir()) == []


def test_every_problem_is_named_at_once_and_a_name_at_the_limit_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = run(capsys, dir="rel", mode="9", files=[{"name": ".x", "content": "x"}, {"name": "y"}])
    assert result["msg"].count("want") == 3 and "files[1] (y): content must be a string." in result["msg"]
    name = "a" + "b_.:@+-9Z" * 22 + "c"  # 200 characters, every allowed one
    assert len(name) == 200
    assert run(capsys, dir=str(tmp_path), files=[{"name": name, "content": ""}])["written"] == [str(tmp_path / name)]
    # absent needs no content
    assert run(capsys, dir=str(tmp_path), files=[{"name": name}], state="absent")["removed"] == [str(tmp_path / name)]


def test_the_temporary_file_is_a_hidden_one_in_the_same_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """rename() is atomic only within one filesystem: the temporary file sits beside its target."""
    moves: list[tuple[str, str]] = []
    real = os.replace

    def spy(src: str, dst: str) -> None:
        moves.append((src, dst))
        real(src, dst)

    monkeypatch.setattr(state_files.os, "replace", spy)
    run(capsys, dir=str(tmp_path), files=[{"name": "a.json", "content": "x"}])
    [(src, dst)] = moves
    assert Path(src).parent == tmp_path and Path(src).name.startswith(".state_files-") and dst == str(tmp_path / "a.json")


def test_dir_is_a_path_with_variables_expanded_and_the_arguments_are_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("D3_TEST_STATE_DIR", str(tmp_path))
    assert run(capsys, dir="$D3_TEST_STATE_DIR/d", dir_mode="0700", files=[{"name": "a", "content": "b"}])["written"] == [
        str(tmp_path / "d" / "a")]  # fmt: skip
    assert "missing required arguments: dir" in run(capsys, files=[])["msg"]
    assert "missing required arguments: files" in run(capsys, dir=str(tmp_path))["msg"]
    assert "value of state must be one of: present, absent" in run(capsys, dir=str(tmp_path), files=[], state="gone")["msg"]
    bad = run(capsys, dir=str(tmp_path), files=["a.json"])
    assert bad["failed"] and "files" in bad["msg"] and not (tmp_path / "a.json").exists()


def test_problems_are_joined_one_after_the_other(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = run(capsys, dir=str(tmp_path), mode="9", dir_mode="8", files=[])
    assert result["msg"] == ("mode = '9': want 4 octal digits as a string, such as '0600'. "
                             "dir_mode = '8': want 4 octal digits as a string, such as '0600'.")  # fmt: skip


def test_a_diff_of_bytes_that_are_not_utf_8_is_shown_replaced(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a").write_bytes(b"ok\xff")
    write = run(capsys, dir=str(tmp_path), files=[{"name": "a", "content": "new"}], _ansible_diff=True)
    assert write["diff"][0]["before"] == "ok\ufffd" and (tmp_path / "a").read_text() == "new"
    (tmp_path / "a").write_bytes(b"\xfe")
    remove = run(capsys, dir=str(tmp_path), files=[{"name": "a"}], state="absent", _ansible_diff=True)
    assert remove["diff"][0]["before"] == "\ufffd" and not (tmp_path / "a").exists()
