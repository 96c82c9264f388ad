"""Job slicing (AWX / AAP `job_slice_count`): site.yml run as two slices of the 3-host lab, in parallel, each over
its own disjoint --limit, gives every host the same image digest as the unsliced run; a sliced run without a pinned
d3_image_digest is refused before the image role resolves or pulls anything. AWX passes a slice no variable that
says it is one (tests/contracts/awx/job-slicing.yml), so each slice gets d3_image_slice_count / _number as the job
template's extra vars. The lab is the STAND-IN fleet; a missing lab part fails, it does not skip."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import labkit
import pytest
from labkit import Run

pytestmark = pytest.mark.lab

DIGEST = re.compile(r"@(sha256:[0-9a-f]{64})$")


def running_digests(host: str) -> set[str]:
    """The manifest digests of the image every running D3 container of a host was started from."""
    images = [image for image, _ in labkit.running(host).values()]
    assert images, f"{host}: no running D3 container"
    digests = {m.group(1) for m in map(DIGEST.search, images) if m}
    assert len(digests) == len(set(images)), f"{host}: an image not pinned by digest: {images}"
    return digests


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


def test_two_parallel_slices_put_every_host_on_the_digest_of_the_unsliced_run(converge_run: Run, converged: list[str]) -> None:
    assert len(converged) >= 3, "slicing needs the 3-host lab (make lab LAB_HOSTS=3)"
    unsliced = {host: running_digests(host) for host in converged}
    assert all(len(d) == 1 for d in unsliced.values()), unsliced
    pinned = labkit.registry_digest("nightly")  # what a first job (or skopeo inspect) pins for every slice
    slices = [converged[:1], converged[1:]]  # disjoint, together the whole fleet

    def run_slice(number: int) -> Run:
        return labkit.run_playbook(
            "site.yml", limit=",".join(slices[number - 1]),
            extravars={"d3_image_slice_count": len(slices), "d3_image_slice_number": number, "d3_image_digest": pinned},
        )  # fmt: skip

    with ThreadPoolExecutor(max_workers=len(slices)) as pool:
        runs = list(pool.map(run_slice, range(1, len(slices) + 1)))
    for number, run in enumerate(runs, 1):
        assert run.status == "successful", (number, run.failure_text())
        assert sorted(run.stats.get("ok", {})) == sorted(slices[number - 1]), (number, run.stats)
    sliced = {host: running_digests(host) for host in converged}
    assert sliced == unsliced == {host: {pinned} for host in converged}, (sliced, unsliced, pinned)
