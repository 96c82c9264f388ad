"""The rollout's decisions around the routers (plugins/filter/d3_rollout.py): the sliced-rollout refusal, the check
before each drain (enough other servers UP in every router), which servers a rollout drains and gives back (never an
operator's MAINT or DRAIN), the drain records an interrupted rollout leaves and their restore, progress lines, the
one-line failure cause, and the closing summary table."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "collections/ansible_collections/d3fleet/fleet/plugins/filter"))
from d3_rollout import (
    batch_line,
    drain_check,
    drain_detail,
    drain_files,
    drain_plan,
    drain_records,
    failure_cause,
    progress,
    restore_plan,
    rollout_rows,
    slice_problems,
    summary,
)


# ---- sliced rollouts (AWX job slicing: each slice holds only its hosts)
def test_an_unsliced_rollout_is_never_refused_here() -> None:
    assert slice_problems(1, 0, [], None) == []
    assert slice_problems(None, None, ["r1"], None) == []
    assert slice_problems("1", 1, [], ["r9"]) == []


@pytest.mark.parametrize("declared", [None, "r1", [""], [1], {"r1": 1}])
def test_a_slice_must_declare_every_router_of_the_fleet(declared: object) -> None:
    (problem,) = slice_problems(2, 1, ["r1"], declared)
    assert problem.startswith("this rollout is slice 1 of 2 (d3_image_slice_count / d3_image_slice_number) and "
                              "d3_rollout_routers is ")  # fmt: skip
    assert "would restart its hosts without draining them" in problem
    assert problem.endswith("to the list of every router of the fleet ([] when it has none).")


def test_a_slice_that_does_not_see_every_router_is_refused_naming_them() -> None:
    (problem,) = slice_problems("3", "2", ["r2"], ["r1", "r2", "r3"])
    assert problem == ("this rollout is slice 2 of 3 (d3_image_slice_count / d3_image_slice_number) does not see the "
                       "routers r1, r3 (d3_rollout_routers; its group d3-routers holds r2): it could not drain its hosts "
                       "in them. Put every router in every slice's inventory or run the rollout unsliced.")  # fmt: skip
    assert "holds none)" in slice_problems(2, 1, [], ["r1"])[0]


def test_a_slice_that_sees_an_undeclared_router_is_refused_and_one_that_sees_all_passes() -> None:
    assert slice_problems(2, 1, ["r1", "r2"], ["r1"]) == [
        "this rollout is slice 1 of 2 (d3_image_slice_count / d3_image_slice_number) sees the routers r2, which "
        "d3_rollout_routers does not list: add them to d3_rollout_routers."]  # fmt: skip
    assert slice_problems(2, 2, ["r2", "r1"], ["r1", "r2"]) == []
    assert slice_problems(2, 2, [], []) == []


# ---- before each drain: enough other servers UP in every router
def row(server: str, status: str = "UP", scur: int = 0, backend: str = "be_a") -> dict:
    return {"backend": backend, "server": server, "status": status, "scur": scur}


A1, A2, A3 = ({"backend": "be_a", "server": f"h{i}-a"} for i in (1, 2, 3))
EDGES = [row("FRONTEND", "OPEN"), row("BACKEND", "UP")]


def test_a_drain_with_another_server_up_passes() -> None:
    assert drain_check({"r1": [*EDGES, row("h1-a"), row("h2-a")]}, [A1], [A1]) == []
    assert drain_check({"r1": [row("h1-a"), row("h2-a", "UP 1/3")]}, [A1], []) == []  # going down: still serving


@pytest.mark.parametrize("other", ["DOWN", "MAINT", "DRAIN", "NOLB", "DOWN 1/2", "MAINT(via)"])
def test_a_drain_that_would_leave_no_up_server_is_refused_naming_router_model_and_servers(other: str) -> None:
    stats = {"r1": [row("h1-a"), row("h2-a")], "r2": [*EDGES, row("h1-a"), row("h2-a", other)]}
    assert drain_check(stats, [A1], [A1]) == [
        f"router r2: draining h1-a would leave model a (backend be_a) with 0 UP server(s), fewer than d3_rollout_min_up "
        f"= 1; its other servers: h2-a ({other}). The rollout stops before draining: bring those servers up (status.yml "
        "shows why they are not), or wait for their health checks."]  # fmt: skip


def test_the_servers_the_same_batch_drains_do_not_count_as_up() -> None:
    stats = {"r1": [row("h1-a"), row("h2-a"), row("h3-a", "DOWN")]}
    (problem,) = drain_check(stats, [A1], [A1, A2])
    assert "its other servers: h3-a (DOWN)." in problem
    assert drain_check(stats, [A1], [A1]) == []
    # two servers of this host (replicas on one host): nothing outside the batch
    (problem,) = drain_check({"r1": [row("h1-a"), row("h1-a2")]}, [A1, {"backend": "be_a", "server": "h1-a2"}], [])
    assert "draining h1-a, h1-a2 would leave" in problem and "its other servers: none outside this batch." in problem


def test_a_model_with_one_server_is_not_refused_and_other_backends_do_not_count() -> None:
    assert drain_check({"r1": [*EDGES, row("h1-a"), row("h2-b", backend="be_b")]}, [A1], [A1]) == []
    (problem,) = drain_check({"r1": [row("h1-a"), row("h2-a", "DOWN"), row("h3-b", backend="be_b")]}, [A1], [])
    assert "h3-b" not in problem
    assert drain_check({"r1": []}, [A1], []) == []


def test_min_up_and_the_model_name() -> None:
    stats = {"r1": [row("h1-a"), row("h2-a"), row("h3-a")]}
    assert drain_check(stats, [A1], [], 2) == []
    (problem,) = drain_check(stats, [A1], [], "3")
    assert "with 2 UP server(s), fewer than d3_rollout_min_up = 3" in problem
    (named,) = drain_check({"r1": [row("s1", backend="x"), row("s2", "DOWN", backend="x")]},
                           [{"backend": "x", "server": "s1", "model": "d3-x"}], [])  # fmt: skip
    assert "would leave model d3-x (backend x)" in named
    (bare,) = drain_check({"r1": [row("s1", backend="x"), row("s2", "", backend="x")]}, [{"backend": "x", "server": "s1"}], [])
    assert "would leave model x (backend x)" in bare and "s2 (?)" in bare


def test_one_refusal_per_router_and_backend() -> None:
    b1 = {"backend": "be_b", "server": "h1-b"}
    rows = [row("h1-a"), row("h2-a", "DOWN"), row("h1-b", backend="be_b"), row("h2-b", "MAINT", backend="be_b")]
    problems = drain_check({"r2": rows, "r1": rows}, [A1, b1, {"backend": "be_a", "server": "h1-a"}], [])
    assert [p.split(" would")[0] for p in problems] == ["router r1: draining h1-a, h1-a", "router r1: draining h1-b",
                                                        "router r2: draining h1-a, h1-a", "router r2: draining h1-b"]


@pytest.mark.parametrize("bad", [0, -1, "one", 1.5, True])
def test_min_up_below_one_or_not_whole_is_refused(bad: object) -> None:
    assert drain_check({}, [A1], [], bad) == [f"d3_rollout_min_up is {bad!r}: it must be a whole number, at least 1. Fix the "
                                              "-e value or the inventory."]  # fmt: skip


# ---- which servers a rollout drains and gives back
def test_the_rollout_drains_up_and_down_servers_and_leaves_an_operators_maint_or_drain() -> None:
    stats = {"r2": [row("h1-a", "UP", 3), row("h2-a", "DOWN", 1)],
             "r1": [row("h1-a", "MAINT"), row("h2-a", "DRAIN", 2)]}  # fmt: skip
    assert drain_plan(stats, [A1, A2]) == [
        {"router": "r1", "drain": [], "kept": ["be_a/h1-a (MAINT)", "be_a/h2-a (DRAIN)"], "inflight": 0},
        {"router": "r2", "drain": [{"backend": "be_a", "server": "h1-a", "scur": 3}, {"backend": "be_a", "server": "h2-a", "scur": 1}],
         "kept": [], "inflight": 4},
    ]  # fmt: skip
    (plan,) = drain_plan({"r1": [row("h1-a", "MAINT(via be_x/s)")]}, [A1, A3])
    assert plan["kept"] == ["be_a/h1-a (MAINT(via be_x/s))"]
    assert plan["drain"] == [{"backend": "be_a", "server": "h3-a", "scur": 0}]  # a server the router does not list
    assert drain_plan({}, [A1]) == []


def test_drain_files_are_one_named_record_per_server_that_drain_records_reads_back() -> None:
    drain = [{"backend": "be_b", "server": "h2-b", "instance": "b"}, {"backend": "be_a", "server": "h2-a"}]
    files = drain_files(drain, "h2", "2026-12-05T12:00:00Z", "rollout-1")
    assert [f["name"] for f in files] == ["be_b--h2-b.json", "be_a--h2-a.json"]
    assert all(f["content"].endswith("}\n") and f["content"].count("\n") == 1 for f in files)
    assert drain_records("".join(f["content"] for f in files)) == [
        {"backend": "be_a", "server": "h2-a", "host": "h2", "instance": "", "since": "2026-12-05T12:00:00Z",
         "by": "playbooks/rollout.yml", "owner": "rollout-1"},
        {"backend": "be_b", "server": "h2-b", "host": "h2", "instance": "b", "since": "2026-12-05T12:00:00Z",
         "by": "playbooks/rollout.yml", "owner": "rollout-1"},
    ]  # fmt: skip
    # to remove them, the names alone
    assert [f["name"] for f in drain_files(drain)] == ["be_b--h2-b.json", "be_a--h2-a.json"]
    assert json.loads(drain_files(drain[1:])[0]["content"]) == {
        "backend": "be_a", "server": "h2-a", "host": "", "instance": "", "since": "", "by": "playbooks/rollout.yml",
        "owner": ""}  # fmt: skip
    assert drain_files([]) == [] and drain_files(None) == []


def test_drain_records_are_read_one_json_object_a_line_bad_lines_skipped() -> None:
    text = ('{"backend": "be_b", "server": "h2-b", "host": "h2"}\n\nnot json\n[1]\n{"backend": 1, "server": "x"}\n'
            '{"backend": "be_a", "server": "h1-a"}\n{"server": "x"}\n')  # fmt: skip
    assert drain_records(text) == [{"backend": "be_a", "server": "h1-a"}, {"backend": "be_b", "server": "h2-b", "host": "h2"}]
    assert drain_records("") == [] and drain_records(None) == []  # type: ignore[arg-type]
    # files concatenated by cat without a newline between them
    assert drain_records('{"backend": "b", "server": "s2"}{"backend": "b", "server": "s1"} \t{"x": 1}') == [
        {"backend": "b", "server": "s1"}, {"backend": "b", "server": "s2"}]
    assert drain_records('nope {"backend": "b", "server": "s"}\n{"backend": "b", "server": "t"}') == [{"backend": "b", "server": "t"}]


def test_restore_gives_back_recorded_drains_but_not_an_operators_maint_nor_unknown_servers() -> None:
    records = [{"backend": "be_a", "server": s} for s in ("h1-a", "h2-a", "h3-a", "h4-a")]
    rows = [row("h1-a", "DRAIN"), row("h2-a", "MAINT"), row("h3-a", "DOWN")]
    assert restore_plan(rows, records) == [{"backend": "be_a", "server": "h1-a"}, {"backend": "be_a", "server": "h3-a"}]
    assert restore_plan([{"backend": "be_a", "server": "h1-a"}], records[:1]) == [{"backend": "be_a", "server": "h1-a"}]


# ---- progress
def test_progress_says_which_batch_of_how_many() -> None:
    batches = [["h1"], ["h2", "h3"]]
    assert batch_line(batches, ["h2", "h3"]) == "batch 2 of 2: hosts h2, h3"
    assert batch_line(batches, ["h1"]) == "batch 1 of 2: hosts h1"
    assert batch_line(batches, []) == "batch ? of 2: hosts "
    assert batch_line(batches, ["h9"]) == "batch ? of 2: hosts h9"
    assert progress(batches, "h3", "drained", "2 requests in flight") == "batch 2 of 2, h3: drained (2 requests in flight)"
    assert progress(batches, "h1", "given back") == "batch 1 of 2, h1: given back"
    assert progress(batches, "h9", "restarted") == "batch ? of 2, h9: restarted"


# ---- the failure cause, never empty
SKOPEO = ('time="2026-12-01T10:00:00Z" level=fatal msg="Error parsing image name \\"docker://lab-registry:5000/v:nope\\": '
          'reading manifest nope in lab-registry:5000/v: manifest unknown"')  # fmt: skip


def test_the_cause_unwraps_skopeos_log_line() -> None:
    cause = failure_cause({}, [f"skopeo inspect docker://x failed (rc 1): {SKOPEO}"])
    assert cause == ('skopeo inspect docker://x failed (rc 1): Error parsing image name "docker://lab-registry:5000/v:nope": '
                     "reading manifest nope in lab-registry:5000/v: manifest unknown")  # fmt: skip
    assert failure_cause({}, ['time="t" level=error msg="a \\\\ b"']) == "a \\ b"


def test_the_cause_takes_msg_stderr_and_failed_items_once_each() -> None:
    result = {"msg": "non-zero return code", "stderr": "warning\nError: disk full\n\n",
              "results": [{"failed": True, "msg": "item  one\n broke"}, {"failed": False, "msg": "fine"}, "x",
                          {"failed": True, "stderr": "Error: disk full"}]}  # fmt: skip
    assert failure_cause(result, None) == "Error: disk full item one broke"
    assert failure_cause({"msg": "m"}, ["m", "", None, "  ", "fb"]) == "m fb"


@pytest.mark.parametrize("result", [{}, None, "x", {"msg": "", "results": None}, {"msg": "non-zero return code"}])
def test_the_cause_is_never_empty(result: object) -> None:
    assert failure_cause(result) == "the failed task gave no reason (run again with -v to see its whole result)"


# ---- the summary
def times(name: str, stop_us: int, new: bool = False) -> dict:
    key = "InactiveExitTimestampMonotonic" if new else "ActiveExitTimestampMonotonic"
    return {"item": {"name": name, "unit": name, "new": new, "reason": "unit changed"}, "stdout": f"{key}={stop_us}\n"}


VIEW = {"h1": {"a": {"backend": "be_a", "server": "h1-a"}, "m": {"backend": "be_m", "server": "h1-m"}},
        "h2": {"a": {"backend": "be_a", "server": "h2-a"}}}  # fmt: skip
OLD, NEW = "reg/v@sha256:" + "1" * 64, "reg/v@sha256:" + "2" * 64


def test_rows_carry_the_units_and_the_routers_windows_and_the_replicas() -> None:
    smoke = [{"instance": "a", "ready_monotonic": 104.0}, {"instance": "m", "ready_monotonic": 110.2},
             {"instance": "n", "ready_monotonic": 20.0}]  # fmt: skip
    context = {"host": "h1", "before": OLD, "after": NEW, "drained_at": 1000.0, "back_at": 1013.44, "servers": VIEW}
    rows = rollout_rows([times("a", 100_000_000), times("m", 107_600_000), times("n", 15_000_000, True), times("z", 1)], smoke, context)
    assert rows == [
        {"host": "h1", "instance": "a", "before": OLD, "after": NEW, "new": False, "unit_s": 4.0, "router_s": 13.4, "replicas": 2},
        {"host": "h1", "instance": "m", "before": OLD, "after": NEW, "new": False, "unit_s": 2.6, "router_s": 13.4, "replicas": 1},
        {"host": "h1", "instance": "n", "before": OLD, "after": NEW, "new": True, "unit_s": 5.0, "router_s": None, "replicas": 0},
        {"host": "h1", "instance": "z", "before": OLD, "after": NEW, "new": False, "unit_s": None, "router_s": None, "replicas": 0},
    ]  # fmt: skip
    # without routers (no view, or no times): no router window
    bare = rollout_rows([times("a", 100_000_000)], smoke, {"host": "h1", "before": None, "after": NEW})
    assert bare[0]["router_s"] is None and bare[0]["replicas"] == 0 and bare[0]["before"] == ""
    assert rollout_rows([times("a", 1)], smoke, {**context, "back_at": None})[0]["router_s"] is None
    assert rollout_rows([times("a", 1)], smoke, {**context, "drained_at": None})[0]["router_s"] is None
    assert rollout_rows([times("a", 1)], smoke, {**context, "host": "h3"})[0]["router_s"] is None


def test_the_summary_puts_the_single_replicas_client_window_beside_the_units_and_says_how_to_pin() -> None:
    rows = [
        {"host": "h2", "instance": "a", "before": OLD, "after": NEW, "unit_s": 4.0, "router_s": 9.1, "replicas": 3},
        {"host": "h1", "instance": "m", "before": OLD, "after": NEW, "unit_s": 2.6, "router_s": 13.4, "replicas": 1},
        {"host": "h1", "instance": "b", "before": "", "after": NEW, "unit_s": 5.0, "router_s": None, "replicas": 0, "new": True},
        {"host": "h1", "instance": "c", "before": "reg/v:tag", "after": NEW, "unit_s": None, "router_s": None, "replicas": 0},
    ]  # fmt: skip
    lines = summary(rows, {"inventory": "inventories/lab", "image_name": "reg/v:next", "digest": "sha256:" + "2" * 64})
    assert lines[:5] == [
        "host  instance  digest before        digest after         unit down  clients could see",
        "h1    b         -                    sha256:222222222222  5.0 s      - (new instance)",
        "h1    c         reg/v:tag            sha256:222222222222  -          - (no router: stop to ready)",
        "h1    m         sha256:111111111111  sha256:222222222222  2.6 s      13.4 s (one replica: drain to back in the router)",
        "h2    a         sha256:111111111111  sha256:222222222222  4.0 s      0 s (2 other replica(s) served; out of the router 9.1 s)",
    ]  # fmt: skip
    assert lines[5:] == [
        "",
        "Keep this digest for later runs (pin it): ansible-playbook site.yml -i inventories/lab -e d3_image_name=reg/v:next "
        "-e d3_image_digest=sha256:" + "2" * 64,
        "  (or set d3_image_digest in the inventory's group_vars, when the inventory is not generated as inventories/lab "
        "is by make lab)",
    ]  # fmt: skip
    assert summary([], {"digest": ""}) == ["host  instance  digest before  digest after  unit down  clients could see"]
    one = summary([{"host": "h", "instance": "i", "before": OLD, "after": NEW, "unit_s": 1.5, "router_s": None}], {})
    assert one[1].endswith("1.5 s      1.5 s (no router: stop to ready)")


def test_one_hosts_view_is_taken_as_its_servers_with_their_instance() -> None:
    mine = {"a": {"backend": "be_a", "server": "h1-a", "frontend": "fe_a"}}
    batch = {"a": {"backend": "be_a", "server": "h1-a"}, "b": {"backend": "be_a", "server": "h2-a"}}
    stats = {"r1": [row("h1-a", "UP", 2), row("h2-a"), row("h3-a", "DOWN")]}
    assert drain_plan(stats, mine) == [{"router": "r1", "kept": [], "inflight": 2, "drain": [
        {"backend": "be_a", "server": "h1-a", "frontend": "fe_a", "instance": "a", "scur": 2}]}]  # fmt: skip
    (problem,) = drain_check(stats, mine, batch)
    assert "its other servers: h3-a (DOWN)." in problem
    assert drain_check(stats, mine, None) == [] and drain_plan(stats, None) == [{"router": "r1", "drain": [], "kept": [], "inflight": 0}]


def test_the_drain_detail_names_each_server_with_its_requests_in_flight_and_what_was_left() -> None:
    plan = [{"router": "r1", "drain": [{"backend": "be_a", "server": "h1-a", "scur": 3}, {"backend": "be_b", "server": "h1-b"}],
             "kept": ["be_c/h1-c (MAINT)", "be_d/h1-d (DRAIN)"]},
            {"router": "r2", "drain": [], "kept": []}, {"router": "r3"}]  # fmt: skip
    assert drain_detail(plan) == ("r1: be_a/h1-a 3 in flight, be_b/h1-b 0 in flight; left as found: be_c/h1-c (MAINT), "
                                  "be_d/h1-d (DRAIN); r2: nothing drained; r3: nothing drained")  # fmt: skip
    assert drain_detail([]) == "no router"


def test_the_refusals_name_every_other_server_and_the_value_given() -> None:
    (problem,) = drain_check({"r1": [row("h1-a"), row("h2-a", "DOWN"), row("h3-a", "MAINT")]}, [A1], [])
    assert "its other servers: h2-a (DOWN), h3-a (MAINT). The rollout stops" in problem
    (undeclared,) = slice_problems(2, 1, [], "r1")
    assert undeclared == ('this rollout is slice 1 of 2 (d3_image_slice_count / d3_image_slice_number) and d3_rollout_routers '
                          'is "r1": a slice holds only its own hosts, so a slice that sees no router would restart its hosts '
                          "without draining them. Set d3_rollout_routers on the job template to the list of every router "
                          "of the fleet ([] when it has none).")  # fmt: skip


# ---- the routers that serve (a router's host down, or its HAProxy stopped, mid-rollout)
def test_every_router_that_answers_is_kept_and_nothing_is_said() -> None:
    from d3_rollout import routers_live

    rows = [{"backend": "be_m", "server": "h-m", "status": "UP"}]
    live = routers_live([{"item": "r1", "stat": rows}, {"item": "r2", "stat": []}])
    assert live == {"stats": {"r1": rows, "r2": []}, "down": {}, "errors": {}, "unread": [], "unreachable": [], "line": ""}


def test_an_unreachable_router_is_left_out_only_when_one_that_answers_holds_the_virtual_address() -> None:
    from d3_rollout import routers_live

    reads = [{"item": "r1", "stat": []}, {"item": "r2", "unreachable": True, "msg": "Failed to connect via ssh:\n refused"}]
    live = routers_live(reads, [], [{"item": "r1", "stdout": "holds\n"}], "10.0.0.10")
    assert live["stats"] == {"r1": []} and live["errors"] == {} and live["unread"] == [] and live["unreachable"] == ["r2"]
    assert live["down"] == {"r2": "unreachable (Failed to connect via ssh: refused); r1 holds the virtual address 10.0.0.10"}
    assert live["line"].startswith("Routers not serving, left out of this step: r2: unreachable (Failed to connect")
    assert "given back at the rollout's end if they answer by then; else status.yml reports it." in live["line"]
    # nobody that answers holds it (the cut-off router may, alive behind a broken SSH), or no virtual address: an error
    cut_off = "unreachable (Failed to connect via ssh: refused) and no router that answers holds "
    for holders, vip, what in (([{"item": "r1", "stdout": ""}], "10.0.0.10", "the virtual address 10.0.0.10"),
                               ([{"item": "r1", "stdout": "holds", "unreachable": True}], "10.0.0.10",
                                "the virtual address 10.0.0.10"),
                               ([{"item": "r1", "stdout": "holds"}], "", "a virtual address (d3_router_vip)"),
                               (None, "10.0.0.10", "the virtual address 10.0.0.10")):  # fmt: skip
        live = routers_live(reads, [], holders, vip)
        assert live["down"] == {} and live["line"] == "", holders
        assert live["errors"] == {"r2": f"{cut_off}{what}: it may still serve clients this rollout cannot drain"}, holders


def test_a_stopped_haproxy_is_left_out_a_running_or_starting_one_that_cannot_be_read_is_an_error() -> None:
    from d3_rollout import routers_live

    reads = [{"item": f"r{i}", "failed": True, "msg": f"m{i}"} for i in range(1, 8)]
    services = [{"item": "r1", "stdout": "inactive\n"}, {"item": "r2", "stdout": "failed"}, {"item": "r3", "stdout": "unknown"},
                {"item": "r4", "stdout": "active\n"}, {"item": "r5", "stdout": "activating"},
                {"item": "r6", "unreachable": True, "stdout": "inactive"}]  # fmt: skip
    live = routers_live(reads, services)
    assert live["stats"] == {} and live["unread"] == [f"r{i}" for i in range(1, 8)] and live["unreachable"] == []
    assert live["down"] == {"r1": "HAProxy not running (haproxy.service inactive)",
                            "r2": "HAProxy not running (haproxy.service failed)",
                            "r3": "HAProxy not running (haproxy.service unknown)"}  # fmt: skip
    # r6's service could not be asked (its host went away after the read), r7's not at all: not known to be stopped
    assert live["errors"] == {"r4": "m4", "r5": "haproxy.service is activating (m5): read again once it settles",
                              "r6": "m6", "r7": "m7"}  # fmt: skip
    assert live["line"].index("r1: HAProxy not running") < live["line"].index("r3: HAProxy")


def test_a_read_without_rows_or_message_is_no_answer() -> None:
    from d3_rollout import routers_live

    assert routers_live(None) == {"stats": {}, "down": {}, "errors": {}, "unread": [], "unreachable": [], "line": ""}
    live = routers_live([{"item": "r1", "unreachable": True, "stat": []}, {"item": "r2", "stat": "UP"}, {"item": "r3", "stat": []}],
                        [{"item": "r2", "stdout": "failed"}], [{"item": "r3", "stdout": "x"}], "10.0.0.10")  # fmt: skip
    assert live["down"] == {"r1": "unreachable (no answer); r3 holds the virtual address 10.0.0.10",
                            "r2": "HAProxy not running (haproxy.service failed)"}  # fmt: skip
    assert live["unread"] == ["r2"]
    long = routers_live([{"item": "r1", "unreachable": True, "msg": "y" * 400}], None, [{"item": "r2", "stdout": "h"}], "v")
    assert long["down"]["r1"] == f"unreachable ({'y' * 300}); r2 holds the virtual address v"
