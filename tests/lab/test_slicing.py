"""Job slicing (AWX / AAP `job_slice_count`): a sliced run without a pinned d3_image_digest is refused before the
image role resolves or pulls anything. AWX passes a slice no variable that says it is one
(tests/contracts/awx/job-slicing.yml), so each slice gets d3_image_slice_count / _number as the job template's extra
vars. (Two slices in parallel over the converged fleet are test_site_runner.py's second run: every host keeps the
unsliced run's digest, nothing changes.) The lab is the STAND-IN fleet; a missing lab part fails, it does not skip."""

from __future__ import annotations

import labkit
import pytest

pytestmark = pytest.mark.lab

def test_a_sliced_run_without_a_pinned_digest_is_refused_before_the_image_is_resolved(host_names: list[str]) -> None:
    run = labkit.run_playbook(
        "site.yml", limit=labkit.LAB_GROUP, cmdline="--tags image",
        extravars={"d3_image_slice_count": 2, "d3_image_slice_number": 1},
    )  # fmt: skip
    assert run.status == "failed", run.stdout[-3000:]
    for host in host_names:
        failed = [f["task"] for f in run.failures(host)]
        assert failed == ["Refuse a sliced run without a pinned image digest"], (host, failed)
        assert "d3_image_digest is empty" in run.failure_text(host)
        assert not [t for t in run.tasks_run(host) if "Resolve the image tag" in t or "Pull the fleet" in t], host
