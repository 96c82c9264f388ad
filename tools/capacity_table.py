#!/usr/bin/env python3
"""The capacity table of docs/capacity.md: for every D3 size and checkpoint variant on NVIDIA L4s, at 8192, 16384, 32768
and 131072 tokens of --max-model-len, what the planner predicts vLLM logs at startup (GPU KV cache size, maximum
concurrency) or why it refuses the plan. Each cell is a real plan: d3_plan with the catalog's flags (its TP and
--gpu-memory-utilization), only --max-model-len changed, on as many L4s as the TP needs.

    python tools/capacity_table.py            # print the table (markdown)
    python tools/capacity_table.py --write    # replace the table in docs/capacity.md

tests/test_capacity_table.py checks that docs/capacity.md holds exactly this output."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "collections"), str(ROOT / "collections/ansible_collections/d3fleet/fleet/plugins/filter")]
from d3_planner import d3_plan, host_gpus  # noqa: E402

DOC = ROOT / "docs" / "capacity.md"
BEGIN, END = "<!-- capacity-table:begin (tools/capacity_table.py) -->", "<!-- capacity-table:end -->"
LENGTHS = (8192, 16384, 32768, 131072)
# what a refusal says, shortened for a table cell: (pattern in the planner's message, cell text from its groups)
REASONS = (
    (r"runs out of memory in vLLM's profile run .*? = (\d+) MiB per GPU", "refused: the profile run runs out of memory ({0} MiB per GPU)"),
    (r"too small for one sequence of --max-model-len \d+ \((\d+) MiB\).*?available KV cache memory \(([\d.]+) GiB\)",
     "refused by vLLM: one sequence needs {0} MiB of KV cache, {1} GiB left"),
    (r"No available memory for the cache blocks.*? = (\d+) MiB per GPU fill its share .*? of (\d+) MiB",
     "refused by vLLM: no memory left for the KV cache ({0} of {1} MiB)"),
    (r"is planned on compute capability ([\d.]+) and newer only \(policy", "refused: planned on compute capability {0} only (policy)"),
)  # fmt: skip


def cell(result: dict[str, Any]) -> str:
    if not result["errors"]:
        kv = result["instances"][0]["kv_cache"]
        return f"{kv['gpu_kv_cache_tokens']:,} / {kv['max_concurrency']:.2f}x"
    text = result["errors"][0]
    fix = re.search(r"Fix: in d3_models\[0\]\.extra_args set (--[a-z-]+=[\d.]+)", text)
    for pattern, shown in REASONS:
        m = re.search(pattern, text)
        if m:
            return shown.format(*m.groups()) + (f"; fix: {fix.group(1)}" if fix else "")
    raise ValueError(f"no table wording for: {text}")


def rows(catalog: dict[str, Any], common: dict[str, Any]) -> list[str]:
    out = []
    for model, entry in catalog.items():
        for variant, spec in (entry.get("variants") or {"default": {}}).items():
            tp = int((spec or {}).get("tensor_parallel_size", entry["tensor_parallel_size"]))
            util = (spec or {}).get("gpu_memory_utilization", entry["gpu_memory_utilization"])
            cells = []
            for length in LENGTHS:
                item = {"model": model, "variant": variant, "extra_args": [f"--max-model-len={length}"]}
                gpus = host_gpus(tp, common["l4_memory_mib"], "NVIDIA L4")
                cells.append(cell(d3_plan([item], catalog, common, gpus, "table", {"api_key_set": True})))
            out.append(f"| {entry['instance_name']} | {variant} | {tp} | {util} | " + " | ".join(cells) + " |")
    return out


def table() -> str:
    data = yaml.safe_load((ROOT / "roles/d3/vars/main.yml").read_text())
    head = ["| instance | variant | TP | share | " + " | ".join(f"{n:,} tokens" for n in LENGTHS) + " |",
            "|---|---|---:|---:|" + "---|" * len(LENGTHS)]  # fmt: skip
    return "\n".join([BEGIN, *head, *rows(data["d3_catalog"], data["d3_catalog_common"]), END])


def in_doc(text: str) -> str:
    return text[text.index(BEGIN) : text.index(END) + len(END)]


def main(argv: list[str]) -> int:
    if argv == ["--write"]:
        text = DOC.read_text()
        DOC.write_text(text.replace(in_doc(text), table()))
        return 0
    print(table())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
