"""The server-state file made to agree with the configuration before HAProxy reads it (plugins/module_utils/
d3_server_state.py, installed by the d3_router role as d3-haproxy-save-state and run by haproxy.service's drop-in
before every reload, start and stop). HAProxy applies a saved server's port over the configured one
(src/server_state.c, v2.6.0 and v3.0.0): tests/contracts/haproxy/server-state.json holds the format and what Debian's
2.6.12 and 3.0.11 did on loopback, with the state saved unchanged and with this helper."""

from __future__ import annotations

import fcntl
import importlib
import json
import os
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_haproxy import OneLineSocket

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "collections"))
state = importlib.import_module("ansible_collections.d3fleet.fleet.plugins.module_utils.d3_server_state")
CONTRACT = json.loads((ROOT / "tests/contracts/haproxy/server-state.json").read_text())
VERSIONS = ["2.6.12-1+deb12u4", "3.0.11-1+deb13u4"]
PLAIN, FIXED, START = ("reload, plain save (before the fix)", "reload, the helper with the configuration",
                       "stop, configuration changed, start (ExecStartPre --reconcile)")  # fmt: skip
HEADER = CONTRACT["header"]


def config(ports: dict[str, int], backend: str = "be_a") -> str:
    servers = "".join(f"    server {name} 127.0.0.1:{port} maxconn 4\n" for name, port in ports.items())
    return ("global\n    server-state-file /var/lib/haproxy/server-state\n\ndefaults\n    mode http\n\n"
            "frontend fe\n    bind 127.0.0.1:8000\n    default_backend be_a\n\n"
            f"backend {backend}\n    balance leastconn\n    default-server check inter 1000 init-addr libc,none\n{servers}")  # fmt: skip


AFTER = config(CONTRACT["configuration_ports"]["after"])


def line(name: str, port: int, op: int = 2, admin: int = 0, health: int = 3, addr: str = "127.0.0.1", backend: str = "be_a") -> str:
    return f"3 {backend} 1 {name} {addr} {op} {admin} 1 1 7 15 3 {health} 6 0 0 0 - {port} - 0 0 - - 0"


def test_the_format_is_the_contracts_on_both_versions() -> None:
    assert tuple(CONTRACT["fields"]) == state.FIELDS and len(state.FIELDS) == 25
    assert f"{state.VERSION}\n# {' '.join(state.FIELDS)}\n" == HEADER
    assert (CONTRACT["min_fields"], CONTRACT["max_fields"]) == (state.MIN_FIELDS, state.MAX_FIELDS)
    for name, column in CONTRACT["columns"].items():
        assert state.FIELDS[column] == name
    columns = (state.BE_NAME, state.SRV_NAME, state.SRV_ADDR, state.OP_STATE, state.ADMIN_STATE, state.CHECK_HEALTH,
               state.SRV_PORT)  # fmt: skip
    assert tuple(CONTRACT["columns"].values()) == columns
    assert (CONTRACT["admin_flags"]["FMAINT"], CONTRACT["admin_flags"]["FDRAIN"]) == (state.FMAINT, state.FDRAIN)
    assert str(CONTRACT["op_states"]["STOPPED"]) == state.STOPPED


@pytest.mark.parametrize("version", VERSIONS)
def test_the_saved_port_won_before_and_the_new_port_is_reached_with_the_helper(version: str) -> None:
    runs = CONTRACT["captures"][version]
    # saved unchanged: every request still went to s2's old port, and nothing moved
    assert runs[PLAIN]["requests_reached_port"] == {"31002": 8}
    assert runs[PLAIN]["after_checks"]["s2"] == "UP 127.0.0.1:31002"
    for run in (FIXED, START):
        after = runs[run]["after_checks"]
        assert runs[run]["requests_reached_port"] == {"31005": 8}
        # the drain and the maintenance that did not move stay; the drained server that moved stays drained there
        assert after == {"s1": "DRAIN 127.0.0.1:31001", "s2": "UP 127.0.0.1:31005", "s3": "DRAIN 127.0.0.1:31006",
                         "s4": "MAINT 127.0.0.1:31004"}  # fmt: skip
    # the moved drained server is DOWN right after the reload, until its checks pass at the new port
    assert runs[FIXED]["just_after"]["s3"].startswith("DOWN")


@pytest.mark.parametrize("version", VERSIONS)
def test_the_helper_turns_the_real_dump_into_what_the_real_haproxy_was_given(version: str) -> None:
    """The plain save's file (HAProxy's own dump before the change) made to agree with the new configuration is the
    file the helper gave the new worker in the fixed run (the seconds since the last change aside)."""
    runs = CONTRACT["captures"][version]
    text, changes = state.reconcile(HEADER + "\n".join(runs[PLAIN]["state_file"]) + "\n", state.config_servers(AFTER))

    def masked(lines: list[str]) -> list[list[str]]:
        return [[f for i, f in enumerate(x.split()) if i != 9] for x in lines]

    assert text.startswith(HEADER)
    assert masked(text.splitlines()[2:]) == masked(runs[FIXED]["state_file"]) == masked(runs[START]["state_file"])
    assert changes == runs[FIXED]["helper"] == runs[START]["helper"]


def test_a_server_that_did_not_move_keeps_its_line_as_it_is() -> None:
    lines = [line("s1", 9001, admin=8), line("s2", 9002), line("s3", 9003, op=0, admin=1, health=0)]
    text = HEADER + "\n".join(lines) + "\n"
    assert state.reconcile(text, state.config_servers(config({"s1": 9001, "s2": 9002, "s3": 9003}))) == (text, [])


def test_a_moved_server_neither_drained_nor_in_maintenance_is_dropped() -> None:
    text, changes = state.reconcile(HEADER + line("s2", 9002) + "\n", state.config_servers(config({"s2": 9012})))
    assert text == HEADER
    assert changes == ["be_a/s2: 127.0.0.1:9002 -> 127.0.0.1:9012, dropped (starts as configured)"]


@pytest.mark.parametrize(("admin", "kept"), [(8, "drained"), (1, "in maintenance"), (9, "in maintenance"), (12, "drained"),
                                             (5, "in maintenance")])  # fmt: skip
def test_a_moved_server_drained_or_in_maintenance_keeps_it_at_the_new_port_down(admin: int, kept: str) -> None:
    text, changes = state.reconcile(HEADER + line("s1", 9001, admin=admin) + "\n", state.config_servers(config({"s1": 9011})))
    fields = text.splitlines()[2].split()
    # the new port; STOPPED and health 0: DOWN until its checks pass there; everything else as saved
    assert fields == line("s1", 9011, op=0, admin=admin, health=0).split()
    assert changes == [f"be_a/s1: 127.0.0.1:9001 -> 127.0.0.1:9011, kept {kept}, DOWN until its checks pass"]


@pytest.mark.parametrize("admin", ["0", "2", "4", "16", "32", "64", "x"])
def test_only_a_forced_drain_or_maintenance_is_kept_when_the_port_moves(admin: str) -> None:
    """Inherited (0x02, 0x10), configured (0x04), resolution (0x20) and FQDN (0x40) flags are HAProxy's to recompute."""
    saved = line("s1", 9001).split()
    saved[6] = admin
    text, _ = state.reconcile(HEADER + " ".join(saved) + "\n", state.config_servers(config({"s1": 9011})))
    assert text == HEADER


def test_a_moved_address_counts_when_the_configuration_gives_an_ip_address() -> None:
    servers = state.config_servers(config({"s1": 9001}).replace("127.0.0.1:9001", "10.0.0.2:9001"))
    assert servers == {("be_a", "s1"): ("10.0.0.2", "9001")}
    text, changes = state.reconcile(HEADER + line("s1", 9001, addr="10.0.0.1") + "\n", servers)
    assert text == HEADER and changes == ["be_a/s1: 10.0.0.1:9001 -> 10.0.0.2:9001, dropped (starts as configured)"]
    # a host name: the saved address is what libc gave, not comparable; the port decides
    named = state.config_servers(config({"s1": 9001}).replace("127.0.0.1:9001", "l4-a.example:9001"))
    kept = HEADER + line("s1", 9001, addr="10.0.0.1") + "\n"
    assert state.reconcile(kept, named) == (kept, [])
    assert state.reconcile(HEADER + line("s1", 9002, addr="10.0.0.1") + "\n", named)[0] == HEADER
    six = state.config_servers(config({"s1": 9001}).replace("127.0.0.1:9001", "[fd00::2]:9001"))
    assert six == {("be_a", "s1"): ("fd00::2", "9001")}
    assert state.reconcile(HEADER + line("s1", 9001, addr="fd00::2") + "\n", six)[1] == []
    # HAProxy prints an address as inet_ntop does; the inventory may spell it otherwise: the same address
    spelled = state.config_servers(config({"s1": 9001}).replace("127.0.0.1:9001", "[fd00:0:0::2]:9001"))
    assert state.reconcile(HEADER + line("s1", 9001, addr="fd00::2") + "\n", spelled)[1] == []
    assert state.reconcile(HEADER + line("s1", 9001, addr="fd00::3") + "\n", spelled)[0] == HEADER
    assert state.reconcile(HEADER + line("s1", 9001, addr="-") + "\n", spelled)[0] == HEADER  # unresolved, then moved
    assert str(state.ip("fd00:0::2")) == "fd00::2" and state.ip("l4-a.example") is None and state.ip("-") is None


def test_lines_haproxy_would_not_apply_are_dropped() -> None:
    servers = state.config_servers(config({"s1": 9001}))
    gone = line("s9", 9009, admin=8)
    other = line("s1", 9001, backend="be_b")
    short = " ".join(line("s1", 9001).split()[:19])
    long = line("s1", 9001) + " 0"
    assert len(long.split()) == 26
    good = line("s1", 9001, admin=8)
    text, changes = state.reconcile(HEADER + "\n".join([gone, other, short, long, "", "  ", good]) + "\n", servers)
    assert text == HEADER + good + "\n"  # the lines after them are read on
    assert changes == ["be_a/s9: not in the configuration, dropped", "be_b/s1: not in the configuration, dropped"]
    # 20 and 25 fields are both read by HAProxy (the optional ones at the end)
    twenty = " ".join(line("s1", 9001).split()[:20])
    assert state.reconcile(HEADER + twenty + "\n", servers) == (HEADER + twenty + "\n", [])


@pytest.mark.parametrize("text", ["", "1\n", "2\n# " + " ".join(state.FIELDS) + "\n", "1\n# be_id be_name\n",
                                  "1\n" + " ".join(state.FIELDS) + "\n", "Unknown command\n"])  # fmt: skip
def test_only_a_version_1_dump_is_a_state_file(text: str) -> None:
    assert not state.is_state(text)
    assert state.is_state(HEADER) and state.is_state(" 1 \n#  " + "  ".join(state.FIELDS) + "\n")


def test_the_configurations_servers_are_those_of_backends_and_listens() -> None:
    text = """global
    server-state-file /x
# backend be_commented
    #server s0 127.0.0.1:1
frontend fe_x
    server not_a_backend 127.0.0.1:9
backend be_a  # comment
    server s1 10.0.0.1:9001 check # trailing comment
    server s2 host.example:9002
    server-template s 3 10.0.0.9:1
listen li
    bind :80
    server s3 10.0.0.3:9003
backend
    server s4 10.0.0.4:9004
backend be_b
    server
    server lonely
    default-server check
userlist u
    server s5 10.0.0.5:9005
"""
    assert state.config_servers(text) == {("be_a", "s1"): ("10.0.0.1", "9001"), ("be_a", "s2"): ("host.example", "9002"),
                                          ("li", "s3"): ("10.0.0.3", "9003")}  # fmt: skip
    # an indented keyword is not a section, however little it is indented
    assert state.config_servers("backend be_a\n    backend x\n    server s1 10.0.0.1:1\n") == {("be_a", "s1"): ("10.0.0.1", "1")}
    assert state.config_servers("backend be_a\n backend x\n server s1 10.0.0.1:1\n") == {("be_a", "s1"): ("10.0.0.1", "1")}
    # a comment starts at the first #, spaced or not; a host name is kept as written
    text = "backend be_a\n    server s1 10.0.0.1:9001#check#x\n    server s2 Xl4-b.example:9002 # a # b\n"
    assert state.config_servers(text) == {("be_a", "s1"): ("10.0.0.1", "9001"), ("be_a", "s2"): ("Xl4-b.example", "9002")}


class StateSocket(OneLineSocket):
    """HAProxy's stats socket answering ``show servers state`` with ``dump``."""

    def __init__(self, path: str, dump: str) -> None:
        super().__init__(path)
        self.dump = dump

    def answer(self, command: str) -> str:
        return self.dump if command == "show servers state" else "Unknown command.\n"


@pytest.fixture
def where(tmp_path: Path) -> Iterator[dict[str, str]]:
    short = Path(f"/tmp/d3ss{os.getpid()}")
    short.mkdir(exist_ok=True)
    try:
        yield {"socket": str(short / "admin.sock"), "file": str(tmp_path / "server-state"), "config": str(tmp_path / "haproxy.cfg")}
    finally:
        for child in short.iterdir():
            child.unlink()
        short.rmdir()


def notes_of(argv: list[str]) -> list[str]:
    """A save's or a reconcile's lines to print; they never fail (exit status 0)."""
    status, lines = state.run(argv)
    assert status == 0
    return lines


def served(path: str, dump: str) -> StateSocket:
    fake = StateSocket(path, dump)
    fake.thread.start()
    return fake


def test_a_save_writes_haproxys_dump_made_to_agree_with_the_configuration(where: dict[str, str]) -> None:
    Path(where["config"]).write_text(config({"s1": 9001, "s2": 9012}))
    fake = served(where["socket"], HEADER + line("s1", 9001, admin=8) + "\n" + line("s2", 9002) + "\n")
    try:
        notes = notes_of(["save", where["socket"], where["file"], where["config"]])
    finally:
        fake.close()
    assert fake.commands == ["show servers state"]
    assert Path(where["file"]).read_text() == HEADER + line("s1", 9001, admin=8) + "\n"
    assert notes == [f"{where['file']}: be_a/s2: 127.0.0.1:9002 -> 127.0.0.1:9012, dropped (starts as configured)"]
    assert stat.S_IMODE(os.stat(where["file"]).st_mode) == 0o644
    # no temporary left; the lock that orders saves and changes beside the file, root's only
    assert sorted(os.listdir(Path(where["file"]).parent)) == ["haproxy.cfg", "server-state", "server-state.lock"]
    assert stat.S_IMODE(os.stat(where["file"] + ".lock").st_mode) == 0o600


def test_a_save_without_a_configuration_writes_the_dump_as_it_is(where: dict[str, str]) -> None:
    dump = HEADER + line("s2", 9002) + "\n"
    fake = served(where["socket"], dump)
    try:
        assert notes_of(["save", where["socket"], where["file"]]) == []
        # an unreadable configuration: the dump as HAProxy gave it, said so
        notes = notes_of(["save", where["socket"], where["file"], where["config"] + ".missing"])
    finally:
        fake.close()
    assert Path(where["file"]).read_text() == dump
    assert notes == [f"{where['config']}.missing: not readable, the state saved as HAProxy gave it"]


def test_when_haproxy_does_not_answer_the_last_file_stays_made_to_agree(where: dict[str, str]) -> None:
    Path(where["config"]).write_text(config({"s1": 9011, "s2": 9002}))
    Path(where["file"]).write_text(HEADER + line("s1", 9001, admin=8) + "\n" + line("s2", 9002, admin=1) + "\n")
    # no HAProxy on the socket (gone before the stop command), then a start's --reconcile: the same result
    notes = notes_of(["save", where["socket"], where["file"], where["config"]])
    assert Path(where["file"]).read_text() == HEADER + line("s1", 9011, op=0, admin=8, health=0) + "\n" + line("s2", 9002, admin=1) + "\n"
    assert notes == [f"{where['file']}: be_a/s1: 127.0.0.1:9001 -> 127.0.0.1:9011, kept drained, DOWN until its checks pass"]
    assert notes_of(["x", "--reconcile", where["file"], where["config"]]) == []  # already agrees: nothing to say


def test_an_answer_that_is_not_a_dump_leaves_the_last_file(where: dict[str, str]) -> None:
    Path(where["config"]).write_text(config({"s1": 9001}))
    kept = HEADER + line("s1", 9001, admin=8) + "\n"
    Path(where["file"]).write_text(kept)
    fake = served(where["socket"], "Permission denied\n")
    try:
        assert notes_of(["save", where["socket"], where["file"], where["config"]]) == []
    finally:
        fake.close()
    assert Path(where["file"]).read_text() == kept


def test_nothing_to_save_and_nothing_written(where: dict[str, str]) -> None:
    Path(where["config"]).write_text(config({"s1": 9001}))
    assert notes_of(["x", "--reconcile", where["file"], where["config"]]) == [f"{where['file']}: no server state to save"]
    assert not Path(where["file"]).exists()
    Path(where["file"]).write_text("garbage\n")
    assert notes_of(["x", "--reconcile", where["file"], where["config"]]) == [f"{where['file']}: no server state to save"]
    assert Path(where["file"]).read_text() == "garbage\n"


def test_a_file_that_already_agrees_is_not_rewritten(where: dict[str, str]) -> None:
    Path(where["config"]).write_text(config({"s1": 9001}))
    Path(where["file"]).write_text(HEADER + line("s1", 9001) + "\n")
    os.utime(where["file"], (1_000_000, 1_000_000))
    assert notes_of(["x", "--reconcile", where["file"], where["config"]]) == []
    assert os.stat(where["file"]).st_mtime == 1_000_000


@pytest.mark.parametrize("argv", [["x"], ["x", "/s"], ["x", "--reconcile", "/f"], ["x", "--reconcile", "/f", "/c", "/d"],
                                  ["x", "-s", "/f", "/c"], ["x", "--other", "/f", "/c"], ["x", "/s", "/f", "/c", "/d"]])  # fmt: skip
def test_a_command_line_it_does_not_know_changes_nothing(argv: list[str]) -> None:
    assert state.run(argv) == (2, ["usage: d3-haproxy-save-state SOCKET FILE [CONFIG] | --reconcile FILE CONFIG"
                                   " | --reload SOCKET FILE CONFIG MAINPID -- CHECK..."])


def test_the_write_is_atomic_and_leaves_no_temporary_on_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "server-state"
    target.write_text("old\n")

    def fail(*_: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(state.os, "replace", fail)
    with pytest.raises(OSError):
        state.write(str(target), "new\n")
    assert target.read_text() == "old\n" and sorted(os.listdir(tmp_path)) == ["server-state"]


def test_main_prints_its_notes_on_stderr_and_fails_only_on_a_wrong_command_line(where: dict[str, str], monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    Path(where["config"]).write_text(config({"s1": 9011}))
    Path(where["file"]).write_text(HEADER + line("s1", 9001) + "\n")
    monkeypatch.setattr(sys, "argv", ["d3-haproxy-save-state", "--reconcile", where["file"], where["config"]])
    assert state.main() == 0
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err == f"{where['file']}: be_a/s1: 127.0.0.1:9001 -> 127.0.0.1:9011, dropped (starts as configured)\n"
    monkeypatch.setattr(sys, "argv", ["d3-haproxy-save-state"])
    assert state.main() == 2 and capsys.readouterr().err.startswith("usage:")


def test_the_installed_helper_runs_as_a_script(where: dict[str, str]) -> None:
    """As haproxy.service runs it: the role's file (a link to this module), executable, /usr/bin/python3 FILE ARGS."""
    helper = ROOT / "roles/d3_router/files/d3-haproxy-save-state"
    assert os.access(helper, os.X_OK) and helper.read_text().startswith("#!/usr/bin/python3\n")
    Path(where["config"]).write_text(config({"s1": 9011}))
    Path(where["file"]).write_text(HEADER + line("s1", 9001, admin=8) + "\n")
    done = subprocess.run([sys.executable, str(helper), "--reconcile", where["file"], where["config"]],
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert (done.returncode, done.stdout) == (0, "")
    assert done.stderr.endswith("kept drained, DOWN until its checks pass\n")
    assert Path(where["file"]).read_text() == HEADER + line("s1", 9011, op=0, admin=8, health=0) + "\n"


def test_ask_half_closes_and_reads_to_the_end(where: dict[str, str]) -> None:
    fake = served(where["socket"], "x" * 200_000)
    try:
        assert state.ask(where["socket"], "show servers state", 5) == "x" * 200_000
    finally:
        fake.close()
    with pytest.raises(OSError):
        state.ask(where["socket"] + ".none", "show servers state", 1)


class SilentSocket(OneLineSocket):
    """Takes the command and never answers nor closes (a HAProxy that hangs)."""

    def serve(self) -> None:
        held = []
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            held.append(conn)


def test_ask_gives_up_after_its_timeout_and_replaces_bytes_that_are_not_utf_8(where: dict[str, str]) -> None:
    silent = SilentSocket(where["socket"])
    silent.thread.start()
    try:
        with pytest.raises(OSError):
            state.ask(where["socket"], "show servers state", 0.3)
    finally:
        silent.close()
    os.unlink(where["socket"])
    raw = RawSocket(where["socket"], b"1\n\xff")
    raw.thread.start()
    try:
        assert state.ask(where["socket"], "show servers state", 5) == "1\n\ufffd"
    finally:
        raw.close()


class RawSocket(OneLineSocket):
    """Answers these bytes to any command."""

    def __init__(self, path: str, data: bytes) -> None:
        super().__init__(path)
        self.data = data

    def answer(self, command: str) -> bytes:
        return self.data


def test_read_replaces_bytes_that_are_not_utf_8(tmp_path: Path) -> None:
    target = tmp_path / "server-state"
    target.write_bytes(b"1\n\xff\n")
    assert state.read(str(target)) == "1\n\ufffd\n"
    assert state.read(str(tmp_path / "none")) is None


def test_write_uses_a_temporary_file_of_its_own_beside_the_target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    renames: list[tuple[str, str]] = []
    real = os.replace
    monkeypatch.setattr(state.os, "replace", lambda a, b: renames.append((a, b)) or real(a, b))
    state.write(str(tmp_path / "server-state"), "x\n")
    (temporary, target), = renames
    assert target == str(tmp_path / "server-state") and os.path.dirname(temporary) == str(tmp_path)
    assert os.path.basename(temporary).startswith("server-state.") and temporary != target
    # a bare file name: beside it, in the working directory
    monkeypatch.chdir(tmp_path)
    state.write("other-state", "y\n")
    assert os.path.dirname(renames[1][0]) == str(tmp_path) and os.path.basename(renames[1][0]).startswith("other-state.")
    assert (tmp_path / "other-state").read_text() == "y\n"


def test_run_asks_haproxy_only_to_save_and_gives_it_ten_seconds(where: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[tuple[str, str, float]] = []
    monkeypatch.setattr(state, "ask", lambda *a: asked.append(a) or HEADER)
    Path(where["config"]).write_text(config({"s1": 9001}))
    Path(where["file"]).write_text(HEADER)
    notes_of(["x", "--reconcile", where["file"], where["config"]])
    assert asked == []  # a start: HAProxy is not running, nothing to ask
    notes_of(["x", where["socket"], where["file"], where["config"]])
    assert asked == [(where["socket"], "show servers state", 10.0)]


def test_a_save_that_cannot_be_written_never_fails(where: dict[str, str]) -> None:
    fake = served(where["socket"], HEADER + line("s1", 9001) + "\n")
    try:
        target = where["file"] + ".d/none/server-state"
        assert notes_of(["x", where["socket"], target]) == [f"{target}.lock: No such file or directory, saving without the lock"]
    finally:
        fake.close()


# --- the lock, the reload and the disk ------------------------------------------------------------------------------


class Clock:
    """A monotonic clock that moves only when the code sleeps."""

    def __init__(self) -> None:
        self.now, self.sleeps = 50.0, []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_the_lock_is_had_by_one_holder_at_a_time_and_given_up_after_its_wait(tmp_path: Path) -> None:
    target = str(tmp_path / "server-state")
    clock = Clock()
    with state.locked(target) as first:
        # flock is per open file: a second open in this same process is a second holder
        with state.locked(target, wait=2.0, clock=clock, sleep=clock.sleep) as second:
            assert (first, second) == (True, False)
        assert 2.0 <= sum(clock.sleeps) < 2.0 + 2 * state.POLL_S and set(clock.sleeps) == {state.POLL_S}
    with state.locked(target, wait=0) as again:  # released when the block ended
        assert again
    assert state.lock_path(target) == target + ".lock" and stat.S_IMODE(os.stat(target + ".lock").st_mode) == 0o600
    with pytest.raises(OSError), state.locked(str(tmp_path / "none" / "server-state")):
        pass


class Reloading(OneLineSocket):
    """The stats socket through a reload: ``show info`` names the worker that answers (``Pid: N``), ``show servers
    state`` the dump; each answer records whether the lock was held by another open file then."""

    def __init__(self, path: str, lock: str, dump: str) -> None:
        super().__init__(path)
        self.lock, self.dump, self.pid, self.seen = lock, dump, 111, []
        self.thread.start()

    def answer(self, command: str) -> str:
        fd = os.open(self.lock, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held = False
        except BlockingIOError:
            held = True
        finally:
            os.close(fd)
        self.seen.append((command, held))
        if command == "show info":
            return f"Name: HAProxy\nVersion: 3.0.11-1+deb13u4\nPid: {self.pid}\nProcess_num: 1\n"
        return self.dump if command == "show servers state" else "Unknown command.\n"


def test_a_reload_saves_checks_signals_and_holds_the_lock_until_a_new_worker_answers(
        where: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    Path(where["config"]).write_text(config({"s1": 9001}))
    dump = HEADER + line("s1", 9001, admin=8) + "\n"
    fake = Reloading(where["socket"], where["file"] + ".lock", dump)
    signals: list[tuple[int, int]] = []
    answers_after = iter([111, 111, 222])  # the old worker answers twice more, then the new one

    def kill(pid: int, sig: int) -> None:
        signals.append((pid, sig))

    def answer(command: str) -> str:
        if command == "show info" and signals:
            fake.pid = next(answers_after)
        return Reloading.answer(fake, command)

    fake.answer = answer  # type: ignore[method-assign]
    monkeypatch.setattr(state.os, "kill", kill)
    mark = Path(where["file"] + ".checked")
    check = [sys.executable, "-c", f"import os; open({str(mark)!r}, 'w').write(str(os.path.exists({where['file']!r})))"]
    clock = Clock()
    try:
        status, notes = state.reload(where["socket"], where["file"], where["config"], 4242, check, 5, clock, clock.sleep)
    finally:
        fake.close()
    assert (status, notes) == (0, [])
    assert mark.read_text() == "True" and Path(where["file"]).read_text() == dump  # saved before the check ran
    assert signals == [(4242, signal.SIGUSR2)]
    # every question asked under the lock, the pid before the signal, then until one that was not there before
    assert fake.seen == [("show servers state", True), ("show info", True), ("show info", True), ("show info", True),
                         ("show info", True)]  # fmt: skip
    assert clock.sleeps == [state.POLL_S, state.POLL_S]
    with state.locked(where["file"], wait=0) as free:
        assert free


def test_a_refused_configuration_fails_the_reload_and_sends_no_signal(where: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    fake = Reloading(where["socket"], where["file"] + ".lock", HEADER)
    signals: list[object] = []
    monkeypatch.setattr(state.os, "kill", lambda *a: signals.append(a))
    check = [sys.executable, "-c", "import sys; sys.exit(3)"]
    try:
        status, notes = state.reload(where["socket"], where["file"], "", 4242, check)
    finally:
        fake.close()
    assert status == 3 and signals == [] and notes == [f"{' '.join(check)}: exit status 3, no reload"]
    assert [c for c, _ in fake.seen] == ["show servers state"]


def test_a_reload_whose_new_worker_never_answers_gives_the_lock_up_and_says_so(where: dict[str, str],
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    fake = Reloading(where["socket"], where["file"] + ".lock", HEADER)
    monkeypatch.setattr(state.os, "kill", lambda *a: None)
    clock = Clock()
    try:
        status, notes = state.reload(where["socket"], where["file"], "", 4242, ["true"], 5, clock, clock.sleep)
    finally:
        fake.close()
    assert status == 0 and notes == [f"{where['socket']}: no new worker answered 20 s after the reload (still 111): "
                                     "look at journalctl -u haproxy"]  # fmt: skip
    assert state.NEW_WORKER_WAIT_S <= sum(clock.sleeps) < state.NEW_WORKER_WAIT_S + 2 * state.POLL_S
    # no HAProxy at all: none answers, said so
    clock = Clock()
    status, notes = state.reload(where["socket"], where["file"], "", 4242, ["true"], 5, clock, clock.sleep)
    assert notes[-1] == f"{where['socket']}: no new worker answered 20 s after the reload (still none): look at journalctl -u haproxy"


def test_a_reload_without_a_master_to_signal_fails(where: dict[str, str]) -> None:
    child = subprocess.Popen(["true"])  # a pid that no longer runs: a finished (and reaped) child's
    child.wait()
    status, notes = state.reload(where["socket"], where["file"], "", child.pid, ["true"], 1)
    assert status == 1 and notes[-1].startswith("reload: [Errno 3]")
    status, notes = state.reload(where["socket"], where["file"], "", child.pid, [where["file"] + ".no-such-binary"], 1)
    assert status == 1 and notes[-1].startswith("reload: [Errno 2]")


def test_the_command_line_runs_a_reload_and_returns_its_status(where: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[tuple[object, ...]] = []
    monkeypatch.setattr(state, "reload", lambda *a: asked.append(a) or (7, ["x"]))
    argv = ["h", "--reload", where["socket"], where["file"], where["config"], "4242", "--", "/usr/sbin/haproxy", "-c"]
    assert state.run(argv) == (7, ["x"])
    assert asked == [(where["socket"], where["file"], where["config"], 4242, ["/usr/sbin/haproxy", "-c"], 10.0)]
    for bad in (argv[:7], [*argv[:5], "pid", *argv[6:]], [*argv[:6], "-", *argv[7:]]):
        assert state.run(bad)[0] == 2
    assert len(asked) == 1


def test_the_file_and_its_directory_are_on_the_disk_before_the_write_returns(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """A power loss after the rename must not leave an empty file (every server would start ready)."""
    synced: list[str] = []
    real_replace = os.replace
    monkeypatch.setattr(state.os, "fsync", lambda fd: synced.append(os.readlink(f"/proc/self/fd/{fd}")))
    monkeypatch.setattr(state.os, "replace", lambda a, b: synced.append("rename") or real_replace(a, b))
    state.write(str(tmp_path / "server-state"), "x\n")
    temporary, rename, directory = synced
    assert os.path.dirname(temporary) == str(tmp_path) and temporary != str(tmp_path / "server-state")
    assert (rename, directory) == ("rename", str(tmp_path))


@pytest.mark.parametrize("version", VERSIONS)
def test_a_set_racing_a_reload_was_lost_before_and_holds_under_the_lock(version: str) -> None:
    """tests/contracts/haproxy/reload-race.json: the real HAProxy, the old drop-in against the helper's --reload and
    the module's lock (the helper as it is now: a change to the lock or the wait needs the loopback run again)."""
    race = json.loads((ROOT / "tests/contracts/haproxy/reload-race.json").read_text())
    before, helper = race["captures"][version]["before"], race["captures"][version]["helper"]
    assert before["drain_lost"] > 0 and before["ready_lost"] > 0  # a drain came back UP, a give-back came back DRAIN
    assert {lost["after"] for lost in before["lost"] if lost["kind"] == "drain"} == {"UP"}
    assert {lost["after"] for lost in before["lost"] if lost["kind"] == "ready"} == {"DRAIN"}
    assert (helper["drain_lost"], helper["ready_lost"], helper["lost"]) == (0, 0, []) and race["tries_per_kind"] == 40


def test_a_reload_goes_ahead_without_a_lock_held_too_long_and_reconciles_what_it_saves(
        where: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """A module stuck holding the lock never blocks a reload past LOCK_WAIT_S; the save is made to agree with the
    configuration the new worker loads, as a plain save is."""
    Path(where["config"]).write_text(config({"s1": 9011}))
    fake = Reloading(where["socket"], where["file"] + ".lock", HEADER + line("s1", 9001) + "\n")
    real = Reloading.answer

    def answer(command: str) -> str:
        if command == "show info" and signals:
            fake.pid = 222
        return real(fake, command)

    signals: list[object] = []
    fake.answer = answer  # type: ignore[method-assign]
    monkeypatch.setattr(state.os, "kill", lambda *a: signals.append(a))
    monkeypatch.setattr(state, "LOCK_WAIT_S", 2.0)
    clock = Clock()
    fd = os.open(where["file"] + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        with pytest.MonkeyPatch.context() as inner:
            inner.setattr(state, "locked", lambda path, clock, sleep: state_locked(path, 2.0, clock, sleep))
            status, notes = state.reload(where["socket"], where["file"], where["config"], 4242, ["true"], 5, clock, clock.sleep)
    finally:
        os.close(fd)
        fake.close()
    assert status == 0 and len(signals) == 1
    assert notes == [f"{where['file']}.lock: still held after 2 s, reloading without it",
                     f"{where['file']}: be_a/s1: 127.0.0.1:9001 -> 127.0.0.1:9011, dropped (starts as configured)"]  # fmt: skip
    assert Path(where["file"]).read_text() == HEADER


state_locked = state.locked


def test_a_show_info_without_a_pid_names_no_worker(where: dict[str, str]) -> None:
    # one fake for every answer: a closed fake's thread can still hold an accept() on a reused descriptor
    answers = ["Pid:\n", "Pid: x\n", "Pid:  \n", "Name: HAProxy\n", "pid: 12\n", "Name: HAProxy\nPid: 4242\nUptime: 0d\n"]
    fake = served(where["socket"], "")
    fake.answer = lambda _command: answers.pop(0)  # type: ignore[method-assign]
    try:
        assert [state.worker_pid(where["socket"], 5) for _ in range(6)] == [None, None, None, None, None, 4242]
    finally:
        fake.close()
