"""Fleet-level replicas (d3_fleet_models, filter d3_fleet_place): spread, constraints, determinism, minimal
movement over random fleets (fixed seed), refusals that name the model and the shortfall, input validation, and
one run of playbooks/plan.yml that shows the placement and a refusal without contacting a host."""

from __future__ import annotations

import hashlib
import random
import re
from pathlib import Path
from typing import Any

import pytest
from d3_fleet import d3_fleet_place
from test_plan_playbook import run_plan

SIZES = ["d3-edge", "d3-lite", "d3-nano", "d3-mini", "d3-flash", "d3"]


@pytest.fixture(scope="module")
def place(request: pytest.FixtureRequest) -> Any:
    import yaml

    root = Path(__file__).resolve().parents[1]
    catalog_vars = yaml.safe_load((root / "roles/d3/vars/main.yml").read_text())

    def _place(models: Any, hosts: Any, options: dict[str, Any] | None = None) -> dict[str, Any]:
        return d3_fleet_place(models, catalog_vars["d3_catalog"], catalog_vars["d3_catalog_common"], hosts, options)

    return _place


def pairs(result: dict[str, Any]) -> set[tuple[str, str]]:
    """What runs where: (instance name, host) for every placed replica (a spread item's replicas share its name)."""
    return {(p["name"], p["host"]) for p in result["placements"]}


def fleet(n: int, gpus: int = 4, **extra: Any) -> dict[str, dict[str, Any]]:
    return {f"l4-{i:02d}": {"gpus": gpus, **extra} for i in range(n)}


# -- spread and constraints ------------------------------------------------------------------------------------


def test_spread_puts_at_most_one_replica_of_an_item_on_a_host(place: Any) -> None:
    rng = random.Random(15)
    for _ in range(200):
        hosts = fleet(rng.randint(2, 8), gpus=8)
        models = [{"model": m, "replicas": rng.randint(1, len(hosts))} for m in rng.sample(SIZES, 3)]
        result = place(models, hosts)
        assert result["errors"] == []
        for m in models:
            on = [p["host"] for p in result["placements"] if p["model"] == m["model"]]
            assert len(on) == m["replicas"] and len(set(on)) == len(on), (m, on)


def test_spread_refuses_more_replicas_than_hosts_and_unspread_shares_a_host(place: Any) -> None:
    result = place([{"model": "d3-mini", "replicas": 2}], {"only": {"gpus": 4}})
    assert result["errors"] == [
        "d3_fleet_models[0] (d3-mini): 2 replicas wanted, 1 placed: hosts with 1 free GPU and no d3-mini replica yet "
        "(spread): none left (only: runs one already (spread)). Fix: add GPUs or hosts, lower replicas or set spread: false"
    ]
    result = place([{"model": "d3-mini", "replicas": 2, "spread": False}], {"only": {"gpus": 4}})
    assert result["errors"] == []
    # two instances (units) d3-mini-1, d3-mini-2, one model for clients and the router: both serve d3-mini
    assert result["hosts"] == {"only": [{"model": "d3-mini", "name": "d3-mini-1", "served_name": "d3-mini"},
                                        {"model": "d3-mini", "name": "d3-mini-2", "served_name": "d3-mini"}]}  # fmt: skip


def test_hosts_and_label_constraints(place: Any) -> None:
    hosts = {**fleet(6), "big-1": {"gpus": 4, "labels": ["big"]}, "big-2": {"gpus": 4, "labels": ["big", "eu"]}}
    result = place(
        [
            {"model": "d3-flash", "replicas": 2, "hosts": ["l4-01", "l4-04"]},
            {"model": "d3", "replicas": 2, "label": "big"},
            {"model": "d3-nano", "replicas": 1, "label": "eu"},
        ],
        hosts,
    )
    assert result["errors"] == []
    where = {(p["model"], p["host"]) for p in result["placements"]}
    assert {h for m, h in where if m == "d3-flash"} == {"l4-01", "l4-04"}
    assert {h for m, h in where if m == "d3"} == {"big-1", "big-2"}
    assert {h for m, h in where if m == "d3-nano"} == {"big-2"}
    # a label nobody carries: refused, and the message says which hosts the label left out
    result = place([{"model": "d3-nano", "replicas": 1, "label": "gpu-xl"}], fleet(2))
    assert result["errors"] == [
        "d3_fleet_models[0] (d3-nano): 1 replica wanted, 0 placed: hosts with 1 free GPU and no d3-nano replica yet "
        "(spread): none left (no host meets its constraints; left out by its label: l4-00, l4-01). Fix: add GPUs or "
        "hosts labelled 'gpu-xl', lower replicas or widen hosts/label"
    ]


# -- determinism -----------------------------------------------------------------------------------------------


def test_same_input_same_output_whatever_the_order_of_the_hosts(place: Any) -> None:
    rng = random.Random(1515)
    for _ in range(50):
        hosts = {f"h{rng.randrange(10**6)}": {"gpus": rng.randint(1, 4)} for _ in range(rng.randint(2, 9))}
        models = [{"model": m, "replicas": rng.randint(1, 3), "spread": rng.random() < 0.7} for m in rng.sample(SIZES, 3)]
        first = place(models, hosts)
        assert place(models, hosts) == first
        names = list(hosts)
        rng.shuffle(names)
        assert place(models, {n: hosts[n] for n in names}) == first


def test_the_ranking_is_sha256_of_name_replica_and_host(place: Any) -> None:
    """sha256 (not Python's hash(), salted per process): with GPUs to spare, a spread item takes its best-ranked hosts
    by sha256("name/host"), an unspread replica r its best host by sha256("name/r/host")."""
    hosts = fleet(5)

    def rank(key: str) -> list[str]:
        return sorted(hosts, key=lambda h: -int(hashlib.sha256(f"{key}/{h}".encode()).hexdigest(), 16))

    result = place([{"model": "d3-flash", "replicas": 2}, {"model": "d3-mini", "replicas": 3, "spread": False}], hosts)
    wanted = {("d3-flash", h) for h in rank("d3-flash")[:2]} | {(f"d3-mini-{r}", rank(f"d3-mini/{r}")[0]) for r in (1, 2, 3)}
    assert pairs(result) == wanted


# -- minimal movement ------------------------------------------------------------------------------------------


def random_fleet(rng: random.Random, ample: bool) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    models = [
        {"model": m, "replicas": rng.randint(1, 3), "spread": rng.random() < 0.6, **({"name": f"{m}-x{i}"} if i else {})}
        for i, m in enumerate(rng.sample(SIZES + SIZES, rng.randint(1, 5)))
    ]
    need = sum(2 * (m["replicas"] + 1) for m in models)  # every replica (and one more) fits on any single host
    hosts = {f"node-{rng.randrange(10**6):06d}": {"gpus": need if ample else rng.randint(1, 8)} for _ in range(rng.randint(5, 9))}
    return models, hosts


def instances_of(item: dict[str, Any], result: dict[str, Any]) -> set[tuple[str, str]]:
    name = item.get("name", "d3-27b" if item["model"] == "d3" else item["model"])
    return {(n, h) for n, h in pairs(result) if n == name or re.fullmatch(rf"{name}-[0-9]+", n)}


def test_adding_a_host_moves_replicas_only_onto_it(place: Any) -> None:
    """With GPUs to spare: nothing moves between the existing hosts; what moves goes to the new host (its share)."""
    rng = random.Random(42)
    moved_total = 0
    for _ in range(300):
        models, hosts = random_fleet(rng, ample=True)
        before = place(models, hosts)
        assert before["errors"] == []
        new = "node-new"
        after = place(models, {**hosts, new: {"gpus": next(iter(hosts.values()))["gpus"]}})
        assert after["errors"] == []
        gone, came = pairs(before) - pairs(after), pairs(after) - pairs(before)
        assert {h for _, h in came} <= {new}, (models, sorted(gone), sorted(came))
        assert sorted(n for n, _ in gone) == sorted(n for n, _ in came)
        moved_total += len(came)
    assert moved_total > 0  # the new host does take its share


def test_adding_a_host_with_scarce_gpus_never_moves_a_replica_between_old_hosts_without_a_cascade(place: Any) -> None:
    """Scarce GPUs: a replica that is not pushed by a move onto the new host keeps its host (checked per item: an
    item none of whose replicas went to the new host, and which lost no GPUs to one, keeps its placement)."""
    rng = random.Random(7)
    checked = 0
    for _ in range(300):
        models, hosts = random_fleet(rng, ample=False)
        before = place(models, hosts)
        after = place(models, {**hosts, "node-new": {"gpus": 2}})
        if any(p["host"] == "node-new" for p in after["placements"]):
            continue  # something moved onto the new host: later replicas may cascade (documented)
        assert pairs(after) == pairs(before)
        checked += 1
    assert checked > 20


def test_adding_a_replica_moves_no_existing_replica(place: Any) -> None:
    rng = random.Random(4242)
    for _ in range(300):
        models, hosts = random_fleet(rng, ample=True)
        before = place(models, hosts)
        grown = [dict(m) for m in models]
        pick = rng.randrange(len(grown))
        grown[pick]["replicas"] += 1
        after = place(grown, hosts)
        assert after["errors"] == []
        assert pairs(before) <= pairs(after), (grown[pick], sorted(pairs(before) - pairs(after)))
        assert len(after["placements"]) - len(before["placements"]) == grown[pick]["replicas"] - models[pick]["replicas"]


def test_adding_a_replica_with_scarce_gpus_keeps_the_item_s_own_replicas(place: Any) -> None:
    rng = random.Random(99)
    for _ in range(300):
        models, hosts = random_fleet(rng, ample=False)
        pick = rng.randrange(len(models))
        grown = [dict(m, replicas=m["replicas"] + (i == pick)) for i, m in enumerate(models)]
        before, after = place(models, hosts), place(grown, hosts)
        assert instances_of(models[pick], before) <= instances_of(grown[pick], after)
        assert len(instances_of(grown[pick], after)) >= len(instances_of(models[pick], before))


def test_a_replica_whose_host_lost_capacity_moves_and_nothing_else(place: Any) -> None:
    rng = random.Random(5)
    for _ in range(100):
        models, hosts = random_fleet(rng, ample=True)
        before = place(models, hosts)
        victim = before["placements"][0]["host"]
        # the host's own d3_models now take all its GPUs
        shrunk = {**hosts, victim: {"gpus": 2, "models": [{"model": "d3-mini"}, {"model": "d3-nano"}]}}
        after = place(models, shrunk)
        assert after["errors"] == []
        assert {h for _, h in pairs(before) - pairs(after)} == {victim}
        assert all(h != victim for _, h in pairs(after))


# -- capacity and refusals -------------------------------------------------------------------------------------


def test_a_27b_replica_takes_two_gpus(place: Any) -> None:
    result = place([{"model": "d3", "replicas": 2}], {"a": {"gpus": 2}, "b": {"gpus": 3}, "c": {"gpus": 1}})
    assert result["errors"] == []
    assert sorted((p["host"], p["gpus"]) for p in result["placements"]) == [("a", 2), ("b", 2)]
    result = place([{"model": "d3", "replicas": 3}], {"a": {"gpus": 2}, "b": {"gpus": 3}, "c": {"gpus": 1}})
    assert "hosts with 2 free GPUs and no d3-27b replica yet (spread): none left (a: runs one already (spread); " in result["errors"][0]
    assert "c: 1 of 1 GPU(s) free" in result["errors"][0]
    # the AWQ variant runs at TP 1: one GPU is enough
    result = place([{"model": "d3", "variant": "w4a16-awq", "replicas": 1, "hosts": ["c"]}], {"c": {"gpus": 1}})
    assert result["errors"] == [] and result["placements"][0]["gpus"] == 1


def test_the_host_s_own_models_take_their_gpus(place: Any) -> None:
    hosts = {
        "a": {"gpus": 2, "models": [{"model": "d3"}]},  # full: the 27B takes both GPUs
        "b": {"gpus": 2, "models": [{"model": "d3-mini", "gpus": [1]}]},  # one GPU left
        "c": {"gpus": 1, "models": [{"model": "d3-flash", "extra_args": ["--tensor-parallel-size=1"]}]},  # full
    }
    result = place([{"model": "d3-nano", "replicas": 1}], hosts)
    assert result["errors"] == [] and [p["host"] for p in result["placements"]] == ["b"]
    result = place([{"model": "d3-nano", "replicas": 1}, {"model": "d3-flash", "replicas": 1}], hosts)
    assert result["errors"][0].startswith("d3_fleet_models[0] (d3-nano): 1 replica wanted, 0 placed: hosts with 1 free GPU")
    assert [(p["model"], p["host"]) for p in result["placements"]] == [("d3-flash", "b")]  # d3-flash came first (name)
    result = place([{"model": "d3-edge", "replicas": 2}], hosts)
    assert result["errors"] == [
        "d3_fleet_models[0] (d3-edge): 2 replicas wanted, 1 placed: hosts with 1 free GPU and no d3-edge replica yet "
        "(spread): none left (a: 0 of 2 GPU(s) free; b: runs one already (spread); c: 0 of 1 GPU(s) free). "
        "Fix: add GPUs or hosts, lower replicas or set spread: false"
    ]
    # a host whose own instance already has the replica's name is not used for it
    result = place([{"model": "d3-flash", "replicas": 1}], {"c": {"gpus": 4, "models": [{"model": "d3-flash"}]}})
    assert "c: its own d3_models[0] is named d3-flash" in result["errors"][0]


def test_vram_of_each_gpu_memory_size_is_checked(place: Any) -> None:
    hosts = {"small": {"gpus": 4, "gpu_memory_mib": 8000}, "l4": {"gpus": 2}}
    result = place([{"model": "d3-flash", "replicas": 1}], hosts)
    assert result["errors"] == [] and result["placements"][0]["host"] == "l4"
    result = place([{"model": "d3-flash", "replicas": 2}], hosts)
    assert "small: its 8000 MiB GPUs do not hold it" in result["errors"][0]


def test_placed_items_pass_the_instance_keys_through(place: Any) -> None:
    item = {
        "model": "d3-mini",
        "replicas": 1,
        "name": "router-mini",
        "port": 9100,
        "extra_args": ["--max-model-len=16384"],
        "env": {"VLLM_LOGGING_LEVEL": "INFO"},
    }
    result = place([item], {"a": {"gpus": 1}})
    assert result["hosts"]["a"] == [
        {
            "model": "d3-mini",
            "name": "router-mini",
            "port": 9100,
            "extra_args": ["--max-model-len=16384"],
            "env": {"VLLM_LOGGING_LEVEL": "INFO"},
        }
    ]
    assert result["table"] == [
        "MODEL    INSTANCE     REPLICA  HOST  GPUS",
        "d3-mini  router-mini  1        a     1",
    ]


# -- input validation --------------------------------------------------------------------------------------------

INVALID = {
    "unknown-model": ({"model": "d3-xl", "replicas": 1}, "unknown model 'd3-xl'. Fix: set d3_fleet_models[0].model to one of: d3, d3-edge"),
    "replicas-zero": ({"model": "d3-mini", "replicas": 0}, "replicas 0 is not a positive whole number"),
    "replicas-missing": ({"model": "d3-mini"}, "replicas None is not a positive whole number"),
    "replicas-bool": ({"model": "d3-mini", "replicas": True}, "replicas True is not a positive whole number"),
    "replicas-text": ({"model": "d3-mini", "replicas": "two"}, "replicas 'two' is not a positive whole number"),
    "bad-name": ({"model": "d3-mini", "replicas": 1, "name": "Mini_1"}, "name 'Mini_1' is not a valid instance name"),
    "name-newline": ({"model": "d3-mini", "replicas": 1, "name": "mini\nExecStartPre=/bin/sh"}, "is not a valid instance name"),
    "unknown-host": (
        {"model": "d3-mini", "replicas": 1, "hosts": ["l4-a", "l4-z"]},
        "hosts ['l4-z'] not in the fleet (its hosts: l4-a, l4-b)",
    ),
    "empty-hosts": ({"model": "d3-mini", "replicas": 1, "hosts": []}, "hosts [] is not a non-empty list of host names"),
    "label-control": ({"model": "d3-mini", "replicas": 1, "label": "big\x1b"}, "label 'big\\x1b' is not a one-line string"),
    "spread-text": ({"model": "d3-mini", "replicas": 1, "spread": "no"}, "spread 'no' is not true or false"),
    "port-unspread": ({"model": "d3-mini", "replicas": 2, "spread": False, "port": 9000}, "two replicas on one host cannot share a port"),
    "gpus-key": ({"model": "d3-mini", "replicas": 1, "gpus": [0]}, "unknown key(s) ['gpus'] (GPU indices are a host's matter"),
    "secret-env": ({"model": "d3-mini", "replicas": 1, "env": {"HF_TOKEN": "x"}}, "env HF_TOKEN would put a secret in the unit file"),
    "owned-flag": ({"model": "d3-mini", "replicas": 1, "extra_args": ["--port=1"]}, "extra_args sets --port, which the planner owns"),
    "port-range": ({"model": "d3-mini", "replicas": 1, "port": 80}, "port 80 is outside 1024-65535"),
    "not-a-mapping": ("d3-mini", "expected a mapping with `model:` and `replicas:`"),
}


@pytest.mark.parametrize("case", sorted(INVALID))
def test_invalid_items_are_refused_with_the_item_and_the_fix(place: Any, case: str) -> None:
    item, message = INVALID[case]
    result = place([item], {"l4-a": {"gpus": 4}, "l4-b": {"gpus": 4}})
    assert len(result["errors"]) == 1 and result["errors"][0].startswith("d3_fleet_models[0]"), result["errors"]
    assert message in result["errors"][0], result["errors"]
    assert "Fix" in result["errors"][0]
    assert result["placements"] == []


def test_fleet_level_input_errors(place: Any) -> None:
    ok = [{"model": "d3-mini", "replicas": 1}]
    assert place(ok, {"a": {"labels": []}})["errors"] == [
        "host a: d3_gpu_count is not set: fleet placement needs each host's declared GPU count so a --limit run "
        "places the same way. Fix: set d3_gpu_count for the host in the inventory"
    ]
    assert "d3_gpu_count = 'four' is not a whole number" in place(ok, {"a": {"gpus": "four"}})["errors"][0]
    assert place(ok, {"a": {"gpus": "2"}})["errors"] == []  # an inventory string of digits is a count
    assert "d3_host_labels = 'big' is not a list" in place(ok, {"a": {"gpus": 2, "labels": "big"}})["errors"][0]
    assert "unknown key(s) ['cpus']" in place(ok, {"a": {"gpus": 2, "cpus": 8}})["errors"][0]
    assert "d3_fleet_models: expected a list" in place({"model": "d3-mini"}, {"a": {"gpus": 2}})["errors"][0]
    twice = place([{"model": "d3-mini", "replicas": 1}, {"model": "d3-nano", "replicas": 1, "name": "d3-mini"}], {"a": {"gpus": 2}})
    assert twice["errors"] == [
        "d3_fleet_models[1] (d3-mini, model d3-nano): name 'd3-mini' is also d3_fleet_models[0]'s. "
        "Fix: give d3_fleet_models[1] a distinct `name:`"
    ]
    clash = place([{"model": "d3-mini", "replicas": 2, "spread": False}, {"model": "d3-nano", "replicas": 1, "name": "d3-mini-2"}],
                  {"a": {"gpus": 4}})  # fmt: skip
    assert "instance name(s) ['d3-mini-2'] also given by d3_fleet_models[0]" in clash["errors"][0]
    assert place(None, {"a": {"gpus": 1}}) == {
        "hosts": {"a": []},
        "placements": [],
        "table": ["MODEL  INSTANCE  REPLICA  HOST  GPUS"],
        "errors": [],
    }


# -- through playbooks/plan.yml ------------------------------------------------------------------------------------


@pytest.mark.playbook
def test_plan_playbook_shows_the_fleet_placement_and_refuses_a_shortfall(tmp_path: Path) -> None:
    fleet_models = [{"model": "d3-flash", "replicas": 2, "port": 8100}, {"model": "d3", "replicas": 1, "label": "big"}]
    hosts = {
        "l4-a": {"d3_gpu_count": 2, "d3_fleet_models": fleet_models},
        "l4-b": {"d3_gpu_count": 4, "d3_host_labels": ["big"], "d3_models": [{"model": "d3-mini"}], "d3_fleet_models": fleet_models},
    }
    out = tmp_path / "plan.json"
    proc = run_plan(tmp_path, {}, "-e", f"d3_plan_output={out}", hosts=hosts)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = proc.stdout
    assert "MODEL     INSTANCE  REPLICA  HOST  GPUS" in text
    assert "d3        d3-27b    1        l4-b  2" in text
    assert "d3-flash  d3-flash  1        l4-b  1" in text and "d3-flash  d3-flash  2        l4-a  1" in text
    import json

    plan = json.loads(out.read_text())
    assert [(i["name"], i["port"]) for i in plan["l4-a"]["instances"]] == [("d3-flash", 8100)]
    # the host's own d3_models first (its port unchanged), then the replicas placed on it
    assert [(i["name"], i["gpus"], i["port"]) for i in plan["l4-b"]["instances"]] == [
        ("d3-mini", [3], 8000),
        ("d3-27b", [0, 1], 8001),
        ("d3-flash", [2], 8100),
    ]
    # a --limit run places the same way (GPU counts come from the inventory)
    limited = run_plan(tmp_path, {}, "-l", "l4-a", hosts=hosts)
    assert limited.returncode == 0 and "d3-flash  d3-flash  2        l4-a  1" in limited.stdout
    # one replica more than hosts: refused, naming the model and the shortfall
    more = [{"model": "d3-flash", "replicas": 3}]
    proc = run_plan(tmp_path, {}, hosts={h: {**v, "d3_fleet_models": more} for h, v in hosts.items()})
    text = " ".join(proc.stdout.split())
    assert proc.returncode != 0
    assert "d3_fleet_models[0] (d3-flash): 3 replicas wanted, 2 placed: hosts with 1 free GPU and no d3-flash replica yet" in text
    assert "l4-a: runs one already (spread); l4-b: runs one already (spread)" in text
    # a host of the group without d3_gpu_count: refused, naming the variable
    proc = run_plan(tmp_path, {}, hosts={**hosts, "l4-c": {"d3_fleet_models": fleet_models}})
    assert proc.returncode != 0
    assert "host l4-c: d3_gpu_count is not set: fleet placement needs each host's declared GPU count" in " ".join(proc.stdout.split())
