"""promtool (Prometheus' own checker, Debian's package, 2.42) on what d3_metrics renders: `promtool check config` on
prometheus.yml with its rules file, `promtool check rules`, `promtool test rules` with a firing and a quiet case for
every alert rule, and `amtool check-config` (Alertmanager's, Debian's 0.25) on alertmanager.yml.

Tier: quick. It starts neither Ansible nor podman, only promtool and amtool (static binaries, about 0.1 s a call):
`make check` puts them into .venv/bin first (`make promtool`: the binaries out of Debian's packages, no service)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from d3_metrics import metrics_alertmanager, metrics_rules, metrics_scrape
from test_metrics import ROUTERS, plan

ROOT = Path(__file__).resolve().parents[1]


def tool(name: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    path = shutil.which(name) or str(Path(sys.executable).parent / name)  # make promtool: the venv's bin
    if not Path(path).exists():
        pytest.fail(f"{name} is missing: run `make promtool` (the binaries out of Debian's packages)")
    return subprocess.run([path, *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False)


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return tool("promtool", *args, cwd=cwd)


@pytest.fixture
def rendered(tmp_path: Path, catalog_vars: dict[str, Any]) -> dict[str, Any]:
    fleet = {
        "l4-a": {"plan": plan(catalog_vars, [{"model": "d3-flash"}, {"model": "d3-mini"}], "l4-a"), "ansible_host": "10.0.0.11"},
        "l4-b": {"plan": plan(catalog_vars, [{"model": "d3-flash"}], "l4-b"), "ansible_host": "10.0.0.12"},
    }  # fmt: skip
    rules_path = tmp_path / "d3-rules.yml"
    out = metrics_scrape(fleet, "router1", ROUTERS, options={"rules_file": str(rules_path)})
    rules = metrics_rules(out["models"], {"slo_queue_ms": 2000, "rollout_stale_minutes": 60})
    assert out["errors"] == rules["errors"] == []
    rules_path.write_text(yaml.safe_dump(rules["rules"], sort_keys=False))
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(out["config"], sort_keys=False))
    return {"dir": tmp_path, "rules": rules["rules"]["groups"][0]["rules"]}


def test_promtool_checks_the_config_and_its_rules(rendered: dict[str, Any]) -> None:
    result = promtool("check", "config", "prometheus.yml", cwd=rendered["dir"])
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rendered['rules'])} rules found" in result.stdout + result.stderr


def test_promtool_refuses_a_broken_rule(rendered: dict[str, Any]) -> None:
    """The check can fail: a rule with a PromQL typo is refused (what `validate:` stops before the file is written)."""
    broken = {"groups": [{"name": "x", "rules": [dict(rendered["rules"][0], expr="up{job=")]}]}
    (rendered["dir"] / "d3-rules.yml").write_text(yaml.safe_dump(broken))
    result = promtool("check", "config", "prometheus.yml", cwd=rendered["dir"])
    assert result.returncode != 0


def _alert(name: str, summary: str, labels: dict[str, str], rules: list[dict[str, Any]], **extra: str) -> dict[str, Any]:
    rule = next(r for r in rules if r["alert"] == name and all(r["labels"].get(k) == v for k, v in extra.items()))
    return {"exp_labels": {**rule["labels"], **labels},
            "exp_annotations": {"runbook_url": rule["annotations"]["runbook_url"], "summary": summary}}  # fmt: skip


VLLM = 'host="l4-a", instance="d3-flash", model="d3-flash", job="d3-vllm"'
MINI = 'host="l4-a", instance="d3-mini", model="d3-mini", job="d3-vllm"'
FE = 'haproxy_frontend_http_responses_total{job="d3-router", host="router1", proxy='
FLASH = 'haproxy_server_status{job="d3-router", proxy="be_d3-flash", server='


def cases(rules: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One promtool unit test per rule: the series that make it fire, when it fires (after its `for:`), and a quiet
    twin (below the threshold, or not yet for long enough)."""
    who = {"host": "l4-a", "instance": "d3-flash", "model": "d3-flash", "job": "d3-vllm"}
    return [
        {"name": "instance down after for: 1m", "interval": "15s",
         "input_series": [{"series": f"up{{{VLLM}}}", "values": "1 1 0x10"},
                          {"series": f"up{{{MINI}}}", "values": "1x12"}],
         "alert_rule_test": [
             {"eval_time": "45s", "alertname": "D3InstanceDown", "exp_alerts": []},
             {"eval_time": "2m", "alertname": "D3InstanceDown",
              "exp_alerts": [_alert("D3InstanceDown", "d3-flash on l4-a does not answer /metrics", who, rules)]}]},
        {"name": "KV cache above 90 % for 10m", "interval": "1m",
         "input_series": [{"series": f'vllm:kv_cache_usage_perc{{{VLLM}, model_name="d3-flash", engine="0"}}', "values": "0.95x20"},
                          {"series": f"vllm:kv_cache_usage_perc{{{MINI}}}", "values": "0.5x20"}],
         "alert_rule_test": [
             {"eval_time": "5m", "alertname": "D3KvCacheHigh", "exp_alerts": []},
             {"eval_time": "12m", "alertname": "D3KvCacheHigh",
              "exp_alerts": [_alert("D3KvCacheHigh", "d3-flash on l4-a: KV cache 95% used",
                                    {"host": "l4-a", "instance": "d3-flash", "model": "d3-flash"}, rules)]}]},
        {"name": "queue time p99 above 2000 ms", "interval": "1m",
         # every request waits 2.5-5 s (bucket le=5 grows, le=2.5 does not); d3-mini's wait under 0.3 s
         "input_series": [{"series": f'vllm:request_queue_time_seconds_bucket{{{VLLM}, le="2.5"}}', "values": "0x20"},
                          {"series": f'vllm:request_queue_time_seconds_bucket{{{VLLM}, le="5.0"}}', "values": "0+60x20"},
                          {"series": f'vllm:request_queue_time_seconds_bucket{{{VLLM}, le="+Inf"}}', "values": "0+60x20"},
                          {"series": f'vllm:request_queue_time_seconds_bucket{{{MINI}, le="0.3"}}', "values": "0+60x20"},
                          {"series": f'vllm:request_queue_time_seconds_bucket{{{MINI}, le="+Inf"}}', "values": "0+60x20"}],
         "alert_rule_test": [
             {"eval_time": "4m", "alertname": "D3QueueTimeHigh", "exp_alerts": []},
             {"eval_time": "12m", "alertname": "D3QueueTimeHigh",
              "exp_alerts": [_alert("D3QueueTimeHigh", "d3-flash on l4-a: queue time p99 above 2000 ms",
                                    {"host": "l4-a", "instance": "d3-flash", "model": "d3-flash"}, rules)]}]},
        {"name": "5xx through the router", "interval": "1m",
         "input_series": [
             {"series": FE + '"fe_d3-flash", code="5xx"}', "values": "0+10x20"},
             {"series": FE + '"fe_d3-flash", code="2xx"}', "values": "0+90x20"},
             {"series": FE + '"fe_d3-mini", code="5xx"}', "values": "0+1x20"},
             {"series": FE + '"fe_d3-mini", code="2xx"}', "values": "0+99x20"}],
         "alert_rule_test": [
             {"eval_time": "3m", "alertname": "D3RouterErrors", "exp_alerts": []},
             {"eval_time": "12m", "alertname": "D3RouterErrors",
              "exp_alerts": [_alert("D3RouterErrors", "fe_d3-flash on router1: 10% of answers are 5xx",
                                    {"host": "router1", "proxy": "fe_d3-flash"}, rules)]}]},
        {"name": "GPU with ECC or Xid errors", "interval": "1m",
         "input_series": [
             {"series": 'd3_gpu_ecc_uncorrected_errors{job="d3-node", host="l4-a", instance="l4-a", gpu="0"}', "values": "0 0 2x5"},
             {"series": 'd3_gpu_ecc_uncorrected_errors{job="d3-node", host="l4-a", instance="l4-a", gpu="1"}', "values": "0x7"},
             {"series": 'd3_gpu_xid_events_total{job="d3-node", host="l4-b", instance="l4-b", gpu="3"}', "values": "0 0 0 1x4"}],
         "alert_rule_test": [
             {"eval_time": "1m", "alertname": "D3GpuErrors", "exp_alerts": []},
             {"eval_time": "5m", "alertname": "D3GpuErrors", "exp_alerts": [
                 _alert("D3GpuErrors", "GPU 0 on l4-a reports ECC or Xid errors",
                        {"job": "d3-node", "host": "l4-a", "instance": "l4-a", "gpu": "0"}, rules),
                 _alert("D3GpuErrors", "GPU 3 on l4-b reports ECC or Xid errors",
                        {"job": "d3-node", "host": "l4-b", "instance": "l4-b", "gpu": "3"}, rules)]}]},
        {"name": "an instance on another digest than most", "interval": "5m",
         "input_series": [
             {"series": 'd3_instance_image_info{job="d3-node", host="l4-a", instance="d3-flash", digest="sha256:aaa"}', "values": "1x12"},
             {"series": 'd3_instance_image_info{job="d3-node", host="l4-a", instance="d3-mini", digest="sha256:aaa"}', "values": "1x12"},
             {"series": 'd3_instance_image_info{job="d3-node", host="l4-b", instance="d3-flash", digest="sha256:bbb"}', "values": "1x12"}],
         "alert_rule_test": [
             {"eval_time": "25m", "alertname": "D3InstanceDigestDrift", "exp_alerts": []},
             {"eval_time": "35m", "alertname": "D3InstanceDigestDrift", "exp_alerts": [
                 _alert("D3InstanceDigestDrift", "d3-flash on l4-b runs sha256:bbb, not the fleet's digest",
                        {"job": "d3-node", "host": "l4-b", "instance": "d3-flash", "digest": "sha256:bbb"}, rules)]}]},
        {"name": "a rollout marker older than 60 minutes", "interval": "10m",
         # marked at t=600 s on l4-a: stale from 600 + 3600 on; l4-b's marker is new at t=3600
         "input_series": [
             {"series": 'd3_rollout_marker_timestamp_seconds{job="d3-node", host="l4-a", instance="l4-a"}', "values": "_ 600x9"},
             {"series": 'd3_rollout_marker_timestamp_seconds{job="d3-node", host="l4-b", instance="l4-b"}', "values": "_x5 3600x4"}],
         "alert_rule_test": [
             {"eval_time": "60m", "alertname": "D3RolloutStale", "exp_alerts": []},
             {"eval_time": "80m", "alertname": "D3RolloutStale", "exp_alerts": [
                 _alert("D3RolloutStale", "l4-a carries a rollout marker older than 60 minutes",
                        {"job": "d3-node", "host": "l4-a", "instance": "l4-a"}, rules)]}]},
        {"name": "a model with fewer UP servers than replicas", "interval": "1m",
         "input_series": [
             {"series": FLASH + '"l4-a-d3-flash", state="UP"}', "values": "1x12"},
             {"series": FLASH + '"l4-b-d3-flash", state="UP"}', "values": "1 1 0x10"},
             {"series": FLASH + '"l4-b-d3-flash", state="DRAIN"}', "values": "0 0 1x10"},
             {"series": 'haproxy_server_status{job="d3-router", proxy="be_d3-mini", server="l4-a-d3-mini", state="UP"}', "values": "1x12"}],
         "alert_rule_test": [
             {"eval_time": "5m", "alertname": "D3ModelReplicasMissing", "exp_alerts": []},
             {"eval_time": "8m", "alertname": "D3ModelReplicasMissing", "exp_alerts": [
                 _alert("D3ModelReplicasMissing", "d3-flash: fewer than its 2 replicas are UP in the router", {}, rules,
                        model="d3-flash")]}]},
        {"name": "a model whose router lists no server at all", "interval": "1m",
         "input_series": [
             {"series": FLASH + '"l4-a-d3-flash", state="UP"}', "values": "1x12"},
             {"series": FLASH + '"l4-b-d3-flash", state="UP"}', "values": "1x12"}],
         "alert_rule_test": [
             {"eval_time": "6m", "alertname": "D3ModelReplicasMissing", "exp_alerts": [
                 _alert("D3ModelReplicasMissing", "d3-mini: fewer than its 1 replicas are UP in the router", {}, rules,
                        model="d3-mini")]}]},
    ]  # fmt: skip


def test_every_rule_fires_and_stays_quiet_as_its_promtool_cases_say(rendered: dict[str, Any]) -> None:
    tests = cases(rendered["rules"])
    assert {a["alertname"] for t in tests for a in t["alert_rule_test"]} == {r["alert"] for r in rendered["rules"]}
    spec = {"rule_files": ["d3-rules.yml"], "evaluation_interval": "15s", "tests": tests}
    (rendered["dir"] / "tests.yml").write_text(yaml.safe_dump(spec, sort_keys=False))
    result = promtool("test", "rules", "tests.yml", cwd=rendered["dir"])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_the_cases_can_fail(rendered: dict[str, Any]) -> None:
    """A case that expects the wrong thing fails: promtool really compares labels and annotations."""
    tests = cases(rendered["rules"])[:1]
    tests[0]["alert_rule_test"][1]["exp_alerts"][0]["exp_labels"]["host"] = "l4-z"
    spec = {"rule_files": ["d3-rules.yml"], "evaluation_interval": "15s", "tests": tests}
    (rendered["dir"] / "tests.yml").write_text(yaml.safe_dump(spec, sort_keys=False))
    assert promtool("test", "rules", "tests.yml", cwd=rendered["dir"]).returncode != 0


def test_amtool_checks_the_alertmanager_config(tmp_path: Path) -> None:
    out = metrics_alertmanager([{"name": "lab", "url": "http://127.0.0.1:9099/alerts"},
                                {"name": "pager", "url": "https://pager.example/hook"}])  # fmt: skip
    assert out["errors"] == []
    (tmp_path / "alertmanager.yml").write_text(yaml.safe_dump(out["config"]))
    result = tool("amtool", "check-config", "alertmanager.yml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert " - 2 receivers" in result.stdout
    (tmp_path / "alertmanager.yml").write_text(yaml.safe_dump({**out["config"], "receivers": []}))
    assert tool("amtool", "check-config", "alertmanager.yml", cwd=tmp_path).returncode != 0
