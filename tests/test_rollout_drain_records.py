"""The d3_state role's drain records on a router (tasks drains_record, drains_read, drains_restore, drains_clear), run
by ansible-playbook on localhost against a fake HAProxy stats socket (tests/fake_haproxy.py): a drain a rollout
recorded and did not give back is reported as left by an interrupted rollout (d3_status_drains, as status.yml prints
it) and given back by the next run, unless HAProxy now shows it in MAINT (an operator's: it stays); the records go."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from fake_haproxy import FakeHAProxy

pytestmark = [pytest.mark.playbook,  # every test here runs ansible-playbook (tests/conftest.py enforces it)
              pytest.mark.skipif(os.geteuid() != 0, reason="the records are root's files (owner root)")]  # fmt: skip

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
LITE2 = {"backend": "be_d3-lite", "server": "d3-lab-host2-d3-lite", "instance": "d3-lite"}
LITE3 = {"backend": "be_d3-lite", "server": "d3-lab-host3-d3-lite", "instance": "d3-lite"}


def play(tmp: Path, fake: FakeHAProxy, tasks: list[dict]) -> subprocess.CompletedProcess[str]:
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable, "d3_router_stats_socket": fake.path,
             "d3_state_drains_dir": str(tmp / "drains")}  # fmt: skip
    inventory = {"all": {"children": {"d3-routers": {"hosts": {"router": local}}, "l4-nodes": {"hosts": {"l4-a": local}}}}}
    (tmp / "hosts.yml").write_text(yaml.safe_dump(inventory))
    (tmp / "play.yml").write_text(yaml.safe_dump([{"hosts": "l4-a", "gather_facts": False, "tasks": tasks}]))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    return subprocess.run([str(BIN / "ansible-playbook"), str(tmp / "play.yml"), "-i", str(tmp / "hosts.yml")], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=180, check=False)  # fmt: skip


def state(tasks_from: str, **params: object) -> dict:
    return {"ansible.builtin.include_role": {"name": "d3_state", "tasks_from": tasks_from}, "vars": params}


def test_a_left_drain_is_reported_then_given_back_but_an_operators_maint_stays(tmp_path: Path) -> None:
    plan = [{"router": "router", "drain": [LITE2, LITE3], "kept": []}]
    with FakeHAProxy.started() as fake:
        fake.status[("be_d3-lite", LITE2["server"])] = ["DRAIN"]
        fake.status[("be_d3-lite", LITE3["server"])] = ["MAINT"]
        proc = play(tmp_path, fake, [
            state("drains_restore.yml", _d3_state_routers=["router"]),   # nothing recorded yet: makes the directory
            state("drains_record.yml", _d3_state_drains=plan),
            state("drains_read.yml", _d3_state_routers=["router"]),
            {"name": "Report", "ansible.builtin.debug": {"msg": "{{ d3_state_drains_records['router'] | "
                                                         "d3fleet.fleet.d3_status_drains(d3_state_drains_stat['router'], 'router') }}"}},
            state("drains_restore.yml", _d3_state_routers=["router"]),
            {"name": "Restored", "ansible.builtin.debug": {"msg": "{{ d3_state_drains_restored | to_json }}"}},
        ])  # fmt: skip
        commands = list(fake.commands)
    assert proc.returncode == 0, proc.stdout[-3000:]
    out = " ".join(proc.stdout.split())  # the YAML callback folds long lines
    assert f"router router: be_d3-lite/{LITE2['server']} (host l4-a, instance d3-lite) left by an interrupted rollout" in out
    assert "now DRAIN. The next rollout.yml or site.yml gives it back." in out
    assert "now MAINT." in out
    # only the drained one is set ready; the MAINT (an operator's, set after the record) stays
    assert f"set server be_d3-lite/{LITE2['server']} state ready" in commands
    assert not [c for c in commands if LITE3["server"] in c and c.startswith("set server")], commands
    assert f"Given back what an interrupted rollout left drained: be_d3-lite/{LITE2['server']} (records in" in out, out[-2000:]
    assert list((tmp_path / "drains").iterdir()) == []
    assert oct((tmp_path / "drains").stat().st_mode & 0o777) == "0o700"


def test_records_are_one_root_only_file_per_server_and_cleared_after_the_give_back(tmp_path: Path) -> None:
    plan = [{"router": "router", "drain": [LITE2], "kept": []}, {"router": "router", "drain": [], "kept": ["x"]}]
    record = tmp_path / "drains" / f"be_d3-lite--{LITE2['server']}.json"
    with FakeHAProxy.started() as fake:
        first = play(tmp_path, fake, [state("drains_restore.yml", _d3_state_routers=["router"]),
                                      state("drains_record.yml", _d3_state_drains=plan)])  # fmt: skip
        assert first.returncode == 0, first.stdout[-3000:]
        assert [p.name for p in (tmp_path / "drains").iterdir()] == [record.name]
        assert (record.stat().st_mode & 0o777, record.stat().st_uid) == (0o600, 0)
        content = json.loads(record.read_text())
        assert {k: content[k] for k in ("backend", "server", "host", "instance", "by")} == {
            **{k: LITE2[k] for k in ("backend", "server", "instance")}, "host": "l4-a", "by": "playbooks/rollout.yml"}
        cleared = play(tmp_path, fake, [state("drains_clear.yml", _d3_state_drains=plan)])
    assert cleared.returncode == 0, cleared.stdout[-3000:]
    assert list((tmp_path / "drains").iterdir()) == []
