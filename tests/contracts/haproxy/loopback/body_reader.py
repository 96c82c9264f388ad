"""The Lua body reader (roles/d3_router/files/d3-router.lua) inside Debian's HAProxy 2.6 (Lua 5.3) and 3.0 (Lua 5.4):
each body's verdict and model as HAProxy sets them (txn.d3_body, txn.d3_model, sent back as response headers), next
to what Python's json.loads(bytes) (vLLM's reading) concludes. Writes the results as
tests/contracts/haproxy/body-encodings.json's "captures". Usage: python3 body_reader.py LUA_FILE."""

from __future__ import annotations

import http.client
import json
import sys

from common import BINS, D, start, stop

LUA = sys.argv[1]
CFG, PIDFILE = D / "body.cfg", D / "body.pid"
CONFIG = f"""global
    lua-load {LUA}
    tune.bufsize 295936
defaults
    mode http
    timeout connect 2s
    timeout client 10s
    timeout server 10s
frontend fe_fleet
    bind 127.0.0.1:31280 proto h1
    option http-buffer-request
    http-request lua.d3_read_model
    http-request return status 200 hdr x-d3-body %[var(txn.d3_body)] hdr x-d3-model %[var(txn.d3_model),hex]
"""
BODIES = {
    "DEL in a string value": b'{"model": "d3-lite", "note": "a\x7fb"}',
    "DEL in the model": b'{"model": "d3-\x7flite"}',
    "UTF-8 byte-order mark": b'\xef\xbb\xbf{"model": "d3-lite"}',
    "two UTF-8 byte-order marks": b'\xef\xbb\xbf\xef\xbb\xbf{"model": "d3-lite"}',
    "UTF-16 with its mark": '{"model": "d3-lite"}'.encode("utf-16"),
    "UTF-16-BE without a mark": '{"model": "d3-lite"}'.encode("utf-16-be"),
    "UTF-32 with its mark": '{"model": "d3-lite"}'.encode("utf-32"),
    "UTF-16 with a duplicate model": '{"model": "d3-lite", "model": "x"}'.encode("utf-16"),
    "UTF-16 truncated": '{"model": "d3-lite"}'.encode("utf-16")[:-1],
    "escaped surrogate pair": b'{"model": "d3-\\ud83d\\ude00"}',
    "not UTF-8": b'{"model": "d3-lite", "s": "\xff"}',
    "escaped duplicate": b'{"model": "d3-lite", "mod\\u0065l": "d3-27b"}',
    "plain": b'{"model": "d3-lite"}',
}


def python_reads(body: bytes) -> list[str | None]:
    pairs: list[list[tuple[str, object]]] = []
    try:
        value = json.loads(body, object_pairs_hook=lambda items: pairs.append(items) or dict(items))
    except ValueError:
        return ["not_json", None]
    if not isinstance(value, dict):
        return ["not_json", None]
    top = [v for k, v in pairs[-1] if k == "model"]
    if not top:
        return ["no_model", None]
    if len(top) > 1:
        return ["duplicate_model", None]
    return ["ok", top[0].encode("utf-8", "surrogatepass").hex()] if isinstance(top[0], str) else ["model_not_string", None]


def main() -> None:
    CFG.write_text(CONFIG)
    out: dict[str, object] = {"python": {case: python_reads(body) for case, body in BODIES.items()}}
    for version, binary in BINS.items():
        start(binary, CFG, PIDFILE)
        got = {}
        for case, body in BODIES.items():
            conn = http.client.HTTPConnection("127.0.0.1", 31280, timeout=5)
            conn.request("POST", "/v1/systemone", body=body, headers={"Content-Type": "application/json"})
            answer = conn.getresponse()
            answer.read()
            got[case] = [answer.getheader("x-d3-body"), answer.getheader("x-d3-model") or None]
            conn.close()
        stop(PIDFILE)
        out[version] = got
    (D / "body-results.json").write_text(json.dumps(out, indent=1))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
