#!/usr/bin/python
"""Ansible module: send one structured-decision request to a D3 instance and time it."""

from __future__ import annotations

DOCUMENTATION = r"""
module: decision
short_description: Send a /v1/systemone (or /health, /v1/models) request to a vLLM D3 instance and time it
description:
  - Uses the Python standard library on the host; measures the request with a monotonic clock in milliseconds
    (the uri module reports whole seconds).
  - Never changes anything; the API key is a no_log parameter.
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
    description: JSON body for POST.
    type: raw
  api_key:
    description: Bearer token for vLLM's --api-key / VLLM_API_KEY.
    type: str
  timeout:
    description: Seconds before giving up.
    type: int
    default: 120
author: d3-fleet
"""

RETURN = r"""
status:
  description: HTTP status (-1 when the connection failed).
  type: int
json:
  description: The parsed JSON answer, when there is one.
  type: raw
content:
  description: The answer's text (first 2000 characters).
  type: str
elapsed_ms:
  description: Time from sending the request to reading the whole answer, in milliseconds.
  type: float
"""

import json
import time
import urllib.error
import urllib.request

from ansible.module_utils.basic import AnsibleModule


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "url": {"type": "str", "required": True},
            "method": {"type": "str", "default": "POST", "choices": ["GET", "POST"]},
            "body": {"type": "raw"},
            "api_key": {"type": "str", "no_log": True},
            "timeout": {"type": "int", "default": 120},
        },
        supports_check_mode=True,
    )
    p = module.params
    data = json.dumps(p["body"]).encode() if p["method"] == "POST" else None
    request = urllib.request.Request(p["url"], data=data, method=p["method"])
    request.add_header("Content-Type", "application/json")
    if p["api_key"]:
        request.add_header("Authorization", f"Bearer {p['api_key']}")
    start = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=p["timeout"]) as answer:
            status, raw = answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    except (urllib.error.URLError, OSError) as exc:
        module.exit_json(changed=False, status=-1, content=str(exc), json=None, elapsed_ms=None)
    elapsed_ms = round((time.perf_counter() - start) * 1000, 1)
    text = raw.decode("utf-8", "replace")
    try:
        parsed = json.loads(text) if text else None
    except ValueError:
        parsed = None
    module.exit_json(changed=False, status=status, json=parsed, content=text[:2000], elapsed_ms=elapsed_ms)


if __name__ == "__main__":
    main()
