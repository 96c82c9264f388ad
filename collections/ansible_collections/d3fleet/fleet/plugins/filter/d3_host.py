"""Host-side helpers: free space, Debian version strings, installed packages, download sizes, and whether a read file
must be written."""

from __future__ import annotations

import re
from typing import Any


def df_line(line: str) -> dict[str, Any]:
    """'<mount point> <available bytes>' (from ``df -P -B1 | awk``) -> {mount, size_available}."""
    mount, _, avail = line.rpartition(" ")
    if not mount or not avail.isdigit():
        raise ValueError(f"cannot read free space from {line!r}")
    return {"mount": mount, "size_available": int(avail)}


def apt_candidate(policy_output: str) -> str:
    """The upstream version of the candidate in ``apt-cache policy PKG`` output ('' when none)."""
    match = re.search(r"Candidate:\s*(\S+)", policy_output)
    if not match or match.group(1) == "(none)":
        return ""
    return upstream_version(match.group(1))


# Debian Policy 5.6.1 (Package): at least two characters, lower case letters (a-z), digits (0-9), plus (+) and minus
# (-) signs and periods (.), starting with an alphanumeric character. Nothing else reaches the shell command below.
DEB_PACKAGE = re.compile(r"[a-z0-9][a-z0-9+.-]+")


def dpkg_status_command(packages: Any) -> str:
    """The one read the action d3fleet.fleet.apt_present makes before apt: each package's status word
    (tests/contracts/dpkg/dpkg-query-status.yml). ValueError naming the option when a name is not a package name."""
    if not isinstance(packages, list) or not packages:
        raise ValueError("apt_present: name must be a non-empty list of Debian package names")
    bad = [p for p in packages if not isinstance(p, str) or not DEB_PACKAGE.fullmatch(p)]
    if bad:
        raise ValueError(
            f"apt_present: name {', '.join(map(repr, bad))}: not a Debian package name (Debian Policy 5.6.1: lower case"
            " letters, digits, '+', '-' and '.', starting with a letter or digit; no version or architecture)"
        )
    return "dpkg-query -W -f='${Package} ${db:Status-Status}\\n' -- " + " ".join(packages)


def apt_missing(dpkg_output: str, packages: list[str]) -> list[str]:
    """The packages, in the order asked, that the read of dpkg_status_command does not show as ``installed``: unknown
    to dpkg (stderr only), or in any other state (config-files, unpacked, half-configured, triggers-pending, ...)."""
    installed = set()
    for line in dpkg_output.splitlines():
        name, _, status = line.partition(" ")
        if status.strip() == "installed":
            installed.add(name)
    return [p for p in packages if p not in installed]


def upstream_version(debian_version: str) -> str:
    """'1:4.3.1+ds1-8+deb12u1' -> '4.3.1'."""
    version = debian_version.split(":", 1)[-1]
    match = re.match(r"(\d+(?:\.\d+)*)", version)
    return match.group(1) if match else ""


def download_bytes(result: dict[str, Any], catalog: dict[str, Any]) -> int:
    """Bytes one model still needs, from a Hub ``/api/models/REPO/tree/SHA/?recursive=true`` answer (a registered
    uri loop item: a list of {type, path, size}); when the Hub gave no sizes, the planned instance's
    ``download_bytes`` (its variant's download_gb), else the catalog's ``download_gb`` for the repository (a size's
    own or one of its variants'). The loop's ``item`` is the planned instance."""
    tree = result.get("json")
    entries = tree if isinstance(tree, list) else []
    sizes = [e.get("size") for e in entries if isinstance(e, dict) and e.get("type") == "file"]
    if sizes and all(isinstance(s, int) for s in sizes):
        return sum(sizes)
    instance = result["item"]
    if isinstance(instance.get("download_bytes"), int):  # the planned variant's size (d3_plan)
        return int(instance["download_bytes"])
    repo = instance["hf_repo"]
    for entry in catalog.values():
        if entry["hf_repo"] == repo:
            return int(float(entry["download_gb"]) * 1e9)
        for variant in (entry.get("variants") or {}).values():
            if (variant or {}).get("hf_repo") == repo:
                return int(float(variant.get("download_gb", entry["download_gb"])) * 1e9)
    raise ValueError(f"{repo} is not in the catalog")


def file_differs(
    info: dict[str, Any], kind: str, mode: str, checksum: str | None = None, owner: str = "root", group: str = "root"
) -> bool:
    """True when a path, as the ``units_read`` module described it, is not what the role would write: missing, of
    another kind (``file`` or ``directory``), another mode, owner or group, or (a file, when ``checksum`` is given)
    another content. A role skips its write when this is False, so a run that changes nothing makes no call."""
    if kind not in ("file", "directory"):
        raise ValueError(f"kind must be 'file' or 'directory', not {kind!r}")
    if not re.fullmatch(r"0[0-7]{3}", mode):
        raise ValueError(f"mode must be 4 octal digits such as '0644', not {mode!r}")
    if not info.get("exists"):
        return True
    if not info.get("isdir" if kind == "directory" else "isreg"):
        return True
    if info.get("mode") != mode or info.get("owner") != owner or info.get("group") != group:
        return True
    return checksum is not None and info.get("checksum") != checksum


class FilterModule:
    """Ansible filters: d3_df_line, d3_apt_candidate, d3_download_bytes, d3_file_differs."""

    def filters(self) -> dict[str, Any]:
        return {
            "d3_df_line": df_line,
            "d3_apt_candidate": apt_candidate,
            "d3_download_bytes": download_bytes,
            "d3_file_differs": file_differs,
        }
