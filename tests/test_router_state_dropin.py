"""roles/d3_router's drop-in for haproxy.service (templates/d3-server-state.conf.j2), rendered with Jinja2 as the
role's template task renders it: every reload, restart and stop saves the servers' state first (the helper
files/d3-haproxy-save-state, plugins/module_utils/d3_server_state.py), made to agree with the configuration the next
worker loads, and every start makes the saved file agree with it, so an operator's `systemctl reload haproxy` keeps
the drains as the role's reload does and a moved port is reached (tests/test_router_server_state.py).
The package's own reload is run by the helper under the lock that orders it with the module's changes (its check
line verbatim, then SIGUSR2 to $MAINPID): checked against upstream's unit (tests/contracts/haproxy/haproxy.service.in,
@SBINDIR@ = /usr/sbin as on Debian)."""

from __future__ import annotations

from pathlib import Path

import jinja2
import yaml

ROOT = Path(__file__).resolve().parents[1]
ROLE = ROOT / "roles/d3_router"
CONTRACT = ROOT / "tests/contracts/haproxy/haproxy.service.in"


def role_vars() -> dict:
    return {**yaml.safe_load((ROLE / "defaults/main.yml").read_text()), **yaml.safe_load((ROLE / "vars/main.yml").read_text())}


def render(**over: str) -> list[str]:
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    text = env.from_string((ROLE / "templates/d3-server-state.conf.j2").read_text()).render(
        ansible_managed="Ansible managed", **{**role_vars(), **over})
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def upstream(key: str) -> list[str]:
    lines = CONTRACT.read_text().splitlines()
    return [line.replace("@SBINDIR@", "/usr/sbin") for line in lines if line.startswith(f"{key}=")]


def test_every_reload_saves_the_state_first_then_runs_the_packages_own_reload() -> None:
    v = role_vars()
    save = f"{v['_d3_router_save_state']} {v['d3_router_stats_socket']} {v['_d3_router_state_file']} $CONFIG"
    lines = render()
    assert lines[0] == "[Service]"
    reload = [line for line in lines if line.startswith("ExecReload=")]
    check, kill = upstream("ExecReload")
    # emptied (a drop-in cannot prepend), then one command under the lock: the save, upstream's check verbatim after
    # `--`, and its SIGUSR2 to $MAINPID (d3_server_state.reload runs the check's line as the package runs it)
    assert kill == "ExecReload=/bin/kill -USR2 $MAINPID"
    helper, _, package = reload[1].partition(" -- ")
    assert reload == ["ExecReload=", reload[1]] and f"ExecReload={package}" == check
    assert helper == (f"ExecReload={v['_d3_router_save_state']} --reload {v['d3_router_stats_socket']} "
                      f"{v['_d3_router_state_file']} $CONFIG $MAINPID")  # fmt: skip
    # a restart or stop saves too; the package has no ExecStop= of its own to keep
    assert [line for line in lines if line.startswith("ExecStop=")] == [f"ExecStop={save}"]
    assert upstream("ExecStop") == []
    # a start makes the saved file agree with the configuration, after the package's own check of it (a drop-in's
    # ExecStartPre= is added after the package's), with the same $CONFIG the package's lines read
    assert [line for line in lines if line.startswith("ExecStartPre=")] == [
        f"ExecStartPre={v['_d3_router_save_state']} --reconcile {v['_d3_router_state_file']} $CONFIG"]
    assert upstream("ExecStartPre") == ["ExecStartPre=/usr/sbin/haproxy -Ws -f $CONFIG -c -q $EXTRAOPTS"]
    assert 'Environment="CONFIG=/etc/haproxy/haproxy.cfg"' in CONTRACT.read_text()
    assert len(lines) == 1 + 2 + 1 + 1  # nothing else is overridden


def test_the_socket_and_the_file_are_the_roles_and_the_helper_is_the_role_file() -> None:
    lines = render(d3_router_stats_socket="/run/other/admin.sock")
    assert ("ExecStop=/usr/local/libexec/d3-fleet/d3-haproxy-save-state /run/other/admin.sock /var/lib/haproxy/server-state"
            " $CONFIG") in lines  # fmt: skip
    # the helper is the collection's Python (tested in tests/test_router_server_state.py), installed from the role
    helper = ROLE / "files/d3-haproxy-save-state"
    assert helper.is_symlink() and helper.resolve() == (ROOT / "collections/ansible_collections/d3fleet/fleet/plugins/"
                                                        "module_utils/d3_server_state.py").resolve()  # fmt: skip
    config = (ROLE / "templates/haproxy.cfg.j2").read_text()
    assert "server-state-file {{ _d3_router_state_file }}" in config and "load-server-state-from-file global" in config
