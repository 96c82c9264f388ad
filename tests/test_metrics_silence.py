"""The planned-restart silences (role d3_metrics, tasks_from silence.yml, as rollout.yml and site.yml include it): one
run of the task file against a fake Alertmanager speaking API v2 (tests/contracts/alertmanager/api-v2-silences.yml)
posts the filter's silences for the restarted hosts' models, with the run's identity, and at its end makes exactly
those end a settle time later (posted again with their id, as Alertmanager updates a silence in place), naming the
alerts only they keep quiet; an Alertmanager that does not answer is a warning, not a failure."""

from __future__ import annotations

import json
import re
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml
from local_http import QuietHandler, serve
from testkit import ansible_playbook

pytestmark = pytest.mark.playbook  # ansible-playbook on localhost aliases

ROOT = Path(__file__).resolve().parents[1]
API = yaml.safe_load((ROOT / "tests/contracts/alertmanager/api-v2-silences.yml").read_text())


class FakeAlertmanager(QuietHandler):
    """POST /api/v2/silences stores a silence (answers {silenceID}), or updates the one whose id it carries as
    Alertmanager 0.25 does (the contract's update rules: matchers and startsAt kept, endsAt not in the past); GET
    lists them with their state; DELETE /api/v2/silence/ID expires one; GET /api/v2/alerts answers ``alerts``, each
    silenced by the silences whose first matcher's value names its alertname. One other operator's silence is there
    from the start."""

    silences: ClassVar[dict[str, dict[str, Any]]] = {}
    calls: ClassVar[list[tuple[str, str]]] = []
    alerts: ClassVar[list[dict[str, Any]]] = []
    open_before: ClassVar[list[dict[str, Any]]] = []

    def answer(self, body: bytes) -> tuple[int, bytes]:
        self.calls.append((self.command, self.path))
        if self.command == "POST" and self.path == API["post"]:
            silence = json.loads(body)
            assert set(API["silence_required"]) <= set(silence), silence
            sid = silence.get(API["update_by"])
            if sid is not None:
                before = self.silences[sid]
                assert all(silence[k] == before[k] for k in API["update_keeps"]), (silence, before)
                assert silence["endsAt"] > time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()), silence
                self.silences[sid] = {**before, "endsAt": silence["endsAt"], "updates": before.get("updates", 0) + 1}
                return 200, json.dumps({API["post_answer"]: sid}).encode()
            sid = str(uuid.uuid4())
            self.silences[sid] = {**silence, "id": sid, "status": {"state": "active"}}
            return 200, json.dumps({API["post_answer"]: sid}).encode()
        if self.command == "GET" and self.path == API["list"]:
            return 200, json.dumps(list(self.silences.values())).encode()
        if self.command == "GET" and self.path == API["alerts"]:
            answer = []
            restarting = any(s.get("createdBy") == "d3-fleet" for s in self.silences.values())
            for labels in self.open_before + (self.alerts if restarting else []):  # the restarts' alerts come after the start
                by = [i for i, s in self.silences.items() if s["status"]["state"] == "active" and s.get("matchers")
                      and all(re.fullmatch(m["value"], labels.get(m["name"], "")) for m in s["matchers"])]  # fmt: skip
                answer.append({"labels": labels, "startsAt": "2026-12-05T05:50:00.000Z",
                               "status": {"state": "suppressed" if by else "active", "silencedBy": by, "inhibitedBy": []}})  # fmt: skip
            return 200, json.dumps(answer).encode()
        if self.command == "DELETE" and self.path.startswith("/api/v2/silence/"):
            sid = self.path.rsplit("/", 1)[1]
            if sid not in self.silences:
                return 404, b""
            self.silences[sid]["status"] = {"state": "expired"}
            return 200, b""
        return 404, b""

    def _handle(self) -> None:  # Alertmanager answers JSON as application/json (uri parses it into `json` then)
        length = int(self.headers.get("Content-Length") or 0)
        status, raw = self.answer(self.rfile.read(length) if length else b"")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    do_GET = do_POST = do_DELETE = _handle


PLAY = """
- name: Restart two hosts (a stand-in for rollout.yml's plays)
  hosts: l4-a:l4-b
  gather_facts: false
  tasks:
    - name: Plan
      ansible.builtin.set_fact:
        d3_host_plan: {instances: "{{ models | map('community.general.dict_kv', 'served_model_name') | list }}"}
    - name: Silence what the restarts trip
      ansible.builtin.include_role: {name: d3_metrics, tasks_from: silence.yml}
      vars: {d3_metrics_silence: start}
      run_once: true
    - name: Every host knows the run's identity (the end include may run on another host)
      ansible.builtin.assert:
        that: d3_metrics_silence_identity == hostvars['l4-a'].d3_metrics_silence_identity
    - name: Remove them
      ansible.builtin.include_role: {name: d3_metrics, tasks_from: silence.yml}
      vars: {d3_metrics_silence: end}
      run_once: true
"""


def run(tmp_path: Path, listen: str | None, **env: str) -> Any:
    """``listen`` None: the monitor sets no d3_metrics_alertmanager_listen_address (the role default, as the lab's)."""
    hosts = {"l4-a": {"models": ["d3-flash", "d3-mini"]}, "l4-b": {"models": ["d3-flash"]}}
    monitor = {} if listen is None else {"d3_metrics_alertmanager_listen_address": listen}
    inventory = {"all": {"vars": {"ansible_connection": "local", "ansible_python_interpreter": "{{ ansible_playbook_python }}"},
                         "children": {"l4-nodes": {"hosts": hosts}, "d3-monitors": {"hosts": {"mon": monitor}}}}}  # fmt: skip
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    (tmp_path / "play.yml").write_text(PLAY)
    return ansible_playbook(str(tmp_path / "play.yml"), "-i", str(tmp_path / "hosts.yml"), timeout=300,
                            ANSIBLE_ROLES_PATH=str(ROOT / "roles"), ANSIBLE_STDOUT_CALLBACK="ansible.builtin.default", **env)  # fmt: skip


def test_a_run_posts_its_silences_and_ends_only_them_a_settle_time_later(tmp_path: Path) -> None:
    FakeAlertmanager.silences.clear()
    FakeAlertmanager.calls.clear()
    FakeAlertmanager.alerts[:] = [{"alertname": "D3ModelReplicasMissing", "model": "d3-flash", "router": "r1"}]
    FakeAlertmanager.open_before[:] = []
    FakeAlertmanager.silences["other"] = {"id": "other", "createdBy": "alice", "comment": "disk swap", "matchers": [],
                                          "status": {"state": "active"}}  # fmt: skip
    with serve(FakeAlertmanager) as url:
        began = time.time()
        proc = run(tmp_path, url.removeprefix("http://"))
        finished = time.time()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    ours = {k: v for k, v in FakeAlertmanager.silences.items() if k != "other"}
    assert len(ours) == 5
    matchers = sorted(tuple((m["name"], m["value"]) for m in s["matchers"]) for s in ours.values())
    assert matchers == [(("alertname", "D3InstanceDigestDrift"), ("host", "l4-a|l4-b"))] + [
        (("alertname", name), ("model", "d3-flash|d3-mini"))
        for name in sorted(("D3ModelReplicasMissing", "D3RouterQueue", "D3RequestsWaiting", "D3RouterErrors"))]
    comments = {s["comment"] for s in ours.values()}
    assert len(comments) == 1 and next(iter(comments)).startswith("Restart two hosts (a stand-in for rollout.ymls plays) by ")
    # each updated once, in place: ending twice the role default's scrape and evaluation intervals (15 s each) later
    assert all(s["createdBy"] == "d3-fleet" and s["status"]["state"] == "active" and s["updates"] == 1 for s in ours.values())
    # the error ratio's silence the ratio's 5 min window later
    for silence in ours.values():
        end = datetime.fromisoformat(silence["endsAt"]).timestamp()
        settle = 60 + (300 if silence["matchers"][0]["value"] == "D3RouterErrors" else 0)
        assert began + settle - 1 <= end <= finished + settle, (silence, began, finished)
    assert "updates" not in FakeAlertmanager.silences["other"]  # an operator's silence stays as it was
    assert [c for c, _ in FakeAlertmanager.calls] == ["GET"] + ["POST"] * 5 + ["GET", "GET"] + ["POST"] * 5
    said = " ".join(proc.stdout.replace("'", "").split())
    assert ("Still firing under this runs silences at its end, which end 60 s from now: mon: "
            "D3ModelReplicasMissing{model=d3-flash,router=r1} since 2026-12-05T05:50:00.000Z.") in said, said[-3000:]
    assert "WARNING" not in proc.stdout


def test_an_incident_open_before_the_run_is_not_silenced_in_a_run_without_a_user_name(tmp_path: Path) -> None:
    """d3-mini's queue alert, notified and open before the run: that alert of d3-mini is left out of the silences (a
    silence would hold back its resolution for good), its other alerts are not, and the run says so. The run has USER
    empty (a container, a CI job): the comment names no user rather than an empty one ("by  at", the lab's rollout
    under load showed it)."""
    FakeAlertmanager.silences.clear()
    FakeAlertmanager.calls.clear()
    FakeAlertmanager.alerts[:] = []
    FakeAlertmanager.open_before[:] = [{"alertname": "D3RequestsWaiting", "model": "d3-mini", "host": "l4-a"}]
    with serve(FakeAlertmanager) as url:
        proc = run(tmp_path, url.removeprefix("http://"), USER="")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    models = {s["matchers"][0]["value"]: s["matchers"][1]["value"] for s in FakeAlertmanager.silences.values()
              if s["matchers"][1]["name"] == "model"}  # fmt: skip
    assert models == {"D3RequestsWaiting": "d3-flash", "D3ModelReplicasMissing": "d3-flash|d3-mini", "D3RouterQueue": "d3-flash|d3-mini",
                      "D3RouterErrors": "d3-flash|d3-mini"}, FakeAlertmanager.silences  # fmt: skip
    said = " ".join(proc.stdout.replace("'", "").split())
    assert ("Not silenced, each already open in Alertmanager: D3RequestsWaiting of d3-mini. This runs restarts may page them; "
            "the open incidents resolutions still reach you.") in said, said[-3000:]
    comments = {s["comment"] for s in FakeAlertmanager.silences.values()}
    assert comments and all(" by an unnamed user at 20" in c for c in comments), comments


def test_a_monitor_on_the_role_default_address_that_does_not_answer_is_a_warning(tmp_path: Path) -> None:
    """A monitor without its own d3_metrics_alertmanager_listen_address (the lab's, and any inventory that keeps the
    default) is reached at the role default, 127.0.0.1:9093: the run posts there, it does not fail looking the variable
    up in hostvars (the lab's session converge did, 2026-12-05). Nothing listens there: an Alertmanager that does not
    answer is a warning at the start and at the end, not a failure."""
    proc = run(tmp_path, None)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    said = " ".join(proc.stdout.replace("'", "").split())  # the callback wraps and quotes long messages
    assert "WARNING: a monitors Alertmanager did not list its open alerts or take this runs silences" in said, said[-3000:]
    assert "WARNING: a monitors Alertmanager did not list or end this runs silences" in said, said[-3000:]
