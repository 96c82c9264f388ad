# ruff: noqa: E501  (each promtool case keeps its series and expectations on the lines a reader compares)
"""promtool (Prometheus' own checker, Debian's package, 2.42) on what d3_metrics renders: `promtool check config` on
prometheus.yml with its rules file, `promtool check rules`, `promtool test rules` with a firing and a quiet case for
every rule (issue 32's list among them: two routers with one replica down on one of them; no routers; a rollout
restart within its cold start and one that overruns it; a wedged engine; a GPU off the bus; one model all-5xx at 3 %
of the traffic; a host down giving one notification group), and `amtool check-config` (Alertmanager's, Debian's
0.25) on alertmanager.yml.

Tier: quick. It starts neither Ansible nor podman, only promtool and amtool (static binaries, about 0.1 s a call):
`make check` puts them into .venv/bin first (`make promtool`: the binaries out of Debian's packages, no service)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from d3_metrics import metrics_alertmanager, metrics_rules, metrics_scrape
from test_metrics import plan

ROOT = Path(__file__).resolve().parents[1]
BOOK = "https://wiki.example/d3-fleet/runbook.md"
ROUTERS = {"r1": {"ansible_host": "10.0.0.5"}, "r2": {"ansible_host": "10.0.0.6"}}


def tool(name: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    path = shutil.which(name) or str(Path(sys.executable).parent / name)  # make promtool: the venv's bin
    if not Path(path).exists():
        pytest.fail(f"{name} is missing: run `make promtool` (the binaries out of Debian's packages)")
    return subprocess.run([path, *args], cwd=cwd, capture_output=True, text=True, timeout=300, check=False)


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return tool("promtool", *args, cwd=cwd)


def render(tmp_path: Path, catalog_vars: dict[str, Any], routers: Any = ROUTERS) -> dict[str, Any]:
    """l4-a: d3-flash (GPU 0), d3-mini (GPU 1); l4-b: d3-flash (GPU 2), d3-27b (GPUs 0, 1); two routers, monitor mon."""
    fleet = {
        "l4-a": {"plan": plan(catalog_vars, [{"model": "d3-flash"}, {"model": "d3-mini"}], "l4-a"), "ansible_host": "10.0.0.11"},
        "l4-b": {"plan": plan(catalog_vars, [{"model": "d3-flash"}, {"model": "d3"}], "l4-b"), "ansible_host": "10.0.0.12"},
    }  # fmt: skip
    rules_path = tmp_path / "d3-rules.yml"
    out = metrics_scrape(fleet, "mon", routers, {"mon": {}}, {"rules_file": str(rules_path)})
    rules = metrics_rules(out["models"], {"runbook_url": BOOK})
    assert out["errors"] == rules["errors"] == []
    rules_path.write_text(yaml.safe_dump(rules["rules"], sort_keys=False))
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(out["config"], sort_keys=False))
    return {"dir": tmp_path, "rules": rules["rules"]["groups"][0]["rules"], "targets": out["targets"]}


@pytest.fixture
def rendered(tmp_path: Path, catalog_vars: dict[str, Any]) -> dict[str, Any]:
    return render(tmp_path, catalog_vars)


def test_promtool_checks_the_config_and_its_rules(rendered: dict[str, Any]) -> None:
    result = promtool("check", "config", "prometheus.yml", cwd=rendered["dir"])
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rendered['rules'])} rules found" in result.stdout + result.stderr


def test_promtool_refuses_a_broken_rule(rendered: dict[str, Any]) -> None:
    """The check can fail: a rule with a PromQL typo is refused (what `validate:` stops before the file is written)."""
    broken = {"groups": [{"name": "x", "rules": [dict(rendered["rules"][-1], expr="up{job=")]}]}
    (rendered["dir"] / "d3-rules.yml").write_text(yaml.safe_dump(broken))
    result = promtool("check", "config", "prometheus.yml", cwd=rendered["dir"])
    assert result.returncode != 0


def summary(rule: dict[str, Any], labels: dict[str, str], value: str) -> str:
    """The rule's summary as Prometheus renders it for these labels and value (the templates the rules use)."""
    text = re.sub(r"\{\{ if \$labels\.(\w+) \}\}(.*?)\{\{ else \}\}(.*?)\{\{ end \}\}",
                  lambda m: m.group(2) if labels.get(m.group(1)) else m.group(3), rule["annotations"]["summary"])
    text = text.replace("{{ $value | humanizePercentage }}", value).replace("{{ $value }}", value)
    return re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels.get(m.group(1), ""), text)


def exp(rules: list[dict[str, Any]], name: str, labels: dict[str, str], value: str = "", **which: str) -> dict[str, Any]:
    """The alert promtool must see: the series' labels + the rule's, its summary and runbook link."""
    rule = next(r for r in rules if r.get("alert") == name and all(r["labels"].get(k) == v for k, v in which.items()))
    every = {**labels, **rule["labels"]}
    return {"exp_labels": every, "exp_annotations": {"runbook_url": rule["annotations"]["runbook_url"],
                                                     "summary": summary(rule, every, value)}}  # fmt: skip


def inst(host: str, name: str, model: str) -> dict[str, str]:
    return {"job": "d3-vllm", "host": host, "instance": f"{host}/{name}", "name": name, "model": model}


FLASH_A, MINI_A = inst("l4-a", "d3-flash", "d3-flash"), inst("l4-a", "d3-mini", "d3-mini")
FLASH_B, BIG_B = inst("l4-b", "d3-flash", "d3-flash"), inst("l4-b", "d3-27b", "d3-27b")
INSTANCES = (FLASH_A, MINI_A, FLASH_B, BIG_B)


def series(metric: str, labels: dict[str, str], values: str) -> dict[str, str]:
    return {"series": metric + "{" + ", ".join(f'{k}="{v}"' for k, v in labels.items()) + "}", "values": values}


def node(host: str) -> dict[str, str]:
    return {"job": "d3-node", "host": host, "instance": host}


def router(host: str) -> dict[str, str]:
    return {"job": "d3-router", "host": host, "instance": host}


def server_status(rt: str, backend: str, server: str, state: str, values: str) -> dict[str, str]:
    return series("haproxy_server_status", {**router(rt), "proxy": backend, "server": server, "state": state}, values)


def test_case(name: str, interval: str, inputs: list[dict[str, str]], checks: list[tuple[str, str, list[Any]]]) -> dict[str, Any]:
    return {"name": name, "interval": interval, "input_series": inputs,
            "alert_rule_test": [{"eval_time": t, "alertname": a, "exp_alerts": e} for t, a, e in checks]}  # fmt: skip


test_case.__test__ = False  # type: ignore[attr-defined]  # a builder, not a test


def cases(rules: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The promtool unit tests: the series that make each rule fire, when, and a quiet twin for every rule."""
    r = rules
    every_up = [series("up", i, "1x40") for i in INSTANCES]
    out = [
        test_case("the Watchdog always fires", "1m", [], [("0m", "Watchdog", [exp(r, "Watchdog", {})])]),
        test_case("a host down (its node exporter), another up", "15s",
                  [series("up", node("l4-b"), "1 1 0x20"), series("up", node("l4-a"), "1x22")],
                  [("45s", "D3HostDown", []), ("2m", "D3HostDown", [exp(r, "D3HostDown", node("l4-b"))])]),
        test_case("a router down, the other up", "15s",
                  [series("up", router("r2"), "1 0x20"), series("up", router("r1"), "1x21")],
                  [("30s", "D3RouterDown", []), ("2m", "D3RouterDown", [exp(r, "D3RouterDown", router("r2"))])]),
        test_case("a router host down: its exporter's scrape failed first, its node exporter's one scrape later", "15s",
                  [series("up", router("r2"), "1 0x20"), series("up", node("r2"), "1 1 0x19"),
                   series("up", {"job": "d3-dcgm", "host": "r2", "instance": "r2"}, "1 0x20")],
                  [("2m", "D3RouterDown", []), ("2m", "D3TargetDown", []),
                   ("2m", "D3HostDown", [exp(r, "D3HostDown", node("r2"))])]),
        test_case("Alertmanager down, Prometheus up", "15s",
                  [series("up", {"job": "d3-alertmanager", "host": "mon", "instance": "mon"}, "0x20"),
                   series("up", {"job": "d3-prometheus", "host": "mon", "instance": "mon"}, "1x20")],
                  [("30s", "D3TargetDown", []), ("2m", "D3TargetDown", [exp(r, "D3TargetDown",
                   {"job": "d3-alertmanager", "host": "mon", "instance": "mon"})])]),
        # a rollout restart: d3-27b (52.2 GB: 151 s expected, 303 s held) down 150 s, then d3-flash down 100 s (within
        # its 113 s) and up; the overrun: d3-flash on l4-b never comes back, d3-mini down past its 1m floor
        test_case("a restart within its cold start does not page", "30s",
                  [series("up", BIG_B, "1 0x5 1x14"), series("up", FLASH_A, "1x7 0 0 0 1x9")],
                  [("4m", "D3InstanceDown", []), ("9m", "D3InstanceDown", [])]),
        test_case("a restart that overruns its cold start pages", "30s",
                  [series("up", FLASH_B, "1 0x19"), series("up", MINI_A, "1 1 0x18")],
                  [("90s", "D3InstanceDown", []),
                   ("3m", "D3InstanceDown", [exp(r, "D3InstanceDown", FLASH_B, model="d3-flash"),
                                             exp(r, "D3InstanceDown", MINI_A, model="d3-mini")])]),
        test_case("d3-27b down past its 303 s", "30s", [series("up", BIG_B, "1 0x19")],
                  [("5m", "D3InstanceDown", []), ("6m", "D3InstanceDown", [exp(r, "D3InstanceDown", BIG_B, model="d3-27b")])]),
        test_case("KV cache above 90 % for 10m", "1m",
                  [series("vllm:kv_cache_usage_perc", {**FLASH_A, "model_name": "d3-flash", "engine": "0"}, "0.95x20"),
                   series("vllm:kv_cache_usage_perc", MINI_A, "0.5x20")],
                  [("5m", "D3KvCacheHigh", []), ("12m", "D3KvCacheHigh", [exp(r, "D3KvCacheHigh",
                   {k: v for k, v in FLASH_A.items() if k != "job"}, "95%")])]),
        # every request waits 2.5-5 s (bucket le=5 grows, le=2.5 does not); d3-mini's wait under 0.3 s
        test_case("queue time p99 above 2000 ms", "1m",
                  [series("vllm:request_queue_time_seconds_bucket", {**FLASH_A, "le": "2.5"}, "0x20"),
                   series("vllm:request_queue_time_seconds_bucket", {**FLASH_A, "le": "5.0"}, "0+60x20"),
                   series("vllm:request_queue_time_seconds_bucket", {**FLASH_A, "le": "+Inf"}, "0+60x20"),
                   series("vllm:request_queue_time_seconds_bucket", {**MINI_A, "le": "0.3"}, "0+60x20"),
                   series("vllm:request_queue_time_seconds_bucket", {**MINI_A, "le": "+Inf"}, "0+60x20")],
                  [("4m", "D3QueueTimeHigh", []), ("12m", "D3QueueTimeHigh", [exp(r, "D3QueueTimeHigh",
                   {k: v for k, v in FLASH_A.items() if k != "job"})])]),
        # the wedged engine: d3-flash on l4-a holds 2 running and 3 waiting and finishes nothing (its queue-time
        # histogram, recorded when a request finishes, stays flat: D3QueueTimeHigh has nothing to read); d3-mini is
        # as busy and finishes 60 a minute; d3-flash on l4-b is idle
        test_case("a wedged engine: requests held, none finishing", "1m",
                  [series("up", FLASH_A, "1x12"), series("up", MINI_A, "1x12"), series("up", FLASH_B, "1x12"),
                   series("vllm:num_requests_running", FLASH_A, "0 2x12"), series("vllm:num_requests_waiting", FLASH_A, "0 3x12"),
                   series("vllm:request_success_total", {**FLASH_A, "finished_reason": "stop"}, "7x12"),
                   series("vllm:num_requests_running", MINI_A, "2x12"), series("vllm:num_requests_waiting", MINI_A, "0x12"),
                   series("vllm:request_success_total", {**MINI_A, "finished_reason": "stop"}, "0+60x12"),
                   series("vllm:num_requests_running", FLASH_B, "0x12"), series("vllm:num_requests_waiting", FLASH_B, "0x12"),
                   series("vllm:request_success_total", {**FLASH_B, "finished_reason": "stop"}, "3x12")],
                  [("4m", "D3EngineStalled", []), ("7m", "D3EngineStalled", [exp(r, "D3EngineStalled", FLASH_A)]),
                   ("4m", "D3QueueTimeHigh", [])]),
        # an instance killed (or frozen) with requests running: its scrape fails, its series go stale, and the last
        # sample alone must not read as a window of held requests (D3InstanceDown's page; the lab's frozen instance
        # paged D3EngineStalled, 2026-12-05); nor a window only partly covered (an instance just started, busy)
        test_case("an instance whose scrape fails with requests running is not a wedged engine", "15s",
                  [series("up", FLASH_A, "1x4 0x30"), series("vllm:num_requests_running", FLASH_A, "2x4 stale"),
                   series("vllm:num_requests_waiting", FLASH_A, "1x4 stale"),
                   series("vllm:request_success_total", {**FLASH_A, "finished_reason": "stop"}, "7x4 stale"),
                   series("up", MINI_A, "_x10 1x20"), series("vllm:num_requests_running", MINI_A, "_x10 2x20"),
                   series("vllm:request_success_total", {**MINI_A, "finished_reason": "stop"}, "_x10 0x20")],
                  [("90s", "D3EngineStalled", []), ("3m", "D3EngineStalled", []), ("6m", "D3EngineStalled", [])]),
        # a wedged engine whose /metrics misses one scrape stays firing (no resolution and second page; the third
        # review: `up == 1` resolved it for that evaluation)
        test_case("a wedged engine whose /metrics misses one scrape", "15s",
                  [series("up", FLASH_A, "1x30 0 1x30"), series("vllm:num_requests_running", FLASH_A, "2x30 stale 2x30"),
                   series("vllm:num_requests_waiting", FLASH_A, "0x30 stale 0x30"),
                   series("vllm:request_success_total", {**FLASH_A, "finished_reason": "stop"}, "7x30 stale 7x30")],
                  [(at, "D3EngineStalled", [exp(r, "D3EngineStalled", FLASH_A)]) for at in ("7m15s", "7m30s", "7m45s", "8m")]),
        test_case("requests waiting in vLLM for 5m", "1m",
                  [series("vllm:num_requests_waiting", FLASH_A, "0 3x10"), series("vllm:num_requests_waiting", MINI_A, "0x11")],
                  [("4m", "D3RequestsWaiting", []), ("7m", "D3RequestsWaiting", [exp(r, "D3RequestsWaiting",
                   {k: v for k, v in FLASH_A.items() if k != "job"}, "3")])]),
        test_case("HAProxy's queue for one model", "1m",
                  [series("haproxy_backend_current_queue", {**router("r1"), "proxy": "be_d3-flash"}, "0 4x10"),
                   series("haproxy_backend_current_queue", {**router("r1"), "proxy": "be_d3-mini"}, "0x11")],
                  [("4m", "D3RouterQueue", []), ("7m", "D3RouterQueue", [exp(r, "D3RouterQueue",
                   {**router("r1"), "proxy": "be_d3-flash", "model": "d3-flash"}, "4")])]),
        # one model all-5xx at 3 % of the traffic: d3-mini 3 req/s all 5xx, d3-flash 97 req/s all 2xx (the frontend's
        # ratio is 3 %, under 5 %); quiet: d3-27b 1 % 5xx, and a model all-5xx at 0.05 req/s (under the minimum rate)
        test_case("one model all 5xx at 3 % of the traffic", "1m",
                  [series("haproxy_backend_http_responses_total", {**router("r1"), "proxy": "be_d3-mini", "code": "5xx"}, "0+180x20"),
                   series("haproxy_backend_http_responses_total", {**router("r1"), "proxy": "be_d3-mini", "code": "2xx"}, "0x20"),
                   series("haproxy_backend_http_responses_total", {**router("r1"), "proxy": "be_d3-flash", "code": "2xx"}, "0+5820x20"),
                   series("haproxy_backend_http_responses_total", {**router("r1"), "proxy": "be_d3-27b", "code": "5xx"}, "0+60x20"),
                   series("haproxy_backend_http_responses_total", {**router("r1"), "proxy": "be_d3-27b", "code": "2xx"}, "0+5940x20"),
                   series("haproxy_backend_http_responses_total", {**router("r2"), "proxy": "be_d3-mini", "code": "5xx"}, "0+3x20")],
                  [("4m", "D3RouterErrors", []), ("12m", "D3RouterErrors", [exp(r, "D3RouterErrors",
                   {"host": "r1", "proxy": "be_d3-mini", "model": "d3-mini"}, "100%")])]),
        test_case("uncorrected ECC errors", "1m",
                  [series("d3_gpu_ecc_uncorrected_errors", {**node("l4-a"), "gpu": "0"}, "0 0 2x5"),
                   series("d3_gpu_ecc_uncorrected_errors", {**node("l4-a"), "gpu": "1"}, "0x7")],
                  [("1m", "D3GpuEccErrors", []), ("5m", "D3GpuEccErrors", [exp(r, "D3GpuEccErrors",
                   {**node("l4-a"), "gpu": "0"}, "2")])]),
        # Xid 79 (off the bus: critical) and 13 (an application's fault: warning); both kept until acknowledged (the
        # collector counts lines after the acknowledgement), not for 30 minutes
        test_case("Xid events, kept until acknowledged", "1m",
                  [series("d3_gpu_xid_events_total", {**node("l4-b"), "pci_bus": "0000:00:07", "gpu": "1", "xid": "79"}, "0 1x80 0x5"),
                   series("d3_gpu_xid_events_total", {**node("l4-a"), "pci_bus": "0000:00:06", "gpu": "0", "xid": "13"}, "0 0 2x84"),
                   series("d3_gpu_xid_events_total", {**node("l4-a"), "pci_bus": "0000:00:07", "gpu": "1", "xid": "48"}, "0x86")],
                  [("0m", "D3GpuXidCritical", []), ("70m", "D3GpuXidCritical", [exp(r, "D3GpuXidCritical",
                   {**node("l4-b"), "pci_bus": "0000:00:07", "gpu": "1", "xid": "79"}, "1")]), ("84m", "D3GpuXidCritical", []),
                   ("1m", "D3GpuXid", []), ("70m", "D3GpuXid", [exp(r, "D3GpuXid",
                   {**node("l4-a"), "pci_bus": "0000:00:06", "gpu": "0", "xid": "13"}, "2")])]),
        test_case("dcgm-exporter's last Xid: 79 is critical, 13 a warning", "1m",
                  [series("DCGM_FI_DEV_XID_ERRORS", {"job": "d3-dcgm", "host": "l4-b", "instance": "l4-b", "gpu": "1"}, "0 79x5"),
                   series("DCGM_FI_DEV_XID_ERRORS", {"job": "d3-dcgm", "host": "l4-a", "instance": "l4-a", "gpu": "0"}, "0 13x5")],
                  [("0m", "D3GpuXidCritical", []), ("2m", "D3GpuXidCritical", [exp(r, "D3GpuXidCritical",
                   {"job": "d3-dcgm", "host": "l4-b", "instance": "l4-b", "gpu": "1"}, "79")]),
                   ("2m", "D3GpuXid", [exp(r, "D3GpuXid", {"job": "d3-dcgm", "host": "l4-a", "instance": "l4-a", "gpu": "0"}, "13")])]),
        # a GPU off the bus: nvidia-smi on l4-b fails (no rows, success 0 naming it); on l4-a it lists 1 GPU of the
        # plan's 2; a router runs no nvidia-smi (success 1)
        test_case("a GPU off the bus: nvidia-smi fails or lists fewer GPUs than the plan uses", "30s",
                  [series("d3_textfile_success", node("l4-b"), "1 1 stale"), series("d3_textfile_success", {**node("l4-b"), "failed": "nvidia-smi"}, "_ _ 0x10"),
                   series("d3_textfile_success", node("r1"), "1x12"), series("d3_textfile_success", node("l4-a"), "1x12")] +
                  [series("d3_gpu_memory_total_bytes", {**node("l4-b"), "gpu": str(g)}, "24e9 24e9 stale") for g in (0, 1, 2)] +
                  [series("d3_gpu_memory_total_bytes", {**node("l4-a"), "gpu": "0"}, "24e9x12"),
                   series("d3_gpu_memory_total_bytes", {**node("l4-a"), "gpu": "1"}, "24e9 24e9 stale")],
                  [("45s", "D3GpuQueryFailed", []), ("3m", "D3GpuQueryFailed", [exp(r, "D3GpuQueryFailed",
                   {**node("l4-b"), "failed": "nvidia-smi"})]),
                   ("45s", "D3GpuLost", []), ("3m", "D3GpuLost", [exp(r, "D3GpuLost", {"host": "l4-a"}, "1")])]),
        test_case("the textfile stale on one host, missing on another, fresh on a third", "30s",
                  [series("node_textfile_mtime_seconds", {**node("l4-a"), "file": "/var/lib/prometheus/node-exporter/d3.prom"}, "0x12"),
                   series("d3_textfile_success", node("l4-a"), "1x12"),
                   series("node_textfile_mtime_seconds", {**node("l4-b"), "file": "/var/lib/prometheus/node-exporter/d3.prom"}, "0+30x12"),
                   series("d3_textfile_success", node("l4-b"), "1x12"),
                   series("up", node("r1"), "1x12")],
                  [("1m", "D3TextfileStale", [exp(r, "D3TextfileStale", node("r1"), "1")]),
                   ("3m", "D3TextfileStale", [exp(r, "D3TextfileStale", {**node("l4-a"), "file": "/var/lib/prometheus/node-exporter/d3.prom"}, "180"),
                                              exp(r, "D3TextfileStale", node("r1"), "1")])]),
        test_case("the textfile cannot read the deployment record", "30s",
                  [series("d3_textfile_success", {**node("l4-a"), "failed": "state"}, "0x10"), series("d3_textfile_success", node("l4-b"), "1x10")],
                  [("30s", "D3TextfileFailed", []), ("2m", "D3TextfileStale", []), ("2m", "D3TextfileFailed", [exp(r, "D3TextfileFailed", {**node("l4-a"), "failed": "state"})])]),
        test_case("an instance on another digest than most", "5m",
                  [series("d3_instance_image_info", {**node("l4-a"), "name": "d3-flash", "digest": "sha256:aaa"}, "1x12"),
                   series("d3_instance_image_info", {**node("l4-a"), "name": "d3-mini", "digest": "sha256:aaa"}, "1x12"),
                   series("d3_instance_image_info", {**node("l4-b"), "name": "d3-flash", "digest": "sha256:bbb"}, "1x12")],
                  [("25m", "D3InstanceDigestDrift", []), ("35m", "D3InstanceDigestDrift", [exp(r, "D3InstanceDigestDrift",
                   {**node("l4-b"), "name": "d3-flash", "digest": "sha256:bbb"})])]),
        # marked at t=600 s on l4-a: stale from 600 + 3600 on; l4-b's marker is new at t=3600
        test_case("a rollout marker older than 60 minutes", "10m",
                  [series("d3_rollout_marker_timestamp_seconds", node("l4-a"), "_ 600x9"),
                   series("d3_rollout_marker_timestamp_seconds", node("l4-b"), "_x5 3600x4")],
                  [("60m", "D3RolloutStale", []), ("80m", "D3RolloutStale", [exp(r, "D3RolloutStale", node("l4-a"))])]),
        # a nightly that renamed every metric on l4-b's d3-flash (it answers /metrics); l4-a's keeps them all
        test_case("an instance answering /metrics without the metrics the rules read", "1m",
                  [series("up", FLASH_B, "1x10"), series("up", FLASH_A, "1x10")] +
                  [series(m, FLASH_A, "1x10") for m in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                   "vllm:kv_cache_usage_perc", "vllm:request_success_total")] +
                  [series("vllm:request_queue_time_seconds_bucket", {**FLASH_A, "le": "+Inf"}, "1x10")],
                  [("3m", "D3VllmMetricMissing", []), ("6m", "D3VllmMetricMissing", [
                      exp(r, "D3VllmMetricMissing", FLASH_B, metric=m) for m in (
                          "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                          "vllm:request_queue_time_seconds_bucket", "vllm:request_success_total")])]),
        # two routers, d3-flash's replica on l4-b down on r1 only (r2 still has both UP); r1 has no server for d3-mini
        # at all (a configuration older than the model) and d3-27b's DOWN; r2 has both
        test_case("two routers, one replica down on one of them", "1m",
                  every_up + [series("up", router(h), "1x12") for h in ("r1", "r2")] +
                  [server_status(rt, "be_d3-flash", f"{h}-d3-flash", "UP", "1x12") for rt in ("r1", "r2") for h in ("l4-a",)] +
                  [server_status("r1", "be_d3-flash", "l4-b-d3-flash", "UP", "1 1 0x10"), server_status("r1", "be_d3-flash", "l4-b-d3-flash", "DOWN", "0 0 1x10"),
                   server_status("r2", "be_d3-flash", "l4-b-d3-flash", "UP", "1x12"),
                   server_status("r1", "be_d3-27b", "l4-b-d3-27b", "UP", "0x12"), server_status("r1", "be_d3-27b", "l4-b-d3-27b", "DOWN", "1x12"),
                   server_status("r2", "be_d3-27b", "l4-b-d3-27b", "UP", "1x12"), server_status("r2", "be_d3-mini", "l4-a-d3-mini", "UP", "1x12")],
                  [("5m", "D3ModelReplicasMissing", [exp(r, "D3ModelReplicasMissing", {"host": "r1", "proxy": "be_d3-27b"}, "0", model="d3-27b"),
                                                     exp(r, "D3ModelReplicasMissing", {"host": "r1"}, "0", model="d3-mini")]),
                   ("8m", "D3ModelReplicasMissing", [exp(r, "D3ModelReplicasMissing", {"host": "r1", "proxy": "be_d3-flash"}, "1", model="d3-flash"),
                                                     exp(r, "D3ModelReplicasMissing", {"host": "r1", "proxy": "be_d3-27b"}, "0", model="d3-27b"),
                                                     exp(r, "D3ModelReplicasMissing", {"host": "r1"}, "0", model="d3-mini")])]),
        # no router in the inventory: every instance up, nothing about routers or replicas fires
        test_case("no routers: nothing wrong", "1m", every_up + [series("up", node(h), "1x40") for h in ("l4-a", "l4-b")],
                  [("12m", a, []) for a in ("D3ModelReplicasMissing", "D3RouterDown", "D3RouterErrors", "D3RouterQueue",
                                            "D3HostDown", "D3InstanceDown", "D3TargetDown")]),
        # a host down: its node exporter and its instances stop answering; the routers mark its servers DOWN. Its
        # replicas are no longer answering, so no replica alert: D3HostDown, and D3InstanceDown (which Alertmanager's
        # inhibition silences: test_a_host_down_gives_one_notification_group)
        test_case("a host down", "1m",
                  [series("up", node("l4-b"), "1 0x10"), series("up", FLASH_B, "1 0x10"), series("up", BIG_B, "1 0x10"),
                   series("up", FLASH_A, "1x10"), series("up", MINI_A, "1x10"), series("up", node("l4-a"), "1x10"),
                   series("d3_textfile_success", node("l4-a"), "1x10")] +
                  [series(m, i, "0x10") for i in (FLASH_A, MINI_A) for m in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                   "vllm:kv_cache_usage_perc", "vllm:request_success_total", "vllm:request_queue_time_seconds_bucket")] +
                  [
                   series("up", router("r1"), "1x10"), server_status("r1", "be_d3-flash", "l4-a-d3-flash", "UP", "1x10"),
                   server_status("r1", "be_d3-flash", "l4-b-d3-flash", "UP", "1 0x10"), server_status("r1", "be_d3-27b", "l4-b-d3-27b", "UP", "1 0x10"),
                   server_status("r1", "be_d3-mini", "l4-a-d3-mini", "UP", "1x10")],
                  [("8m", "D3HostDown", [exp(r, "D3HostDown", node("l4-b"))]), ("8m", "D3ModelReplicasMissing", []),
                   ("8m", "D3InstanceDown", [])]),
        # d3-mini's D3InstanceDown waits the 1m floor, as long as D3HostDown: when its scrape fails one interval before
        # the node exporter's it would fire first and notify before the inhibition's source exists (the SRE review of
        # 2026-12-05, on Alertmanager 0.25: two notifications); `unless` the host's node exporter is down holds it
        test_case("a host down whose instance's scrape failed first", "15s",
                  [series("up", node("l4-a"), "1 1 0x20"), series("up", MINI_A, "1 0x21")],
                  [("75s", "D3HostDown", []), ("75s", "D3InstanceDown", []),
                   ("90s", "D3HostDown", [exp(r, "D3HostDown", node("l4-a"))]), ("90s", "D3InstanceDown", [])]),
        # a host back from a reboot: D3InstanceDown's for: starts again when the host answers (an inhibition lifted
        # by D3HostDown's resolution would otherwise let an instance still starting page at once), and an instance
        # that stays down past its cold start after that pages
        test_case("a host rebooting, its instance back within its cold start after the host", "15s",
                  [series("up", node("l4-a"), "1 0x5 1x20"), series("up", MINI_A, "1 0x9 1x10")],
                  [("75s", "D3HostDown", [exp(r, "D3HostDown", node("l4-a"))]), ("120s", "D3HostDown", []),
                   ("120s", "D3InstanceDown", []), ("165s", "D3InstanceDown", [])]),
        test_case("a host back from a reboot, its instance down past its cold start", "15s",
                  [series("up", node("l4-a"), "1 0x5 1x20"), series("up", MINI_A, "1 0x30")],
                  [("180s", "D3InstanceDown", []), ("195s", "D3InstanceDown", [exp(r, "D3InstanceDown", MINI_A, model="d3-mini")])]),
        # a live host whose node exporter misses one scrape in 16 (a timeout while it loads weights) does not hold a
        # down instance's alert: only more than half of D3HostDown's for: failed does (the SRE review's case D)
        test_case("a node exporter missing a scrape now and then beside a down instance", "15s",
                  [series("up", node("l4-b"), "1x15 0 1x15 0 1x15 0 1x15 0 1x15 0 1x15"), series("up", BIG_B, "1x3 0x100")],
                  [("5m", "D3InstanceDown", []), ("8m", "D3InstanceDown", [exp(r, "D3InstanceDown", BIG_B, model="d3-27b")]),
                   ("20m", "D3HostDown", [])]),
    ]  # fmt: skip
    return out


# cases over an hour or more, whose rules hold for whole minutes: evaluated every minute, not every 15 s (the rest)
SLOW = ("Xid events, kept until acknowledged", "an instance on another digest than most", "a rollout marker older than 60 minutes")


def run_cases(rendered: dict[str, Any], tests: list[dict[str, Any]]) -> subprocess.CompletedProcess[str]:
    """promtool test rules on the cases: the long ones in a file evaluated every minute, the others every 15 s (the
    default evaluation interval); one result, both files' output."""
    files = []
    for name, every, part in (("tests.yml", "15s", [t for t in tests if t["name"] not in SLOW]),
                              ("tests-long.yml", "1m", [t for t in tests if t["name"] in SLOW])):  # fmt: skip
        if part:
            (rendered["dir"] / name).write_text(yaml.safe_dump({"rule_files": ["d3-rules.yml"], "evaluation_interval": every,
                                                                "tests": part}, sort_keys=False))  # fmt: skip
            files.append(name)
    return promtool("test", "rules", *files, cwd=rendered["dir"])


def test_every_rule_fires_and_stays_quiet_as_its_promtool_cases_say(rendered: dict[str, Any]) -> None:
    tests = cases(rendered["rules"])
    alerts = [r for r in rendered["rules"] if "alert" in r]
    # every rule (each per-model and per-metric rule on its own) has a case where it fires and one where it is quiet
    fired = [(a["alertname"], e["exp_labels"]) for t in tests for a in t["alert_rule_test"] for e in a["exp_alerts"]]
    quiet = {a["alertname"] for t in tests for a in t["alert_rule_test"] if not a["exp_alerts"]}
    for rule in alerts:
        own = {k: v for k, v in rule["labels"].items() if k in ("model", "metric")}
        assert any(n == rule["alert"] and all(labels.get(k) == v for k, v in own.items()) for n, labels in fired), rule
        assert rule["alert"] in quiet or rule["alert"] == "Watchdog", rule["alert"]
    result = run_cases(rendered, tests)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_the_cases_can_fail(rendered: dict[str, Any]) -> None:
    """A case that expects the wrong thing fails: promtool really compares labels and annotations."""
    tests = cases(rendered["rules"])[1:2]
    tests[0]["alert_rule_test"][1]["exp_alerts"][0]["exp_labels"]["host"] = "l4-z"
    assert run_cases(rendered, tests).returncode != 0


def test_the_wedged_engine_case_fails_against_the_old_queue_time_rule(rendered: dict[str, Any]) -> None:
    """Without D3EngineStalled the wedged engine pages nothing: the queue-time p99 (recorded when a request
    finishes) stays quiet, which is what the issue found."""
    rendered["rules"][:] = [r for r in rendered["rules"] if r.get("alert") != "D3EngineStalled"]
    (rendered["dir"] / "d3-rules.yml").write_text(yaml.safe_dump({"groups": [{"name": "d3-fleet", "rules": rendered["rules"]}]}))
    wedged = next(t for t in cases(rendered["rules"] + [{"alert": "D3EngineStalled", "labels": {}, "annotations": {
        "summary": "", "runbook_url": ""}}]) if t["name"].startswith("a wedged engine"))  # fmt: skip
    assert run_cases(rendered, [wedged]).returncode != 0


def firing_at(rendered: dict[str, Any], case: dict[str, Any], at: str) -> list[dict[str, str]]:
    """The alerts (labels) of every rule firing at ``at`` in ``case``'s series, read back from promtool: each alert
    name is asked to fire nothing, and promtool's failure message lists what fires."""
    names = sorted({r["alert"] for r in rendered["rules"] if "alert" in r})
    probe = {**case, "alert_rule_test": [{"eval_time": at, "alertname": n, "exp_alerts": []} for n in names]}
    result = run_cases(rendered, [probe])
    text = result.stdout + result.stderr
    return [dict(re.findall(r'(\w+)="([^"]*)"', m)) for m in re.findall(r"Labels:\{([^}]*)\}", text)]


def notification_groups(alerts: list[dict[str, str]], config: dict[str, Any]) -> set[tuple[str, ...]]:
    """What Alertmanager notifies for these alerts under ``config``: the inhibit rules applied (a target matched by a
    rule is dropped when a source alert with equal labels fires), then one group per route's group_by values."""

    def matches(alert: dict[str, str], matcher: str) -> bool:
        name, op, value = re.fullmatch(r'(\w+)(=~|=)"(.*)"', matcher).groups()  # type: ignore[union-attr]
        return re.fullmatch(value, alert.get(name, "")) is not None if op == "=~" else alert.get(name, "") == value

    kept = []
    for alert in alerts:
        inhibited = any(
            all(matches(alert, m) for m in rule["target_matchers"])
            and any(all(matches(src, m) for m in rule["source_matchers"]) and src is not alert
                    and all(src.get(k) == alert.get(k) for k in rule["equal"]) for src in alerts)
            for rule in config["inhibit_rules"])  # fmt: skip
        if not inhibited:
            kept.append(alert)
    route = config["route"]
    return {tuple(a.get(k, "") for k in route["group_by"]) for a in kept if a.get("alertname") != "Watchdog"}


def test_a_host_down_gives_one_notification_group(rendered: dict[str, Any]) -> None:
    case = next(t for t in cases(rendered["rules"]) if t["name"] == "a host down")
    alerts = firing_at(rendered, case, "8m")
    # the instances' own alerts do not fire (`unless` the host's node exporter is down)
    assert {a["alertname"] for a in alerts} == {"Watchdog", "D3HostDown"}, alerts
    config = metrics_alertmanager([{"name": "ops", "url": "http://a/"}])["config"]
    assert notification_groups(alerts, config) == {("D3HostDown", "l4-b")}
    # and one that fired before (a scrape that failed a `for:` earlier) is inhibited: still one group; without the
    # inhibition the instances' own group too (what the issue counted: one notification per alert)
    earlier = [*alerts, {"alertname": "D3InstanceDown", "host": "l4-b", "model": "d3-flash", "severity": "critical"}]
    assert notification_groups(earlier, config) == {("D3HostDown", "l4-b")}
    assert len(notification_groups(earlier, {**config, "inhibit_rules": []})) == 2


def test_a_router_down_hides_its_replica_counts(rendered: dict[str, Any]) -> None:
    alerts = [{"alertname": "D3RouterDown", "host": "r1", "severity": "critical"},
              {"alertname": "D3ModelReplicasMissing", "host": "r1", "model": "d3-flash", "severity": "critical"},
              {"alertname": "D3ModelReplicasMissing", "host": "r2", "model": "d3-flash", "severity": "critical"}]  # fmt: skip
    config = metrics_alertmanager([{"name": "ops", "url": "http://a/"}])["config"]
    assert notification_groups(alerts, config) == {("D3RouterDown", "r1"), ("D3ModelReplicasMissing", "r2")}


def test_amtool_checks_the_alertmanager_config(tmp_path: Path) -> None:
    out = metrics_alertmanager([{"name": "lab", "url": "http://127.0.0.1:9099/alerts"},
                                {"name": "pager", "url": "https://pager.example/hook", "severities": ["critical"]}],
                               watchdog={"name": "deadman", "url": "https://deadman.example/ping"})  # fmt: skip
    assert out["errors"] == []
    (tmp_path / "alertmanager.yml").write_text(yaml.safe_dump(out["config"]))
    result = tool("amtool", "check-config", "alertmanager.yml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert " - 4 receivers" in result.stdout and " - 4 inhibit rules" in result.stdout
    # amtool's routing: the Watchdog reaches only its receiver; a warning only the receivers that take warnings
    routes = {
        labels: tool("amtool", "config", "routes", "test", "--config.file=alertmanager.yml", *labels.split(), cwd=tmp_path).stdout.strip()
        for labels in ("alertname=Watchdog severity=none", "alertname=D3HostDown severity=critical",
                       "alertname=D3KvCacheHigh severity=warning")
    }  # fmt: skip
    assert routes == {"alertname=Watchdog severity=none": "deadman", "alertname=D3HostDown severity=critical": "lab,pager",
                      "alertname=D3KvCacheHigh severity=warning": "lab"}, routes  # fmt: skip
    (tmp_path / "alertmanager.yml").write_text(yaml.safe_dump({**out["config"], "receivers": []}))
    assert tool("amtool", "check-config", "alertmanager.yml", cwd=tmp_path).returncode != 0
