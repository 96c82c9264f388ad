"""One HTTP request to a D3 instance, timed (shared by the decision and smoke modules). Standard library only: it runs
on the host, in the module's Python."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any


def send(url: str, method: str = "POST", body: Any = None, api_key: str | None = None, timeout: float = 120) -> dict:
    """{status, json, content, elapsed_ms}: the HTTP status (an error status is returned, not raised; -1 when no
    connection could be made, with the error as content and elapsed_ms None), the parsed JSON answer (None when
    empty or not JSON), its first 2000 characters, and the time from sending to reading the whole answer (ms,
    monotonic clock)."""
    data = json.dumps(body).encode() if method == "POST" else None
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    start = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
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
