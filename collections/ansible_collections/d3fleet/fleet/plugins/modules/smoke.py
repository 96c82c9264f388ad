#!/usr/bin/python
"""Ansible module: wait until a host's D3 instances serve, all at once, then send each the smoke requests."""

from __future__ import annotations

DOCUMENTATION = r"""
module: smoke
version_added: 0.3.0
short_description: Wait until every D3 instance of a host serves, then send each the same requests, in one call
description:
  - Waits for all I(instances) at once (not one after the other); an instance is ready when its systemd unit is
    active with no job queued (a restart that is only queued is not mistaken for readiness, the old process may still
    answer) and its I(health_url) answers 200. Each instance's readiness is seen within I(poll_s) of the moment it
    serves, whatever the others do; the moment is returned on the wall clock and on CLOCK_MONOTONIC (systemd's clock
    for C(*TimestampMonotonic)).
  - Then sends every ready instance the I(requests), in order, each timed with a monotonic clock (milliseconds).
    Each POST body gets the instance's served model name as C(model).
  - One remote call for the whole smoke test of a host (the d3_smoke role checks the answers on the controller).
    Never changes anything (C(changed=false)); the API key is a no_log parameter. An HTTP error status is returned,
    not failed on; a connection that cannot be made is RV(answers) status -1.
options:
  instances:
    description: The host's planned instances.
    type: list
    elements: dict
    required: true
    suboptions:
      unit:
        description: systemd unit name without C(.service).
        type: str
        required: true
      health_url:
        description: The instance's /health URL.
        type: str
        required: true
      url:
        description: The instance's base URL (requests' paths are appended).
        type: str
        required: true
      served_model_name:
        description: The model name the instance serves (put into each POST body as C(model)).
        type: str
        required: true
  requests:
    description: The requests to send to every ready instance, in order.
    type: list
    elements: dict
    default: []
    suboptions:
      id:
        description: The request's name in RV(answers).
        type: str
        required: true
      path:
        description: Path appended to the instance's url, e.g. C(/v1/systemone).
        type: str
        required: true
      method:
        description: HTTP method.
        type: str
        default: POST
        choices: [GET, POST]
      body:
        description: JSON body of a POST (C(model) is set to the instance's served name).
        type: dict
      auth:
        description: Send the API key (when one is given); V(false) sends the request without it.
        type: bool
        default: true
      timeout:
        description: Seconds before giving up on this request.
        type: int
        default: 120
  api_key:
    description: "Bearer token for vLLM's --api-key / VLLM_API_KEY, sent as C(Authorization: Bearer ...)."
    type: str
  timeout_s:
    description: Seconds to wait, in all, until every instance is ready.
    type: float
    default: 600
  poll_s:
    description: Seconds between two rounds of checks.
    type: float
    default: 0.5
author: d3-fleet
"""

EXAMPLES = r"""
- name: Wait until every instance serves, then ask each one decision
  d3fleet.fleet.smoke:
    instances: "{{ d3_host_plan.instances }}"
    timeout_s: 600
    requests:
      - {id: models, method: GET, path: /v1/models}
      - id: decision
        path: /v1/systemone
        body: {state: {ticket: My card was charged twice.}, questions: "{{ d3_smoke_questions }}"}
    api_key: "{{ d3_units_api_key | default(omit, true) }}"
  register: smoke

- name: Fail unless every instance is ready
  ansible.builtin.assert:
    that: smoke.waiting | length == 0
"""

RETURN = r"""
ready:
  description: Per unit that became ready, the wall-clock time (epoch seconds) when it was first seen ready.
  type: dict
  returned: always
ready_monotonic:
  description: The same moments on CLOCK_MONOTONIC.
  type: dict
  returned: always
waiting:
  description: Per unit not ready when I(timeout_s) passed, what was last seen (empty when all are ready).
  type: dict
  returned: always
answers:
  description: >-
    Per ready unit, per request id: {status, json, content, elapsed_ms}, as the decision module returns them
    (status -1 when no connection could be made). Units that were not ready have no entry. (Not named C(results),
    a key Ansible keeps for loops.)
  type: dict
  returned: always
"""

import subprocess
import time
import urllib.error
import urllib.request

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.d3fleet.fleet.plugins.module_utils.d3_http import send


def unit_state(unit: str) -> tuple[str, str, str]:
    """(ActiveState, Job, note): the note names what an operator reads first when a unit never gets ready, e.g.
    "auto-restart, 12 restarts" for an instance that keeps crashing (older systemctl leaves unknown ones out)."""
    out = subprocess.run(
        ["systemctl", "show", "--property=ActiveState,SubState,NRestarts,Job", f"{unit}.service"],
        capture_output=True, text=True, check=False,
    ).stdout  # fmt: skip
    props = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    state = props.get("ActiveState", "?")
    notes = [props["SubState"]] if props.get("SubState") and props["SubState"] not in (state, "running", "dead") else []
    restarts = props.get("NRestarts", "")
    if restarts.isdigit() and int(restarts) > 0:
        notes.append(f"{restarts} restart" + ("s" if int(restarts) > 1 else ""))
    return state, props.get("Job", ""), ", ".join(notes)


def health(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return str(answer.status)
    except urllib.error.HTTPError as err:
        return str(err.code)
    except (urllib.error.URLError, OSError) as err:
        return type(getattr(err, "reason", err)).__name__


def wait(targets: dict[str, str], timeout: float, poll: float) -> dict:
    deadline = time.monotonic() + timeout
    ready: dict[str, float] = {}
    ready_monotonic: dict[str, float] = {}
    waiting: dict[str, str] = {unit: "not polled yet" for unit in targets}
    while True:
        for unit, url in targets.items():
            if unit in ready:
                continue
            state, job, note = unit_state(unit)
            if state != "active" or job:
                detail = "; ".join(x for x in (note, "job queued" if job else "") if x)
                waiting[unit] = f"unit {state}" + (f" ({detail})" if detail else "")
                continue
            status = health(url)
            if status == "200":
                ready[unit], ready_monotonic[unit] = time.time(), time.monotonic()
                waiting.pop(unit, None)
            else:
                waiting[unit] = f"unit active, {url} answered {status}"
        if not waiting or time.monotonic() >= deadline:
            break
        time.sleep(poll)
    return {"ready": ready, "ready_monotonic": ready_monotonic, "waiting": waiting}


def ask(instance: dict, requests: list[dict], api_key: str | None) -> dict:
    out = {}
    for req in requests:
        body = dict(req.get("body") or {}, model=instance["served_model_name"]) if req["method"] == "POST" else None
        key = api_key if req["auth"] else None
        out[req["id"]] = send(instance["url"] + req["path"], req["method"], body, key, req["timeout"])
    return out


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "instances": {
                "type": "list",
                "elements": "dict",
                "required": True,
                "options": {
                    "unit": {"type": "str", "required": True},
                    "health_url": {"type": "str", "required": True},
                    "url": {"type": "str", "required": True},
                    "served_model_name": {"type": "str", "required": True},
                },
            },
            "requests": {
                "type": "list",
                "elements": "dict",
                "default": [],
                "options": {
                    "id": {"type": "str", "required": True},
                    "path": {"type": "str", "required": True},
                    "method": {"type": "str", "default": "POST", "choices": ["GET", "POST"]},
                    "body": {"type": "dict"},
                    "auth": {"type": "bool", "default": True},
                    "timeout": {"type": "int", "default": 120},
                },
            },
            "api_key": {"type": "str", "no_log": True},
            "timeout_s": {"type": "float", "default": 600},
            "poll_s": {"type": "float", "default": 0.5},
        },
        supports_check_mode=True,
    )
    p = module.params
    ids = [req["id"] for req in p["requests"]]
    if len(set(ids)) != len(ids):
        module.fail_json(msg=f"request ids must be unique: {ids}")
    seen = wait({i["unit"]: i["health_url"] for i in p["instances"]}, p["timeout_s"], p["poll_s"])
    answers = {i["unit"]: ask(i, p["requests"], p["api_key"]) for i in p["instances"] if i["unit"] in seen["ready"]}
    module.exit_json(changed=False, answers=answers, **seen)


if __name__ == "__main__":
    main()
