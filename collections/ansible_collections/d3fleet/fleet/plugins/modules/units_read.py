#!/usr/bin/python
"""Ansible module: read, in one remote call, everything the d3_units role decides from."""

from __future__ import annotations

DOCUMENTATION = r"""
module: units_read
version_added: 0.3.0
short_description: Read the D3 unit files, their systemd state, the API key secret and stale units in one call
description:
  - Read-only (always C(changed=false), runs in check mode too). It replaces a dozen single reads per host
    (stat, slurp, find, C(systemctl show), C(podman secret inspect)), so a run that changes nothing costs one
    remote call for the d3_units role's decisions; the role then writes, reloads and starts only what differs.
  - Files are described as C(stat) would (existence, type, mode, owner, mtime) with the SHA-1 of a regular file's
    content, the checksum the C(template) and C(copy) modules compare.
  - Units are read with a single C(systemctl show --timestamp=unix) for all of them (systemd prints one block per
    unit, in the order asked, separated by an empty line).
options:
  paths:
    description: Paths to describe.
    type: list
    elements: path
    default: []
  slurp:
    description: Small files whose text to return (for example the API key fingerprint file; never the key).
    type: list
    elements: path
    default: []
  units:
    description: systemd unit names (with suffix) whose properties to read.
    type: list
    elements: str
    default: []
  properties:
    description: The systemd properties to read for each unit.
    type: list
    elements: str
    default: [Id, ActiveState, InactiveExitTimestamp, NeedDaemonReload, UnitFileState]
  secret:
    description:
      - A podman secret whose existence to check (C(podman secret inspect)); its data is never read.
      - Without podman on the host (a fresh host in check mode) the secret does not exist.
    type: str
  find_paths:
    description: Directories in which to list the files that end in one of I(find_suffixes) and contain I(find_contains).
    type: list
    elements: path
    default: []
  find_suffixes:
    description: File name endings listed by I(find_paths).
    type: list
    elements: str
    default: [.container, .service]
  find_contains:
    description: A literal string a listed file must contain (the D3 instance label, plugins/module_utils/d3_labels.py).
    type: str
    default: io.d3-fleet.instance=
author: d3-fleet
"""

EXAMPLES = r"""
- name: Read the units' files, states and the API key secret in one call
  d3fleet.fleet.units_read:
    paths: [/etc/containers/systemd, /etc/containers/systemd/d3-flash.container]
    units: [d3-flash.service]
    secret: d3-api-key
    slurp: [/var/lib/d3/api-key.sha256]
    find_paths: [/etc/containers/systemd, /etc/systemd/system]
  register: units_host

- name: Template the unit only when its content differs
  ansible.builtin.debug:
    msg: "{{ units_host.files['/etc/containers/systemd/d3-flash.container'].checksum }}"
"""

RETURN = r"""
files:
  description: >-
    Per path (the path itself, a symlink not followed): C(exists), C(isdir), C(isreg), C(islnk), C(mode) (4 octal
    digits), C(uid), C(gid), C(owner), C(group), C(mtime) and, for a regular file, C(checksum) (SHA-1 of its content).
  type: dict
  returned: always
slurped:
  description: Per path of I(slurp), its text, or null when it cannot be read.
  type: dict
  returned: always
units:
  description: Per unit, its properties (strings as systemd prints them).
  type: dict
  returned: always
secret_exists:
  description: Whether the podman secret exists (null when I(secret) is not given).
  type: bool
  returned: always
found:
  description: The files found by I(find_paths) (sorted paths).
  type: list
  returned: always
"""

import grp
import hashlib
import os
import pwd
import stat

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.d3fleet.fleet.plugins.module_utils.d3_labels import INSTANCE


def describe(path: str) -> dict:
    # the path itself, not what a symlink points at (as template and copy see a destination: they replace a link with
    # the file), so a link is neither the file nor the directory a role writes
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return {"exists": False}
    info = {
        "exists": True,
        "isdir": stat.S_ISDIR(st.st_mode),
        "isreg": stat.S_ISREG(st.st_mode),
        "islnk": stat.S_ISLNK(st.st_mode),
        "mode": f"{stat.S_IMODE(st.st_mode):04o}",
        "uid": st.st_uid,
        "gid": st.st_gid,
        "owner": name_of(pwd.getpwuid, st.st_uid),
        "group": name_of(grp.getgrgid, st.st_gid),
        "mtime": st.st_mtime,
    }
    if info["isreg"]:
        digest = hashlib.sha1()  # the checksum Ansible's template and copy modules compare (not for security)
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(65536), b""):
                digest.update(block)
        info["checksum"] = digest.hexdigest()
    return info


def name_of(lookup, number: int) -> str | None:
    try:
        return lookup(number)[0]
    except KeyError:
        return None


def read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read(65536)
    except OSError:
        return None


def parse_show(text: str, units: list[str]) -> dict:
    """`systemctl show A B` prints one block per unit, in the order asked, blocks separated by an empty line."""
    blocks = text.strip("\n").split("\n\n") if text.strip() else []
    out: dict = {}
    for unit, block in zip(units, blocks, strict=False):  # the caller checks that the counts agree
        out[unit] = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
    return out


def find(paths: list[str], suffixes: list[str], contains: str) -> list[str]:
    found = []
    for directory in paths:
        try:
            names = os.listdir(directory)
        except OSError:
            continue
        for name in names:
            path = os.path.join(directory, name)
            if not name.endswith(tuple(suffixes)) or not os.path.isfile(path):
                continue
            text = read_text(path)
            if text is not None and contains in text:
                found.append(path)
    return sorted(found)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "paths": {"type": "list", "elements": "path", "default": []},
            "slurp": {"type": "list", "elements": "path", "default": []},
            "units": {"type": "list", "elements": "str", "default": []},
            "properties": {
                "type": "list",
                "elements": "str",
                "default": ["Id", "ActiveState", "InactiveExitTimestamp", "NeedDaemonReload", "UnitFileState"],
            },
            "secret": {"type": "str"},
            "find_paths": {"type": "list", "elements": "path", "default": []},
            "find_suffixes": {"type": "list", "elements": "str", "default": [".container", ".service"]},
            "find_contains": {"type": "str", "default": f"{INSTANCE}="},
        },
        supports_check_mode=True,
    )
    p = module.params
    units: dict = {}
    if p["units"]:
        argv = ["systemctl", "show", "--timestamp=unix", "--property=" + ",".join(p["properties"]), *p["units"]]
        rc, out, err = module.run_command(argv)
        if rc != 0:
            module.fail_json(msg=f"systemctl show failed (rc {rc}): {err.strip()}", rc=rc)
        units = parse_show(out, p["units"])
        if len(units) != len(p["units"]):
            module.fail_json(msg=f"systemctl show printed {len(units)} blocks for {len(p['units'])} units", stdout=out)
    secret_exists = None
    if p["secret"]:
        # no podman yet (a fresh host in --check, before the podman role installed it): no secret either
        podman = module.get_bin_path("podman")
        if podman is None:
            secret_exists = False
        else:
            rc, _, _ = module.run_command([podman, "secret", "inspect", "--format", "{{.Spec.Name}}", p["secret"]])
            secret_exists = rc == 0
    module.exit_json(
        changed=False,
        files={path: describe(path) for path in p["paths"]},
        slurped={path: read_text(path) for path in p["slurp"]},
        units=units,
        secret_exists=secret_exists,
        found=find(p["find_paths"], p["find_suffixes"], p["find_contains"]),
    )


if __name__ == "__main__":
    main()
