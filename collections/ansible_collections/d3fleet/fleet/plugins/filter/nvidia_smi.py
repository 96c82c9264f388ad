"""Parsers for ``nvidia-smi`` output (production code, no lab knowledge).

Filter:

* ``nvidia_smi_query_gpus``: ``nvidia-smi --query-gpu=... --format=csv[,noheader][,nounits]``.
  Without a header the default field list below is assumed (or pass ``fields``); with a
  header the columns are matched by name, so any field list/order works.

Parsers that are not filters (no role reads these outputs; the lab's tests use them):

* ``nvidia_smi_list``: ``nvidia-smi -L``.
* ``nvidia_smi_table``: the default ``nvidia-smi`` table (driver/CUDA version, per-GPU memory).

Every function is pure (text in, plain data out) and raises ``ValueError`` with the offending
line on input it does not understand.
"""

from __future__ import annotations

import re
from typing import Any

DEFAULT_QUERY_FIELDS: tuple[str, ...] = (
    "index",
    "name",
    "uuid",
    "memory.total",
    "memory.used",
    "driver_version",
    "compute_cap",
)

# query field -> (output key, converter)
_INT_FIELDS: dict[str, str] = {
    "index": "index",
    "memory.total": "memory_total_mib",
    "memory.used": "memory_used_mib",
    "memory.free": "memory_free_mib",
    "memory.reserved": "memory_reserved_mib",
}
_RENAMED: dict[str, str] = {"uuid": "uuid", "name": "name"}
_NA = {"[N/A]", "N/A", "[Not Supported]", "[Unknown Error]"}
_HEADER_FIELD = re.compile(r"^[a-z][a-z0-9_.]*(?: \[[^\]]+\])?$")
_NO_DEVICES = "No devices were found"
_LIST_GPU = re.compile(r"^GPU (\d+): (.+?) \(UUID: (GPU-[0-9a-fA-F-]+)\)$")
_LIST_MIG = re.compile(r"^\s+MIG (.+?)\s+Device\s+(\d+): \(UUID: (MIG-[0-9a-fA-F-]+)\)$")
_TABLE_VERSIONS = re.compile(
    r"NVIDIA-SMI (\S+)\s+Driver Version: (\S+)\s+CUDA Version: (\S+)"
)
_TABLE_ROW1 = re.compile(r"^\|\s+(\d+)\s+(.+?)\s+(On|Off)\s+\|\s+(\S+)\s+(\S+)\s+\|")
_TABLE_ROW2 = re.compile(r"^\|.*\|\s+(\d+)MiB /\s+(\d+)MiB\s+\|")


def _lines(text: Any) -> list[str]:
    if not isinstance(text, str):
        raise ValueError(f"nvidia-smi output must be a string, got {type(text).__name__}")
    return [line.rstrip() for line in text.splitlines() if line.strip()]


def _key(field: str) -> str:
    if field in _INT_FIELDS:
        return _INT_FIELDS[field]
    return _RENAMED.get(field, field.replace(".", "_"))


def _value(field: str, raw: str, lineno: int) -> Any:
    value = raw.strip()
    if value in _NA:
        return None
    if field not in _INT_FIELDS:
        return value
    number = value.removesuffix(" MiB").strip()
    if not number.isdigit():
        raise ValueError(f"nvidia-smi line {lineno}: field {field!r} is not an integer: {raw.strip()!r}")
    return int(number)


def _is_header(cells: list[str]) -> bool:
    return not cells[0].isdigit() and all(_HEADER_FIELD.match(cell) for cell in cells)


def nvidia_smi_query_gpus(text: str, fields: list[str] | None = None) -> list[dict[str, Any]]:
    """Parse ``--query-gpu`` CSV output into one dict per GPU.

    Known keys: index (int), name, uuid, memory_total_mib (int), memory_used_mib (int),
    driver_version, compute_cap; further queried fields keep their name with ``.`` -> ``_``.
    ``[N/A]`` values become None.
    """
    lines = _lines(text)
    if not lines or (len(lines) == 1 and lines[0].strip() == _NO_DEVICES):
        return []
    first = [cell.strip() for cell in lines[0].split(",")]
    if _is_header(first):
        names = [re.sub(r" \[[^\]]+\]$", "", cell) for cell in first]
        rows = lines[1:]
        offset = 2
    else:
        names = list(fields or DEFAULT_QUERY_FIELDS)
        rows = lines
        offset = 1
    gpus: list[dict[str, Any]] = []
    for lineno, line in enumerate(rows, start=offset):
        # GPU names contain no commas; split exactly like nvidia-smi joins (", ").
        cells = line.split(",")
        if len(cells) != len(names):
            raise ValueError(
                f"nvidia-smi line {lineno}: expected {len(names)} fields ({', '.join(names)}), "
                f"got {len(cells)}: {line!r}"
            )
        gpus.append({_key(name): _value(name, cell, lineno) for name, cell in zip(names, cells, strict=True)})
    return gpus


def nvidia_smi_list(text: str) -> list[dict[str, Any]]:
    """Parse ``nvidia-smi -L`` into [{index, name, uuid, mig_devices: [{profile, index, uuid}]}]."""
    gpus: list[dict[str, Any]] = []
    for lineno, line in enumerate(_lines(text), start=1):
        if line.strip() == _NO_DEVICES:
            continue
        gpu = _LIST_GPU.match(line)
        if gpu:
            gpus.append(
                {"index": int(gpu[1]), "name": gpu[2], "uuid": gpu[3], "mig_devices": []}
            )
            continue
        mig = _LIST_MIG.match(line)
        if mig and gpus:
            gpus[-1]["mig_devices"].append({"profile": mig[1], "index": int(mig[2]), "uuid": mig[3]})
            continue
        raise ValueError(f"nvidia-smi -L line {lineno} not understood: {line!r}")
    return gpus


def nvidia_smi_table(text: str) -> dict[str, Any]:
    """Parse the default ``nvidia-smi`` table: versions and per-GPU index/name/bus id/memory."""
    versions = _TABLE_VERSIONS.search(text if isinstance(text, str) else "")
    if not versions:
        raise ValueError("nvidia-smi table: no 'NVIDIA-SMI ... Driver Version: ... CUDA Version:' header")
    gpus: list[dict[str, Any]] = []
    for line in _lines(text):
        row1 = _TABLE_ROW1.match(line)
        if row1:
            gpus.append(
                {
                    "index": int(row1[1]),
                    "name": row1[2],
                    "persistence_mode": row1[3],
                    "pci_bus_id": row1[4],
                }
            )
            continue
        row2 = _TABLE_ROW2.match(line)
        if row2 and gpus and "memory_total_mib" not in gpus[-1]:
            gpus[-1]["memory_used_mib"] = int(row2[1])
            gpus[-1]["memory_total_mib"] = int(row2[2])
    return {
        "smi_version": versions[1],
        "driver_version": versions[2],
        "cuda_version": versions[3],
        "gpus": gpus,
    }


class FilterModule:
    """Ansible filter: nvidia_smi_query_gpus. nvidia_smi_list and nvidia_smi_table (`nvidia-smi -L` and the default
    table) are not filters: no role reads those outputs; the lab's tests (tests/lab/test_nvidia_lab.py) use them."""

    def filters(self) -> dict[str, Any]:
        return {"nvidia_smi_query_gpus": nvidia_smi_query_gpus}
