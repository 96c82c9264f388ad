"""Unit tests for d3_units_actions (d3_units.py): the d3_units role's start / restart / reload decision (start.yml).

Plain data as the role has it: the units_read result, the template loop's registered result, the secret write's and
the prune loop's. The lab runs the same decision end to end: tests/lab/test_site_runner.py (a converge, a second run
that restarts nothing, a check run), tests/lab/test_real_stack.py (API key rotation) and tests/lab/test_rollout.py
(d3_units_restarted). Every case here was also checked against the Jinja it replaces (3000 random inputs, once).
"""

from __future__ import annotations

from typing import Any

import pytest
from d3_units import FilterModule, changed, start_epoch, units_actions

DIR = "/etc/containers/systemd"
KEY = "/var/lib/d3/api-key.sha256"
T = 1_700_000_000  # the instances' start (InactiveExitTimestamp)
OPTIONS = {"unit_dir": DIR, "suffix": ".container", "key_file": KEY, "quadlet": True, "check_mode": False}
SKIPPED = {"changed": False, "skipped": True}
LOADED = "unit file newer than the loaded unit"
UNIT_NEWER = "unit file newer than the running instance"
KEY_NEWER = "API key newer than the running instance"


def host(units: dict[str, dict[str, str]], mtimes: dict[str, float] | None = None, key_mtime: float | None = None) -> dict[str, Any]:
    """A units_read result: every unit's show block, each unit file's mtime (default: written before the start)."""
    files: dict[str, Any] = {KEY: {"exists": False}} if key_mtime is None else {KEY: {"exists": True, "mtime": key_mtime}}
    for unit in units:
        files[f"{DIR}/{unit}.container"] = {"exists": True, "mtime": (mtimes or {}).get(unit, T - 100)}
    return {"units": {f"{u}.service": show for u, show in units.items()}, "files": files}


def running(**extra: str) -> dict[str, str]:
    return {"ActiveState": "active", "InactiveExitTimestamp": f"@{T}", "NeedDaemonReload": "no",
            "UnitFileState": "generated", **extra}  # fmt: skip


def rendered(*units: str, changed_units: tuple[str, ...] = ()) -> dict[str, Any]:
    results = [
        {
            "item": {"name": u.removeprefix("d3-"), "unit": u},
            "changed": u in changed_units,
            **({} if u in changed_units else {"skipped": True}),
        }
        for u in units
    ]
    return {"changed": bool(changed_units), "results": results}


def decide(show: dict[str, str], *, unit_changed: bool = False, secret: dict[str, Any] | None = None,
           unit_mtime: float = T - 100, key_mtime: float | None = None, **options: Any) -> dict[str, Any]:  # fmt: skip
    """The decision for one instance d3-a."""
    out = units_actions(rendered("d3-a", changed_units=("d3-a",) if unit_changed else ()),
                        host({"d3-a": show}, {"d3-a": unit_mtime}, key_mtime), secret or SKIPPED, SKIPPED,
                        {**OPTIONS, **options})  # fmt: skip
    return out


@pytest.mark.parametrize(
    ("case", "show", "kwargs", "action", "reason"),
    [
        ("nothing changed", running(), {}, "none", ""),
        ("inactive", running(ActiveState="inactive"), {}, "start", "not running"),
        ("failed", running(ActiveState="failed"), {}, "start", "not running"),
        ("deactivating", running(ActiveState="deactivating"), {}, "start", "not running"),
        ("no such unit yet", {}, {"unit_changed": True}, "start", "not running"),
        ("activating counts as running", running(ActiveState="activating"), {}, "none", ""),
        ("reloading counts as running", running(ActiveState="reloading"), {}, "none", ""),
        ("not running wins over a changed unit", running(ActiveState="inactive"), {"unit_changed": True}, "start", "not running"),
        ("unit changed", running(), {"unit_changed": True}, "restart", "unit changed"),
        ("unit changed wins over the key", running(), {"unit_changed": True, "secret": {"changed": True}}, "restart", "unit changed"),
        ("key replaced", running(), {"secret": {"changed": True}}, "restart", "API key changed"),
        ("key write skipped", running(), {"secret": SKIPPED}, "none", ""),
        (
            "key replaced wins over NeedDaemonReload",
            running(NeedDaemonReload="yes"),
            {"secret": {"changed": True}},
            "restart",
            "API key changed",
        ),
        ("unit not loaded yet", running(NeedDaemonReload="yes"), {}, "restart", LOADED),
        ("NeedDaemonReload wins over a newer file", running(NeedDaemonReload="yes"), {"unit_mtime": T + 50}, "restart", LOADED),
        ("unit file 2 s newer (interrupted run)", running(), {"unit_mtime": T + 2}, "restart", UNIT_NEWER),
        ("unit file 1.5 s newer", running(), {"unit_mtime": T + 1.5}, "restart", UNIT_NEWER),
        ("unit file within the 1 s of slack", running(), {"unit_mtime": T + 1}, "none", ""),
        ("unit file 0.5 s newer: slack", running(), {"unit_mtime": T + 0.5}, "none", ""),
        ("unit file newer wins over the key file", running(), {"unit_mtime": T + 5, "key_mtime": T + 5}, "restart", UNIT_NEWER),
        ("key file 2 s newer (interrupted rotation)", running(), {"key_mtime": T + 2}, "restart", KEY_NEWER),
        ("key file within the slack", running(), {"key_mtime": T + 1}, "none", ""),
        ("key file older", running(), {"key_mtime": T - 10}, "none", ""),
        ("no start timestamp: any file is newer", running(InactiveExitTimestamp=""), {"unit_mtime": 1.5}, "restart", UNIT_NEWER),
        ("no start timestamp, file at 1 s", running(InactiveExitTimestamp=""), {"unit_mtime": 1.0}, "none", ""),
    ],
)
def test_the_action_per_instance(case: str, show: dict[str, str], kwargs: dict[str, Any], action: str, reason: str) -> None:
    [got] = decide(show, **kwargs)["actions"]
    assert (got["action"], got["reason"], got["new"]) == (action, reason, action == "start"), case
    assert got["state"] == ("restarted" if action == "restart" else "started")


def test_an_action_names_its_instance_and_unit_in_plan_order() -> None:
    out = units_actions(rendered("d3-b", "d3-a", changed_units=("d3-a",)),
                        host({"d3-a": running(), "d3-b": running()}), SKIPPED, SKIPPED, OPTIONS)  # fmt: skip
    assert out["actions"] == [
        {"name": "b", "unit": "d3-b", "action": "none", "new": False, "reason": "", "enabled": True, "state": "started", "call": False},
        {"name": "a", "unit": "d3-a", "action": "restart", "new": False, "reason": "unit changed", "enabled": True,
         "state": "restarted", "call": True},
    ]  # fmt: skip
    assert out["restarted"] == [{"name": "a", "unit": "d3-a", "new": False, "reason": "unit changed"}]


def test_restarted_lists_started_and_restarted_instances_only() -> None:
    out = units_actions(rendered("d3-a", "d3-b", "d3-c", changed_units=("d3-c",)),
                        host({"d3-a": running(ActiveState="inactive"), "d3-b": running(), "d3-c": running()}),
                        SKIPPED, SKIPPED, OPTIONS)  # fmt: skip
    assert out["restarted"] == [
        {"name": "a", "unit": "d3-a", "new": True, "reason": "not running"},
        {"name": "c", "unit": "d3-c", "new": False, "reason": "unit changed"},
    ]
    assert [list(r) for r in out["restarted"]] == [["name", "unit", "new", "reason"]] * 2  # the documented key order


@pytest.mark.parametrize(
    ("case", "quadlet", "unit_file_state", "action_kwargs", "check_mode", "enabled", "call"),
    [
        ("quadlet, nothing to do", True, "generated", {}, False, True, False),
        ("quadlet, restart", True, "generated", {"unit_changed": True}, False, True, True),
        ("classic enabled, nothing to do", False, "enabled", {}, False, True, False),
        ("classic not enabled: the call enables it", False, "disabled", {}, False, False, True),
        ("classic, UnitFileState unknown", False, "", {}, False, False, True),
        ("check mode: a written unit does not exist yet", True, "generated", {"unit_changed": True}, True, True, False),
        ("check mode: a key change still restarts", True, "generated", {"secret": {"changed": True}}, True, True, True),
        ("check mode, classic not enabled, unit changed", False, "disabled", {"unit_changed": True}, True, False, False),
    ],
)
def test_enabled_and_whether_the_systemd_call_runs(case: str, quadlet: bool, unit_file_state: str, action_kwargs: dict[str, Any],
                                                   check_mode: bool, enabled: bool, call: bool) -> None:  # fmt: skip
    [got] = decide(running(UnitFileState=unit_file_state), quadlet=quadlet, check_mode=check_mode, **action_kwargs)["actions"]
    assert (got["enabled"], got["call"]) == (enabled, call), case


def test_the_classic_unit_file_path_is_read_with_its_suffix() -> None:
    files = {"/etc/systemd/system/d3-a.service": {"exists": True, "mtime": T + 10}, KEY: {"exists": False}}
    classic = {**OPTIONS, "unit_dir": "/etc/systemd/system", "suffix": ".service", "quadlet": False}
    show = {"d3-a.service": running(UnitFileState="enabled")}
    out = units_actions(rendered("d3-a"), {"units": show, "files": files}, SKIPPED, SKIPPED, classic)
    assert out["actions"][0]["reason"] == UNIT_NEWER


@pytest.mark.parametrize(
    ("case", "units", "changed_units", "pruned", "mtimes", "reload"),
    [
        ("nothing changed", {"d3-a": running()}, (), SKIPPED, {}, False),
        ("a unit written now", {"d3-a": running()}, ("d3-a",), SKIPPED, {}, True),
        ("a stale unit removed", {"d3-a": running()}, (), {"changed": True, "results": []}, {}, True),
        ("prune loop item changed", {"d3-a": running()}, (), {"results": [{"changed": True}]}, {}, True),
        ("a unit systemd has not loaded", {"d3-a": running(), "d3-b": running(NeedDaemonReload="yes")}, (), SKIPPED, {}, True),
        ("NeedDaemonReload of a stopped unit", {"d3-a": running(ActiveState="inactive", NeedDaemonReload="yes")}, (), SKIPPED, {}, True),
        ("a stopped unit only starts", {"d3-a": running(ActiveState="inactive")}, (), SKIPPED, {}, False),
        ("a unit file newer than its instance", {"d3-a": running()}, (), SKIPPED, {"d3-a": T + 5}, True),
    ],
)
def test_whether_systemd_reloads_first(case: str, units: dict[str, Any], changed_units: tuple[str, ...], pruned: dict[str, Any],
                                       mtimes: dict[str, float], reload: bool) -> None:  # fmt: skip
    out = units_actions(rendered(*units, changed_units=changed_units), host(units, mtimes), SKIPPED, pruned, OPTIONS)
    assert out["reload"] is reload, case


def test_a_key_file_newer_than_an_instance_reloads_too() -> None:
    # as the Jinja did: every 'newer' reason reloads, the key's included (harmless: nothing to regenerate)
    assert decide(running(), key_mtime=T + 5)["reload"] is True
    assert decide(running(), secret={"changed": True})["reload"] is False  # the key alone: a restart, no reload


def test_an_empty_plan_decides_nothing() -> None:
    out = units_actions({"changed": False, "skipped": True, "results": []}, {"units": {}, "files": {}}, SKIPPED, SKIPPED, OPTIONS)
    assert out == {"actions": [], "reload": False, "restarted": [], "stops": []}


def gpu_rendered(gpus: dict[str, list[int]], changed_units: tuple[str, ...]) -> dict[str, Any]:
    out = rendered(*gpus, changed_units=changed_units)
    for result in out["results"]:
        result["item"]["gpus"] = gpus[result["item"]["unit"]]
    return out


def test_instances_sharing_a_gpu_that_restart_together_are_stopped_first_the_later_ones_first() -> None:
    gpus = {"d3-a": [0], "d3-b": [0], "d3-c": [1], "d3-d": [0, 1]}
    units = {u: running() for u in gpus}
    # a, b and d restart; a and b share GPU 0, d shares 0 and 1: all three stop before any starts; c is left alone
    out = units_actions(gpu_rendered(gpus, ("d3-a", "d3-b", "d3-d")), host(units), SKIPPED, SKIPPED, OPTIONS)
    assert out["stops"] == ["d3-d", "d3-b", "d3-a"]
    assert [(a["unit"], a["action"], a["state"], a["call"]) for a in out["actions"]] == [
        ("d3-a", "restart", "started", True), ("d3-b", "restart", "started", True), ("d3-c", "none", "started", False),
        ("d3-d", "restart", "started", True)]  # fmt: skip
    assert [r["unit"] for r in out["restarted"]] == ["d3-a", "d3-b", "d3-d"]


def test_a_restart_alone_on_its_gpu_or_beside_instances_that_stay_is_a_plain_restart() -> None:
    gpus = {"d3-a": [0], "d3-b": [0], "d3-c": [1]}
    units = {u: running() for u in gpus}
    # a restarts, b (same GPU) stays: a plain restart; c alone on GPU 1
    out = units_actions(gpu_rendered(gpus, ("d3-a", "d3-c")), host(units), SKIPPED, SKIPPED, OPTIONS)
    assert out["stops"] == [] and [a["state"] for a in out["actions"]] == ["restarted", "started", "restarted"]
    # a restarts while b, stopped, starts on its GPU: a is stopped first; b was not running, nothing to stop
    units["d3-b"] = running(ActiveState="inactive")
    out = units_actions(gpu_rendered(gpus, ("d3-a",)), host(units), SKIPPED, SKIPPED, OPTIONS)
    assert out["stops"] == ["d3-a"] and [a["state"] for a in out["actions"]] == ["started", "started", "started"]
    # without GPUs in the items (no sharing known), nothing is stopped first
    out = units_actions(rendered("d3-a", "d3-b", changed_units=("d3-a", "d3-b")), host({"d3-a": running(), "d3-b": running()}),
                        SKIPPED, SKIPPED, OPTIONS)  # fmt: skip
    assert out["stops"] == [] and [a["state"] for a in out["actions"]] == ["restarted", "restarted"]


def test_in_check_mode_a_unit_that_would_be_written_is_not_stopped_first() -> None:
    gpus = {"d3-a": [0], "d3-b": [0]}
    units = {u: running() for u in gpus}
    out = units_actions(gpu_rendered(gpus, ("d3-a", "d3-b")), host(units), SKIPPED, SKIPPED, {**OPTIONS, "check_mode": True})
    assert out["stops"] == [] and [a["call"] for a in out["actions"]] == [False, False]


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        ({"changed": True}, True),
        ({"changed": False, "results": [{"changed": True}]}, False),  # the task's own word wins, as Ansible's test
        ({"results": [{"changed": False}, {"changed": True}]}, True),
        ({"results": [{"changed": False}, "x"]}, False),
        ({"results": []}, False),
        ({"skipped": True}, False),
        ({}, False),
    ],
)
def test_changed_is_ansibles_is_changed(result: dict[str, Any], expected: bool) -> None:
    assert changed(result) is expected


def test_changed_refuses_what_is_not_a_result() -> None:
    with pytest.raises(ValueError, match=r"^a registered task result must be a dict, not list$"):
        changed([])


@pytest.mark.parametrize(
    ("timestamp", "epoch"),
    [("@1700000000", 1700000000.0), ("1700000000", 1700000000.0), ("", 0.0), (None, 0.0), ("n/a", 0.0), ("@", 0.0)],
)
def test_start_epoch(timestamp: str | None, epoch: float) -> None:
    assert start_epoch(timestamp) == epoch


def test_the_filter_is_registered() -> None:
    assert FilterModule().filters() == {"d3_units_actions": units_actions}


def test_an_instance_that_only_gets_enabled_does_not_count_as_starting_beside_a_restart() -> None:
    # classic units: b needs no restart, only `enabled: true` (call, action none); a restarts alone on the GPU
    gpus = {"d3-a": [0], "d3-b": [0]}
    units = {"d3-a": running(UnitFileState="enabled"), "d3-b": running(UnitFileState="disabled")}
    out = units_actions(gpu_rendered(gpus, ("d3-a",)), host(units), SKIPPED, SKIPPED, {**OPTIONS, "quadlet": False})
    assert [(a["action"], a["call"]) for a in out["actions"]] == [("restart", True), ("none", True)]
    assert out["stops"] == [] and out["actions"][0]["state"] == "restarted"
