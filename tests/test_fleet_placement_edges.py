"""Edges of fleet placement (d3_fleet_place) the main suite leaves open: how a host's own d3_models count (GPUs,
names, ports), port clashes between replicas, the order within a round, unspread shortfalls, hosts/label refusal
wording, planner refusals carried over to the fleet item, options passed to the fit check, and the inventory
errors (every bad host reported, each named as the inventory spells it)."""

from __future__ import annotations

from typing import Any

import pytest
from d3_fleet import FilterModule, d3_fleet_place, item_tp

OK = [{"model": "d3-mini", "replicas": 1}]


@pytest.fixture(scope="module")
def place(catalog_vars: dict[str, Any]) -> Any:
    def _place(models: Any, hosts: Any, options: dict[str, Any] | None = None) -> dict[str, Any]:
        return d3_fleet_place(models, catalog_vars["d3_catalog"], catalog_vars["d3_catalog_common"], hosts, options)

    return _place


@pytest.fixture(scope="module")
def catalog(catalog_vars: dict[str, Any]) -> dict[str, Any]:
    return catalog_vars["d3_catalog"]


def where_is(result: dict[str, Any]) -> dict[str, str]:
    return {p["name"]: p["host"] for p in result["placements"]}


# -- item_tp: the GPUs a host's own d3_models item takes ------------------------------------------------------------


def test_item_tp_follows_gpus_variant_catalog_and_extra_args(catalog: dict[str, Any]) -> None:
    assert item_tp({"model": "d3-mini"}, catalog) == 1
    assert item_tp({"model": "d3"}, catalog) == 2  # the size's own TP (its default variant sets none)
    assert item_tp({"model": "d3", "variant": "w4a16-awq"}, catalog) == 1  # the variant's TP wins
    assert item_tp({"model": "d3", "gpus": [0, 1, 2]}, catalog) == 3  # an explicit GPU list wins
    assert item_tp({"model": "d3-mini", "extra_args": ["--tensor-parallel-size=2"]}, catalog) == 2
    assert item_tp({"model": "d3-mini", "extra_args": ["--tensor-parallel-size", "3", "--max-model-len=4096"]}, catalog) == 3
    assert item_tp({"model": "d3-mini", "extra_args": ["--max-model-len=8192"]}, catalog) == 1  # other flags: no TP
    # what the planner refuses anyway counts no GPU
    assert item_tp({"model": "d3-mini", "extra_args": ["--tensor-parallel-size=two"]}, catalog) == 0
    assert item_tp({"model": "d3-xl"}, catalog) == 0
    assert item_tp("d3-mini", catalog) == 0
    assert item_tp(None, catalog) == 0


def test_item_tp_of_a_default_variant_with_its_own_tp_and_of_a_bare_entry() -> None:
    catalog = {
        "x": {"tensor_parallel_size": 2, "default_variant": "small", "variants": {"small": {"tensor_parallel_size": 1}, "big": {}}},
        "bare": {},
    }
    assert item_tp({"model": "x"}, catalog) == 1  # the default variant's TP
    assert item_tp({"model": "x", "variant": "big"}, catalog) == 2  # a variant without TP: the size's
    assert item_tp({"model": "bare"}, catalog) == 1  # no TP anywhere: 1 GPU


def test_the_host_s_own_variant_and_tp_flag_decide_its_free_gpus(place: Any) -> None:
    # d3 AWQ runs on one GPU: a 2-GPU host keeps one free for a replica; d3 BF16 takes both
    hosts = {"awq": {"gpus": 2, "models": [{"model": "d3", "variant": "w4a16-awq"}]}, "bf16": {"gpus": 2, "models": [{"model": "d3"}]}}
    result = place([{"model": "d3-nano", "replicas": 2}], hosts)
    assert where_is(result) == {"d3-nano": "awq"}
    assert "bf16: 0 of 2 GPU(s) free" in result["errors"][0]
    # an own instance whose extra_args raise its TP takes that many GPUs
    hosts = {"a": {"gpus": 2, "models": [{"model": "d3-mini", "extra_args": ["--tensor-parallel-size=2"]}]}}
    assert "(a: 0 of 2 GPU(s) free)" in place([{"model": "d3-nano", "replicas": 1}], hosts)["errors"][0]


def test_own_items_the_planner_will_refuse_take_no_gpus_and_do_not_break_placement(place: Any) -> None:
    hosts = {"a": {"gpus": 1, "models": ["d3-mini", {"model": "d3-xl", "port": 9100}]}}
    result = place([{"model": "d3-nano", "replicas": 1, "port": 9100}], hosts)
    assert result["errors"] == [] and where_is(result) == {"d3-nano": "a"}


# -- names and ports on a host -------------------------------------------------------------------------------------


def test_a_host_s_own_instance_name_and_port_keep_replicas_away(place: Any) -> None:
    # named own instance: its `name:` counts, not the model's instance name
    hosts = {"a": {"gpus": 4, "models": [{"model": "d3-mini", "name": "router"}]}}
    result = place([{"model": "d3-nano", "name": "router", "replicas": 1}], hosts)
    assert "(a: its own d3_models[0] is named router)" in result["errors"][0]
    assert where_is(place([{"model": "d3-mini", "replicas": 1}], hosts)) == {"d3-mini": "a"}  # d3-mini is free there
    # own port (as digits, as the inventory may give it): a replica that wants that port goes elsewhere
    hosts = {"a": {"gpus": 4, "models": [{"model": "d3-edge", "port": "9100"}]}, "b": {"gpus": 1}}
    result = place([{"model": "d3-mini", "replicas": 2, "port": 9100}], hosts)
    assert where_is(result) == {"d3-mini": "b"}
    assert "(a: port 9100 taken by its own d3_models[0]; b: runs one already (spread))" in result["errors"][0]
    assert where_is(place([{"model": "d3-mini", "replicas": 1, "port": 9101}], {"a": hosts["a"]})) == {"d3-mini": "a"}


def test_two_items_with_one_port_never_share_a_host(place: Any) -> None:
    models = [{"model": "d3-mini", "replicas": 1, "port": 9100}, {"model": "d3-nano", "replicas": 1, "port": 9100}]
    result = place(models, {"a": {"gpus": 4}})
    assert where_is(result) == {"d3-mini": "a"}  # same round and TP: d3-mini comes first by name
    assert result["errors"] == [
        "d3_fleet_models[1] (d3-nano): 1 replica wanted, 0 placed: hosts with 1 free GPU and no d3-nano replica yet "
        "(spread): none left (a: port 9100 taken by replica 1 of d3_fleet_models[0]). Fix: add GPUs or hosts, or lower replicas"
    ]
    result = place(models, {"a": {"gpus": 4}, "b": {"gpus": 4}})
    assert result["errors"] == [] and set(where_is(result).values()) == {"a", "b"}


def test_within_a_round_the_larger_tp_goes_first(place: Any) -> None:
    # d3-edge sorts first by name, but the 27B (TP 2) is placed first and takes the host's two GPUs
    result = place([{"model": "d3-edge", "replicas": 1}, {"model": "d3", "replicas": 1}], {"a": {"gpus": 2}})
    assert where_is(result) == {"d3-27b": "a"}
    assert len(result["errors"]) == 1 and result["errors"][0].startswith("d3_fleet_models[0] (d3-edge): 1 replica wanted, 0 placed")


# -- unspread shortfalls -------------------------------------------------------------------------------------------


def test_an_unspread_shortfall_names_the_replica_that_found_no_host_and_later_replicas_still_go(place: Any) -> None:
    # replica 1 cannot go to a (an own instance has its name); replica 2 still does
    hosts = {"a": {"gpus": 4, "models": [{"model": "d3-edge", "name": "mini-1"}]}}
    result = place([{"model": "d3-mini", "name": "mini", "replicas": 2, "spread": False}], hosts)
    assert where_is(result) == {"mini-2": "a"}
    assert result["errors"] == [
        "d3_fleet_models[0] (mini, model d3-mini): 2 replicas wanted, 1 placed: hosts with 1 free GPU: none left "
        "(a: its own d3_models[0] is named mini-1). Fix: add GPUs or hosts, or lower replicas"
    ]


# -- hosts / label refusals ----------------------------------------------------------------------------------------


def test_a_hosts_shortfall_lists_the_hosts_it_left_out(place: Any) -> None:
    hosts = {"a": {"gpus": 4}, "b": {"gpus": 4}, "c": {"gpus": 4}}
    result = place([{"model": "d3-mini", "replicas": 2, "hosts": ["a"]}], hosts)
    assert where_is(result) == {"d3-mini": "a"}
    assert result["errors"] == [
        "d3_fleet_models[0] (d3-mini): 2 replicas wanted, 1 placed: hosts with 1 free GPU and no d3-mini replica yet "
        "(spread): none left (a: runs one already (spread); left out by its hosts: b, c). "
        "Fix: add GPUs or hosts, lower replicas, widen hosts/label or set spread: false"
    ]
    # hosts and label together: both named as what left hosts out
    hosts = {"a": {"gpus": 4, "labels": ["big"]}, "b": {"gpus": 4, "labels": ["big"]}, "c": {"gpus": 4}}
    result = place([{"model": "d3-mini", "replicas": 2, "hosts": ["a", "c"], "label": "big"}], hosts)
    assert where_is(result) == {"d3-mini": "a"}
    assert "(a: runs one already (spread); left out by its hosts and label: b, c)." in result["errors"][0]
    assert "Fix: add GPUs or hosts labelled 'big', lower replicas, widen hosts/label or set spread: false" in result["errors"][0]


def test_hosts_checked_against_the_fleet_even_when_the_fleet_is_not_a_mapping(place: Any) -> None:
    result = place([{"model": "d3-mini", "replicas": 1, "hosts": ["a"]}], ["a"])
    assert result["errors"] == [
        "fleet hosts: expected a mapping of host name to its GPUs, labels and models, got ['a']",
        "d3_fleet_models[0] (d3-mini): hosts ['a'] not in the fleet (its hosts: none). Fix: name hosts of the group",
    ]
    assert result["placements"] == [] and result["hosts"] == {}


# -- refusals carried over from the planner's own check ----------------------------------------------------------


def test_a_planner_refusal_reads_as_the_fleet_item_s(place: Any) -> None:
    item = {"model": "d3-mini", "replicas": 1, "extra_args": ["--no-enforce-eager"]}
    result = place([item], {"a": {"gpus": 1}})
    assert result["errors"] == [
        "d3_fleet_models[0] (d3-mini): dropping --enforce-eager makes vLLM capture CUDA graphs, which OOMs on a 24 GB L4 "
        "(fixed 18.4 GB vision-encoder profiling allocation). Fix: remove --no-enforce-eager, or set d3_allow_cuda_graphs: "
        "true to acknowledge the risk",
        "d3_fleet_models[0] (d3-mini): d3-mini at TP 1 runs out of memory in vLLM's profile run ('torch.OutOfMemoryError: "
        "CUDA out of memory'): weights 3815 + profile-run peak 2576 (32768 tokens x 82432 B) + non-torch 512 + encoder probe "
        "18842 (CUDA graph capture without --enforce-eager) = 25745 MiB per GPU, more than the GPU holds beside the CUDA "
        "context (CUDA out of memory during CUDA graph capture. Tried to allocate 18.40 GiB (fixed vision-encoder profiling "
        "allocation). GPU 0 has a total capacity of 22.03 GiB of which 15.29 GiB is free. Use --enforce-eager.). Fix: pick a "
        "smaller model or variant for d3_fleet_models[0]; or keep --enforce-eager (remove "
        "--no-enforce-eager)",
    ]
    # only the planner's "d3_models[0] (name): " is cut: the rest of the message, even a "): " in a value, stays
    result = place([{"model": "d3-mini", "replicas": 1, "extra_args": ["oops): here"]}], {"a": {"gpus": 1}})
    assert len(result["errors"]) == 1
    assert result["errors"][0].startswith(
        "d3_fleet_models[0] (d3-mini): d3_fleet_models[0].extra_args: 'oops): here' is not a flag (extra_args items are"
    )
    assert "d3-fleet-check" not in result["errors"][0]


def test_the_fit_check_uses_the_planner_options_that_decide_fit(place: Any) -> None:
    item = {"model": "d3-mini", "replicas": 1, "extra_args": ["--no-enforce-eager"]}
    # d3_allow_cuda_graphs reaches the check (no acknowledgement refusal); the CUDA-graph memory still does not fit an L4
    result = place([item], {"a": {"gpus": 1}}, {"allow_cuda_graphs": True, "port_base": 9000, "listen_address": "0.0.0.0"})
    assert [e.split(": ", 1)[1][:40] for e in result["errors"]] == ["d3-mini at TP 1 runs out of memory in vL"]
    # d3_vram_overhead_mib reaches it too: a margin larger than the share refuses what fits by default
    assert place(OK, {"a": {"gpus": 1}})["errors"] == []
    assert "non-torch 20000" in place(OK, {"a": {"gpus": 1}}, {"vram_overhead_mib": 20000})["errors"][0]
    # host matters (port_base, listen_address) are left to the per-host planner: an odd value does not refuse here
    assert place(OK, {"a": {"gpus": 1}}, {"listen_address": "not an address"})["errors"] == []


def test_a_27b_on_one_gpu_hosts_is_a_shortfall_not_a_fit_error(place: Any) -> None:
    result = place([{"model": "d3", "replicas": 1}], {"a": {"gpus": 1}})
    assert result["errors"] == [
        "d3_fleet_models[0] (d3-27b, model d3): 1 replica wanted, 0 placed: hosts with 2 free GPUs and no d3-27b replica "
        "yet (spread): none left (a: 1 of 1 GPU(s) free). Fix: add GPUs or hosts, or lower replicas"
    ]


# -- item validation ---------------------------------------------------------------------------------------------


def test_every_problem_of_an_item_is_reported_at_once(place: Any) -> None:
    result = place([{"model": "d3-mini", "replicas": 0, "env": {"HF_TOKEN": "x"}}], {"a": {"gpus": 1}})
    assert len(result["errors"]) == 2
    assert result["errors"][0].startswith("d3_fleet_models[0] (d3-mini): replicas 0 is not a positive whole number")
    assert result["errors"][1].startswith("d3_fleet_models[0] (d3-mini): env HF_TOKEN would put a secret in the unit file")


def test_item_messages_show_the_value_and_the_fix(place: Any) -> None:
    hosts = {"a": {"gpus": 2}}
    err = place(["d3-mini"], hosts)["errors"]
    assert err == ["d3_fleet_models[0]: expected a mapping with `model:` and `replicas:`, got 'd3-mini'. "
                   "Fix: write `- {model: d3-flash, replicas: 2}`"]  # fmt: skip
    err = place([{"model": "d3-mini", "replicas": 1, "cpus": 2}], hosts)["errors"]
    assert len(err) == 1 and err[0].startswith("d3_fleet_models[0]: unknown key(s) ['cpus']. Fix: use only ['env', 'extra_args',")
    err = place([{"model": "d3-mini", "replicas": 1, "name": "Mini"}], hosts)["errors"]
    assert err[0].endswith("Fix: use lowercase letters, digits and '-' (at most 63, starting with a letter or digit)")
    err = place([{"model": "d3-mini", "replicas": 2, "spread": False, "port": 9000}], hosts)["errors"]
    assert err[0].endswith("port with spread: false: two replicas on one host cannot share a port. "
                           "Fix: remove `port:` or set spread: true")  # fmt: skip
    for label in ("", 5):
        err = place([{"model": "d3-mini", "replicas": 1, "label": label}], hosts)["errors"]
        assert len(err) == 1 and f"label {label!r} is not a one-line string" in err[0]
    err = place({"model": "d3-mini"}, hosts)["errors"]
    assert err == ["d3_fleet_models: expected a list, got dict. Fix: write a YAML list"]


def test_a_long_name_is_refused_only_where_replicas_add_a_suffix(place: Any) -> None:
    name = "m" * 62  # a valid instance name; "-2" would make it 64 characters
    result = place([{"model": "d3-mini", "name": name, "replicas": 2}], {"a": {"gpus": 1}, "b": {"gpus": 1}})
    assert result["errors"] == [] and {p["name"] for p in result["placements"]} == {name}
    result = place([{"model": "d3-mini", "name": name, "replicas": 2, "spread": False}], {"a": {"gpus": 2}})
    assert result["errors"] == [
        f"d3_fleet_models[0] ({name}, model d3-mini): name {name!r} is too long for replica names {name}-1..{name}-2. "
        "Fix: give a shorter `name:`"
    ]


def test_a_bad_or_duplicate_item_does_not_stop_the_items_after_it(place: Any) -> None:
    models = [
        {"model": "d3-xl", "replicas": 1},
        {"model": "d3-mini", "replicas": 1},
        {"model": "d3-nano", "replicas": 1, "name": "d3-mini"},
        {"model": "d3-edge", "replicas": 1},
    ]
    result = place(models, {"a": {"gpus": 4}})
    assert where_is(result) == {"d3-mini": "a", "d3-edge": "a"}
    assert [e.split(":", 1)[0] for e in result["errors"]] == ["d3_fleet_models[0]", "d3_fleet_models[2] (d3-mini, model d3-nano)"]


def test_replica_names_clash_only_on_the_numbers_actually_used(place: Any) -> None:
    hosts = {"a": {"gpus": 8}}
    unspread = {"model": "d3-mini", "name": "mini", "replicas": 2, "spread": False}
    for free in ("mini-0", "mini-3"):  # no replica 0, and 2 replicas use no "-3"
        result = place([unspread, {"model": "d3-nano", "replicas": 1, "name": free}], hosts)
        assert result["errors"] == [] and where_is(result) == {"mini-1": "a", "mini-2": "a", free: "a"}
    models = [unspread, {"model": "d3-nano", "replicas": 1, "name": "mini-1"}, {"model": "d3-edge", "replicas": 1}]
    result = place(models, hosts)
    assert result["errors"] == [
        "d3_fleet_models[1] (mini-1, model d3-nano): instance name(s) ['mini-1'] also given by d3_fleet_models[0]. "
        "Fix: give d3_fleet_models[1] a distinct `name:`"
    ]
    assert where_is(result) == {"mini-1": "a", "mini-2": "a", "d3-edge": "a"}  # the item after the clash is placed
    # a later clash is still found after an earlier one
    models = [
        *models,
        {"model": "d3-lite", "name": "lite", "replicas": 2, "spread": False},
        {"model": "d3-edge", "replicas": 1, "name": "lite-2"},
    ]
    result = place(models, hosts)
    assert [e.split(":", 1)[0] for e in result["errors"]] == [
        "d3_fleet_models[1] (mini-1, model d3-nano)",
        "d3_fleet_models[4] (lite-2, model d3-edge)",
    ]
    assert "instance name(s) ['lite-2'] also given by d3_fleet_models[3]" in result["errors"][1]


# -- inventory (hosts) errors ----------------------------------------------------------------------------------------


def test_every_bad_host_is_reported_named_as_the_inventory_spells_it(place: Any) -> None:
    hosts: dict[Any, Any] = {
        "zz-good": {"gpus": 1},
        5: {"gpus": 1},
        "": {"gpus": 1},
        "h0-\x1bctl": {"gpus": 1},
        "h1-spec": "4 gpus",
        "h2-keys": {"gpus": 1, "cpus": 8},
        "h3-no-gpus": {"labels": []},
        "h4-gpus": {"gpus": "four"},
        "h5-mem": {"gpus": 1, "gpu_memory_mib": 0},
        "h6-label": {"gpus": 1, "labels": [""]},
        "h7-label": {"gpus": 1, "labels": ["big\x1b"]},
        "h8-models": {"gpus": 1, "models": "d3-mini"},
    }
    result = place(OK, hosts)
    errors = result["errors"]
    expected = [
        ("host '': ", "a host name must be one line of text"),
        ("host 5: ", "a host name must be one line of text"),
        ("host 'h0-\\x1bctl': ", "a host name must be one line of text"),
        ("host h1-spec: ", "expected a mapping with gpus, gpu_memory_mib, labels, models, got '4 gpus'"),
        ("host h2-keys: ", "unknown key(s) ['cpus']"),
        ("host h3-no-gpus: ", "d3_gpu_count is not set"),
        ("host h4-gpus: ", "d3_gpu_count = 'four' is not a whole number"),
        ("host h5-mem: ", "d3_gpu_memory_mib = 0 is not a positive whole number"),
        ("host h6-label: ", "d3_host_labels = [''] is not a list of one-line strings"),
        ("host h7-label: ", "d3_host_labels = ['big\\x1b'] is not a list of one-line strings"),
        ("host h8-models: ", "d3_models = 'd3-mini' is not a list"),
    ]
    assert len(errors) == len(expected), errors
    for error, (start, phrase) in zip(errors, expected, strict=True):
        assert error.startswith(start) and phrase in error, (error, start, phrase)
    assert all("\x1b" not in e for e in errors)  # a control character is shown escaped, never written raw
    assert result["hosts"] == {"zz-good": []}  # the good host is read; nothing is placed while hosts are wrong
    assert result["placements"] == []


def test_a_memory_size_given_as_digits_counts(place: Any) -> None:
    result = place([{"model": "d3-flash", "replicas": 2}], {"a": {"gpus": 1, "gpu_memory_mib": "8000"}, "b": {"gpus": 1}})
    assert where_is(result) == {"d3-flash": "b"}
    assert "a: its 8000 MiB GPUs do not hold it" in result["errors"][0]


def test_the_filter_is_registered_under_its_name() -> None:
    assert FilterModule().filters() == {"d3_fleet_place": d3_fleet_place}


def test_a_variant_that_is_not_a_string_is_refused_for_a_fleet_item_and_a_host_s_own_item(place: Any, catalog: dict[str, Any]) -> None:
    """`variant: [fp8]` in YAML is a list: it takes no GPU and the planner's refusal names it (it raised TypeError)."""
    assert item_tp({"model": "d3", "variant": ["fp8"]}, catalog) == 0
    result = place([{"model": "d3", "replicas": 1, "variant": ["fp8"]}], {"a": {"gpus": 2, "models": []}})
    assert result["placements"] == [] and any("has no variant ['fp8']" in e for e in result["errors"]), result["errors"]
    own = place(OK, {"a": {"gpus": 2, "models": [{"model": "d3", "variant": ["fp8"]}]}})
    assert where_is(own) == {"d3-mini": "a"}  # the own item takes no GPU here; the host's own plan refuses it
