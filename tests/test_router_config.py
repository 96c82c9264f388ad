"""roles/d3_router's haproxy.cfg rendered by Ansible on localhost (the role's read-only preflight, then its template
into a temporary directory: no lab, no HAProxy needed), its frontends, backends, servers and health checks checked
line by line; the role's refusal of an l4 host this run did not plan; and HAProxy's own check of the file
(`haproxy -c`, lab: the lab's router host has HAProxy)."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from d3_planner import d3_plan
from l4 import l4_gpus
from testkit import ansible_playbook

pytestmark = pytest.mark.playbook

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def plan(catalog_vars: dict[str, Any], models: list[Any], host: str) -> dict[str, Any]:
    result = d3_plan(models, catalog_vars["d3_catalog"], catalog_vars["d3_catalog_common"], l4_gpus(4), host=host,
                     options={"api_key_set": True, "listen_address": "0.0.0.0"})  # fmt: skip
    assert result["errors"] == []
    return result


def render(tmp: Path, l4_hosts: dict[str, Any], router_vars: dict[str, Any] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the role's preflight and its template on localhost for a router host `router`, the l4 hosts' plans given
    as their d3_host_plan (what the l4-nodes play of site.yml sets); the file lands in tmp/haproxy.cfg."""
    router = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable, **(router_vars or {})}
    inventory = {"all": {"children": {"l4-nodes": {"hosts": l4_hosts}, "d3-routers": {"hosts": {"router": router}}}}}
    (tmp / "hosts.yml").write_text(yaml.safe_dump(inventory))
    (tmp / "render.yml").write_text(yaml.safe_dump([{
        "hosts": "d3-routers", "gather_facts": False,
        "tasks": [
            {"ansible.builtin.import_role": {"name": "d3_router", "tasks_from": "preflight"}},
            {"ansible.builtin.template": {"src": str(ROOT / "roles/d3_router/templates/haproxy.cfg.j2"),
                                          "dest": str(tmp / "haproxy.cfg"), "mode": "0644"}},
            {"ansible.builtin.copy": {"content": "{{ {'models': d3_router_models, 'servers': d3_router_servers, 'key_hashes': "
                                                 "_d3_router_key_hashes, 'view': _d3_router_view} | to_json }}",
                                      "dest": str(tmp / "facts.json"), "mode": "0644"}},
        ]}]))  # fmt: skip
    return ansible_playbook(str(tmp / "render.yml"), "-i", str(tmp / "hosts.yml"))


# a router clients reach beyond loopback (the role's default is loopback only)
ROUTER_VARS = {"d3_router_ports": {"d3-mini": 9100}, "d3_router_timeout_s": 300, "d3_router_check_interval_ms": 500,
               "d3_router_listen_address": "0.0.0.0"}  # fmt: skip


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory, catalog_vars: dict[str, Any]) -> tuple[str, dict[str, Any], dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("router")
    hosts = {
        "l4-a": {"ansible_host": "10.0.0.11", "d3_units_api_key": "k",
                 "d3_host_plan": plan(catalog_vars, [{"model": "d3-flash"}, {"model": "d3-mini"}], "l4-a")},
        "l4-b": {"ansible_host": "10.0.0.12", "d3_router_backend_address": "l4-b.internal.example", "d3_allow_unauthenticated": True,
                 "d3_host_plan": plan(catalog_vars, [{"model": "d3-flash"}], "l4-b")},
    }  # fmt: skip
    proc = render(tmp, hosts, ROUTER_VARS)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    return (tmp / "haproxy.cfg").read_text(), json.loads((tmp / "facts.json").read_text()), hosts


def sections(text: str) -> dict[str, list[str]]:
    """'frontend fe_x' -> its lines (stripped, comments left out)."""
    out: dict[str, list[str]] = {}
    current = ""
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if not line.startswith(" "):
            current = line.strip()
            out[current] = []
        else:
            out[current].append(line.strip())
    return out


PATH_ACLS = ["acl d3_path path -m str /v1/systemone", "acl d3_path path -m str /v1/models", "acl d3_path path -m str /health"]


def test_one_fleet_endpoint_routing_by_model_and_a_frontend_only_where_a_port_is_named(
        rendered: tuple[str, dict[str, Any], dict[str, Any]]) -> None:  # fmt: skip
    cfg = sections(rendered[0])
    files = "/etc/haproxy/d3-router"
    json_answer = f"content-type application/json file {files}"
    assert cfg["frontend fe_fleet"] == [
        "bind 0.0.0.0:8000 proto h1", "maxconn 1536", "option http-buffer-request", *PATH_ACLS, "acl d3_path path_beg /health/",
        "acl d3_known var(txn.d3_model) -m str d3-flash", "acl d3_known var(txn.d3_model) -m str d3-mini",
        "http-request deny deny_status 404 if !d3_path",
        f"http-request return status 400 {json_answer}/headers-too-long.json if {{ req.hdrs,length gt 32768 }}",
        f"http-request return status 413 {json_answer}/too-large.json if {{ req.body_size gt 262144 }}",
        "http-request set-var(txn.d3_size) req.body_size",
        f"http-request return status 413 {json_answer}/too-large.json if {{ req.body_len,sub(txn.d3_size) lt 0 }}",
        "http-request return status 200 if { path /health } { nbsrv(be_d3-flash) ge 1 }",
        "http-request return status 200 if { path /health } { nbsrv(be_d3-mini) ge 1 }",
        "http-request return status 503 if { path /health }",
        "http-request return status 200 if { path /health/d3-flash } { nbsrv(be_d3-flash) ge 1 }",
        "http-request return status 503 if { path /health/d3-flash }",
        "http-request return status 200 if { path /health/d3-mini } { nbsrv(be_d3-mini) ge 1 }",
        "http-request return status 503 if { path /health/d3-mini }",
        "http-request return status 404 if { path_beg /health/ }",
        f"http-request return status 200 content-type application/json file {files}/models.json if {{ path /v1/models }} METH_GET",
        "http-request lua.d3_read_model",
        *[f"http-request return status 400 {json_answer}/{verdict}.json if {{ var(txn.d3_body) -m str {verdict} }}"
          for verdict in ("not_json", "no_model", "duplicate_model", "model_not_string")],
        f"http-request return status 404 content-type application/json file {files}/unknown-model.json if !d3_known",
        "use_backend be_d3-flash if { var(txn.d3_model) -m str d3-flash }",
        "use_backend be_d3-mini if { var(txn.d3_model) -m str d3-mini }",
    ]  # fmt: skip
    # every file the configuration names is one the role writes (the filter's answers, the Lua reader; without keys,
    # no 401 and no key hashes)
    named = set(re.findall(rf"{files}/([\w.-]+)", rendered[0]))
    assert named == {*rendered[1]["view"]["endpoint"]["files"], "d3-router.lua"} - {"unauthorized.json"}, named
    # d3-mini has a port of its own (d3_router_ports), d3-flash only the endpoint; /metrics, /pause... never pass
    assert cfg["frontend fe_d3-mini"] == ["bind 0.0.0.0:9100 proto h1", "maxconn 512", *PATH_ACLS,
                                          "http-request deny deny_status 404 if !d3_path", "default_backend be_d3-mini"]  # fmt: skip
    assert [s for s in cfg if s.startswith(("frontend", "backend"))] == [
        "frontend fe_fleet", "frontend fe_health", "frontend fe_metrics", "backend be_d3-flash", "frontend fe_d3-mini",
        "backend be_d3-mini"]  # fmt: skip
    # the exporter: loopback only by default, its own port, the global maxconn's 64 spare connections
    assert cfg["frontend fe_metrics"] == [
        "bind 0.0.0.0:8405 proto h1", "maxconn 64", "no log", "acl d3_metrics_client src 127.0.0.0/8 ::1",
        "http-request deny if !d3_metrics_client", "http-request use-service prometheus-exporter if { path /metrics }",
        "http-request deny deny_status 404"]  # fmt: skip
    # keepalived's check: /health on 127.0.0.1 only (whatever d3_router_listen_address), plain, 16 connections of its
    # own; the same answer as the endpoint's /health, nothing else
    assert cfg["frontend fe_health"] == [
        "bind 127.0.0.1:8406 proto h1", "maxconn 16", "no log",
        "http-request return status 200 if { path /health } { nbsrv(be_d3-flash) ge 1 }",
        "http-request return status 200 if { path /health } { nbsrv(be_d3-mini) ge 1 }",
        "http-request return status 503 if { path /health }", "http-request deny deny_status 404"]  # fmt: skip


def test_backends_hold_every_replica_with_health_checks(rendered: tuple[str, dict[str, Any], dict[str, Any]]) -> None:
    text, _, hosts = rendered
    cfg = sections(text)
    port = {h: {i["name"]: i["port"] for i in hosts[h]["d3_host_plan"]["instances"]} for h in hosts}
    head = ["balance leastconn", "option httpchk GET /health", "http-check expect status 200",
            "default-server check inter 500 fall 2 rise 2 init-addr libc,none slowstart 10s"]  # fmt: skip
    assert cfg["backend be_d3-flash"] == [*head, f"server l4-a-d3-flash 10.0.0.11:{port['l4-a']['d3-flash']} maxconn 256",
                                          f"server l4-b-d3-flash l4-b.internal.example:{port['l4-b']['d3-flash']} maxconn 256"]  # fmt: skip
    assert cfg["backend be_d3-mini"] == [*head, f"server l4-a-d3-mini 10.0.0.11:{port['l4-a']['d3-mini']} maxconn 256"]
    # the state-file helper reads the rendered file's servers and ports (plugins/module_utils/d3_server_state.py)
    sys.path.insert(0, str(ROOT / "collections"))
    from ansible_collections.d3fleet.fleet.plugins.module_utils.d3_server_state import config_servers

    assert config_servers(text) == {
        ("be_d3-flash", "l4-a-d3-flash"): ("10.0.0.11", str(port["l4-a"]["d3-flash"])),
        ("be_d3-flash", "l4-b-d3-flash"): ("l4-b.internal.example", str(port["l4-b"]["d3-flash"])),
        ("be_d3-mini", "l4-a-d3-mini"): ("10.0.0.11", str(port["l4-a"]["d3-mini"]))}  # fmt: skip


def test_timeouts_retries_state_file_and_the_runtime_api(rendered: tuple[str, dict[str, Any], dict[str, Any]]) -> None:
    cfg = sections(rendered[0])
    assert {"mode http", "option forwardfor", "load-server-state-from-file global", "timeout connect 2s", "timeout client 300s",
            "timeout server 300s", "timeout http-request 10s", "timeout http-keep-alive 30s", "timeout queue 30s",
            "option http-server-close", "retries 2", "option redispatch 1"} <= set(cfg["defaults"])  # fmt: skip
    assert {"stats socket /run/haproxy/admin.sock mode 660 level admin expose-fd listeners",
            "server-state-file /var/lib/haproxy/server-state", "tune.bufsize 295936", "tune.maxrewrite 1024",
            "lua-load-per-thread /etc/haproxy/d3-router/d3-router.lua"} <= set(cfg["global"])  # fmt: skip
    # sized from the plan: d3-flash 2 x 256, d3-mini 256: capacity 768; the endpoint twice that, d3-mini's own port
    # twice its 256, the health frontend's 16 and the exporter's 64 (docs/router.md "Connections and memory")
    assert "maxconn 2128" in cfg["global"]
    limits = rendered[1]["view"]["limits"]
    assert (limits["capacity"], limits["fleet_maxconn"], limits["global_maxconn"], limits["memory_mib"]) == (768, 1536, 2128, 1202)
    # every frontend's maxconn fits in the global one: no frontend's clients take another's connections
    frontends = [line for name, lines in cfg.items() if name.startswith("frontend") for line in lines if line.startswith("maxconn ")]
    assert len(frontends) == 4 and sum(int(line.split()[1]) for line in frontends) == 2128
    assert not any("ssl" in line for lines in cfg.values() for line in lines)  # no TLS unless a certificate is given
    # no secret and no header rewriting: the clients' Authorization header passes through untouched, nothing captured
    secretish = r"(?i)authorization|bearer|api[_-]?key|http-request (set|del)-header|capture (request|response)"
    assert not re.search(secretish, rendered[0].replace("Authorization header", "").replace("passes through", ""))


def test_tls_on_every_client_port_and_adding_a_model_changes_no_other(
        tmp_path: Path, catalog_vars: dict[str, Any], rendered: tuple[str, dict[str, Any], dict[str, Any]]) -> None:  # fmt: skip
    """With a certificate, every client port binds with TLS (plain HTTP gets no answer: refused at the handshake), the
    exporter's stays plain; and a model added to a host changes no line of the other models' sections."""
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=router",
                    "-keyout", str(tmp_path / "key.pem"), "-out", str(tmp_path / "cert.pem")], check=True, capture_output=True)  # fmt: skip
    _, _, hosts = rendered
    hosts = {**hosts, "l4-b": {**hosts["l4-b"], "d3_host_plan": plan(catalog_vars, [{"model": "d3-flash"}, {"model": "d3-lite"}], "l4-b")}}
    proc = render(tmp_path, hosts, {**ROUTER_VARS, "d3_router_tls_certificate": (tmp_path / "cert.pem").read_text(),
                                    "d3_router_tls_key": (tmp_path / "key.pem").read_text()})  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert "PRIVATE KEY" not in proc.stdout  # the key's tasks log nothing
    cfg, before = sections((tmp_path / "haproxy.cfg").read_text()), sections(rendered[0])
    assert cfg["frontend fe_fleet"][0] == "bind 0.0.0.0:8000 ssl crt /etc/haproxy/d3-router/tls.pem alpn http/1.1 proto h1"
    assert cfg["frontend fe_d3-mini"][0] == "bind 0.0.0.0:9100 ssl crt /etc/haproxy/d3-router/tls.pem alpn http/1.1 proto h1"
    assert cfg["frontend fe_metrics"][0] == "bind 0.0.0.0:8405 proto h1"
    assert cfg["frontend fe_health"][0] == "bind 127.0.0.1:8406 proto h1"  # plain: loopback only, for keepalived
    # HTTP/1.1 only on every bind, as checked on both HAProxy versions (tests/contracts/haproxy/http1-only.yml)
    http1 = yaml.safe_load((ROOT / "tests/contracts/haproxy/http1-only.yml").read_text())["bind_options"]
    binds = [line for conf in (cfg, before) for lines in conf.values() for line in lines if line.startswith("bind ")]
    assert len(binds) >= 6 and all(b.endswith(" " + (http1["tls"] if " ssl " in b else http1["plain"])) for b in binds), binds
    # Mozilla's intermediate profile (tests/contracts/haproxy/mozilla-intermediate-6.0.json): no AES128-SHA, no DHE
    mozilla = json.loads((ROOT / "tests/contracts/haproxy/mozilla-intermediate-6.0.json").read_text())["intermediate"]
    assert {
        "ssl-default-bind-options prefer-client-ciphers ssl-min-ver TLSv1.2 no-tls-tickets",
        f"ssl-default-bind-ciphers {':'.join(mozilla['ciphers']['openssl'])}",
        f"ssl-default-bind-ciphersuites {':'.join(mozilla['ciphersuites'])}",
        f"ssl-default-bind-curves {':'.join(c for c in mozilla['tls_curves'] if c != 'X25519MLKEM768')}",
    } <= set(cfg["global"])
    for section in ("backend be_d3-flash", "backend be_d3-mini"):
        assert cfg[section] == before[section], section
    assert "backend be_d3-lite" in cfg and "use_backend be_d3-lite if { var(txn.d3_model) -m str d3-lite }" in cfg["frontend fe_fleet"]


def test_the_role_publishes_the_names_the_rollout_drains_by(rendered: tuple[str, dict[str, Any], dict[str, Any]]) -> None:
    facts = rendered[1]
    assert facts["servers"] == {
        "l4-a": {"d3-flash": {"backend": "be_d3-flash", "server": "l4-a-d3-flash", "frontend": "fe_d3-flash"},
                 "d3-mini": {"backend": "be_d3-mini", "server": "l4-a-d3-mini", "frontend": "fe_d3-mini"}},
        "l4-b": {"d3-flash": {"backend": "be_d3-flash", "server": "l4-b-d3-flash", "frontend": "fe_d3-flash"}},
    }  # fmt: skip
    assert [m["served_name"] for m in facts["models"]] == ["d3-flash", "d3-mini"]


def test_the_role_refuses_a_host_the_run_did_not_plan_and_bad_inputs(tmp_path: Path, catalog_vars: dict[str, Any]) -> None:
    hosts = {"l4-a": {"ansible_host": "10.0.0.11", "d3_host_plan": plan(catalog_vars, [{"model": "d3-flash"}], "l4-a")},
             "l4-b": {"ansible_host": "10.0.0.12"}}  # fmt: skip
    proc = render(tmp_path, hosts)
    assert proc.returncode != 0 and not (tmp_path / "haproxy.cfg").exists()
    assert "host l4-b (l4-nodes) has no d3_host_plan: this run did not plan it" in proc.stdout, proc.stdout[-3000:]
    hosts["l4-a"]["d3_units_api_key"] = "k"
    proc = render(tmp_path, {"l4-a": hosts["l4-a"]}, {"d3_router_timeout_s": 0, "d3_router_stats_socket": "/run/x y"})
    assert proc.returncode != 0 and not (tmp_path / "haproxy.cfg").exists()
    assert "d3_router_stats_socket = '/run/x y' is not a plain absolute path" in proc.stdout, proc.stdout[-3000:]
    assert "d3_router_timeout_s = 0 (want whole seconds, 1-86400" in proc.stdout
    # a key without its certificate
    proc = render(tmp_path, {"l4-a": hosts["l4-a"]}, {"d3_router_tls_key": "-----BEGIN PRIVATE KEY-----\nx"})
    assert proc.returncode != 0 and not (tmp_path / "haproxy.cfg").exists()
    assert "must be set both, or neither (plain HTTP); given: certificate no, key yes." in proc.stdout, proc.stdout[-3000:]
    assert "BEGIN PRIVATE KEY" not in proc.stdout


def test_a_keyless_backend_behind_a_router_beyond_loopback_is_refused_before_any_change(
        tmp_path: Path, catalog_vars: dict[str, Any]) -> None:  # fmt: skip
    keyless = {"l4-a": {"ansible_host": "10.0.0.11", "d3_host_plan": plan(catalog_vars, [{"model": "d3-flash"}], "l4-a")}}
    proc = render(tmp_path, keyless, {"d3_router_listen_address": "0.0.0.0"})
    assert proc.returncode != 0 and not (tmp_path / "haproxy.cfg").exists()
    assert ("host l4-a instance 'd3-flash' has no API key and the router listens on 0.0.0.0 (d3_router_listen_address), "
            "beyond loopback") in " ".join(proc.stdout.split()), proc.stdout[-3000:]  # fmt: skip
    # the role's default, loopback only, may front it
    assert render(tmp_path, keyless).returncode == 0
    assert "bind 127.0.0.1:8000 proto h1" in sections((tmp_path / "haproxy.cfg").read_text())["frontend fe_fleet"]


def test_keys_the_router_checks_reach_it_as_hashes_only_and_a_bad_one_is_refused_by_position(
        tmp_path: Path, catalog_vars: dict[str, Any]) -> None:  # fmt: skip
    """d3_router_api_keys: every /v1 request of the endpoint needs one (401 otherwise, vLLM's answer); the
    configuration and the facts hold their SHA-256, no key is printed; a key that is no Bearer token is refused before
    any change, named by its position."""
    hosts = {"l4-a": {"ansible_host": "10.0.0.11", "d3_units_api_key": "k",
                      "d3_host_plan": plan(catalog_vars, [{"model": "d3-flash"}], "l4-a")}}  # fmt: skip
    keys = ["first-key-0123456789", "second.key~with+/-0123="]
    proc = render(tmp_path, hosts, {"d3_router_api_keys": keys})
    assert proc.returncode == 0, proc.stdout[-3000:]
    text = (tmp_path / "haproxy.cfg").read_text()
    facts = json.loads((tmp_path / "facts.json").read_text())
    assert facts["key_hashes"] == sorted(hashlib.sha256(k.encode()).hexdigest() for k in keys)
    fleet = sections(text)["frontend fe_fleet"]
    assert "acl d3_key req.hdr(authorization),word(2,' '),sha2(256),hex,lower -m str -f /etc/haproxy/d3-router/api-keys.sha256" in fleet
    assert ("http-request return status 401 content-type application/json file /etc/haproxy/d3-router/unauthorized.json "
            "if { path_beg /v1/ } !d3_bearer or { path_beg /v1/ } !d3_key") in fleet  # fmt: skip
    # before the model list and the unknown model's 404, which name the served models
    assert fleet.index(next(x for x in fleet if "status 401" in x)) < fleet.index(next(x for x in fleet if "models.json" in x))
    assert (
        json.loads(facts["view"]["endpoint"]["files"]["unauthorized.json"])
        == json.loads((ROOT / "tests/contracts/vllm/unauthorized.json").read_text())["body"]
    )
    for key in keys:
        assert key not in proc.stdout and key not in text
    proc = render(tmp_path, hosts, {"d3_router_api_keys": ["good-key-0123456789", "short", "has space in it 0123456"]})
    assert proc.returncode != 0
    out = " ".join(proc.stdout.split())
    assert "d3_router_api_keys[1] is not a key the router can check" in out and "d3_router_api_keys[2]" in out, out[-2000:]
    assert "d3_router_api_keys[0]" not in out and "short" not in out.replace("shortest", "")


# HAProxy's own check (haproxy -c) of the configuration the role wrote runs on the lab router host, with Debian's
# HAProxy: tests/lab/test_router.py (test_haproxy_config_is_checked_by_haproxy_itself).
