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
# (-) signs and periods (.), starting with an alphanumeric character. Only such names reach the shell command below.
DEB_PACKAGE = re.compile(r"[a-z0-9][a-z0-9+.-]+")
# apt's record of automatically installed packages (Dir::State::extended_states): apt state=present marks the packages
# it is given as manually installed, so a requested package marked automatic is left to apt
APT_EXTENDED_STATES = "/var/lib/apt/extended_states"


def dpkg_status_command(packages: Any) -> str | None:
    """The one read the action d3fleet.fleet.apt_present makes before apt (tests/contracts/dpkg/dpkg-query-status.yml):
    the native architecture, each package's architecture, error flag and status word, and which of them apt marked
    as automatically installed. None when a name is not a plain package name (a version, an architecture, a
    pattern: apt alone knows what it means, so the action asks apt). ValueError when there is no name at all."""
    if not isinstance(packages, list) or not packages:
        raise ValueError("apt_present: name must be a non-empty list of Debian package names")
    if not all(isinstance(p, str) and DEB_PACKAGE.fullmatch(p) for p in packages):
        return None
    names = " ".join(packages)
    return (
        "printf 'arch %s\\n' \"$(dpkg --print-architecture)\"; "
        "dpkg-query -W -f='pkg ${Package} ${Architecture} ${db:Status-Eflag} ${db:Status-Status}\\n' -- " + names + "; rc=$?; "
        f"awk -v RS= -v want=' {names} ' '/\\nAuto-Installed: 1/ {{ split($0, f, \"\\n\"); n = \"\"; a = \"\"; "
        "for (i in f) { if (f[i] ~ /^Package: /) n = substr(f[i], 10); else if (f[i] ~ /^Architecture: /) a = substr(f[i], 15) } "
        f"if (index(want, \" \" n \" \")) print \"auto\", n, a }}' {APT_EXTENDED_STATES} 2>/dev/null; exit $rc"
    )


def apt_missing(read: str, packages: list[str]) -> list[str]:
    """The packages, in the order asked, that apt state=present would still act on, from the output of
    dpkg_status_command: not installed for the native architecture or ``all`` (unknown to dpkg, another state such
    as config-files, unpacked or triggers-pending, the reinstall-required flag, only a foreign architecture), or marked
    automatically installed (apt would mark it manual). Without the native architecture, every package."""
    native = ""
    installed: set[tuple[str, str]] = set()
    auto: set[tuple[str, str]] = set()
    for line in read.splitlines():
        fields = line.split()
        if fields[:1] == ["arch"] and len(fields) == 2:
            native = fields[1]
        elif fields[:1] == ["pkg"] and len(fields) == 5 and fields[3:] == ["ok", "installed"]:
            installed.add((fields[1], fields[2]))
        elif fields[:1] == ["auto"] and len(fields) == 3:
            auto.add((fields[1], fields[2]))

    def present(name: str) -> bool:
        return bool(native) and bool({(name, native), (name, "all")} & installed) and (name, native) not in auto

    return [p for p in packages if not present(p)]


# apt-get's options for package lists read into a temporary directory: the host's own lists, caches and package
# database stay as they are (apt.conf(5): Dir::State::Lists; an empty Dir::Cache::pkgcache / srcpkgcache: no cache file)
_TMP_LISTS = '-o "Dir::State::Lists=$d" -o Dir::Cache::pkgcache= -o Dir::Cache::srcpkgcache='


def apt_simulate_command(packages: list[str]) -> str:
    """What check mode runs where the real run would refresh apt's package lists before installing
    (tests/contracts/dpkg/apt-get-simulate.yml): fresh lists read into a temporary directory, then ``apt-get -s
    install`` (a simulation: nothing is installed). The host's lists are not touched; the directory is removed.
    Plain package names only (dpkg_status_command's check): anything else is refused."""
    if not isinstance(packages, list) or not packages or not all(isinstance(p, str) and DEB_PACKAGE.fullmatch(p) for p in packages):
        raise ValueError(f"apt_present: cannot simulate an install of {packages!r}: plain Debian package names only")
    return (
        "set -e; d=$(mktemp -d); trap 'rm -rf \"$d\"' EXIT; mkdir -p \"$d/partial\"; "
        f"apt-get {_TMP_LISTS} -qq update >/dev/null; apt-get {_TMP_LISTS} -s install -- {' '.join(packages)}"
    )


def apt_simulated(stdout: str) -> list[str]:
    """The packages apt-get's simulation would install or upgrade (its ``Inst NAME ...`` lines, in its order)."""
    return [line.split()[1] for line in stdout.splitlines() if line.startswith("Inst ") and len(line.split()) > 1]


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
