"""d3_firewall refuses a rules file path that would reach its unit file as text with a newline or a shell word
(preflight, before anything is written). One run: each case is a local alias with its own path (testkit.aliased_run)."""

from __future__ import annotations

from typing import Any

import pytest
from testkit import aliased_run

pytestmark = pytest.mark.playbook  # the cases share one ansible-playbook run (tests/conftest.py enforces the marker)

PLAY = """- hosts: all
  gather_facts: false
  tasks:
    - ansible.builtin.import_role: {name: d3_firewall, tasks_from: preflight.yml}
"""
PATHS = ["/etc/d3-fleet/x.nft\nExecStartPre=/bin/sh -c id", "/etc/d3-fleet/x.nft\n", "/etc/x.nft; rm -rf /", "x.nft"]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    hosts: dict[str, dict[str, Any]] = {f"path_{i}": {"d3_firewall_rules_file": p} for i, p in enumerate(PATHS)}
    hosts["default"] = {}
    return aliased_run(tmp_path_factory.mktemp("firewall-inputs"), PLAY, hosts)


@pytest.mark.parametrize("case", range(len(PATHS)))
def test_a_rules_file_that_could_inject_is_refused(results: dict[str, dict[str, Any]], case: int) -> None:
    got = results[f"path_{case}"]
    assert got["failed"], got
    assert f"host path_{case}: d3_firewall_rules_file = " in got["text"] and "Fix the inventory" in got["text"], got["text"]


def test_the_default_rules_file_passes(results: dict[str, dict[str, Any]]) -> None:
    assert results["default"]["failed"] == [], results["default"]["text"]
