# ruff: noqa: E501  (each target row and each refusal is kept on one line, as it is read)
"""The fleet's metrics decisions (filters d3_metrics_scrape, d3_metrics_rules, d3_metrics_alertmanager; role
d3_metrics): every planned instance, router and host is a target with the plan's labels, adding a model adds its
targets and nothing else, every rule reads a metric name the contract names and links the runbook, bad inventory
values are refused naming the variable."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from d3_inputs import shown
from d3_metrics import (
    DEFAULTS,
    XID_CRITICAL,
    FilterModule,
    metrics_alertmanager,
    metrics_rules,
    metrics_scrape,
    metrics_silence_targets,
    metrics_silences,
    metrics_silences_end,
    metrics_silences_held,
    metrics_silences_ours,
)
from d3_planner import d3_plan
from l4 import l4_gpus

ROOT = Path(__file__).resolve().parents[1]
CONTRACT = yaml.safe_load((ROOT / "tests/contracts/metrics/names.yml").read_text())


def plan(catalog_vars: dict[str, Any], models: list[Any], host: str) -> dict[str, Any]:
    result = d3_plan(models, catalog_vars["d3_catalog"], catalog_vars["d3_catalog_common"], l4_gpus(4), host=host,
                     options={"api_key_set": True, "listen_address": "0.0.0.0"})  # fmt: skip
    assert result["errors"] == []
    return result


@pytest.fixture
def fleet(catalog_vars: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """l4-a: d3-flash and d3-mini; l4-b (behind a NAT, offset 1000): d3-flash again and d3-edge named triage."""
    return {
        "l4-a": {"plan": plan(catalog_vars, [{"model": "d3-flash"}, {"model": "d3-mini"}], "l4-a"),
                 "ansible_host": "10.0.0.11"},
        "l4-b": {"plan": plan(catalog_vars, [{"model": "d3-flash"}, {"model": "d3-edge", "name": "triage"}], "l4-b"),
                 "backend_address": "10.0.2.2", "backend_port_offset": 1000, "ansible_host": "192.0.2.7"},
    }  # fmt: skip


ROUTERS = {"router1": {"ansible_host": "10.0.0.5", "metrics_port": 8405}}
BOOK = "https://wiki.example/runbook.md"


def scrape(fleet: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    kwargs.setdefault("routers", ROUTERS)
    out = metrics_scrape(fleet, "router1", **kwargs)
    assert out["errors"] == []
    return out


def test_every_instance_router_and_host_is_a_target_with_the_plan_s_labels(fleet: dict[str, Any]) -> None:
    out = scrape(fleet)
    ports = {h: {i["name"]: i for i in fleet[h]["plan"]["instances"]} for h in fleet}
    vllm = [(t["target"], t["labels"]) for t in out["targets"] if t["job"] == "d3-vllm"]
    a, b = ports["l4-a"], ports["l4-b"]
    assert vllm == [
        (f"10.0.0.11:{a['d3-flash']['port']}", {"host": "l4-a", "instance": "l4-a/d3-flash", "name": "d3-flash",
         "model": "d3-flash", "catalog_model": "d3-flash", "variant": a["d3-flash"]["variant"], "gpus": ",".join(map(str, a["d3-flash"]["gpus"]))}),
        (f"10.0.2.2:{b['d3-flash']['port'] + 1000}", {"host": "l4-b", "instance": "l4-b/d3-flash", "name": "d3-flash",
         "model": "d3-flash", "catalog_model": "d3-flash", "variant": b["d3-flash"]["variant"], "gpus": ",".join(map(str, b["d3-flash"]["gpus"]))}),
        (f"10.0.0.11:{a['d3-mini']['port']}", {"host": "l4-a", "instance": "l4-a/d3-mini", "name": "d3-mini",
         "model": "d3-mini", "catalog_model": "d3-mini", "variant": a["d3-mini"]["variant"], "gpus": ",".join(map(str, a["d3-mini"]["gpus"]))}),
        (f"10.0.2.2:{b['triage']['port'] + 1000}", {"host": "l4-b", "instance": "l4-b/triage", "name": "triage",
         "model": "triage", "catalog_model": "d3-edge", "variant": b["triage"]["variant"], "gpus": ",".join(map(str, b["triage"]["gpus"]))}),
    ]  # fmt: skip
    assert all(labels["variant"] and labels["gpus"] for _, labels in vllm)
    node = [(t["target"], t["labels"]) for t in out["targets"] if t["job"] == "d3-node"]
    assert node == [("10.0.0.11:9100", {"host": "l4-a", "instance": "l4-a"}),
                    ("10.0.2.2:10100", {"host": "l4-b", "instance": "l4-b"}),
                    ("127.0.0.1:9100", {"host": "router1", "instance": "router1"})]  # fmt: skip
    router = [(t["target"], t["labels"]) for t in out["targets"] if t["job"] == "d3-router"]
    assert router == [("127.0.0.1:8405", {"host": "router1", "instance": "router1"})]


def test_the_config_is_prometheus_yml(fleet: dict[str, Any]) -> None:
    config = scrape(fleet, options={"scrape_interval": "5s", "alertmanager": "127.0.0.1:9093"})["config"]
    assert config["global"] == {"scrape_interval": "5s", "evaluation_interval": "15s"}
    assert config["rule_files"] == ["/etc/prometheus/d3-rules.yml"]
    assert config["alerting"] == {"alertmanagers": [{"static_configs": [{"targets": ["127.0.0.1:9093"]}]}]}
    assert [j["job_name"] for j in config["scrape_configs"]] == ["d3-vllm", "d3-router", "d3-node", "d3-prometheus",
                                                                  "d3-alertmanager"]  # fmt: skip
    assert all(j["metrics_path"] == CONTRACT["vllm"]["path"] for j in config["scrape_configs"])
    assert [j.get("honor_labels") for j in config["scrape_configs"]] == [None] * 5  # a target's labels are the plan's
    assert config["scrape_configs"][3]["static_configs"] == [{"targets": ["127.0.0.1:9090"],
                                                               "labels": {"host": "router1", "instance": "router1"}}]  # fmt: skip
    node = config["scrape_configs"][2]["static_configs"]
    assert node[0] == {"targets": ["10.0.0.11:9100"], "labels": {"host": "l4-a", "instance": "l4-a"}}


def test_monitors_that_are_no_router_get_their_node_exporter_scraped(fleet: dict[str, Any]) -> None:
    out = metrics_scrape(fleet, "mon1", routers={"router1": {"metrics_port": None}}, others={"mon1": {}, "router1": {}})
    assert out["errors"] == []
    assert [(t["job"], t["target"]) for t in out["targets"] if t["job"] != "d3-vllm"] == [
        ("d3-node", "10.0.0.11:9100"), ("d3-node", "10.0.2.2:10100"), ("d3-node", "127.0.0.1:9100"),
        ("d3-node", "router1:9100"), ("d3-router", "router1:8405"), ("d3-prometheus", "127.0.0.1:9090"),
        ("d3-alertmanager", "127.0.0.1:9093")]  # fmt: skip


def test_dcgm_exporter_is_an_optional_target_on_the_gpu_hosts(fleet: dict[str, Any]) -> None:
    """dcgm-exporter's port 9400 (NVIDIA/dcgm-exporter pkg/cmd/app.go, tests/contracts/metrics/names.yml), on every
    l4-nodes host only, shifted by its NAT offset; off by default (the textfile stays the default)."""
    assert [t for t in scrape(fleet)["targets"] if t["job"] == "d3-dcgm"] == []
    dcgm = CONTRACT["dcgm_exporter"]["port"]
    out = scrape(fleet, options={"dcgm_exporter": True})
    assert [(t["target"], t["labels"]) for t in out["targets"] if t["job"] == "d3-dcgm"] == [
        (f"10.0.0.11:{dcgm}", {"host": "l4-a", "instance": "l4-a"}),
        (f"10.0.2.2:{dcgm + 1000}", {"host": "l4-b", "instance": "l4-b"}),
    ]
    assert "d3-dcgm" in [j["job_name"] for j in out["config"]["scrape_configs"]]
    far = copy.deepcopy(fleet)
    far["l4-b"]["backend_port_offset"] = 60000
    errors = metrics_scrape(far, "router1", ROUTERS, options={"dcgm_exporter": True, "node_exporter_port": 1})["errors"]
    assert errors[-1:] == ["host l4-b: its dcgm-exporter port 9400 + d3_router_backend_port_offset 60000 = 69400 is not a TCP port. "
                      "Fix the inventory."]  # fmt: skip
    assert metrics_scrape(fleet, "router1", ROUTERS, options={"dcgm_exporter": "yes"})["errors"] == [
        "d3_metrics_dcgm_exporter = 'yes' is not true or false. Fix the inventory."
    ]


def test_an_ipv6_address_is_bracketed(fleet: dict[str, Any]) -> None:
    fleet["l4-a"]["ansible_host"] = "2001:db8::1"
    targets = scrape(fleet)["targets"]
    assert "[2001:db8::1]:9100" in [t["target"] for t in targets]


def test_adding_a_model_adds_its_targets_and_nothing_else(fleet: dict[str, Any], catalog_vars: dict[str, Any]) -> None:
    before = scrape(fleet)
    grown = copy.deepcopy(fleet)
    grown["l4-a"]["plan"] = plan(catalog_vars, [{"model": "d3-flash"}, {"model": "d3-mini"}, {"model": "d3-nano"}], "l4-a")
    after = scrape(grown)
    old = [yaml.safe_dump(t) for t in before["targets"]]
    new = [yaml.safe_dump(t) for t in after["targets"]]
    added = [t for t in new if t not in old]
    assert [t for t in old if t not in new] == []
    assert len(added) == 1 and "instance: l4-a/d3-nano" in added[0]
    b_conf, a_conf = before["config"], after["config"]
    assert {k: v for k, v in b_conf.items() if k != "scrape_configs"} == {k: v for k, v in a_conf.items() if k != "scrape_configs"}
    rules_before = metrics_rules(before["models"], {"runbook_url": BOOK})["rules"]["groups"][0]["rules"]
    rules_after = metrics_rules(after["models"], {"runbook_url": BOOK})["rules"]["groups"][0]["rules"]
    assert [r for r in rules_after if r not in rules_before and "alert" in r] == [
        r for r in rules_after if r.get("labels", {}).get("model") == "d3-nano"
    ]
    assert all(r in rules_after for r in rules_before if r.get("record") != "d3:host_gpus:planned")


@pytest.mark.parametrize(
    ("option", "value", "needle"),
    [
        ("scrape_interval", "15", "d3_metrics_scrape_interval = '15' is not a Prometheus duration"),
        ("scrape_interval", "15s\n", "d3_metrics_scrape_interval = '15s\\n' is not"),
        ("kv_cache_for", "0m", "d3_metrics_kv_cache_for = '0m' is not"),
        ("node_exporter_port", 0, "d3_metrics_node_exporter_port = 0 is not a TCP port"),
        ("node_exporter_port", True, "d3_metrics_node_exporter_port = True is not"),
        ("kv_cache_ratio", 1.5, "d3_metrics_kv_cache_ratio = 1.5 is not a fraction"),
        ("kv_cache_ratio", 0, "d3_metrics_kv_cache_ratio = 0 is not"),
        ("error_ratio", "0.1", "d3_metrics_error_ratio = '0.1' is not"),
        ("slo_queue_ms", 0, "d3_metrics_slo_queue_ms = 0 is not a whole number above 0"),
        ("slo_queue_ms", 2.5, "d3_metrics_slo_queue_ms = 2.5 is not"),
        ("rollout_stale_minutes", False, "d3_metrics_rollout_stale_minutes = False is not"),
        ("alertmanager", "localhost", "d3_metrics_alertmanager = 'localhost' is not HOST:PORT"),
        ("alertmanager", "a b:9093", "is not HOST:PORT"),
        ("alertmanager", "host:99999", "is not HOST:PORT"),
        ("alertmanager", 9093, "is not HOST:PORT"),
        ("rules_file", "etc/x.yml", "d3_metrics_rules_file = 'etc/x.yml' is not a plain absolute path"),
        ("runbook_url", "javascript:alert(1)", "d3_metrics_runbook_url = 'javascript:alert(1)' is not an absolute http(s) URL"),
        ("runbook_url", 3, "is not an absolute http(s) URL"),
        ("runbook_url", "docs/runbook.md", "a pager cannot open a path"),
        ("cold_start_margin", 0.5, "d3_metrics_cold_start_margin = 0.5 is not a factor of at least 1"),
        ("cold_start_s_per_gb", 0, "d3_metrics_cold_start_s_per_gb = 0 is not a number above 0"),
        ("error_min_rps", -1, "d3_metrics_error_min_rps = -1 is not"),
        ("waiting_max", -1, "d3_metrics_waiting_max = -1 is not a whole number of at least 0"),
        ("waiting_max", 1.5, "d3_metrics_waiting_max = 1.5 is not"),
        ("textfile_interval_s", 0, "d3_metrics_textfile_interval_s = 0 is not a whole number above 0"),
        ("prometheus", "x", "d3_metrics_prometheus = 'x' is not HOST:PORT"),
        ("stall_for", "5", "d3_metrics_stall_for = '5' is not a Prometheus duration"),
        ("nonsense", 1, "unknown option 'nonsense'"),
    ],
)
def test_a_bad_option_is_refused_naming_the_variable(fleet: dict[str, Any], option: str, value: Any, needle: str) -> None:
    out = metrics_scrape(fleet, "router1", ROUTERS, options={option: value})
    assert len(out["errors"]) == 1 and needle in out["errors"][0], out["errors"]
    assert out["config"]["global"]["scrape_interval"] == "15s"
    rules = metrics_rules(out["models"], {"runbook_url": BOOK, option: value})
    assert len(rules["errors"]) == 1 and needle in rules["errors"][0]


@pytest.mark.parametrize(
    ("option", "value"),
    [("alertmanager", "[::1]:9093"), ("alertmanager", "mon.example:9093"), ("runbook_url", "https://wiki.example/d3/runbook"),
     ("kv_cache_ratio", 1), ("slo_queue_ms", 10**7), ("node_exporter_port", 64535), ("scrape_interval", "500ms")],
)  # fmt: skip
def test_good_options_pass(fleet: dict[str, Any], option: str, value: Any) -> None:
    assert metrics_scrape(fleet, "router1", ROUTERS, options={option: value})["errors"] == []


def test_options_that_are_no_mapping_are_refused(fleet: dict[str, Any]) -> None:
    assert metrics_scrape(fleet, "router1", ROUTERS, options=["x"])["errors"] == ["d3_metrics options: expected a mapping, got ['x']"]
    assert metrics_scrape(fleet, "router1", ROUTERS, options={"slo_queue_ms": None})["errors"] == []


def test_bad_hosts_and_routers_are_refused(fleet: dict[str, Any]) -> None:
    assert metrics_scrape("x")["errors"] == ["fleet hosts: expected a mapping of host to plan, got 'x'"]
    bad = copy.deepcopy(fleet)
    bad["l4-a"]["ansible_host"] = "10.0.0.11; rm -rf /"
    errors = metrics_scrape(bad, "router1", ROUTERS)["errors"]
    assert any(e.startswith("host l4-a instance") for e in errors)
    assert "host l4-a: the monitor's address for it, '10.0.0.11; rm -rf /', is not an IP address or a DNS host name. " \
           "Fix its ansible_host." in errors  # fmt: skip
    errors = metrics_scrape(fleet, "router1", {"router1": {"metrics_port": 0}})["errors"]
    assert errors == ["router router1: d3_router_metrics_port = 0 is not a TCP port (1-65535). Fix the inventory."]
    errors = metrics_scrape(fleet, "mon", {"r\n1": {"ansible_host": "a\nb"}})["errors"]
    assert errors == ["host r\n1: the monitor's address for it, 'a\\nb', is not one line of text. Fix its ansible_host."]


@pytest.mark.parametrize("address", ["1.2.3.999", "a..b", "-host", "::::", "host-", "10.0.0.1:9100", "[::1]", "fe80::1%a b"])
def test_an_address_the_router_would_refuse_is_refused_here_too(fleet: dict[str, Any], address: str) -> None:
    """One check for both (module_utils/d3_address.py): before it, the monitor took any run of letters, digits, '.',
    ':' and '-' (1.2.3.999, a..b, ::::) where the router refused them."""
    errors = metrics_scrape(fleet, "mon", {"r1": {"ansible_host": address}})["errors"]
    assert errors == [f"host r1: the monitor's address for it, {address!r}, is not an IP address or a DNS host name. "
                      "Fix its ansible_host."]  # fmt: skip
    assert [t for t in metrics_scrape(fleet, "mon", {"r1": {"ansible_host": address}})["targets"] if t["labels"]["host"] == "r1"] == []
    assert metrics_scrape(fleet, "router1", ["router1"])["errors"] == [
        "d3-routers hosts: expected a mapping of host to its variables, got ['router1']"
    ]
    far = copy.deepcopy(fleet)
    far["l4-b"]["backend_port_offset"] = 60000
    errors = metrics_scrape(far, "router1", ROUTERS)["errors"]
    assert any("host l4-b: its node exporter port 9100 + d3_router_backend_port_offset 60000 = 69100" in e for e in errors)


def test_the_router_s_refusals_name_the_monitor(fleet: dict[str, Any], catalog_vars: dict[str, Any]) -> None:
    fleet["l4-a"]["plan"] = None
    errors = metrics_scrape(fleet, "router1", ROUTERS)["errors"]
    assert errors and errors[0].startswith("host l4-a (l4-nodes) has no d3_host_plan: this run did not plan it, so the monitor")


# --- rules ----------------------------------------------------------------------------------------------------------


def rules_of(fleet: dict[str, Any], **options: Any) -> list[dict[str, Any]]:
    options.setdefault("runbook_url", BOOK)
    out = metrics_rules(scrape(fleet)["models"], options)
    assert out["errors"] == []
    return [r for r in out["rules"]["groups"][0]["rules"] if "alert" in r]


def test_each_rule_links_its_runbook_entry(fleet: dict[str, Any]) -> None:
    rules = rules_of(fleet)
    anchors = {r["alert"]: r["annotations"]["runbook_url"] for r in rules}
    assert set(anchors) == {
        "Watchdog", "D3HostDown", "D3RouterDown", "D3TargetDown", "D3InstanceDown", "D3ModelReplicasMissing", "D3KvCacheHigh",
        "D3QueueTimeHigh", "D3EngineStalled", "D3RequestsWaiting", "D3RouterQueue", "D3RouterErrors", "D3GpuEccErrors",
        "D3GpuXidCritical", "D3GpuXid", "D3GpuQueryFailed", "D3GpuLost", "D3TextfileStale", "D3TextfileFailed",
        "D3InstanceDigestDrift", "D3RolloutStale", "D3VllmMetricMissing"}  # fmt: skip
    assert all(url == f"{BOOK}#{name.lower()}" for name, url in anchors.items())
    runbook = (ROOT / "docs/runbook.md").read_text()
    headings = {re.sub(r"[^a-z0-9 -]", "", h.lower()).strip().replace(" ", "-") for h in re.findall(r"^#+ (.+)$", runbook, re.M)}
    assert {url.split("#")[1] for url in anchors.values()} <= headings


def test_a_runbook_url_is_required_and_absolute(fleet: dict[str, Any]) -> None:
    models = scrape(fleet)["models"]
    assert metrics_rules(models)["errors"] == [
        "d3_metrics_runbook_url = '' is not set: give the absolute http(s) URL where the on-call engineer opens "
        "docs/runbook.md (a pager cannot open a relative path). Fix the inventory."]  # fmt: skip
    assert metrics_rules(models, {"runbook_url": None})["errors"][0].startswith("d3_metrics_runbook_url = '' is not set")
    assert len(metrics_rules(models, {"runbook_url": "docs/runbook.md"})["errors"]) == 1
    assert metrics_rules(models, {"runbook_url": "http://wiki:8080/d3/runbook.md"})["errors"] == []


def test_one_down_and_one_replica_rule_per_model(fleet: dict[str, Any]) -> None:
    """Each model's instances are down only past its expected cold start (the checkpoint at 2.9 s/GB, doubled, at least
    d3_metrics_instance_down_for); its replicas are counted per router against the replicas answering."""
    rules = rules_of(fleet)
    down = [(r["labels"]["model"], r["expr"], r["for"]) for r in rules if r["alert"] == "D3InstanceDown"]
    unless = ' unless on (host) (avg_over_time(up{job="d3-node"}[1m]) < 0.5)'  # a host down is D3HostDown's alone
    assert down == [('d3-flash', 'up{job="d3-vllm", model="d3-flash"} == 0' + unless, "113s"),
                    ('d3-mini', 'up{job="d3-vllm", model="d3-mini"} == 0' + unless, "1m"),
                    ('triage', 'up{job="d3-vllm", model="triage"} == 0' + unless, "1m")]  # fmt: skip
    replica = [(r["labels"]["model"], r["expr"], r["for"]) for r in rules if r["alert"] == "D3ModelReplicasMissing"]
    assert replica == [
        ("d3-flash", '(d3:router_servers_up:sum{proxy="be_d3-flash"} or on (host) (d3:router_up == 1) * 0) '
                     '< on () group_left () (d3:vllm_up:count{model="d3-flash"})', "5m"),
        ("d3-mini", '(d3:router_servers_up:sum{proxy="be_d3-mini"} or on (host) (d3:router_up == 1) * 0) '
                    '< on () group_left () (d3:vllm_up:count{model="d3-mini"})', "5m"),
        ("triage", '(d3:router_servers_up:sum{proxy="be_triage"} or on (host) (d3:router_up == 1) * 0) '
                   '< on () group_left () (d3:vllm_up:count{model="triage"})', "5m"),
    ]  # fmt: skip
    flash = next(r for r in rules if r["alert"] == "D3ModelReplicasMissing")
    assert flash["annotations"]["summary"] == "router {{ $labels.host }}: {{ $value }} of d3-flash's answering replicas are UP (plan: 2)"
    assert {r["labels"]["severity"] for r in rules if r["alert"] in ("D3InstanceDown", "D3ModelReplicasMissing")} == {"critical"}
    # the cold start's figures: 19.4 GB x 2.9 s/GB x 2 = 112.5 s -> 113 s; a bigger margin or a slower disk, longer
    longer = rules_of(fleet, cold_start_margin=3, cold_start_s_per_gb=4.0, instance_down_for="2m")
    assert [r["for"] for r in longer if r["alert"] == "D3InstanceDown"] == ["233s", "2m", "2m"]
    assert next(r["for"] for r in rules_of(fleet, cold_start_s_per_gb=3.09) if r["alert"] == "D3InstanceDown") == "2m"


def test_the_recording_rules_come_first_and_are_read(fleet: dict[str, Any]) -> None:
    out = metrics_rules(scrape(fleet)["models"], {"runbook_url": BOOK})["rules"]["groups"][0]["rules"]
    records = [r["record"] for r in out if "record" in r]
    assert out[: len(records)] == [r for r in out if "record" in r]
    assert records == ["d3:router_up", "d3:router_servers_up:sum", "d3:vllm_up:count", "d3:router_backend_responses:rate5m",
                       "d3:host_gpus:count", "d3:host_gpus:planned"]  # fmt: skip
    text = "\n".join(r["expr"] for r in out if "alert" in r)
    assert all(text.count(name) >= 1 for name in records), [n for n in records if n not in text]
    planned = next(r for r in out if r.get("record") == "d3:host_gpus:planned")
    gpus = {h: max(g for i in fleet[h]["plan"]["instances"] for g in i["gpus"]) + 1 for h in fleet}
    assert planned["expr"] == " or ".join(f'label_replace(vector({gpus[h]}), "host", "{h}", "", "")' for h in sorted(gpus))
    assert "d3:host_gpus:planned" not in [r.get("record") for r in metrics_rules([], {"runbook_url": BOOK})["rules"]["groups"][0]["rules"]]


def test_thresholds_come_from_the_inventory(fleet: dict[str, Any]) -> None:
    rules = {r["alert"]: r for r in rules_of(fleet, kv_cache_ratio=0.8, kv_cache_for="3m", slo_queue_ms=1500,
                                              rollout_stale_minutes=45, error_ratio=0.1, error_min_rps=0.5,
                                              stall_for="2m", waiting_max=4, textfile_interval_s=10, host_down_for="2m",
                                              gpu_for="3m", queue_for="4m")}  # fmt: skip
    assert rules["D3KvCacheHigh"]["expr"].endswith(" > 0.8") and rules["D3KvCacheHigh"]["for"] == "3m"
    assert rules["D3QueueTimeHigh"]["expr"].endswith(" > 1.5") and rules["D3QueueTimeHigh"]["for"] == "4m"
    assert "queue time p99 above 1500 ms" in rules["D3QueueTimeHigh"]["annotations"]["summary"]
    assert rules["D3RolloutStale"]["expr"].endswith(" > 2700")
    assert "older than 45 minutes" in rules["D3RolloutStale"]["annotations"]["summary"]
    assert " > 0.1 and " in rules["D3RouterErrors"]["expr"] and ") > 0.5, " in rules["D3RouterErrors"]["expr"]
    assert rules["D3EngineStalled"]["expr"].count("[2m]") == 4 and rules["D3EngineStalled"]["expr"].endswith(" offset 2m) == 1")
    # the host-down hold: D3HostDown's for:, at least three scrape intervals (the lab's 10 s at a 5 s scrape: 15 s)
    lab = {r["alert"]: r for r in metrics_rules([], {"host_down_for": "10s", "scrape_interval": "5s"})["rules"]["groups"][0]["rules"]
           if "alert" in r}  # fmt: skip
    assert lab["D3RouterDown"]["expr"].endswith('unless on (host) (avg_over_time(up{job="d3-node"}[15s]) < 0.5)')
    assert rules["D3RouterDown"]["expr"].endswith('(avg_over_time(up{job="d3-node"}[2m]) < 0.5)')
    assert rules["D3RequestsWaiting"]["expr"].endswith(" > 4") and rules["D3RequestsWaiting"]["for"] == "4m"
    assert rules["D3RouterQueue"]["for"] == "4m"
    assert " > 40 or " in rules["D3TextfileStale"]["expr"]
    assert rules["D3HostDown"]["for"] == rules["D3RouterDown"]["for"] == rules["D3TargetDown"]["for"] == "2m"
    assert rules["D3GpuQueryFailed"]["for"] == rules["D3GpuLost"]["for"] == rules["D3TextfileFailed"]["for"] == "3m"


PROMQL_WORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset", "inf", "nan"}


def series_names(expr: str) -> set[str]:
    """Every series name a PromQL expression reads: the identifiers left once strings, label matchers, ranges,
    label lists (by, on, ...) and function calls are taken out."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    words = re.findall(r"(?<![\w.])([a-zA-Z_:][a-zA-Z0-9_:]*)(?![a-zA-Z0-9_:])(?!\s*\()", text)
    return {w for w in words if w.lower() not in PROMQL_WORDS and not re.fullmatch(r"[0-9.e+-]+", w)}


def test_every_rule_reads_metric_names_from_the_contract(fleet: dict[str, Any]) -> None:
    known = set(CONTRACT["haproxy"]["metrics"]) | set(CONTRACT["d3"]["metrics"]) | {"up"}
    known |= set(CONTRACT["node_exporter"]["metrics"]) | set(CONTRACT["dcgm_exporter"]["metrics"])
    known |= {n + suffix for n, kind in CONTRACT["vllm"]["metrics"].items()
              for suffix in (["_bucket", "_sum", "_count"] if kind == "histogram" else ["_total"] if kind == "counter" else [""])}  # fmt: skip
    records: set[str] = set()
    for rule in metrics_rules(scrape(fleet)["models"], {"runbook_url": BOOK})["rules"]["groups"][0]["rules"]:
        names = series_names(rule["expr"]) - records
        assert names <= known, (rule.get("alert") or rule.get("record"), names - known)
        records.add(rule.get("record"))
    # the reader finds a name written without braces too (a recording rule's, or a metric's)
    assert series_names('rate(a:b{x="y{"}[5m]) > on (host) group_left () c unless ignoring (q) d_e or vector(1) > bool 2') == {"a:b", "c", "d_e"}
    assert "UP" in CONTRACT["haproxy"]["states"] and "5xx" in CONTRACT["haproxy"]["codes"]
    # the guards: one per vLLM metric a rule reads
    guarded = {r["labels"]["metric"] for r in rules_of(fleet) if r["alert"] == "D3VllmMetricMissing"}
    read = {n for r in rules_of(fleet) if r["alert"] != "D3VllmMetricMissing" for n in re.findall(r"(vllm:[a-z_]+)\{", r["expr"])}
    assert guarded == read


def test_xid_severities_follow_the_contract(fleet: dict[str, Any]) -> None:
    xid = yaml.safe_load((ROOT / "tests/contracts/nvidia/xid-severity.yml").read_text())
    assert set(XID_CRITICAL) == {str(c) for c, row in xid["codes"].items() if row["severity"] == "critical"}
    rules = {r["alert"]: r["expr"] for r in rules_of(fleet)}
    assert 'xid=~"46|48|64|79"' in rules["D3GpuXidCritical"] and 'xid!~"46|48|64|79"' in rules["D3GpuXid"]


def test_bad_models_are_refused() -> None:
    assert metrics_rules("x", {"runbook_url": BOOK})["errors"] == ["models: expected the list d3_metrics_scrape returns, got 'x'"]
    out = metrics_rules([{"served_name": "a\nb", "backend": "be_a", "servers": []}], {"runbook_url": BOOK})
    assert out["errors"] == ["model 'a\\nb': its name or backend 'be_a' cannot go into a rule. Fix d3_models."]
    assert not [r for r in out["rules"]["groups"][0]["rules"] if r.get("alert") == "D3ModelReplicasMissing"]
    assert metrics_rules([{"served_name": "a", "backend": None}], {"runbook_url": BOOK})["errors"]
    assert metrics_rules(["x"], {"runbook_url": BOOK})["errors"] == [
        "model None: its name or backend None cannot go into a rule. Fix d3_models."
    ]
    # a server without plan facts (no GPUs, no size): the floor, no planned GPUs
    out = metrics_rules([{"served_name": "a", "backend": "be_a", "servers": [{"host": "h", "gpus": [True, -1], "download_bytes": True}, "x"]}],
                        {"runbook_url": BOOK})  # fmt: skip
    assert out["errors"] == []
    assert [r["for"] for r in out["rules"]["groups"][0]["rules"] if r.get("alert") == "D3InstanceDown"] == ["1m"]
    assert "d3:host_gpus:planned" not in [r.get("record") for r in out["rules"]["groups"][0]["rules"]]


def test_each_alert_s_severity_duration_and_group(fleet: dict[str, Any]) -> None:
    out = metrics_rules(scrape(fleet)["models"], {"runbook_url": BOOK})
    assert [g["name"] for g in out["rules"]["groups"]] == ["d3-fleet"]
    table = {(r["alert"], r["labels"]["severity"], r["for"]) for r in out["rules"]["groups"][0]["rules"] if "alert" in r}
    assert len(table) == 23
    assert table == {
        ("Watchdog", "none", "0m"), ("D3HostDown", "critical", "1m"), ("D3RouterDown", "critical", "1m"),
        ("D3TargetDown", "critical", "1m"), ("D3InstanceDown", "critical", "113s"), ("D3InstanceDown", "critical", "1m"),
        ("D3ModelReplicasMissing", "critical", "5m"), ("D3KvCacheHigh", "warning", "10m"), ("D3QueueTimeHigh", "warning", "5m"),
        ("D3EngineStalled", "critical", "0m"), ("D3RequestsWaiting", "warning", "5m"), ("D3RouterQueue", "warning", "5m"),
        ("D3RouterErrors", "critical", "5m"), ("D3GpuEccErrors", "critical", "0m"), ("D3GpuXidCritical", "critical", "0m"),
        ("D3GpuXid", "warning", "0m"), ("D3GpuQueryFailed", "critical", "1m"), ("D3GpuLost", "critical", "1m"),
        ("D3TextfileStale", "warning", "0m"), ("D3TextfileFailed", "warning", "1m"), ("D3InstanceDigestDrift", "warning", "30m"),
        ("D3RolloutStale", "warning", "0m"), ("D3VllmMetricMissing", "warning", "5m"),
    }  # fmt: skip


def test_labels_have_one_meaning_across_targets_and_alerts(fleet: dict[str, Any]) -> None:
    """model: the served name on targets and on every rule; instance: unique across hosts."""
    out = scrape(fleet)
    vllm = [t["labels"] for t in out["targets"] if t["job"] == "d3-vllm"]
    per_job = {(t["job"], t["labels"]["instance"]) for t in out["targets"]}
    assert len(per_job) == len(out["targets"])
    assert len({v["instance"] for v in vllm}) == len(vllm) == 4
    served = {v["model"] for v in vllm}
    assert {r["labels"]["model"] for r in rules_of(fleet) if "model" in r["labels"]} == served == {"d3-flash", "d3-mini", "triage"}


# --- silences -------------------------------------------------------------------------------------------------------


def test_a_planned_restart_silences_what_it_trips_and_never_instance_down() -> None:
    out = metrics_silences(
        {"l4-b": ["d3-flash", "triage"], "l4-a": ["d3-flash", "d3.x"]}, "rollout.yml run 7", "2026-12-02T14:00:00+00:00", 45
    )
    assert out["errors"] == []
    common = {"startsAt": "2026-12-02T14:00:00.000Z", "endsAt": "2026-12-02T14:45:00.000Z", "createdBy": "d3-fleet",
              "comment": "rollout.yml run 7: planned restart of l4-a, l4-b; expires by itself at 2026-12-02T14:45:00.000Z"}  # fmt: skip
    models = {"name": "model", "value": "d3-flash|d3\\.x|triage", "isRegex": True, "isEqual": True}
    assert out["silences"] == [
        *({"matchers": [{"name": "alertname", "value": name, "isRegex": True, "isEqual": True}, models], **common}
          for name in ("D3ModelReplicasMissing", "D3RouterQueue", "D3RequestsWaiting", "D3RouterErrors")),
        {"matchers": [{"name": "alertname", "value": "D3InstanceDigestDrift", "isRegex": True, "isEqual": True},
                      {"name": "host", "value": "l4-a|l4-b", "isRegex": True, "isEqual": True}], **common},
    ]  # fmt: skip
    assert out["left_out"] == []
    assert "D3InstanceDown" not in str(out["silences"]) and "D3HostDown" not in str(out["silences"])
    only_host = metrics_silences({"l4-a": None}, "x", "2026-12-02T14:00:00Z")
    assert [m["value"] for s in only_host["silences"] for m in s["matchers"]] == ["D3InstanceDigestDrift", "l4-a"]
    assert only_host["silences"][0]["endsAt"] == "2026-12-02T15:00:00.000Z"
    assert metrics_silences({}, "x", "2026-12-02T14:00:00Z") == {"silences": [], "errors": [], "left_out": []}


def test_an_incident_open_before_the_run_is_left_out_of_its_silences() -> None:
    """An alert Alertmanager holds unresolved at the run's start (notified, about to be, or notified then inhibited or
    silenced by someone else) leaves its own pair out of the silences: a silence would hold back that incident's
    resolution for good (Alertmanager resolves only what it notified and mutes both; the SRE reviews'
    exp_resolved_muted.py and exp_open.py on 0.25). Only that pair: the model's other alerts are still silenced."""

    def answer(*alerts: tuple[str, str, dict[str, str]]) -> dict[str, Any]:
        return {"item": "mon", "json": [{"labels": {"alertname": a, **labels}, "status": {"state": state}} for a, state, labels in alerts]}

    opened = [answer(("D3RequestsWaiting", "active", {"model": "d3-flash", "host": "l4-a"}),
                     ("D3ModelReplicasMissing", "suppressed", {"model": "triage", "host": "r1"}),  # notified, then inhibited
                     ("D3InstanceDown", "active", {"model": "d3.x"}),  # never silenced anyway
                     ("D3ModelReplicasMissing", "active", {"model": "other"})),  # not restarted
              answer(("D3InstanceDigestDrift", "unprocessed", {"host": "l4-b"})), {"item": "mon-2"}, "x",
              {"item": "mon", "json": [{"labels": None, "status": {"state": "active"}}, "y"]}]  # fmt: skip
    out = metrics_silences({"l4-b": ["d3-flash", "triage"], "l4-a": ["d3-flash", "d3.x"]}, "run 7", "2026-12-02T14:00:00Z", 60, opened)
    assert [[m["value"] for m in s["matchers"]] for s in out["silences"]] == [
        ["D3ModelReplicasMissing", "d3-flash|d3\\.x"], ["D3RouterQueue", "d3-flash|d3\\.x|triage"],
        ["D3RequestsWaiting", "d3\\.x|triage"], ["D3RouterErrors", "d3-flash|d3\\.x|triage"], ["D3InstanceDigestDrift", "l4-a"]]
    assert out["left_out"] == ["D3InstanceDigestDrift of l4-b", "D3ModelReplicasMissing of triage", "D3RequestsWaiting of d3-flash"]
    assert "l4-a, l4-b" in out["silences"][0]["comment"]  # the comment still names every host restarted
    everything = metrics_silences({"l4-b": ["triage"]}, "run 7", "2026-12-02T14:00:00Z", 60, [answer(
        *((name, "active", {"model": "triage"}) for name in ("D3ModelReplicasMissing", "D3RouterQueue", "D3RequestsWaiting", "D3RouterErrors")),
        ("D3InstanceDigestDrift", "active", {"host": "l4-b"}))])  # fmt: skip
    assert everything["silences"] == [] and len(everything["left_out"]) == 5


def test_the_error_ratio_silence_ends_the_ratio_s_window_after_the_others() -> None:
    """A restart with no replica left answers 503 through it, and the 5xx ratio over the recording rule's window keeps
    them for that window after it: its silence ends that window (5m) after the others' settle time."""
    listed = [{"item": "mon-1", "json": [
        {**LISTED, "id": "a"},
        {**LISTED, "id": "b", "matchers": [{"name": "alertname", "value": "D3RouterErrors", "isRegex": True, "isEqual": True},
                                           {"name": "model", "value": "d3-27b", "isRegex": True, "isEqual": True}]}]}]  # fmt: skip
    out = metrics_silences_end(listed, "run 7", "2026-12-05T06:00:00Z", {"mon-1": ["15s", "15s"]})
    assert {s["id"]: s["endsAt"] for _, s in out["silences"]} == {"a": "2026-12-05T06:01:00.000Z", "b": "2026-12-05T06:06:00.000Z"}
    rules = {r.get("record"): r["expr"] for r in metrics_rules([], {})["rules"]["groups"][0]["rules"]}
    assert "[5m]" in rules["d3:router_backend_responses:rate5m"]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("x", "id", "2026-12-02T14:00:00Z"), "silences: expected a mapping of host to its served models, got 'x'"),
        (({"h": []}, "id", "2026-12-02T14:00:00"), "silences: the run's time '2026-12-02T14:00:00' is not an ISO 8601 time with a zone"),
        (({"h": []}, "id", "yesterday"), "is not an ISO 8601 time"),
        (({"h": []}, "a\nb", "2026-12-02T14:00:00Z"), "silences: the run's identity 'a\\nb' is not one line of text"),
        (({"h": []}, " ", "2026-12-02T14:00:00Z"), "the run's identity ' ' is not"),
        (({"h": []}, "x" * 301, "2026-12-02T14:00:00Z"), "is not one line of text (at most 300 characters)"),
        (({"h": []}, "id", "2026-12-02T14:00:00Z", 0), "d3_metrics_silence_minutes = 0 is not a whole number of minutes (1-10080)"),
        (({"h": []}, "id", "2026-12-02T14:00:00Z", 10081), "d3_metrics_silence_minutes = 10081 is not"),
        (({"a b": []}, "id", "2026-12-02T14:00:00Z"), "silences: host 'a b' cannot go into a matcher"),
    ],
)  # fmt: skip
def test_bad_silence_inputs_are_refused(args: tuple[Any, ...], needle: str) -> None:
    out = metrics_silences(*args)
    assert out["silences"] == [] and len(out["errors"]) == 1 and needle in out["errors"][0], out["errors"]


def test_the_silences_have_the_api_s_shape() -> None:
    api = yaml.safe_load((ROOT / "tests/contracts/alertmanager/api-v2-silences.yml").read_text())
    for silence in metrics_silences({"h": ["m"]}, "x", "2026-12-02T14:00:00Z")["silences"]:
        assert set(api["silence_required"]) <= set(silence) <= set(api["silence_required"])
        for matcher in silence["matchers"]:
            assert set(api["matcher_required"]) <= set(matcher) <= set(api["matcher_required"]) | set(api["matcher_optional"])
    config = metrics_alertmanager([{"name": "a", "url": "http://a/"}])["config"]
    assert set(config["route"]) <= set(api["config"]["route"])
    assert all(set(r) <= set(api["config"]["route"]) for r in config["route"]["routes"])
    assert all(set(i) == set(api["config"]["inhibit_rule"]) for i in config["inhibit_rules"])


def test_the_run_finds_its_own_silences_to_remove() -> None:
    mine = {"id": "1", "createdBy": "d3-fleet", "comment": "rollout.yml run 7: planned restart of l4-a", "status": {"state": "active"}}
    listed = [
        mine, {**mine, "id": "0", "status": {"state": "pending"}},
        {**mine, "id": "2", "status": {"state": "expired"}},
        {**mine, "id": "3", "comment": "rollout.yml run 77: planned restart of l4-a"},
        {**mine, "id": "4", "createdBy": "alice"}, {**mine, "id": 5}, {**mine, "id": "6", "status": None},
        {**mine, "id": "7", "comment": None}, {**mine, "id": "../8"}, {**mine, "id": "9?x"}, {**mine, "id": ""}, "x",
        {**mine, "id": "6f1c2a9e-0b7d-4c1e-9a55-3f0e2b8c7d10"},
    ]  # fmt: skip
    assert metrics_silences_ours(listed, "rollout.yml run 7") == ["0", "1", "6f1c2a9e-0b7d-4c1e-9a55-3f0e2b8c7d10"]
    assert metrics_silences_ours(listed, "") == metrics_silences_ours(None, "x") == metrics_silences_ours(listed, None) == []
    results = [{"item": "mon-1", "json": listed[:2]}, {"item": "mon-2", "json": [mine]}, {"item": "mon-3"}, {"json": listed}, "x"]
    spans = {"mon-1": ["5s", "5s"], "mon-2": ("15s", "1m")}
    ended = metrics_silences_end(results, "rollout.yml run 7", "2026-12-05T06:00:00Z", spans)
    assert [(m, s["id"]) for m, s in ended["silences"]] == [("mon-1", "1"), ("mon-1", "0"), ("mon-2", "1")]
    assert metrics_silences_end("x", "rollout.yml run 7", "2026-12-05T06:00:00Z", spans)["silences"] == []


# one of this run's silences as Alertmanager lists it (GET /api/v2/silences: gettableSilence)
LISTED = {"id": "6f1c2a9e-0b7d-4c1e-9a55-3f0e2b8c7d10", "createdBy": "d3-fleet", "comment": "run 7: planned restart of l4-a",
          "status": {"state": "active"}, "startsAt": "2026-12-05T05:40:00.123Z", "endsAt": "2026-12-05T06:40:00.123Z",
          "updatedAt": "2026-12-05T05:40:00.123Z",
          "matchers": [{"name": "alertname", "value": "D3InstanceDigestDrift", "isRegex": True, "isEqual": True}]}  # fmt: skip


def test_a_run_ends_its_silences_a_settle_time_later_not_at_once() -> None:
    """Twice the monitor's scrape plus evaluation interval from now: a server given back just before is scraped and
    evaluated by then, so its alert's resolution reaches Alertmanager before the silence ends. The silence is posted
    back as Alertmanager updates it in place (its id, matchers and startsAt unchanged, a later endsAt than now)."""
    results = [{"item": "mon-1", "json": [LISTED]}]
    out = metrics_silences_end(results, "run 7", "2026-12-05T06:00:00+00:00", {"mon-1": ["15s", "1m"]})
    assert out == {"silences": [["mon-1", {**{k: LISTED[k] for k in ("id", "matchers", "startsAt", "createdBy", "comment")},
                                           "endsAt": "2026-12-05T06:02:30.000Z"}]],
                   "settle": {"mon-1": 150}, "errors": []}  # fmt: skip
    api = yaml.safe_load((ROOT / "tests/contracts/alertmanager/api-v2-silences.yml").read_text())
    assert set(out["silences"][0][1]) == set(api["silence_required"]) | {api["update_by"]}
    # lab intervals: 20 s; a silence that ends sooner by itself is left as it is (even one ending exactly then)
    lab = metrics_silences_end(results, "run 7", "2026-12-05T06:00:00Z", {"mon-1": ["5s", "5s"]})
    assert lab["settle"] == {"mon-1": 20} and lab["silences"][0][1]["endsAt"] == "2026-12-05T06:00:20.000Z"
    assert metrics_silences_end(results, "run 7", "2026-12-05T06:39:40.123Z", {"mon-1": ["5s", "5s"]})["silences"] == []
    later = metrics_silences_end(results, "run 7", "2026-12-05T06:39:40.122Z", {"mon-1": ["5s", "5s"]})["silences"]
    assert [s["endsAt"] for _, s in later] == ["2026-12-05T06:40:00.000Z"]  # whole seconds, as the run's time is
    assert metrics_silences_end([{"item": "mon-1", "json": [{**LISTED, "endsAt": "soon"}]}], "run 7", "2026-12-05T06:00:00Z",
                                {"mon-1": ["5s", "5s"]})["silences"][0][1]["endsAt"] == "2026-12-05T06:00:20.000Z"  # fmt: skip
    # not this run's, or no identity: nothing
    assert metrics_silences_end(results, "run 8", "2026-12-05T06:00:00Z", {"mon-1": ["5s", "5s"]})["silences"] == []


def test_the_settle_time_counts_from_the_monitor_s_clock() -> None:
    """The Date header of the monitor's silences answer, not the controller's time: a controller 70 s behind the monitor
    would post an endsAt Alertmanager refuses (400, the SRE review's exp_skew.py on 0.25); 50 s behind, a 60 s
    settle would shrink to 10 s. An answer without a Date header (or a bad one) falls back to the run's time."""
    spans = {"mon-1": ["15s", "15s"]}
    date = yaml.safe_load((ROOT / "tests/contracts/alertmanager/api-v2-silences.yml").read_text())["date_header"]  # as uri names it
    ahead = [{"item": "mon-1", "json": [LISTED], date: "Sat, 05 Dec 2026 06:01:10 GMT"}]
    out = metrics_silences_end(ahead, "run 7", "2026-12-05T06:00:00Z", spans)
    assert [s["endsAt"] for _, s in out["silences"]] == ["2026-12-05T06:02:10.000Z"]
    for bad in ("yesterday", "Sat, 05 Dec 2026 06:01:10", "", None, 5):
        out = metrics_silences_end([{**ahead[0], date: bad}], "run 7", "2026-12-05T06:00:00Z", spans)
        assert [s["endsAt"] for _, s in out["silences"]] == ["2026-12-05T06:01:00.000Z"], bad


@pytest.mark.parametrize("spans", [{}, {"mon-1": ["5s"]}, {"mon-1": ["5s", "5"]}, {"mon-1": ["5s", 5]}, {"mon-1": "5s"},
                                   {"mon-1": ["0s", "5s"]}, "x"])  # fmt: skip
def test_a_monitor_without_durations_keeps_its_silences_to_their_own_expiry(spans: Any) -> None:
    out = metrics_silences_end([{"item": "mon-1", "json": [LISTED]}], "run 7", "2026-12-05T06:00:00Z", spans)
    assert out["silences"] == [] and out["settle"] == {}
    assert out["errors"] == [f"mon-1: its d3_metrics_scrape_interval and d3_metrics_evaluation_interval {shown(spans.get('mon-1') if isinstance(spans, dict) else None)} "
                             "are not Prometheus durations: this run's silences there are left to expire by themselves"]  # fmt: skip


def test_a_bad_time_ends_nothing() -> None:
    out = metrics_silences_end([{"item": "mon-1", "json": [LISTED]}], "run 7", "2026-12-05T06:00:00", {"mon-1": ["5s", "5s"]})
    assert out == {"silences": [], "settle": {},
                   "errors": ["silences: the run's time '2026-12-05T06:00:00' is not an ISO 8601 time with a zone"]}


def test_the_alerts_only_this_run_keeps_quiet_are_named() -> None:
    ours, other = LISTED["id"], "0d6c5a1e-aaaa-4bbb-8ccc-000000000001"
    listed = [{"item": "mon-1", "json": [LISTED]}, {"item": "mon-2", "json": [LISTED]}]

    def alert(name: str, silenced: list[str], inhibited: list[str] | None = None, **labels: str) -> dict[str, Any]:
        return {"labels": {"alertname": name, **labels}, "startsAt": "2026-12-05T05:50:00Z",
                "status": {"state": "suppressed" if silenced or inhibited else "active", "silencedBy": silenced,
                           "inhibitedBy": inhibited or []}}  # fmt: skip

    alerts = [{"item": "mon-1", "json": [
        alert("D3ModelReplicasMissing", [ours], model="d3-lite", router="r1"),
        alert("D3ModelReplicasMissing", [ours, other], model="d3-lite", router="r2"),  # an operator's silence too
        alert("D3RouterQueue", [ours], ["x"], model="d3-lite"),  # inhibited: stays quiet
        alert("D3InstanceDown", [], host="h"),  # not silenced: already notified
        alert("D3RequestsWaiting", [other]), "x", {"status": None},
    ]}, {"item": "mon-2", "json": [alert("D3InstanceDigestDrift", [ours], host="l4-a")]}, {"item": "mon-3", "json": [alert("X", [ours])]},
        {"item": "mon-2"}, "x"]  # fmt: skip
    assert metrics_silences_held(alerts, listed, "run 7") == [
        "mon-1: D3ModelReplicasMissing{model=d3-lite,router=r1} since 2026-12-05T05:50:00Z",
        "mon-2: D3InstanceDigestDrift{host=l4-a} since 2026-12-05T05:50:00Z"]
    assert metrics_silences_held(alerts, listed, "run 8") == metrics_silences_held("x", listed, "run 7") == []


def test_each_monitor_s_alertmanager_is_reached_where_it_listens_checked_first() -> None:
    out = metrics_silence_targets({"mon-1": None, "mon-2": "0.0.0.0:9193", "mon-3": "[::]:9093", "mon-4": "10.0.0.9:9093",
                                   "mon-5": "", "mon-6": "[::1]:9094"}, "127.0.0.1:9093")  # fmt: skip
    assert out == {"targets": {"mon-1": "127.0.0.1:9093", "mon-2": "127.0.0.1:9193", "mon-3": "[::1]:9093",
                               "mon-4": "10.0.0.9:9093", "mon-5": "127.0.0.1:9093", "mon-6": "[::1]:9094"}, "errors": []}  # fmt: skip
    assert metrics_silence_targets({"mon-1": None}) == {"targets": {"mon-1": "127.0.0.1:9093"}, "errors": []}
    bad = metrics_silence_targets({"mon-1": "127.0.0.1", "mon-2": "h:70000", "mon-3": "a/b:9093", "mon-4": 9093,
                                   "a b": "127.0.0.1:9093", "mon-5": "1.2.3.4:9093"}, "127.0.0.1:9093")  # fmt: skip
    assert bad["targets"] == {"mon-5": "1.2.3.4:9093"}
    assert bad["errors"] == [
        "monitor 'a b': not a host name a task can be delegated to",
        "mon-1: d3_metrics_alertmanager_listen_address = '127.0.0.1' is not HOST:PORT. Fix the inventory.",
        "mon-2: d3_metrics_alertmanager_listen_address = 'h:70000' is not HOST:PORT. Fix the inventory.",
        "mon-3: d3_metrics_alertmanager_listen_address = 'a/b:9093' is not HOST:PORT. Fix the inventory.",
        "mon-4: d3_metrics_alertmanager_listen_address = 9093 is not HOST:PORT. Fix the inventory.",
    ]
    assert metrics_silence_targets({"mon-1": None}, "nowhere")["errors"] == [
        "mon-1: d3_metrics_alertmanager_listen_address = 'nowhere' is not HOST:PORT. Fix the inventory."]
    assert metrics_silence_targets(["mon-1"]) == {"targets": {}, "errors": [
        "monitors: expected a mapping of monitor to its Alertmanager listen address, got ['mon-1']"]}


# --- alertmanager ---------------------------------------------------------------------------------------------------


def test_receivers_per_severity_the_watchdog_its_own_grouping_and_inhibition() -> None:
    out = metrics_alertmanager([{"name": "ops", "url": "http://127.0.0.1:9099/alerts"},
                                {"name": "pager", "url": "https://pager.example/hook", "severities": ["critical"]},
                                {"name": "chat", "url": "https://chat.example/hook", "severities": ["warning", "warning"]}],
                               "10s", "4h", {"name": "deadman", "url": "https://deadman.example/ping"}, "2m")  # fmt: skip
    assert out["errors"] == []
    route = out["config"]["route"]
    assert {k: v for k, v in route.items() if k != "routes"} == {
        "receiver": "none",
        "group_by": ["alertname", "host"],
        "group_wait": "10s",
        "group_interval": "10s",
        "repeat_interval": "4h",
    }
    assert route["routes"] == [
        {"receiver": "deadman", "matchers": ['alertname="Watchdog"'], "group_by": ["alertname"], "group_wait": "0s",
         "group_interval": "2m", "repeat_interval": "2m", "continue": False},
        {"receiver": "ops", "continue": True, "matchers": ['severity=~"critical|warning"']},
        {"receiver": "pager", "continue": True, "matchers": ['severity=~"critical"']},
        {"receiver": "chat", "continue": True, "matchers": ['severity=~"warning"']},
    ]  # fmt: skip
    assert out["config"]["receivers"] == [
        {"name": "none"},
        {"name": "ops", "webhook_configs": [{"url": "http://127.0.0.1:9099/alerts", "send_resolved": True}]},
        {"name": "pager", "webhook_configs": [{"url": "https://pager.example/hook", "send_resolved": True}]},
        {"name": "chat", "webhook_configs": [{"url": "https://chat.example/hook", "send_resolved": True}]},
        {"name": "deadman", "webhook_configs": [{"url": "https://deadman.example/ping", "send_resolved": False}]},
    ]  # fmt: skip
    inhibit = out["config"]["inhibit_rules"]
    assert [(i["source_matchers"], i["equal"]) for i in inhibit] == [
        (['alertname="D3HostDown"'], ["host"]), (['alertname="D3RouterDown"'], ["host"]),
        (['alertname="D3GpuQueryFailed"'], ["host"]), (['alertname="D3GpuXidCritical"'], ["host"])]  # fmt: skip
    assert all("Watchdog" not in i["target_matchers"][0] and "D3HostDown" not in i["target_matchers"][0] for i in inhibit)
    assert inhibit[1]["target_matchers"] == ['alertname=~"D3ModelReplicasMissing|D3RouterQueue|D3RouterErrors"']
    assert metrics_alertmanager([{"name": "ops", "url": "http://a/"}], watchdog="")["config"]["route"]["routes"][0]["receiver"] == "none"


def test_a_bad_watchdog_receiver_is_refused() -> None:
    errors = metrics_alertmanager([{"name": "ops", "url": "http://a/"}], watchdog={"name": "ops", "url": "http://b/"})["errors"]
    assert errors == ["d3_metrics_watchdog_webhook.name = 'ops' is not a unique name (letters, digits, . _ -; not 'none'). "
                      "Fix the inventory."]  # fmt: skip
    errors = metrics_alertmanager([{"name": "ops", "url": "http://a/"}], watchdog={"name": "dog", "url": "ftp://b/"})["errors"]
    assert errors == ["d3_metrics_watchdog_webhook.url = 'ftp://b/' is not an http(s) URL. Fix the inventory."]
    out = metrics_alertmanager([{"name": "ops", "url": "http://a/"}], watchdog=["x"])
    assert out["errors"] and out["config"]["route"]["routes"][0]["receiver"] == "none"


@pytest.mark.parametrize(
    ("hooks", "needle"),
    [
        ([], "d3_metrics_webhooks = []: give at least one"),
        (None, "d3_metrics_webhooks = None: give at least one"),
        ([{"name": "a b", "url": "http://a/"}], "d3_metrics_webhooks[0].name = 'a b' is not a unique name"),
        ([{"name": "none", "url": "http://a/"}], "d3_metrics_webhooks[0].name = 'none' is not a unique name"),
        ([{"name": "a", "url": "http://a/", "severities": ["page"]}], "d3_metrics_webhooks[0].severities = ['page'] is not"),
        ([{"name": "a", "url": "http://a/", "severities": []}], "d3_metrics_webhooks[0].severities = [] is not"),
        ([{"name": "a", "url": "http://a/", "severities": "critical"}], "d3_metrics_webhooks[0].severities = 'critical' is not"),
        (["x"], "d3_metrics_webhooks[0].name = None is not"),
        ([{"name": "a", "url": "http://a/"}, {"name": "a", "url": "http://b/"}], "d3_metrics_webhooks[1].name = 'a' is not a unique"),
        ([{"name": "a", "url": "ftp://a/"}], "d3_metrics_webhooks[0].url = 'ftp://a/' is not an http(s) URL"),
        ([{"name": "a", "url": ""}], "d3_metrics_webhooks[0].url = '' is not"),
        ([{"name": "a", "url": "http://a/\n"}], "d3_metrics_webhooks[0].url = 'http://a/\\n' is not"),
    ],
)  # fmt: skip
def test_bad_webhooks_are_refused(hooks: Any, needle: str) -> None:
    out = metrics_alertmanager(hooks)
    assert len(out["errors"]) == 1 and needle in out["errors"][0], out["errors"]
    assert out["config"]["receivers"][0] == {"name": "none"}


def test_bad_timings_are_refused() -> None:
    errors = metrics_alertmanager([{"name": "a", "url": "http://a/"}], "10", "4h\n", None, "1")["errors"]
    assert errors == ["d3_metrics_group_wait = '10' is not a Prometheus duration (30s, 5m, 4h). Fix the inventory.",
                      "d3_metrics_repeat_interval = '4h\\n' is not a Prometheus duration (30s, 5m, 4h). Fix the inventory.",
                      "d3_metrics_watchdog_interval = '1' is not a Prometheus duration (30s, 5m, 4h). Fix the inventory."]  # fmt: skip


def test_the_filters_are_exported() -> None:
    assert FilterModule().filters() == {"d3_metrics_scrape": metrics_scrape, "d3_metrics_rules": metrics_rules,
                                        "d3_metrics_alertmanager": metrics_alertmanager, "d3_metrics_silences": metrics_silences,
                                        "d3_metrics_silences_ours": metrics_silences_ours, "d3_metrics_silences_end": metrics_silences_end,
                                        "d3_metrics_silences_held": metrics_silences_held,
                                        "d3_metrics_silence_targets": metrics_silence_targets}  # fmt: skip


def test_the_filter_defaults_are_the_role_s() -> None:
    defaults = yaml.safe_load((ROOT / "roles/d3_metrics/defaults/main.yml").read_text())
    for key, value in DEFAULTS.items():
        if key not in ("router_metrics_port", "prometheus"):  # the router role's port; the monitor's listen address
            assert defaults[f"d3_metrics_{key}"] == value, key


@pytest.mark.parametrize(
    ("options", "ok"),
    [({"slo_queue_ms": 1}, True), ({"slo_queue_ms": 10**7 + 1}, False), ({"node_exporter_port": 1}, True),
     ({"node_exporter_port": 65536}, False), ({"alertmanager": "host:1"}, True), ({"alertmanager": "host:65536"}, False),
     ({"alertmanager": "HOST.Example:9093"}, True), ({"alertmanager": "[2001:DB8::1]:9093"}, True),
     ({"alertmanager": "h\n:9093"}, False), ({"router_metrics_port": 65535}, True),
     ({"cold_start_s_per_gb": 10000}, True), ({"cold_start_s_per_gb": 10000.5}, False), ({"error_min_rps": 10001}, False),
     ({"cold_start_margin": 1}, True), ({"cold_start_margin": 100}, True), ({"cold_start_margin": 100.5}, False),
     ({"waiting_max": 0}, True), ({"waiting_max": 10**7}, True), ({"waiting_max": 10**7 + 1}, False)],
)  # fmt: skip
def test_option_bounds(fleet: dict[str, Any], options: dict[str, Any], ok: bool) -> None:
    assert (metrics_scrape(fleet, "router1", ROUTERS, options=options)["errors"] == []) is ok


def test_every_bad_option_is_named_not_only_the_first(fleet: dict[str, Any]) -> None:
    errors = metrics_scrape(fleet, "router1", ROUTERS, options={"b_unknown": 1, "a_unknown": 2, "scrape_interval": "x"})["errors"]
    assert [e.split(" (known")[0] for e in errors] == [
        "d3_metrics options: unknown option 'a_unknown'", "d3_metrics options: unknown option 'b_unknown'",
        "d3_metrics_scrape_interval = 'x' is not a Prometheus duration (a whole number and ms, s, m, h, d, w or y: 30s, 5m). "
        "Fix the inventory."]  # fmt: skip
    assert errors[0].endswith(f"(known: {', '.join(sorted(DEFAULTS))})")
    errors = metrics_scrape(fleet, "router1", {"r1": {"metrics_port": 0}, "r2": {"metrics_port": 0}})["errors"]
    assert len(errors) == 2
    errors = metrics_rules([{"served_name": "a\n", "backend": "be"}, {"served_name": "b\n", "backend": "be"}], {"runbook_url": BOOK})[
        "errors"
    ]
    assert len(errors) == 2
    errors = metrics_alertmanager([{"name": "a b", "url": "http://a/"}, {"name": "c", "url": "ftp://c/"}])["errors"]
    assert len(errors) == 2
    out = metrics_alertmanager([])
    assert out["errors"] == ["d3_metrics_webhooks = []: give at least one {name, url} (an http(s) URL that receives "
                             "Alertmanager's webhook). Fix the inventory."]  # fmt: skip
    assert out["config"]["route"]["receiver"] == "none" and out["config"]["receivers"] == [{"name": "none"}]
    assert out["config"]["route"]["routes"][0]["receiver"] == "none"  # the Watchdog: no receiver of its own


def test_a_monitor_address_from_ansible_host_or_the_name(fleet: dict[str, Any]) -> None:
    fleet["l4-a"]["backend_address"] = ""
    fleet["l4-a"]["ansible_host"] = "L4-A.example"
    targets = metrics_scrape(fleet, "router1", ROUTERS)["targets"]
    assert ("d3-node", "L4-A.example:9100") in [(t["job"], t["target"]) for t in targets]
    out = metrics_scrape(fleet, "router1", {"router2": {"ansible_host": ""}})
    assert ("d3-router", "router2:8405") in [(t["job"], t["target"]) for t in out["targets"]]


def test_another_router_and_monitor_are_reached_at_their_backend_address(fleet: dict[str, Any]) -> None:
    """A router or monitor reached over SSH through a NAT (the lab's: every ansible_host is 127.0.0.1) is scraped at its
    backend_address: at ansible_host the monitor would scrape itself and call it the other router (the lab's pair
    did, 2026-12-05: router2's exporters were router1's, so router2 stopped paged nothing)."""
    routers = {"router1": {"ansible_host": "127.0.0.1", "backend_address": "10.79.0.11", "metrics_port": 8405},
               "router2": {"ansible_host": "127.0.0.1", "backend_address": "10.79.0.12", "metrics_port": 8405}}  # fmt: skip
    others = {"router1": {"ansible_host": "127.0.0.1", "backend_address": "10.79.0.11"},
              "mon2": {"ansible_host": "127.0.0.1", "backend_address": "10.79.0.13"}}  # fmt: skip
    out = metrics_scrape(fleet, "router1", routers, others)
    got = {(t["job"], t["labels"]["host"]): t["target"] for t in out["targets"] if t["labels"]["host"] != "l4-a"
           and t["labels"]["host"] != "l4-b"}  # fmt: skip
    assert got[("d3-router", "router2")] == "10.79.0.12:8405" and got[("d3-node", "router2")] == "10.79.0.12:9100"
    assert got[("d3-node", "mon2")] == "10.79.0.13:9100"
    assert got[("d3-router", "router1")] == "127.0.0.1:8405" and got[("d3-node", "router1")] == "127.0.0.1:9100"  # itself


SUMMARIES = {
    "Watchdog": "Always firing: the dead-man's switch. Its receiver alarms when it stops arriving.",
    "D3HostDown": "{{ $labels.host }} does not answer (its node exporter is unreachable)",
    "D3RouterDown": "router {{ $labels.host }}: HAProxy's exporter does not answer",
    "D3TargetDown": "{{ $labels.job }} on {{ $labels.host }} does not answer",
    "D3KvCacheHigh": "{{ $labels.name }} on {{ $labels.host }}: KV cache {{ $value | humanizePercentage }} used",
    "D3QueueTimeHigh": "{{ $labels.name }} on {{ $labels.host }}: queue time p99 above 2000 ms",
    "D3EngineStalled": "{{ $labels.name }} on {{ $labels.host }}: requests held for 5m and none finished (a wedged engine)",
    "D3RequestsWaiting": "{{ $labels.name }} on {{ $labels.host }}: {{ $value }} requests waiting in vLLM's queue for 5m",
    "D3RouterQueue": "router {{ $labels.host }}: {{ $value }} requests queued for {{ $labels.model }} (every server at its maxconn)",
    "D3RouterErrors": "router {{ $labels.host }}: {{ $value | humanizePercentage }} of {{ $labels.model }}'s answers are 5xx",
    "D3GpuEccErrors": "GPU {{ $labels.gpu }} on {{ $labels.host }}: {{ $value }} uncorrected ECC errors",
    "D3GpuXidCritical": "GPU {{ $labels.gpu }} on {{ $labels.host }}: Xid {{ if $labels.xid }}{{ $labels.xid }}, {{ $value }} kernel log "
                        "line(s) since the last acknowledgement{{ else }}{{ $value }} (dcgm-exporter's last Xid){{ end }} "
                        "(NVIDIA's catalog: reset or service the GPU)",
    "D3GpuXid": "GPU {{ $labels.gpu }} on {{ $labels.host }}: Xid {{ if $labels.xid }}{{ $labels.xid }}, {{ $value }} kernel log "
                "line(s) since the last acknowledgement{{ else }}{{ $value }} (dcgm-exporter's last Xid){{ end }}",
    "D3GpuQueryFailed": "{{ $labels.host }}: nvidia-smi fails (a GPU off the bus, or the driver)",
    "D3GpuLost": "{{ $labels.host }}: nvidia-smi lists {{ $value }} GPUs, fewer than the plan uses",
    "D3TextfileStale": "{{ $labels.host }}: d3.prom not rewritten for 120 s (d3-textfile.timer)",
    "D3TextfileFailed": "{{ $labels.host }}: the textfile collector cannot read {{ $labels.failed }}",
    "D3InstanceDigestDrift": "{{ $labels.name }} on {{ $labels.host }} runs {{ $labels.digest }}, not the fleet's digest",
    "D3RolloutStale": "{{ $labels.host }} carries a rollout marker older than 60 minutes",
}  # fmt: skip


def test_each_alert_s_summary_as_the_pager_shows_it(fleet: dict[str, Any]) -> None:
    """The summaries whole (promtool checks them rendered; this pins the wording, what the on-call engineer reads)."""
    rules = rules_of(fleet)
    assert {r["alert"]: r["annotations"]["summary"] for r in rules if r["alert"] in SUMMARIES} == SUMMARIES
    per = {(r["alert"], r["labels"].get("model") or r["labels"].get("metric")): r["annotations"]["summary"] for r in rules
           if r["alert"] not in SUMMARIES}  # fmt: skip
    assert per[("D3InstanceDown", "d3-flash")] == "{{ $labels.name }} on {{ $labels.host }} has not answered /metrics for 113s (its expected cold start, doubled)"
    assert per[("D3ModelReplicasMissing", "triage")] == "router {{ $labels.host }}: {{ $value }} of triage's answering replicas are UP (plan: 1)"
    assert per[("D3VllmMetricMissing", "vllm:num_requests_running")] == ("{{ $labels.name }} on {{ $labels.host }} answers /metrics "
                                                                         "without vllm:num_requests_running: a rule reading it is blind")  # fmt: skip
    assert next(r for r in rules_of(fleet, textfile_interval_s=7) if r["alert"] == "D3TextfileStale")["annotations"]["summary"] == (
        "{{ $labels.host }}: d3.prom not rewritten for 28 s (d3-textfile.timer)")  # fmt: skip


def test_a_sub_second_floor_is_one_second(fleet: dict[str, Any]) -> None:
    rules = rules_of(fleet, instance_down_for="500ms", cold_start_s_per_gb=0.0001)
    assert {r["for"] for r in rules if r["alert"] == "D3InstanceDown"} == {"1s"}


def test_a_gpu_zero_plan_counts_one_gpu() -> None:
    models = [{"served_name": "m", "backend": "be_m", "servers": [{"host": "h0", "instance": "m", "gpus": [0]},
                                                                   {"host": "h1", "instance": "m", "gpus": [1, 0]}]}]  # fmt: skip
    planned = next(r for r in metrics_rules(models, {"runbook_url": BOOK})["rules"]["groups"][0]["rules"] if r.get("record") == "d3:host_gpus:planned")
    assert planned["expr"] == 'label_replace(vector(1), "host", "h0", "", "") or label_replace(vector(2), "host", "h1", "", "")'
    bad = [{"served_name": "m", "backend": "be_m", "servers": [{"host": "a b", "gpus": [0]}, {"host": 3, "gpus": [0]}, {"host": "h", "gpus": "0"},
                                                                {"host": "h2", "gpus": [-1, True, "1"]}]}]  # fmt: skip
    assert "d3:host_gpus:planned" not in [r.get("record") for r in metrics_rules(bad, {"runbook_url": BOOK})["rules"]["groups"][0]["rules"]]


def test_a_cold_start_reads_only_positive_checkpoint_sizes() -> None:
    from d3_metrics import cold_start_s

    assert cold_start_s([{"download_bytes": 1e9}, {"download_bytes": 2e9}], 3.0) == 6.0
    assert cold_start_s([{"download_bytes": 0.5}, {"download_bytes": True}, {"download_bytes": "9e9"}, {"download_bytes": -5e9}, {}], 3.0) == pytest.approx(1.5e-9)
    assert cold_start_s([], 3.0) == 0


def test_option_keys_of_any_kind_are_named_and_later_ones_still_read() -> None:
    out = metrics_rules([], {1: "x", "aaa": 1, "runbook_url": BOOK, "stall_for": "7m"})
    assert out["errors"][:2] == [f"d3_metrics options: unknown option 1 (known: {', '.join(sorted(DEFAULTS))})",
                                 f"d3_metrics options: unknown option 'aaa' (known: {', '.join(sorted(DEFAULTS))})"]  # fmt: skip
    assert "[7m]" in next(r["expr"] for r in out["rules"]["groups"][0]["rules"] if r.get("alert") == "D3EngineStalled")
    assert metrics_rules("x", {"runbook_url": "nope"})["errors"][0] == "models: expected the list d3_metrics_scrape returns, got 'x'"


def test_silence_bounds() -> None:
    assert metrics_silences({"h": ["m"]}, "x" * 300, "2026-12-02T14:00:00Z", 1)["errors"] == []
    assert metrics_silences({"h": ["m"]}, "x" * 301, "2026-12-02T14:00:00Z")["errors"] != []
    assert metrics_silences({"h": ["m"]}, "id", "2026-12-02T14:00:00Z", 1.5)["errors"] == [
        "d3_metrics_silence_minutes = 1.5 is not a whole number of minutes (1-10080). Fix the inventory."]
    assert metrics_silences({"h": ["m"]}, "id", "2026-12-02T16:00:00+02:00", 10)["silences"][0]["startsAt"] == "2026-12-02T14:00:00.000Z"
    # a model name that cannot go into a matcher is left out; a host with no model gets only the digest silence
    out = metrics_silences({"h": ["m", "a b", 3], "g": None}, "id", "2026-12-02T14:00:00Z")
    assert [m["value"] for m in out["silences"][0]["matchers"]][1] == "m"
    assert [m["value"] for m in out["silences"][4]["matchers"]][1] == "g|h"


def test_the_run_s_silences_need_its_identity() -> None:
    mine = {"id": "1", "createdBy": "d3-fleet", "comment": ": planned restart of l4-a", "status": {"state": "active"}}
    assert metrics_silences_ours([mine], "") == []
    assert metrics_silences_end([{"item": "mon-1", "json": [mine]}], "", "2026-12-05T06:00:00Z", {"mon-1": ["5s", "5s"]})["silences"] == []
