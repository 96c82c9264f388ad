"""The router's fleet endpoint and its safety (filter d3_router_backends): ports that never move, one backend for
replicas on one host (spread: false), the API key rule beyond loopback, the paths that pass, the exporter's clients,
each server's maxconn, and the answers HAProxy gives itself (GET /v1/models, an unknown model) checked against vLLM's
shapes (tests/contracts/vllm/)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from d3_fleet import d3_fleet_place
from d3_planner import d3_plan
from d3_rollout import drain_problems, rollout_waves
from d3_router import MAX_NUM_SEQS, router_backends
from l4 import l4_gpus

ROOT = Path(__file__).resolve().parents[1]
CONTRACTS = ROOT / "tests/contracts/vllm"


def inst(name: str, port: int, served: str | None = None, args: Any = None) -> dict[str, Any]:
    return {"name": name, "served_model_name": served or name, "model": "m-" + (served or name), "port": port,
            "bind_address": "0.0.0.0", "hf_repo": f"org/{served or name}", "max_model_len": 4096, "args": args or []}  # fmt: skip


def node(*instances: Any, **spec: Any) -> dict[str, Any]:
    return {"plan": {"instances": list(instances)}, "ansible_host": "10.0.0.11", "api_key": True, **spec}


def view(out: dict[str, Any]) -> dict[str, Any]:
    """Per served name: its port, frontend, backend and servers (name, address, port, maxconn)."""
    return {m["served_name"]: (m["port"], m["frontend"], m["backend"], [(s["name"], s["address"], s["port"], s["maxconn"])
                                                                       for s in m["servers"]]) for m in out["models"]}  # fmt: skip


def test_adding_or_removing_a_model_changes_no_other_model_s_port_backend_or_server() -> None:
    ports = {"b": 9100, "m-d": 9300}
    before = router_backends({"l4-a": node(inst("b", 8001), inst("d", 8002))}, "router", ports)
    assert before["errors"] == []
    # a model sorting first (the old index-based port would have moved b and d), on the same host and on a new one
    for fleet in ({"l4-a": node(inst("b", 8001), inst("d", 8002), inst("a", 8003))},
                  {"l4-a": node(inst("b", 8001), inst("d", 8002)), "l4-0": node(inst("a", 8000), inst("c", 8001))}):  # fmt: skip
        after = router_backends(fleet, "router", ports)
        assert after["errors"] == []
        assert {k: v for k, v in view(after).items() if k in ("b", "d")} == view(before)
        assert {h: {i: after["servers"][h][i] for i in before["servers"][h]} for h in before["servers"]} == before["servers"]
        assert view(after)["a"][:2] == (None, None)  # the new model: on the fleet endpoint only, until given a port
    # removing one leaves the other as it was
    alone = router_backends({"l4-a": node(inst("d", 8002))}, "router", {"m-d": 9300})
    assert view(alone)["d"] == view(before)["d"]


def test_spread_false_replicas_on_one_host_are_one_model_one_backend_two_servers(catalog_vars: dict[str, Any]) -> None:
    catalog, common = catalog_vars["d3_catalog"], catalog_vars["d3_catalog_common"]
    placed = d3_fleet_place([{"model": "d3-mini", "name": "mini", "replicas": 2, "spread": False}], catalog, common,
                            {"l4-a": {"gpus": 4}})  # fmt: skip
    assert placed["errors"] == []
    plan = d3_plan(placed["hosts"]["l4-a"], catalog, common, l4_gpus(4), host="l4-a",
                   options={"api_key_set": True, "listen_address": "0.0.0.0"})  # fmt: skip
    assert plan["errors"] == []
    assert [(i["name"], i["served_model_name"]) for i in plan["instances"]] == [("mini-1", "mini"), ("mini-2", "mini")]
    out = router_backends({"l4-a": {"plan": plan, "ansible_host": "10.0.0.11", "api_key": True}}, "router")
    assert out["errors"] == []
    ((_, _, backend, servers),) = view(out).values()
    assert (backend, [s[0] for s in servers]) == ("be_mini", ["l4-a-mini-1", "l4-a-mini-2"])
    assert out["servers"]["l4-a"] == {"mini-1": {"backend": "be_mini", "server": "l4-a-mini-1", "frontend": "fe_mini"},
                                      "mini-2": {"backend": "be_mini", "server": "l4-a-mini-2", "frontend": "fe_mini"}}  # fmt: skip
    # the rollout restarts l4-a in two waves, one server of the backend each (mini-2 shares mini-1's GPU and starts
    # after it: its wave comes later), so the batch with both is not refused
    assert plan["instances"][1]["start_after"] == ["mini-1"]
    assert rollout_waves(plan["instances"], "l4-a", out["servers"], ["l4-a"]) == [["mini-1"], ["mini-2"]]
    served = {"l4-a": [i["served_model_name"] for i in plan["instances"]], "l4-b": []}
    assert drain_problems([["l4-a"], ["l4-b"]], served, 1) == []


@pytest.mark.parametrize(
    ("listen", "spec", "refused"),
    [
        ("0.0.0.0", {"api_key": False}, True),
        ("::", {"api_key": None}, True),
        ("10.0.0.5", {"api_key": "yes"}, True),  # only True counts: the role passes a yes/no, never the key
        ("0.0.0.0", {"api_key": False, "allow_unauthenticated": "true"}, True),
        ("0.0.0.0", {"api_key": True}, False),
        ("0.0.0.0", {"api_key": False, "allow_unauthenticated": True}, False),
        ("127.0.0.1", {"api_key": False}, False),
        ("::1", {"api_key": False}, False),
    ],
)
def test_a_keyless_backend_is_refused_behind_a_router_beyond_loopback(listen: str, spec: dict[str, Any], refused: bool) -> None:
    out = router_backends({"l4-a": node(inst("a", 8001), inst("b", 8002), **spec), "l4-b": node(inst("a", 8001))}, "router",
                          listen_address=listen)  # fmt: skip
    expected = [
        f"host l4-a instance '{name}' has no API key and the router listens on {listen} (d3_router_listen_address), beyond "
        "loopback: anyone who reaches the router could use it. Set d3_units_api_key (Ansible Vault) on l4-a, or "
        "d3_allow_unauthenticated: true on l4-a to serve it open on purpose, or d3_router_listen_address: 127.0.0.1."
        for name in ("a", "b")
    ]  # fmt: skip
    assert out["errors"] == (expected if refused else [])
    # the keyed host still routes
    assert [s["host"] for m in out["models"] for s in m["servers"]] == (["l4-b"] if refused else ["l4-a", "l4-b", "l4-a"])
    # a reader of the fleet that is no router (the rollout's drains, the monitor's targets) passes no listen address
    assert router_backends({"l4-a": node(inst("a", 8001), **spec)}, "router")["errors"] == []


def test_only_the_paths_clients_need_and_the_inventory_s_pass() -> None:
    fleet = {"l4-a": node(inst("a", 8001))}
    out = router_backends(fleet, "router", options={"allowed_paths": ["/v1/chat/completions", "/v1/models", "/v1/x~y.z_w-1"]})
    assert out["errors"] == []
    assert out["endpoint"]["paths"] == ["/v1/systemone", "/v1/models", "/health", "/v1/chat/completions", "/v1/x~y.z_w-1"]
    assert router_backends(fleet, "router")["endpoint"]["paths"] == ["/v1/systemone", "/v1/models", "/health"]
    bad = ["v1/x", "/v1/../metrics", "/v1/./x", "/v1/..", "/v1/.", "/v1/x?y=1", "/v1/x y", "/", "/v1//x", "/v1/x\n", 3, "/v1/x/"]
    out = router_backends(fleet, "router", options={"allowed_paths": bad})
    assert out["errors"] == [f"d3_router_allowed_paths: {p!r} is not a URL path (/v1/name: letters, digits, . _ ~ -; no query, "
                             "no .. segment). Fix the inventory." for p in bad]  # fmt: skip
    assert out["endpoint"]["paths"] == ["/v1/systemone", "/v1/models", "/health"]
    out = router_backends(fleet, "router", options={"allowed_paths": "/v1/x"})
    assert out["errors"] == ["d3_router_allowed_paths = '/v1/x' is not a list of URL paths. Fix the inventory."]
    assert router_backends(fleet, "router", options={"allowed_paths": None})["errors"] == []


def test_the_exporter_s_clients_and_every_port_of_the_router_are_checked() -> None:
    fleet = {"l4-a": node(inst("a", 8001))}
    out = router_backends(fleet, "router", options={"metrics_allowed": ["10.1.2.3/16", "2001:db8::1", "192.0.2.9"]})
    assert out["errors"] == []
    assert out["metrics"] == {"port": 8405, "allowed": ["10.1.0.0/16", "2001:db8::1/128", "192.0.2.9/32"]}
    assert out["endpoint"]["port"] == 8000
    out = router_backends(fleet, "router", options={"metrics_allowed": ["10.0.0.0/33", "x", True]})
    assert out["errors"] == [
        "d3_router_metrics_allowed[0] = '10.0.0.0/33' is not an IP address or network (CIDR). Fix the inventory.",
        "d3_router_metrics_allowed[1] = 'x' is not an IP address or network (CIDR). Fix the inventory.",
        "d3_router_metrics_allowed[2] = True expected text, got bool. Fix the inventory."]  # fmt: skip
    assert out["metrics"]["allowed"] == []
    assert router_backends(fleet, "router", options={"metrics_allowed": "10.0.0.0/8"})["errors"] == [
        "d3_router_metrics_allowed = '10.0.0.0/8' is not a list of IP addresses or networks. Fix the inventory."]
    for key, var in (("endpoint_port", "d3_router_port"), ("metrics_port", "d3_router_metrics_port"),
                     ("health_port", "d3_router_health_port")):  # fmt: skip
        for bad in (0, 65536, "8000", True, None):
            assert router_backends(fleet, "router", options={key: bad})["errors"] == [
                f"{var} = {bad!r} is not a TCP port (1-65535). Fix the inventory."], (key, bad)
        assert router_backends(fleet, "router", options={key: 1})["errors"] == []
        assert router_backends(fleet, "router", options={key: 65535})["errors"] == []
    assert router_backends(fleet, "router", options={"endpoint_port": 8405})["errors"] == [
        "d3_router_metrics_port 8405 is also d3_router_port. Give each its own port."]
    assert router_backends(fleet, "router", {"a": 8000})["errors"] == [
        "model a: its router port 8000 (d3_router_ports['a']) is also that of d3_router_port. Give each model its own port in "
        "d3_router_ports."]  # fmt: skip
    assert router_backends(fleet, "l4-a", options={"metrics_port": 8001})["errors"] == [
        "d3_router_metrics_port 8001 is also the port of instance a on the router host l4-a. Choose another."]
    # a refused endpoint port does not hide a clash of the exporter's
    assert router_backends(fleet, "router", {"a": 8405}, options={"endpoint_port": 0})["errors"] == [
        "d3_router_port = 0 is not a TCP port (1-65535). Fix the inventory.",
        "model a: its router port 8405 (d3_router_ports['a']) is also that of d3_router_metrics_port. Give each model its own "
        "port in d3_router_ports."]  # fmt: skip
    assert router_backends(fleet, "router", options="x")["endpoint"]["port"] == 8000  # not a mapping: the defaults
    # the ports clients connect to: the endpoint's and the models' own, not the exporter's
    assert router_backends(fleet, "router", {"a": 9001})["client_ports"] == [8000, 9001]
    assert router_backends(fleet, "router", options={"endpoint_port": 0})["client_ports"] == []


@pytest.mark.parametrize(
    ("args", "maxconn"),
    [
        ([], MAX_NUM_SEQS),
        (None, MAX_NUM_SEQS),
        ("--max-num-seqs 8", MAX_NUM_SEQS),  # not a list: the planner's args always are
        (["--model", "org/a", "--max-num-seqs", "64"], 64),
        (["--max-num-seqs=32"], 32),
        (["--max_num_seqs", "16", "--enforce-eager"], 16),
        (["--max-num-seqs", "8", "--max-num-seqs=1000000"], 1_000_000),
        (["--max-num-seqs", "1"], 1),
        (["not-a-flag"], MAX_NUM_SEQS),
    ],
)
def test_each_server_s_maxconn_is_its_instance_s_concurrency(args: Any, maxconn: int) -> None:
    out = router_backends({"l4-a": node(inst("a", 8001, args=args))}, "router")
    assert out["errors"] == [] and out["models"][0]["servers"][0]["maxconn"] == maxconn
    assert MAX_NUM_SEQS == 256


@pytest.mark.parametrize("value", ["0", "x", "1000001", "-1", None])
def test_a_max_num_seqs_that_is_no_concurrency_is_refused(value: Any) -> None:
    args = ["--max-num-seqs", value] if value is not None else ["--max-num-seqs"]
    out = router_backends({"l4-a": node(inst("a", 8001, args=args), inst("b", 8002))}, "router")
    assert out["errors"] == ["host l4-a instance 'a': its --max-num-seqs in the plan's flags is not a whole number "
                             "(1-1000000), so the router cannot size its maxconn. Fix its extra_args."]  # fmt: skip
    assert [m["served_name"] for m in out["models"]] == ["b"]


def test_the_model_list_and_the_unknown_model_answer_have_vllm_s_shapes() -> None:
    fleet = {"l4-b": node(inst("b-1", 8001, served="b"), inst("b-2", 8002, served="b")), "l4-a": node(inst("a", 8001))}
    endpoint = router_backends(fleet, "router")["endpoint"]
    listing = json.loads(endpoint["models_json"])
    # sorted keys, one line: the file (and so the configuration) is the same on every run
    assert endpoint["models_json"] == json.dumps(listing, sort_keys=True) + "\n"
    assert endpoint["unknown_json"] == json.dumps(json.loads(endpoint["unknown_json"]), sort_keys=True) + "\n"
    card = json.loads((CONTRACTS / "models.json").read_text())["body"]
    assert set(listing) == set(card) and listing["object"] == card["object"] == "list"
    assert [set(c) for c in listing["data"]] == [set(card["data"][0])] * 2
    assert listing["data"] == [
        {"id": name, "object": "model", "created": 0, "owned_by": "vllm", "root": f"org/{name}", "parent": None, "max_model_len": 4096}
        for name in ("a", "b")]  # fmt: skip
    assert endpoint["models_json"].endswith("}\n") and endpoint["unknown_json"].endswith("}\n")
    error = json.loads(endpoint["unknown_json"])
    contract = json.loads((CONTRACTS / "model-not-found.json").read_text())
    assert set(error) == set(contract["body"]) and set(error["error"]) == set(contract["body"]["error"])
    assert {k: error["error"][k] for k in ("type", "param", "code")} == {k: contract["body"]["error"][k] for k in ("type", "param", "code")}
    assert error["error"]["message"] == "The model in the request is not served by this fleet. Served models: a, b."
    # nothing served: said so (the filter refuses such a fleet anyway)
    assert "Served models: none." in router_backends({}, "router")["endpoint"]["unknown_json"]
