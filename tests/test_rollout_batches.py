"""The rollout's batch check: d3_rollout_batches makes the batches Ansible makes (compared with Ansible's own
PlaybookExecutor._get_serialized_batches), and d3_rollout_drain_problems refuses a batch that would drain every
replica of a model, or more than d3_rollout_max_unavailable of them."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from ansible.executor.playbook_executor import PlaybookExecutor

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "collections/ansible_collections/d3fleet/fleet/plugins/filter"))
from d3_rollout import FilterModule, drain_problems, rollout_batches, rollout_downtimes, systemctl_show


def ansible_batches(hosts: list[str], serial: Any) -> list[list[str]]:
    """Ansible's own batches for a play over `hosts` with `serial` (the executor method, with a stand-in inventory)."""
    fake = SimpleNamespace(_inventory=SimpleNamespace(get_hosts=lambda pattern, order=None: list(hosts)))
    play = SimpleNamespace(hosts="all", order=None, serial=serial if isinstance(serial, list) else [serial])
    return PlaybookExecutor._get_serialized_batches(fake, play)  # type: ignore[arg-type]


@pytest.mark.parametrize("count", [1, 2, 3, 4, 7, 10, 33])
@pytest.mark.parametrize("serial", [[1, "25%", "100%"], 1, 2, "50%", "10%", [2, 1], [], [0], ["30%", 3], "100%", [1, -1]])
def test_batches_are_ansibles(count: int, serial: Any) -> None:
    hosts = [f"h{i}" for i in range(count)]
    assert rollout_batches(hosts, serial) == ansible_batches(hosts, serial)


def test_the_default_serial_makes_a_canary_then_quarters() -> None:
    hosts = [f"h{i}" for i in range(8)]
    assert rollout_batches(hosts, [1, "25%", "100%"]) == [["h0"], ["h1", "h2"], ["h3", "h4", "h5", "h6", "h7"]]


REPLICAS = {"h1": ["d3-flash", "d3-lite"], "h2": ["d3-lite"], "h3": ["d3-lite", "d3-nano"], "h4": ["d3-nano"]}


def test_a_batch_holding_every_replica_of_a_model_is_refused_naming_it() -> None:
    problems = drain_problems([["h1"], ["h2", "h3", "h4"]], REPLICAS, 5)
    assert len(problems) == 1
    assert problems[0].startswith("batch 2 (h2, h3, h4) would drain 2 of the 2 replicas of d3-nano at once (on h3, h4;")
    assert "d3_rollout_serial" in problems[0]


def test_more_than_max_unavailable_is_refused_and_one_replica_models_are_not() -> None:
    assert drain_problems([["h1"], ["h2"], ["h3"], ["h4"]], REPLICAS, 1) == []
    assert drain_problems([["h1", "h2"], ["h3"], ["h4"]], REPLICAS, 2) == []  # 2 of 3 d3-lite, max 2
    refused = drain_problems([["h1", "h2"], ["h3"], ["h4"]], REPLICAS, 1)
    assert len(refused) == 1 and "2 of the 3 replicas of d3-lite" in refused[0]
    # d3-flash has one replica: draining it is not refused
    assert drain_problems([["h1"]], {"h1": ["d3-flash"]}, 1) == []


def test_two_replicas_on_one_host_count_as_many_as_its_waves_drain_at_once() -> None:
    # one at a time (d3_rollout_waves), so a batch of h1 alone drains 1 of 3; max 1 and a whole-batch pair: 2 of 3
    assert drain_problems([["h1"], ["h2"]], {"h1": ["a", "a"], "h2": ["a"]}, 1) == []
    assert "2 of the 3 replicas of a" in drain_problems([["h1", "h2"]], {"h1": ["a", "a"], "h2": ["a"]}, 1)[0]


def test_max_unavailable_below_one_is_refused() -> None:
    assert "at least 1" in drain_problems([["h1"]], REPLICAS, 0)[0]


def test_max_unavailable_that_is_not_a_whole_number_is_refused_saying_how_to_fix_it() -> None:
    for bad in ("two", "1.5", True, -1):
        problems = drain_problems([["h1"]], REPLICAS, bad)
        assert problems == [f"d3_rollout_max_unavailable is {bad!r}: it must be a whole number, at least 1 (a replica must "
                            "restart some time). Fix the -e value or the inventory."], bad  # fmt: skip
    assert drain_problems([["h1"], ["h2"], ["h3"], ["h4"]], REPLICAS, "1") == []


def test_hosts_without_instances_drain_nothing() -> None:
    assert drain_problems([["h0", "h1"], ["h2", "h5"]], {"h1": ["a"], "h2": ["a"]}, 1) == []


def test_the_refusal_says_how_to_fix_it() -> None:
    problem = drain_problems([["h1", "h2"]], {"h1": ["a"], "h2": ["a"]}, 1)[0]
    assert problem.endswith("Fix: a smaller d3_rollout_serial (e.g. 1), or place the replicas on hosts that fall in different batches.")


def test_exports() -> None:
    filters = FilterModule().filters()
    assert {k: filters[k] for k in ("d3_rollout_batches", "d3_rollout_drain_problems", "d3_rollout_downtimes", "d3_systemctl_show")} == {
        "d3_rollout_batches": rollout_batches, "d3_rollout_drain_problems": drain_problems,
        "d3_rollout_downtimes": rollout_downtimes, "d3_systemctl_show": systemctl_show}  # fmt: skip
    assert sorted(filters) == sorted(["d3_rollout_batches", "d3_rollout_drain_problems", "d3_rollout_slice_problems",
                                      "d3_rollout_drain_check", "d3_rollout_drain_plan", "d3_rollout_drain_detail",
                                      "d3_rollout_drain_records", "d3_rollout_drain_files",
                                      "d3_rollout_restore_plan", "d3_rollout_routers_live", "d3_rollout_progress", "d3_rollout_batch_line",
                                      "d3_rollout_failure_cause", "d3_rollout_downtimes", "d3_rollout_rows",
                                      "d3_rollout_summary", "d3_systemctl_show", "d3_rollout_waves"])  # fmt: skip
    assert all(filters[k].__name__ == k.removeprefix("d3_rollout_").replace("d3_", "") or k in (
        "d3_rollout_batches", "d3_rollout_drain_problems", "d3_rollout_downtimes", "d3_rollout_rows",
        "d3_rollout_waves") for k in filters)
