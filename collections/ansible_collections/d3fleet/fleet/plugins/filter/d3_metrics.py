"""The fleet's metrics and alerts, from the plan (Ansible filters ``d3_metrics_scrape``, ``d3_metrics_rules``,
``d3_metrics_alertmanager``; role ``d3_metrics``).

Pure functions: no target list, no threshold and no receiver is written by hand in YAML.

- ``d3_metrics_scrape``: Prometheus' configuration. One target per planned instance (vLLM's ``/metrics``, job
  ``d3-vllm``), per router (HAProxy's built-in exporter on ``d3_router_metrics_port``, job ``d3-router``) and per host
  (node exporter, job ``d3-node``), each with the labels ``host`` and ``instance`` (the instance's name, or the host's
  for a router and a node exporter), instances also ``model``, ``served_name``, ``variant`` and ``gpus`` (the plan's
  GPU indices, comma-separated). The monitor reaches an instance where the router does (``d3_router_backends``: the
  same address, the same ``d3_router_backend_port_offset``, the same loopback rule); a host's node exporter at that
  address too, its port shifted by the same offset (a NAT in front of a host shifts every port it forwards).
- ``d3_metrics_rules``: the alert rules, each with a ``runbook_url`` into docs/runbook.md. One replica rule per
  served model, its replica count the plan's.
- ``d3_metrics_alertmanager``: Alertmanager's configuration, a webhook receiver per ``d3_metrics_webhooks`` entry.

Metric names are upstream's (tests/contracts/metrics.yml names the sources): vLLM ``vllm/v1/metrics/loggers.py``,
HAProxy ``addons/promex``; the ``d3_gpu_*`` and ``d3_instance_*`` series are this project's own, written by the
role's textfile collector (roles/d3_metrics/files/d3_textfile.py) for node exporter's textfile collector.
"""

from __future__ import annotations

import re
from typing import Any

from ansible_collections.d3fleet.fleet.plugins.module_utils.d3_address import address_problem as _address_problem

try:  # under Ansible: the collection's own modules
    from ansible_collections.d3fleet.fleet.plugins.filter.d3_inputs import check, control_free, shown
    from ansible_collections.d3fleet.fleet.plugins.filter.d3_router import router_backends
except ImportError:  # the unit tests import the filters as top-level modules
    from d3_inputs import check, control_free, shown  # type: ignore[no-redef]
    from d3_router import router_backends  # type: ignore[no-redef]

# Prometheus' duration (model.ParseDuration), the units an operator writes here: 30s, 5m, 1h, 15d, 2w, 1y
DURATION = re.compile(r"\A[1-9][0-9]{0,5}(ms|s|m|h|d|w|y)\Z")
NAME = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9_.-]{0,62}\Z")
RUNBOOK = re.compile(r"\A(https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?)?/?[A-Za-z0-9._~%/+-]*\Z")

DEFAULTS: dict[str, Any] = {
    "scrape_interval": "15s",
    "evaluation_interval": "15s",
    "node_exporter_port": 9100,
    "router_metrics_port": 8405,
    "alertmanager": "127.0.0.1:9093",
    "rules_file": "/etc/prometheus/d3-rules.yml",
    "runbook_url": "docs/runbook.md",
    "instance_down_for": "1m",
    "replicas_for": "5m",
    "kv_cache_ratio": 0.9,
    "kv_cache_for": "10m",
    "slo_queue_ms": 2000,
    "queue_for": "5m",
    "error_ratio": 0.05,
    "error_for": "5m",
    "digest_for": "30m",
    "rollout_stale_minutes": 60,
}


def _port_ok(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 65535


def _options(options: Any, errors: list[str]) -> dict[str, Any]:
    """The defaults overlaid with ``options``; a bad value is an error naming its variable, and its default is kept."""
    if options is None:
        options = {}
    if not isinstance(options, dict):
        errors.append(f"d3_metrics options: expected a mapping, got {shown(options)}")
        return dict(DEFAULTS)
    out = dict(DEFAULTS)
    for key in sorted(options, key=str):
        value = options[key]
        if key not in DEFAULTS:
            errors.append(f"d3_metrics options: unknown option {shown(key)} (known: {', '.join(sorted(DEFAULTS))})")
            continue
        if value is None:
            continue
        problem = _option_problem(key, value)
        if problem:
            errors.append(f"d3_metrics_{key} = {shown(value)} {problem}. Fix the inventory.")
            continue
        out[key] = value
    return out


def _option_problem(key: str, value: Any) -> str | None:
    if key.endswith("_interval") or key.endswith("_for"):
        ok = isinstance(value, str) and DURATION.match(value)
        return None if ok else "is not a Prometheus duration (a whole number and ms, s, m, h, d, w or y: 30s, 5m)"
    if key.endswith("_port"):
        return None if _port_ok(value) else "is not a TCP port (1-65535)"
    if key in ("kv_cache_ratio", "error_ratio"):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= 1
        return None if ok else "is not a fraction above 0 and at most 1 (0.9 is 90 %)"
    if key in ("slo_queue_ms", "rollout_stale_minutes"):
        ok = isinstance(value, int) and not isinstance(value, bool) and 0 < value <= 10**7
        return None if ok else "is not a whole number above 0"
    if key == "alertmanager":
        host, _, port = str(value).rpartition(":")
        ok = isinstance(value, str) and control_free(value) and re.fullmatch(r"[A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\]", host)
        return None if ok and port.isdigit() and _port_ok(int(port)) else "is not HOST:PORT"
    if key == "rules_file":
        return check("path", value)
    # runbook_url
    return None if isinstance(value, str) and RUNBOOK.match(value) else "is not an http(s) URL or a relative path"


def _target(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def _host_address(spec: dict[str, Any], host: str, monitor_host: str) -> str:
    """Where the monitor reaches ``host`` itself: itself over loopback, else where the router reaches its instances."""
    if host == monitor_host:
        return "127.0.0.1"
    for key in ("backend_address", "ansible_host"):
        if spec.get(key) not in (None, ""):
            return str(spec[key])
    return host


def metrics_scrape(
    _input: Any,
    monitor_host: str = "",
    routers: Any = None,
    others: Any = None,
    options: Any = None,
) -> dict[str, Any]:
    """``_input``: every host of ``l4-nodes`` as ``d3_router_backends`` takes them (``{host: {plan, backend_address,
    backend_port_offset, ansible_host}}``); ``routers``: ``{router: {ansible_host, metrics_port}}``; ``others``:
    ``{host: {ansible_host}}``, further hosts whose node exporter is scraped (the monitors). Returns ``{config,
    targets, errors}``: ``config`` is prometheus.yml as data, ``targets`` one row per target (job, target, labels)."""
    errors: list[str] = []
    opts = _options(options, errors)
    fleet = _input if isinstance(_input, dict) else {}
    if not isinstance(_input, dict):
        errors.append(f"fleet hosts: expected a mapping of host to plan, got {shown(_input)}")
    routed = router_backends(fleet, monitor_host) if fleet else {"models": [], "servers": {}, "errors": []}
    errors += [e.replace("the router", "the monitor") for e in routed["errors"]]
    plans = {h: {i.get("name"): i for i in (s or {}).get("plan", {}).get("instances", []) if isinstance(i, dict)}
             for h, s in fleet.items() if isinstance(s, dict) and isinstance(s.get("plan"), dict)}  # fmt: skip
    targets: list[dict[str, Any]] = []
    for model in routed["models"]:
        for server in model["servers"]:
            inst = plans[server["host"]][server["instance"]]
            gpus = inst.get("gpus") if isinstance(inst.get("gpus"), list) else []
            variant = inst.get("variant")
            labels = {
                "host": server["host"],
                "instance": server["instance"],
                "model": model["model"],
                "served_name": model["served_name"],
                "variant": variant if isinstance(variant, str) and NAME.match(variant) else "",
                "gpus": ",".join(str(g) for g in gpus if isinstance(g, int) and not isinstance(g, bool)),
            }
            targets.append({"job": "d3-vllm", "target": _target(server["address"], server["port"]), "labels": labels})
    hosts: dict[str, tuple[dict[str, Any], int]] = {}
    for group, members in (("l4-nodes", fleet), ("d3-routers", routers), ("d3-monitors", others)):
        if members is None:
            continue
        if not isinstance(members, dict):
            errors.append(f"{group} hosts: expected a mapping of host to its variables, got {shown(members)}")
            continue
        for host in sorted(members, key=str):
            spec = members[host] if isinstance(members[host], dict) else {}
            offset = spec.get("backend_port_offset") if group == "l4-nodes" else 0
            hosts.setdefault(str(host), (spec, offset if isinstance(offset, int) and not isinstance(offset, bool) else 0))
    for host, (spec, offset) in sorted(hosts.items()):
        address = _host_address(spec, host, monitor_host)
        problem = _address_problem(address)
        if problem:
            errors.append(f"host {host}: the monitor's address for it, {shown(address)}, {problem}. Fix its ansible_host.")
            continue
        port = opts["node_exporter_port"] + (0 if host == monitor_host else offset)
        if not _port_ok(port):
            errors.append(f"host {host}: its node exporter port {opts['node_exporter_port']} + "
                          f"d3_router_backend_port_offset {offset} = {port} is not a TCP port. Fix the inventory.")  # fmt: skip
            continue
        targets.append({"job": "d3-node", "target": _target(address, port), "labels": {"host": host, "instance": host}})
    for router in sorted(routers or {}, key=str) if isinstance(routers, dict) else []:
        spec = routers[router] if isinstance(routers[router], dict) else {}
        port = spec.get("metrics_port")
        port = opts["router_metrics_port"] if port in (None, "") else port
        if not _port_ok(port):
            errors.append(f"router {router}: d3_router_metrics_port = {shown(port)} is not a TCP port (1-65535). "
                          "Fix the inventory.")  # fmt: skip
            continue
        address = _host_address(spec, str(router), monitor_host)
        if not _address_problem(address):  # a bad address was refused above: every router's node exporter is a target
            targets.append({"job": "d3-router", "target": _target(address, port),
                            "labels": {"host": str(router), "instance": str(router)}})  # fmt: skip
    jobs = []
    for job in ("d3-vllm", "d3-router", "d3-node"):
        rows = [t for t in targets if t["job"] == job]
        if rows:
            jobs.append({
                "job_name": job,
                "metrics_path": "/metrics",
                "static_configs": [{"targets": [t["target"]], "labels": t["labels"]} for t in rows],
            })  # fmt: skip
            if job == "d3-node":  # the textfile's d3_instance_image_info keeps its own instance (the d3 instance's name)
                jobs[-1]["honor_labels"] = True
    config = {
        "global": {"scrape_interval": opts["scrape_interval"], "evaluation_interval": opts["evaluation_interval"]},
        "rule_files": [opts["rules_file"]],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [opts["alertmanager"]]}]}]},
        "scrape_configs": jobs,
    }
    return {"config": config, "targets": targets, "models": routed["models"], "errors": errors}


def _alert(name: str, expr: str, duration: str, severity: str, summary: str, runbook: str, **labels: str) -> dict[str, Any]:
    anchor = name.lower()  # GitHub's anchor of the runbook heading "### <name>"
    return {
        "alert": name,
        "expr": expr,
        "for": duration,
        "labels": {"severity": severity, **labels},
        "annotations": {"summary": summary, "runbook_url": f"{runbook}#{anchor}"},
    }


def metrics_rules(_input: Any, options: Any = None) -> dict[str, Any]:
    """``_input``: the served models, as ``d3_metrics_scrape`` returns them (``models``: served_name, backend,
    servers). Returns ``{rules: {groups: [...]}, errors}``: the alert rules file as data."""
    errors: list[str] = []
    opts = _options(options, errors)
    book = opts["runbook_url"]
    models = _input if isinstance(_input, list) else []
    if not isinstance(_input, list):
        errors.append(f"models: expected the list d3_metrics_scrape returns, got {shown(_input)}")
    rules = [
        _alert("D3InstanceDown", 'up{job="d3-vllm"} == 0', opts["instance_down_for"], "critical",
               "{{ $labels.instance }} on {{ $labels.host }} does not answer /metrics", book),
        _alert("D3KvCacheHigh", f'max by (host, instance, model) (vllm:kv_cache_usage_perc{{job="d3-vllm"}}) > {opts["kv_cache_ratio"]}',
               opts["kv_cache_for"], "warning",
               "{{ $labels.instance }} on {{ $labels.host }}: KV cache {{ $value | humanizePercentage }} used", book),
        _alert("D3QueueTimeHigh",
               "histogram_quantile(0.99, sum by (host, instance, model, le) "
               f'(rate(vllm:request_queue_time_seconds_bucket{{job="d3-vllm"}}[5m]))) > {opts["slo_queue_ms"] / 1000:g}',
               opts["queue_for"], "warning",
               f"{{{{ $labels.instance }}}} on {{{{ $labels.host }}}}: queue time p99 above {opts['slo_queue_ms']} ms",
               book),
        _alert("D3RouterErrors",
               'sum by (host, proxy) (rate(haproxy_frontend_http_responses_total{job="d3-router", code="5xx"}[5m])) '
               '/ sum by (host, proxy) (rate(haproxy_frontend_http_responses_total{job="d3-router"}[5m])) '
               f'> {opts["error_ratio"]}',
               opts["error_for"], "critical",
               "{{ $labels.proxy }} on {{ $labels.host }}: {{ $value | humanizePercentage }} of answers are 5xx", book),
        _alert("D3GpuErrors",
               'd3_gpu_ecc_uncorrected_errors{job="d3-node"} > 0 or increase(d3_gpu_xid_events_total{job="d3-node"}[30m]) > 0',
               "0m", "critical", "GPU {{ $labels.gpu }} on {{ $labels.host }} reports ECC or Xid errors", book),
        _alert("D3InstanceDigestDrift",
               '(d3_instance_image_info{job="d3-node"} == 1) and on (digest) (count by (digest) (d3_instance_image_info{job="d3-node"}) '
               '< on () group_left () max(count by (digest) (d3_instance_image_info{job="d3-node"})))',
               opts["digest_for"], "warning",
               "{{ $labels.instance }} on {{ $labels.host }} runs {{ $labels.digest }}, not the fleet's digest", book),
        _alert("D3RolloutStale",
               f'time() - d3_rollout_marker_timestamp_seconds{{job="d3-node"}} > {opts["rollout_stale_minutes"] * 60}',
               "0m", "warning",
               f"{{{{ $labels.host }}}} carries a rollout marker older than {opts['rollout_stale_minutes']} minutes", book),
    ]
    for model in models:
        served, backend = model.get("served_name"), model.get("backend")
        replicas = len(model.get("servers") or [])
        if not (isinstance(served, str) and NAME.match(served) and isinstance(backend, str) and NAME.match(backend)):
            errors.append(f"model {shown(served)}: its name or backend {shown(backend)} cannot go into a rule. "
                          "Fix d3_models.")  # fmt: skip
            continue
        rules.append(_alert(
            "D3ModelReplicasMissing",
            f'(count(haproxy_server_status{{job="d3-router", proxy="{backend}", state="UP"}} == 1) or vector(0)) < {replicas}',
            opts["replicas_for"], "critical",
            f"{served}: fewer than its {replicas} replicas are UP in the router", book, model=served))  # fmt: skip
    return {"rules": {"groups": [{"name": "d3-fleet", "rules": rules}]}, "errors": errors}


def metrics_alertmanager(_input: Any, group_wait: Any = "10s", repeat_interval: Any = "4h") -> dict[str, Any]:
    """``_input``: ``d3_metrics_webhooks``, a list of ``{name, url}``. Returns ``{config, errors}``: alertmanager.yml as
    data, every alert routed to every webhook (send_resolved on)."""
    errors: list[str] = []
    hooks = _input if isinstance(_input, list) else []
    if not isinstance(_input, list) or not _input:
        errors.append(f"d3_metrics_webhooks = {shown(_input)}: give at least one {{name, url}} (an http(s) URL that "
                      "receives Alertmanager's webhook). Fix the inventory.")  # fmt: skip
    for key, value in (("d3_metrics_group_wait", group_wait), ("d3_metrics_repeat_interval", repeat_interval)):
        if not (isinstance(value, str) and DURATION.match(value)):
            errors.append(f"{key} = {shown(value)} is not a Prometheus duration (30s, 5m, 4h). Fix the inventory.")
    receivers, seen = [], set()
    for index, hook in enumerate(hooks):
        hook = hook if isinstance(hook, dict) else {}
        name, url = hook.get("name"), hook.get("url")
        where = f"d3_metrics_webhooks[{index}]"
        if not (isinstance(name, str) and NAME.match(name)) or name in seen:
            errors.append(f"{where}.name = {shown(name)} is not a unique name (letters, digits, . _ -). Fix the inventory.")
            continue
        if check("url", url) or not url:
            errors.append(f"{where}.url = {shown(url)} is not an http(s) URL. Fix the inventory.")
            continue
        seen.add(name)
        receivers.append({"name": name, "webhook_configs": [{"url": url, "send_resolved": True}]})
    route: dict[str, Any] = {
        "receiver": receivers[0]["name"] if receivers else "none",
        "group_by": ["alertname", "host", "instance", "model"],
        "group_wait": group_wait,
        "group_interval": group_wait,
        "repeat_interval": repeat_interval,
        "routes": [{"receiver": r["name"], "continue": True, "matchers": ['alertname=~".+"']} for r in receivers[1:]],
    }
    if not route["routes"]:
        del route["routes"]
    return {"config": {"route": route, "receivers": receivers or [{"name": "none"}]}, "errors": errors}


class FilterModule:
    """Ansible filters: d3_metrics_scrape, d3_metrics_rules, d3_metrics_alertmanager."""

    def filters(self) -> dict[str, Any]:
        return {
            "d3_metrics_scrape": metrics_scrape,
            "d3_metrics_rules": metrics_rules,
            "d3_metrics_alertmanager": metrics_alertmanager,
        }
