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


def rollout(tmp_path: Path, extra: dict[str, Any], routers: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    hosts = tmp_path / "hosts.yml"
    local = f"{{ansible_connection: local, ansible_python_interpreter: {sys.executable}}}"
    group = "".join(f"        {r}: {local}\n" for r in routers)
    hosts.write_text(f"all:\n  children:\n    l4-nodes:\n      hosts:\n        h1: {local}\n"
                     + (f"    d3-routers:\n      hosts:\n{group}" if routers else ""))
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


SLICE = {"d3_image_slice_count": 2, "d3_image_slice_number": 2, "d3_rollout_canary_slice": 1}


@pytest.mark.parametrize("extra", [{}, {"d3_image_slice_count": 1}, {**SLICE, "d3_rollout_routers": []}])
def test_an_unsliced_rollout_or_a_slice_that_knows_passes_the_check(tmp_path: Path, extra: dict[str, Any]) -> None:
    proc = rollout(tmp_path, extra)
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert "Refuse a sliced rollout that does not know which slice holds the canary" in proc.stdout


def test_a_slice_that_does_not_see_every_router_is_refused_naming_them_and_one_that_does_passes(tmp_path: Path) -> None:
    """AWX job slicing gives each slice only its own hosts: a slice without the routers would restart undrained."""
    undeclared = rollout(tmp_path, SLICE)
    assert undeclared.returncode != 0
    assert "d3_rollout_routers is null: a slice holds only its own hosts" in undeclared.stdout, undeclared.stdout[-2000:]
    missing = rollout(tmp_path, {**SLICE, "d3_rollout_routers": ["r1", "r2"]}, routers=("r1",))
    assert missing.returncode != 0
    assert "does not see the routers r2 (d3_rollout_routers; its group d3-routers holds r1)" in missing.stdout, missing.stdout[-2000:]
    seen = rollout(tmp_path, {**SLICE, "d3_rollout_routers": ["r1"]}, routers=("r1",))
    assert seen.returncode == 0, seen.stdout[-2000:]
    assert "Refuse a sliced rollout that does not see every router of the fleet" in seen.stdout
