"""Helpers of the fault drills (tests/lab/test_drills.py, and drills 8 and 9 in test_rollout.py): what a fault must
not lose on a lab host, a decision asked from inside a host, and the drill's figure (printed, and appended as a JSON
line to build/lab-figures.jsonl, or D3_DRILLS_OUT=<file>: lab/drills.sh prints them as one table, tools/ci_report.py
at the end of `make test`).

The lab is a STAND-IN (lab/README.md)."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

import labkit
from labkit import on_host, running


def figure(drill: int | str, name: str, text: str, started: float) -> None:
    lab_s = time.monotonic() - started
    print(f"\nDRILL {drill} | {name} | {text} | {lab_s:.0f} s")
    out = Path(os.environ.get("D3_DRILLS_OUT") or labkit.ROOT / "build/lab-figures.jsonl")
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("a", encoding="utf-8") as handle:
        handle.write(json.dumps({"drill": drill, "name": name, "figure": text, "lab_s": round(lab_s)}) + "\n")


def nothing_lost(host: str) -> dict[str, Any]:
    """What a fault must not lose on a host: the deployment record (sha256), the weights (every snapshot and
    completion marker), the images (ids), and the instances serving (name -> image)."""
    record = on_host(host, "cat /var/lib/d3/deployed.json")
    return {
        "record": hashlib.sha256(record.encode()).hexdigest(),
        "weights": on_host(host, "cd /var/lib/d3/huggingface && ls -d hub/models--*/snapshots/* d3-complete/*/* | sort"),
        "images": sorted(on_host(host, "podman images -q --no-trunc").split()),
        "serving": {name: image for name, (image, _) in running(host).items()},
    }


def decision(host: str, port: int, name: str) -> dict[str, Any] | None:
    """A one-question decision from inside the host; None while the instance does not answer."""
    body = json.dumps({"model": name, "state": "x", "questions": {"q": {"type": "noul", "instructions": "ok?"}}})
    out = on_host(host, f"curl -s -m 5 http://127.0.0.1:{port}/v1/systemone -H 'Content-Type: application/json' -d '{body}'", check=False)
    try:
        answer = json.loads(out)
    except ValueError:
        return None
    return answer if answer.get("object") == "structured_decision" else None


def ports(host: str) -> dict[str, int]:
    record = json.loads(on_host(host, "cat /var/lib/d3/deployed.json"))
    return {name: int(inst["port"]) for name, inst in record["instances"].items()}


def served_names(host: str) -> dict[str, str]:
    """Instance name -> the model name it serves, where the host's d3_models name one (`served_name`: the
    `spread: false` replicas of a model share it, e.g. d3-lab-host2's d3-lite-2 serves d3-lite); else the name."""
    models = labkit.host_vars(host).get("d3_models", [])
    return {m["name"]: m["served_name"] for m in models if "name" in m and "served_name" in m}


def all_answer(host: str) -> bool:
    served = served_names(host)
    return all(decision(host, port, served.get(name, name)) for name, port in ports(host).items())


def assert_intact(host: str, before: dict[str, Any]) -> None:
    after = nothing_lost(host)
    assert after["record"] == before["record"], f"{host}: the deployment record changed"
    assert after["weights"] == before["weights"], f"{host}: weights changed"
    assert set(before["images"]) <= set(after["images"]), f"{host}: an image was removed"
    assert after["serving"] == before["serving"], f"{host}: serving {after['serving']} != before {before['serving']}"
    assert all_answer(host), f"{host}: an instance does not answer a decision"


def run_seconds(run: labkit.Run) -> float:
    stamps = [e.get("created") for e in run.events if e.get("created")]
    first, last = (time.mktime(time.strptime(s[:19], "%Y-%m-%dT%H:%M:%S")) for s in (stamps[0], stamps[-1]))
    return last - first
