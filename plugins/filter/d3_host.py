"""Host-side helpers for preflight: which mount holds a path, and Debian version strings."""

from __future__ import annotations

import re
from typing import Any


def mount_for(mounts: list[dict[str, Any]], path: str) -> dict[str, Any]:
    """The entry of ansible_facts['mounts'] whose mount point is the longest prefix of ``path``."""
    best: dict[str, Any] | None = None
    for m in mounts:
        point = str(m.get("mount", ""))
        prefix = point.rstrip("/") + "/"
        if (path == point or path.startswith(prefix) or point == "/") and (best is None or len(point) > len(best["mount"])):
            best = m
    if best is None:
        raise ValueError(f"no mount holds {path}")
    return best


def apt_candidate(policy_output: str) -> str:
    """The upstream version of the candidate in ``apt-cache policy PKG`` output ('' when none)."""
    match = re.search(r"Candidate:\s*(\S+)", policy_output)
    if not match or match.group(1) == "(none)":
        return ""
    return upstream_version(match.group(1))


def upstream_version(debian_version: str) -> str:
    """'1:4.3.1+ds1-8+deb12u1' -> '4.3.1'."""
    version = debian_version.split(":", 1)[-1]
    match = re.match(r"(\d+(?:\.\d+)*)", version)
    return match.group(1) if match else ""


def download_bytes(result: dict[str, Any], catalog: dict[str, Any]) -> int:
    """Bytes one model still needs, from a Hub ``/api/models/REPO/revision/SHA?blobs=true`` answer (a registered
    uri loop item); the catalog's ``download_gb`` when the Hub gave no sizes."""
    siblings = (result.get("json") or {}).get("siblings") or []
    sizes = [s.get("size") for s in siblings if isinstance(s, dict)]
    if sizes and all(isinstance(s, int) for s in sizes):
        return sum(sizes)
    repo = result["item"]["item"]["hf_repo"]
    for entry in catalog.values():
        if entry["hf_repo"] == repo:
            return int(float(entry["download_gb"]) * 1e9)
    raise ValueError(f"{repo} is not in the catalog")


class FilterModule:
    """Ansible filters: d3_mount_for, d3_apt_candidate, d3_upstream_version, d3_download_bytes."""

    def filters(self) -> dict[str, Any]:
        return {
            "d3_mount_for": mount_for,
            "d3_apt_candidate": apt_candidate,
            "d3_upstream_version": upstream_version,
            "d3_download_bytes": download_bytes,
        }
