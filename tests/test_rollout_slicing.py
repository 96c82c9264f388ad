"""rollout.yml refuses a sliced run (AWX job slicing) that does not say which slice holds the canary, before it
contacts a host's roles; a slice that knows passes the check. Runs on localhost, tags restricted to the check."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from testkit import ansible_playbook

pytestmark = pytest.mark.playbook  # every test here runs ansible-playbook (tests/conftest.py enforces it)

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def rollout(tmp_path: Path, extra: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    hosts = tmp_path / "hosts.yml"
    hosts.write_text("all:\n  children:\n    l4-nodes:\n      hosts:\n        h1: {ansible_connection: local, "
                     f"ansible_python_interpreter: {sys.executable}}}\n")
    # --tags none_but_always: only the `always` check runs; no role touches this machine
    return ansible_playbook("playbooks/rollout.yml", "-i", str(hosts), "--tags", "none_but_always", "-e", "ansible_become=false",
                            "-e", json.dumps(extra), timeout=300, ANSIBLE_BECOME="false")  # fmt: skip


@pytest.mark.parametrize("extra", [
    {"d3_image_slice_count": 2, "d3_image_slice_number": 1},
    {"d3_image_slice_count": 2, "d3_image_slice_number": 2, "d3_rollout_canary_slice": 3},
    {"d3_image_slice_count": 2, "d3_rollout_canary_slice": 1},
])  # fmt: skip
def test_a_sliced_rollout_without_its_canary_slice_is_refused(tmp_path: Path, extra: dict[str, Any]) -> None:
    proc = rollout(tmp_path, extra)
    assert proc.returncode != 0
    assert "Each slice would restart its own first host as a canary" in proc.stdout, proc.stdout[-2000:]
    assert "set d3_rollout_canary_slice" in proc.stdout


@pytest.mark.parametrize("extra", [{}, {"d3_image_slice_count": 1},
                                   {"d3_image_slice_count": 2, "d3_image_slice_number": 2, "d3_rollout_canary_slice": 1}])
def test_an_unsliced_rollout_or_a_slice_that_knows_passes_the_check(tmp_path: Path, extra: dict[str, Any]) -> None:
    proc = rollout(tmp_path, extra)
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert "Refuse a sliced rollout that does not know which slice holds the canary" in proc.stdout
