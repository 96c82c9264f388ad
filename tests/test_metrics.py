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
from d3_metrics import DEFAULTS, FilterModule, metrics_alertmanager, metrics_rules, metrics_scrape
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
        (f"10.0.0.11:{a['d3-flash']['port']}", {"host": "l4-a", "instance": "d3-flash", "model": "d3-flash",
         "served_name": "d3-flash", "variant": a["d3-flash"]["variant"], "gpus": ",".join(map(str, a["d3-flash"]["gpus"]))}),
        (f"10.0.2.2:{b['d3-flash']['port'] + 1000}", {"host": "l4-b", "instance": "d3-flash", "model": "d3-flash",
         "served_name": "d3-flash", "variant": b["d3-flash"]["variant"], "gpus": ",".join(map(str, b["d3-flash"]["gpus"]))}),
        (f"10.0.0.11:{a['d3-mini']['port']}", {"host": "l4-a", "instance": "d3-mini", "model": "d3-mini",
         "served_name": "d3-mini", "variant": a["d3-mini"]["variant"], "gpus": ",".join(map(str, a["d3-mini"]["gpus"]))}),
        (f"10.0.2.2:{b['triage']['port'] + 1000}", {"host": "l4-b", "instance": "triage", "model": "d3-edge",
         "served_name": "triage", "variant": b["triage"]["variant"], "gpus": ",".join(map(str, b["triage"]["gpus"]))}),
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
    assert [j["job_name"] for j in config["scrape_configs"]] == ["d3-vllm", "d3-router", "d3-node"]
    assert all(j["metrics_path"] == CONTRACT["vllm"]["path"] for j in config["scrape_configs"])
    assert [j.get("honor_labels") for j in config["scrape_configs"]] == [None, None, True]
    node = config["scrape_configs"][2]["static_configs"]
    assert node[0] == {"targets": ["10.0.0.11:9100"], "labels": {"host": "l4-a", "instance": "l4-a"}}


def test_monitors_that_are_no_router_get_their_node_exporter_scraped(fleet: dict[str, Any]) -> None:
    out = metrics_scrape(fleet, "mon1", routers={"router1": {"metrics_port": None}}, others={"mon1": {}, "router1": {}})
    assert out["errors"] == []
    assert [(t["job"], t["target"]) for t in out["targets"] if t["job"] != "d3-vllm"] == [
        ("d3-node", "10.0.0.11:9100"), ("d3-node", "10.0.2.2:10100"), ("d3-node", "127.0.0.1:9100"),
        ("d3-node", "router1:9100"), ("d3-router", "router1:8405")]  # fmt: skip


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
    assert len(added) == 1 and "instance: d3-nano" in added[0]
    b_conf, a_conf = before["config"], after["config"]
    assert {k: v for k, v in b_conf.items() if k != "scrape_configs"} == {k: v for k, v in a_conf.items() if k != "scrape_configs"}
    rules_before = metrics_rules(before["models"])["rules"]["groups"][0]["rules"]
    rules_after = metrics_rules(after["models"])["rules"]["groups"][0]["rules"]
    assert [r for r in rules_after if r not in rules_before] == [
        r for r in rules_after if r["labels"].get("model") == "d3-nano"]
    assert all(r in rules_after for r in rules_before)


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
        ("runbook_url", "javascript:alert(1)", "d3_metrics_runbook_url = 'javascript:alert(1)' is not an http(s) URL"),
        ("runbook_url", 3, "is not an http(s) URL"),
        ("nonsense", 1, "unknown option 'nonsense'"),
    ],
)
def test_a_bad_option_is_refused_naming_the_variable(fleet: dict[str, Any], option: str, value: Any, needle: str) -> None:
    out = metrics_scrape(fleet, "router1", ROUTERS, options={option: value})
    assert len(out["errors"]) == 1 and needle in out["errors"][0], out["errors"]
    assert out["config"]["global"]["scrape_interval"] == "15s"
    rules = metrics_rules(out["models"], {option: value})
    assert len(rules["errors"]) == 1 and needle in rules["errors"][0]


@pytest.mark.parametrize(
    ("option", "value"),
    [("alertmanager", "[::1]:9093"), ("alertmanager", "mon.example:9093"), ("runbook_url", "https://wiki.example/d3/runbook"),
     ("kv_cache_ratio", 1), ("slo_queue_ms", 10**7), ("node_exporter_port", 64535), ("scrape_interval", "500ms")],
)  # fmt: skip
def test_good_options_pass(fleet: dict[str, Any], option: str, value: Any) -> None:
    assert metrics_scrape(fleet, "router1", ROUTERS, options={option: value})["errors"] == []


def test_options_that_are_no_mapping_are_refused(fleet: dict[str, Any]) -> None:
    assert metrics_scrape(fleet, "router1", ROUTERS, options=["x"])["errors"] == [
        "d3_metrics options: expected a mapping, got ['x']"]
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
        "d3-routers hosts: expected a mapping of host to its variables, got ['router1']"]
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
    out = metrics_rules(scrape(fleet)["models"], options)
    assert out["errors"] == []
    return out["rules"]["groups"][0]["rules"]


def test_each_rule_links_its_runbook_entry(fleet: dict[str, Any]) -> None:
    rules = rules_of(fleet, runbook_url="https://wiki.example/runbook.md")
    anchors = {r["alert"]: r["annotations"]["runbook_url"] for r in rules}
    assert anchors == {
        "D3InstanceDown": "https://wiki.example/runbook.md#d3instancedown",
        "D3KvCacheHigh": "https://wiki.example/runbook.md#d3kvcachehigh",
        "D3QueueTimeHigh": "https://wiki.example/runbook.md#d3queuetimehigh",
        "D3RouterErrors": "https://wiki.example/runbook.md#d3routererrors",
        "D3GpuErrors": "https://wiki.example/runbook.md#d3gpuerrors",
        "D3InstanceDigestDrift": "https://wiki.example/runbook.md#d3instancedigestdrift",
        "D3RolloutStale": "https://wiki.example/runbook.md#d3rolloutstale",
        "D3ModelReplicasMissing": "https://wiki.example/runbook.md#d3modelreplicasmissing",
    }
    runbook = (ROOT / "docs/runbook.md").read_text()
    headings = {re.sub(r"[^a-z0-9 -]", "", h.lower()).strip().replace(" ", "-") for h in re.findall(r"^#+ (.+)$", runbook, re.M)}
    assert {url.split("#")[1] for url in anchors.values()} <= headings


def test_one_replica_rule_per_model_with_the_plan_s_count(fleet: dict[str, Any]) -> None:
    replica = [r for r in rules_of(fleet) if r["alert"] == "D3ModelReplicasMissing"]
    assert [(r["labels"]["model"], r["expr"]) for r in replica] == [
        ("d3-flash", '(count(haproxy_server_status{job="d3-router", proxy="be_d3-flash", state="UP"} == 1) or vector(0)) < 2'),
        ("d3-mini", '(count(haproxy_server_status{job="d3-router", proxy="be_d3-mini", state="UP"} == 1) or vector(0)) < 1'),
        ("triage", '(count(haproxy_server_status{job="d3-router", proxy="be_triage", state="UP"} == 1) or vector(0)) < 1'),
    ]  # fmt: skip
    assert replica[0]["for"] == "5m" and replica[0]["labels"]["severity"] == "critical"
    assert replica[0]["annotations"]["summary"] == "d3-flash: fewer than its 2 replicas are UP in the router"


def test_thresholds_come_from_the_inventory(fleet: dict[str, Any]) -> None:
    rules = {r["alert"]: r for r in rules_of(fleet, kv_cache_ratio=0.8, kv_cache_for="3m", slo_queue_ms=1500,
                                              rollout_stale_minutes=45, error_ratio=0.1, instance_down_for="30s")}  # fmt: skip
    assert rules["D3KvCacheHigh"]["expr"].endswith(" > 0.8") and rules["D3KvCacheHigh"]["for"] == "3m"
    assert rules["D3QueueTimeHigh"]["expr"].endswith(" > 1.5")
    assert "queue time p99 above 1500 ms" in rules["D3QueueTimeHigh"]["annotations"]["summary"]
    assert rules["D3RolloutStale"]["expr"].endswith(" > 2700")
    assert "older than 45 minutes" in rules["D3RolloutStale"]["annotations"]["summary"]
    assert rules["D3RouterErrors"]["expr"].endswith(" > 0.1")
    assert rules["D3InstanceDown"]["for"] == "30s"
    assert rules_of(fleet)[0]["annotations"]["runbook_url"] == "docs/runbook.md#d3instancedown"


def test_every_rule_reads_metric_names_from_the_contract(fleet: dict[str, Any]) -> None:
    known = set(CONTRACT["haproxy"]["metrics"]) | set(CONTRACT["d3"]["metrics"]) | {"up"}
    known |= {n + suffix for n, kind in CONTRACT["vllm"]["metrics"].items()
              for suffix in (["_bucket", "_sum", "_count"] if kind == "histogram" else [""])}  # fmt: skip
    for rule in rules_of(fleet):
        names = set(re.findall(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{", rule["expr"]))
        assert names and names <= known, (rule["alert"], names - known)
    assert "UP" in CONTRACT["haproxy"]["states"] and "5xx" in CONTRACT["haproxy"]["codes"]


def test_bad_models_are_refused() -> None:
    assert metrics_rules("x")["errors"] == ["models: expected the list d3_metrics_scrape returns, got 'x'"]
    out = metrics_rules([{"served_name": "a\nb", "backend": "be_a", "servers": []}])
    assert out["errors"] == ["model 'a\\nb': its name or backend 'be_a' cannot go into a rule. Fix d3_models."]
    assert not [r for r in out["rules"]["groups"][0]["rules"] if r["alert"] == "D3ModelReplicasMissing"]
    assert metrics_rules([{"served_name": "a", "backend": None}])["errors"]


# --- alertmanager ---------------------------------------------------------------------------------------------------


def test_every_webhook_gets_every_alert_resolved_too() -> None:
    out = metrics_alertmanager([{"name": "ops", "url": "http://127.0.0.1:9099/alerts"},
                                {"name": "pager", "url": "https://pager.example/hook"}])  # fmt: skip
    assert out["errors"] == []
    assert out["config"] == {
        "route": {"receiver": "ops", "group_by": ["alertname", "host", "instance", "model"], "group_wait": "10s",
                  "group_interval": "10s", "repeat_interval": "4h",
                  "routes": [{"receiver": "pager", "continue": True, "matchers": ['alertname=~".+"']}]},
        "receivers": [{"name": "ops", "webhook_configs": [{"url": "http://127.0.0.1:9099/alerts", "send_resolved": True}]},
                      {"name": "pager", "webhook_configs": [{"url": "https://pager.example/hook", "send_resolved": True}]}],
    }  # fmt: skip
    assert "routes" not in metrics_alertmanager([{"name": "ops", "url": "http://a/"}])["config"]["route"]


@pytest.mark.parametrize(
    ("hooks", "needle"),
    [
        ([], "d3_metrics_webhooks = []: give at least one"),
        (None, "d3_metrics_webhooks = None: give at least one"),
        ([{"name": "a b", "url": "http://a/"}], "d3_metrics_webhooks[0].name = 'a b' is not a unique name"),
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
    assert out["config"]["receivers"][-1]["name"] in ("none", "a")


def test_bad_timings_are_refused() -> None:
    errors = metrics_alertmanager([{"name": "a", "url": "http://a/"}], "10", "4h\n")["errors"]
    assert errors == ["d3_metrics_group_wait = '10' is not a Prometheus duration (30s, 5m, 4h). Fix the inventory.",
                      "d3_metrics_repeat_interval = '4h\\n' is not a Prometheus duration (30s, 5m, 4h). Fix the inventory."]  # fmt: skip


def test_the_filters_are_exported() -> None:
    assert FilterModule().filters() == {"d3_metrics_scrape": metrics_scrape, "d3_metrics_rules": metrics_rules,
                                        "d3_metrics_alertmanager": metrics_alertmanager}  # fmt: skip


def test_the_filter_defaults_are_the_role_s() -> None:
    defaults = yaml.safe_load((ROOT / "roles/d3_metrics/defaults/main.yml").read_text())
    for key, value in DEFAULTS.items():
        if key != "router_metrics_port":  # the router role's d3_router_metrics_port
            assert defaults[f"d3_metrics_{key}"] == value, key


def test_each_alert_s_severity_duration_and_group(fleet: dict[str, Any]) -> None:
    out = metrics_rules(scrape(fleet)["models"])
    assert out["rules"]["groups"][0]["name"] == "d3-fleet"
    table = {(r["alert"], r["labels"]["severity"], r["for"]) for r in out["rules"]["groups"][0]["rules"]}
    assert table == {
        ("D3InstanceDown", "critical", "1m"), ("D3KvCacheHigh", "warning", "10m"), ("D3QueueTimeHigh", "warning", "5m"),
        ("D3RouterErrors", "critical", "5m"), ("D3GpuErrors", "critical", "0m"), ("D3InstanceDigestDrift", "warning", "30m"),
        ("D3RolloutStale", "warning", "0m"), ("D3ModelReplicasMissing", "critical", "5m"),
    }  # fmt: skip


@pytest.mark.parametrize(
    ("options", "ok"),
    [({"slo_queue_ms": 1}, True), ({"slo_queue_ms": 10**7 + 1}, False), ({"node_exporter_port": 1}, True),
     ({"node_exporter_port": 65536}, False), ({"alertmanager": "host:1"}, True), ({"alertmanager": "host:65536"}, False),
     ({"alertmanager": "HOST.Example:9093"}, True), ({"alertmanager": "[2001:DB8::1]:9093"}, True),
     ({"alertmanager": "h\n:9093"}, False), ({"router_metrics_port": 65535}, True)],
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
    errors = metrics_rules([{"served_name": "a\n", "backend": "be"}, {"served_name": "b\n", "backend": "be"}])["errors"]
    assert len(errors) == 2
    errors = metrics_alertmanager([{"name": "a b", "url": "http://a/"}, {"name": "c", "url": "ftp://c/"}])["errors"]
    assert len(errors) == 2
    out = metrics_alertmanager([])
    assert out["errors"] == ["d3_metrics_webhooks = []: give at least one {name, url} (an http(s) URL that receives "
                             "Alertmanager's webhook). Fix the inventory."]  # fmt: skip
    assert out["config"]["route"]["receiver"] == "none" and out["config"]["receivers"] == [{"name": "none"}]


def test_a_monitor_address_from_ansible_host_or_the_name(fleet: dict[str, Any]) -> None:
    fleet["l4-a"]["backend_address"] = ""
    fleet["l4-a"]["ansible_host"] = "L4-A.example"
    targets = metrics_scrape(fleet, "router1", ROUTERS)["targets"]
    assert ("d3-node", "L4-A.example:9100") in [(t["job"], t["target"]) for t in targets]
    out = metrics_scrape(fleet, "router1", {"router2": {"ansible_host": ""}})
    assert ("d3-router", "router2:8405") in [(t["job"], t["target"]) for t in out["targets"]]
