"""One rollout at a time: the filters of plugins/filter/d3_rollout_lease.py (the lease a rollout takes on every router,
who may take it over, whose drain records are whose) and the status line of a drain whose owner is gone."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "collections/ansible_collections/d3fleet/fleet/plugins/filter"))
import d3_rollout_lease as lease_mod  # noqa: E402
from d3_rollout_lease import (  # noqa: E402
    FilterModule,
    controller,
    describe,
    drains_owned,
    lease_holder,
    lease_plan,
    process_alive,
    process_start,
)
from d3_status import status_drains  # noqa: E402

NOW = 1_780_000_000.0  # 2026-05-28T20:26:40Z
ME = {"owner": "20260528T202640Z-ctl-100", "controller": "ctl", "pid": 100, "pid_start": "555", "user": "ops",
      "started": "2026-05-28T20:26:01Z"}  # fmt: skip


def other(**over: Any) -> str:
    lease = {"owner": "20260528T200000Z-ctl-42", "controller": "ctl", "pid": 42, "pid_start": "777", "user": "ann",
             "started": "2026-05-28T20:00:00Z", "expires": int(NOW) + 600, "limit": "host2"}  # fmt: skip
    return json.dumps({**lease, **over})


@pytest.fixture(autouse=True)
def alive(monkeypatch: pytest.MonkeyPatch) -> set[tuple[Any, Any]]:
    """The processes that run, as (pid, start): pid 42 started at 777 by default."""
    running = {(42, "777")}
    monkeypatch.setattr(lease_mod, "process_alive", lambda pid, start: (pid, start) in running)
    return running


def test_no_lease_anywhere_takes_it_on_every_router() -> None:
    plan = lease_plan({"r1": "", "r2": None}, ME, NOW, 900, "", "host1:host2")
    assert plan == {"refusals": [], "notes": [], "lease": {
        "owner": ME["owner"], "controller": "ctl", "pid": 100, "pid_start": "555", "user": "ops",
        "started": "2026-05-28T20:26:01Z", "expires": int(NOW) + 900, "limit": "host1:host2"}}  # fmt: skip
    assert lease_plan({}, {"owner": "x"}, NOW)["lease"] == {"owner": "x", "controller": "", "pid": 0, "pid_start": "",
                                                             "user": "", "started": "2026-05-28T20:26:40Z",
                                                             "expires": int(NOW) + 3600, "limit": ""}  # fmt: skip


def test_a_live_lease_of_another_rollout_refuses_naming_it_and_the_way_out() -> None:
    plan = lease_plan({"r1": other(), "r2": ""}, ME, NOW)
    assert plan["notes"] == []
    assert plan["refusals"] == [
        "router r1: rollout 20260528T200000Z-ctl-42 (ann on ctl, pid 42, since 2026-05-28T20:00:00Z, until "
        "2026-05-28T20:36:40Z, --limit host2) holds the routers: one rollout at a time, so this one changes nothing. If "
        "that rollout no longer runs (its controller died), clear its lease with "
        "-e d3_rollout_take_over=20260528T200000Z-ctl-42 (its drains are given back first), or wait until it expires."]  # fmt: skip
    # from another controller its process cannot be seen: live until it expires
    assert lease_plan({"r1": other(controller="elsewhere", pid_start="0")}, ME, NOW)["refusals"]


def test_own_lease_is_renewed() -> None:
    plan = lease_plan({"r1": json.dumps({**json.loads(other()), "owner": ME["owner"]})}, ME, NOW, 60)
    assert plan["refusals"] == plan["notes"] == [] and plan["lease"]["expires"] == int(NOW) + 60


def test_an_expired_lease_or_a_gone_process_on_this_controller_is_taken_over(alive: set) -> None:
    expired = lease_plan({"r1": other(expires=int(NOW))}, ME, NOW)
    assert expired["refusals"] == []
    assert expired["notes"] == ["router r1: took over the lease of rollout 20260528T200000Z-ctl-42 (ann on ctl, pid 42, "
                                "since 2026-05-28T20:00:00Z, until 2026-05-28T20:26:40Z, --limit host2): it expired at "
                                "2026-05-28T20:26:40Z."]  # fmt: skip
    assert lease_plan({"r1": other(expires=int(NOW) + 1)}, ME, NOW)["refusals"]
    alive.clear()
    gone = lease_plan({"r1": other()}, ME, NOW)
    assert gone["refusals"] == [] and gone["notes"][0].endswith("its ansible-playbook (pid 42 on ctl) no longer runs.")
    # a reused pid is another process
    alive.add((42, "778"))
    assert lease_plan({"r1": other()}, ME, NOW)["notes"]


def test_take_over_names_the_holder() -> None:
    plan = lease_plan({"r1": other(controller="elsewhere")}, ME, NOW, 3600, "20260528T200000Z-ctl-42")
    assert plan["refusals"] == [] and plan["notes"][0].endswith(": d3_rollout_take_over names it.")
    assert lease_plan({"r1": other(controller="elsewhere")}, ME, NOW, 3600, "someone-else")["refusals"]


@pytest.mark.parametrize("text", ["not json", "[]", '{"owner": ""}', '{"owner": 3}', '"x"'])
def test_a_file_that_holds_no_lease_is_refused(text: str) -> None:
    (refusal,) = lease_plan({"r1": text}, ME, NOW)["refusals"]
    assert refusal.startswith("router r1: the rollout lease file holds no lease (") and "remove it" in refusal
    assert lease_holder(text, ME, NOW) is None


@pytest.mark.parametrize("seconds", [59, 86401, "x", True, -1, "3600.5"])
def test_refuses_a_lease_length_out_of_range(seconds: Any) -> None:
    plan = lease_plan({}, ME, NOW, seconds)
    assert plan["refusals"] == [f"d3_state_lease_s = {seconds!r} is not whole seconds 60-86400 (how long the rollout's "
                                "lease on the routers holds without renewal; each batch renews it)."]  # fmt: skip
    assert plan["lease"]["expires"] == int(NOW) + 3600
    for good in (60, 86400, "120"):
        assert lease_plan({}, ME, NOW, good)["refusals"] == []


def test_an_unreadable_expiry_is_gone() -> None:
    assert lease_plan({"r1": other(expires="soon")}, ME, NOW)["notes"][0].endswith("its expiry is unreadable.")
    assert "until ?" in describe({"owner": "x", "expires": None})
    assert describe({"owner": "x"}) == "rollout x (? on ?, pid ?, since ?, until ?)"


def test_the_live_holder() -> None:
    holder = lease_holder(other(), ME, NOW)
    assert holder["owner"] == "20260528T200000Z-ctl-42" and holder["description"].startswith("rollout 20260528T200000Z")
    assert lease_holder(json.loads(other()), ME, NOW)["pid"] == 42
    assert lease_holder("", ME, NOW) is None and lease_holder(None, ME, NOW) is None
    assert lease_holder(other(expires=int(NOW) - 1), ME, NOW) is None


def test_drains_split_by_owner() -> None:
    held = {"backend": "be_a", "server": "s1", "owner": "20260528T200000Z-ctl-42"}
    gone = {"backend": "be_a", "server": "s2", "owner": "old-run"}
    legacy = {"backend": "be_a", "server": "s3"}
    out = drains_owned({"r1": [held, gone, legacy], "r2": [gone]}, {"r1": other(), "r2": ""}, ME, NOW)
    assert out["r1"] == {"holder": describe(json.loads(other())), "held": [held], "orphaned": [gone, legacy],
                         "kept": f"r1: {describe(json.loads(other()))} holds the routers: its drains stay (be_a/s1); "
                                 "this run gives none of them back."}  # fmt: skip
    assert out["r2"] == {"holder": "", "held": [], "orphaned": [gone], "kept": ""}
    # a live holder without drains here: named all the same (a run during a rollout always says who holds the routers)
    assert drains_owned({"r1": [gone]}, {"r1": other()}, ME, NOW)["r1"]["kept"] == (
        f"r1: {describe(json.loads(other()))} holds the routers: its drains stay (none now); this run gives none of them back.")
    # the holder gone: every record is orphaned
    assert drains_owned({"r1": [held]}, {"r1": other(expires=0)}, ME, NOW)["r1"]["orphaned"] == [held]
    assert drains_owned({"r1": [held]}, {}, ME, NOW)["r1"]["orphaned"] == [held]


def test_this_process_and_the_controller() -> None:
    me = controller(None, "ops")
    assert me["pid"] == os.getppid() and me["user"] == "ops" and me["controller"]
    assert me["pid_start"] == process_start(os.getppid()) != ""
    assert process_start(os.getpid()).isdigit()
    assert process_start(2**22 + 7) == "" and process_start("x") == ""  # type: ignore[arg-type]
    assert FilterModule().filters()["d3_rollout_lease_plan"] is lease_plan
    assert set(FilterModule().filters()) == {"d3_rollout_controller", "d3_rollout_lease_plan", "d3_rollout_lease_holder",
                                             "d3_rollout_drains_owned"}  # fmt: skip


def test_process_alive_reads_proc(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.undo()
    assert process_alive(os.getpid(), process_start(os.getpid()))
    assert not process_alive(os.getpid(), "1")
    assert not process_alive(os.getpid(), "")
    assert not process_alive(2**22 + 7, "1")


def test_a_process_whose_name_holds_parentheses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stat = "7 (a) b) S " + " ".join(str(n) for n in range(4, 30))
    real_open = open

    def fake_open(path: str, *args: Any, **kwargs: Any) -> Any:
        if path == "/proc/7/stat":
            (tmp_path / "stat").write_text(stat)
            return real_open(tmp_path / "stat", *args, **kwargs)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", fake_open)
    assert process_start(7) == "22"
    stat = "7 (a) S 4"
    assert process_start(7) == ""


def test_status_names_the_owner_of_a_drain_left_behind() -> None:
    rows = [{"backend": "be_a", "server": "s1", "status": "DRAIN"}]
    (line,) = status_drains([{"backend": "be_a", "server": "s1", "host": "h", "instance": "i", "since": "t",
                              "owner": "run-1"}], rows, "r1")  # fmt: skip
    assert line == ("router r1: be_a/s1 (host h, instance i) left by an interrupted rollout (run-1, which no longer "
                    "runs), drained since t, now DRAIN. The next rollout.yml or site.yml gives it back.")  # fmt: skip
    (line,) = status_drains([{"backend": "be_a", "server": "s1"}], rows, "r1")
    assert "left by an interrupted rollout, drained since ?" in line


def test_more_routers_each_decided_and_stamps_in_utc(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    try:
        own = json.dumps({**json.loads(other()), "owner": ME["owner"]})
        plan = lease_plan({"r1": own, "r2": other(), "r3": "[]", "r4": other(expires=0)}, ME, NOW)
        assert [r.split(":")[0] for r in plan["refusals"]] == ["router r2", "router r3"]
        assert plan["notes"] == ["router r4: took over the lease of rollout 20260528T200000Z-ctl-42 (ann on ctl, pid 42, "
                                 "since 2026-05-28T20:00:00Z, until 1970-01-01T00:00:00Z, --limit host2): it expired at "
                                 "1970-01-01T00:00:00Z."]  # fmt: skip
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


def test_a_broken_lease_is_shown_cut_at_80_characters() -> None:
    text = "x" * 100
    (refusal,) = lease_plan({"r1": text}, ME, NOW)["refusals"]
    assert refusal == (f"router r1: the rollout lease file holds no lease ({'x' * 80!r}): remove it on the router if no "
                       "rollout runs, then run again.")  # fmt: skip


def test_two_drains_kept_are_listed() -> None:
    held = [{"backend": "be_a", "server": f"s{i}", "owner": "20260528T200000Z-ctl-42"} for i in (1, 2)]
    kept = drains_owned({"r1": held}, {"r1": other()}, ME, NOW)["r1"]["kept"]
    assert "its drains stay (be_a/s1, be_a/s2); this run" in kept


def test_process_start_with_exactly_twenty_fields(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_open = open
    stat = "8 (n) " + " ".join(str(n) for n in range(3, 23))  # fields 3..22: 20 after the name

    def fake_open(path: str, *args: Any, **kwargs: Any) -> Any:
        if path == "/proc/8/stat":
            (tmp_path / "stat").write_text(stat)
            return real_open(tmp_path / "stat", *args, **kwargs)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", fake_open)
    assert process_start(8) == "22"
    stat = "8 (n) " + " ".join(str(n) for n in range(3, 22))  # 19: no start time
    assert process_start(8) == ""
