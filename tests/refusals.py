"""docs/refusals.md as data: the catalog of refused inputs that tests walk (unit: plan.yml; lab: site.yml)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
CATALOG = ROOT / "docs" / "refusals.md"
ROW = re.compile(r"^\| (?P<id>[a-z0-9-]+) \| (?P<stage>[a-z]+) \| (?P<variable>[a-z0-9_]+) \| `(?P<bad>.*)` \| (?P<says>.+) \|$")


@dataclass(frozen=True)
class Refusal:
    id: str
    stage: str
    variable: str
    bad: dict[str, Any]
    says: str

    @property
    def alias(self) -> str:
        return "refuse_" + self.id.replace("-", "_")


def catalog() -> list[Refusal]:
    rows = []
    for line in CATALOG.read_text().splitlines():
        m = ROW.match(line)
        if m:
            bad = yaml.safe_load(m["bad"])
            assert isinstance(bad, dict) and m["variable"] in bad, line
            rows.append(Refusal(m["id"], m["stage"], m["variable"], bad, m["says"].strip()))
    ids = [r.id for r in rows]
    assert len(ids) == len(set(ids)), "duplicate ids in docs/refusals.md"
    return rows


def plan_yml_judges() -> list[Refusal]:
    """The rows plan.yml can judge (tests/test_refusals_catalog.py). Not: the host's probe (preflight), the weights,
    toolkit and firewall roles' checks (site.yml and rollout.yml run them; they read the host), an unpinned revision
    (plan.yml previews unpinned models on purpose; site.yml refuses them), and an inventory d3_units_image_ref (plan.yml
    renders with d3_image_name)."""
    return [r for r in catalog() if (r.stage == "plan" or r.variable.startswith(("d3_image_", "d3_units_")))
            and r.id not in ("unpinned", "image-ref")]  # fmt: skip
