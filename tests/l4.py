"""GPU lists for planner tests: NVIDIA L4s with the memory the catalog states (d3_catalog_common.l4_memory_mib),
the one place that knows it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from d3_planner import host_gpus

L4_MIB = int(yaml.safe_load((Path(__file__).resolve().parents[1] / "roles/d3/vars/main.yml").read_text())
             ["d3_catalog_common"]["l4_memory_mib"])  # fmt: skip


def l4_gpus(count: int, memory_mib: int | None = None) -> list[dict[str, Any]]:
    return host_gpus(count, L4_MIB if memory_mib is None else memory_mib, "NVIDIA L4")
