"""site.yml's monitor play (d3-monitors, docs/metrics.md): an inventory without monitors runs it on no host and says
nothing about it (no "Could not match supplied host pattern" warning); one with monitors runs it there, --limit kept."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from testkit import ansible_playbook

pytestmark = pytest.mark.playbook  # ansible-playbook --list-hosts (tests/conftest.py enforces the marker)

ROOT = Path(__file__).resolve().parents[1]


def monitor_hosts(*args: str) -> tuple[list[str], str]:
    proc = ansible_playbook("site.yml", "--list-hosts", *args, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if "Monitor the fleet" in line)
    hosts = [line.strip() for line in lines[start + 3 :] if line.startswith("      ") and line.strip()]
    return hosts, proc.stderr


def test_no_monitors_no_warning_about_them() -> None:
    hosts, stderr = monitor_hosts("-i", "inventories/example")
    assert hosts == []
    assert "d3-monitors" not in stderr, stderr


def test_monitors_get_the_play_and_a_limit_still_applies(tmp_path: Path) -> None:
    inventory = yaml.safe_load((ROOT / "inventories/example/hosts.yml").read_text())
    inventory["all"]["children"]["d3-monitors"] = {"hosts": {"mon-1": {"ansible_host": "10.0.0.9"}}}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    assert monitor_hosts("-i", str(tmp_path / "hosts.yml"))[0] == ["mon-1"]
    assert monitor_hosts("-i", str(tmp_path / "hosts.yml"), "-l", "l4-nodes")[0] == []
