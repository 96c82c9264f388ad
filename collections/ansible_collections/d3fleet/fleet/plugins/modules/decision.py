#!/usr/bin/python
"""Ansible module: send one structured-decision request to a D3 instance and time it."""

from __future__ import annotations

DOCUMENTATION = r"""
module: decision
version_added: 0.1.0
short_description: Send a /v1/systemone (or /health, /v1/models) request to a vLLM D3 instance and time it
description:
  - Uses the Python standard library on the host; measures the request with a monotonic clock in milliseconds
    (the uri module reports whole seconds).
  - Never changes anything (it always reports C(changed=false)) and sends its request in check mode too; the API key
    is a no_log parameter.
  - An HTTP error status is returned, not failed on; a connection that cannot be made returns RV(status=-1).
options:
  url:
    description: Full URL, e.g. http://127.0.0.1:8000/v1/systemone.
    type: str
    required: true
  method:
    description: HTTP method.
    type: str
    default: POST
    choices: [GET, POST]
  body:
    description: JSON body for POST (serialized with C(json.dumps); ignored for GET).
    type: raw
  api_key:
    description: "Bearer token for vLLM's --api-key / VLLM_API_KEY, sent as C(Authorization: Bearer ...)."
    type: str
  timeout:
    description: Seconds before giving up.
    type: int
    default: 120
  validate_certs:
    description:
      - Check an https URL's certificate (system CAs, the URL's host name). Off only for a server asking itself over
        loopback (the d3_router role's own check of its TLS frontends, whose certificate names the router).
    type: bool
    default: true
author: d3-fleet
"""

EXAMPLES = r"""
- name: Ask one choice, one noul and one score question
  d3fleet.fleet.decision:
    url: "http://127.0.0.1:8000/v1/systemone"
    body:
      model: d3-mini
      state: {ticket: My card was charged twice for one order.}
      questions: "{{ d3_smoke_questions }}"
    api_key: "{{ d3_units_api_key | default(omit, true) }}"
  register: answer

- name: Fail unless it answered 200 with a well-formed decision
  ansible.builtin.assert:
    that:
      - answer.status == 200
      - answer.json | d3fleet.fleet.d3_decision_problems(d3_smoke_questions) | length == 0

- name: Ask for /health without waiting long
  d3fleet.fleet.decision:
    url: "http://127.0.0.1:8000/health"
    method: GET
    timeout: 5
  register: health
"""

RETURN = r"""
status:
  description: HTTP status (-1 when the connection failed).
  type: int
  returned: always
json:
  description: The parsed JSON answer; null when the answer is empty or not JSON, or the connection failed.
  type: raw
  returned: always
content:
  description: The answer's text (first 2000 characters), or the connection error's message.
  type: str
  returned: always
elapsed_ms:
  description: Time from sending the request to reading the whole answer, in milliseconds; null when the connection failed.
  type: float
  returned: always
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.d3fleet.fleet.plugins.module_utils.d3_http import send


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "url": {"type": "str", "required": True},
            "method": {"type": "str", "default": "POST", "choices": ["GET", "POST"]},
            "body": {"type": "raw"},
            "api_key": {"type": "str", "no_log": True},
            "timeout": {"type": "int", "default": 120},
            "validate_certs": {"type": "bool", "default": True},
        },
        supports_check_mode=True,
    )
    p = module.params
    module.exit_json(changed=False, **send(p["url"], p["method"], p["body"], p["api_key"], p["timeout"], p["validate_certs"]))


if __name__ == "__main__":
    main()
