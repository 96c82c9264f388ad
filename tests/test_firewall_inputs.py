"""d3_firewall refuses, in its read-only preflight, a rules file path that would reach d3-firewall.service's
ExecStart=/ExecReload= with a newline or a shell word (before anything changes on the host)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from testkit import ansible_playbook

pytestmark = pytest.mark.playbook  # every test here runs ansible-playbook (tests/conftest.py enforces it)

ROOT = Path(__file__).resolve().parents[1]
PLAY = """- hosts: localhost
  gather_facts: false
  tasks:
    - ansible.builtin.import_role: {name: d3_firewall, tasks_from: preflight.yml}
"""


def preflight(tmp_path: Path, extra: dict[str, object]) -> subprocess.CompletedProcess[str]:
    play = tmp_path / "preflight.yml"
    play.write_text(PLAY)
    return ansible_playbook("-i", "localhost,", str(play), "-e", json.dumps(extra), timeout=120, ANSIBLE_ROLES_PATH=str(ROOT / "roles"))


@pytest.mark.parametrize(
    "path", ["/etc/d3-fleet/x.nft\nExecStartPre=/bin/sh -c id", "/etc/d3-fleet/x.nft\n", "/etc/x.nft; rm -rf /", "x.nft"]
)
def test_a_rules_file_that_could_inject_is_refused(tmp_path: Path, path: str) -> None:
    proc = preflight(tmp_path, {"d3_firewall_rules_file": path})
    assert proc.returncode != 0
    assert "host localhost: d3_firewall_rules_file = " in proc.stdout and "Fix the inventory" in proc.stdout, proc.stdout[-2000:]


def test_the_default_rules_file_passes(tmp_path: Path) -> None:
    proc = preflight(tmp_path, {})
    assert proc.returncode == 0, proc.stdout[-2000:]
