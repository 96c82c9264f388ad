"""The haproxy_runtime module (the d3_router role's only way to HAProxy's runtime API) against a fake HAProxy stats
socket: a threading UNIX socket server that answers as HAProxy's non-interactive mode does (doc/management.txt, "9.3.
Unix Socket commands": one command line, the answer, then the connection closes; `set server` answers an empty line
when taken), from the `show stat` captured from Debian's HAProxy 3.0.11 (tests/contracts/haproxy/show-stat.csv), and
records every command. Also the shared parsing (module_utils/d3_haproxy.py) and the filters that decide from the
module's results (d3_router_api_problems) and from systemctl show (d3_rollout_downtimes, d3_systemctl_show)."""

from __future__ import annotations

import fcntl
import importlib
import json
import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.module_utils.testing import patch_module_args
from fake_haproxy import CAPTURED, FakeHAProxy, FakeMaster

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "collections/ansible_collections/d3fleet/fleet/plugins/modules"))
sys.path.insert(0, str(ROOT / "collections"))
haproxy_runtime = importlib.import_module("haproxy_runtime")
d3_haproxy = importlib.import_module("ansible_collections.d3fleet.fleet.plugins.module_utils.d3_haproxy")
d3_router_api = importlib.import_module("d3_router_api")  # filter (tests/conftest.py puts plugins/filter on sys.path)
d3_rollout = importlib.import_module("d3_rollout")

LITE2 = {"backend": "be_d3-lite", "server": "d3-lab-host2-d3-lite"}
LITE3 = {"backend": "be_d3-lite", "server": "d3-lab-host3-d3-lite"}
FLASH = {"backend": "be_d3-flash", "server": "d3-lab-host2-d3-flash"}


@pytest.fixture
def haproxy() -> Iterator[FakeHAProxy]:
    with FakeHAProxy.started() as fake:
        yield fake


def params(sock: str, **over: Any) -> dict[str, Any]:
    base = {"socket": sock, "router": "r1", "servers": [], "state": None, "wait": False, "timeout": 60, "poll": 1.0,
            "connect_timeout": 10.0, "state_file": ""}  # fmt: skip
    return {**base, **over}


def run_main(capsys: pytest.CaptureFixture[str], **args: Any) -> dict[str, Any]:
    args.setdefault("state_file", "")  # the module's default is the router's file; the tests that save pass theirs
    with patch_module_args(args), pytest.raises(SystemExit):
        haproxy_runtime.main()
    return json.loads(capsys.readouterr().out)


class Clock:
    """A monotonic clock that only moves when the module sleeps."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


# --- reading -------------------------------------------------------------------------------------------------------


def test_reads_show_stat_of_the_captured_haproxy(haproxy: FakeHAProxy, capsys: pytest.CaptureFixture[str]) -> None:
    out = run_main(capsys, socket=haproxy.path, router="r1", servers=[LITE3, {"backend": "be_d3-lite", "server": "new"}])
    assert haproxy.commands == ["show stat"]
    assert out["changed"] is False and out["changed_servers"] == [] and out["waited_s"] == 0.0
    assert (out["router"], out["socket"], out["state"]) == ("r1", haproxy.path, None)
    assert len(out["stat"]) == len(CAPTURED) - 1
    assert out["stat"][0] == {"backend": "fe_d3-27b", "server": "FRONTEND", "scur": 0, "status": "OPEN"}
    assert out["stat"][1] == {"backend": "be_d3-27b", "server": "d3-lab-host1-d3-27b", "scur": 0, "status": "UP"}
    assert out["servers"] == [{**LITE3, "scur": 0, "status": "UP"}, {"backend": "be_d3-lite", "server": "new", "scur": 0,
                                                                      "status": "MISSING"}]  # fmt: skip
    assert out["missing"] == [{"backend": "be_d3-lite", "server": "new"}]


def test_router_defaults_to_the_socket(haproxy: FakeHAProxy, capsys: pytest.CaptureFixture[str]) -> None:
    out = run_main(capsys, socket=haproxy.path)
    assert out["router"] == haproxy.path and out["missing"] == [] and out["servers"] == []


# --- setting -------------------------------------------------------------------------------------------------------


def test_drain_sets_only_the_servers_not_drained_yet(haproxy: FakeHAProxy, capsys: pytest.CaptureFixture[str]) -> None:
    haproxy.status[(LITE3["backend"], LITE3["server"])] = ["DRAIN"]
    out = run_main(capsys, socket=haproxy.path, router="r1", servers=[LITE2, LITE3, FLASH], state="drain")
    assert haproxy.commands == ["show stat", "set server be_d3-lite/d3-lab-host2-d3-lite state drain",
                                "set server be_d3-flash/d3-lab-host2-d3-flash state drain"]  # fmt: skip
    assert out["changed"] is True and out["state"] == "drain"
    assert out["changed_servers"] == ["be_d3-lite/d3-lab-host2-d3-lite", "be_d3-flash/d3-lab-host2-d3-flash"]


def test_drain_of_drained_servers_changes_nothing(haproxy: FakeHAProxy, capsys: pytest.CaptureFixture[str]) -> None:
    haproxy.status[(LITE2["backend"], LITE2["server"])] = ["DRAIN 1/2"]
    out = run_main(capsys, socket=haproxy.path, servers=[LITE2], state="drain")
    assert haproxy.commands == ["show stat"] and out["changed"] is False and out["changed_servers"] == []


def test_ready_gives_back_drained_down_and_maint_servers_only(haproxy: FakeHAProxy, capsys: pytest.CaptureFixture[str]) -> None:
    haproxy.status[("be_d3-lite", "d3-lab-host2-d3-lite")] = ["DRAIN"]
    haproxy.status[("be_d3-flash", "d3-lab-host2-d3-flash")] = ["DOWN 1/2"]  # drained or not: show stat cannot tell
    haproxy.status[("be_d3-nano", "d3-lab-host2-d3-nano")] = ["MAINT"]
    haproxy.status[("be_d3-mini", "d3-lab-host1-d3-mini")] = ["NOLB"]
    nano, mini = {"backend": "be_d3-nano", "server": "d3-lab-host2-d3-nano"}, {"backend": "be_d3-mini", "server": "d3-lab-host1-d3-mini"}
    out = run_main(capsys, socket=haproxy.path, servers=[LITE2, LITE3, FLASH, nano, mini], state="ready")
    # each through maintenance, so that HAProxy's slowstart ramps it up (it applies when a server leaves MAINT); the
    # DOWN one straight from DRAIN: leaving MAINT would make it UP 1/2 until its first check fails
    # (tests/contracts/haproxy/giveback-down.json); it ramps when its checks pass
    assert haproxy.commands[1:] == [
        "set server be_d3-lite/d3-lab-host2-d3-lite state maint", "set server be_d3-lite/d3-lab-host2-d3-lite state ready",
        "set server be_d3-flash/d3-lab-host2-d3-flash state ready",
        "set server be_d3-nano/d3-lab-host2-d3-nano state maint", "set server be_d3-nano/d3-lab-host2-d3-nano state ready"]  # fmt: skip
    assert out["changed"] is True and len(out["changed_servers"]) == 3 and out["state_saved"] == ""


def test_check_mode_reports_what_would_change_and_sends_nothing(haproxy: FakeHAProxy, capsys: pytest.CaptureFixture[str]) -> None:
    out = run_main(capsys, socket=haproxy.path, servers=[LITE2], state="drain", wait=True, _ansible_check_mode=True)
    assert haproxy.commands == ["show stat"]
    assert out["changed"] is True and out["changed_servers"] == ["be_d3-lite/d3-lab-host2-d3-lite"] and out["waited_s"] == 0.0


# --- the saved state --------------------------------------------------------------------------------------------

# a version 1 dump as both versions print it (tests/contracts/haproxy/server-state.json): the module writes only that
STATE = (json.loads((ROOT / "tests/contracts/haproxy/server-state.json").read_text())["header"]
         + "4 be_d3-lite 1 d3-lab-host2-d3-lite 10.0.0.2 2 8 1 1 7 15 3 4 6 0 0 0 - 9001 - 0 0 - - 0\n")  # fmt: skip


def test_a_change_writes_show_servers_state_to_the_state_file(haproxy: FakeHAProxy, capsys: pytest.CaptureFixture[str],
                                                               tmp_path: Path) -> None:  # fmt: skip
    """After the servers' state changed, `show servers state` goes where HAProxy's server-state-file reads it (a
    start after kill -9 applies the state as it is now, not the last reload's), world-readable, no temporary left."""
    haproxy.servers_state = STATE
    target = tmp_path / "server-state"
    target.write_text("1\nan older state\n")
    out = run_main(capsys, socket=haproxy.path, servers=[LITE2], state="drain", state_file=str(target))
    assert haproxy.commands == ["show stat", "set server be_d3-lite/d3-lab-host2-d3-lite state drain", "show servers state"]
    assert target.read_text() == STATE and out["state_saved"] == str(target) and "warnings" not in out
    # no temporary left; the lock the reload holds too (d3_server_state.locked), root's only
    assert oct(target.stat().st_mode & 0o777) == "0o644"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["server-state", "server-state.lock"]
    assert oct((tmp_path / "server-state.lock").stat().st_mode & 0o777) == "0o600"
    out = run_main(capsys, socket=haproxy.path, servers=[LITE2], state="ready", state_file=str(target))
    assert haproxy.commands[-1] == "show servers state" and out["state_saved"] == str(target)
    # the temporary file is the module's own (the reload's save runs beside it: the HAProxy maintainer's review found
    # both writing server-state.d3-new and, 22-28 times in 200, no state file left): a path taken by another is no bar
    (tmp_path / "server-state.d3-new").mkdir()
    out = run_main(capsys, socket=haproxy.path, servers=[LITE2], state="drain", state_file=str(target))
    assert out["state_saved"] == str(target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["server-state", "server-state.d3-new", "server-state.lock"]


def test_nothing_changed_nothing_written(haproxy: FakeHAProxy, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    haproxy.servers_state = STATE
    haproxy.status[(LITE2["backend"], LITE2["server"])] = ["DRAIN"]
    out = run_main(capsys, socket=haproxy.path, servers=[LITE2], state="drain", state_file=str(tmp_path / "s"))
    assert haproxy.commands == ["show stat"] and out["state_saved"] == "" and not (tmp_path / "s").exists()
    out = run_main(capsys, socket=haproxy.path, servers=[LITE3], state="drain", state_file=str(tmp_path / "s"), _ansible_check_mode=True)
    assert out["changed"] is True and out["state_saved"] == "" and not (tmp_path / "s").exists()


@pytest.mark.parametrize("answer", ["Unknown command.\n", "", "2\n# a format this module does not know\n",
                                    "1\n# be_id be_name srv_id\n4 be_d3-lite 1\n"])  # fmt: skip
def test_a_state_that_cannot_be_read_patches_the_last_file_and_warns(haproxy: FakeHAProxy, capsys: pytest.CaptureFixture[str],
                                                                     tmp_path: Path, answer: str,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """The last file holds every other server's state (a drain the rollout made before): it gets this change and is
    never removed (the review of 2026-12-05: a stop between the module's set and its save removed the file ExecStop had
    just written, and the restart brought every drain back ready)."""
    haproxy.servers_state = answer
    warned: list[str] = []  # AnsibleModule.warn (where the warning goes depends on what else the process imported)
    monkeypatch.setattr(haproxy_runtime.AnsibleModule, "warn", lambda _self, text: warned.append(text))
    target = tmp_path / "server-state"
    header = json.loads((ROOT / "tests/contracts/haproxy/server-state.json").read_text())["header"]
    other = "4 be_d3-lite 2 d3-lab-host3-d3-lite 10.0.0.3 2 8 1 1 7 15 3 4 6 0 0 0 - 9001 - 0 0 - - 0\n"  # drained
    mine = "4 be_d3-lite 1 d3-lab-host2-d3-lite 10.0.0.2 2 1 1 1 7 15 3 4 6 0 0 0 - 9001 - 0 0 - - 0\n"  # in MAINT
    target.write_text(header + mine + other)
    out = run_main(capsys, socket=haproxy.path, router="r1", servers=[LITE2], state="drain", state_file=str(target))
    assert out["changed"] is True and out["state_saved"] == str(target) and out["state_patched"] is True
    assert target.read_text() == header + mine.replace(" 2 1 1 1 ", " 2 8 1 1 ") + other  # FDRAIN set, FMAINT cleared
    assert warned == [f"r1: `show servers state` could not be read after the change; {target} got the change over its "
                      "last saved states instead (every other server as last saved)."]  # fmt: skip
    # no last file to patch: nothing written, said so
    target.unlink()
    out = run_main(capsys, socket=haproxy.path, router="r1", servers=[LITE2], state="ready", state_file=str(target))
    assert out["state_saved"] == "" and out["state_patched"] is False and not target.exists()
    assert warned[1] == (f"r1: `show servers state` could not be read after the change and there is no last {target} to "
                         "patch: a start applies the configuration's states until the next change or reload.")  # fmt: skip
    # saved, or nothing changed: no warning
    haproxy.servers_state = STATE
    run_main(capsys, socket=haproxy.path, servers=[LITE3], state="drain", state_file=str(target))
    run_main(capsys, socket=haproxy.path, servers=[LITE3], state="drain", state_file="")
    assert len(warned) == 2 and target.read_text() == STATE


def test_a_state_file_that_cannot_be_written_stays_as_it_was(haproxy: FakeHAProxy, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    haproxy.servers_state = STATE
    target = tmp_path / "s"
    target.write_text("1\nan older state\n")

    def full(*_: object) -> None:
        raise OSError("No space left on device")

    monkeypatch.setattr(haproxy_runtime, "write", full)
    out = haproxy_runtime.run(params(haproxy.path, servers=[LITE2], state="drain", state_file=str(target)), False)
    assert out["state_saved"] == "" and out["changed"] is True and target.read_text() == "1\nan older state\n"


def test_a_lock_that_cannot_be_opened_is_refused_before_anything_is_set(haproxy: FakeHAProxy, tmp_path: Path) -> None:
    """The reload's lock lives beside the state file. Without its directory no reload saves there either: the change
    goes ahead unlocked (and the save fails, said so); a lock that exists but cannot be opened is refused."""
    missing = tmp_path / "no-dir" / "s"
    out = haproxy_runtime.run(params(haproxy.path, servers=[LITE2], state="drain", state_file=str(missing)), False)
    assert out["changed_servers"] == ["be_d3-lite/d3-lab-host2-d3-lite"] and out["state_saved"] == ""
    assert not (tmp_path / "no-dir").exists()
    (tmp_path / "s.lock").mkdir()  # a directory where the lock should be: EISDIR
    refusal = r"the lock .*/s\.lock cannot be opened: .*Is a directory.*; nothing was set\.$"
    with pytest.raises(haproxy_runtime.Refusal, match=refusal) as refused:
        haproxy_runtime.run(params(haproxy.path, servers=[LITE3], state="drain", state_file=str(tmp_path / "s")), False)
    assert haproxy.commands[-1] == "show stat" and "Is a directory" in refused.value.error


@pytest.mark.parametrize("path", ["relative/state", "/var/lib/../etc/passwd", "/var/lib/haproxy/a b", "/var/./x"])
def test_a_state_file_path_that_is_not_plain_is_refused_before_anything_is_sent(haproxy: FakeHAProxy, path: str) -> None:
    with pytest.raises(haproxy_runtime.Refusal, match=r"the state file .* is not a plain absolute path"):
        haproxy_runtime.run(params(haproxy.path, servers=[LITE2], state="drain", state_file=path), False)
    assert haproxy.commands == []


def test_the_module_writes_the_file_the_router_role_configures() -> None:
    """One fact in two languages: the module's default state_file is the d3_router role's server-state-file."""
    role = yaml.safe_load((ROOT / "roles/d3_router/vars/main.yml").read_text())["_d3_router_state_file"]
    assert haproxy_runtime.ARGUMENT_SPEC["state_file"]["default"] == role


# --- waiting -------------------------------------------------------------------------------------------------------


def test_drain_waits_until_no_session_is_left(haproxy: FakeHAProxy) -> None:
    haproxy.scur[("be_d3-lite", "d3-lab-host2-d3-lite")] = [0, 2, 1, 0]  # the first read decides what to set
    haproxy.scur[("be_d3-lite", "d3-lab-host3-d3-lite")] = [5]  # not drained: its sessions do not count
    clock = Clock()
    out = haproxy_runtime.run(params(haproxy.path, servers=[LITE2], state="drain", wait=True, poll=0.5), False, clock,
                              clock.sleep)  # fmt: skip
    assert haproxy.commands == ["show stat", "set server be_d3-lite/d3-lab-host2-d3-lite state drain", "show stat",
                                "show stat", "show stat"]  # fmt: skip
    assert clock.sleeps == [0.5, 0.5] and out["waited_s"] == 1.0
    assert out["servers"] == [{**LITE2, "scur": 0, "status": "DRAIN"}]


def test_a_drain_returns_what_each_server_had_in_flight_when_it_was_drained(haproxy: FakeHAProxy) -> None:
    haproxy.scur[("be_d3-lite", "d3-lab-host2-d3-lite")] = [3, 1, 0]  # 3 in flight when drained, then they finish
    clock = Clock()
    out = haproxy_runtime.run(params(haproxy.path, servers=[LITE2], state="drain", wait=True, poll=0.5), False, clock,
                              clock.sleep)  # fmt: skip
    assert out["before"] == [{**LITE2, "scur": 3, "status": "UP"}]
    assert out["servers"] == [{**LITE2, "scur": 0, "status": "DRAIN"}]
    # only reading: before and servers are the same read
    read = haproxy_runtime.run(params(haproxy.path, servers=[LITE3]), False, clock, clock.sleep)
    assert read["before"] == read["servers"] and read["before"][0]["server"] == LITE3["server"]


def test_ready_waits_until_every_server_is_up(haproxy: FakeHAProxy) -> None:
    haproxy.status[("be_d3-lite", "d3-lab-host2-d3-lite")] = ["DRAIN"]
    clock = Clock()
    out = haproxy_runtime.run(params(haproxy.path, servers=[LITE2, LITE3], state="ready", wait=True), False, clock, clock.sleep)
    assert haproxy.commands == ["show stat", "set server be_d3-lite/d3-lab-host2-d3-lite state maint",
                                "set server be_d3-lite/d3-lab-host2-d3-lite state ready", "show stat"]  # fmt: skip
    assert clock.sleeps == [] and out["waited_s"] == 0.0 and out["changed_servers"] == ["be_d3-lite/d3-lab-host2-d3-lite"]


def test_ready_wait_polls_a_server_that_is_not_up_yet(haproxy: FakeHAProxy) -> None:
    haproxy.status[("be_d3-lite", "d3-lab-host2-d3-lite")] = ["DOWN"]
    haproxy.after_set[("be_d3-lite", "d3-lab-host2-d3-lite")] = ["DOWN", "UP 1/2", "UP"]
    clock = Clock()
    out = haproxy_runtime.run(params(haproxy.path, servers=[LITE2], state="ready", wait=True), False, clock, clock.sleep)
    assert haproxy.commands.count("show stat") == 4 and clock.sleeps == [1.0, 1.0] and out["waited_s"] == 2.0


def test_drain_wait_fails_at_the_deadline_naming_the_servers(haproxy: FakeHAProxy) -> None:
    haproxy.scur[("be_d3-lite", "d3-lab-host2-d3-lite")] = [3]
    haproxy.status[("be_d3-lite", "d3-lab-host3-d3-lite")] = ["DRAIN"]
    haproxy.scur[("be_d3-lite", "d3-lab-host3-d3-lite")] = [0]
    clock = Clock()
    with pytest.raises(haproxy_runtime.Refusal) as refused:
        haproxy_runtime.run(params(haproxy.path, servers=[LITE2, LITE3], state="drain", wait=True, timeout=3), False,
                            clock, clock.sleep)  # fmt: skip
    assert str(refused.value) == (
        f"router r1 (HAProxy runtime API {haproxy.path}): the servers be_d3-lite/d3-lab-host2-d3-lite (3 sessions) still "
        "serve requests after 3 s (timeout)."
    )
    assert clock.sleeps == [1.0, 1.0, 1.0]


def test_ready_wait_fails_at_the_deadline_naming_the_servers(haproxy: FakeHAProxy) -> None:
    haproxy.status[("be_d3-lite", "d3-lab-host2-d3-lite")] = ["DRAIN"]
    haproxy.after_set[("be_d3-lite", "d3-lab-host2-d3-lite")] = ["DOWN"]
    clock = Clock()
    with pytest.raises(haproxy_runtime.Refusal) as refused:
        haproxy_runtime.run(params(haproxy.path, servers=[LITE2], state="ready", wait=True, timeout=2, poll=1.5), False,
                            clock, clock.sleep)  # fmt: skip
    assert str(refused.value) == (
        f"router r1 (HAProxy runtime API {haproxy.path}): the servers be_d3-lite/d3-lab-host2-d3-lite (DOWN) are not UP "
        "after 2 s (timeout)."
    )
    assert clock.sleeps == [1.5, 1.5]


def test_without_wait_nothing_is_polled(haproxy: FakeHAProxy) -> None:
    haproxy.scur[("be_d3-lite", "d3-lab-host2-d3-lite")] = [4]
    clock = Clock()
    out = haproxy_runtime.run(params(haproxy.path, servers=[LITE2], state="drain"), False, clock, clock.sleep)
    assert haproxy.commands.count("show stat") == 1 and clock.sleeps == [] and out["servers"][0]["scur"] == 4


# --- refusals ------------------------------------------------------------------------------------------------------


def test_a_refused_command_fails_naming_router_socket_and_server(haproxy: FakeHAProxy, capsys: pytest.CaptureFixture[str]) -> None:
    haproxy.refuse = "Permission denied"
    out = run_main(capsys, socket=haproxy.path, router="r1", servers=[LITE2], state="drain")
    assert out["failed"] is True and (out["router"], out["socket"], out["state"]) == ("r1", haproxy.path, "drain")
    assert out["msg"] == (f"router r1 (HAProxy runtime API {haproxy.path}): `set server be_d3-lite/d3-lab-host2-d3-lite "
                          "state drain` was refused: Permission denied")  # fmt: skip


def test_a_server_the_router_does_not_know_is_refused_before_any_set(haproxy: FakeHAProxy, capsys: pytest.CaptureFixture[str]) -> None:
    out = run_main(capsys, socket=haproxy.path, router="r1", servers=[LITE2, {"backend": "be_d3-lite", "server": "l4-new"}],
                   state="ready")  # fmt: skip
    assert haproxy.commands == ["show stat"]
    assert out["msg"] == (f"router r1 (HAProxy runtime API {haproxy.path}) does not know the servers be_d3-lite/l4-new: "
                          "nothing was set. Configure the routers first: "
                          "ansible-playbook site.yml -l d3-routers --tags router")  # fmt: skip


def test_no_haproxy_at_the_socket_fails_with_the_socket_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = str(tmp_path / "none.sock")
    out = run_main(capsys, socket=path, router="r1")
    assert out["failed"] is True and out["error"] == "[Errno 2] No such file or directory"
    assert out["msg"] == (f"router r1 (HAProxy runtime API {path}): HAProxy's runtime API does not answer `show stat`: "
                          "[Errno 2] No such file or directory.")  # fmt: skip


def test_an_answer_that_is_not_show_stat_fails(haproxy: FakeHAProxy, capsys: pytest.CaptureFixture[str]) -> None:
    haproxy.answer_stat = "Unknown command.\n  help   :  this message\n\n"
    out = run_main(capsys, socket=haproxy.path, router="r1")
    assert out["msg"] == (f"router r1 (HAProxy runtime API {haproxy.path}): the answer to `show stat` is not HAProxy's CSV: "
                          "'Unknown command. help : this message'.")  # fmt: skip
    assert out["error"] == "not show stat: 'Unknown command. help : this message'"


def test_a_set_that_breaks_off_fails_naming_the_command(haproxy: FakeHAProxy, monkeypatch: pytest.MonkeyPatch) -> None:
    real = haproxy_runtime.ask_as

    def ask_as(path: str, command: str, timeout: float) -> tuple[int | None, str]:
        if command.startswith("set "):
            raise ConnectionResetError(104, "Connection reset by peer")
        return real(path, command, timeout)

    monkeypatch.setattr(haproxy_runtime, "ask_as", ask_as)
    with pytest.raises(haproxy_runtime.Refusal) as refused:
        haproxy_runtime.run(params(haproxy.path, servers=[LITE2], state="drain"), False)
    assert str(refused.value) == (f"router r1 (HAProxy runtime API {haproxy.path}): `set server be_d3-lite/d3-lab-host2-d3-lite "
                                  "state drain` failed: [Errno 104] Connection reset by peer.")  # fmt: skip


@pytest.mark.parametrize("path", ["run/admin.sock", "/run/haproxy/admin.sock\nshow stat", "/run/x y", "/run/../etc/x",
                                  "/run/./x", "/run/haproxy/", "/run//x"])  # fmt: skip
def test_a_socket_path_that_is_not_plain_is_refused_before_connecting(path: str) -> None:
    with pytest.raises(haproxy_runtime.Refusal) as refused:
        haproxy_runtime.run(params(path, router="r9"), False)
    assert str(refused.value) == (f"router r9 (HAProxy runtime API {path}): the stats socket {path!r} is not a plain absolute "
                                  "path (/dir/name: letters, digits, . _ - @ +; no .. or spaces).")  # fmt: skip


def test_plain_socket_paths_pass(haproxy: FakeHAProxy) -> None:
    for path in ["/run/haproxy/admin.sock", "/var/run/ha_proxy@1/a+b.sock"]:
        assert haproxy_runtime.PLAIN_PATH.match(path)
    assert haproxy_runtime.run(params(haproxy.path), False)["changed"] is False


@pytest.mark.parametrize("server", [{"backend": "be_x; shutdown sessions", "server": "s"}, {"backend": "be_x", "server": "s\nshow stat"},
                                    {"backend": "be_x"}])  # fmt: skip
def test_a_server_name_that_is_not_an_haproxy_name_is_refused_before_anything_is_sent(haproxy: FakeHAProxy, server: dict) -> None:
    with pytest.raises(haproxy_runtime.Refusal) as refused:
        haproxy_runtime.run(params(haproxy.path, servers=[LITE2, server], state="drain"), False)
    assert str(refused.value).startswith(f"router r1 (HAProxy runtime API {haproxy.path}): server {server!r}: ")
    assert str(refused.value).endswith(" is not an HAProxy name (letters, digits, . _ : -); nothing was sent to the router.")
    assert haproxy.commands == []


def test_server_names_are_checked_without_a_state_too(haproxy: FakeHAProxy) -> None:
    with pytest.raises(haproxy_runtime.Refusal, match="backend name 'be x' is not an HAProxy name"):
        haproxy_runtime.run(params(haproxy.path, servers=[{"backend": "be x", "server": "s"}]), False)
    assert haproxy.commands == []


@pytest.mark.parametrize(("name", "value", "text"), [
    ("timeout", 0, "timeout = 0 is not 1-86400 whole seconds."),
    ("timeout", 86401, "timeout = 86401 is not 1-86400 whole seconds."),
    ("poll", 0.04, "poll = 0.04 is not 0.05-60 seconds."),
    ("poll", 60.5, "poll = 60.5 is not 0.05-60 seconds."),
    ("connect_timeout", 0.05, "connect_timeout = 0.05 is not 0.1-300 seconds."),
    ("connect_timeout", 301, "connect_timeout = 301 is not 0.1-300 seconds."),
])  # fmt: skip
def test_waits_out_of_range_are_refused(haproxy: FakeHAProxy, name: str, value: float, text: str) -> None:
    with pytest.raises(haproxy_runtime.Refusal) as refused:
        haproxy_runtime.run(params(haproxy.path, **{name: value}), False)
    assert str(refused.value) == f"router r1 (HAProxy runtime API {haproxy.path}): {text}"
    assert haproxy.commands == []


@pytest.mark.parametrize(("name", "value"), [("timeout", 1), ("timeout", 86400), ("poll", 0.05), ("poll", 60),
                                             ("connect_timeout", 0.1), ("connect_timeout", 300)])  # fmt: skip
def test_waits_at_the_bounds_pass(haproxy: FakeHAProxy, name: str, value: float) -> None:
    assert haproxy_runtime.run(params(haproxy.path, **{name: value}), False)["changed"] is False


def test_ask_reads_the_whole_answer_until_haproxy_closes(haproxy: FakeHAProxy) -> None:
    text = haproxy_runtime.ask(haproxy.path, "show stat", 5)
    assert text.startswith("# pxname,svname,") and text.endswith("\n\n") and len(text) > 65536 // 8
    assert text.count("\n") == len(CAPTURED) + 1


# --- module_utils/d3_haproxy.py --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("status", "state", "already"), [
    ("DRAIN", "drain", True), ("DRAIN 1/2", "drain", True), ("UP", "drain", False), ("DOWN", "drain", False),
    ("MAINT", "drain", False), ("UP", "ready", True), ("UP 1/3", "ready", True), ("NOLB", "ready", True),
    ("DRAIN", "ready", False), ("DOWN", "ready", False), ("MAINT", "ready", False), ("no check", "ready", False),
    ("", "ready", False), ("MAINT", "maint", True), ("MAINT(via)", "maint", True), ("DRAIN", "maint", False),
])  # fmt: skip
def test_in_state_takes_only_what_show_stat_proves(status: str, state: str, already: bool) -> None:
    assert d3_haproxy.in_state(status, state) is already


def test_parse_stat_reads_the_four_fields_of_every_row() -> None:
    rows = d3_haproxy.parse_stat("# pxname,svname,qcur,qmax,scur,status\nbe,s1,0,0,,DRAIN\n\nbe,s2,0,0,7,\n")
    assert rows == [{"backend": "be", "server": "s1", "scur": 0, "status": "DRAIN"},
                    {"backend": "be", "server": "s2", "scur": 7, "status": ""}]  # fmt: skip


@pytest.mark.parametrize("text", ["", "\n\n", "pxname,svname\nbe,s\n", "#pxname,svname\n"])
def test_parse_stat_refuses_what_is_not_show_stat(text: str) -> None:
    with pytest.raises(ValueError) as refused:
        d3_haproxy.parse_stat(text)
    assert str(refused.value) == f"not the output of `show stat`: {text[:200]!r}"


def test_select_copies_rows_so_callers_cannot_change_the_stat() -> None:
    rows = [{"backend": "b", "server": "s", "scur": 1, "status": "UP"}]
    picked = d3_haproxy.select(rows, [{"backend": "b", "server": "s"}])
    picked[0]["status"] = "X"
    assert rows[0]["status"] == "UP"


def test_set_command_accepts_every_haproxy_name_character_and_the_longest_name() -> None:
    name = "A-z_0.9:" + "x" * 119
    assert d3_haproxy.set_command({"backend": name, "server": "s"}, "maint") == f"set server {name}/s state maint"
    with pytest.raises(ValueError, match="is not an HAProxy name"):
        d3_haproxy.set_command({"backend": name + "x", "server": "s"}, "maint")


# --- d3_router_api_problems ------------------------------------------------------------------------------------------


def test_api_problems_name_the_router_socket_and_error_or_the_missing_servers() -> None:
    results = [
        {"item": "r1", "router": "r1", "socket": "/run/a.sock", "stat": [], "missing": []},
        {"item": "r2", "router": "r2", "socket": "/run/b.sock", "failed": True, "msg": "long", "error": "[Errno 2] No such file"},
        {"item": "r3", "socket": "/run/c.sock", "stat": [], "missing": [{"backend": "be_a", "server": "h-a"},
                                                                          {"backend": "be_b", "server": "h-a"},
                                                                          {"backend": "be_b", "server": "h-b"}]},
        {"item": "r4", "unreachable": True, "msg": "Failed to connect\n  to the host via ssh"},
        {"msg": ""},
    ]  # fmt: skip
    assert d3_router_api.router_api_problems(results) == [
        "r2: no HAProxy runtime API at /run/b.sock ([Errno 2] No such file).",
        "r3 does not know the servers h-a, h-b.",
        "r4: no HAProxy runtime API at ? (Failed to connect to the host via ssh).",
        "router: no HAProxy runtime API at ? (no answer).",
    ]


def test_api_problems_cut_a_long_error_at_160_characters() -> None:
    exact, longer = "e" * 160, "e" * 161
    assert d3_router_api.router_api_problems([{"router": "r", "error": exact}]) == [f"r: no HAProxy runtime API at ? ({exact})."]
    assert d3_router_api.router_api_problems([{"router": "r", "error": longer}]) == [f"r: no HAProxy runtime API at ? ({'e' * 157}...)."]


def test_router_status_reads_the_modules_rows(haproxy: FakeHAProxy) -> None:
    haproxy.status[("be_d3-lite", "d3-lab-host2-d3-lite")] = ["DRAIN"]
    rows = haproxy_runtime.run(params(haproxy.path), False)["stat"]
    lines = d3_router_api.router_status(rows, "r1")
    assert "r1: d3-lite: 1 up, 1 draining, 0 down, 0 in maintenance; draining: d3-lab-host2-d3-lite" in lines
    assert lines == d3_router_api.router_status(haproxy_runtime.ask(haproxy.path, "show stat", 5), "r1")


# --- d3_rollout_downtimes, d3_systemctl_show ---------------------------------------------------------------------------


def test_downtimes_of_restarted_and_new_instances() -> None:
    times = [
        {"item": {"name": "d3-lite", "unit": "d3-lite", "new": False, "reason": "unit changed"},
         "stdout": "ActiveExitTimestampMonotonic=5000000\nInactiveExitTimestampMonotonic=5200000\n"},
        {"item": {"name": "d3-nano", "unit": "d3-nano", "new": True, "reason": ""},
         "stdout": "ActiveExitTimestampMonotonic=0\nInactiveExitTimestampMonotonic=7000000"},
        {"item": {"name": "d3-mini", "unit": "d3-mini", "new": False, "reason": "x"}, "stdout": ""},
        {"item": {"name": "d3-edge", "unit": "d3-edge", "new": True, "reason": ""}, "stdout": ""},
    ]  # fmt: skip
    smoke = [{"instance": "d3-lite", "ready_monotonic": 6.44}, {"instance": "d3-nano", "ready_monotonic": "10.25"}]
    assert d3_rollout.rollout_downtimes(times, smoke) == [
        "d3-lite: down 1.4 s (unit stop to ready; unit changed; smoke passed)",
        "d3-nano: new, ready 3.2 s after its start (no downtime: it was not serving)",
        "d3-mini: restarted; no ready time from the smoke test",
        "d3-edge: new; no ready time from the smoke test",
    ]


def test_downtimes_read_missing_timestamps_as_zero() -> None:
    times = [{"item": {"name": "a", "unit": "a", "new": False, "reason": "r"}, "stdout": "Other=1\nnoequals"},
             {"item": {"name": "a", "unit": "b", "new": True}, "stdout": None}]  # fmt: skip
    assert d3_rollout.rollout_downtimes(times, [{"instance": "a", "ready_monotonic": 2}]) == [
        "a: down 2.0 s (unit stop to ready; r; smoke passed)",
        "b: new, ready 2.0 s after its start (no downtime: it was not serving)",
    ]


def test_systemctl_show_maps_blocks_to_units() -> None:
    text = ("Id=d3-lite.service\nActiveState=active\nNRestarts=0\nExecStart={ path=/x ; argv[]=a=b }\n\n"
            "ActiveState=inactive\n\nId=d3.service.d\nNRestarts=3\n\nId=other\n")  # fmt: skip
    assert d3_rollout.systemctl_show(text) == {
        "d3-lite": {"Id": "d3-lite.service", "ActiveState": "active", "NRestarts": "0", "ExecStart": "{ path=/x ; argv[]=a=b }"},
        "d3.service.d": {"Id": "d3.service.d", "NRestarts": "3"},
        "other": {"Id": "other"},
    }
    assert d3_rollout.systemctl_show("") == {} and d3_rollout.systemctl_show(None) == {}  # type: ignore[arg-type]


def test_every_missing_and_every_pending_server_is_named(haproxy: FakeHAProxy) -> None:
    gone = [{"backend": "be_d3-lite", "server": "l4-x"}, {"backend": "be_d3-nano", "server": "l4-y"}]
    with pytest.raises(haproxy_runtime.Refusal, match=r"does not know the servers be_d3-lite/l4-x, be_d3-nano/l4-y: nothing"):
        haproxy_runtime.run(params(haproxy.path, servers=[LITE2, *gone], state="drain"), False)
    haproxy.scur[("be_d3-lite", "d3-lab-host2-d3-lite")] = [1]
    haproxy.scur[("be_d3-lite", "d3-lab-host3-d3-lite")] = [2]
    clock = Clock()
    with pytest.raises(haproxy_runtime.Refusal, match=r"servers be_d3-lite/d3-lab-host2-d3-lite \(1 sessions\), "
                                                      r"be_d3-lite/d3-lab-host3-d3-lite \(2 sessions\) still serve"):  # fmt: skip
        haproxy_runtime.run(params(haproxy.path, servers=[LITE2, LITE3], state="drain", wait=True, timeout=1), False, clock,
                            clock.sleep)  # fmt: skip


def test_a_long_refusal_is_cut_at_200_characters(haproxy: FakeHAProxy) -> None:
    haproxy.refuse = "x" * 250
    with pytest.raises(haproxy_runtime.Refusal) as refused:
        haproxy_runtime.run(params(haproxy.path, servers=[LITE2], state="drain"), False)
    assert str(refused.value).endswith("state drain` was refused: " + "x" * 200)


def test_a_socket_that_never_answers_fails_after_connect_timeout() -> None:
    with FakeHAProxy.started() as fake:
        fake.close()  # nothing accepts: the connection waits in the listen backlog, HAProxy would answer
        silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        Path(fake.path).unlink()
        silent.bind(fake.path)
        silent.listen(1)
        try:
            with pytest.raises(haproxy_runtime.Refusal) as refused:
                haproxy_runtime.run(params(fake.path, connect_timeout=0.2), False)
        finally:
            silent.close()
    assert str(refused.value).endswith("HAProxy's runtime API does not answer `show stat`: timed out.")


def test_downtimes_keep_values_that_hold_an_equals_sign() -> None:
    times = [{"item": {"name": "a", "unit": "a", "new": False, "reason": "r"},
              "stdout": "ActiveExitTimestampMonotonic=1000000=x\n"}]  # fmt: skip
    with pytest.raises(ValueError, match="could not convert string to float: '1000000=x'"):
        d3_rollout.rollout_downtimes(times, [{"instance": "a", "ready_monotonic": 2}])


# --- every worker (the master CLI) ------------------------------------------------------------------------------------

KEY2 = ("be_d3-lite", "d3-lab-host2-d3-lite")


def test_a_drain_wait_counts_the_sessions_of_old_workers_after_a_reload(haproxy: FakeHAProxy) -> None:
    """A reload during the wait: the stats socket reaches the new worker (0 sessions), the old one still serves the
    drained server's requests in flight; the wait ends only when the old one has none left."""
    haproxy.scur[KEY2] = [3, 0]  # 3 in flight when drained; the new worker shows 0 from the first poll on
    haproxy.pid = 11  # the drain is taken by the current worker (the first show proc is the set's: module `send`)
    clock = Clock()
    with FakeMaster.started([{11: {KEY2: 3}}, {11: {KEY2: 3}}, {22: {KEY2: 0}, 11: {KEY2: 2}}, {22: {}, 11: {KEY2: 1}},
                             {22: {}}]) as master:  # fmt: skip
        out = haproxy_runtime.run(params(haproxy.path, master_socket=master.path, servers=[LITE2], state="drain",
                                         wait=True, poll=0.5), False, clock, clock.sleep)  # fmt: skip
        commands = list(master.commands)
    assert clock.sleeps == [0.5, 0.5, 0.5] and out["waited_s"] == 1.5
    assert out["workers_seen"] == {11: 3}
    assert out["servers"] == [{**LITE2, "scur": 0, "status": "DRAIN"}]
    assert commands[:5] == ["show proc", "show proc", "@!11 show stat", "show proc", "@!22 show stat"]
    assert commands[5] == "@!11 show stat"
    # the stats socket alone would have stopped waiting at the first poll
    haproxy.scur[KEY2] = [0]
    alone = haproxy_runtime.run(params(haproxy.path, servers=[LITE2], state="drain", wait=True, poll=0.5), False, Clock(),
                                lambda s: None)  # fmt: skip
    assert alone["waited_s"] == 0 and alone["workers_seen"] == {}


def test_every_worker_counts_and_a_worker_that_left_counts_nothing(haproxy: FakeHAProxy) -> None:
    haproxy.scur[KEY2] = [0]
    clock = Clock()
    # 33 is listed but gone by its show stat (the master no longer knows it); the first show proc is the set's
    haproxy.pid = 22
    with FakeMaster.started([{22: {KEY2: 1}, 11: {KEY2: 2}}, {22: {KEY2: 1}, 11: {KEY2: 2}}, {22: {}}]) as master:
        master_answer = master.answer

        def gone(command: str) -> str:
            if command == "show proc" and master.snapshots and len(master.snapshots) > 1:
                text = master_answer(command)
                return text.replace("# programs", "33            worker          2               0d00h01m50s     x\n# programs")
            return master_answer(command)

        master.answer = gone  # type: ignore[method-assign]
        out = haproxy_runtime.run(params(haproxy.path, master_socket=master.path, servers=[LITE2, LITE3], state="drain",
                                         wait=True, poll=1.0), False, clock, clock.sleep)  # fmt: skip
        assert "@!33 show stat" in master.commands
    assert out["workers_seen"] == {22: 1, 11: 2} and out["waited_s"] == 1.0


def test_a_master_cli_that_does_not_answer_fails_naming_the_variable(haproxy: FakeHAProxy, tmp_path: Path) -> None:
    """A master CLI that does not answer is waited for (a reload re-executes the master: its CLI refuses connections
    for 26-53 ms, the review of 2026-12-05), and the timeout names the variable."""
    clock = Clock()
    none = haproxy.path.replace("admin.sock", "none.sock")
    with pytest.raises(haproxy_runtime.Refusal, match=rf"HAProxy's master CLI {none} \(it does not answer `show proc`: .*; if it "
                       r"never does, set d3_router_master_socket to the -S socket of haproxy.service\) still serve requests "
                       r"after 3 s \(timeout\)"):  # fmt: skip
        haproxy_runtime.run(params(haproxy.path, master_socket=none, servers=[LITE2], state="drain", wait=True, timeout=3),
                            False, clock, clock.sleep)  # fmt: skip
    assert clock.sleeps == [1.0, 1.0, 1.0]
    with FakeMaster.started([{}]) as master:
        master.answer_proc = "Unknown command.\n"
        clock = Clock()
        with pytest.raises(haproxy_runtime.Refusal, match=r"did not answer `show proc` as HAProxy does: not the output.* after 2 s"):
            haproxy_runtime.run(params(haproxy.path, master_socket=master.path, servers=[LITE2], state="drain", wait=True,
                                       timeout=2), False, clock, clock.sleep)  # fmt: skip
        # a master that answers again within the wait: the wait goes on and ends when the sessions do
        master.commands.clear()
        master.answer_proc = None
        haproxy.pid = 7
        master.snapshots = [{7: {KEY2: 0}}]
        haproxy.scur[KEY2] = [0]
        real = master.answer
        calls: list[str] = []

        def down_once(command: str) -> str:
            calls.append(command)
            return "Unknown command.\n" if calls.count("show proc") == 1 else real(command)

        master.answer = down_once  # type: ignore[method-assign]
        clock = Clock()
        out = haproxy_runtime.run(params(haproxy.path, master_socket=master.path, servers=[LITE2], state="drain", wait=True),
                                  False, clock, clock.sleep)  # fmt: skip
        assert out["waited_s"] == 1.0 and calls == ["show proc", "show proc", "@!7 show stat"]


@pytest.mark.parametrize("path", ["relative.sock", "/run/../x", "/run/a b", "/run/./x"])
def test_a_master_socket_path_that_is_not_plain_is_refused(path: str) -> None:
    with pytest.raises(haproxy_runtime.Refusal, match=f"the master socket {path!r} is not a plain absolute path"):
        haproxy_runtime.run(params("/run/haproxy/admin.sock", master_socket=path), False)


def test_parse_proc_of_the_captured_masters() -> None:
    contract = yaml.safe_load((ROOT / "tests/contracts/haproxy/master-cli.yml").read_text())
    for version, capture in contract["show_proc"].items():
        procs = d3_haproxy.parse_proc(capture["text"])
        assert [p["type"] for p in procs if p["section"] == "master"] == ["master"], version
        assert d3_haproxy.worker_pids(capture["text"]) == capture["workers"], version
    text = "#<PID> <type>\n1 master 0\n# workers\n2 worker 0\n# old workers\n3 worker 1\n# programs\n4 foo 0\n"
    assert d3_haproxy.worker_pids(text) == [2, 3]
    assert d3_haproxy.parse_proc(text)[3] == {"pid": 4, "type": "foo", "section": "programs"}
    with pytest.raises(ValueError, match="not the output of `show proc`"):
        d3_haproxy.parse_proc("# workers\n2 worker 0\n")
    assert d3_haproxy.worker_pids("1 master\n# workers\nx worker\n5\n") == []


def test_a_worker_the_master_cli_could_not_ask_is_waited_for_not_counted_empty(haproxy: FakeHAProxy) -> None:
    """The HAProxy maintainer's review (2.6.12 and 3.0.11): a reload closes every master CLI connection (management.txt
    9.4), so `@!<pid> show stat` can end without an answer while that worker still serves the drained server's request.
    Before, that counted as 0 sessions (the wait ended with a 10 s request in flight). Now such a worker is unknown: the
    wait goes on until it answers, or until the master says it left (its own answer for a pid it does not know)."""
    haproxy.scur[KEY2] = [0]
    haproxy.pid = 22
    clock = Clock()
    with FakeMaster.started([{22: {KEY2: 0}, 11: {KEY2: 0}}]) as master:
        master.closed = {11}
        answer = master.answer
        asked: list[str] = []

        def reopen_after_two(command: str) -> str:
            asked.append(command)
            if asked.count("@!11 show stat") > 2:
                master.closed = set()
            return answer(command)

        master.answer = reopen_after_two  # type: ignore[method-assign]
        out = haproxy_runtime.run(params(haproxy.path, master_socket=master.path, servers=[LITE2], state="drain",
                                         wait=True, poll=1.0), False, clock, clock.sleep)  # fmt: skip
    assert out["waited_s"] == 2.0 and asked.count("@!11 show stat") == 3, asked
    # never readable: the timeout names the worker
    clock = Clock()
    with FakeMaster.started([{22: {KEY2: 0}, 11: {KEY2: 0}}]) as master:
        master.closed = {11}
        with pytest.raises(haproxy_runtime.Refusal, match=r"worker 11 \(its show stat could not be read\) still serve requests after 3 s"):
            haproxy_runtime.run(params(haproxy.path, master_socket=master.path, servers=[LITE2], state="drain", wait=True,
                                       timeout=3, poll=1.0), False, clock, clock.sleep)  # fmt: skip


def test_every_worker_after_one_that_left_or_did_not_answer_is_still_counted(haproxy: FakeHAProxy) -> None:
    """The master lists 22 (current), then the old workers 11 and 33; 33 still serves the drained server. Whether 22 has
    left (the master's own answer for a pid it does not know) or answered something else at the first poll, 11 and 33
    are still asked and 33's sessions counted (a `break` there would have ended the wait with 33's requests in flight)."""
    haproxy.scur[KEY2] = [0]
    haproxy.pid = 22
    for twenty_two in ("Can't find the target PID matching the prefix '@!22'\n", "garbage\n"):
        clock = Clock()
        first = {22: {KEY2: 0}, 11: {KEY2: 0}, 33: {KEY2: 2}}
        with FakeMaster.started([first, first, {22: {KEY2: 0}, 11: {KEY2: 0}}]) as master:
            answer = master.answer

            asked: list[str] = []

            def first_worker(command: str, answer: Any = answer, text: str = twenty_two, asked: list[str] = asked) -> str:
                asked.append(command)
                return text if command == "@!22 show stat" and asked.count(command) == 1 else answer(command)

            master.answer = first_worker  # type: ignore[method-assign]
            out = haproxy_runtime.run(params(haproxy.path, master_socket=master.path, servers=[LITE2], state="drain",
                                             wait=True, timeout=5, poll=1.0), False, clock, clock.sleep)  # fmt: skip
            assert out["workers_seen"] == {33: 2}, (twenty_two, out["workers_seen"])
            assert "@!11 show stat" in master.commands and "@!33 show stat" in master.commands


GIVEBACK = json.loads((ROOT / "tests/contracts/haproxy/giveback-down.json").read_text())


@pytest.mark.parametrize(("status", "steps"), [
    ("DOWN", ("ready",)), ("DOWN 1/2", ("ready",)), ("DOWN (agent)", ("ready",)),
    ("DRAIN", ("maint", "ready")), ("DRAIN 1/2", ("maint", "ready")), ("MAINT", ("maint", "ready")),
    ("MAINT (via be/s)", ("maint", "ready")), ("NOLB", ("maint", "ready")), ("UP 1/2", ("maint", "ready")),
    ("DOWNX", ("maint", "ready")), ("", ("maint", "ready")),
])  # fmt: skip
def test_a_down_server_is_given_back_without_leaving_maintenance(status: str, steps: tuple[str, ...]) -> None:
    assert d3_haproxy.ready_steps(status) == steps


@pytest.mark.parametrize("version", ["2.6.12-1+deb12u4", "3.0.11-1+deb13u4"])
def test_the_giveback_of_a_down_server_as_both_versions_did_it(version: str) -> None:
    """tests/contracts/haproxy/giveback-down.json: a drained server whose instance is down, given back through MAINT,
    was UP 1/2 (slowstart's first step: eligible for new requests) until its first check failed; given back from
    DRAIN it stayed DOWN; either way, once its instance answered, its checks brought it UP through the slowstart ramp."""
    runs = GIVEBACK["captures"][version]
    through, straight = runs["through MAINT (the module before)"], runs["straight from DRAIN"]
    assert through["drained_and_down"] == straight["drained_and_down"] == "DOWN"
    assert d3_haproxy.ready_steps(straight["drained_and_down"]) == ("ready",)
    assert through["after_give_back"][0][1] == "UP 1/2" and through["after_give_back"][-1][1] == "DOWN"
    assert [status for _, status, _ in straight["after_give_back"]] == ["DOWN"]
    for run in (through, straight):
        ramp = [int(t) for _, status, t in run["instance_started"] if status == "UP" and t]
        assert ramp[0] < 20 and ramp[-1] > 80 and ramp == sorted(ramp)  # slowstart's throttle, rising


# --- the reload's lock, and a state lost in the wait ---------------------------------------------------------------


def lock_is_held(state_file: Path) -> bool:
    """Whether another open file holds the reload's lock (flock is per open file: this process's other ones count)."""
    fd = os.open(f"{state_file}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def test_the_sets_and_the_save_are_made_under_the_reloads_lock_and_only_they(haproxy: FakeHAProxy, tmp_path: Path) -> None:
    """A reload holds the lock from its save until the new worker runs (d3_server_state.reload): a set sent while the
    lock is held would reach the old worker only, and the new one would start from a file without it."""
    haproxy.servers_state = STATE
    target = tmp_path / "server-state"
    seen: list[tuple[str, bool]] = []
    real = haproxy.answer
    haproxy.answer = lambda command: seen.append((command, lock_is_held(target))) or real(command)  # type: ignore[method-assign]
    haproxy.status[("be_d3-lite", "d3-lab-host2-d3-lite")] = ["DRAIN"]
    out = haproxy_runtime.run(params(haproxy.path, servers=[LITE2], state="ready", wait=True, state_file=str(target)), False)
    # each change and the save name the worker that took them (show info;...), under the lock; then the wait
    assert seen == [("show stat", False), ("show info;set server be_d3-lite/d3-lab-host2-d3-lite state maint", True),
                    ("show info;set server be_d3-lite/d3-lab-host2-d3-lite state ready", True),
                    ("show info;show servers state", True), ("show stat", False)]  # fmt: skip
    assert out["state_saved"] == str(target) and not lock_is_held(target)


def test_a_lock_held_past_its_wait_is_refused_and_nothing_is_set(haproxy: FakeHAProxy, tmp_path: Path) -> None:
    target = tmp_path / "server-state"
    clock = Clock()
    fd = os.open(f"{target}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)  # a reload that does not end
    try:
        with pytest.raises(haproxy_runtime.Refusal) as refused:
            haproxy_runtime.run(params(haproxy.path, servers=[LITE2], state="drain", state_file=str(target)), False, clock,
                                clock.sleep)  # fmt: skip
    finally:
        os.close(fd)
    assert str(refused.value) == (
        f"router r1 (HAProxy runtime API {haproxy.path}): the lock {target}.lock is still held after 45 s (a reload of "
        "HAProxy that does not end: systemctl status haproxy); nothing was set.")
    assert haproxy.commands == ["show stat"] and 45.0 <= sum(clock.sleeps) < 45.1
    # released: the same drain goes through
    out = haproxy_runtime.run(params(haproxy.path, servers=[LITE2], state="drain", state_file=""), False)
    assert out["changed_servers"] == ["be_d3-lite/d3-lab-host2-d3-lite"]


def test_a_drain_lost_during_the_wait_is_set_again_and_waited_for(haproxy: FakeHAProxy, tmp_path: Path) -> None:
    """The new worker of a reload that bypassed the lock (a `kill -USR2` by hand) started from an older file: the
    server is ready again there. The wait sets it again, says so, and waits for its sessions as before."""
    haproxy.servers_state = STATE
    key = ("be_d3-lite", "d3-lab-host2-d3-lite")
    haproxy.after_set[key] = ["DRAIN", "UP"]  # drained, then ready again
    haproxy.scur[key] = [0, 1, 1, 0]  # the first read, the first poll, the second (lost), the read after the set
    reload_at_second_poll(haproxy)
    clock = Clock()
    out = haproxy_runtime.run(params(haproxy.path, servers=[LITE2], state="drain", wait=True, poll=0.5,
                                     state_file=str(tmp_path / "s")), False, clock, clock.sleep)  # fmt: skip
    drain = "set server be_d3-lite/d3-lab-host2-d3-lite state drain"
    assert haproxy.commands == ["show stat", drain, "show servers state", "show stat", "show stat", drain,
                                "show servers state", "show stat"]  # fmt: skip
    assert out["reapplied"] == ["be_d3-lite/d3-lab-host2-d3-lite"] and out["servers"] == [{**LITE2, "scur": 0, "status": "DRAIN"}]
    assert clock.sleeps == [0.5] and out["changed_servers"] == ["be_d3-lite/d3-lab-host2-d3-lite"]


def reload_at_second_poll(haproxy: FakeHAProxy) -> None:
    """A new worker answers from the wait's second read of show stat on (a reload that bypassed the lock)."""
    real = haproxy.answer
    reads: list[str] = []

    def answer(command: str) -> str:
        reads.append(command)
        if reads.count("show stat") == 3:
            haproxy.pid = 5353
        return real(command)

    haproxy.answer = answer  # type: ignore[method-assign]


@pytest.mark.parametrize("state", ["drain", "ready"])
def test_a_state_changed_under_the_same_worker_is_someone_elses_and_is_not_fought(haproxy: FakeHAProxy, tmp_path: Path,
                                                                                  state: str) -> None:  # fmt: skip
    """No reload since the set (the same worker answers): an operator readied the server being drained, or put the one
    being given back in maintenance; the module fails naming it instead of setting it again (the review of 2026-12-05
    found the wait re-draining an operator's `ready` twice and making a dead server UP 1/2 from MAINT)."""
    haproxy.servers_state = STATE
    key = ("be_d3-lite", "d3-lab-host2-d3-lite")
    haproxy.status[key] = ["UP" if state == "drain" else "DRAIN"]
    haproxy.after_set[key] = ["DRAIN", "UP"] if state == "drain" else ["UP 1/2", "MAINT"]
    haproxy.scur[key] = [1]
    clock = Clock()
    with pytest.raises(haproxy_runtime.Refusal) as refused:
        haproxy_runtime.run(params(haproxy.path, servers=[LITE2], state=state, wait=True, poll=0.5,
                                   state_file=str(tmp_path / "s")), False, clock, clock.sleep)  # fmt: skip
    now = "UP" if state == "drain" else "MAINT"
    assert str(refused.value) == (
        f"router r1 (HAProxy runtime API {haproxy.path}): be_d3-lite/d3-lab-host2-d3-lite ({now}) left {state} during the "
        "wait with no reload since it was set (worker 4242): someone else changed it, so it is not set again. Find who "
        "(an operator, another run) and run again.")
    assert haproxy.commands.count(f"set server be_d3-lite/d3-lab-host2-d3-lite state {state}") == 1


def test_a_giveback_lost_during_the_wait_is_set_again(haproxy: FakeHAProxy) -> None:
    key = ("be_d3-lite", "d3-lab-host2-d3-lite")
    haproxy.status[key] = ["DRAIN"]
    haproxy.after_set[key] = ["UP 1/2", "DRAIN"]  # coming up, then a reload brought an older DRAIN back
    reload_at_second_poll(haproxy)
    clock = Clock()
    out = haproxy_runtime.run(params(haproxy.path, servers=[LITE2], state="ready", wait=True), False, clock, clock.sleep)
    maint, ready = (f"set server be_d3-lite/d3-lab-host2-d3-lite state {s}" for s in ("maint", "ready"))
    assert haproxy.commands == ["show stat", maint, ready, "show stat", "show stat", maint, ready, "show stat"]
    assert out["reapplied"] == ["be_d3-lite/d3-lab-host2-d3-lite"] and out["servers"][0]["status"] == "UP"


@pytest.mark.parametrize(("status", "state", "left"), [
    ("UP", "drain", True), ("UP 1/2", "drain", True), ("NOLB", "drain", True), ("DRAIN", "drain", False),
    ("DRAIN 1/2", "drain", False), ("MAINT", "drain", False), ("DOWN", "drain", False), ("MISSING", "drain", False),
    ("DRAIN", "ready", True), ("MAINT", "ready", True), ("DRAIN 1/2", "ready", True), ("UP", "ready", False),
    ("UP 1/2", "ready", False), ("DOWN", "ready", False), ("NOLB", "ready", False), ("MAINT(via)", "ready", False),
])  # fmt: skip
def test_left_state_takes_only_what_show_stat_proves(status: str, state: str, left: bool) -> None:
    assert haproxy_runtime.left_state(status, state) is left


@pytest.mark.parametrize("version", ["2.6.12-1+deb12u4", "3.0.11-1+deb13u4"])
def test_a_drained_server_with_failing_checks_is_given_back_through_maint_as_measured(version: str) -> None:
    """tests/contracts/haproxy/giveback-failing.json: `DRAIN 2/3` given back straight stayed UP (eligible) about 2 s,
    through MAINT about 1 s before DOWN; so it goes through MAINT like any running server (not like a DOWN one)."""
    runs = json.loads((ROOT / "tests/contracts/haproxy/giveback-failing.json").read_text())["captures"][version]
    through, straight = runs["maint then ready"], runs["ready"]
    failing = through["drained_then_failing"][-1][1]
    assert failing.startswith("DRAIN ") and straight["drained_then_failing"][-1][1] == failing
    assert d3_haproxy.ready_steps(failing) == ("maint", "ready")
    assert through["after_give_back"][-1][1] == straight["after_give_back"][-1][1] == "DOWN"
    up_through, up_straight = through["after_give_back"][-1][0], straight["after_give_back"][-1][0]
    assert up_through < 1.2 < 1.8 < up_straight


def test_one_read_out_of_state_under_the_same_worker_is_read_again_not_refused(haproxy: FakeHAProxy, tmp_path: Path) -> None:
    """Right after a reload that took the lock, the old worker may still answer one show stat (it never got the drain):
    one such read is read again, not taken for someone else's change (the third review of 2026-12-05)."""
    haproxy.servers_state = STATE
    key = ("be_d3-lite", "d3-lab-host2-d3-lite")
    haproxy.after_set[key] = ["DRAIN", "UP", "DRAIN"]  # the old worker's view once, then the current one's again
    haproxy.scur[key] = [0, 1, 1, 0]
    clock = Clock()
    out = haproxy_runtime.run(params(haproxy.path, servers=[LITE2], state="drain", wait=True, poll=0.5,
                                     state_file=str(tmp_path / "s")), False, clock, clock.sleep)  # fmt: skip
    assert out["reapplied"] == [] and clock.sleeps == [0.5, 0.5] and out["servers"][0]["status"] == "DRAIN"
    assert haproxy.commands.count("set server be_d3-lite/d3-lab-host2-d3-lite state drain") == 1


def test_a_change_an_old_worker_took_is_sent_again_until_a_current_one_takes_it(haproxy: FakeHAProxy) -> None:
    """With the master socket: a set that reached a worker show proc does not list as current is sent again; when a
    reload by hand makes the worker that took it current, that counts (show proc asked again)."""
    key = ("be_d3-lite", "d3-lab-host2-d3-lite")
    haproxy.pid = 11  # the old worker takes the first one
    real = haproxy.answer
    sets: list[str] = []

    def answer(command: str) -> str:
        if "set server" in command:
            sets.append(command)
            if len(sets) == 2:
                haproxy.pid = 22  # the new worker takes the second
        return real(command)

    haproxy.answer = answer  # type: ignore[method-assign]
    clock = Clock()
    with FakeMaster.started([{22: {key: 0}, 11: {key: 0}}]) as master:
        out = haproxy_runtime.run(params(haproxy.path, master_socket=master.path, servers=[LITE2], state="drain"), False,
                                  clock, clock.sleep)  # fmt: skip
    assert len(sets) == 2 and out["changed_servers"] == ["be_d3-lite/d3-lab-host2-d3-lite"]
    assert clock.sleeps == [haproxy_runtime.PLACE_POLL_S]
    # the worker that took it becomes the current one (a reload by hand between): taken at once
    haproxy.pid, sets[:] = 33, []
    with FakeMaster.started([{11: {}}, {33: {key: 0}}]) as master:
        haproxy.status[key] = ["UP"]
        out = haproxy_runtime.run(params(haproxy.path, master_socket=master.path, servers=[LITE2], state="drain"), False,
                                  clock, clock.sleep)  # fmt: skip
    assert len(sets) == 1 and master.commands == ["show proc", "show proc"]
    # never a current one: refused after PLACE_WAIT_S, naming both
    haproxy.answer, haproxy.pid = real, 44  # type: ignore[method-assign]
    with FakeMaster.started([{55: {key: 0}}]) as master:
        haproxy.status[key] = ["UP"]
        with pytest.raises(haproxy_runtime.Refusal, match=r"reached worker 44 only, not a current one \(55, show proc\), for 5 s"):
            haproxy_runtime.run(params(haproxy.path, master_socket=master.path, servers=[LITE2], state="drain"), False,
                                clock, clock.sleep)  # fmt: skip
