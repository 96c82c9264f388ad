"""The commands the front door shows a new user, as written: README.md's ```sh blocks, the example inventory's comments
and the lines `make demo` ends with (examples/demo-next-steps.sh). tests/test_readme_commands.py and
tests/lab/test_readme_commands_lab.py run them; this module only reads and sorts them (no process)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

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


def tier(command: str) -> str:
    """Where a shown command runs: `setup`, `skip` (NOT_RUN), `lab` (the lab inventory, or a call to the lab's router
    on this machine's loopback) or `playbook` (the example inventory, on no host); `unknown` otherwise."""
    if SETUP.match(command):
        return "setup"
    if command in NOT_RUN:
        return "skip"
    if LAB_INVENTORY in command or (command.startswith("curl ") and "http://127.0.0.1:" in command):
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
