"""The fleet's metrics and alerts, from the plan (Ansible filters ``d3_metrics_scrape``, ``d3_metrics_rules``,
``d3_metrics_alertmanager``, ``d3_metrics_silences``, ``d3_metrics_silences_ours``, ``d3_metrics_silences_end``,
``d3_metrics_silences_held``, ``d3_metrics_silence_targets``; role ``d3_metrics``).

Pure functions: no target list, no threshold and no receiver is written by hand in YAML.

- ``d3_metrics_scrape``: Prometheus' configuration. One target per planned instance (vLLM's ``/metrics``, job
  ``d3-vllm``), per router (HAProxy's built-in exporter on ``d3_router_metrics_port``, job ``d3-router``), per host
  (node exporter, job ``d3-node``; NVIDIA's dcgm-exporter, job ``d3-dcgm``, when ``dcgm_exporter`` is on), and the
  monitor's own Prometheus and Alertmanager (jobs ``d3-prometheus``, ``d3-alertmanager``). One meaning per label on
  every target and alert: ``host`` the inventory host, ``instance`` unique across the fleet (``<host>/<instance
  name>`` for an instance, the host's name otherwise), ``name`` the instance's name (its unit), ``model`` the served
  model name (what clients send, what the router's backend ``be_<model>`` and vLLM's ``model_name`` carry),
  ``catalog_model`` the catalog's name, ``variant``, ``gpus`` (the plan's GPU indices, comma-separated). The monitor
  reaches an instance where the router does (``d3_router_backends``: the same address, the same
  ``d3_router_backend_port_offset``, the same loopback rule); a host's exporters at that address too, their ports
  shifted by the same offset (a NAT in front of a host shifts every port it forwards).
- ``d3_metrics_rules``: recording rules for the expressions several rules read, then the alert rules, each with an
  absolute ``runbook_url`` into docs/runbook.md (``d3_metrics_runbook_url``). Per served model: its instances' down
  alert held for its expected cold start (from the catalog's checkpoint size) and its replica count per router.
  docs/metrics.md gives the reason for every threshold and ``for:``.
- ``d3_metrics_alertmanager``: Alertmanager's configuration: receivers per severity, the Watchdog's own receiver,
  grouping by alert and host, inhibition (a host down silences its instances and exporters; a router down its replica
  counts).
- ``d3_metrics_silences`` / ``d3_metrics_silences_ours``: the silences a planned restart (rollout.yml, site.yml)
  posts to Alertmanager's API v2, and which of the silences Alertmanager lists are that run's;
  ``d3_metrics_silences_end``: how the run ends them (a settle time after its end, not at once);
  ``d3_metrics_silences_held``: the alerts only they keep quiet at that end; ``d3_metrics_silence_targets``: where
  the run reaches each monitor's Alertmanager, each address checked first.

Metric names are upstream's (tests/contracts/metrics/names.yml names the sources): vLLM ``vllm/v1/metrics/loggers.py``,
HAProxy ``addons/promex``, node exporter's textfile collector, dcgm-exporter's ``etc/default-counters.csv``; the
``d3_gpu_*`` and ``d3_instance_*`` series are this project's own, written by the role's textfile collector
(roles/d3_metrics/files/d3_textfile.py) for node exporter's textfile collector.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
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
RUNBOOK = re.compile(r"\Ahttps?://[A-Za-z0-9.-]+(:[0-9]{1,5})?(/[A-Za-z0-9._~%/+-]*)?\Z")
# a silence's id as Alertmanager gives it (a UUID, api/v2/openapi.yaml): what the end posts back to update it
SILENCE_ID = re.compile(r"\A[0-9A-Fa-f-]{1,64}\Z")
SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}

# NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html and the pages it links;
# tests/contracts/nvidia/xid-severity.yml quotes each): the codes that page as critical. Every other Xid is a warning
# (the catalog's RESTART_APP codes such as 13 are faults of one application, which vLLM's own restart answers).
XID_CRITICAL = ("46", "48", "64", "79")
# vLLM's metrics a rule reads (tests/contracts/metrics/names.yml): each gets a guard that fires when an instance
# answers /metrics without it (a nightly that renamed it would otherwise leave its rule silent forever)
VLLM_READ = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
             "vllm:request_queue_time_seconds_bucket", "vllm:request_success_total")  # fmt: skip
# what a planned restart legitimately trips before its instances are back (the silences of d3_metrics_silences):
# never D3InstanceDown, which waits out the catalog's cold start and so pages a restart that overruns it


def node_down(host_down_for: str, scrape_interval: str) -> str:
    """A host whose node exporter failed more than half its scrapes over D3HostDown's ``for:``, at least three scrape
    intervals (D3HostDown's page, coming): the host's other down alerts are held while it holds. Not one failed scrape:
    a node exporter that misses one now and then (a timeout while the host loads weights) would reset a down
    instance's ``for:`` forever (the SRE review of 2026-12-05, promtool: a down d3-27b never paged); and not a window
    of two samples (the lab's 10 s at a 5 s scrape), where one miss can be all the window holds (the third review)."""
    window = _duration(max(seconds(host_down_for), 3 * seconds(scrape_interval)))
    return f'(avg_over_time(up{{job="d3-node"}}[{window}]) < 0.5)'

SILENCED_BY_MODEL = ("D3ModelReplicasMissing", "D3RouterQueue", "D3RequestsWaiting")
SILENCED_BY_HOST = ("D3InstanceDigestDrift",)
# the router's 5xx ratio over ERRORS_WINDOW: a model restarted with no replica left to serve (one replica, or
# site.yml restarting every host at once) answers 503 through its restart, and the ratio stays high for the window
# after it (the SRE review of 2026-12-05: a one-replica 27B restart paged D3RouterErrors 3 minutes after it ended):
# its own silence ends ERRORS_WINDOW after the others
SILENCED_FOR_WINDOW = ("D3RouterErrors",)
ERRORS_WINDOW = "5m"

DEFAULTS: dict[str, Any] = {
    "scrape_interval": "15s",
    "evaluation_interval": "15s",
    "node_exporter_port": 9100,
    "router_metrics_port": 8405,
    "dcgm_exporter": False,
    "dcgm_exporter_port": 9400,
    "alertmanager": "127.0.0.1:9093",
    "prometheus": "127.0.0.1:9090",
    "rules_file": "/etc/prometheus/d3-rules.yml",
    "runbook_url": "",
    "instance_down_for": "1m",
    "cold_start_s_per_gb": 2.9,
    "cold_start_margin": 2.0,
    "host_down_for": "1m",
    "replicas_for": "5m",
    "kv_cache_ratio": 0.9,
    "kv_cache_for": "10m",
    "slo_queue_ms": 2000,
    "queue_for": "5m",
    "waiting_max": 0,
    "stall_for": "5m",
    "error_ratio": 0.05,
    "error_min_rps": 0.1,
    "error_for": "5m",
    "gpu_for": "1m",
    "textfile_interval_s": 30,
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


def _number_ok(value: Any, low: float, high: float, whole: bool = False) -> bool:
    kinds = (int,) if whole else (int, float)
    return isinstance(value, kinds) and not isinstance(value, bool) and low < value <= high


def _option_problem(key: str, value: Any) -> str | None:
    if key.endswith("_interval") or key.endswith("_for"):
        ok = isinstance(value, str) and DURATION.match(value)
        return None if ok else "is not a Prometheus duration (a whole number and ms, s, m, h, d, w or y: 30s, 5m)"
    if key.endswith("_port"):
        return None if _port_ok(value) else "is not a TCP port (1-65535)"
    if key == "dcgm_exporter":
        return None if isinstance(value, bool) else "is not true or false"
    if key in ("kv_cache_ratio", "error_ratio"):
        return None if _number_ok(value, 0, 1) else "is not a fraction above 0 and at most 1 (0.9 is 90 %)"
    if key in ("cold_start_s_per_gb", "error_min_rps"):
        return None if _number_ok(value, 0, 10**4) else "is not a number above 0 (at most 10000)"
    if key == "cold_start_margin":
        return None if _number_ok(value, 0.999, 100) else "is not a factor of at least 1 (2 is twice the cold start)"
    if key == "waiting_max":
        return None if _number_ok(value, -1, 10**7, whole=True) else "is not a whole number of at least 0"
    if key in ("slo_queue_ms", "rollout_stale_minutes", "textfile_interval_s"):
        return None if _number_ok(value, 0, 10**7, whole=True) else "is not a whole number above 0"
    if key in ("alertmanager", "prometheus"):
        host, _, port = str(value).rpartition(":")
        ok = isinstance(value, str) and control_free(value) and re.fullmatch(r"[A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\]", host)
        return None if ok and port.isdigit() and _port_ok(int(port)) else "is not HOST:PORT"
    if key == "rules_file":
        return check("path", value)
    # runbook_url
    if isinstance(value, str) and RUNBOOK.match(value):
        return None
    return "is not an absolute http(s) URL (where the on-call engineer opens docs/runbook.md: a pager cannot open a path)"


def seconds(duration: str) -> float:
    """A Prometheus duration (DURATION) in seconds."""
    match = DURATION.match(duration)
    assert match is not None, duration
    return int(duration[: match.start(1)]) * SECONDS[match.group(1)]


def _duration(total: float) -> str:
    """Whole seconds, rounded up, as a Prometheus duration (minutes when they divide evenly)."""
    whole = max(1, -int(-total // 1))
    return f"{whole // 60}m" if whole % 60 == 0 else f"{whole}s"


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


def monitors_problem(monitors: Any) -> str | None:
    """More than one monitor is refused: each runs its own Alertmanager, not clustered (no gossip, each Prometheus
    sends to its own), so every alert would page once per monitor (the SRE review of 2026-12-05: one D3RouterDown, two
    notifications, on Alertmanager 0.25). The Watchdog, at a receiver of its own, is what watches the one monitor."""
    names = sorted(str(m) for m in monitors) if isinstance(monitors, dict | list) else []
    if len(names) <= 1:
        return None
    return (f"d3-monitors lists {len(names)} hosts ({', '.join(names)}): each would run its own Alertmanager, not "
            "clustered with the others, and every alert would page once per monitor. Fix: keep one host in d3-monitors "
            "(its Watchdog, d3_metrics_watchdog_webhook, tells you when it stops); docs/metrics.md.")


def metrics_scrape(
    _input: Any,
    monitor_host: str = "",
    routers: Any = None,
    others: Any = None,
    options: Any = None,
) -> dict[str, Any]:
    """``_input``: every host of ``l4-nodes`` as ``d3_router_backends`` takes them (``{host: {plan, backend_address,
    backend_port_offset, ansible_host}}``); ``routers``: ``{router: {ansible_host, backend_address, metrics_port}}``;
    ``others``: ``{host: {ansible_host, backend_address}}``, further hosts whose node exporter is scraped (the
    monitors). Every host is reached at its ``backend_address`` when set, else its ``ansible_host``. Returns ``{config,
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
    models = []  # the router's models, each server with its plan's GPUs and checkpoint size (for d3_metrics_rules)
    for model in routed["models"]:
        servers = []
        for server in model["servers"]:
            inst = plans[server["host"]][server["instance"]]
            servers.append({**server, "gpus": inst.get("gpus"), "download_bytes": inst.get("download_bytes")})
            gpus = inst.get("gpus") if isinstance(inst.get("gpus"), list) else []
            variant = inst.get("variant")
            labels = {
                "host": server["host"],
                "instance": f"{server['host']}/{server['instance']}",
                "name": server["instance"],
                "model": model["served_name"],
                "catalog_model": model["model"],
                "variant": variant if isinstance(variant, str) and NAME.match(variant) else "",
                "gpus": ",".join(str(g) for g in gpus if isinstance(g, int) and not isinstance(g, bool)),
            }
            targets.append({"job": "d3-vllm", "target": _target(server["address"], server["port"]), "labels": labels})
        models.append({**model, "servers": servers})
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
        exporters = [("d3-node", "node exporter", opts["node_exporter_port"])]
        if opts["dcgm_exporter"] and host in fleet:  # dcgm-exporter: GPU hosts only
            exporters.append(("d3-dcgm", "dcgm-exporter", opts["dcgm_exporter_port"]))
        for job, what, base in exporters:
            port = base + (0 if host == monitor_host else offset)
            if not _port_ok(port):
                errors.append(f"host {host}: its {what} port {base} + "
                              f"d3_router_backend_port_offset {offset} = {port} is not a TCP port. Fix the inventory.")  # fmt: skip
                continue
            targets.append({"job": job, "target": _target(address, port), "labels": {"host": host, "instance": host}})
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
    if monitor_host:  # the monitor's own Prometheus and Alertmanager: a target down is an alert like any other
        for job, key in (("d3-prometheus", "prometheus"), ("d3-alertmanager", "alertmanager")):
            targets.append({"job": job, "target": opts[key], "labels": {"host": monitor_host, "instance": monitor_host}})
    jobs = []
    for job in ("d3-vllm", "d3-router", "d3-node", "d3-dcgm", "d3-prometheus", "d3-alertmanager"):
        rows = [t for t in targets if t["job"] == job]
        if rows:
            jobs.append({
                "job_name": job,
                "metrics_path": "/metrics",
                "static_configs": [{"targets": [t["target"]], "labels": t["labels"]} for t in rows],
            })  # fmt: skip
    config = {
        "global": {"scrape_interval": opts["scrape_interval"], "evaluation_interval": opts["evaluation_interval"]},
        "rule_files": [opts["rules_file"]],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [opts["alertmanager"]]}]}]},
        "scrape_configs": jobs,
    }
    return {"config": config, "targets": targets, "models": models, "errors": errors}


def _alert(name: str, expr: str, duration: str, severity: str, summary: str, runbook: str, **labels: str) -> dict[str, Any]:
    anchor = name.lower()  # GitHub's anchor of the runbook heading "### <name>"
    return {
        "alert": name,
        "expr": expr,
        "for": duration,
        "labels": {"severity": severity, **labels},
        "annotations": {"summary": summary, "runbook_url": f"{runbook}#{anchor}"},
    }


def _alternatives(values: Any) -> str:
    """A PromQL / Alertmanager regex matching exactly these names (NAME: only '.' needs escaping)."""
    return "|".join(str(v).replace(".", "\\.") for v in values)


def _models(models: Any, errors: list[str]) -> list[dict[str, Any]]:
    """The served models whose names can go into a rule: {served, backend, servers: [{host, instance}]}."""
    out = []
    for model in models:
        model = model if isinstance(model, dict) else {}
        served, backend = model.get("served_name"), model.get("backend")
        if not (isinstance(served, str) and NAME.match(served) and isinstance(backend, str) and NAME.match(backend)):
            errors.append(f"model {shown(served)}: its name or backend {shown(backend)} cannot go into a rule. "
                          "Fix d3_models.")  # fmt: skip
            continue
        servers = [s for s in model.get("servers") or [] if isinstance(s, dict)]
        out.append({"served": served, "backend": backend, "servers": servers})
    return out


def cold_start_s(servers: list[dict[str, Any]], per_gb: float) -> float:
    """The longest expected cold start of a model's instances: its checkpoint (the plan's download_bytes) at
    ``per_gb`` seconds per GB (the field report: about 150 s for d3's 52.2 GB on 2 x L4, 2.9 s/GB)."""
    sizes = [s.get("download_bytes") for s in servers]
    sizes = [b for b in sizes if isinstance(b, (int, float)) and not isinstance(b, bool) and b > 0]
    return max(sizes, default=0) / 1e9 * per_gb


def _records(gpus: dict[str, int]) -> list[dict[str, Any]]:
    """Recording rules: each expression that several rules read, computed once per evaluation."""
    rules = [
        {"record": "d3:router_up", "expr": 'max by (host) (up{job="d3-router"})'},
        {"record": "d3:router_servers_up:sum", "expr": 'sum by (host, proxy) (haproxy_server_status{job="d3-router", state="UP"})'},
        {"record": "d3:vllm_up:count", "expr": 'count by (model) (up{job="d3-vllm"} == 1)'},
        {"record": f"d3:router_backend_responses:rate{ERRORS_WINDOW}",
         "expr": f'sum by (host, proxy, code) (rate(haproxy_backend_http_responses_total{{job="d3-router"}}[{ERRORS_WINDOW}]))'},
        {"record": "d3:host_gpus:count", "expr": 'count by (host) (d3_gpu_memory_total_bytes{job="d3-node"})'},
    ]  # fmt: skip
    if gpus:
        rules.append({"record": "d3:host_gpus:planned", "expr": " or ".join(
            f'label_replace(vector({n}), "host", "{h}", "", "")' for h, n in sorted(gpus.items()))})  # fmt: skip
    return rules


def _planned_gpus(models: list[dict[str, Any]]) -> dict[str, int]:
    """Per host, how many GPUs its plan shows at least (its highest planned GPU index + 1)."""
    out: dict[str, int] = {}
    for model in models:
        for server in model["servers"]:
            host, gpus = server.get("host"), server.get("gpus")
            if isinstance(host, str) and NAME.match(host) and isinstance(gpus, list):
                for g in gpus:
                    if isinstance(g, int) and not isinstance(g, bool) and g >= 0:
                        out[host] = max(out.get(host, 0), g + 1)
    return out


def metrics_rules(_input: Any, options: Any = None) -> dict[str, Any]:
    """``_input``: the served models, as ``d3_metrics_scrape`` returns them (``models``: served_name, backend,
    servers). Returns ``{rules: {groups: [...]}, errors}``: the rules file as data (one group: the recording rules
    first, so the alerts read this evaluation's values)."""
    errors: list[str] = []
    opts = _options(options, errors)
    book = opts["runbook_url"]
    if not RUNBOOK.match(book) and not (isinstance(options, dict) and options.get("runbook_url") not in (None, "")):
        errors.append(f"d3_metrics_runbook_url = {shown(book)} is not set: give the absolute http(s) URL where the "
                      "on-call engineer opens docs/runbook.md (a pager cannot open a relative path). Fix the inventory.")  # fmt: skip
    models = _models(_input if isinstance(_input, list) else [], errors)
    if not isinstance(_input, list):
        errors.insert(0, f"models: expected the list d3_metrics_scrape returns, got {shown(_input)}")
    stall, queue, textfile = opts["stall_for"], opts["queue_for"], opts["textfile_interval_s"]
    where = "{{ $labels.name }} on {{ $labels.host }}"
    crit = _alternatives(XID_CRITICAL)
    # the textfile's series name the code in `xid` and count its lines since the acknowledgement; dcgm-exporter's
    # gauge is the last code itself (no `xid` label)
    xid = ("{{ if $labels.xid }}{{ $labels.xid }}, {{ $value }} kernel log line(s) since the last acknowledgement"
           "{{ else }}{{ $value }} (dcgm-exporter's last Xid){{ end }}")
    dcgm_crit = " or ".join(f'DCGM_FI_DEV_XID_ERRORS{{job="d3-dcgm"}} == {x}' for x in XID_CRITICAL)
    held = node_down(opts["host_down_for"], opts["scrape_interval"])
    rules = [
        _alert("Watchdog", "vector(1)", "0m", "none",
               "Always firing: the dead-man's switch. Its receiver alarms when it stops arriving.", book),
        _alert("D3HostDown", 'up{job="d3-node"} == 0', opts["host_down_for"], "critical",
               "{{ $labels.host }} does not answer (its node exporter is unreachable)", book),
        # a host down is D3HostDown's alone: its other exporters' alerts have the same for:, and whichever scrape
        # failed first would fire (and notify) before the inhibition's source exists (the lab's router stopped paged
        # D3RouterDown beside D3HostDown, 2026-12-05); `unless` resets them once the host's node exporter is down too
        # (D3InstanceDown too, below: a model on the 1m floor waits as long as D3HostDown)
        _alert("D3RouterDown", f'up{{job="d3-router"}} == 0 unless on (host) {held}', opts["host_down_for"], "critical",
               "router {{ $labels.host }}: HAProxy's exporter does not answer", book),
        _alert("D3TargetDown", f'up{{job=~"d3-prometheus|d3-alertmanager|d3-dcgm"}} == 0 unless on (host) {held}',
               opts["host_down_for"], "critical", "{{ $labels.job }} on {{ $labels.host }} does not answer", book),
        _alert("D3KvCacheHigh",
               f'max by (host, instance, name, model) (vllm:kv_cache_usage_perc{{job="d3-vllm"}}) > {opts["kv_cache_ratio"]}',
               opts["kv_cache_for"], "warning", f"{where}: KV cache {{{{ $value | humanizePercentage }}}} used", book),
        _alert("D3QueueTimeHigh",
               "histogram_quantile(0.99, sum by (host, instance, name, model, le) "
               f'(rate(vllm:request_queue_time_seconds_bucket{{job="d3-vllm"}}[5m]))) > {opts["slo_queue_ms"] / 1000:g}',
               queue, "warning", f"{where}: queue time p99 above {opts['slo_queue_ms']} ms", book),
        _alert("D3EngineStalled",
               f'(min_over_time(vllm:num_requests_running{{job="d3-vllm"}}[{stall}]) > 0 '
               f'or min_over_time(vllm:num_requests_waiting{{job="d3-vllm"}}[{stall}]) > 0) '
               f'unless on (host, instance) increase(vllm:request_success_total{{job="d3-vllm"}}[{stall}]) > 0 '
               # answering /metrics at most of the window's scrapes and at its start (a wedged engine's API server
               # still does): one whose scrape fails with requests running (killed, frozen, restarting) is
               # D3InstanceDown's, and its last sample alone would otherwise look like a window of held requests (the
               # lab's frozen instance paged so, 2026-12-05); not every scrape, nor the last one, or one missed
               # scrape would resolve a wedged engine's alert and page it again (the third review)
               f'and on (host, instance) avg_over_time(up{{job="d3-vllm"}}[{stall}]) > 0.5 '
               f'and on (host, instance) (up{{job="d3-vllm"}} offset {stall}) == 1',
               "0m", "critical", f"{where}: requests held for {stall} and none finished (a wedged engine)", book),
        _alert("D3RequestsWaiting",
               f'max by (host, instance, name, model) (vllm:num_requests_waiting{{job="d3-vllm"}}) > {opts["waiting_max"]}',
               queue, "warning", f"{where}: {{{{ $value }}}} requests waiting in vLLM's queue for {queue}", book),
        _alert("D3RouterQueue",
               'label_replace(haproxy_backend_current_queue{job="d3-router"} > 0, "model", "$1", "proxy", "be_(.+)")',
               queue, "warning",
               "router {{ $labels.host }}: {{ $value }} requests queued for {{ $labels.model }} (every server at its maxconn)", book),
        _alert("D3RouterErrors",
               'label_replace(sum by (host, proxy) (d3:router_backend_responses:rate5m{code="5xx"}) '
               f'/ sum by (host, proxy) (d3:router_backend_responses:rate5m) > {opts["error_ratio"]} '
               f'and sum by (host, proxy) (d3:router_backend_responses:rate5m) > {opts["error_min_rps"]}, '
               '"model", "$1", "proxy", "be_(.+)")',
               opts["error_for"], "critical",
               "router {{ $labels.host }}: {{ $value | humanizePercentage }} of {{ $labels.model }}'s answers are 5xx", book),
        _alert("D3GpuEccErrors",
               'd3_gpu_ecc_uncorrected_errors{job="d3-node"} > 0 or DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{job="d3-dcgm"} > 0',
               "0m", "critical", "GPU {{ $labels.gpu }} on {{ $labels.host }}: {{ $value }} uncorrected ECC errors", book),
        _alert("D3GpuXidCritical",
               f'd3_gpu_xid_events_total{{job="d3-node", xid=~"{crit}"}} > 0 or {dcgm_crit}',
               "0m", "critical", f"GPU {{{{ $labels.gpu }}}} on {{{{ $labels.host }}}}: Xid {xid} (NVIDIA's catalog: reset or "
               "service the GPU)", book),
        _alert("D3GpuXid",
               f'd3_gpu_xid_events_total{{job="d3-node", xid!~"{crit}"}} > 0 '
               f'or (DCGM_FI_DEV_XID_ERRORS{{job="d3-dcgm"}} > 0 unless ({dcgm_crit}))',
               "0m", "warning", f"GPU {{{{ $labels.gpu }}}} on {{{{ $labels.host }}}}: Xid {xid}", book),
        _alert("D3GpuQueryFailed", 'd3_textfile_success{job="d3-node", failed=~"(.*,)?nvidia-smi(,.*)?"} == 0',
               opts["gpu_for"], "critical", "{{ $labels.host }}: nvidia-smi fails (a GPU off the bus, or the driver)", book),
        _alert("D3GpuLost", "d3:host_gpus:count < on (host) d3:host_gpus:planned",
               opts["gpu_for"], "critical", "{{ $labels.host }}: nvidia-smi lists {{ $value }} GPUs, fewer than the plan uses", book),
        _alert("D3TextfileStale",
               f'time() - node_textfile_mtime_seconds{{job="d3-node", file=~"(.*/)?d3[.]prom"}} > {4 * textfile} '
               'or (up{job="d3-node"} == 1 unless on (host) d3_textfile_success{job="d3-node"})',
               "0m", "warning", f"{{{{ $labels.host }}}}: d3.prom not rewritten for {4 * textfile} s (d3-textfile.timer)", book),
        _alert("D3TextfileFailed", 'd3_textfile_success{job="d3-node", failed!~"(.*,)?nvidia-smi(,.*)?"} == 0',
               opts["gpu_for"], "warning", "{{ $labels.host }}: the textfile collector cannot read {{ $labels.failed }}", book),
        _alert("D3InstanceDigestDrift",
               '(d3_instance_image_info{job="d3-node"} == 1) and on (digest) (count by (digest) (d3_instance_image_info{job="d3-node"}) '
               '< on () group_left () max(count by (digest) (d3_instance_image_info{job="d3-node"})))',
               opts["digest_for"], "warning", f"{where} runs {{{{ $labels.digest }}}}, not the fleet's digest", book),
        _alert("D3RolloutStale",
               f'time() - d3_rollout_marker_timestamp_seconds{{job="d3-node"}} > {opts["rollout_stale_minutes"] * 60}',
               "0m", "warning",
               f"{{{{ $labels.host }}}} carries a rollout marker older than {opts['rollout_stale_minutes']} minutes", book),
    ]  # fmt: skip
    rules += [_alert("D3VllmMetricMissing", f'up{{job="d3-vllm"}} == 1 unless on (host, instance) {m}{{job="d3-vllm"}}',
                     opts["replicas_for"], "warning", f"{where} answers /metrics without {m}: a rule reading it is blind",
                     book, metric=m) for m in VLLM_READ]  # fmt: skip
    floor = seconds(opts["instance_down_for"])
    for model in models:
        served, backend, servers = model["served"], model["backend"], model["servers"]
        bound = max(floor, cold_start_s(servers, opts["cold_start_s_per_gb"]) * opts["cold_start_margin"])
        rules.append(_alert(
            "D3InstanceDown", f'up{{job="d3-vllm", model="{served}"}} == 0 unless on (host) {held}', _duration(bound), "critical",
            f"{where} has not answered /metrics for {_duration(bound)} (its expected cold start, doubled)", book,
            model=served))  # fmt: skip
        rules.append(_alert(
            "D3ModelReplicasMissing",
            f'(d3:router_servers_up:sum{{proxy="{backend}"}} or on (host) (d3:router_up == 1) * 0) '
            f'< on () group_left () (d3:vllm_up:count{{model="{served}"}})',
            opts["replicas_for"], "critical",
            f"router {{{{ $labels.host }}}}: {{{{ $value }}}} of {served}'s answering replicas are UP (plan: {len(servers)})",
            book, model=served))  # fmt: skip
    records = _records(_planned_gpus(models))
    return {"rules": {"groups": [{"name": "d3-fleet", "rules": records + rules}]}, "errors": errors}


INHIBIT = [
    # a host down: its instances, its exporters, its GPU and textfile alerts say nothing more
    (
        "D3HostDown",
        "D3InstanceDown|D3RouterDown|D3TargetDown|D3Gpu.+|D3Textfile.+|D3EngineStalled|D3RequestsWaiting"
        "|D3KvCacheHigh|D3QueueTimeHigh|D3VllmMetricMissing|D3RolloutStale",
        ["host"],
    ),
    # a router down: its own replica counts, queue and error ratios
    ("D3RouterDown", "D3ModelReplicasMissing|D3RouterQueue|D3RouterErrors", ["host"]),
    # nvidia-smi failing (a GPU off the bus): the GPUs it no longer lists, the textfile's other complaints
    ("D3GpuQueryFailed", "D3GpuLost|D3TextfileFailed", ["host"]),
    # a critical Xid (79: off the bus) explains the failing nvidia-smi on that host
    ("D3GpuXidCritical", "D3GpuQueryFailed|D3GpuLost", ["host"]),
]


def metrics_alertmanager(
    _input: Any, group_wait: Any = "10s", repeat_interval: Any = "4h", watchdog: Any = None, watchdog_interval: Any = "1m"
) -> dict[str, Any]:
    """``_input``: ``d3_metrics_webhooks``, a list of ``{name, url, severities}`` (severities: a list of
    ``critical`` / ``warning``, both when left out); ``watchdog``: ``d3_metrics_watchdog_webhook`` ({name, url} or
    none), where the always-firing Watchdog goes every ``watchdog_interval``. Returns ``{config, errors}``:
    alertmanager.yml as data."""
    errors: list[str] = []
    hooks = _input if isinstance(_input, list) else []
    if not isinstance(_input, list) or not _input:
        errors.append(f"d3_metrics_webhooks = {shown(_input)}: give at least one {{name, url}} (an http(s) URL that "
                      "receives Alertmanager's webhook). Fix the inventory.")  # fmt: skip
    for key, value in (("d3_metrics_group_wait", group_wait), ("d3_metrics_repeat_interval", repeat_interval),
                       ("d3_metrics_watchdog_interval", watchdog_interval)):  # fmt: skip
        if not (isinstance(value, str) and DURATION.match(value)):
            errors.append(f"{key} = {shown(value)} is not a Prometheus duration (30s, 5m, 4h). Fix the inventory.")
    receivers: list[dict[str, Any]] = []
    routes: list[dict[str, Any]] = []
    seen: set[str] = {"none"}
    entries = [(f"d3_metrics_webhooks[{i}]", h) for i, h in enumerate(hooks)]
    if watchdog not in (None, "", {}):
        entries.append(("d3_metrics_watchdog_webhook", watchdog))
    for where, hook in entries:
        hook = hook if isinstance(hook, dict) else {}
        name, url = hook.get("name"), hook.get("url")
        severities = hook.get("severities", ["critical", "warning"])
        if not (isinstance(name, str) and NAME.match(name)) or name in seen:
            errors.append(f"{where}.name = {shown(name)} is not a unique name (letters, digits, . _ -; not 'none'). "
                          "Fix the inventory.")  # fmt: skip
            continue
        if check("url", url) or not url:
            errors.append(f"{where}.url = {shown(url)} is not an http(s) URL. Fix the inventory.")
            continue
        if where.startswith("d3_metrics_webhooks") and (
            not isinstance(severities, list) or not severities or not set(severities) <= {"critical", "warning"}
        ):
            errors.append(f"{where}.severities = {shown(severities)} is not a list of critical and/or warning. "
                          "Fix the inventory.")  # fmt: skip
            continue
        seen.add(name)
        receivers.append({"name": name, "webhook_configs": [{"url": url, "send_resolved": where[-1] == "]"}]})
        if where[-1] == "]":
            wanted = sorted(set(severities))
            routes.append({"receiver": name, "continue": True, "matchers": [f'severity=~"{"|".join(wanted)}"']})
    dog = receivers[-1]["name"] if watchdog not in (None, "", {}) and receivers and receivers[-1]["name"] not in (
        r["receiver"] for r in routes) else "none"  # fmt: skip
    watch = {"receiver": dog, "matchers": ['alertname="Watchdog"'], "group_by": ["alertname"], "group_wait": "0s",
             "group_interval": watchdog_interval, "repeat_interval": watchdog_interval, "continue": False}  # fmt: skip
    route: dict[str, Any] = {
        "receiver": "none",
        "group_by": ["alertname", "host"],
        "group_wait": group_wait,
        "group_interval": group_wait,
        "repeat_interval": repeat_interval,
        "routes": [watch, *routes],
    }
    inhibit = [{"source_matchers": [f'alertname="{source}"'], "target_matchers": [f'alertname=~"{targets}"'], "equal": equal}
               for source, targets, equal in INHIBIT]  # fmt: skip
    config = {"route": route, "inhibit_rules": inhibit, "receivers": [{"name": "none"}, *receivers]}
    return {"config": config, "errors": errors}


def _when(text: Any) -> datetime | None:
    try:
        when = datetime.fromisoformat(str(text))  # Python 3.11 reads a trailing Z as UTC
    except ValueError:
        return None
    return when if when.tzinfo else None


def _iso(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")


def _open_alerts(results: Any) -> list[dict[str, Any]]:
    """The labels of every alert Alertmanager holds unresolved (GET /api/v2/alerts lists no resolved one), whatever its
    state: notified (active), about to be (within group_wait), or held back by an inhibition or someone's silence
    after it was notified. From a uri loop's results (``json`` each monitor's answer)."""
    found = []
    for result in results if isinstance(results, list) else []:
        answer = result.get("json") if isinstance(result, dict) else None
        for alert in answer if isinstance(answer, list) else []:
            if isinstance(alert, dict) and isinstance(alert.get("labels"), dict):
                found.append(alert["labels"])
    return found


def metrics_silences(_input: Any, identity: Any, now: Any, minutes: Any = 60, open_alerts: Any = None) -> dict[str, Any]:
    """The silences a planned restart posts to Alertmanager's API v2 (POST /api/v2/silences, tests/contracts/
    alertmanager/api-v2-silences.yml). ``_input``: the hosts it restarts, ``{host: [served model names]}``;
    ``identity``: the run's (playbook, controller, start), written as the comment so its end finds them;
    ``now``: the run's time, ISO 8601 with a zone; ``minutes``: how long they hold at most (they expire by
    themselves if the run dies). Returns ``{silences: [postableSilence...], errors}``: one on the models' replica,
    router-queue and waiting alerts, one on their router error ratios (ended later: ERRORS_WINDOW), one on the
    hosts' digest drift. D3InstanceDown is never silenced: it waits out each model's cold start, so a restart that
    overruns it pages. One silence per alert name. ``open_alerts``: the uri loop's results of GET /api/v2/alerts on
    the monitors: an alert already open there leaves its pair (alert name and model, or host) out of the silences,
    named in ``left_out`` (a silence would hold back that incident's resolution for good: Alertmanager sends a
    resolution only for what it notifies, and mutes both under a silence; the SRE reviews of 2026-12-05, on 0.25)."""
    errors: list[str] = []
    hosts = _input if isinstance(_input, dict) else {}
    if not isinstance(_input, dict):
        errors.append(f"silences: expected a mapping of host to its served models, got {shown(_input)}")
    start = _when(now)
    if start is None:
        errors.append(f"silences: the run's time {shown(now)} is not an ISO 8601 time with a zone")
    if not (isinstance(identity, str) and identity.strip() and control_free(identity) and len(identity) <= 300):
        errors.append(f"silences: the run's identity {shown(identity)} is not one line of text (at most 300 characters)")
    if not _number_ok(minutes, 0, 10080, whole=True):
        errors.append(f"d3_metrics_silence_minutes = {shown(minutes)} is not a whole number of minutes (1-10080). "
                      "Fix the inventory.")  # fmt: skip
    names = sorted(str(h) for h in hosts if isinstance(h, str) and NAME.match(h))
    models = sorted({m for h in names for m in (hosts[h] or []) if isinstance(m, str) and NAME.match(m)})
    errors += [f"silences: host {shown(h)} cannot go into a matcher" for h in hosts if str(h) not in names]
    if errors or not names:
        return {"silences": [], "errors": errors, "left_out": []}
    opened = {(a.get("alertname"), a.get("model"), a.get("host")) for a in _open_alerts(open_alerts)}
    by_model = SILENCED_BY_MODEL + SILENCED_FOR_WINDOW
    left_out = sorted({f"{name} of {model}" for name, model, _ in opened if name in by_model and model in models}
                      | {f"{name} of {host}" for name, _, host in opened if name in SILENCED_BY_HOST and host in names})  # fmt: skip
    assert start is not None
    ends = _iso(start + timedelta(minutes=minutes))
    common = {"startsAt": _iso(start), "endsAt": ends, "createdBy": "d3-fleet",
              "comment": f"{identity}: planned restart of {', '.join(names)}; expires by itself at {ends}"}  # fmt: skip

    def matcher(name: str, value: str) -> dict[str, Any]:
        return {"name": name, "value": value, "isRegex": True, "isEqual": True}

    silences = []
    for names_of, label, alerts in ((models, "model", by_model), (names, "host", SILENCED_BY_HOST)):
        for alert in alerts:
            kept = [v for v in names_of if f"{alert} of {v}" not in left_out]
            if kept:
                silences.append({"matchers": [matcher("alertname", _alternatives([alert])), matcher(label, _alternatives(kept))], **common})
    return {"silences": silences, "errors": [], "left_out": left_out}


def metrics_silence_targets(_input: Any, default: Any = "127.0.0.1:9093") -> dict[str, Any]:
    """Where a planned restart reaches each monitor's Alertmanager API (the task is delegated to the monitor, so its
    own listen address; an unspecified one, 0.0.0.0 or [::], is reached over that monitor's loopback). ``_input``:
    ``{monitor: d3_metrics_alertmanager_listen_address or none}``, none taking ``default`` (the role's). Returns
    ``{targets: {monitor: HOST:PORT}, errors}``: a monitor whose address is not HOST:PORT is left out, named in an
    error (the run warns and goes on: its silences are missing there, and the monitor's own play refuses it)."""
    errors: list[str] = []
    targets: dict[str, str] = {}
    monitors = _input if isinstance(_input, dict) else {}
    if not isinstance(_input, dict):
        errors.append(f"monitors: expected a mapping of monitor to its Alertmanager listen address, got {shown(_input)}")
    for monitor in sorted(monitors, key=str):
        address = default if monitors[monitor] in (None, "") else monitors[monitor]
        if not (isinstance(monitor, str) and NAME.match(monitor)):
            errors.append(f"monitor {shown(monitor)}: not a host name a task can be delegated to")
        elif _option_problem("alertmanager", address):
            errors.append(f"{monitor}: d3_metrics_alertmanager_listen_address = {shown(address)} is not HOST:PORT. "
                          "Fix the inventory.")  # fmt: skip
        else:
            host, _, port = address.rpartition(":")
            loopback = {"0.0.0.0": "127.0.0.1", "[::]": "[::1]"}.get(host, host)  # listening everywhere: its loopback
            targets[monitor] = f"{loopback}:{port}"
    return {"targets": targets, "errors": errors}


def metrics_silences_ours(_input: Any, identity: Any) -> list[str]:
    """The ids of the silences Alertmanager lists (GET /api/v2/silences) that this run posted and that still hold
    (active or pending): created by d3-fleet, the comment starting with the run's identity, the id a UUID's characters
    (the end posts it back to update that silence)."""
    if not isinstance(_input, list) or not isinstance(identity, str) or not identity:
        return []
    ours = []
    for silence in _input:
        silence = silence if isinstance(silence, dict) else {}
        state = silence.get("status", {}).get("state") if isinstance(silence.get("status"), dict) else None
        comment = silence.get("comment")
        if (silence.get("createdBy") == "d3-fleet" and isinstance(comment, str) and comment.startswith(f"{identity}: ")
                and state in ("active", "pending") and isinstance(silence.get("id"), str)
                and SILENCE_ID.match(silence["id"])):  # fmt: skip
            ours.append(silence["id"])
    return sorted(ours)


def _ours_by_monitor(listed: Any, identity: Any) -> dict[str, tuple[list[dict[str, Any]], datetime | None]]:
    """``listed``: the ``results`` of a uri loop that listed each monitor's silences (``item``: the monitor, ``json``:
    its GET /api/v2/silences answer, ``date``: the answer's Date header). Returns ``{monitor: ([this run's silences as
    listed], the monitor's time or None)}``."""
    ours: dict[str, tuple[list[dict[str, Any]], datetime | None]] = {}
    for result in listed if isinstance(listed, list) else []:
        result = result if isinstance(result, dict) else {}
        monitor, answer = result.get("item"), result.get("json")
        if isinstance(monitor, str) and isinstance(answer, list):
            ids = set(metrics_silences_ours(answer, identity))
            ours[monitor] = ([s for s in answer if isinstance(s, dict) and s.get("id") in ids], _http_date(result.get("date")))
    return ours


def _http_date(text: Any) -> datetime | None:
    """An HTTP Date header (RFC 9110, "Sat, 05 Dec 2026 06:00:00 GMT") as a time, or None."""
    try:
        when = parsedate_to_datetime(str(text))
    except (TypeError, ValueError, IndexError):
        return None
    return when if when.tzinfo else None


def metrics_silences_end(_input: Any, identity: Any, now: Any, intervals: Any) -> dict[str, Any]:
    """How a run ends its own silences: not deleted (an alert still firing in Alertmanager when its silence goes is
    notified at once, and a replica given back a second before is still firing there until Prometheus has scraped
    the router and evaluated the rule: the lab's rollout under load paged so, 2026-12-05), but posted again with
    their id and an ``endsAt`` a settle time from ``now``: twice the monitor's scrape plus evaluation interval, by
    which the given-back servers' resolutions have reached Alertmanager (the error-ratio silence ERRORS_WINDOW later:
    the ratio's window still holds the restart's 503s until then). What still fires then pages: a fault the
    planned work left. Alertmanager updates an active silence in place when only its ``endsAt`` changes and is not in
    the past (silence/silence.go ``canUpdate``, tests/contracts/alertmanager/api-v2-silences.yml). The settle time
    counts from the monitor's own clock (the Date header of its silences answer; ``now`` only where it sent none): a
    controller's clock behind the monitor's by more than the settle time would give an ``endsAt`` Alertmanager
    refuses, leaving the silences an hour (the SRE review of 2026-12-05, on Alertmanager 0.25).

    ``_input``: the uri loop's ``results`` (GET /api/v2/silences per monitor); ``identity``: the run's;
    ``now``: ISO 8601 with a zone; ``intervals``: ``{monitor: [scrape_interval, evaluation_interval]}``, Prometheus
    durations (the monitor's own variables). Returns ``{silences: [[monitor, postableSilence with id]], settle:
    {monitor: seconds}, errors}``; a monitor whose intervals are not durations keeps its silences to their own
    expiry, named in an error (the run warns)."""
    errors: list[str] = []
    start = _when(now)
    if start is None:
        return {"silences": [], "settle": {}, "errors": [f"silences: the run's time {shown(now)} is not an ISO 8601 time with a zone"]}
    spans = intervals if isinstance(intervals, dict) else {}
    ends: list[list[Any]] = []
    settle: dict[str, float] = {}
    for monitor, (silences, clock) in sorted(_ours_by_monitor(_input, identity).items()):
        pair = spans.get(monitor)
        if not (isinstance(pair, list | tuple) and len(pair) == 2 and all(isinstance(d, str) and DURATION.match(d) for d in pair)):
            errors.append(f"{monitor}: its d3_metrics_scrape_interval and d3_metrics_evaluation_interval {shown(pair)} are not "
                          "Prometheus durations: this run's silences there are left to expire by themselves")  # fmt: skip
            continue
        settle[monitor] = 2 * (seconds(pair[0]) + seconds(pair[1]))
        for silence in silences:
            matchers = silence.get("matchers") if isinstance(silence.get("matchers"), list) else []
            window = any(isinstance(m, dict) and m.get("name") == "alertname" and m.get("value") in SILENCED_FOR_WINDOW
                         for m in matchers)  # fmt: skip
            end = (clock or start) + timedelta(seconds=settle[monitor] + (seconds(ERRORS_WINDOW) if window else 0))
            until = _when(silence.get("endsAt"))
            if until is not None and until <= end:
                continue  # it ends sooner by itself
            keys = ("id", "matchers", "startsAt", "createdBy", "comment")
            ends.append([monitor, {**{k: silence.get(k) for k in keys}, "endsAt": _iso(end)}])
    return {"silences": ends, "settle": settle, "errors": errors}


def metrics_silences_held(_input: Any, listed: Any, identity: Any) -> list[str]:
    """The alerts only this run's silences keep quiet when it ends, one line each (``monitor: alertname{labels}
    since startsAt``): they page when the silences end unless they resolve first. ``_input``: the results of a uri
    loop of GET /api/v2/alerts per monitor (``item``: the monitor; gettableAlert, ``status.silencedBy`` and
    ``status.inhibitedBy``); ``listed``: the silences' loop results, as for d3_metrics_silences_end. An alert also
    silenced by someone else's silence, or inhibited, is left out: it stays quiet after this run's end."""
    ours = {m: {s.get("id") for s in silences} for m, (silences, _) in _ours_by_monitor(listed, identity).items()}
    held = []
    for result in _input if isinstance(_input, list) else []:
        result = result if isinstance(result, dict) else {}
        monitor, alerts = result.get("item"), result.get("json")
        if not (isinstance(monitor, str) and ours.get(monitor) and isinstance(alerts, list)):
            continue
        for alert in alerts:
            alert = alert if isinstance(alert, dict) else {}
            status = alert.get("status") if isinstance(alert.get("status"), dict) else {}
            by, inhibited = status.get("silencedBy") or [], status.get("inhibitedBy") or []
            if by and set(by) <= ours[monitor] and not inhibited:
                labels = alert.get("labels") if isinstance(alert.get("labels"), dict) else {}
                shown_labels = ",".join(f"{k}={labels[k]}" for k in sorted(labels) if k != "alertname")
                held.append(f"{monitor}: {labels.get('alertname', '?')}{{{shown_labels}}} since {alert.get('startsAt', '?')}")
    return sorted(held)


class FilterModule:
    """Ansible filters: d3_metrics_scrape, d3_metrics_rules, d3_metrics_alertmanager, d3_metrics_silences,
    d3_metrics_silences_ours, d3_metrics_silences_end, d3_metrics_silences_held, d3_metrics_silence_targets."""

    def filters(self) -> dict[str, Any]:
        return {
            "d3_metrics_scrape": metrics_scrape,
            "d3_metrics_rules": metrics_rules,
            "d3_metrics_alertmanager": metrics_alertmanager,
            "d3_metrics_silences": metrics_silences,
            "d3_metrics_silences_ours": metrics_silences_ours,
            "d3_metrics_silence_targets": metrics_silence_targets,
            "d3_metrics_silences_end": metrics_silences_end,
            "d3_metrics_silences_held": metrics_silences_held,
        }
