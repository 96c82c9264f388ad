"""Edges of the fleet status rows (d3fleet.fleet plugins/filter/d3_status.py) the other status tests leave open: the
whole row of a recorded instance the plan does not have (running or not), the unit looked up by the planned or
recorded unit name, the digest after the first '@', and what an absent restart count reads as."""

from __future__ import annotations

from typing import Any

from ansible_collections.d3fleet.fleet.plugins.module_utils import d3_labels
from d3_status import status_rows

WANTED = "sha256:" + "a" * 64
REV = "0123456789abcdef0123456789abcdef01234567"


def container(name: str, digest: str = WANTED, revision: str = REV, model: str = "d3") -> dict[str, Any]:
    labels = {d3_labels.INSTANCE: name, d3_labels.REVISION: revision, d3_labels.MODEL: model}
    return {"Image": f"ghcr.io/vllm-sr/vllm@{digest}", "State": "running", "Labels": labels}


def test_the_label_keys() -> None:
    assert (d3_labels.INSTANCE, d3_labels.MODEL, d3_labels.REVISION) == (
        "io.d3-fleet.instance", "io.d3-fleet.model", "io.d3-fleet.revision")


def test_a_recorded_instance_still_running_but_not_planned_is_one_whole_row() -> None:
    deployed = {"d3-old": {"model": "d3-old-model", "revision": REV, "port": 8001, "gpus": [1], "unit": "d3-old-unit"},
                "d3-27b": {"model": "d3", "revision": REV, "port": 8000, "gpus": [0], "unit": "d3-27b"}}
    units = {"d3-old-unit": {"ActiveState": "active", "NRestarts": "2"}, "d3-old": {"ActiveState": "failed", "NRestarts": "9"}}
    plan = {"instances": [{"name": "d3-27b", "model": "d3", "revision": REV, "gpus": [0]}]}
    ctx = {"deployed": deployed, "units": units, "gpus": [0, 1]}
    rows = status_rows(plan, "l4-a", [container("d3-27b"), container("d3-old", revision="f" * 40)], [], WANTED, ctx)
    assert rows[1] == {"host": "l4-a", "instance": "d3-old", "model": "d3-old-model", "digest": WANTED,
                       "revision": "f" * 40, "health": "unit active", "smoke_ms": None, "restarts": 2, "gpus": [1],
                       "drift": ["not in the inventory"], "unknown": []}
    # and the planned one is a row of its own, before it, with its planned GPUs
    assert [r["instance"] for r in rows] == ["d3-27b", "d3-old"] and rows[0]["gpus"] == [0]


def test_every_recorded_instance_the_plan_lacks_is_listed_in_name_order() -> None:
    deployed = {"d3-b": {"unit": "d3-b"}, "d3-a": {"unit": "d3-a"}, "d3-kept": {"unit": "d3-kept"}}
    plan = {"instances": [{"name": "d3-kept", "model": "d3", "revision": None}]}
    rows = status_rows(plan, "h", [], [], "", {"deployed": deployed})
    assert [(r["instance"], r["model"], r["digest"], r["revision"], r["gpus"]) for r in rows] == [
        ("d3-kept", "d3", "", "", []), ("d3-a", "?", "", "", []), ("d3-b", "?", "", "", [])]
    assert rows[1]["drift"] == ["not in the inventory", "not running"]


def test_a_recorded_instance_without_a_unit_name_is_looked_up_by_its_name() -> None:
    units = {"d3-old": {"ActiveState": "activating", "NRestarts": "1"}}
    rows = status_rows({"instances": []}, "h", [], [], "", {"deployed": {"d3-old": {"model": "d3"}}, "units": units})
    assert (rows[0]["health"], rows[0]["restarts"]) == ("unit activating", 1)


def test_a_planned_instance_reads_its_unit_by_its_unit_name_then_by_its_name() -> None:
    plan = {"instances": [{"name": "d3-27b", "unit": "d3-27b-unit", "model": "d3", "revision": REV}]}
    units = {"d3-27b-unit": {"ActiveState": "active", "NRestarts": "5"}, "d3-27b": {"ActiveState": "failed", "NRestarts": "7"}}
    (only,) = status_rows(plan, "h", [container("d3-27b")], [], WANTED, {"units": units})
    assert (only["restarts"], only["health"]) == (5, "down (?)")
    # no probe row and no unit state: the unit's state is shown
    (unprobed,) = status_rows({"instances": [{"name": "d3-27b", "model": "d3", "revision": REV}]}, "h",
                              [container("d3-27b")], [], WANTED, {"units": {"d3-27b": {"NRestarts": "0"}}})
    assert unprobed["restarts"] == 0


def test_a_container_the_inventory_does_not_know_reads_its_unit_by_its_name() -> None:
    rows = status_rows({"instances": []}, "h", [container("d3-stray")], [], "", {"units": {"d3-stray": {"NRestarts": "6"}}})
    assert (rows[0]["instance"], rows[0]["restarts"], rows[0]["drift"]) == ("d3-stray", 6, ["not in the inventory"])


def test_no_image_is_no_digest() -> None:
    plan = {"instances": [{"name": "d3-27b", "model": "d3", "revision": REV}]}
    bare = {"State": "running", "Labels": {d3_labels.INSTANCE: "d3-27b", d3_labels.REVISION: REV}}
    assert status_rows(plan, "h", [bare], [], "")[0]["digest"] == ""
    stray = {"State": "running", "Labels": {d3_labels.INSTANCE: "d3-stray"}}
    assert status_rows({"instances": []}, "h", [stray], [], "")[0]["digest"] == ""
    deployed = {"d3-old": {"model": "d3"}}
    assert status_rows({"instances": []}, "h", [{**stray, "Labels": {d3_labels.INSTANCE: "d3-old"}}], [], "",
                       {"deployed": deployed})[0]["digest"] == ""


def test_the_digest_is_everything_after_the_first_at_sign() -> None:
    plan = {"instances": [{"name": "d3-27b", "model": "d3", "revision": REV}]}
    odd = {"Image": "registry@x/vllm@sha256:abc", "State": "running", "Labels": {d3_labels.INSTANCE: "d3-27b"}}
    assert status_rows(plan, "h", [odd], [], "")[0]["digest"] == "x/vllm@sha256:abc"


def test_no_restart_count_is_none() -> None:
    plan = {"instances": [{"name": "d3-27b", "model": "d3", "revision": REV}]}
    assert status_rows(plan, "h", [container("d3-27b")], [], "", {"units": {"d3-27b": {"ActiveState": "active"}}})[0][
        "restarts"] is None


def test_several_lost_gpus_are_listed_together() -> None:
    plan = {"instances": [{"name": "d3-27b", "model": "d3", "revision": REV, "gpus": [1, 2]}]}
    (only,) = status_rows(plan, "h", [container("d3-27b")], [], "", {"gpus": [0]})
    assert only["drift"] == ["GPU 1, 2 missing (nvidia-smi lists 0)"]
