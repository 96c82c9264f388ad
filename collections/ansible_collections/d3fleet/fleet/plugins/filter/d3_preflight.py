"""The d3_preflight role's driver check (tasks/gpus.yml): is the host's NVIDIA driver new enough for the vLLM image.

vLLM's nightly image is built on CUDA 13 (tests/contracts/versions.yml: driver), which needs driver R580+; R535-R579
data-center drivers run it only in CUDA forward-compatibility mode (d3_cuda_compat).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def driver_branch(version: Any) -> int:
    """'580.95.05' -> 580; 0 when the version does not start with a number (refused as too old)."""
    head = str(version).split(".")[0].strip()
    return int(head) if head.isdigit() else 0


def driver_problems(version: Any, host: str, options: Mapping[str, Any]) -> list[str]:
    """The refusal of a driver too old for the image's CUDA, empty when it passes: the driver's branch is at least
    ``min_branch``, or ``cuda_compat`` is set and it is at least ``compat_min_branch``."""
    branch = driver_branch(version)
    minimum, compat_minimum = int(options["min_branch"]), int(options["compat_min_branch"])
    compat = bool(options["cuda_compat"])
    if branch >= minimum or (compat and branch >= compat_minimum):
        return []
    if compat:
        fix = (f"d3_cuda_compat is set, but forward compatibility needs at least R{compat_minimum} "
               "(d3_preflight_driver_compat_min_branch). Fix: upgrade the driver.")  # fmt: skip
    else:
        fix = (f"Fix: upgrade the driver to branch {minimum} or newer, or, on an R{compat_minimum}+ data-center "
               "driver, set d3_cuda_compat: true (adds VLLM_ENABLE_CUDA_COMPATIBILITY=1 to every instance).")  # fmt: skip
    return [
        f"host {host}: NVIDIA driver {version} is older than R{minimum}, which the vLLM image's CUDA 13 needs "
        f"(d3_preflight_driver_min_branch); vLLM would crash-loop at start. {fix}"
    ]


class FilterModule:
    """Ansible filters: d3_driver_problems."""

    def filters(self) -> dict[str, Any]:
        return {"d3_driver_problems": driver_problems}
