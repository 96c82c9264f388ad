"""Unit tests for d3_driver_problems (d3_preflight.py): the driver branch check of roles/d3_preflight/tasks/gpus.yml.
The lab runs it on a host whose driver is R570
(tests/lab/test_real_stack.py::test_one_pair_of_hosts_through_real_stack_contracts_and_back)."""

from __future__ import annotations

import pytest
from d3_preflight import FilterModule, driver_branch, driver_problems

DEFAULTS = {"min_branch": 580, "compat_min_branch": 535, "cuda_compat": False}
COMPAT = {**DEFAULTS, "cuda_compat": True}
HEAD = ("host h1: NVIDIA driver {v} is older than R580, which the vLLM image's CUDA 13 needs (d3_preflight_driver_min_branch); "
        "vLLM would crash-loop at start. ")  # fmt: skip
UPGRADE_OR_COMPAT = ("Fix: upgrade the driver to branch 580 or newer, or, on an R535+ data-center driver, set d3_cuda_compat: true "
                     "(adds VLLM_ENABLE_CUDA_COMPATIBILITY=1 to every instance).")  # fmt: skip
COMPAT_TOO_OLD = (
    "d3_cuda_compat is set, but forward compatibility needs at least R535 (d3_preflight_driver_compat_min_branch). Fix: upgrade the driver."
)


@pytest.mark.parametrize(
    ("case", "version", "options", "fix"),
    [
        ("R580", "580.95.05", DEFAULTS, None),
        ("newer", "600.1", DEFAULTS, None),
        ("a four-digit branch", "1000.0", DEFAULTS, None),
        ("R579", "579.99", DEFAULTS, UPGRADE_OR_COMPAT),
        ("R570", "570.195.03", DEFAULTS, UPGRADE_OR_COMPAT),
        ("R570 in compat mode", "570.195.03", COMPAT, None),
        ("R535 in compat mode", "535.274.02", COMPAT, None),
        ("R534 in compat mode", "534.1", COMPAT, COMPAT_TOO_OLD),
        ("R470 in compat mode", "470.256.02", COMPAT, COMPAT_TOO_OLD),
        ("R580 needs no compat", "580.95.05", COMPAT, None),
        ("not a version", "N/A", DEFAULTS, UPGRADE_OR_COMPAT),
        ("not a version, compat", "", COMPAT, COMPAT_TOO_OLD),
    ],
)
def test_driver_problems_exact_messages(case: str, version: str, options: dict[str, object], fix: str | None) -> None:
    expected = [] if fix is None else [HEAD.format(v=version) + fix]
    assert driver_problems(version, "h1", options) == expected, case


def test_the_branches_come_from_the_options() -> None:
    options = {"min_branch": 590, "compat_min_branch": 575, "cuda_compat": False}
    [message] = driver_problems("585.1", "gpu-7", options)
    assert message.startswith("host gpu-7: NVIDIA driver 585.1 is older than R590, which")
    assert message.endswith("Fix: upgrade the driver to branch 590 or newer, or, on an R575+ data-center driver, set d3_cuda_compat: true "
                            "(adds VLLM_ENABLE_CUDA_COMPATIBILITY=1 to every instance).")  # fmt: skip
    assert driver_problems("575.0", "gpu-7", {**options, "cuda_compat": True}) == []
    assert driver_problems("574.9", "gpu-7", {**options, "cuda_compat": True})[0].endswith(
        "needs at least R575 (d3_preflight_driver_compat_min_branch). Fix: upgrade the driver."
    )
    assert driver_problems("590.0", "gpu-7", {**options, "min_branch": "590", "compat_min_branch": "575"}) == []  # strings from -e


@pytest.mark.parametrize(
    ("version", "branch"), [("580.95.05", 580), ("535", 535), (" 570.1", 570), ("N/A", 0), ("", 0), ("5a0.1", 0), (580, 580)]
)
def test_driver_branch(version: object, branch: int) -> None:
    assert driver_branch(version) == branch


def test_the_filter_is_registered() -> None:
    assert FilterModule().filters()["d3_driver_problems"] is driver_problems
