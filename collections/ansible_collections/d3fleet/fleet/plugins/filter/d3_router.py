"""The router's view of the fleet (Ansible filter plugin ``d3_router_backends``).

Pure function: from the plan of every host of ``l4-nodes`` (``d3_host_plan``, role ``d3``) it computes one HAProxy
frontend and one backend per served model name (what clients send as ``model``), the backend's servers (every
planned instance of that name on every host), the router's port per model, and the (backend, server) pair of each
instance, which the rollout uses to drain it through HAProxy's runtime API. Every value that reaches the HAProxy
configuration is checked here first (whole-string matches, no control characters); the template only loops.

Naming (the contract with the rollout and the status playbook):

- frontend ``fe_<served name>``, backend ``be_<served name>``;
- server ``<inventory_hostname>-<instance name>``, every character outside ``[A-Za-z0-9_.-]`` replaced by ``_``;
- the fleet endpoint (``endpoint_port``, default 8000): every model on one port, routed by the request body's
  ``model`` (what vLLM's ``--served-model-name`` is); ``GET /v1/models`` answered by the router for the whole fleet
  (``models_json``, vLLM's list shape), an unknown model a 404 with an OpenAI-style error naming the served models
  (``unknown_json``);
- a port of its own per model only where the inventory gives one: ``ports[<served name>]``, else
  ``ports[<catalog model>]`` (when that model has one served name in the fleet). Never computed from the other models
  (an index among the served names moved every port after a model added in front of it): adding or removing a
  model changes no other model's port, frontend, backend or server.

Safe to expose: a router that listens beyond loopback forwards to instances only when each of their hosts has an API
key (``d3_units_api_key``) or says ``d3_allow_unauthenticated``; only ``PATHS`` and the inventory's
``allowed_paths`` reach an instance (vLLM leaves ``/metrics``, ``/pause``, ``/tokenize``... open without a key).

Each server's ``maxconn`` is the instance's concurrency: its ``--max-num-seqs`` when the plan's flags set one, else
vLLM's default for the OpenAI server on a GPU below 70 GiB (the L4), 256 (``MAX_NUM_SEQS``); past it HAProxy queues.

Where the router connects to an instance: port = the instance's port + the host's ``d3_router_backend_port_offset``
(default 0: a NAT or port forward between router and host, as in the lab); address = the host's
``d3_router_backend_address`` when set; else the instance's
bind address when it is one specific address (vLLM listens there only); else the host's ``ansible_host``, else its
inventory name. An instance bound to loopback only (127.0.0.1, ::1: ``d3_listen_address``'s default) is reachable
from its own host only: refused unless the router is that host (then the router connects to that loopback address).
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import re
from typing import Any

from ansible_collections.d3fleet.fleet.plugins.module_utils.d3_address import address_problem as _address_problem

try:  # under Ansible: the collection's own module
    from ansible_collections.d3fleet.fleet.plugins.filter.d3_inputs import check, control_free, shown
    from ansible_collections.d3fleet.fleet.plugins.filter.d3_planner import split_args
except ImportError:  # the unit tests import the filters as top-level modules
    from d3_inputs import check, control_free, shown  # type: ignore[no-redef]
    from d3_planner import split_args  # type: ignore[no-redef]

# HAProxy proxy and server names: letters, digits, '-', '_', '.', ':' (configuration.txt, "4. Proxies"); served names
# come from the planner (NAME_RE, [a-z0-9-]), checked again here since they reach the configuration.
SERVED_NAME = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9_.-]{0,126}\Z")
UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")
# vllm-project/vllm vllm/engine/arg_utils.py, EngineArgs.get_batch_defaults: default_max_num_seqs
# {LLM_CLASS: 256, OPENAI_API_SERVER: 256} unless the GPU has >= 70 GiB (not an A100): 1024. An L4 has 23 GiB.
MAX_NUM_SEQS = 256
# what clients need: decisions, the model list, the health check (the rest of vLLM's open paths stay behind the router)
PATHS = ("/v1/systemone", "/v1/models", "/health")
URL_PATH = re.compile(r"\A(/[A-Za-z0-9._~-]+)+\Z")
# the header block a request may have (HAProxy's req.hdrs, the request line and headers), on top of the body
HEADER_KIB = 32
# tune.maxrewrite: room kept in the buffer for the headers HAProxy adds (X-Forwarded-For); configuration.txt
# "tune.maxrewrite": "It is generally wise to set it to about 1024"
MAXREWRITE = 1024
# connections beyond the frontends' for the exporter's scrapes and an upstream balancer's /health checks
SPARE_CONNECTIONS = 64
# the health frontend's connections (loopback only; keepalived's check every second, 2 s timeout, and the role's own
# checks): its own maxconn, counted into the global one, so the fleet endpoint's clients can never take them
HEALTH_MAXCONN = 16
# Mozilla's server-side TLS guidelines 6.0, "intermediate" (mozilla/ssl-config-generator
# src/static/guidelines/6.0.json, commit 8debe30faad8a27a3ba95954035c5d9cdd7a5066;
# tests/contracts/haproxy/mozilla-intermediate-6.0.json): its OpenSSL ciphers (TLS 1.2), ciphersuites (TLS 1.3) and
# curves without X25519MLKEM768, which Debian 12's OpenSSL 3.0 does not know (HAProxy refuses an unknown curve)
TLS = {
    "ciphers": ":".join(("ECDHE-ECDSA-AES128-GCM-SHA256", "ECDHE-RSA-AES128-GCM-SHA256", "ECDHE-ECDSA-AES256-GCM-SHA384",
                         "ECDHE-RSA-AES256-GCM-SHA384", "ECDHE-ECDSA-CHACHA20-POLY1305", "ECDHE-RSA-CHACHA20-POLY1305")),
    "ciphersuites": "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256",
    "curves": "X25519:prime256v1:secp384r1",
}  # fmt: skip
# what d3-router.lua (the role's files) says of a request body, and the 400 each gets (vLLM's error shape)
BODY_ERRORS = {
    "not_json": "The request body is not a JSON object.",
    "no_model": "The request body has no `model`.",
    "duplicate_model": "The request body has `model` more than once.",
    "model_not_string": "The request body's `model` is not a string.",
}
# a key the router checks (d3_router_api_keys): what a Bearer token may hold (RFC 6750 b64token), 16-512 characters
API_KEY = re.compile(r"\A[A-Za-z0-9._~+/-]{16,512}=*\Z")
LISTEN_HINT = ("set d3_listen_address to 0.0.0.0 or the host's own address on that host (which needs the API key, "
               "d3_units_api_key, from Vault), or run the router on that host")  # fmt: skip


def server_name(host: str, instance: str) -> str:
    """The HAProxy server name of ``instance`` on ``host``: ``<host>-<instance>``, unsafe characters as ``_``."""
    return UNSAFE.sub("_", f"{host}-{instance}")


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _port_ok(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 65535


def _max_num_seqs(args: Any) -> int | None:
    """The instance's ``--max-num-seqs`` from the plan's vLLM arguments (any spelling vLLM reads), else
    ``MAX_NUM_SEQS``; None when it is set to something that is not a positive whole number."""
    try:
        pairs = split_args(list(args)) if isinstance(args, list) else []
    except ValueError:
        pairs = []
    value: Any = MAX_NUM_SEQS
    for flag, given in pairs:
        if flag == "--max-num-seqs":
            value = given
    text = str(value)
    return int(text) if text.isdigit() and 0 < int(text) <= 1_000_000 else None


def _whole(value: Any) -> Any:
    """An inventory number as Ansible may pass it (``-e name=300`` gives the text "300"): whole-number text as int."""
    return int(value) if isinstance(value, str) and value.isdigit() and len(value) <= 7 else value


def _options(options: Any, errors: list[str]) -> dict[str, Any]:
    """The fleet endpoint's, the exporter's and the paths' settings, checked (errors name the variable)."""
    options = options if isinstance(options, dict) else {}
    out: dict[str, Any] = {}
    for key, var, default in (("endpoint_port", "d3_router_port", 8000), ("metrics_port", "d3_router_metrics_port", 8405),
                              ("health_port", "d3_router_health_port", 8406)):  # fmt: skip
        value = options.get(key, default)
        if not _port_ok(value):
            errors.append(f"{var} = {shown(value)} is not a TCP port (1-65535). Fix the inventory.")
            value = None
        out[key] = value
    extra = options.get("allowed_paths") or []
    paths = list(PATHS)
    if not isinstance(extra, list):
        errors.append(f"d3_router_allowed_paths = {shown(extra)} is not a list of URL paths. Fix the inventory.")
        extra = []
    for path in extra:
        if not isinstance(path, str) or not URL_PATH.match(path) or "/../" in path + "/" or "/./" in path + "/":
            errors.append(f"d3_router_allowed_paths: {shown(path)} is not a URL path (/v1/name: letters, digits, . _ ~ -; "
                          "no query, no .. segment). Fix the inventory.")  # fmt: skip
        elif path not in paths:
            paths.append(path)
    out["paths"] = paths
    kib = _whole(options.get("max_request_kib", 256))
    if isinstance(kib, bool) or not isinstance(kib, int) or not 16 <= kib <= 65536:
        errors.append(f"d3_router_max_request_kib = {shown(kib)} is not a whole number of KiB (16-65536). Fix the inventory.")
        kib = 256
    out["max_request_kib"] = kib
    maxconn = _whole(options.get("maxconn", 0))
    if isinstance(maxconn, bool) or not isinstance(maxconn, int) or not 0 <= maxconn <= 1_000_000:
        errors.append(f"d3_router_maxconn = {shown(maxconn)} is not a whole number of connections (0: from the plan, "
                      "or 1-1000000). Fix the inventory.")  # fmt: skip
        maxconn = 0
    out["maxconn"] = maxconn
    out["api_keys"] = options.get("api_keys") is True
    allowed = options.get("metrics_allowed") or []
    out["metrics_allowed"] = []
    if not isinstance(allowed, list):
        errors.append(f"d3_router_metrics_allowed = {shown(allowed)} is not a list of IP addresses or networks. Fix the inventory.")
        allowed = []
    for position, network in enumerate(allowed):
        problem = check("network", network)
        if problem:
            errors.append(f"d3_router_metrics_allowed[{position}] = {shown(network)} {problem}. Fix the inventory.")
        else:
            out["metrics_allowed"].append(str(ipaddress.ip_network(str(network), strict=False)))
    return out


def router_backends(
    _input: Any,
    router_host: str = "",
    ports: Any = None,
    listen_address: Any = None,
    options: Any = None,
) -> dict[str, Any]:
    """``_input``: ``{host: {plan, backend_address, backend_port_offset, ansible_host, api_key,
    allow_unauthenticated}}`` for every host of ``l4-nodes`` (``backend_port_offset``: what a NAT between router and
    host adds to every instance port, default 0; ``plan`` is the host's ``d3_host_plan`` or None when this run did not
    plan it; ``api_key``: whether the host has ``d3_units_api_key``, never the key). ``listen_address``: where the
    router listens (None: no router listens, e.g. the rollout's or the monitor's view; no key rule). ``options``: ``endpoint_port``,
    ``metrics_port``, ``health_port``, ``metrics_allowed``, ``allowed_paths``. Returns ``{models, servers, endpoint,
    metrics, health, client_ports, errors}``."""
    errors: list[str] = []
    ports = {} if ports is None else ports
    if not isinstance(_input, dict):
        return {"models": [], "servers": {}, "endpoint": {}, "metrics": {}, "health": {}, "client_ports": [],
                "errors": [f"fleet hosts: expected a mapping of host to plan, got {shown(_input)}"]}  # fmt: skip
    if not isinstance(ports, dict):
        errors.append(f"d3_router_ports = {shown(ports)} is not a mapping of model or served name to port. Fix the inventory.")
        ports = {}
    if listen_address is not None and check("ip", listen_address):
        errors.append(f"d3_router_listen_address = {shown(listen_address)} {check('ip', listen_address)} "
                      "(0.0.0.0: every IPv4 address, :: every IPv6 address). Fix the inventory.")  # fmt: skip
    settings = _options(options, errors)
    # the key rule is the router's (the role passes where it listens); other readers of the fleet (the rollout, the
    # monitor) pass none
    bound_to = _ip(str(listen_address))
    exposed = listen_address is not None and (bound_to is None or not bound_to.is_loopback)

    by_name: dict[str, dict[str, Any]] = {}
    servers: dict[str, dict[str, dict[str, Any]]] = {}
    taken_names: dict[str, str] = {}
    host_ports: dict[int, str] = {}  # the router host's own instance ports (when it is an l4 host too)
    for host in sorted(_input, key=str):
        spec = _input[host]
        if not isinstance(host, str) or not host or not control_free(host):
            errors.append(f"l4-nodes host {shown(host)}: a host name must be one line of text. Fix the inventory.")
            continue
        spec = spec if isinstance(spec, dict) else {}
        plan = spec.get("plan")
        if not isinstance(plan, dict) or not isinstance(plan.get("instances"), list):
            errors.append(f"host {host} (l4-nodes) has no d3_host_plan: this run did not plan it, so the router cannot "
                          "know its instances. Run site.yml without a --limit that leaves l4-nodes hosts out "
                          "(e.g. -l 'l4-nodes:d3-routers'), and fix the host if its plan failed.")  # fmt: skip
            continue
        explicit = spec.get("backend_address")
        if explicit is not None and explicit != "":
            problem = _address_problem(explicit)
            if problem:
                errors.append(f"host {host}: d3_router_backend_address = {shown(explicit)} {problem}. Fix the inventory.")
                continue
        offset = spec.get("backend_port_offset")
        offset = 0 if offset is None or offset == "" else offset
        if isinstance(offset, bool) or not isinstance(offset, int) or not -65534 <= offset <= 65534:
            errors.append(f"host {host}: d3_router_backend_port_offset = {shown(offset)} is not a whole number of ports "
                          "(-65534..65534). Fix the inventory.")  # fmt: skip
            continue
        keyless = spec.get("api_key") is not True and spec.get("allow_unauthenticated") is not True
        fallback = spec.get("ansible_host")
        fallback_var = "ansible_host"
        if fallback is None or fallback == "":
            fallback, fallback_var = host, "the inventory name"
        for inst in plan["instances"]:
            if not isinstance(inst, dict):
                errors.append(f"host {host}: d3_host_plan has an instance that is not a mapping: {shown(inst)}")
                continue
            name, served, model = inst.get("name"), inst.get("served_model_name"), inst.get("model")
            port, bind = inst.get("port"), inst.get("bind_address")
            where = f"host {host} instance {shown(name)}"
            bad = [f"{key} {shown(value)}" for key, value in (("name", name), ("served_model_name", served), ("model", model))
                   if not isinstance(value, str) or not SERVED_NAME.match(value)]  # fmt: skip
            if not _port_ok(port):
                bad.append(f"port {shown(port)}")
            if bad:
                errors.append(f"{where}: the plan's {', '.join(bad)} cannot go into the router's configuration "
                              "(names: letters, digits, . _ -; port 1-65535). Fix d3_models / d3_fleet_models.")  # fmt: skip
                continue
            if host == router_host:
                host_ports[port] = name
            bound = _ip(str(bind)) if isinstance(bind, str) and control_free(bind) else None
            if explicit:
                address, source = explicit, "d3_router_backend_address"
            elif bound is not None and not bound.is_loopback and not bound.is_unspecified:
                address, source = str(bound), "the instance's bind address (d3_listen_address)"
            else:
                address, source = fallback, fallback_var
            if bound is not None and bound.is_loopback:
                if host != router_host:
                    errors.append(f"{where} listens on {bound} only (d3_listen_address), so the router on "
                                  f"{router_host or 'another host'} cannot reach it: {LISTEN_HINT}.")  # fmt: skip
                    continue
                address, source = str(bound), "the instance's loopback bind address (the router runs on this host)"
            elif bound is None:
                errors.append(f"{where}: the plan's bind_address {shown(bind)} is not an IP address. Fix d3_listen_address.")
                continue
            problem = _address_problem(address)
            if problem:
                errors.append(f"{where}: the router's address for it, {source} = {shown(address)}, {problem}. "
                              "Set d3_router_backend_address on that host.")  # fmt: skip
                continue
            resolved = _ip(address)
            if resolved is not None and (resolved.is_loopback or resolved.is_unspecified) and host != router_host:
                seen_from = f"the router {router_host}" if router_host else "the router"
                errors.append(f"{where}: the router would connect to {address} ({source}), which is not that host as "
                              f"seen from {seen_from}. Set d3_router_backend_address on {host} to an "
                              "address the router reaches it at.")  # fmt: skip
                continue
            if not _port_ok(port + offset):
                errors.append(f"{where}: its port {port} + d3_router_backend_port_offset {offset} = {port + offset} is "
                              "not a TCP port (1-65535). Fix the inventory.")  # fmt: skip
                continue
            if exposed and keyless:
                errors.append(f"{where} has no API key and the router listens on {listen_address} "
                              "(d3_router_listen_address), beyond loopback: anyone who reaches the router could use it. "
                              f"Set d3_units_api_key (Ansible Vault) on {host}, or d3_allow_unauthenticated: true on "
                              f"{host} to serve it open on purpose, or d3_router_listen_address: 127.0.0.1.")  # fmt: skip
                continue
            maxconn = _max_num_seqs(inst.get("args"))
            if maxconn is None:
                errors.append(f"{where}: its --max-num-seqs in the plan's flags is not a whole number (1-1000000), so the "
                              "router cannot size its maxconn. Fix its extra_args.")  # fmt: skip
                continue
            sname = server_name(host, name)
            if sname in taken_names:
                errors.append(f"{where}: its router server name {sname!r} is also that of {taken_names[sname]}. "
                              "Rename the instance (`name:`) or the host.")  # fmt: skip
                continue
            taken_names[sname] = where
            entry = by_name.setdefault(served, {"models": set(), "servers": [], "cards": []})
            entry["models"].add(model)
            entry["cards"].append((sname, inst.get("hf_repo"), inst.get("max_model_len")))
            entry["servers"].append({"name": sname, "address": address, "port": port + offset, "host": host, "instance": name,
                                     "maxconn": maxconn})  # fmt: skip
            servers.setdefault(host, {})[name] = {"backend": f"be_{served}", "server": sname, "frontend": f"fe_{served}"}

    names = sorted(by_name)
    by_model: dict[str, list[str]] = {}
    for served in names:
        for model in by_name[served]["models"]:
            by_model.setdefault(model, []).append(served)
    wanted: dict[str, tuple[int, str]] = {}
    for key in sorted(ports, key=str):
        value = ports[key]
        if not _port_ok(value):
            errors.append(f"d3_router_ports[{shown(key)}] = {shown(value)} is not a TCP port (1-65535). Fix the inventory.")
            continue
        if key in by_name:
            wanted[key] = (value, f"d3_router_ports[{key!r}]")
        elif key in by_model and len(by_model[key]) == 1:
            wanted.setdefault(by_model[key][0], (value, f"d3_router_ports[{key!r}]"))
        elif key in by_model:
            errors.append(f"d3_router_ports[{key!r}]: model {key} is served under several names ({', '.join(by_model[key])}); "
                          "key the port by served name instead.")  # fmt: skip
        else:
            errors.append(f"d3_router_ports[{shown(key)}] names no model served in the fleet (served: "
                          f"{', '.join(names) or 'none'}). Fix or remove it.")  # fmt: skip

    models = []
    used: dict[int, str] = {}
    for var, key in (("d3_router_port", "endpoint_port"), ("d3_router_metrics_port", "metrics_port"),
                     ("d3_router_health_port", "health_port")):  # fmt: skip
        port = settings[key]
        if port is None:
            continue
        if port in used:
            errors.append(f"{var} {port} is also {used[port]}. Give each its own port.")
        elif port in host_ports:
            errors.append(f"{var} {port} is also the port of instance {host_ports[port]} on the router host {router_host}. "
                          "Choose another.")  # fmt: skip
        used[port] = var
    for served in names:
        entry = by_name[served]
        port, why = wanted.get(served, (None, ""))
        if port in used:
            errors.append(f"model {served}: its router port {port} ({why}) is also that of {used[port]}. "
                          "Give each model its own port in d3_router_ports.")  # fmt: skip
            continue
        if port in host_ports:
            errors.append(f"model {served}: its router port {port} ({why}) is also the port of instance "
                          f"{host_ports[port]} on the router host {router_host}. Choose another in d3_router_ports.")  # fmt: skip
            continue
        if len(entry["models"]) > 1:
            errors.append(f"served name {served} is used by different models ({', '.join(sorted(entry['models']))}) on "
                          "different hosts: clients would get either. Give the instances distinct `name:`.")  # fmt: skip
            continue
        if port is not None:
            used[port] = f"model {served}"
        capacity = sum(s["maxconn"] for s in entry["servers"])
        models.append({
            "model": next(iter(entry["models"])),
            "served_name": served,
            "frontend": None if port is None else f"fe_{served}",
            "backend": f"be_{served}",
            "port": port,
            "capacity": capacity,
            "maxconn": 2 * capacity if port is not None else None,
            "servers": sorted(entry["servers"], key=lambda s: s["name"]),
            "card": min(entry["cards"]),  # (server name, ...): the first server's, names are unique
        })  # fmt: skip
    if not by_name and not errors:
        errors.append("no instance is planned on any host of l4-nodes: the router has nothing to route (HAProxy does "
                      "not start without a frontend). Plan models (d3_models, d3_fleet_models) first.")  # fmt: skip
    served_names = [m["served_name"] for m in models]
    # GET /v1/models as vLLM answers it (ModelList of ModelCard: tests/contracts/vllm/models.json), for the whole fleet;
    # created is 0 (the configuration must not change on every run), root the checkpoint the plan serves
    listing = {"object": "list", "data": [
        {"id": m["served_name"], "object": "model", "created": 0, "owned_by": "vllm", "root": m["card"][1], "parent": None,
         "max_model_len": m["card"][2]} for m in models]}  # fmt: skip
    # vLLM's ErrorResponse (ErrorInfo: message, type, param, code) for a model it does not serve: NotFoundError, 404
    message = f"The model in the request is not served by this fleet. Served models: {', '.join(served_names) or 'none'}."
    unknown = {"error": {"message": message, "type": "NotFoundError", "param": "model", "code": 404}}
    for m in models:
        del m["card"]
    files = {"models.json": listing, "unknown-model.json": unknown,
             # vLLM's AuthenticationMiddleware answer (tests/contracts/vllm/unauthorized.json)
             "unauthorized.json": {"error": "Unauthorized"},
             "headers-too-long.json": _error(f"The request's header block is over {HEADER_KIB} KiB.", 400),
             "too-large.json": _error(f"The request body is over {settings['max_request_kib']} KiB "
                                      "(d3_router_max_request_kib), or did not arrive whole.", 413),
             **{f"{verdict}.json": _error(message, 400) for verdict, message in BODY_ERRORS.items()}}  # fmt: skip
    endpoint = {"port": settings["endpoint_port"], "paths": settings["paths"],
                "models_json": json.dumps(listing, sort_keys=True) + "\n", "unknown_json": json.dumps(unknown, sort_keys=True) + "\n",
                "files": {name: json.dumps(body, sort_keys=True) + "\n" for name, body in files.items()},
                "body_errors": list(BODY_ERRORS), "api_keys": settings["api_keys"]}  # fmt: skip
    metrics = {"port": settings["metrics_port"], "allowed": settings["metrics_allowed"]}
    # keepalived's check asks this frontend (127.0.0.1 only, its own maxconn): never starved by the endpoint's clients
    health = {"port": settings["health_port"], "maxconn": HEALTH_MAXCONN}
    # the ports clients connect to (the firewall role guards them on a router); the exporter has its own allow list
    client_ports = sorted({settings["endpoint_port"], *(m["port"] for m in models if m["port"])} - {None})
    return {"models": models, "servers": servers, "endpoint": endpoint, "metrics": metrics, "health": health,
            "client_ports": client_ports,
            "limits": limits(models, settings["max_request_kib"], settings["maxconn"]), "errors": errors}  # fmt: skip


def _error(message: str, code: int) -> dict[str, Any]:
    """vLLM's ErrorResponse for a request it refuses (create_error_response's default type, BadRequestError)."""
    return {"error": {"message": message, "type": "BadRequestError", "param": None, "code": code}}


def limits(models: list[dict[str, Any]], max_request_kib: int, maxconn: int = 0) -> dict[str, Any]:
    """HAProxy's buffer and connection limits from the plan (docs/router.md, "Connections and memory"):

    - ``bufsize``: the largest body, ``HEADER_KIB`` of headers and ``MAXREWRITE`` (the endpoint buffers the whole
      request to read its model);
    - ``capacity``: the requests the fleet's instances take at once, the sum of every server's ``maxconn``;
    - ``fleet_maxconn``: the fleet endpoint's connections, ``maxconn`` when given (d3_router_maxconn), else twice the
      capacity (as many clients waiting, in HAProxy's queue or between two requests, as served);
    - ``global_maxconn``: the fleet endpoint's, every model port's (twice its backend's capacity), the health
      frontend's ``HEALTH_MAXCONN`` and ``SPARE_CONNECTIONS``: the frontends' limits fit in it, so no frontend's
      clients can take another's connections;
    - ``memory_mib``: the most the buffers can take, two per connection (request and response), rounded up."""
    bufsize = max_request_kib * 1024 + HEADER_KIB * 1024 + MAXREWRITE
    capacity = sum(m["capacity"] for m in models)
    fleet = maxconn or max(2 * capacity, 1)
    total = fleet + sum(m["maxconn"] for m in models if m["maxconn"]) + HEALTH_MAXCONN + SPARE_CONNECTIONS
    return {"max_body": max_request_kib * 1024, "bufsize": bufsize, "maxrewrite": MAXREWRITE, "header_kib": HEADER_KIB,
            "capacity": capacity,
            "fleet_maxconn": fleet, "global_maxconn": total, "spare": SPARE_CONNECTIONS, "health_maxconn": HEALTH_MAXCONN,
            "memory_mib": -(-total * 2 * bufsize // (1024 * 1024)), "tls": dict(TLS)}  # fmt: skip


def key_hashes(keys: Any) -> dict[str, Any]:
    """d3_router_api_keys (a list of keys, from Ansible Vault) -> ``{hashes, file, errors}``: the SHA-256 (hex) of each
    key, what the router's configuration compares a client's Bearer token against, and the file HAProxy reads them from
    (one a line); an error names the key by its position only, never its text."""
    if keys is None or keys == "" or keys == []:
        return {"hashes": [], "file": "", "errors": []}
    if not isinstance(keys, list):
        return {"hashes": [], "file": "", "errors": ["d3_router_api_keys is not a list of keys. Fix the inventory (Ansible Vault)."]}
    hashes, errors = [], []
    for position, key in enumerate(keys):
        if not isinstance(key, str) or not API_KEY.match(key):
            errors.append(f"d3_router_api_keys[{position}] is not a key the router can check: want 16-512 characters of "
                          "letters, digits and . _ ~ + / - (a Bearer token). Fix the inventory (Ansible Vault).")  # fmt: skip
        else:
            hashes.append(hashlib.sha256(key.encode()).hexdigest())
    unique = sorted(set(hashes))
    return {"hashes": unique, "file": "".join(f"{h}\n" for h in unique), "errors": errors}


class FilterModule:
    """Ansible filters: d3_router_backends, d3_router_key_hashes."""

    def filters(self) -> dict[str, Any]:
        return {"d3_router_backends": router_backends, "d3_router_key_hashes": key_hashes}
