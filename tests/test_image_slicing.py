"""Job slicing and the fleet's image digest (roles/d3_image/tasks/validate.yml), against the AWX contract in
tests/contracts/awx/job-slicing.yml: a sliced run (d3_image_slice_count > 1) without a pinned d3_image_digest is
refused with a message naming the variable and how to get the digest; controller-only, no host is contacted."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml
from testkit import ansible_playbook

pytestmark = pytest.mark.playbook  # every test here runs ansible-playbook (tests/conftest.py enforces it)

ROOT = Path(__file__).resolve().parents[1]
CONTRACT = yaml.safe_load((ROOT / "tests/contracts/awx/job-slicing.yml").read_text())
VALIDATE = ROOT / "roles/d3_image/tasks/validate.yml"
DIGEST = "sha256:" + "ab" * 32

PLAYBOOK = """
- name: The image role's input checks only
  hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Validate
      ansible.builtin.include_role:
        name: d3_image
        tasks_from: validate.yml
"""


def _validate(tmp_path: Path, extra: dict) -> subprocess.CompletedProcess[str]:
    book = tmp_path / "validate.yml"
    book.write_text(PLAYBOOK)
    (tmp_path / "extra.yml").write_text(yaml.safe_dump(extra))
    return ansible_playbook("-i", "localhost,", str(book), "-e", f"@{tmp_path / 'extra.yml'}", timeout=120,
                            ANSIBLE_ROLES_PATH=str(ROOT / "roles"))  # fmt: skip


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


def test_a_sliced_run_without_a_pinned_digest_is_refused(tmp_path: Path) -> None:
    proc = _validate(tmp_path, {"d3_image_slice_count": 2, "d3_image_slice_number": 1})
    assert proc.returncode != 0, proc.stdout
    out = proc.stdout
    assert "Refuse a sliced run without a pinned image digest" in out
    assert "one of 2 slices (d3_image_slice_count)" in out
    assert "d3_image_digest is empty" in out
    assert "skopeo inspect --no-tags --format '{{.Digest}}' docker://docker.io/vllm/vllm-openai:nightly" in out


@pytest.mark.parametrize(
    "extra",
    [
        {},  # not sliced
        {"d3_image_slice_count": 1},
        {"d3_image_slice_count": 3, "d3_image_slice_number": 2, "d3_image_digest": DIGEST},
    ],
    ids=["unsliced", "one-slice", "sliced-pinned"],
)
def test_unsliced_or_pinned_runs_pass(tmp_path: Path, extra: dict) -> None:
    proc = _validate(tmp_path, extra)
    assert proc.returncode == 0, proc.stdout[-3000:]


@pytest.mark.parametrize(
    "extra",
    [{"d3_image_slice_count": 0}, {"d3_image_slice_count": 2, "d3_image_slice_number": 3, "d3_image_digest": DIGEST},
     {"d3_image_slice_count": "two"}],
    ids=["zero-slices", "number-above-count", "not-a-number"],
)  # fmt: skip
def test_a_bad_slice_count_or_number_is_refused(tmp_path: Path, extra: dict) -> None:
    proc = _validate(tmp_path, extra)
    assert proc.returncode != 0, proc.stdout
    assert "Refuse a bad slice count or slice number" in proc.stdout
