"""docs/refusals.md kept true, without the lab: every row plan.yml can judge (the planner's and the image and unit
roles' input checks; plan.yml contacts no host when the GPUs are declared) is refused by plan.yml with a message
naming the host, the variable and the catalog's fragment, and a good host beside them passes. The lab test
(tests/lab/test_refusals.py) walks every row through site.yml."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from refusals import Refusal, catalog, plan_yml_judges
from testkit import ansible_playbook

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
SHA = "645f0f466bbfb62d90145fa12dd437e2d4534511"
GOOD: dict[str, Any] = {
    "ansible_host": "192.0.2.1", "ansible_port": 1, "d3_gpu_count": 4, "d3_models": [{"model": "d3-edge"}],
    "d3_model_revisions": {"d3-edge": SHA, "d3-lite": SHA, "d3": SHA},
}  # fmt: skip
PLAN_YML_JUDGES = plan_yml_judges()  # the others are judged by site.yml only (tests/lab/test_refusals.py)


def failures(stdout: str) -> dict[str, list[str]]:
    """Every failed task's message per host, from the json stdout callback."""
    out: dict[str, list[str]] = {}
    for play in json.loads(stdout[stdout.index("{") :])["plays"]:
        for task in play["tasks"]:
            for host, res in task["hosts"].items():
                if res.get("failed"):
                    for item in [res, *(res.get("results") or [])]:  # a loop's messages are its items'
                        msg = item.get("msg")
                        out.setdefault(host, []).append(" ".join(msg) if isinstance(msg, list) else str(msg))
    return out


@pytest.fixture(scope="module")
def judged(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    hosts = {r.alias: {**GOOD, **r.bad} for r in PLAN_YML_JUDGES} | {"good_host": GOOD}
    path = tmp_path_factory.mktemp("refusals") / "hosts.yml"
    path.write_text(yaml.safe_dump({"all": {"children": {"l4-nodes": {"hosts": hosts}}}}))
    proc = ansible_playbook("playbooks/plan.yml", "-i", str(path), timeout=300, ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json")
    assert proc.returncode != 0, "plan.yml passed a catalog of bad inputs"
    found = failures(proc.stdout)
    assert "good_host" not in found, found.get("good_host")
    return found


def test_the_catalog_has_the_issue_s_35_inputs_and_more() -> None:
    rows = catalog()
    assert len(rows) >= 35 and {r.stage for r in rows} == {"preflight", "plan", "inputs"}
    assert len(PLAN_YML_JUDGES) >= 30


@pytest.mark.playbook
@pytest.mark.parametrize("row", PLAN_YML_JUDGES, ids=[r.id for r in PLAN_YML_JUDGES])
def test_plan_yml_refuses_the_row_as_the_catalog_says(judged: dict[str, list[str]], row: Refusal) -> None:
    messages = judged.get(row.alias)
    assert messages, f"{row.id}: plan.yml did not refuse {row.bad}"
    text = " ".join(messages)
    # Ansible's own argument-spec validation names the host in its failure line, not in the message
    assert row.alias in text or text.startswith("Validation of arguments failed"), text
    assert row.variable in text and row.says in text, text
    assert "zzsecret" not in text  # a refusal never echoes a secret
