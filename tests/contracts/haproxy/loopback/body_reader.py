"""The Lua body reader (roles/d3_router/files/d3-router.lua) inside Debian's HAProxy 2.6 (Lua 5.3) and 3.0 (Lua 5.4):
each body's verdict and model as HAProxy sets them (txn.d3_body, txn.d3_model, sent back as response headers), next
to what Python's json.loads(bytes) (vLLM's reading) concludes. Writes the results to $RFIX_DIR/body-results.json and,
given a SECTION, into tests/contracts/haproxy/body-encodings.json: each body's bytes and Python's verdict, and the
captures under SECTION (after, before, before_2026_12_05). Usage: [PORT=N] python3 body_reader.py LUA_FILE [SECTION]
(PORT: the frontend's, 31280 unless given)."""

from __future__ import annotations

import http.client
import json
import os
import sys
from pathlib import Path

from common import BINS, D, start, stop

LUA = sys.argv[1]
SECTION = sys.argv[2] if len(sys.argv) > 2 else None
PORT = int(os.environ.get("PORT", "31280"))
CONTRACT = Path(__file__).resolve().parents[1] / "body-encodings.json"
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
    bind 127.0.0.1:{PORT} proto h1
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
    # the review of 2026-12-05: the values inside the top-level object, as Python's json reads them
    "a missing comma in an array": b'{"model": "d3-lite", "x": [1 2]}',
    "a lone minus": b'{"model": "d3-lite", "x": -}',
    "true misspelt": b'{"model": "d3-lite", "x": tru}',
    "a leading zero": b'{"model": "d3-lite", "x": 01}',
    "a trailing comma in a nested object": b'{"model": "d3-lite", "x": {"a": 1,}}',
    "a missing colon in a nested object": b'{"model": "d3-lite", "x": {"a" 1}}',
    "a point without digits": b'{"model": "d3-lite", "x": 1.}',
    "an exponent without digits": b'{"model": "d3-lite", "x": 1e}',
    "a minus before NaN": b'{"model": "d3-lite", "x": -NaN}',
    "a vertical tab as whitespace": b'{"model": "d3-lite", "x": [1\x0b]}',
    "an integer of 4301 digits": b'{"model": "d3-lite", "x": ' + b"1" * 4301 + b"}",
    "the model a number with a leading zero": b'{"model": 01}',
    "2,000 levels of arrays": b'{"model": "d3-lite", "x": ' + b"[" * 2000 + b"]" * 2000 + b"}",
    "2,000 levels of objects": b'{"model": "d3-lite", "x": ' + b'{"a":' * 2000 + b"1" + b"}" * 2000 + b"}",
    "NaN, Infinity and -Infinity": b'{"model": "d3-lite", "x": [NaN, Infinity, -Infinity]}',
    "numbers of every form": b'{"model": "d3-lite", "x": [0, -0, 10, -1.5, 0.25e-3, 1E+2, 6e0, -0.0E-0]}',
    "an integer of 4300 digits": b'{"model": "d3-lite", "x": ' + b"1" * 4300 + b"}",
    "a float of 4301 digits": b'{"model": "d3-lite", "x": ' + b"1" * 4301 + b".5}",
    "nested values with whitespace": b'{"model": "d3-lite",\r\n "x": {\t"a" :[ 1 , {"b":null} ,true,false, "s" ] , "c":{ }}}',
    "512 levels (the reader's limit)": b'{"model": "d3-lite", "x": ' + b"[" * 511 + b"1" + b"]" * 511 + b"}",
}


def python_reads(body: bytes) -> list[str | None]:
    pairs: list[list[tuple[str, object]]] = []
    try:
        value = json.loads(body, object_pairs_hook=lambda items: pairs.append(items) or dict(items))
    except (ValueError, RecursionError):
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
            conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=5)
            conn.request("POST", "/v1/systemone", body=body, headers={"Content-Type": "application/json"})
            answer = conn.getresponse()
            answer.read()
            model = answer.getheader("x-d3-model")  # HAProxy's hex converter writes upper case; Python's .hex() lower
            got[case] = [answer.getheader("x-d3-body"), model.lower() if model else None]
            conn.close()
        stop(PIDFILE)
        out[version] = got
    (D / "body-results.json").write_text(json.dumps(out, indent=1))
    print(json.dumps(out, indent=1))
    if SECTION:
        contract = json.loads(CONTRACT.read_text())
        contract["bodies_hex"].update({case: body.hex() for case, body in BODIES.items()})
        contract["python"].update(out["python"])
        for version in BINS:
            contract.setdefault(SECTION, {}).setdefault(version, {}).update(out[version])
        CONTRACT.write_text(json.dumps(contract, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
