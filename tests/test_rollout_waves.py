"""The waves one host restarts in (d3_rollout_waves, plugins/filter/d3_rollout.py) and the batch check that counts
them (d3_rollout_drain_problems): two replicas of a model on one host (spread: false) drained one at a time, never
more of a backend at once than d3_rollout_max_unavailable / d3_rollout_min_up allow, and instances sharing a GPU in
their start order (start_after, the unit's After=)."""

from __future__ import annotations

import pytest
from d3_rollout import FilterModule, drain_problems, rollout_waves


def inst(name: str, *after: str) -> dict:
    return {"name": name, "start_after": list(after)}


def server(host: str, name: str, backend: str) -> dict:
    return {"backend": backend, "server": f"{host}-{name}"}


# h1: two d3-lite replicas sharing GPU 0 (spread: false: d3-lite-1, d3-lite-2, one backend) and d3-flash on it too
PAIR = [inst("d3-lite-1"), inst("d3-lite-2", "d3-lite-1"), inst("d3-flash", "d3-lite-1", "d3-lite-2")]
VIEW = {"h1": {"d3-lite-1": server("h1", "d3-lite-1", "be_d3-lite"), "d3-lite-2": server("h1", "d3-lite-2", "be_d3-lite"),
               "d3-flash": server("h1", "d3-flash", "be_d3-flash")}}  # fmt: skip


def test_two_replicas_on_one_host_are_drained_one_at_a_time() -> None:
    assert rollout_waves(PAIR, "h1", VIEW, ["h1"]) == [["d3-lite-1"], ["d3-lite-2", "d3-flash"]]
    # the same without the GPU order: d3-flash fits in the first wave
    assert rollout_waves([inst("d3-lite-1"), inst("d3-lite-2"), inst("d3-flash")], "h1", VIEW, ["h1"]) == [
        ["d3-lite-1", "d3-flash"], ["d3-lite-2"]]  # fmt: skip


def test_an_instance_never_restarts_before_one_it_starts_after() -> None:
    # d3-flash starts after d3-lite-2 (shared GPU): it goes in d3-lite-2's wave, not the first
    waves = rollout_waves([inst("d3-lite-1"), inst("d3-lite-2"), inst("d3-flash", "d3-lite-2")], "h1", VIEW, ["h1"])
    assert waves == [["d3-lite-1"], ["d3-lite-2", "d3-flash"]]
    # a start_after naming an instance that is not planned here is ignored
    assert rollout_waves([inst("a", "gone")], "h9", {}, ["h9"]) == [["a"]]


def test_without_routers_every_instance_is_in_one_wave() -> None:
    assert rollout_waves(PAIR, "h1", {}, ["h1"]) == [["d3-lite-1", "d3-lite-2", "d3-flash"]]
    assert rollout_waves(PAIR, "h1", None, ["h1"]) == [["d3-lite-1", "d3-lite-2", "d3-flash"]]
    # a host that plans nothing: one empty wave (the units role still prunes)
    assert rollout_waves([], "h1", VIEW, ["h1"]) == [[]]


def test_max_unavailable_and_min_up_size_the_waves() -> None:
    three = {**VIEW, "h2": {"d3-lite": server("h2", "d3-lite", "be_d3-lite")}}
    pair = [inst("d3-lite-1"), inst("d3-lite-2")]
    # 3 servers: max_unavailable 2 and min_up 1 let both of h1's go at once
    assert rollout_waves(pair, "h1", three, ["h1"], 1, 2) == [["d3-lite-1", "d3-lite-2"]]
    # min_up 2 keeps two of the three up: one at a time
    assert rollout_waves(pair, "h1", three, ["h1"], 2, 2) == [["d3-lite-1"], ["d3-lite-2"]]
    # h2 restarts in the same batch: its replica counts against both limits (never below one a wave)
    assert rollout_waves(pair, "h1", three, ["h1", "h2"], 1, 2) == [["d3-lite-1"], ["d3-lite-2"]]
    assert rollout_waves(pair, "h1", three, ["h2", "h1"], "1", "3") == [["d3-lite-1"], ["d3-lite-2"]]
    # only the pair: max_unavailable 2 still keeps min_up 1 serving
    assert rollout_waves(pair, "h1", VIEW, ["h1"], 1, 2) == [["d3-lite-1"], ["d3-lite-2"]]
    # four servers on one host, max 2 at once: two waves of two
    four = {"h1": {n: server("h1", n, "be_x") for n in "abcd"}}
    assert rollout_waves([inst(n) for n in "abcd"], "h1", four, ["h1"], 1, 2) == [["a", "b"], ["c", "d"]]
    # another host outside the batch does not count as draining
    assert rollout_waves(pair, "h1", three, ["h1", "h3"], 1, 2) == [["d3-lite-1", "d3-lite-2"]]


@pytest.mark.parametrize("bad", [0, -1, "two", True, 1.5])
def test_invalid_limits_fail_naming_the_variable(bad: object) -> None:
    with pytest.raises(ValueError, match=r"\Ad3_rollout_min_up is .*: it must be a whole number, at least 1\. Fix the -e "
                                         r"value or the inventory\.\Z"):  # fmt: skip
        rollout_waves(PAIR, "h1", VIEW, ["h1"], bad, 1)
    with pytest.raises(ValueError, match=r"\Ad3_rollout_max_unavailable is .*: it must be a whole number, at least 1\. Fix "
                                         r"the -e value or the inventory\.\Z"):  # fmt: skip
        rollout_waves(PAIR, "h1", VIEW, ["h1"], 1, bad)


def test_a_batch_with_a_hosts_pair_is_not_refused_since_its_waves_take_one_at_a_time() -> None:
    assert drain_problems([["h1"]], {"h1": ["a", "a"]}, 1) == []
    assert drain_problems([["h1"], ["h2"]], {"h1": ["a", "a"], "h2": ["a"]}, 1) == []
    # with h2 in the same batch: one of h1's and h2's at once, 2 > 1
    (problem,) = drain_problems([["h1", "h2"]], {"h1": ["a", "a"], "h2": ["a"]}, 1)
    assert problem.startswith("batch 1 (h1, h2) would drain 2 of the 3 replicas of a at once (on h1, h2;")
    # max 2: h1's pair and h2's one at a time each, 2 of 3 at once, allowed
    assert drain_problems([["h1", "h2"]], {"h1": ["a", "a"], "h2": ["a"]}, 2) == []
    # max 3: min_up still keeps one of the three (h1 one at a time), 2 of 3 at once
    assert drain_problems([["h1", "h2"]], {"h1": ["a", "a"], "h2": ["a"]}, 3) == []
    # one replica on each of two hosts of one batch: both at once whatever the limits, refused
    assert "2 of the 2 replicas" in drain_problems([["h1", "h2"]], {"h1": ["a"], "h2": ["a"]}, 3)[0]
    # min_up 2 on 3 replicas: h1 drains one at a time even with max 2
    assert drain_problems([["h1"]], {"h1": ["a", "a"], "h2": ["a"]}, 2, 2) == []


@pytest.mark.parametrize("bad", [0, "x", False])
def test_drain_problems_refuse_an_invalid_min_up(bad: object) -> None:
    assert drain_problems([["h1"]], {"h1": ["a"]}, 1, bad) == [
        f"d3_rollout_min_up is {bad!r}: it must be a whole number, at least 1. Fix the -e value or the inventory."]


def test_exported() -> None:
    assert FilterModule().filters()["d3_rollout_waves"] is rollout_waves


def test_the_batchs_other_servers_count_against_both_limits() -> None:
    # h1 three servers of be_x, h2 two: with h2 in the batch, its two count as out
    view = {"h1": {n: server("h1", n, "be_x") for n in "abc"}, "h2": {n: server("h2", n, "be_x") for n in "de"}}
    h1 = [inst(n) for n in "abc"]
    # 5 servers, max 4, min_up 1: min(4 - 2, 5 - 1 - 2) = 2 at once
    assert rollout_waves(h1, "h1", view, ["h1", "h2"], 1, 4) == [["a", "b"], ["c"]]
    # 10 servers (5 more elsewhere, not restarting), max 3: 3 - 2 = 1 at once, three waves
    view["h3"] = {n: server("h3", n, "be_x") for n in "fghij"}
    assert rollout_waves(h1, "h1", view, ["h1", "h2"], 1, 3) == [["a"], ["b"], ["c"]]
    # defaults (min_up 1, max_unavailable 1): one at a time, however many the host holds
    four = {"h1": {n: server("h1", n, "be_x") for n in "abcd"}}
    assert rollout_waves([inst(n) for n in "abcd"], "h1", four, ["h1"]) == [["a"], ["b"], ["c"], ["d"]]
