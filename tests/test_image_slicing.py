"""Job slicing and the fleet's image digest (roles/d3_image/tasks/validate.yml), against the AWX contract in
tests/contracts/awx/job-slicing.yml: a sliced run (d3_image_slice_count > 1) without a pinned d3_image_digest is
refused with a message naming the variable and how to get the digest; controller-only, no host is contacted."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from testkit import aliased_run

pytestmark = pytest.mark.playbook  # every test here runs ansible-playbook (tests/conftest.py enforces it)

ROOT = Path(__file__).resolve().parents[1]
CONTRACT = yaml.safe_load((ROOT / "tests/contracts/awx/job-slicing.yml").read_text())
VALIDATE = ROOT / "roles/d3_image/tasks/validate.yml"
DIGEST = "sha256:" + "ab" * 32

PLAYBOOK = """
- name: The image role's input checks only
  hosts: all
  gather_facts: false
  tasks:
    - name: Validate
      ansible.builtin.include_role:
        name: d3_image
        tasks_from: validate.yml
"""
# each case is a local alias with its own variables, all in one run (testkit.aliased_run)
CASES = {
    "sliced-unpinned": {"d3_image_slice_count": 2, "d3_image_slice_number": 1},
    "unsliced": {},
    "one-slice": {"d3_image_slice_count": 1},
    "sliced-pinned": {"d3_image_slice_count": 3, "d3_image_slice_number": 2, "d3_image_digest": DIGEST},
    "zero-slices": {"d3_image_slice_count": 0},
    "number-above-count": {"d3_image_slice_count": 2, "d3_image_slice_number": 3, "d3_image_digest": DIGEST},
    "not-a-number": {"d3_image_slice_count": "two"},
}


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    return aliased_run(tmp_path_factory.mktemp("image-slicing"), PLAYBOOK, {k.replace("-", "_"): v for k, v in CASES.items()})


def test_the_contract_names_its_source_and_awx_sets_no_slice_variable() -> None:
    assert "awx_meta_vars" in CONTRACT["_source"]
    assert CONTRACT["slice_vars_in_extra_vars"] == []
    assert not [v for v in CONTRACT["extra_vars_set"] if "slice" in v]


def test_validate_relies_on_no_awx_variable_that_does_not_exist() -> None:
    """Every awx_/tower_ name the check reads must be one AWX really sets (the contract), and the slice count the
    check reads is the one the contract tells job templates to set."""
    text = VALIDATE.read_text()
    used = set(re.findall(r"\b(?:awx|tower)_[a-z_]+", text))
    known = set(CONTRACT["extra_vars_set"]) | {v.replace("awx_", "tower_", 1) for v in CONTRACT["extra_vars_set"]}
    assert used <= known, used - known
    assert CONTRACT["d3_fleet_contract"]["slice_count_var"] in text
    assert CONTRACT["d3_fleet_contract"]["requires_when_sliced"] in text


def test_a_sliced_run_without_a_pinned_digest_is_refused(results: dict[str, dict[str, Any]]) -> None:
    got = results["sliced_unpinned"]
    assert got["failed"] == ["d3_image : Refuse a sliced run without a pinned image digest"], got
    out = got["text"]
    assert "one of 2 slices (d3_image_slice_count)" in out
    assert "d3_image_digest is empty" in out
    assert "skopeo inspect --no-tags --format '{{.Digest}}' docker://docker.io/vllm/vllm-openai:nightly" in out


@pytest.mark.parametrize("case", ["unsliced", "one-slice", "sliced-pinned"])
def test_unsliced_or_pinned_runs_pass(results: dict[str, dict[str, Any]], case: str) -> None:
    got = results[case.replace("-", "_")]
    assert got["failed"] == [], got["text"]


@pytest.mark.parametrize("case", ["zero-slices", "number-above-count", "not-a-number"])
def test_a_bad_slice_count_or_number_is_refused(results: dict[str, dict[str, Any]], case: str) -> None:
    got = results[case.replace("-", "_")]
    assert got["failed"] == ["d3_image : Refuse a bad slice count or slice number"], got
