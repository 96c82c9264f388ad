"""roles/d3_router tasks/drainable.yml (rollout.yml's check before any restart) run by Ansible on localhost, its
haproxy_runtime module talking to a fake HAProxy stats socket (tests/fake_haproxy.py: the `show stat` captured from
HAProxy 3.0.11, tests/contracts/haproxy/show-stat.csv), or to a path where nothing listens, or to a socket that
answers what is not `show stat`: a router that knows every server passes; one that lacks a server, or has no HAProxy,
stops the rollout naming the router, the servers and the fix."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from fake_haproxy import FakeHAProxy

pytestmark = pytest.mark.playbook  # every test here runs ansible-playbook (tests/conftest.py enforces it)

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
KNOWN = [{"backend": "be_d3-lite", "server": "d3-lab-host2-d3-lite"}, {"backend": "be_d3-lite", "server": "d3-lab-host3-d3-lite"}]


def run(
    tmp: Path, socket_exists: bool, servers: list[dict[str, str]], rc: int = 0, extra: dict[str, object] | None = None,
    socket: str | None = None
) -> subprocess.CompletedProcess[str]:
    """rc != 0: the socket answers what is not `show stat` (HAProxy reloaded mid-read, or another program)."""
    with FakeHAProxy.started() as fake:
        if rc:
            fake.answer_stat = "Unknown command.\n\n"
        router = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
        router["d3_router_stats_socket"] = socket or (fake.path if socket_exists else str(tmp / "admin.sock"))
        inventory = {"all": {"children": {"d3-routers": {"hosts": {"router": router}}, "l4-nodes": {"hosts": {"l4-a": router}}}}}
        (tmp / "hosts.yml").write_text(yaml.safe_dump(inventory))
        (tmp / "check.yml").write_text(yaml.safe_dump([{
            "hosts": "l4-nodes", "gather_facts": False,
            "tasks": [{"ansible.builtin.include_role": {"name": "d3_router", "tasks_from": "drainable.yml"},
                       "vars": {"d3_router_drainable_servers": servers, **(extra or {})}}],
        }]))  # fmt: skip
        env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
        proc = subprocess.run([str(BIN / "ansible-playbook"), str(tmp / "check.yml"), "-i", str(tmp / "hosts.yml")], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=180, check=False)  # fmt: skip
        proc.commands = list(fake.commands)  # type: ignore[attr-defined]
        return proc


def test_a_router_that_knows_every_server_passes(tmp_path: Path) -> None:
    proc = run(tmp_path, True, KNOWN)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "failed=0" in proc.stdout and "TASK [d3_router : Refuse a rollout the routers could not drain]" in proc.stdout


def test_a_server_the_router_does_not_know_stops_the_rollout(tmp_path: Path) -> None:
    proc = run(tmp_path, True, [*KNOWN, {"backend": "be_d3-lite", "server": "l4-new-d3-lite"}])
    assert proc.returncode != 0
    assert "The rollout stops before any restart: router does not know the servers l4-new-d3-lite." in proc.stdout
    assert "d3-lab-host2-d3-lite" not in proc.stdout.split("does not know")[1].split("Configure")[0]
    assert "ansible-playbook site.yml -l d3-routers --tags router" in proc.stdout


@pytest.mark.parametrize("servers", [KNOWN, []])
def test_a_router_without_haproxy_stops_the_rollout(tmp_path: Path, servers: list[dict[str, str]]) -> None:
    proc = run(tmp_path, False, servers)
    assert proc.returncode != 0
    assert f"router: no HAProxy runtime API at {tmp_path / 'admin.sock'} ([Errno 2] No such file or directory)." in proc.stdout
    assert "Configure the routers first" in proc.stdout


def test_a_router_whose_answer_breaks_off_stops_the_rollout(tmp_path: Path) -> None:
    """The socket answers what is not `show stat` (HAProxy reloaded mid-read): not taken as the router's servers."""
    proc = run(tmp_path, True, KNOWN, rc=1)
    assert proc.returncode != 0
    assert "router: no HAProxy runtime API at /tmp/d3hx" in proc.stdout
    assert "/admin.sock (not show stat: 'Unknown command.')." in proc.stdout


@pytest.mark.parametrize(("name", "value"), [("d3_router_drain_timeout_s", "30s"), ("d3_router_ready_timeout_s", 0),
                                             ("d3_router_drain_timeout_s", "10\n"), ("d3_router_ready_timeout_s", 100000)])  # fmt: skip
def test_a_drain_or_ready_timeout_that_is_not_whole_seconds_stops_the_rollout(tmp_path: Path, name: str, value: object) -> None:
    proc = run(tmp_path, True, KNOWN, extra={name: value})
    assert proc.returncode != 0
    assert "bad router input: d3_router_drain_timeout_s = " in proc.stdout and "(want whole seconds, 1-86400)" in proc.stdout
    assert f"{name} = {json.dumps(value)}" in proc.stdout  # the message shows the value that was refused
    assert "TASK [d3_router : Read each router's servers" not in proc.stdout


def test_a_router_socket_path_that_is_not_plain_is_refused_before_anything_connects(tmp_path: Path) -> None:
    """The router's d3_router_stats_socket reaches the runtime API module: refused, naming the router and the
    variable, before any connection."""
    proc = run(tmp_path, True, KNOWN, socket="/run/haproxy/admin.sock\nshow stat")
    assert proc.returncode != 0
    assert "The rollout stops before any restart: host router: d3_router_stats_socket = " in proc.stdout, proc.stdout[-3000:]
    assert "contains a control character" in proc.stdout
    assert "TASK [d3_router : Read each router's servers" not in proc.stdout
    assert proc.commands == []  # type: ignore[attr-defined]
