"""Unit tests of the collection's units_read and smoke modules (the one-call reads of the d3_units and d3_smoke roles)
and of the d3_file_differs filter that decides from units_read's answer whether a write must run."""

from __future__ import annotations

import grp
import hashlib
import importlib
import json
import os
import pwd
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml
from local_http import QuietHandler, serve
from testkit import run_module

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "collections/ansible_collections/d3fleet/fleet/plugins/modules"))
sys.path.insert(0, str(ROOT / "collections"))
units_read = importlib.import_module("units_read")
smoke = importlib.import_module("smoke")
d3_host = importlib.import_module("d3_host")  # the filter plugin (tests/conftest.py puts plugins/filter on sys.path)

SECRET = "k3y-never-shown"


run = run_module


# --- units_read -----------------------------------------------------------------------------------------------------


def test_units_read_describes_files_as_the_template_module_compares_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    unit = tmp_path / "d3-flash.container"
    unit.write_text("[Container]\nImage=x\n")
    unit.chmod(0o640)
    out = run(units_read, capsys, paths=[str(tmp_path), str(unit), str(tmp_path / "missing")])
    files = out["files"]
    assert out["changed"] is False
    assert files[str(unit)]["checksum"] == hashlib.sha1(b"[Container]\nImage=x\n").hexdigest()
    assert (files[str(unit)]["mode"], files[str(unit)]["isreg"], files[str(unit)]["isdir"]) == ("0640", True, False)
    assert files[str(unit)]["mtime"] == unit.stat().st_mtime
    assert files[str(tmp_path)]["isdir"] is True and "checksum" not in files[str(tmp_path)]
    assert files[str(tmp_path / "missing")] == {"exists": False}


def test_units_read_describes_a_symlink_itself_so_the_role_replaces_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A link to a file or directory with the right content, mode and owner is not that file (template and copy replace
    a link at their destination); a dangling link exists (d3_file_differs: write it either way)."""
    target, directory = tmp_path / "target", tmp_path / "dir"
    target.write_text("x\n")
    target.chmod(0o644)
    directory.mkdir(mode=0o755)
    links = {name: tmp_path / name for name in ("to-file", "to-dir", "dangling")}
    links["to-file"].symlink_to(target)
    links["to-dir"].symlink_to(directory)
    links["dangling"].symlink_to(tmp_path / "nowhere")
    files = run(units_read, capsys, paths=[str(p) for p in (target, *links.values())])["files"]
    me = pwd.getpwuid(os.getuid()).pw_name, grp.getgrgid(os.getgid()).gr_name
    assert files[str(target)]["islnk"] is False and files[str(target)]["isreg"] is True
    assert not d3_host.file_differs(files[str(target)], "file", "0644", hashlib.sha1(b"x\n").hexdigest(), *me)
    for name, link in links.items():
        info = files[str(link)]
        assert (info["exists"], info["islnk"], info["isreg"], info["isdir"], "checksum" in info) == (True, True, False, False, False), name
        assert d3_host.file_differs(info, "file", "0644", hashlib.sha1(b"x\n").hexdigest(), *me), name
        assert d3_host.file_differs(info, "directory", "0755", None, *me), name


def test_units_read_slurps_and_finds_the_labelled_units(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    quadlet, classic = tmp_path / "q", tmp_path / "s"
    quadlet.mkdir()
    classic.mkdir()
    (quadlet / "d3-a.container").write_text("Label=io.d3-fleet.instance=a\n")
    (quadlet / "other.container").write_text("Label=app=x\n")
    (quadlet / "d3-b.conf").write_text("io.d3-fleet.instance=b\n")  # not a unit file name
    (classic / "d3-c.service").write_text("--label io.d3-fleet.instance=c\n")
    (tmp_path / "fp").write_text("abc\n")
    finds = [str(quadlet), str(classic), str(tmp_path / "none")]
    out = run(units_read, capsys, find_paths=finds, slurp=[str(tmp_path / "fp"), str(tmp_path / "no")])
    assert out["found"] == [str(quadlet / "d3-a.container"), str(classic / "d3-c.service")]
    assert out["slurped"] == {str(tmp_path / "fp"): "abc\n", str(tmp_path / "no"): None}
    assert out["units"] == {} and out["secret_exists"] is None


def test_units_read_maps_systemctl_show_blocks_to_the_units_in_order(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[list[str]] = []
    show = "Id=a.service\nActiveState=active\nNeedDaemonReload=no\n\nId=b.service\nActiveState=inactive\nNeedDaemonReload=yes\n"

    def run_command(self: Any, argv: list[str], **_: Any) -> tuple[int, str, str]:
        calls.append(argv)
        if argv[0] == "systemctl":
            return 0, show, ""
        return (0 if argv[-1] == "present" else 125), "", "no such secret"

    monkeypatch.setattr(units_read.AnsibleModule, "run_command", run_command)
    monkeypatch.setattr(units_read.AnsibleModule, "get_bin_path", lambda self, name, *a, **k: f"/usr/bin/{name}")
    out = run(units_read, capsys, units=["a.service", "b.service"], secret="present")
    assert out["units"]["a.service"]["ActiveState"] == "active"
    assert out["units"]["b.service"] == {"Id": "b.service", "ActiveState": "inactive", "NeedDaemonReload": "yes"}
    assert calls[0][:3] == ["systemctl", "show", "--timestamp=unix"] and calls[0][-2:] == ["a.service", "b.service"]
    assert calls[1][0] == "/usr/bin/podman"
    assert len([c for c in calls if c[0] == "systemctl"]) == 1  # one systemctl for every unit
    assert out["secret_exists"] is True
    assert run(units_read, capsys, secret="absent")["secret_exists"] is False
    short = run(units_read, capsys, units=["a.service", "b.service", "c.service"])
    assert short["failed"] is True and "2 blocks for 3 units" in short["msg"]


# --- d3_file_differs ------------------------------------------------------------------------------------------------

FILE = {"exists": True, "isreg": True, "isdir": False, "mode": "0644", "owner": "root", "group": "root", "checksum": "c1"}
DIR = {"exists": True, "isreg": False, "isdir": True, "mode": "0755", "owner": "root", "group": "root"}


def test_file_differs_only_when_a_write_would_change_something() -> None:
    differs = d3_host.file_differs
    assert differs(FILE, "file", "0644", "c1") is False
    assert differs(FILE, "file", "0644") is False
    assert differs(DIR, "directory", "0755") is False
    assert differs(FILE, "file", "0644", "c2") is True
    assert differs(FILE, "file", "0600", "c1") is True
    assert differs(dict(FILE, owner="fleet"), "file", "0644", "c1") is True
    assert differs(dict(FILE, group="fleet"), "file", "0644", "c1") is True
    assert differs({"exists": False}, "file", "0644", "c1") is True
    assert differs(FILE, "directory", "0644") is True
    assert differs(DIR, "file", "0755") is True
    with pytest.raises(ValueError, match="kind"):
        differs(FILE, "link", "0644")
    with pytest.raises(ValueError, match="mode"):
        differs(FILE, "file", "644")


# --- smoke ----------------------------------------------------------------------------------------------------------


class Handler(QuietHandler):
    """/<name>/health answers 200 once the instance is 'up'; /<name>/v1/... echoes what it got."""

    up: ClassVar[set[str]] = set()
    delay: ClassVar[dict[str, float]] = {}  # seconds before answering, per path after the name

    def answer(self, body: bytes) -> tuple[int, bytes]:
        name, _, rest = self.path.lstrip("/").partition("/")
        time.sleep(self.delay.get(rest, 0))
        if rest == "health":
            return (200 if name in self.up else 503), b""
        return 200, json.dumps(
            {"path": rest, "method": self.command, "body": json.loads(body) if body else None, "auth": self.headers.get("Authorization")}
        ).encode()


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with serve(Handler) as url:
        yield url


def instance(server: str, name: str) -> dict[str, str]:
    return {"unit": f"d3-{name}", "health_url": f"{server}/{name}/health", "url": f"{server}/{name}", "served_model_name": name}


REQUESTS = [
    {"id": "models", "method": "GET", "path": "/v1/models"},
    {"id": "anonymous", "method": "GET", "path": "/v1/models", "auth": False},
    {"id": "decision", "path": "/v1/systemone", "body": {"state": {"t": 1}, "questions": {"q": {"type": "noul"}}}},
]


def test_smoke_sends_every_request_to_every_ready_instance(
    server: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(smoke, "unit_state", lambda unit: ("active", "", ""))
    monkeypatch.setattr(Handler, "up", {"flash", "lite"})
    out = run(smoke, capsys, instances=[instance(server, "flash"), instance(server, "lite")], requests=REQUESTS, api_key=SECRET,
              timeout_s=5, poll_s=0.05)  # fmt: skip
    assert out["changed"] is False and out["waiting"] == {}
    assert set(out["ready"]) == set(out["ready_monotonic"]) == {"d3-flash", "d3-lite"}
    flash = out["answers"]["d3-flash"]
    assert list(flash) == ["models", "anonymous", "decision"]
    assert flash["models"]["json"] == {"path": "v1/models", "method": "GET", "body": None, "auth": "Bearer ********"}
    assert flash["anonymous"]["json"]["auth"] is None  # auth: false sends no key
    assert flash["decision"]["json"]["body"] == {"state": {"t": 1}, "questions": {"q": {"type": "noul"}}, "model": "flash"}
    assert out["answers"]["d3-lite"]["decision"]["json"]["body"]["model"] == "lite"
    assert all(r["elapsed_ms"] > 0 for r in flash.values())
    assert SECRET not in json.dumps(out)


def test_smoke_reports_what_it_waited_for_and_asks_only_the_ready(server: str, capsys: pytest.CaptureFixture[str],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    states = {"d3-flash": ("active", "", ""), "d3-lite": ("active", "42", ""), "d3-mini": ("active", "", "")}
    monkeypatch.setattr(smoke, "unit_state", lambda unit: states[unit])
    monkeypatch.setattr(Handler, "up", {"flash", "lite"})
    out = run(smoke, capsys, instances=[instance(server, n) for n in ("flash", "lite", "mini")], requests=REQUESTS[:1],
              timeout_s=0.3, poll_s=0.05)  # fmt: skip
    assert list(out["ready"]) == ["d3-flash"]
    assert out["waiting"] == {"d3-lite": "unit active (job queued)", "d3-mini": f"unit active, {server}/mini/health answered 503"}
    assert list(out["answers"]) == ["d3-flash"]


def test_smoke_refuses_duplicate_request_ids(server: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(smoke, "unit_state", lambda unit: ("active", "", ""))
    out = run(smoke, capsys, instances=[instance(server, "flash")], requests=[REQUESTS[0], REQUESTS[0]])
    assert out["failed"] is True and "unique" in out["msg"]


def test_units_read_without_podman_finds_no_secret(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh host in --check: the podman role has not installed podman yet, so there is no secret (not a failure)."""
    monkeypatch.setattr(units_read.AnsibleModule, "get_bin_path", lambda self, name, *a, **k: None)
    out = run(units_read, capsys, secret="d3-api-key")
    assert out.get("failed") is None and out["secret_exists"] is False


# --- fakes of systemctl and podman on PATH (the modules run them as they would on a host) ----------------------------

FAKE_SYSTEMCTL = r"""
import json, os, sys
state = json.load(open(os.environ["FAKE_HOST"]))
args = sys.argv[1:]
if state.get("no_systemd"):
    sys.exit("System has not been booted with systemd as init system (PID 1). Can't operate.")
if args[:1] != ["show"]:
    sys.exit(f"Unknown command verb {args[:1]}.")
wanted, units = None, []
for arg in args[1:]:
    if arg.startswith("--property="):
        wanted = arg.split("=", 1)[1].split(",")
    elif arg.startswith("-") and arg != "--timestamp=unix":
        sys.exit(f"systemctl: unrecognized option '{arg}'")
    elif not arg.startswith("-"):
        units.append(arg)
blocks = []
for unit in units:  # the asked properties that are set (older systemctl leaves empty ones out; the modules take either)
    props = state["units"].get(unit, {"Id": unit, "ActiveState": "inactive"})
    blocks.append("".join(f"{k}={v}\n" for k, v in props.items() if v != "" and (wanted is None or k in wanted)))
sys.stdout.write("\n".join(blocks))
"""

FAKE_PODMAN = r"""
import json, os, re, sys
state = json.load(open(os.environ["FAKE_HOST"]))
args = sys.argv[1:]
if args[:2] != ["secret", "inspect"]:
    sys.exit(f"Error: unrecognized command `podman {' '.join(args[:2])}`")
rest, template = args[2:], "{{json .}}"
if rest[:1] == ["--format"]:
    template, rest = rest[1], rest[2:]
elif rest[:1] and rest[0].startswith("-"):
    sys.exit(f"Error: unknown flag: {rest[0]}")
for field in re.findall(r"{{\s*([^}]*?)\s*}}", template):  # Go templates: field names are case-sensitive
    if field not in (".Spec.Name", ".ID", "json ."):
        sys.exit(f"Error: template: inspect:1: can't evaluate field {field}")
for name in rest:
    if name not in state["secrets"]:
        sys.exit(f'Error: inspecting secret: no secret with name or id "{name}": no such secret')
    print(template.replace("{{.Spec.Name}}", name))
"""


class FakeHost:
    """A host's systemd units and podman secrets, as the fake systemctl and podman (first on PATH) see them."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.path = tmp_path / "host.json"
        bindir = tmp_path / "bin"
        bindir.mkdir()
        for name, text in (("systemctl", FAKE_SYSTEMCTL), ("podman", FAKE_PODMAN)):
            (bindir / name).write_text(f"#!{sys.executable}\n{text}")
            (bindir / name).chmod(0o755)
        monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
        monkeypatch.setenv("FAKE_HOST", str(self.path))
        self.set()

    def set(self, units: dict[str, dict[str, str]] | None = None, secrets: tuple[str, ...] = (), **flags: bool) -> None:
        self.path.write_text(json.dumps({"units": units or {}, "secrets": list(secrets), **flags}))


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeHost:
    return FakeHost(tmp_path, monkeypatch)


def documented(module: Any) -> dict[str, Any]:
    return yaml.safe_load(module.DOCUMENTATION)["options"]


# --- units_read: edges ----------------------------------------------------------------------------------------------

EXEC_START = "{ path=/usr/bin/podman ; argv[]=/usr/bin/podman run --name=d3-flash --label=io.d3-fleet.instance=flash ; }"
SHOW = {
    "a.service": {"Id": "a.service", "ActiveState": "active", "InactiveExitTimestamp": "@1767225600",
                  "NeedDaemonReload": "no", "UnitFileState": "generated", "ExecStart": EXEC_START, "MainPID": "4242"},
    "b.service": {"Id": "b.service", "ActiveState": "inactive", "InactiveExitTimestamp": "", "NeedDaemonReload": "yes",
                  "UnitFileState": "disabled", "Description": "D3 lite on an NVIDIA RTX"},
}  # fmt: skip


def test_units_read_reads_the_documented_properties_by_default(host: FakeHost, capsys: pytest.CaptureFixture[str]) -> None:
    host.set(SHOW)
    out = run(units_read, capsys, units=["a.service", "b.service"])
    wanted = documented(units_read)["properties"]["default"]
    assert out.get("failed") is None
    assert list(out["units"]) == ["a.service", "b.service"]
    assert set(out["units"]["a.service"]) == set(wanted)  # systemctl printed these and only these
    assert out["units"]["a.service"]["InactiveExitTimestamp"] == "@1767225600"
    assert out["units"]["b.service"]["NeedDaemonReload"] == "yes"


def test_units_read_keeps_property_values_whole(host: FakeHost, capsys: pytest.CaptureFixture[str]) -> None:
    """Values hold '=' (ExecStart) and may end in any letter: only the first '=' splits, only newlines are trimmed."""
    host.set(SHOW)
    out = run(units_read, capsys, units=["a.service", "b.service"], properties=["Id", "ExecStart", "Description"])
    assert out["units"]["a.service"] == {"Id": "a.service", "ExecStart": EXEC_START}
    assert out["units"]["b.service"]["Description"] == SHOW["b.service"]["Description"]


def test_units_read_fails_with_what_systemctl_said(host: FakeHost, capsys: pytest.CaptureFixture[str]) -> None:
    host.set(no_systemd=True)
    out = run(units_read, capsys, units=["a.service"])
    assert out["failed"] is True and out["rc"] == 1
    assert out["msg"].startswith("systemctl show failed (rc 1): System has not been booted with systemd")


def test_units_read_fails_when_systemctl_prints_too_few_blocks(host: FakeHost, capsys: pytest.CaptureFixture[str]) -> None:
    host.set({**SHOW, "c.service": {"Id": ""}})  # a unit with nothing to print: no block of its own
    short = run(units_read, capsys, units=["a.service", "b.service", "c.service"])
    assert short["failed"] is True and "printed 2 blocks for 3 units" in short["msg"]
    assert "Id=a.service" in short["stdout"] and "Id=b.service" in short["stdout"]  # what systemctl printed, to debug
    nothing = run(units_read, capsys, units=["c.service"])
    assert nothing["failed"] is True and "printed 0 blocks for 1 units" in nothing["msg"]


def test_units_read_asks_podman_whether_the_secret_exists(host: FakeHost, capsys: pytest.CaptureFixture[str]) -> None:
    host.set(secrets=("d3-api-key",))
    assert run(units_read, capsys, secret="d3-api-key")["secret_exists"] is True
    assert run(units_read, capsys, secret="other-key")["secret_exists"] is False


def test_units_read_runs_in_check_mode(host: FakeHost, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    host.set(SHOW, secrets=("d3-api-key",))
    out = run(units_read, capsys, units=["a.service"], paths=[str(tmp_path)], secret="d3-api-key", _ansible_check_mode=True)
    assert out.get("skipped") is None and out["changed"] is False
    assert out["units"]["a.service"]["ActiveState"] == "active" and out["secret_exists"] is True
    assert out["files"][str(tmp_path)]["isdir"] is True


def test_units_read_describes_owner_and_group(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    unit = tmp_path / "d3-flash.container"
    unit.write_text("[Container]\n")
    st = unit.stat()
    info = run(units_read, capsys, paths=[str(unit)])["files"][str(unit)]
    assert info["exists"] is True
    assert (info["uid"], info["gid"]) == (st.st_uid, st.st_gid)
    assert info["owner"] == pwd.getpwuid(st.st_uid).pw_name
    assert info["group"] == grp.getgrgid(st.st_gid).gr_name


def test_units_read_expands_home_in_paths(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "units").mkdir()
    (tmp_path / "units/d3-a.container").write_text("Label=io.d3-fleet.instance=a\n")
    (tmp_path / "fp").write_text("abc\n")
    out = run(units_read, capsys, paths=["~/fp"], slurp=["~/fp"], find_paths=["~/units"])
    assert out["files"][str(tmp_path / "fp")]["isreg"] is True
    assert out["slurped"] == {str(tmp_path / "fp"): "abc\n"}
    assert out["found"] == [str(tmp_path / "units/d3-a.container")]


def test_units_read_find_looks_at_every_entry_of_every_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "q").mkdir()
    (tmp_path / "q/README").write_text("io.d3-fleet.instance=x\n")  # not a unit file name
    (tmp_path / "q/sub.container").mkdir()  # a directory, not a file
    (tmp_path / "q/d3-a.container").write_text("Label=io.d3-fleet.instance=a\n")
    listdir = os.listdir
    monkeypatch.setattr(os, "listdir", lambda path: sorted(listdir(path), key=lambda n: n.startswith("d3-")))  # skipped first
    out = run(units_read, capsys, find_paths=[str(tmp_path / "missing"), str(tmp_path / "q")])
    assert out["found"] == [str(tmp_path / "q/d3-a.container")]


def test_units_read_reads_text_as_utf8_whatever_the_locale(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = tmp_path / "t"
    text.write_bytes("fingerprint é\n".encode() + b"\xff\n")
    real_open = open

    def latin1_host_open(path: str, mode: str = "r", encoding: str | None = None, **kwargs: Any) -> Any:
        return real_open(path, mode, encoding=encoding or "latin-1", **kwargs)  # a host whose locale is Latin-1

    monkeypatch.setattr(units_read, "open", latin1_host_open, raising=False)
    assert units_read.read_text(str(text)) == "fingerprint é\n\ufffd\n"  # an undecodable byte is replaced, not an error
    assert units_read.read_text(str(tmp_path)) is None


def test_units_read_slurps_at_most_64_kib(tmp_path: Path) -> None:
    big = tmp_path / "big"
    big.write_text("x" * 70000)
    assert units_read.read_text(str(big)) == "x" * 65536


# --- smoke: edges ---------------------------------------------------------------------------------------------------


class Clock:
    """smoke's time: monotonic and wall clock advance only by sleep()."""

    def __init__(self) -> None:
        self.now, self.slept = 1000.0, []

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return 1.8e9 + self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(smoke, "time", fake)
    return fake


def refused_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/health"


def test_smoke_reads_the_units_state_from_systemctl(host: FakeHost) -> None:
    host.set({"d3-flash.service": {"ActiveState": "active"}, "d3-lite.service": {"ActiveState": "active", "Job": "1234"}})
    assert smoke.unit_state("d3-flash") == ("active", "", "")
    assert smoke.unit_state("d3-lite") == ("active", "1234", "")
    assert smoke.unit_state("d3-gone") == ("inactive", "", "")
    # the note: a SubState that says more than the state, and the restart count when there were restarts
    host.set({"d3-nano.service": {"ActiveState": "activating", "SubState": "auto-restart", "NRestarts": "1", "Job": "7"},
              "d3-mini.service": {"ActiveState": "active", "SubState": "running", "NRestarts": "0"},
              "d3-edge.service": {"ActiveState": "inactive", "SubState": "dead", "NRestarts": "2"}})  # fmt: skip
    assert smoke.unit_state("d3-nano") == ("activating", "7", "auto-restart, 1 restart")
    assert smoke.unit_state("d3-mini") == ("active", "", "")
    assert smoke.unit_state("d3-edge") == ("inactive", "", "2 restarts")
    host.set(no_systemd=True)
    assert smoke.unit_state("d3-flash") == ("?", "", "")


def test_smoke_says_why_each_unit_is_not_ready(
    host: FakeHost, clock: Clock, server: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Handler, "up", {"flash", "lite", "mini"})
    host.set({"d3-flash.service": {"ActiveState": "active"},
              "d3-lite.service": {"ActiveState": "active", "Job": "77"},  # a queued restart: the old process answers
              "d3-mini.service": {"ActiveState": "activating", "SubState": "start-post", "NRestarts": "0"},
              # a crash loop: between two tries, with the next start queued
              "d3-nano.service": {"ActiveState": "activating", "SubState": "auto-restart", "NRestarts": "12", "Job": "91"},
              "d3-pico.service": {"ActiveState": "active", "SubState": "running", "NRestarts": "1"},
              "d3-edge.service": {"ActiveState": "failed", "SubState": "failed", "NRestarts": "1"}})  # fmt: skip
    pico = dict(instance(server, "pico"), health_url=refused_url())
    instances = [instance(server, n) for n in ("flash", "lite", "mini", "nano", "edge")] + [pico]
    out = run(smoke, capsys, instances=instances, timeout_s=1, poll_s=0.5)
    assert list(out["ready"]) == ["d3-flash"] and list(out["answers"]) == ["d3-flash"]
    assert out["waiting"] == {
        "d3-lite": "unit active (job queued)",
        "d3-mini": "unit activating (start-post)",
        "d3-nano": "unit activating (auto-restart, 12 restarts; job queued)",
        "d3-edge": "unit failed (1 restart)",
        "d3-pico": f"unit active, {pico['health_url']} answered ConnectionRefusedError",
    }
    assert sum(clock.slept) <= 1  # it stops once timeout_s has passed
    host.set(no_systemd=True)
    assert run(smoke, capsys, instances=instances[:1], timeout_s=0)["waiting"] == {"d3-flash": "unit ?"}


def test_smoke_polls_until_each_unit_is_ready_and_says_when(
    clock: Clock, server: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    start = clock.now
    polls: list[str] = []

    def unit_state(unit: str) -> tuple[str, str, str]:  # d3-flash is active from its third poll on
        polls.append(unit)
        return ("active", "", "") if unit == "d3-lite" or polls.count(unit) >= 3 else ("activating", "", "")

    monkeypatch.setattr(smoke, "unit_state", unit_state)
    monkeypatch.setattr(Handler, "up", {"flash", "lite"})
    out = run(smoke, capsys, instances=[instance(server, "lite"), instance(server, "flash")], timeout_s=10, poll_s=0.5)
    assert out["waiting"] == {} and list(out["answers"]) == ["d3-lite", "d3-flash"]
    assert out["ready_monotonic"] == {"d3-lite": start, "d3-flash": start + 1.0}  # seen on the third round
    assert out["ready"] == {unit: clock.time() - clock.now + moment for unit, moment in out["ready_monotonic"].items()}
    assert clock.slept == [0.5, 0.5]  # no sleep once all are ready
    assert polls.count("d3-lite") == 1  # a ready unit is not polled again


def test_smoke_waits_timeout_s_by_default(clock: Clock, server: str, capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setattr(smoke, "unit_state", lambda unit: ("activating", "", ""))
    out = run(smoke, capsys, instances=[instance(server, "flash")])
    options = documented(smoke)
    assert out["waiting"] == {"d3-flash": "unit activating"}
    assert set(clock.slept) == {options["poll_s"]["default"]}
    assert sum(clock.slept) == options["timeout_s"]["default"]


def test_smoke_requests_time_out_as_configured(server: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    timeouts: list[float] = []
    real_send = smoke.send

    def send(url: str, method: str, body: Any, key: str | None, timeout: float) -> dict[str, Any]:
        timeouts.append(timeout)
        return real_send(url, method, body, key, timeout)

    monkeypatch.setattr(smoke, "send", send)
    monkeypatch.setattr(smoke, "unit_state", lambda unit: ("active", "", ""))
    monkeypatch.setattr(Handler, "up", {"flash"})
    monkeypatch.setattr(Handler, "delay", {"v1/slow": 2.5})
    requests = [{"id": "slow", "method": "GET", "path": "/v1/slow", "timeout": 1}, {"id": "models", "method": "GET", "path": "/v1/models"}]
    answers = run(smoke, capsys, instances=[instance(server, "flash")], requests=requests)["answers"]["d3-flash"]
    assert answers["slow"]["status"] == -1 and "timed out" in answers["slow"]["content"]
    assert answers["models"]["status"] == 200
    assert timeouts == [1, documented(smoke)["requests"]["suboptions"]["timeout"]["default"]]


def test_smoke_health_check_gives_up_after_two_seconds() -> None:
    with socket.socket() as sock:  # accepts connections (the backlog) but never answers
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        start = time.monotonic()
        status = smoke.health(f"http://127.0.0.1:{sock.getsockname()[1]}/health")
        elapsed = time.monotonic() - start
    assert status == "TimeoutError"
    assert 1.5 < elapsed < 2.8
    assert smoke.health(refused_url()) == "ConnectionRefusedError"


@pytest.mark.parametrize(("option", "field"), [("instances", f) for f in ("unit", "health_url", "url", "served_model_name")]
                         + [("requests", "id"), ("requests", "path")])  # fmt: skip
def test_smoke_requires_every_field(option: str, field: str, server: str, capsys: pytest.CaptureFixture[str],
                                    monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    polled: list[str] = []
    monkeypatch.setattr(smoke, "unit_state", lambda unit: polled.append(unit) or ("active", "", ""))
    monkeypatch.setattr(Handler, "up", {"flash"})
    args = {"instances": [instance(server, "flash")], "requests": [dict(REQUESTS[2])], "timeout_s": 1, "poll_s": 0.1}
    del args[option][0][field]
    out = run(smoke, capsys, **args)
    assert out["failed"] is True and f"missing required arguments: {field} found in {option}" in out["msg"]
    assert polled == []  # refused before waiting for anything


def test_smoke_requires_instances_and_refuses_unknown_methods(server: str, capsys: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setattr(smoke, "unit_state", lambda unit: ("active", "", ""))
    monkeypatch.setattr(Handler, "up", {"flash"})
    out = run(smoke, capsys, requests=REQUESTS)
    assert out["failed"] is True and "missing required arguments: instances" in out["msg"]
    put = run(smoke, capsys, instances=[instance(server, "flash")], requests=[dict(REQUESTS[2], method="PUT")])
    assert put["failed"] is True and "method must be one of: GET, POST" in put["msg"] and "answers" not in put


def test_smoke_without_requests_only_waits(server: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(smoke, "unit_state", lambda unit: ("active", "", ""))
    monkeypatch.setattr(Handler, "up", {"flash"})
    out = run(smoke, capsys, instances=[instance(server, "flash")], timeout_s=5, poll_s=0.05)
    assert out.get("failed") is None and list(out["ready"]) == ["d3-flash"] and out["answers"] == {"d3-flash": {}}


def test_smoke_runs_in_check_mode(server: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(smoke, "unit_state", lambda unit: ("active", "", ""))
    monkeypatch.setattr(Handler, "up", {"flash"})
    out = run(smoke, capsys, instances=[instance(server, "flash")], requests=REQUESTS[:1], _ansible_check_mode=True)
    assert out.get("skipped") is None and out["answers"]["d3-flash"]["models"]["status"] == 200


def test_units_read_takes_numbers_in_its_string_lists_as_text(host: FakeHost, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """YAML reads `units: [8080]` or `find_suffixes: [.container, 2]` as numbers: they are names, not a crash."""
    host.set({"8080": {"Id": "8080", "ActiveState": "active"}})
    (tmp_path / "d3-a.container").write_text("Label=io.d3-fleet.instance=a\n")
    (tmp_path / "d3-b.v2").write_text("Label=io.d3-fleet.instance=b\n")
    out = run(units_read, capsys, units=[8080], properties=["Id", 7], find_paths=[str(tmp_path)], find_suffixes=[".container", 2])
    assert out.get("failed") is None
    assert out["units"] == {"8080": {"Id": "8080"}}
    assert out["found"] == [str(tmp_path / "d3-a.container"), str(tmp_path / "d3-b.v2")]
