"""d3_units refuses inventory values that would reach a unit file as text with a newline or a shell word (the
validation runs before anything is written; plan.yml's previews go through it too)."""

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
    - ansible.builtin.import_role: {name: d3_units, tasks_from: validate.yml}
"""


def validate(tmp_path: Path, extra: dict[str, object]) -> subprocess.CompletedProcess[str]:
    play = tmp_path / "validate.yml"
    play.write_text(PLAY)
    return ansible_playbook("-i", "localhost,", str(play), "-e", json.dumps(extra), timeout=120, ANSIBLE_ROLES_PATH=str(ROOT / "roles"))


@pytest.mark.parametrize(
    "extra",
    [
        {"d3_units_cdi_unit": "x.service\n[Service]\nExecStartPre=/bin/sh -c id"},
        {"d3_units_cdi_unit": "nvidia-cdi-refresh.service\n"},
        {"d3_units_wait_ready": "/usr/local/bin/x; rm -rf /"},
        {"d3_units_wait_ready": "relative/path"},
        {"d3_units_start_timeout_s": "900\nExecStartPre=/bin/true"},
        {"d3_units_start_timeout_s": "900\n"},
        {"d3_units_restart_sec": "10\nExecStartPre=/bin/true"},
        {"d3_units_api_key_secret": "d3-api-key\n[Service]"},
        {"d3_units_api_key_secret": "a b"},
        {"d3_units_api_key_fingerprint_file": "/var/lib/d3/x\n"},
    ],
)
def test_injecting_values_are_refused(tmp_path: Path, extra: dict[str, object]) -> None:
    proc = validate(tmp_path, {"d3_units_image_ref": "x", **extra})
    assert proc.returncode != 0
    (name,) = extra
    assert "Fix the inventory" in proc.stdout and f"host localhost: {name} = " in proc.stdout, proc.stdout[-2000:]


def test_the_defaults_and_a_refresh_unit_pass(tmp_path: Path) -> None:
    proc = validate(tmp_path, {"d3_units_image_ref": "x", "d3_units_cdi_unit": "nvidia-cdi-refresh.service"})
    assert proc.returncode == 0, proc.stdout


@pytest.mark.parametrize("key", ["zq1 zq2", "zq3\nzq4", "zq5\tzq6"])
def test_an_api_key_a_secret_cannot_hold_is_refused_without_showing_it(tmp_path: Path, key: str) -> None:
    proc = validate(tmp_path, {"d3_units_image_ref": "x", "d3_units_api_key": key})
    assert proc.returncode != 0
    assert "d3_units_api_key contains whitespace or a control character (not shown: it is a secret)" in proc.stdout
    assert "zq" not in proc.stdout + proc.stderr
