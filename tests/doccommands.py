"""The commands the front door shows a new user, as written: README.md's ```sh blocks, the example inventory's comments
and the lines `make demo` ends with (examples/demo-next-steps.sh). tests/test_readme_commands.py and
tests/lab/test_readme_commands_lab.py run them; this module only reads and sorts them (no process)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
EXAMPLE = ROOT / "inventories/example"
NEXT_STEPS = ROOT / "examples/demo-next-steps.sh"
REQUEST = ROOT / "examples/decision-request.json"
CONTRACT_REQUEST = ROOT / "tests/contracts/vllm/systemone-request.json"

# Lines that set up the shell for the commands after them (run before each command, as a reader's shell has them).
SETUP = re.compile(r"(\. \.venv/bin/activate|export [A-Z_]+=\S+)\Z")
# Shown but not run here, each with its reason.
NOT_RUN = {
    "make demo": "the demo itself: brings the shared lab to 2 hosts; timed by hand (README, docs/testing.md)",
    "make test": "the whole suite (.ci/run runs it)",
    "make check": "the quick tier this test is part of",
    "make lab-down": "removes the shared lab the lab tier needs",
}
LAB_INVENTORY = "-i inventories/lab"


def _shell_lines(text: str) -> list[str]:
    """Commands of a shell text: comments and blank lines dropped, `\\` continuations joined."""
    commands, pending = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1]
            continue
        command = _strip_comment(pending + line)
        pending = ""
        if command:
            commands.append(command)
    return commands


def _strip_comment(line: str) -> str:
    """The line without a trailing `# comment` (a # outside quotes that starts a word)."""
    quote, out = None, []
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            break
        out.append(ch)
    return "".join(out).rstrip()


def readme_commands(text: str) -> list[str]:
    """Every command of the ```sh blocks of a Markdown text, in order."""
    blocks = re.findall(r"^[ \t]*```sh[ \t]*\n(.*?)^[ \t]*```", text, flags=re.M | re.S)
    return [c for block in blocks for c in _shell_lines(block)]


def comment_commands(text: str) -> list[str]:
    """The commands a YAML file's comments show: a comment line whose text, indented, starts with `ansible-playbook` or `make `."""
    found = []
    for line in text.splitlines():
        m = re.match(r"\s*#\s{2,}((?:ansible-playbook|make) .*)\Z", line)
        if m:
            found.append(_strip_comment(m.group(1)))
    return found


def shown() -> list[tuple[str, str]]:
    """(where, command) for every command the front door shows, in reading order."""
    out = [("README.md", c) for c in readme_commands(README.read_text())]
    for path in sorted(EXAMPLE.rglob("*.yml")):
        out += [(str(path.relative_to(ROOT)), c) for c in comment_commands(path.read_text())]
    out += [(str(NEXT_STEPS.relative_to(ROOT)), c) for c in _shell_lines(NEXT_STEPS.read_text())]
    return out


# where this machine reaches the lab's router: its published ports on loopback, or the routers' virtual address on their
# VRRP bridge (lab/roles/lab_hosts/defaults/main.yml: lab_hosts_vrrp_base .10)
LAB_ADDRESSES = ("127.0.0.1", "10.79.0.10")


def tier(command: str) -> str:
    """Where a shown command runs: `setup`, `skip` (NOT_RUN), `lab` (the lab inventory, or a call to the lab's router
    on this machine's loopback) or `playbook` (the example inventory, on no host); `unknown` otherwise."""
    if SETUP.match(command):
        return "setup"
    if command in NOT_RUN:
        return "skip"
    if LAB_INVENTORY in command or (command.startswith("curl ") and any(f"http://{a}:" in command for a in LAB_ADDRESSES)):
        return "lab"
    if command == "make plan" or "-i inventories/example" in command:
        return "playbook"
    return "unknown"


def setup_lines() -> list[str]:
    return [c for _, c in shown() if tier(c) == "setup"]


def run(command: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """A shown command as a reader runs it: bash in the repository's top directory after the shown setup lines, with
    no ANSIBLE_* variable of the test's own environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    script = "\n".join(["set -e", *setup_lines(), command])
    return subprocess.run(["bash", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout,
                          check=False)  # fmt: skip


# --- the facts the docs name: variables, groups, ports (tests/test_readme_commands.py checks them against the code) ---

DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]
# where the code is: every file here that is text (roles, playbooks, the collection, the lab's stand-ins, tools)
CODE = ["site.yml", "Makefile", "ansible.cfg", "execution-environment.yml", "roles", "playbooks", "collections", "lab",
        "molecule", "tools", "inventories/example", ".ci"]  # fmt: skip
CODE_SUFFIXES = {".yml", ".yaml", ".py", ".j2", ".sh", ".cfg", ".conf", ".txt", ".json", ""}
# a variable of the project's roles, as the docs write them in `code`
VARIABLE = re.compile(r"(?<![\w./-])((?:d3|nvidia_toolkit|podman)_[a-z0-9_]*[a-z0-9])(?![\w*{-]|\.[a-z])")
GROUP_VARS = re.compile(r"group_vars/([A-Za-z0-9_.-]+?)(?=[/`)\s,.;:]|\Z)")
GROUP = re.compile(r"\bgroups?:? `([a-z0-9][a-z0-9-]*)`|`([a-z0-9][a-z0-9-]*)` group")
URL_PORT = re.compile(r"https?://([A-Za-z0-9_.-]+):([0-9]{2,5})")
DEFAULT_ROW = re.compile(r"^\| `([a-z0-9_]+)`(?: \([^|]*\))? \| `([^`|]+)` \|", flags=re.M)
# a variable with its default in running text: `d3_router_metrics_port` (8405)
DEFAULT_INLINE = re.compile(r"`([a-z0-9_]+)` \(([0-9]+)\)")
# names the docs keep for a reason though the code no longer has them
HISTORICAL = {"d3_router_port_base": "docs/router.md: the variable d3_router_ports replaced, for an upgrade"}


def code_files() -> list[Path]:
    files = []
    for entry in CODE:
        path = ROOT / entry
        found = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        files += [p for p in found if p.suffix in CODE_SUFFIXES and "__pycache__" not in p.parts]
    return files


def code_words() -> set[str]:
    """Every word (letters, digits, `_`, `-`) of the code."""
    words: set[str] = set()
    for path in code_files():
        try:
            words.update(re.findall(r"[A-Za-z0-9_-]+", path.read_text()))
        except UnicodeDecodeError:
            continue
    return words


def doc_spans(path: Path) -> list[str]:
    """The `code` spans of a Markdown file, fenced blocks included."""
    text = path.read_text()
    fenced = re.findall(r"^[ \t]*```[a-z]*\n(.*?)^[ \t]*```", text, flags=re.M | re.S)
    rest = re.sub(r"^[ \t]*```[a-z]*\n.*?^[ \t]*```", "", text, flags=re.M | re.S)
    return fenced + re.findall(r"`([^`\n]+)`", rest)


def named_variables() -> dict[str, list[str]]:
    """variable -> the docs that name it (in code spans)."""
    out: dict[str, list[str]] = {}
    for path in DOCS:
        for span in doc_spans(path):
            for name in VARIABLE.findall(span):
                out.setdefault(name, []).append(path.name)
    return out


def named_groups() -> dict[str, list[str]]:
    """inventory group -> the docs that name it (group_vars/NAME, group `NAME`, `NAME` group)."""
    out: dict[str, list[str]] = {}
    for path in DOCS + sorted(EXAMPLE.rglob("*.yml")):
        text = path.read_text()
        names = GROUP_VARS.findall(text) + [a or b for a, b in GROUP.findall(text)]
        for name in names:
            out.setdefault(name, []).append(path.name)
    return out


def named_router_urls() -> list[tuple[str, str, int]]:
    """(doc, host, port) of every URL the docs give to a router by name (http://router:8000, http://ROUTER:8000)."""
    return [(path.name, host, int(port)) for path in DOCS for host, port in URL_PORT.findall(path.read_text())
            if "router" in host.lower()]  # fmt: skip


def documented_defaults() -> list[tuple[str, str, str]]:
    """(doc, variable, default) of every table row `| \\`variable\\` | \\`default\\` |` in the docs."""
    found = []
    for path in DOCS:
        text = path.read_text()
        found += [(path.name, name, value) for name, value in DEFAULT_ROW.findall(text) + DEFAULT_INLINE.findall(text)]
    return found


def role_defaults() -> dict[str, Any]:
    """variable -> its default, from every role's defaults/main.yml."""
    out: dict[str, Any] = {}
    for path in sorted((ROOT / "roles").glob("*/defaults/main.yml")):
        out.update(yaml.safe_load(path.read_text()) or {})
    return out


def playbook_groups() -> set[str]:
    """The inventory groups the playbooks and roles use (hosts: lines and groups['NAME'])."""
    found = {"all"}
    for path in [ROOT / "site.yml", *sorted((ROOT / "playbooks").glob("*.yml")), *sorted((ROOT / "roles").rglob("*.yml"))]:
        text = path.read_text()
        found.update(re.findall(r"groups\[['\"]([A-Za-z0-9_-]+)['\"]\]", text))
        found.update(re.findall(r"^\s*-?\s*hosts: ([A-Za-z0-9_-]+)\s*$", text, flags=re.M))
    return found
