# d3fleet.fleet.fleet: the fleet-shaped stdout callback (docs/output.md).
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
name: fleet
type: stdout
short_description: Fleet-shaped output - one line per host and step, the tables whole, each error once with its fix
description:
  - A stdout callback for the d3-fleet playbooks. Without C(-v) it prints, for each play, one line per host and
    step when the step ends (a step is a role's consecutive tasks, play tasks in between do not end it; the tasks
    of the play outside roles make one step, C(play tasks), that ends with the play; a role's tasks from another
    role it includes count as its own) - C(ok),
    C(changed) with the number of changed tasks, or C(FAILED), the number of tasks it ran and how long it took -
    the messages of C(ansible.builtin.debug) tasks (the plan, smoke, status and bench tables) line by line, never
    wrapped nor quoted (a host's own message, when several hosts print, under the host's name; the same message
    from another host as one line naming both), each failure once (host, step, task and the task's own message,
    which names the fix; a list of problems one problem a line under that host), and a recap of one line per host.
  - Hidden without C(-v) - every task banner, the C(ok)/C(skipped) lines, the result dictionaries, a failure a
    C(rescue) section handles (the rescue's own failure is printed), a failure under C(ignore_errors), the Python
    traceback and the source excerpt of a failed task. Warnings and deprecations are printed as usual.
  - With C(-v) or more it prints what C(ansible.builtin.default) prints (it is that callback, with its options).
  - Opt-in - set C(ANSIBLE_STDOUT_CALLBACK=d3fleet.fleet.fleet) (C(make demo) does); the project's C(ansible.cfg)
    keeps C(ansible.builtin.default), which the tests that read Ansible's output expect, and AWX uses its own.
author: d3-fleet
version_added: 1.0.0
extends_documentation_fragment:
  - ansible.builtin.default_callback
  - ansible.builtin.result_format_callback
requirements:
  - set as the stdout callback (C(ANSIBLE_STDOUT_CALLBACK=d3fleet.fleet.fleet) or C(stdout_callback) in ansible.cfg)
"""

EXAMPLES = r"""
# make demo's output; any playbook the same way:
#   ANSIBLE_STDOUT_CALLBACK=d3fleet.fleet.fleet ansible-playbook site.yml -i inventories/lab -l 'l4-nodes:d3-routers'
# prints, per step and host:
#   d3-lab-host1  d3_units        changed 2    14 tasks   6.2 s
# and a failure once:
#   FAILED d3-lab-host2 [d3] Refuse a plan that cannot work: host d3-lab-host2: ... Fix: ...
"""

import json
import re
import time
from collections.abc import Mapping
from typing import Any

from ansible import constants as C
from ansible.plugins.callback.default import CallbackModule as DefaultCallback

DEBUG_ACTIONS = frozenset({"debug", "ansible.builtin.debug", "ansible.legacy.debug"})
PLAY_STEP = "play tasks"  # the step of a play's tasks outside roles
COUNTS = ("ok", "changed", "failed", "unreachable", "skipped", "rescued", "ignored")


def message_lines(msg: Any) -> list[str]:
    """A debug message as the lines to print: a string split at its newlines, a list one element a line (a table's
    rows), anything else as compact JSON on one line."""
    if isinstance(msg, str):
        return msg.splitlines() or [""]
    if isinstance(msg, list | tuple):
        return [line for item in msg for line in message_lines(item if isinstance(item, str) else _compact(item))]
    return [_compact(msg)]


def _compact(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str, ensure_ascii=False)


def failure_message(result: Mapping[str, Any]) -> str:
    """One line for a failed result: its msg (a list joined), each failed loop item's label and msg, or else the tail
    of its stderr/stdout; the module's own words, whose message names the fix."""
    items = result.get("results")
    if isinstance(items, list) and any(isinstance(r, Mapping) and r.get("failed") for r in items):
        parts = [f"{_label(r)}: {failure_message(r)}" for r in items if isinstance(r, Mapping) and r.get("failed")]
        return "; ".join(parts)
    msg = result.get("msg")
    if isinstance(msg, list | tuple):
        msg = " ".join(str(m) for m in msg)
    text = str(msg or "").strip()
    if not text or text.startswith("non-zero return code"):
        for key in ("stderr", "stdout"):  # a command's own words: the last lines of the first that has some
            tail = str(result.get(key) or "").strip().splitlines()[-3:]
            if tail:
                text = f"{text}: {' / '.join(tail)}" if text else " / ".join(tail)
                break
    if "rc" in result and result.get("rc") not in (0, None) and "rc " not in text:
        text = f"{text} (rc {result['rc']})" if text else f"rc {result['rc']}"
    return " ".join(text.split()) or "failed without a message (-v shows the whole result)"


def failure_lines(result: Mapping[str, Any]) -> list[str]:
    """A failed result as the lines to print: a message that is a list of problems (the plan's refusals, a refused
    host's plan so far) one problem a line; anything else the one line of failure_message."""
    msg = result.get("msg")
    if isinstance(msg, list | tuple) and len(msg) > 1 and not result.get("results"):
        lines = [" ".join(line.split()) for item in msg for line in str(item).splitlines()]
        return [line for line in lines if line]
    return [failure_message(result)]


def names_a_host(text: str, hosts: list[str]) -> bool:
    """Whether ``text`` names one of ``hosts`` as a word (a fleet table does; a host's own plan block may not)."""
    words = set(re.findall(r"[\w.-]+", text))
    return any(h in words for h in hosts)


def _label(item: Mapping[str, Any]) -> str:
    label = item.get("_ansible_item_label", item.get("item"))
    return label if isinstance(label, str) else _compact(label)


def phase_line(host: str, phase: str, counts: Mapping[str, int], seconds: float, widths: tuple[int, int]) -> str:
    """The progress line of one host at the end of one step."""
    if counts.get("unreachable"):
        state = "UNREACHABLE"
    elif counts.get("failed"):
        state = "FAILED"
    elif counts.get("changed"):
        state = f"changed {counts['changed']}"
    else:
        state = "ok"
    ran = sum(counts.get(k, 0) for k in ("ok", "changed", "failed", "unreachable", "rescued", "ignored"))
    tasks = f"{ran} task" + ("s" if ran != 1 else "")
    return f"  {host:<{widths[0]}}  {phase:<{widths[1]}}  {state:<11}  {tasks:>9}  {seconds:6.1f} s"


def recap_line(host: str, summary: Mapping[str, int], width: int) -> str:
    keys = ("ok", "changed", "unreachable", "failures", "skipped", "rescued", "ignored")
    return f"  {host:<{width}}  " + "  ".join(f"{k}={summary.get(k, 0)}" for k in keys)


def rescued(task: Any) -> bool:
    """Whether a failure of this task is handled by a `rescue` section: some enclosing block has one and the task (or
    the include or block holding it) sits in that block's own `block` part (not in its rescue or always)."""
    child, parent = task, getattr(task, "_parent", None)
    while parent is not None:
        if getattr(parent, "rescue", None) and any(_same(child, t) for t in getattr(parent, "block", None) or []):
            return True
        child, parent = parent, getattr(parent, "_parent", None)
    return False


def _same(a: Any, b: Any) -> bool:
    return a is b or (getattr(a, "_uuid", None) is not None and getattr(a, "_uuid", None) == getattr(b, "_uuid", None))


def task_name(task: Any) -> str:
    """A task's own name (without the role prefix the step already shows), or Ansible's name for it."""
    return str(getattr(task, "name", "") or task.get_name()).strip()


def role_of(task: Any) -> str | None:
    """The role a task belongs to (its step): the outermost role of its parents, so that the tasks a role includes
    from another (d3_preflight checking every role's inputs) stay in the step of the role the play named; None for a
    task of the play itself."""
    role, node = None, task
    while node is not None:
        role = getattr(node, "_role", None) or role
        node = getattr(node, "_parent", None)
    return None if role is None else str(role.get_name(include_role_fqcn=False))


class Step:
    """One step's results per host: a role's consecutive tasks (tasks of the play in between do not end it), or all
    the tasks of the play outside roles (printed when the play ends)."""

    def __init__(self, name: str, start: float) -> None:
        self.name, self.start = name, start
        self.hosts: dict[str, dict[str, int]] = {}
        self.last: dict[str, float] = {}

    def count(self, host: str, key: str, now: float) -> None:
        self.hosts.setdefault(host, dict.fromkeys(COUNTS, 0))[key] += 1
        self.last[host] = now


class CallbackModule(DefaultCallback):
    """ansible.builtin.default with -v; the fleet-shaped output without."""

    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "stdout"
    CALLBACK_NAME = "d3fleet.fleet.fleet"

    def __init__(self) -> None:
        super().__init__()
        self._role_step: Step | None = None
        self._play_step: Step | None = None
        self._play_hosts: list[str] = []
        self._printed: dict[tuple[str, str], str] = {}
        self._clock = time.monotonic

    def _verbose(self) -> bool:
        return self._display.verbosity > 0

    # ---- steps -------------------------------------------------------------------------------------------------
    def _flush(self, step: Step | None) -> None:
        if step is None:
            return
        names = [h for h in self._play_hosts if h in step.hosts] + sorted(set(step.hosts) - set(self._play_hosts))
        width = max([len(h) for h in self._play_hosts + names] + [1])
        for host in names:
            counts = step.hosts[host]
            if not any(counts.get(k) for k in COUNTS if k != "skipped"):
                continue
            line = phase_line(host, step.name, counts, step.last[host] - step.start, (width, 16))
            color = C.COLOR_ERROR if counts.get("failed") or counts.get("unreachable") else (
                C.COLOR_CHANGED if counts.get("changed") else C.COLOR_OK)
            self._display.display(line, color=color)

    def _end_play(self) -> None:
        self._flush(self._role_step)
        self._flush(self._play_step)
        self._role_step = self._play_step = None

    def _step(self, task: Any) -> Step:
        role = role_of(task)
        if role is None:
            if self._play_step is None:
                self._play_step = Step(PLAY_STEP, self._clock())
            return self._play_step
        if self._role_step is None or self._role_step.name != role:
            self._flush(self._role_step)
            self._role_step = Step(role, self._clock())
        return self._role_step

    def _count(self, result: Any, key: str) -> Step:
        step = self._step(result.task)
        step.count(result.host.get_name(), key, self._clock())
        return step

    # ---- playbook events ---------------------------------------------------------------------------------------
    def v2_playbook_on_play_start(self, play: Any) -> None:
        if self._verbose():
            return super().v2_playbook_on_play_start(play)
        self._end_play()
        self._play_hosts = []
        self._display.display(f"PLAY {play.get_name().strip()}" + (" [CHECK MODE]" if play.check_mode else ""))
        return None

    def v2_playbook_on_task_start(self, task: Any, is_conditional: bool) -> None:
        if self._verbose():
            return super().v2_playbook_on_task_start(task, is_conditional)
        self._step(task)
        return None

    def v2_playbook_on_handler_task_start(self, task: Any) -> None:
        if self._verbose():
            return super().v2_playbook_on_handler_task_start(task)
        self._step(task)
        return None

    def v2_runner_on_start(self, host: Any, task: Any) -> None:
        if self._verbose():
            return super().v2_runner_on_start(host, task)
        if host.get_name() not in self._play_hosts:
            self._play_hosts.append(host.get_name())
        return None

    def v2_runner_on_ok(self, result: Any) -> None:
        if self._verbose():
            return super().v2_runner_on_ok(result)
        res = result.result
        self._count(result, "changed" if res.get("changed") else "ok")
        self._handle_warnings(res)
        if result.task.action in DEBUG_ACTIONS:
            self._print_debug(result.task, res, result.host.get_name())
        return None

    def _print_debug(self, task: Any, res: Mapping[str, Any], host: str = "") -> None:
        """Each message line by line. A message from one of several hosts that names none of them (a host's own
        block) is labelled with its host; the same message again from another host says so in one labelled line;
        the same fleet table (it names hosts) from every host prints once."""
        for one in res.get("results") or [res]:
            if "msg" in one:
                lines = message_lines(one["msg"])
            else:
                lines = [f"{k}: {line}" for k, v in one.items() if not k.startswith("_") and k not in (
                    "changed", "failed", "item", "ansible_loop_var") for line in message_lines(v)]
            text = "\n".join(lines)
            label = bool(host) and len(self._play_hosts) > 1 and not getattr(task, "run_once", False) and not names_a_host(
                text, self._play_hosts)
            first = self._printed.get((task._uuid, text))
            if first is not None:  # the same message from another host
                if label:
                    self._display.display(f"{host}: the same as {first}")
                continue
            self._printed[(task._uuid, text)] = host
            self._display.display(f"{host}:\n" + text if label else text)

    def v2_runner_on_failed(self, result: Any, ignore_errors: bool = False) -> None:
        if self._verbose():
            return super().v2_runner_on_failed(result, ignore_errors)
        res = result.result
        self._handle_warnings(res)
        if ignore_errors:
            self._count(result, "ignored")
        elif rescued(result.task):
            self._count(result, "rescued")
        else:
            step = self._count(result, "failed")
            lines = failure_lines(res)
            head = f"FAILED {result.host.get_name()} [{step.name}] {task_name(result.task)}:"
            # one problem per line under its host: a list of problems is not joined into one line
            text = f"{head} {lines[0]}" if len(lines) == 1 else "\n".join([head, *(f"  {line}" for line in lines)])
            self._display.display(text, color=C.COLOR_ERROR, stderr=self.get_option("display_failed_stderr"))
        return None

    def v2_runner_on_unreachable(self, result: Any) -> None:
        if self._verbose():
            return super().v2_runner_on_unreachable(result)
        self._count(result, "unreachable")
        if not result.task.ignore_unreachable:
            self._display.display(f"UNREACHABLE {result.host.get_name()}: {failure_message(result.result)}",
                                  color=C.COLOR_UNREACHABLE, stderr=self.get_option("display_failed_stderr"))  # fmt: skip
        return None

    def v2_runner_on_skipped(self, result: Any) -> None:
        if self._verbose():
            return super().v2_runner_on_skipped(result)
        self._count(result, "skipped")
        return None

    def v2_runner_item_on_ok(self, result: Any) -> None:
        return super().v2_runner_item_on_ok(result) if self._verbose() else None

    def v2_runner_item_on_failed(self, result: Any) -> None:
        return super().v2_runner_item_on_failed(result) if self._verbose() else None

    def v2_runner_item_on_skipped(self, result: Any) -> None:
        return super().v2_runner_item_on_skipped(result) if self._verbose() else None

    def v2_runner_retry(self, result: Any) -> None:
        return super().v2_runner_retry(result) if self._verbose() else None

    def v2_runner_on_async_poll(self, result: Any) -> None:
        return super().v2_runner_on_async_poll(result) if self._verbose() else None

    def v2_runner_on_async_ok(self, result: Any) -> None:
        return super().v2_runner_on_async_ok(result) if self._verbose() else None

    def v2_runner_on_async_failed(self, result: Any) -> None:
        return super().v2_runner_on_async_failed(result) if self._verbose() else None

    def v2_playbook_on_include(self, included_file: Any) -> None:
        return super().v2_playbook_on_include(included_file) if self._verbose() else None

    def v2_playbook_on_notify(self, handler: Any, host: Any) -> None:
        return super().v2_playbook_on_notify(handler, host) if self._verbose() else None

    def v2_playbook_on_no_hosts_remaining(self) -> None:
        if self._verbose():
            return super().v2_playbook_on_no_hosts_remaining()
        self._end_play()
        self._display.display("no hosts left: the play stops", color=C.COLOR_ERROR)
        return None

    def v2_playbook_on_stats(self, stats: Any) -> None:
        if self._verbose():
            return super().v2_playbook_on_stats(stats)
        self._end_play()
        hosts = sorted(stats.processed.keys())
        width = max([len(h) for h in hosts] + [1])
        self._display.display("RECAP")
        for host in hosts:
            summary = stats.summarize(host)
            bad = summary.get("failures") or summary.get("unreachable")
            self._display.display(recap_line(host, summary, width), color=C.COLOR_ERROR if bad else C.COLOR_OK)
        return None
