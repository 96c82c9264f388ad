"""d3_units refuses inventory values that would reach a unit file as text with a newline or a shell word (the
validation runs before anything is written; plan.yml's previews go through it too). One run: each case is a local
alias of this machine with its own bad value (testkit.aliased_run)."""

from __future__ import annotations

from typing import Any

import pytest
from testkit import aliased_run

pytestmark = pytest.mark.playbook  # the cases share one ansible-playbook run (tests/conftest.py enforces the marker)

PLAY = """- hosts: all
  gather_facts: false
  tasks:
    - ansible.builtin.import_role: {name: d3_units, tasks_from: validate.yml}
"""
INJECTING = [
    {"d3_units_image_ref": "docker.io/vllm/vllm-openai:nightly\n[Service]\nExecStartPre=/bin/id"},
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
]
KEYS = ["zq1 zq2", "zq3\nzq4", "zq5\tzq6"]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    base = {"d3_units_image_ref": "x"}
    hosts = {f"inject_{i}": {**base, **extra} for i, extra in enumerate(INJECTING)}
    hosts |= {f"key_{i}": {**base, "d3_units_api_key": key} for i, key in enumerate(KEYS)}
    hosts["good"] = {**base, "d3_units_cdi_unit": "nvidia-cdi-refresh.service"}
    return aliased_run(tmp_path_factory.mktemp("unit-inputs"), PLAY, hosts)


@pytest.mark.parametrize("case", range(len(INJECTING)), ids=[next(iter(e)) for e in INJECTING])
def test_injecting_values_are_refused(results: dict[str, dict[str, Any]], case: int) -> None:
    got = results[f"inject_{case}"]
    (name,) = INJECTING[case]
    assert got["failed"], got
    assert "Fix the inventory" in got["text"] and f"host inject_{case}: {name} = " in got["text"], got["text"]


def test_the_defaults_and_a_refresh_unit_pass(results: dict[str, dict[str, Any]]) -> None:
    assert results["good"]["failed"] == [], results["good"]["text"]


@pytest.mark.parametrize("case", range(len(KEYS)))
def test_an_api_key_a_secret_cannot_hold_is_refused_without_showing_it(results: dict[str, dict[str, Any]], case: int) -> None:
    got = results[f"key_{case}"]
    assert got["failed"], got
    assert "d3_units_api_key contains whitespace or a control character (not shown: it is a secret)" in got["text"]
    assert "zq" not in results["_stdout"]["text"]
