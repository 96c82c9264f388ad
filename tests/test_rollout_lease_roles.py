"""The d3_state role's lease tasks (lease.yml, lease_release.yml) and the drain give-back with owners
(drains_restore.yml, as site.yml and rollout.yml run it), by ansible-playbook on localhost against a fake HAProxy
stats socket: a live rollout's drains stay while one whose owner is gone is given back, a second rollout is refused
naming the first, the lease file is root's only and given back at the end."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from fake_haproxy import FakeHAProxy
from test_rollout_drain_records import LITE2, LITE3, play, state

pytestmark = [pytest.mark.playbook,
              pytest.mark.skipif(os.geteuid() != 0, reason="the lease and records are root's files (owner root)")]  # fmt: skip


def test_a_live_rollouts_drains_stay_the_orphans_go_back_and_a_second_rollout_is_refused(tmp_path: Path) -> None:
    lease_file = tmp_path / "lease" / "rollout-lease.json"
    routers = {"_d3_state_routers": ["router"], "d3_state_lease_file": str(lease_file)}
    with FakeHAProxy.started() as fake:
        fake.status[("be_d3-lite", LITE2["server"])] = ["DRAIN"]
        fake.status[("be_d3-lite", LITE3["server"])] = ["DRAIN"]
        proc = play(tmp_path, fake, [
            state("drains_restore.yml", **routers),   # makes the records' directory
            state("lease.yml", _d3_state_rollout_id="run-a", _d3_state_rollout_started="t0", **routers),
            state("drains_record.yml", _d3_state_rollout_id="run-a", _d3_state_drains=[{"router": "router", "drain": [LITE2]}]),
            state("drains_record.yml", _d3_state_rollout_id="run-gone", _d3_state_drains=[{"router": "router", "drain": [LITE3]}]),
            state("drains_restore.yml", **routers),   # site.yml's give-back while run-a holds the routers
            {"name": "Restored", "ansible.builtin.debug": {"msg": "restored {{ d3_state_drains_restored | to_json }}"}},
            {"name": "Second", "block": [state("lease.yml", _d3_state_rollout_id="run-b", _d3_state_rollout_started="t1",
                                               **routers)],
             "rescue": [{"name": "Refused", "ansible.builtin.debug": {"msg": "REFUSED {{ ansible_failed_result.msg }}"}}]},
            {"name": "Lease after the refusal",
             "ansible.builtin.debug": {"msg": f"LEASE {{{{ (lookup('ansible.builtin.file', '{lease_file}') | from_json).owner }}}}"}},
            state("lease_release.yml", _d3_state_rollout_id="run-a", **routers),
        ])  # fmt: skip
        commands = list(fake.commands)
    assert proc.returncode == 0, proc.stdout[-4000:]
    out = " ".join(proc.stdout.split())
    # the orphan (its rollout no longer runs) is given back; run-a's drain stays, and the run says whose it is
    assert f"set server be_d3-lite/{LITE3['server']} state ready" in commands
    assert not [c for c in commands if LITE2["server"] in c and c.startswith("set server")], commands
    assert f'restored ["be_d3-lite/{LITE3["server"]}"]' in out, out[-3000:]
    assert "router: rollout run-a (" in out and f"holds the routers: its drains stay (be_d3-lite/{LITE2['server']})" in out
    assert [p.name for p in (tmp_path / "drains").iterdir()] == [f"be_d3-lite--{LITE2['server']}.json"]
    assert json.loads((tmp_path / "drains" / f"be_d3-lite--{LITE2['server']}.json").read_text())["owner"] == "run-a"
    # a second rollout is refused, naming the first and the way out; the lease stays run-a's
    assert "REFUSED The rollout stops before any change: router router: rollout run-a (" in out
    assert "-e d3_rollout_take_over=run-a" in out
    assert "LEASE run-a" in out
    # given back at the end
    assert not lease_file.exists()
    assert oct(lease_file.parent.stat().st_mode & 0o777) == "0o755"


def test_the_lease_file_is_roots_only_and_names_who_runs(tmp_path: Path) -> None:
    lease_file = tmp_path / "rollout-lease.json"
    routers = {"_d3_state_routers": ["router"], "d3_state_lease_file": str(lease_file)}
    with FakeHAProxy.started() as fake:
        proc = play(tmp_path, fake, [state("lease.yml", _d3_state_rollout_id="run-a", _d3_state_rollout_started="t0",
                                           d3_state_lease_s=120, **routers)])  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert (lease_file.stat().st_mode & 0o777, lease_file.stat().st_uid) == (0o600, 0)
    lease = json.loads(lease_file.read_text())
    assert lease["owner"] == "run-a" and lease["started"] == "t0" and lease["pid"] > 1 and lease["pid_start"]
    assert 100 <= lease["expires"] - time.time() <= 121
