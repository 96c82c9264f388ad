"""Planner rules that come from the real stack (issue 8): the share cap on a shared GPU, one-after-another
starts on a shared GPU, the listen address, CUDA forward compatibility."""

from __future__ import annotations

from typing import Any

import pytest
from d3_planner import d3_plan
from l4 import l4_gpus


def plan(catalog_vars: dict[str, Any], models: list[Any], gpus: int = 2, **opts: Any) -> dict[str, Any]:
    opts.setdefault("api_key_set", True)  # a key is set: the listen-address tests below are not about the key rule
    return d3_plan(models, catalog_vars["d3_catalog"], catalog_vars["d3_catalog_common"], l4_gpus(gpus), "l4-a", opts)


def lite(name: str, util: str, gpus: list[int] | None = None) -> dict[str, Any]:
    item: dict[str, Any] = {"model": "d3-lite", "name": name, "extra_args": [f"--gpu-memory-utilization={util}"]}
    if gpus is not None:
        item["gpus"] = gpus
    return item


def test_two_shares_within_the_cap_share_a_gpu_and_start_in_order(catalog_vars: dict[str, Any]) -> None:
    result = plan(catalog_vars, [lite("a", "0.45", [0]), lite("b", "0.45", [0]), lite("c", "0.45", [1])])
    assert result["errors"] == []
    a, b, c = result["instances"]
    assert (a["start_after"], b["start_after"], c["start_after"]) == ([], ["a"], [])
    assert (a["wait_ready"], b["wait_ready"], c["wait_ready"]) == (True, False, False)
    assert a["health_url"] == f"http://127.0.0.1:{a['port']}/health"


def test_shares_above_the_cap_on_one_gpu_are_refused(catalog_vars: dict[str, Any]) -> None:
    result = plan(catalog_vars, [lite("a", "0.5", [0]), lite("b", "0.5", [0])])
    assert result["instances"] == []
    (error,) = result["errors"]
    assert error == (
        "host l4-a: d3_models[1] (b): VRAM over budget on GPU 0: its share of 11280 MiB (--gpu-memory-utilization 0.5 x "
        "22560 MiB) on top of a 11280 MiB (0.5) makes 0.5 + 0.5 = 1 of the GPU (22560 MiB), over the 0.92 (20755.2 MiB) "
        "that d3_gpu_share_cap allows on a shared GPU (vLLM needs its share free at start, and the driver keeps some). Fix: set "
        "--gpu-memory-utilization=0.42 in d3_models[1].extra_args (what is left), or move d3_models[1] to another GPU "
        "(its `gpus:`) or host"
    )


def test_the_cap_is_a_variable_and_a_gpu_of_its_own_takes_any_share(catalog_vars: dict[str, Any]) -> None:
    # above the cap, vLLM itself refuses two halves: the first holds 11,280 MiB and a CUDA context, the second's own
    # context takes 512 more, 10,256 MiB are free for its 11,280 (Worker.init_device)
    (error,) = plan(catalog_vars, [lite("a", "0.5", [0]), lite("b", "0.5", [0])], gpu_share_cap=1.0)["errors"]
    assert ("its share does not fit on GPU 0 beside a 11280 MiB (0.5): 11280 MiB of their shares + its 11280 MiB + "
            "1024 MiB of CUDA contexts (2 x 512) = 23584 MiB, more than the 22560 MiB torch sees (this is the planner's "
            "refusal, not vLLM's startup check") in error
    assert plan(catalog_vars, [lite("a", "0.5", [0]), lite("b", "0.45", [0])], gpu_share_cap=1.0)["errors"] == []
    assert plan(catalog_vars, [lite("a", "0.46", [0]), lite("b", "0.46", [0])])["errors"] == []
    assert plan(catalog_vars, [lite("a", "0.47", [0]), lite("b", "0.46", [0])])["errors"] != []
    alone = plan(catalog_vars, [lite("a", "0.97", [0])])
    assert alone["errors"] == [] and alone["instances"][0]["start_after"] == []
    # a GPU of its own: its share and its CUDA context must fit: 0.98 x 22,560 = 22,109 MiB, 22,048 free
    assert "Free memory on device cuda:0 (21.53/22.03 GiB)" in plan(catalog_vars, [lite("a", "0.98", [0])])["errors"][0]


def test_automatic_placement_keeps_to_the_cap(catalog_vars: dict[str, Any]) -> None:
    result = plan(catalog_vars, [lite("a", "0.5"), lite("b", "0.5")], gpus=1)
    assert result["instances"] == []
    assert "within d3_gpu_share_cap 0.92" in result["errors"][0]
    shared = plan(catalog_vars, [lite("a", "0.4"), lite("b", "0.4")], gpus=1)
    assert [i["gpus"] for i in shared["instances"]] == [[0], [0]]
    assert shared["instances"][1]["start_after"] == ["a"]


@pytest.mark.parametrize("address", ["127.0.0.1", "127.0.1.1", "::1", "0.0.0.0", "::", "10.0.0.5", "fe80::1"])
def test_listen_addresses_the_host_can_bind(catalog_vars: dict[str, Any], address: str) -> None:
    result = plan(catalog_vars, [lite("a", "0.4")], listen_address=address, host_addresses=["10.0.0.5", "fe80::1%eth0"])
    assert result["errors"] == []


def test_a_listen_address_the_host_does_not_have_is_refused(catalog_vars: dict[str, Any]) -> None:
    result = plan(catalog_vars, [lite("a", "0.4")], listen_address="203.0.113.7", host_addresses=["10.0.0.5", "bogus"])
    (error,) = result["errors"]
    assert error.startswith("host l4-a: d3_listen_address: 203.0.113.7 is not an address of this host (its addresses: 10.0.0.5)")
    assert "Fix: set d3_listen_address" in error
    # without the host's facts (plan.yml with d3_gpu_count) only the form is checked
    assert plan(catalog_vars, [lite("a", "0.4")], listen_address="203.0.113.7")["errors"] == []


@pytest.mark.parametrize("address", ["l4-a.example.com", "10.0.0.5\n", "", "10.0.0.5 ", "0.0.0.0/0"])
def test_a_listen_address_that_is_not_an_ip_is_refused(catalog_vars: dict[str, Any], address: str) -> None:
    (error,) = plan(catalog_vars, [lite("a", "0.4")], listen_address=address)["errors"]
    assert f"d3_listen_address: {address!r} is not an IP address" in error


def test_the_health_url_of_a_wildcard_bind_is_loopback(catalog_vars: dict[str, Any]) -> None:
    v4 = plan(catalog_vars, [lite("a", "0.4")], listen_address="0.0.0.0")["instances"][0]
    v6 = plan(catalog_vars, [lite("a", "0.4")], listen_address="::")["instances"][0]
    own = plan(catalog_vars, [lite("a", "0.4")], listen_address="fd00::5", host_addresses=["fd00::5"])["instances"][0]
    assert v4["health_url"] == f"http://127.0.0.1:{v4['port']}/health"
    assert v6["health_url"] == f"http://[::1]:{v6['port']}/health"
    assert own["health_url"] == f"http://[fd00::5]:{own['port']}/health"
    assert "--host" in v4["args"] and v4["args"][v4["args"].index("--host") + 1] == "0.0.0.0"


def test_cuda_compat_adds_the_forward_compatibility_switch(catalog_vars: dict[str, Any]) -> None:
    assert "VLLM_ENABLE_CUDA_COMPATIBILITY" not in plan(catalog_vars, [lite("a", "0.4")])["instances"][0]["env"]
    env = plan(catalog_vars, [lite("a", "0.4")], cuda_compat=True)["instances"][0]["env"]
    assert env["VLLM_ENABLE_CUDA_COMPATIBILITY"] == "1"


def test_d3_models_that_is_not_a_list_is_refused(catalog_vars: dict[str, Any]) -> None:
    """A string would otherwise be planned one character at a time (found by mutation testing)."""
    result = plan(catalog_vars, "d3-mini")  # type: ignore[arg-type]
    assert result["errors"] == ["host l4-a: d3_models: expected a list, got str. Fix: write a YAML list"]
    assert plan(catalog_vars, None)["errors"] == []  # type: ignore[arg-type]
