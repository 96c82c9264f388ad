"""The fleet-shaped stdout callback d3fleet.fleet.fleet (docs/output.md): its rendering functions and its events,
fed with stand-in tasks, hosts and results (no Ansible process); one playbook-tier run checks it inside Ansible."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "collections/ansible_collections/d3fleet/fleet/plugins/callback"))

import fleet  # noqa: E402  (the callback, imported flat like the filters)
from fleet import CallbackModule, failure_message, message_lines, phase_line, recap_line, rescued  # noqa: E402


# ---- the rendering functions --------------------------------------------------------------------------------------
def test_message_lines_prints_tables_whole() -> None:
    assert message_lines("a\nb  c") == ["a", "b  c"]
    assert message_lines("") == [""]
    assert message_lines(["row 1", "row 2 " + "x" * 200]) == ["row 1", "row 2 " + "x" * 200]
    assert message_lines(["t", {"b": 0.5, "a": [1]}]) == ["t", '{"a": [1], "b": 0.5}']
    assert message_lines(("x\ny",)) == ["x", "y"]
    assert message_lines({"k": "é"}) == ['{"k": "é"}']
    assert message_lines(3) == ["3"]
    assert message_lines(["t", [1, 2]]) == ["t", "[1, 2]"]
    assert message_lines({"path": Path("/x")}) == ['{"path": "/x"}']


def test_failure_message_is_the_tasks_own_words() -> None:
    assert failure_message({"msg": "host a: bad.  Fix:\n set x"}) == "host a: bad. Fix: set x"
    assert failure_message({"msg": ["one", "two"]}) == "one two"
    assert failure_message({"msg": "non-zero return code", "rc": 2, "stderr": "l1\nl2\nl3\nl4", "stdout": "o"}) == (
        "non-zero return code: l2 / l3 / l4 (rc 2)")
    assert failure_message({"rc": 1, "stdout": "only out"}) == "only out (rc 1)"
    assert failure_message({"rc": 3}) == "rc 3"
    assert failure_message({"stderr": "a\nb"}) == "a / b"
    assert failure_message({"msg": "kept", "stderr": "noise", "rc": 0}) == "kept"
    assert failure_message({"msg": "rc 5 said it", "rc": 5}) == "rc 5 said it"
    assert failure_message({}) == "failed without a message (-v shows the whole result)"


def test_failure_message_of_a_loop_names_each_failed_item() -> None:
    result = {"msg": "One or more items failed", "results": [
        {"failed": False, "item": "x"},
        {"failed": True, "msg": "bad one", "_ansible_item_label": "d3-mini"},
        {"failed": True, "msg": "bad two", "item": {"name": "n"}},
        "not a dict",
    ]}  # fmt: skip
    assert failure_message(result) == 'd3-mini: bad one; {"name": "n"}: bad two'
    assert failure_message({"msg": "plain", "results": [{"failed": False}]}) == "plain"
    assert failure_message({"msg": "plain", "results": "odd"}) == "plain"


@pytest.mark.parametrize(("counts", "state", "tasks"), [
    ({"ok": 3}, "ok", "3 tasks"),
    ({"ok": 1}, "ok", "1 task"),
    ({"ok": 2, "changed": 2, "skipped": 9}, "changed 2", "4 tasks"),
    ({"ok": 1, "changed": 1, "failed": 1}, "FAILED", "3 tasks"),
    ({"unreachable": 1, "failed": 1}, "UNREACHABLE", "2 tasks"),
    ({"rescued": 1, "ignored": 1}, "ok", "2 tasks"),
])  # fmt: skip
def test_phase_line(counts: dict[str, int], state: str, tasks: str) -> None:
    line = phase_line("host1", "d3_units", counts, 12.345, (7, 10))
    assert line == f"  host1    d3_units    {state:<11}  {tasks:>9}    12.3 s"


def test_recap_line() -> None:
    summary = {"ok": 5, "changed": 1, "failures": 0, "skipped": 2, "unreachable": 0, "rescued": 1, "ignored": 0}
    assert recap_line("h", summary, 3) == "  h    ok=5  changed=1  unreachable=0  failures=0  skipped=2  rescued=1  ignored=0"
    assert recap_line("h", {}, 1).endswith("ok=0  changed=0  unreachable=0  failures=0  skipped=0  rescued=0  ignored=0")


# ---- stand-ins for Ansible's objects ----------------------------------------------------------------------------
class Obj:
    def __init__(self, **kw: Any) -> None:
        self.__dict__.update(kw)


class Role:
    def __init__(self, name: str) -> None:
        self.name = name

    def get_name(self, include_role_fqcn: bool = True) -> str:
        return ("" if include_role_fqcn is False else "ns.col.") + self.name


class Task(Obj):
    count = 0

    def __init__(self, name: str = "t", role: str | None = None, action: str = "command", parent: Any = None, **kw: Any) -> None:
        Task.count += 1
        super().__init__(name=name, _role=Role(role) if role else None, action=action, _parent=parent,
                         _uuid=f"u{Task.count}", ignore_unreachable=False, **kw)  # fmt: skip

    def get_name(self) -> str:
        return f"{self._role.name} : {self.name}" if self._role else self.name


class Host:
    def __init__(self, name: str) -> None:
        self.name = name

    def get_name(self) -> str:
        return self.name


class Display:
    def __init__(self, verbosity: int = 0) -> None:
        self.verbosity = verbosity
        self.lines: list[tuple[str, str | None, bool]] = []

    def display(self, msg: str, color: str | None = None, stderr: bool = False, **_: Any) -> None:
        self.lines.extend((line, color, stderr) for line in msg.split("\n"))

    def banner(self, msg: str, color: str | None = None, **_: Any) -> None:
        self.lines.append((f"BANNER {msg}", color, False))

    def text(self) -> list[str]:
        return [line for line, _, _ in self.lines]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        self.now += 1.5
        return self.now


def callback(verbosity: int = 0) -> tuple[CallbackModule, Display]:
    cb = CallbackModule()
    display = Display(verbosity)
    cb._display = display
    cb._clock = Clock()
    cb._plugin_options = {"display_failed_stderr": False}  # what set_options() reads from the config
    return cb, display


def result(host: str, task: Task, **res: Any) -> Obj:
    return Obj(host=Host(host), task=task, result=res)


PLAY = Obj(get_name=lambda: " Converge ", check_mode=False)


# ---- rescued ------------------------------------------------------------------------------------------------------
def test_rescued_only_inside_the_block_part_of_a_block_with_a_rescue() -> None:
    inner = Task("fails")
    in_rescue = Task("rescue task")
    block = Obj(block=[inner], rescue=[in_rescue], _parent=None, _uuid="b1")
    inner._parent = in_rescue._parent = block
    assert rescued(inner) and not rescued(in_rescue)
    # nested: a task in an inner block (no rescue) inside an outer block's block part
    leaf = Task("leaf")
    middle = Obj(block=[leaf], rescue=[], _parent=None, _uuid="m")
    leaf._parent = middle
    outer = Obj(block=[Obj(_uuid="m")], rescue=[Task()], _parent=None, _uuid="o")  # a copy of `middle`, same uuid
    middle._parent = outer
    assert rescued(leaf)
    always_only = Obj(block=[], rescue=[], always=[Task()], _parent=None, _uuid="a")
    lone = Task("lone", parent=always_only)
    always_only.block = [lone]
    assert not rescued(lone) and not rescued(Task("no parent"))
    assert not rescued(Task("uuid None", parent=Obj(block=[Obj(_uuid=None)], rescue=[1], _parent=None)))
    assert not rescued(object())  # no _parent
    assert not rescued(Task("in an include", parent=Obj()))  # a parent without block, rescue or _parent
    assert not rescued(Task("no block list", parent=Obj(rescue=[1])))


def test_task_name_and_role() -> None:
    assert fleet.task_name(Task("  Write the unit ", role="d3_units")) == "Write the unit"
    assert fleet.task_name(Obj(name="", get_name=lambda: "command")) == "command"
    assert fleet.task_name(Obj(get_name=lambda: " unnamed ")) == "unnamed"
    assert fleet.role_of(object()) is None
    assert fleet.role_of(Task(role="d3_units")) == "d3_units"
    assert fleet.role_of(Task()) is None
    # d3_preflight includes nvidia_toolkit's checks: they stay in d3_preflight's step
    include = Task("Check the toolkit inputs", role="d3_preflight", parent=Obj(_role=Role("d3_preflight"), _parent=None))
    inner_block = Obj(_role=Role("nvidia_toolkit"), _parent=include)
    assert fleet.role_of(Task("validate", role="nvidia_toolkit", parent=inner_block)) == "d3_preflight"
    assert fleet.role_of(Task("play task", parent=Obj(_role=None, _parent=Obj()))) is None


# ---- the events, without -v ------------------------------------------------------------------------------------
def run_play(cb: CallbackModule) -> None:
    cb.v2_playbook_on_play_start(PLAY)
    units = Task("Write the unit", role="d3_units")
    cb.v2_playbook_on_task_start(units, False)
    for h in ("h1", "h2"):
        cb.v2_runner_on_start(Host(h), units)
    cb.v2_runner_on_ok(result("h2", units, changed=True))
    cb.v2_runner_on_ok(result("h1", units, changed=False))
    skip = Task("Skipped", role="d3_units")
    cb.v2_playbook_on_task_start(skip, False)
    cb.v2_runner_on_skipped(result("h1", skip, skipped=True))
    table = Task("Print the table", role="d3_smoke", action="ansible.builtin.debug")
    cb.v2_playbook_on_task_start(table, False)
    cb.v2_runner_on_ok(result("h1", table, msg=["host  model  health 2q ms", "h1    mini   12"]))
    cb.v2_runner_on_ok(result("h2", table, msg=["host  model  health 2q ms", "h1    mini   12"]))  # the same: once
    cb.v2_runner_on_failed(result("h2", table, msg="x", exception="Traceback ..."), ignore_errors=True)


def test_one_line_per_host_and_step_the_tables_whole() -> None:
    cb, display = callback()
    run_play(cb)
    cb.v2_playbook_on_stats(Obj(processed={"h2": 1, "h1": 1}, summarize=lambda h: {"ok": 1, "failures": 0}))
    assert display.text() == [
        "PLAY Converge",
        phase_line("h1", "d3_units", {"ok": 1}, 4.5, (2, 16)),
        phase_line("h2", "d3_units", {"changed": 1}, 1.5, (2, 16)),
        "host  model  health 2q ms",
        "h1    mini   12",
        phase_line("h1", "d3_smoke", {"ok": 1}, 1.5, (2, 16)),
        phase_line("h2", "d3_smoke", {"ok": 1, "ignored": 1}, 4.5, (2, 16)),
        "RECAP",
        "  h1  ok=1  changed=0  unreachable=0  failures=0  skipped=0  rescued=0  ignored=0",
        "  h2  ok=1  changed=0  unreachable=0  failures=0  skipped=0  rescued=0  ignored=0",
    ]
    colors = {line: color for line, color, _ in display.lines}
    assert colors[phase_line("h2", "d3_units", {"changed": 1}, 1.5, (2, 16))] == fleet.C.COLOR_CHANGED
    assert colors[phase_line("h1", "d3_units", {"ok": 1}, 4.5, (2, 16))] == fleet.C.COLOR_OK


def test_each_failure_once_with_its_message_rescued_and_ignored_ones_hidden() -> None:
    cb, display = callback()
    cb.v2_playbook_on_play_start(Obj(get_name=lambda: "Plan", check_mode=True))
    plan = Task("Refuse a plan that cannot work", role="d3", action="ansible.builtin.assert")
    cb.v2_playbook_on_task_start(plan, False)
    cb.v2_runner_on_failed(result("h1", plan, msg=["host h1: bad port. Fix: set port"], exception="Traceback"))
    probe = Task("Probe", role="d3")
    block = Obj(block=[probe], rescue=[Task()], _parent=None, _uuid="blk")
    probe._parent = block
    cb.v2_playbook_on_task_start(probe, False)
    cb.v2_runner_on_failed(result("h2", probe, msg="hidden: the rescue handles it"))
    cb.v2_runner_on_failed(result("h3", probe, msg="hidden: ignored"), ignore_errors=True)
    down = Task("Gather", role="d3")
    cb.v2_playbook_on_task_start(down, False)
    cb.v2_runner_on_unreachable(result("h4", down, msg="ssh: connect refused", unreachable=True))
    down.ignore_unreachable = True
    cb.v2_runner_on_unreachable(result("h5", down, msg="hidden: ignore_unreachable", unreachable=True))
    cb.v2_playbook_on_no_hosts_remaining()
    text = display.text()
    assert text[0] == "PLAY Plan [CHECK MODE]"
    assert text[1] == "FAILED h1 [d3] Refuse a plan that cannot work: host h1: bad port. Fix: set port"
    assert text[2] == "UNREACHABLE h4: ssh: connect refused"
    assert [t.split()[:3] for t in text[3:8]] == [["h1", "d3", "FAILED"], ["h2", "d3", "ok"], ["h3", "d3", "ok"],
                                                   ["h4", "d3", "UNREACHABLE"], ["h5", "d3", "UNREACHABLE"]]  # fmt: skip
    assert text[8:] == ["no hosts left: the play stops"]
    assert not any("hidden" in t or "Traceback" in t for t in text)
    failed = [(c, e) for line, c, e in display.lines if line.startswith(("FAILED", "UNREACHABLE"))]
    assert failed == [(fleet.C.COLOR_ERROR, False), (fleet.C.COLOR_UNREACHABLE, False)]
    assert [c for line, c, _ in display.lines if line.startswith("  h1")] == [fleet.C.COLOR_ERROR]


def test_failed_stderr_option_and_recap_colours() -> None:
    cb, display = callback()
    cb._plugin_options["display_failed_stderr"] = True
    cb.v2_playbook_on_play_start(PLAY)
    t = Task("x")
    cb.v2_playbook_on_task_start(t, False)
    cb.v2_runner_on_failed(result("h", t, msg="m"))
    cb.v2_runner_on_unreachable(result("h", t, msg="u"))
    assert [e for line, _, e in display.lines if line.startswith(("FAILED", "UNREACHABLE"))] == [True, True]
    assert "FAILED h [play tasks] x: m" in display.text()
    summaries = {"bad": {"ok": 1, "failures": 1}, "down": {"unreachable": 1}, "good": {"ok": 2}}
    cb.v2_playbook_on_stats(Obj(processed=dict.fromkeys(summaries, 1), summarize=summaries.__getitem__))
    recap = [(line.split()[0], c) for line, c, _ in display.lines if line.startswith("  ") and "ok=" in line]
    assert recap == [("bad", fleet.C.COLOR_ERROR), ("down", fleet.C.COLOR_ERROR), ("good", fleet.C.COLOR_OK)]


def test_debug_loops_vars_and_handlers() -> None:
    cb, display = callback()
    cb.v2_playbook_on_play_start(PLAY)
    loop = Task("Report", action="debug")
    cb.v2_playbook_on_task_start(loop, False)
    cb.v2_runner_on_ok(result("h", loop, results=[{"msg": "one"}, {"msg": "one"}, {"msg": "two"}]))
    var = Task("Show a var", action="ansible.legacy.debug")
    cb.v2_playbook_on_task_start(var, False)
    cb.v2_runner_on_ok(result("h", var, **{"plan": ["a", "b"], "changed": False, "_ansible_no_log": False, "failed": False,
                                           "item": 1, "ansible_loop_var": "item"}))
    handler = Task("Restart", role="d3_units")
    cb.v2_playbook_on_handler_task_start(handler)
    cb.v2_runner_on_ok(result("h", handler, changed=True))
    cb.v2_playbook_on_play_start(Obj(get_name=lambda: "Router", check_mode=False))  # the last step's line first
    assert display.text()[1:5] == ["one", "two", "plan: a", "plan: b"]
    assert display.text()[5:] == [phase_line("h", "d3_units", {"changed": 1}, 1.5, (1, 16)),
                                  phase_line("h", "play tasks", {"ok": 2}, 3.0, (1, 16)), "PLAY Router"]


def test_play_tasks_between_a_roles_tasks_do_not_end_its_step() -> None:
    """status.yml's shape: role d3_image, a task of the play, d3_image again, then d3_state: two role lines, then
    the play's own line at its end."""
    cb, display = callback()
    cb.v2_playbook_on_play_start(PLAY)
    for task in (Task("a", role="d3_image"), Task("b"), Task("c", role="d3_image"), Task("d", role="d3_state")):
        cb.v2_playbook_on_task_start(task, False)
        cb.v2_runner_on_ok(result("h", task))
    cb.v2_playbook_on_stats(Obj(processed={}, summarize=dict))
    assert [line.split()[1:3] for line in display.text()[1:4]] == [["d3_image", "ok"], ["d3_state", "ok"],
                                                                    ["play", "tasks"]]  # fmt: skip
    assert display.text()[1].split()[3] == "2" and display.text()[3].split()[4] == "1"


def test_hosts_outside_the_play_order_come_last_and_a_skipped_only_host_prints_nothing() -> None:
    cb, display = callback()
    cb.v2_playbook_on_play_start(PLAY)
    t = Task("x", role="r")
    cb.v2_playbook_on_task_start(t, False)
    cb.v2_runner_on_start(Host("b"), t)
    cb.v2_runner_on_start(Host("b"), t)
    cb.v2_runner_on_ok(result("zz-delegated", t))
    cb.v2_runner_on_ok(result("b", t))
    cb.v2_runner_on_skipped(result("c", t))
    cb.v2_playbook_on_stats(Obj(processed={}, summarize=dict))
    assert [line.split()[0] for line in display.text()[1:3]] == ["b", "zz-delegated"]
    assert display.text()[1].startswith("  b             r  ") and display.text()[3:] == ["RECAP"]
    assert cb._play_hosts == ["b"]


def test_verbose_is_the_default_callback(monkeypatch: pytest.MonkeyPatch) -> None:
    """With -v every event goes to ansible.builtin.default, unchanged."""
    seen: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
    events = [n for n in dir(CallbackModule) if n.startswith("v2_") and n in vars(CallbackModule)]
    for name in events:
        monkeypatch.setattr(fleet.DefaultCallback, name, lambda self, *a, _n=name, **k: seen.append((_n, a, k)), raising=False)
    cb, display = callback(verbosity=1)
    t = Task("x")
    args = {"v2_playbook_on_play_start": (PLAY,), "v2_playbook_on_task_start": (t, False),
            "v2_playbook_on_handler_task_start": (t,), "v2_runner_on_start": (Host("h"), t),
            "v2_runner_on_failed": (result("h", t, msg="m"), False), "v2_playbook_on_notify": (t, Host("h")),
            "v2_playbook_on_no_hosts_remaining": (), "v2_playbook_on_stats": (Obj(processed={}),),
            "v2_playbook_on_include": (Obj(),)}  # fmt: skip
    given = {}
    for name in events:
        given[name] = args.get(name, (result("h", t),))
        getattr(cb, name)(*given[name])
    assert seen == [(name, given[name], {}) for name in events] and display.lines == []


def test_quiet_events_print_nothing_without_v() -> None:
    cb, display = callback()
    t = Task("x")
    for name in ("v2_runner_item_on_ok", "v2_runner_item_on_failed", "v2_runner_item_on_skipped", "v2_runner_retry",
                 "v2_runner_on_async_poll", "v2_runner_on_async_ok", "v2_runner_on_async_failed"):
        assert getattr(cb, name)(result("h", t)) is None
    assert cb.v2_playbook_on_include(Obj()) is None and cb.v2_playbook_on_notify(t, Host("h")) is None
    cb.v2_playbook_on_stats(Obj(processed={}, summarize=dict))
    assert display.text() == ["RECAP"]


# ---- inside Ansible ----------------------------------------------------------------------------------------------
PLAYBOOK = """
- name: A play
  hosts: all
  gather_facts: false
  tasks:
    - name: Print a table
      ansible.builtin.debug:
        msg: ["host  model   health 2q ms   {{ 'x' * 120 }}", "a     d3      12.5"]
      run_once: true
    - name: Change something
      ansible.builtin.command: "true"
    - name: A failure a rescue handles
      block:
        - name: Fail inside the block
          ansible.builtin.fail:
            msg: HIDDEN-RESCUED
      rescue:
        - name: Recover
          ansible.builtin.set_fact:
            recovered: true
    - name: Fail on one host
      ansible.builtin.fail:
        msg: "host {{ inventory_hostname }}: bad input. Fix: set x"
      when: inventory_hostname == 'b'
"""


@pytest.mark.playbook
def test_inside_ansible(tmp_path: Path) -> None:
    from testkit import ansible_playbook

    (tmp_path / "play.yml").write_text(PLAYBOOK)
    (tmp_path / "hosts.yml").write_text(
        "all:\n  vars: {ansible_connection: local, ansible_python_interpreter: '{{ ansible_playbook_python }}'}\n"
        "  hosts: {a: {}, b: {}}\n")
    quiet = ansible_playbook(str(tmp_path / "play.yml"), "-i", str(tmp_path / "hosts.yml"),
                             ANSIBLE_STDOUT_CALLBACK="d3fleet.fleet.fleet")  # fmt: skip
    assert quiet.returncode == 2, quiet.stdout + quiet.stderr
    lines = quiet.stdout.splitlines()
    assert lines[0] == "PLAY A play" and lines[1] == "host  model   health 2q ms   " + "x" * 120
    assert lines.count("FAILED b [play tasks] Fail on one host: host b: bad input. Fix: set x") == 1
    assert [ln.split()[:3] for ln in lines if ln.startswith("  a ") or ln.startswith("  b ")][:2] == [
        ["a", "play", "tasks"], ["b", "play", "tasks"]]
    assert "HIDDEN-RESCUED" not in quiet.stdout + quiet.stderr and "TASK [" not in quiet.stdout
    assert len(lines) == 9, quiet.stdout
    assert "Origin:" not in quiet.stderr and "[ERROR]" not in quiet.stderr, quiet.stderr  # no second copy of the error
    verbose = ansible_playbook(str(tmp_path / "play.yml"), "-i", str(tmp_path / "hosts.yml"), "-v",
                               ANSIBLE_STDOUT_CALLBACK="d3fleet.fleet.fleet")  # fmt: skip
    assert "TASK [Fail inside the block]" in verbose.stdout and "HIDDEN-RESCUED" in verbose.stdout


@pytest.mark.parametrize("handler", [False, True])
def test_a_step_starts_when_its_first_task_starts(handler: bool) -> None:
    cb, display = callback()
    cb._clock = iter([10.0, 20.0, 50.0, 90.0]).__next__
    cb.v2_playbook_on_play_start(PLAY)
    task = Task("Restart", role="d3_units")
    (cb.v2_playbook_on_handler_task_start(task) if handler else cb.v2_playbook_on_task_start(task, False))
    cb.v2_runner_on_ok(result("h", task))
    cb.v2_playbook_on_no_hosts_remaining()
    assert display.text()[1:] == [phase_line("h", "d3_units", {"ok": 1}, 10.0, (1, 16)), "no hosts left: the play stops"]
    assert display.lines[-1][1] == fleet.C.COLOR_ERROR


def test_before_any_play_the_real_clock_and_an_unreachable_only_step() -> None:
    cb = CallbackModule()
    display = Display()
    cb._display = display
    task = Task("x")
    cb.v2_playbook_on_task_start(task, False)
    cb.v2_runner_on_ok(result("h", task))
    cb.v2_playbook_on_stats(Obj(processed={}, summarize=dict))
    assert display.text() == [phase_line("h", "play tasks", {"ok": 1}, 0.0, (1, 16)), "RECAP"]
    cb, display = callback()
    cb.v2_playbook_on_play_start(PLAY)
    cb.v2_runner_on_unreachable(result("h", Obj(ignore_unreachable=True, _role=None)))
    cb.v2_playbook_on_stats(Obj(processed={}, summarize=dict))
    assert display.lines[1] == (phase_line("h", "play tasks", {"unreachable": 1}, 1.5, (1, 16)), fleet.C.COLOR_ERROR, False)


# ---- issue 35: one problem per line, grouped by host; each host's block under its name -------------------------
def test_a_list_of_problems_prints_one_problem_a_line_under_its_host() -> None:
    cb, display = callback()
    cb.v2_playbook_on_play_start(PLAY)
    plan = Task("Refuse a plan that cannot work", action="ansible.builtin.assert")
    cb.v2_playbook_on_task_start(plan, False)
    problems = ["host h1: d3_models[0]: unknown model 'd3-mnii' (did you mean 'd3-mini'?). Fix: set d3_models[0].model",
                "host h1: d3_models[1]: port  8100\ncollides. Fix: give each instance its own port",
                "plan so far (nothing is changed until every problem is fixed):", ""]  # fmt: skip
    cb.v2_runner_on_failed(result("h1", plan, msg=problems))
    cb.v2_runner_on_failed(result("h2", plan, msg=["host h2: one problem. Fix: x"]))
    assert display.text()[1:] == [
        "FAILED h1 [play tasks] Refuse a plan that cannot work:",
        "  host h1: d3_models[0]: unknown model 'd3-mnii' (did you mean 'd3-mini'?). Fix: set d3_models[0].model",
        "  host h1: d3_models[1]: port 8100",
        "  collides. Fix: give each instance its own port",
        "  plan so far (nothing is changed until every problem is fixed):",
        "FAILED h2 [play tasks] Refuse a plan that cannot work: host h2: one problem. Fix: x",
    ]
    assert {c for line, c, _ in display.lines[1:]} == {fleet.C.COLOR_ERROR}


def test_failure_lines() -> None:
    assert fleet.failure_lines({"msg": ["a", "b  c"]}) == ["a", "b c"]
    assert fleet.failure_lines({"msg": ("a", "b")}) == ["a", "b"]
    assert fleet.failure_lines({"msg": ["only"]}) == ["only"]
    assert fleet.failure_lines({"msg": "one\ntwo"}) == ["one two"]
    loop = {"msg": ["x", "y"], "results": [{"failed": True, "msg": "m", "item": "i"}]}
    assert fleet.failure_lines(loop) == ["i: m"]


def test_a_host_s_own_block_is_labelled_and_the_same_block_from_another_host_says_so() -> None:
    cb, display = callback()
    cb.v2_playbook_on_play_start(PLAY)
    show = Task("Show the plan", role="d3_units", action="ansible.builtin.debug")
    cb.v2_playbook_on_task_start(show, False)
    for h in ("l4-a", "l4-b", "l4-c"):
        cb.v2_runner_on_start(Host(h), show)
    block = ["d3-mini: d3-mini on GPU 0, port 8000", "GPU 0 NVIDIA L4: 10365/23034 MiB budgeted"]
    cb.v2_runner_on_ok(result("l4-a", show, msg=block))
    cb.v2_runner_on_ok(result("l4-b", show, msg=block))
    cb.v2_runner_on_ok(result("l4-c", show, msg=["d3-edge: d3-edge on GPU 0, port 8000"]))
    fleet_table = ["host  model", "l4-a  d3-mini", "l4-b  d3-mini"]  # names its hosts: printed once, unlabelled
    cb.v2_runner_on_ok(result("l4-a", show, msg=fleet_table))
    cb.v2_runner_on_ok(result("l4-b", show, msg=fleet_table))
    once = Task("Summary", action="ansible.builtin.debug", run_once=True)
    cb.v2_playbook_on_task_start(once, False)
    cb.v2_runner_on_ok(result("l4-a", once, msg=["fleet: 3 host(s)"]))
    assert display.text()[1:] == ["l4-a:", *block, "l4-b: the same as l4-a", "l4-c:", "d3-edge: d3-edge on GPU 0, port 8000",
                                  *fleet_table, "fleet: 3 host(s)"]  # fmt: skip


def test_names_a_host() -> None:
    assert fleet.names_a_host("l4-a  d3-mini", ["l4-a", "l4-b"])
    assert not fleet.names_a_host("l4-ab d3-mini", ["l4-a"])
    assert not fleet.names_a_host("health", ["h"])
    assert fleet.names_a_host("host h: x", ["h"])
