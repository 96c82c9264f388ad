"""Unit tests of the fleet status filter (d3fleet.fleet plugins/filter/d3_status.py): drift found both ways, exact drift
reasons, the health column from the probe, containers the inventory does not know, and the aligned table."""

from __future__ import annotations

from typing import Any

from d3_status import FilterModule, status_drains, status_monitor, status_rows, status_table

WANTED = "sha256:" + "a" * 64
OTHER = "sha256:" + "b" * 64
REV = "0123456789abcdef0123456789abcdef01234567"
PLAN = {"instances": [{"name": "d3-27b", "model": "d3", "revision": REV}]}
READY = [{"name": "d3-27b", "health": 200, "decision": 200, "elapsed_ms": 12.4, "problems": []}]


def container(state: str = "running", digest: str = WANTED, revision: str = REV, name: str = "d3-27b",
              model: str | None = "d3") -> dict[str, Any]:
    labels = {"io.d3-fleet.instance": name, "io.d3-fleet.revision": revision}
    if model:
        labels["io.d3-fleet.model"] = model
    return {"Image": f"ghcr.io/vllm-sr/vllm@{digest}", "State": state, "Labels": labels}


def row(containers: list[dict[str, Any]], probe: list[dict[str, Any]] = READY, wanted: str = WANTED,
        plan: dict[str, Any] = PLAN) -> dict[str, Any]:
    (only,) = status_rows(plan, "l4-a", containers, probe, wanted)
    return only


def test_as_wanted_is_no_drift() -> None:
    assert row([container()]) == {"host": "l4-a", "instance": "d3-27b", "model": "d3", "digest": WANTED, "revision": REV,
                                   "health": "ready", "smoke_ms": 12.4, "restarts": None, "gpus": [], "drift": [],
                                   "unknown": []}


def test_each_drift_reason_exactly() -> None:
    assert row([])["drift"] == ["not running"]
    assert row([], probe=[])["health"] == "down (?)"
    assert row([container(state="exited")])["drift"] == ["container exited"]
    assert row([container(digest=OTHER)])["drift"] == [f"image {OTHER[:19]} != wanted {WANTED[:19]}"]
    assert row([container(revision="f" * 40)])["drift"] == [f"revision {'f' * 12} != wanted {REV[:12]}"]
    unlabelled = {"Image": "localhost/vllm:latest", "State": "created", "Labels": {"io.d3-fleet.instance": "d3-27b"}}
    assert row([unlabelled]) | {"health": None} == {
        "host": "l4-a", "instance": "d3-27b", "model": "d3", "digest": "", "revision": "", "health": None,
        "smoke_ms": 12.4, "restarts": None, "gpus": [], "unknown": [],
        "drift": ["container created", f"image ? != wanted {WANTED[:19]}", f"revision  != wanted {REV[:12]}"]}


def test_no_wanted_digest_or_revision_means_no_such_drift() -> None:
    assert row([container(digest=OTHER)], wanted="")["drift"] == []
    plan = {"instances": [{"name": "d3-27b", "model": "d3", "revision": None}]}
    assert row([container(revision="f" * 40)], plan=plan)["drift"] == []


def test_health_column_from_the_probe() -> None:
    probe = [{**READY[0], "health": 503}]
    assert (row([container()], probe)["health"], row([container()], probe)["smoke_ms"]) == ("down (503)", 12.4)
    assert row([container()], [{"name": "d3-27b", "health": 200}])["health"] == "no decision (?)"
    assert row([container()], [{**READY[0], "decision": 401}])["health"] == "no decision (401)"
    bad = [{**READY[0], "problems": ["q1: no answer", "q2: no answer"]}]
    assert row([container()], bad)["health"] == "bad answer: q1: no answer; q2: no answer"
    other = [{**READY[0], "name": "d3-mini"}]
    assert (row([container()], other)["health"], row([container()], other)["smoke_ms"]) == ("down (?)", None)


def test_containers_the_inventory_does_not_know() -> None:
    rows = status_rows(PLAN, "l4-a", [container(name="zz-old", model=None, revision=""), container(), container(name="aa-old"),
                                      {"Labels": {}, "Image": "x"}, {"Image": "y"}], READY, WANTED)
    assert [r["instance"] for r in rows] == ["d3-27b", "aa-old", "zz-old"]
    assert rows[1] == {"host": "l4-a", "instance": "aa-old", "model": "d3", "digest": WANTED, "revision": REV, "health": "-",
                       "smoke_ms": None, "restarts": None, "gpus": [], "drift": ["not in the inventory"], "unknown": []}
    assert (rows[2]["model"], rows[2]["revision"]) == ("?", "")
    bare = {"Labels": {"io.d3-fleet.instance": "bare"}}
    assert status_rows({"instances": []}, "h", [bare], [], "") == [
        {"host": "h", "instance": "bare", "model": "?", "digest": "", "revision": "", "health": "-", "smoke_ms": None,
         "restarts": None, "gpus": [], "drift": ["not in the inventory"], "unknown": []}]


def test_table_is_aligned_and_truncated() -> None:
    rows = [
        {"host": "l4-a", "instance": "d3-27b", "model": "d3", "digest": WANTED, "revision": REV, "health": "ready",
         "smoke_ms": 12.5, "drift": []},
        {"host": "l4-bb", "instance": "x", "model": "d3-mini", "digest": "", "revision": None, "health": "down (?)",
         "smoke_ms": None, "drift": ["not running", "container exited"]},
    ]
    assert status_table(rows) == [
        "host   instance  model    digest               revision      health    2q ms  restarts  drift",
        "l4-a   d3-27b    d3       sha256:aaaaaaaaaaaa  0123456789ab  ready     12     -         none",
        "l4-bb  x         d3-mini                                     down (?)  -      -         not running; container exited",
    ]
    assert status_table([{**rows[0], "smoke_ms": 12.6}])[1].split()[-3] == "13"
    assert status_table([{**rows[0], "restarts": 2, "unknown": ["wanted image digest unknown: x"]}])[1].endswith(
        "ready   12     2         unknown: wanted image digest unknown: x")


def test_filter_plugin_exports() -> None:
    assert FilterModule().filters() == {"d3_status_rows": status_rows, "d3_status_table": status_table,
                                        "d3_status_drains": status_drains, "d3_status_monitor": status_monitor}


def test_an_unresolved_wanted_digest_is_unknown_not_no_drift() -> None:
    (only,) = status_rows(PLAN, "l4-a", [container(digest=OTHER)], READY, "", {"digest_error": "skopeo: connection refused"})
    assert (only["drift"], only["unknown"]) == ([], ["wanted image digest unknown: skopeo: connection refused"])
    (resolved,) = status_rows(PLAN, "l4-a", [container()], READY, WANTED, {"digest_error": ""})
    assert resolved["unknown"] == []


def test_restart_count_and_unit_state_from_systemd() -> None:
    units = {"d3-27b": {"ActiveState": "active", "NRestarts": "3"}}
    (only,) = status_rows(PLAN, "l4-a", [container()], READY, WANTED, {"units": units})
    assert only["restarts"] == 3
    (odd,) = status_rows(PLAN, "l4-a", [container()], READY, WANTED, {"units": {"d3-27b": {"NRestarts": "[not set]"}}})
    assert odd["restarts"] is None


def test_a_lost_gpu_names_the_instance_and_the_gpu() -> None:
    plan = {"instances": [{"name": "d3-mini", "model": "d3-mini", "revision": REV, "gpus": [2]}]}
    deployed = {"d3-27b": {"model": "d3", "revision": REV, "port": 8000, "gpus": [0, 1], "unit": "d3-27b"},
                "d3-mini": {"model": "d3-mini", "revision": REV, "port": 8001, "gpus": [2], "unit": "d3-mini"}}
    units = {"d3-27b": {"ActiveState": "activating", "NRestarts": "4"}, "d3-mini": {"ActiveState": "active", "NRestarts": "0"}}
    ctx = {"gpus": [0, 2, 3], "deployed": deployed, "units": units, "plan_error": "GPU index [1] out of range"}
    mini = container(name="d3-mini", model="d3-mini")
    rows = status_rows(plan, "l4-a", [mini], [{**READY[0], "name": "d3-mini"}], WANTED, ctx)
    assert [(r["instance"], r["drift"], r["health"], r["restarts"]) for r in rows] == [
        ("d3-mini", [], "ready", 0),
        ("d3-27b", ["not in the plan (GPU index [1] out of range)", "not running", "GPU 1 missing (nvidia-smi lists 0, 2, 3)"],
         "unit activating", 4),
    ]
    # GPUs not read (declared with d3_gpu_count): no GPU drift; a planned instance on a missing GPU is named too
    assert status_rows(plan, "l4-a", [mini], READY, WANTED, {"gpus": None})[0]["drift"] == []
    assert status_rows(plan, "l4-a", [mini], READY, WANTED, {"gpus": [0, 1]})[0]["drift"] == [
        "GPU 2 missing (nvidia-smi lists 0, 1)"]
    assert status_rows(plan, "l4-a", [mini], READY, WANTED, {"gpus": []})[0]["drift"] == ["GPU 2 missing (nvidia-smi lists none)"]
    # a recorded instance dropped by a working plan is "not in the inventory"
    dropped = status_rows(plan, "l4-a", [mini], READY, WANTED, {"deployed": deployed})[1]
    assert dropped["drift"] == ["not in the inventory", "not running"] and dropped["health"] == "-"


def test_drains_left_by_an_interrupted_rollout_name_server_host_instance_and_state_now() -> None:
    records = [{"backend": "be_a", "server": "h1-a", "host": "h1", "instance": "a", "since": "2026-12-01T19:00:00Z"},
               {"backend": "be_b", "server": "h2-b"}]  # fmt: skip
    rows = [{"backend": "be_a", "server": "h1-a", "status": "DRAIN"}, {"backend": "be_b", "server": "h9-b", "status": "UP"},
            {"backend": "be_b", "server": "h2-b", "status": ""}]  # fmt: skip
    assert status_drains(records, rows, "r1") == [
        "router r1: be_a/h1-a (host h1, instance a) left by an interrupted rollout, drained since 2026-12-01T19:00:00Z, "
        "now DRAIN. The next rollout.yml or site.yml gives it back.",
        "router r1: be_b/h2-b (host ?, instance ?) left by an interrupted rollout, drained since ?, now ?. The next "
        "rollout.yml or site.yml gives it back.",
    ]
    assert "now not in the router's configuration." in status_drains(records[:1], [], "r1")[0]
    assert status_drains([], rows, "r1") == []
