#!/usr/bin/python
"""Ansible module: small root-owned state files in one directory, written or removed in one remote call."""

from __future__ import annotations

DOCUMENTATION = r"""
module: state_files
version_added: 1.3.0
short_description: Write or remove small root-owned state files in one directory in one call
description:
  - The d3_state role's records (a rollout's drain records and lease on a router, the rollout marker on a host) in one
    remote call per host, where a M(ansible.builtin.file) and a M(ansible.builtin.copy) per file took two or three.
  - With O(state=present), each file is written when its content, mode or owner differs (a temporary file in the same
    directory, C(fsync), then C(rename), so a reader never sees half a file), owned by root with O(mode). With
    O(state=absent), each file that exists is removed; the directory is left as it is.
  - With O(dir_mode), the directory is created when it is missing (with that mode; missing parents with the default
    mode, as C(mkdir -p)) and given that mode and root as owner when it exists; without it, a missing directory fails
    the task (O(state=present)) or has nothing to remove (O(state=absent)).
  - A symbolic link or anything but a regular file where a file goes fails the task before anything is written (a link
    at O(dir) to a directory is followed, as M(ansible.builtin.file) does). With O(state=absent), any name that stays
    in the directory is accepted (a file named by hand is removed, or is not there), a name given twice counts once,
    and a file already gone is not an error.
options:
  dir:
    description: The directory, an absolute path without C(.) or C(..) components.
    type: path
    required: true
  dir_mode:
    description: >-
      The directory's mode (4 octal digits, as a string) when the module should create it and keep its mode and
      owner (root).
    type: str
  files:
    description:
      - >-
        The files. C(name) is a plain file name (letters, digits, C(_.:@+-), not starting with C(.); at most 200
        characters); C(content) the text to write (ignored with O(state=absent)).
    type: list
    elements: dict
    required: true
  mode:
    description: The files' mode (4 octal digits, as a string).
    type: str
    default: "0600"
  state:
    description: V(present) writes the files, V(absent) removes them.
    type: str
    choices: [present, absent]
    default: present
attributes:
  check_mode:
    support: full
    details: Reports what would change (and its diff) and writes nothing.
  diff_mode:
    support: full
    details: One diff per file written or removed (its text before and after).
notes:
  - "Run it as root (C(become)): the files are root's."
author: d3-fleet
"""

EXAMPLES = r"""
- name: Write the lease on each router (root only)
  d3fleet.fleet.state_files:
    dir: /var/lib/d3
    dir_mode: "0755"
    files: [{name: rollout-lease.json, content: "{{ lease | to_json }}\n"}]
  delegate_to: "{{ item }}"
  loop: "{{ groups['d3-routers'] }}"

- name: Remove the drain records of the servers given back
  d3fleet.fleet.state_files:
    dir: /var/lib/d3/router-drains
    files: [{name: be_d3-lite--host2-d3-lite.json}]
    state: absent
"""

RETURN = r"""
written:
  description: The paths written (in check mode, that would be).
  returned: always
  type: list
  elements: str
  sample: [/var/lib/d3/rollout-lease.json]
removed:
  description: The paths removed (in check mode, that would be).
  returned: always
  type: list
  elements: str
  sample: [/var/lib/d3/router-drains/be_d3-lite--host2-d3-lite.json]
"""

import contextlib
import os
import re
import stat
import tempfile
from typing import Any

from ansible.module_utils.basic import AnsibleModule

NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:@+-]{0,199}\Z")
# what O(state=absent) removes: any name that stays in the directory (a record named by hand is removed or not there)
NAME_ABSENT = re.compile(r"[^/\0]{1,255}\Z")
MODE = re.compile(r"0[0-7]{3}\Z")


def problems(params: dict[str, Any]) -> list[str]:
    """What is wrong with the arguments, each naming the argument and the fix (empty when nothing is)."""
    out = []
    directory = params["dir"]
    if not os.path.isabs(directory) or any(part in (".", "..") for part in directory.split("/")):
        out.append(f"dir = {directory!r}: want an absolute path without . or .. components.")
    for key in ("mode", "dir_mode"):
        value = params[key]
        if value is not None and not MODE.match(value):
            out.append(f"{key} = {value!r}: want 4 octal digits as a string, such as '0600'.")
    for i, item in enumerate(params["files"]):
        name = item.get("name")
        if params["state"] == "absent" and isinstance(name, str) and NAME_ABSENT.match(name) and name not in (".", ".."):
            pass
        elif not isinstance(name, str) or not NAME.match(name):
            out.append(f"files[{i}].name = {name!r}: want a plain file name (letters, digits, _.:@+-; not starting with .).")
        elif params["state"] == "present" and not isinstance(item.get("content"), str):
            out.append(f"files[{i}] ({name}): content must be a string.")
        extra = sorted(set(item) - {"name", "content"})
        if extra:
            out.append(f"files[{i}]: unknown keys {extra}; want name and content.")
    return out


def _read(path: str) -> tuple[os.stat_result | None, bytes]:
    """The file's stat and content (None and b'' when it does not exist), read through a descriptor opened without
    following a link or waiting on a FIFO; anything but a regular file raises ValueError."""
    refused = ValueError(f"{path} exists and is not a regular file (a link, a directory...): remove it by hand.")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None, b""
    except OSError as exc:  # ELOOP: a link; EISDIR cannot happen with O_RDONLY, other errors are raised as they are
        if os.path.islink(path):
            raise refused from exc
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise refused
    with os.fdopen(fd, "rb") as handle:
        return st, handle.read()


def _owned(st: os.stat_result, mode: int) -> bool:
    return stat.S_IMODE(st.st_mode) == mode and (st.st_uid, st.st_gid) == (0, 0)


def _write(directory: str, path: str, data: bytes, mode: int) -> None:
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".state_files-")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fchmod(handle.fileno(), mode)
            os.fchown(handle.fileno(), 0, 0)
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise


def _directory(module: AnsibleModule, directory: str, dir_mode: str | None) -> bool:
    """Make the directory right (dir_mode given) or check it exists; True when it changed (or would). A link to a
    directory is followed (as the file module does: /var/lib/d3 moved to a data disk)."""
    try:
        st = os.stat(directory)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISDIR(st.st_mode):
        module.fail_json(msg=f"{directory} exists and is not a directory: remove it by hand or choose another dir.")
    if dir_mode is None:
        if st is None:
            module.fail_json(msg=f"{directory} does not exist: create it first, or give dir_mode to have it created.")
        return False
    mode = int(dir_mode, 8)
    if st is not None and _owned(st, mode):
        return False
    if not module.check_mode:
        missing = []
        at = directory
        while not os.path.isdir(at):
            missing.append(at)
            at = os.path.dirname(at)
        for level in reversed(missing):  # each missing level, as the file module makes them: this mode, root's
            with contextlib.suppress(FileExistsError):  # another run made it meanwhile
                os.mkdir(level, mode)
            os.chmod(level, mode)
            os.chown(level, 0, 0)
        os.chmod(directory, mode)
        os.chown(directory, 0, 0)
    return True


def _apply(module: AnsibleModule, directory: str, plans: list[tuple[str, bytes]], removals: list[str], mode: int,
           changed: bool) -> tuple[list[str], list[str]]:
    """Write and remove; the paths written and removed. A failure part way says what was done before it."""
    written: list[str] = []
    removed: list[str] = []
    try:
        for path, new in plans:
            _write(directory, path, new, mode)
            written.append(path)
        for path in removals:
            try:
                os.unlink(path)
            except FileNotFoundError:  # removed meanwhile (another run): gone as asked
                continue
            removed.append(path)
    except OSError as exc:
        module.fail_json(msg=_failure(module.params["dir"], exc), changed=changed or bool(written or removed),
                         written=written, removed=removed)  # fmt: skip
    return written, removed


def _failure(directory: str, exc: Exception) -> str:
    hint = " Run it as root (become: true): the files are root's." if isinstance(exc, PermissionError) else ""
    return f"state_files in {directory}: {exc}{hint}"


def run(module: AnsibleModule) -> dict[str, Any]:
    params = module.params
    directory, present = os.path.normpath(params["dir"]), params["state"] == "present"
    mode = int(params["mode"], 8)
    changed = False
    if present or params["dir_mode"] is not None:
        changed = _directory(module, directory, params["dir_mode"])
    written: list[str] = []
    removed: list[str] = []
    diffs: list[dict[str, str]] = []
    plans = []
    items = {item["name"]: item for item in params["files"]}  # a name given twice: once (the last one's content)
    for item in items.values():
        path = os.path.join(directory, item["name"])
        st, old = _read(path)
        if present:
            new = item["content"].encode()
            if st is None or old != new or not _owned(st, mode):
                plans.append((path, new))
                written.append(path)
                diffs.append({"before_header": path, "after_header": path,
                              "before": old.decode(errors="replace"), "after": item["content"]})  # fmt: skip
        elif st is not None:
            removed.append(path)
            diffs.append({"before_header": path, "after_header": path, "before": old.decode(errors="replace"), "after": ""})
    if not module.check_mode:
        written, removed = _apply(module, directory, plans, removed, mode, changed)
    result: dict[str, Any] = {"changed": changed or bool(written or removed), "written": written, "removed": removed}
    if module._diff:
        result["diff"] = diffs
    return result


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "dir": {"type": "path", "required": True},
            "dir_mode": {"type": "str"},
            "files": {"type": "list", "elements": "dict", "required": True},
            "mode": {"type": "str", "default": "0600"},
            "state": {"type": "str", "choices": ["present", "absent"], "default": "present"},
        },
        supports_check_mode=True,
    )
    found = problems(module.params)
    if found:
        module.fail_json(msg=" ".join(found))
    try:
        module.exit_json(**run(module))
    except (OSError, ValueError) as exc:
        module.fail_json(msg=_failure(module.params["dir"], exc))


if __name__ == "__main__":
    main()
