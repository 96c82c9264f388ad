"""One HTTP request to a D3 instance, timed (shared by the decision and smoke modules). Standard library only: it runs
on the host, in the module's Python."""

from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.request
from typing import Any


def send(url: str, method: str = "POST", body: Any = None, api_key: str | None = None, timeout: float = 120,
         validate_certs: bool = True) -> dict:
    """{status, json, content, elapsed_ms}: the HTTP status (an error status is returned, not raised; -1 when no
    connection could be made, with the error as content and elapsed_ms None), the parsed JSON answer (None when
    empty or not JSON), its first 2000 characters, and the time from sending to reading the whole answer (ms,
    monotonic clock). An https URL's certificate is checked against the system's CAs and the URL's host name unless
    ``validate_certs`` is false (a router asking itself over loopback: its certificate names the router, not
    127.0.0.1)."""
    data = json.dumps(body).encode() if method == "POST" else None
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    start = time.perf_counter()
    try:
        context = None if validate_certs else ssl._create_unverified_context()  # a loopback self-check only
        with urllib.request.urlopen(request, timeout=timeout, context=context) as answer:
            status, raw = answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    except (urllib.error.URLError, OSError) as exc:
        return {"status": -1, "content": str(exc), "json": None, "elapsed_ms": None}
    elapsed_ms = round((time.perf_counter() - start) * 1000, 1)
    text = raw.decode("utf-8", "replace")
    try:
        parsed = json.loads(text) if text else None
    except ValueError:
        parsed = None
    return {"status": status, "json": parsed, "content": text[:2000], "elapsed_ms": elapsed_ms}
