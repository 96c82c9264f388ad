#!/usr/bin/python3
"""d3-fleet: the host's GPU and deployment facts for node exporter's textfile collector (role d3_metrics).

Run by d3-textfile.timer as root (nvidia-smi, the kernel log and the root-only deployment record need it). Writes
<directory>/d3.prom atomically (a temporary file in the same directory, then rename: node exporter never reads half a
file). Series (tests/contracts/metrics/names.yml):

  d3_gpu_memory_used_bytes, d3_gpu_memory_total_bytes, d3_gpu_utilization_ratio, d3_gpu_temperature_celsius,
  d3_gpu_power_watts, d3_gpu_ecc_uncorrected_errors       {gpu, uuid}   from nvidia-smi --query-gpu (QUERY)
  d3_gpu_xid_events_total                   {pci_bus, xid, gpu}   NVRM: Xid lines of this boot's kernel log after the
                                                                  acknowledgement (--xid-ack's mtime); gpu when known
  d3_instance_image_info                                  {name, digest} = 1, from the deployment record
  d3_rollout_marker_timestamp_seconds                     the marker's mtime, only while it exists
  d3_textfile_success                                     1 when every source answered, else 0 (and what failed)

A value nvidia-smi reports as "[N/A]" (ECC off, no power sensor) is left out, not written as 0. A host without GPUs
(--no-gpu: a router, a monitor) runs neither nvidia-smi nor the Xid scan, so its d3_textfile_success says only
whether its own sources answered. An Xid stays counted (and its alert firing) until an operator acknowledges it:
`touch /var/lib/d3/xid-acknowledged` after the fix (or a reboot: the scan reads this boot only).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

# nvidia-smi --help-query-gpu names; the lab's stand-in (lab/nvidia) answers the same query
QUERY = ("index", "uuid", "pci.bus_id", "memory.used", "memory.total", "utilization.gpu", "temperature.gpu",
         "power.draw", "ecc.errors.uncorrected.volatile.total")  # fmt: skip
GAUGES = (  # (query field, metric, factor, help)
    ("memory.used", "d3_gpu_memory_used_bytes", 1024 * 1024, "GPU memory used (nvidia-smi memory.used)"),
    ("memory.total", "d3_gpu_memory_total_bytes", 1024 * 1024, "GPU memory (nvidia-smi memory.total)"),
    ("utilization.gpu", "d3_gpu_utilization_ratio", 0.01, "GPU busy fraction (nvidia-smi utilization.gpu)"),
    ("temperature.gpu", "d3_gpu_temperature_celsius", 1, "GPU temperature (nvidia-smi temperature.gpu)"),
    ("power.draw", "d3_gpu_power_watts", 1, "GPU power draw (nvidia-smi power.draw)"),
    ("ecc.errors.uncorrected.volatile.total", "d3_gpu_ecc_uncorrected_errors", 1,
     "uncorrected ECC errors since the driver loaded (nvidia-smi ecc.errors.uncorrected.volatile.total)"),
)  # fmt: skip
# "NVRM: Xid (PCI:0000:00:06): 79, pid=..., GPU has fallen off the bus." (the driver's kernel log line)
XID = re.compile(r"NVRM: Xid \(PCI:([0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})[^)]*\): (\d+)")
LABEL_OK = re.compile(r"\A[A-Za-z0-9_.,:@/+-]{1,200}\Z")


def _label(value: Any) -> str:
    text = str(value)
    return text if LABEL_OK.match(text) else "invalid"


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None  # [N/A], [Not Supported]


def _value(number: float) -> str:
    number = round(number, 6)
    return str(int(number)) if number.is_integer() else str(number)


def gpu_rows(csv_text: str) -> list[dict[str, str]]:
    """nvidia-smi --query-gpu=QUERY --format=csv,noheader,nounits -> one dict per GPU; ValueError on a short line."""
    rows = []
    for line in csv_text.splitlines():
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(QUERY):
            raise ValueError(f"nvidia-smi line with {len(cells)} fields, expected {len(QUERY)}: {line!r}")
        rows.append(dict(zip(QUERY, cells, strict=True)))
    return rows


def xid_counts(kernel_log: str, rows: list[dict[str, str]]) -> dict[tuple[str, str], int]:
    """Xid lines per (PCI bus, Xid code). The driver names the bus (0000:00:06), nvidia-smi 00000000:00:06.0: the GPU
    index is looked up by it where nvidia-smi still lists the GPU (a GPU off the bus is listed no more)."""
    counts: dict[tuple[str, str], int] = {}
    for match in XID.finditer(kernel_log):
        key = (match.group(1).lower(), match.group(2))
        counts[key] = counts.get(key, 0) + 1
    return counts


def gpu_by_bus(rows: list[dict[str, str]]) -> dict[str, str]:
    return {r["pci.bus_id"][-12:-2].lower(): r["index"] for r in rows}


def render(rows: list[dict[str, str]], xids: dict[tuple[str, str], int] | None, state: dict[str, Any] | None,
           marker_mtime: float | None, failures: list[str]) -> str:  # fmt: skip
    """The textfile, in Prometheus' text exposition format."""
    out: list[str] = []
    for field, metric, factor, text in GAUGES:
        samples = [(r, _number(r[field])) for r in rows]
        samples = [(r, v) for r, v in samples if v is not None]
        if samples:
            out += [f"# HELP {metric} {text}", f"# TYPE {metric} gauge"]
            out += [f'{metric}{{gpu="{_label(r["index"])}",uuid="{_label(r["uuid"])}"}} {_value(v * factor)}' for r, v in samples]
    if xids:
        out += ["# HELP d3_gpu_xid_events_total NVRM Xid lines in this boot's kernel log since their acknowledgement",
                "# TYPE d3_gpu_xid_events_total counter"]  # fmt: skip
        index = gpu_by_bus(rows)
        for (bus, code), n in sorted(xids.items()):
            gpu = f',gpu="{_label(index[bus])}"' if bus in index else ""
            out.append(f'd3_gpu_xid_events_total{{pci_bus="{_label(bus)}",xid="{_label(code)}"{gpu}}} {n}')
    if state is not None:
        ref = str(state.get("image_ref", ""))
        digest = ref.partition("@")[2] or "none"
        instances = state.get("instances") if isinstance(state.get("instances"), dict) else {}
        if instances:
            out += ["# HELP d3_instance_image_info the image digest each instance runs (the deployment record)",
                    "# TYPE d3_instance_image_info gauge"]  # fmt: skip
            out += [f'd3_instance_image_info{{name="{_label(n)}",digest="{_label(digest)}"}} 1' for n in sorted(instances)]
    if marker_mtime is not None:
        out += ["# HELP d3_rollout_marker_timestamp_seconds when this host was marked for a rollout restart",
                "# TYPE d3_rollout_marker_timestamp_seconds gauge", f"d3_rollout_marker_timestamp_seconds {marker_mtime:.0f}"]  # fmt: skip
    out += ["# HELP d3_textfile_success 1 when every source of d3.prom answered", "# TYPE d3_textfile_success gauge"]
    out += [f'd3_textfile_success{{failed="{_label(",".join(failures))}"}} 0' if failures else "d3_textfile_success 1"]
    return "\n".join(out) + "\n"


def collect(nvidia_smi: str, state_file: Path, marker: Path, gpus: bool = True, xid_ack: Path | None = None) -> str:
    failures: list[str] = []
    rows: list[dict[str, str]] = []
    xids: dict[tuple[str, str], int] | None = None
    if gpus:
        try:
            text = subprocess.run([nvidia_smi, f"--query-gpu={','.join(QUERY)}", "--format=csv,noheader,nounits"],
                                  capture_output=True, text=True, timeout=20, check=True).stdout  # fmt: skip
            rows = gpu_rows(text)
        except (OSError, subprocess.SubprocessError, ValueError):
            failures.append("nvidia-smi")
        since: list[str] = []
        try:
            since = [f"--since=@{int(xid_ack.stat().st_mtime)}"] if xid_ack is not None else []
        except FileNotFoundError:
            since = []  # never acknowledged: this boot's every Xid
        try:
            log = subprocess.run(["journalctl", "-k", "-b", *since, "--no-pager", "-o", "cat", "--grep", "NVRM: Xid"],
                                 capture_output=True, text=True, timeout=20, check=False)  # fmt: skip
            xids = xid_counts(log.stdout if log.returncode in (0, 1) else "", rows)
            if log.returncode not in (0, 1):  # 1: no line matched
                failures.append("journalctl")
        except (OSError, subprocess.SubprocessError):
            failures.append("journalctl")
    state = None
    try:
        state = json.loads(state_file.read_text())
    except FileNotFoundError:
        state = None  # no deployment recorded yet
    except (OSError, ValueError):
        failures.append("state")
    try:
        mtime: float | None = marker.stat().st_mtime
    except FileNotFoundError:
        mtime = None
    return render(rows, xids, state if isinstance(state, dict) else None, mtime, failures)


def write_atomically(directory: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".d3.prom.")
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.chmod(tmp, 0o644)  # node exporter (user prometheus) reads it; it holds no secret
    os.replace(tmp, directory / "d3.prom")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--directory", type=Path, default=Path("/var/lib/prometheus/node-exporter"))
    parser.add_argument("--nvidia-smi", default="nvidia-smi")
    parser.add_argument("--state-file", type=Path, default=Path("/var/lib/d3/deployed.json"))
    parser.add_argument("--marker", type=Path, default=Path("/var/lib/d3/rollout-in-progress"))
    parser.add_argument("--xid-ack", type=Path, default=Path("/var/lib/d3/xid-acknowledged"))
    parser.add_argument("--no-gpu", action="store_true", help="a host without GPUs: no nvidia-smi, no Xid scan")
    args = parser.parse_args(argv)
    write_atomically(args.directory, collect(args.nvidia_smi, args.state_file, args.marker, not args.no_gpu, args.xid_ack))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
