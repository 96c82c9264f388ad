"""roles/d3_router's haproxy.cfg rendered by Ansible on localhost (the role's read-only preflight, then its template
into a temporary directory: no lab, no HAProxy needed), its frontends, backends, servers and health checks checked
line by line; the role's refusal of an l4 host this run did not plan; and HAProxy's own check of the file
(`haproxy -c`, lab: the lab's router host has HAProxy)."""

from __future__ import annotations

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
            {"ansible.builtin.copy": {"content": "{{ {'models': d3_router_models, 'servers': d3_router_servers} | to_json }}",
                                      "dest": str(tmp / "facts.json"), "mode": "0644"}},
        ]}]))  # fmt: skip
    return ansible_playbook(str(tmp / "render.yml"), "-i", str(tmp / "hosts.yml"))


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory, catalog_vars: dict[str, Any]) -> tuple[str, dict[str, Any], dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("router")
    hosts = {
        "l4-a": {"ansible_host": "10.0.0.11", "d3_host_plan": plan(catalog_vars, [{"model": "d3-flash"}, {"model": "d3-mini"}], "l4-a")},
        "l4-b": {"ansible_host": "10.0.0.12", "d3_router_backend_address": "l4-b.internal.example",
                 "d3_host_plan": plan(catalog_vars, [{"model": "d3-flash"}], "l4-b")},
    }  # fmt: skip
    proc = render(tmp, hosts, {"d3_router_ports": {"d3-mini": 9100}, "d3_router_timeout_s": 300, "d3_router_check_interval_ms": 500})
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


def test_one_frontend_per_model_on_its_port(rendered: tuple[str, dict[str, Any], dict[str, Any]]) -> None:
    cfg = sections(rendered[0])
    assert cfg["frontend fe_d3-flash"] == ["bind 0.0.0.0:9000", "default_backend be_d3-flash"]
    assert cfg["frontend fe_d3-mini"] == ["bind 0.0.0.0:9100", "default_backend be_d3-mini"]
    assert [s for s in cfg if s.startswith(("frontend", "backend"))] == [
        "frontend fe_d3-flash", "backend be_d3-flash", "frontend fe_d3-mini", "backend be_d3-mini"]  # fmt: skip


def test_backends_hold_every_replica_with_health_checks(rendered: tuple[str, dict[str, Any], dict[str, Any]]) -> None:
    text, _, hosts = rendered
    cfg = sections(text)
    port = {h: {i["name"]: i["port"] for i in hosts[h]["d3_host_plan"]["instances"]} for h in hosts}
    head = ["balance leastconn", "option httpchk GET /health", "http-check expect status 200",
            "default-server check inter 500 fall 2 rise 2 init-addr last,libc,none"]  # fmt: skip
    assert cfg["backend be_d3-flash"] == [*head, f"server l4-a-d3-flash 10.0.0.11:{port['l4-a']['d3-flash']}",
                                          f"server l4-b-d3-flash l4-b.internal.example:{port['l4-b']['d3-flash']}"]  # fmt: skip
    assert cfg["backend be_d3-mini"] == [*head, f"server l4-a-d3-mini 10.0.0.11:{port['l4-a']['d3-mini']}"]


def test_timeouts_retries_and_the_runtime_api(rendered: tuple[str, dict[str, Any], dict[str, Any]]) -> None:
    cfg = sections(rendered[0])
    assert {"mode http", "timeout connect 2s", "timeout client 300s", "timeout server 300s", "retries 2",
            "option redispatch 1"} <= set(cfg["defaults"])  # fmt: skip
    assert "stats socket /run/haproxy/admin.sock mode 660 level admin expose-fd listeners" in cfg["global"]
    # no secret and no header rewriting: the clients' Authorization header passes through untouched
    assert not re.search(r"(?i)authorization|bearer|api[_-]?key|http-request (set|del)-header", rendered[0].replace(
        "Authorization header", "").replace("passes through", ""))  # fmt: skip


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
    proc = render(tmp_path, {"l4-a": hosts["l4-a"]}, {"d3_router_timeout_s": 0, "d3_router_stats_socket": "/run/x y"})
    assert proc.returncode != 0 and not (tmp_path / "haproxy.cfg").exists()
    assert "d3_router_stats_socket = '/run/x y' is not a plain absolute path" in proc.stdout, proc.stdout[-3000:]
    assert "d3_router_timeout_s = 0 (want whole seconds, 1-86400" in proc.stdout


# HAProxy's own check (haproxy -c) of the configuration the role wrote runs on the lab router host, with Debian's
# HAProxy: tests/lab/test_router.py (test_haproxy_config_is_checked_by_haproxy_itself).
