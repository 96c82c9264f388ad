"""The fleet endpoint's body reader (roles/d3_router/files/d3-router.lua, HAProxy's Lua action d3_read_model) against
what vLLM does with the same body: Python's json (through pydantic) keeps the LAST of duplicate keys and decodes
escapes in keys, so the router must route by the one top-level "model" vLLM will read, or refuse the body (400).

Run in Lua 5.3 (Debian 12's HAProxy 2.6 links liblua5.3) and 5.4 (Debian 13's HAProxy 3.0) through lupa, with a stand-in
for the two parts of HAProxy's Lua API the action uses (doc/lua-api/index.rst: core.register_action; TXN.f:req_body()
and TXN:set_var()). The real HAProxy runs it in the lab (tests/lab/test_router.py) and ran it on loopback
(tests/contracts/haproxy/loopback-2.6.12-3.0.11.json)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from lupa import lua53, lua54

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = (ROOT / "roles/d3_router/files/d3-router.lua").read_text()
RUNTIMES = {"lua5.3": lua53, "lua5.4": lua54}


class Reader:
    """The action as HAProxy registers it, in one Lua runtime."""

    def __init__(self, runtime: Any) -> None:
        self.lua = runtime.LuaRuntime(unpack_returned_tuples=True)
        self.actions: dict[str, Any] = {}
        core = self.lua.table_from({"register_action": self._register})
        self.lua.globals().core = core
        self.lua.execute(SCRIPT)

    def _register(self, name: str, kinds: Any, func: Any, nargs: int) -> None:
        assert list(kinds.values()) == ["http-req"] and nargs == 0
        self.actions[name] = func

    def read(self, body: bytes) -> tuple[str, str | None]:
        found: dict[str, str] = {}
        fetches = self.lua.table_from({"req_body": lambda _self: body})
        txn = self.lua.table_from({"f": fetches, "set_var": lambda _self, name, value: found.__setitem__(name, value)})
        self.actions["d3_read_model"](txn)
        assert set(found) <= {"txn.d3_body", "txn.d3_model"}
        model = found.get("txn.d3_model")
        return found["txn.d3_body"], model.decode() if isinstance(model, bytes) else model


@pytest.fixture(scope="module", params=sorted(RUNTIMES))
def reader(request: pytest.FixtureRequest) -> Reader:
    return Reader(RUNTIMES[request.param])


def vllm_reads(body: bytes) -> tuple[str, str | None]:
    """What the router must conclude, from Python's json as vLLM parses the body: ok and the model vLLM serves, or why
    it is refused."""
    pairs: list[list[tuple[str, Any]]] = []
    try:
        value = json.loads(body, object_pairs_hook=lambda items: pairs.append(items) or dict(items))
    except ValueError:
        return "not_json", None
    if not isinstance(value, dict):
        return "not_json", None
    top = [v for k, v in pairs[-1] if k == "model"]  # the outermost object is built last
    if not top:
        return "no_model", None
    if len(top) > 1:
        return "duplicate_model", None
    return ("ok", top[0]) if isinstance(top[0], str) else ("model_not_string", None)


CASES = {
    b'{"model": "d3-lite", "state": {"ticket": "x"}, "questions": {"q": {"type": "noul"}}}': ("ok", "d3-lite"),
    # a "model" key inside the state or the questions is the client's data, not the routing key
    b'{"state": {"model": "car"}, "questions": {"model": {"type": "noul"}}, "model": "d3-mini"}': ("ok", "d3-mini"),
    b'{"model": "d3-lite", "state": {}, "model": "d3-27b"}': ("duplicate_model", None),
    b'{"model": "d3-lite", "mod\\u0065l": "d3-27b"}': ("duplicate_model", None),
    b'{"mod\\u0065l": "d3-27b"}': ("ok", "d3-27b"),
    b'{"model": "d3-\\u006cite"}': ("ok", "d3-lite"),
    b'{"model": 7}': ("model_not_string", None),
    b'{"model": null}': ("model_not_string", None),
    b'{"model": ["d3-lite"]}': ("model_not_string", None),
    b'{"state": {}}': ("no_model", None),
    b"{}": ("no_model", None),
    b' \r\n\t{ "model" : "d3-lite" } \n': ("ok", "d3-lite"),
    b'{"a": "}{\\"][", "model": "x", "b": [1, {"c": "\\\\"}, -2.5e3, true, false, null]}': ("ok", "x"),
    b"model=d3-lite": ("not_json", None),
    b"": ("not_json", None),
    b'["model", "d3-lite"]': ("not_json", None),
    b'"d3-lite"': ("not_json", None),
    b'{"model": "d3-lite"} trailing': ("not_json", None),
    b'{"model": "d3-lite",}': ("not_json", None),
    b'{"model" "d3-lite"}': ("not_json", None),
    b'{"model": "d3-lite"': ("not_json", None),
    b'{"model": "d3-\x01lite"}': ("not_json", None),
    b'{"model": "d3-lite\\x"}': ("not_json", None),
    b'{"model": "d3-lite\\u00"}': ("not_json", None),
    b'{model: "d3-lite"}': ("not_json", None),
    b'{"model": "d3-lite", "a": }': ("not_json", None),
    b'{"model": "d3-lite", "a": {"b": 1}': ("not_json", None),
    b'{"model": "d3-lite", "a": "open}': ("not_json", None),
    b'{"a": [1, "x': ("not_json", None),
}


@pytest.mark.parametrize("body", list(CASES), ids=[repr(b)[:40] for b in CASES])
def test_the_reader_concludes_what_vllm_would_read(reader: Reader, body: bytes) -> None:
    assert reader.read(body) == CASES[body]
    # and the cases say what Python's json, as vLLM, makes of each body
    assert vllm_reads(body) == CASES[body]


def test_random_bodies_conclude_as_vllm_reads_them(reader: Reader) -> None:
    """Many generated requests, keys and values of every JSON kind, "model" at any depth and sometimes twice at the
    top, escaped or not: the reader agrees with Python's json on each."""
    rng = random.Random(31)

    def value(depth: int) -> Any:
        kind = rng.choice(["str", "num", "lit", "obj", "arr"] if depth < 3 else ["str", "num", "lit"])
        if kind == "str":
            return rng.choice(["d3-lite", "}{", '"quoted"', "back\\slash", "üñí", "model", ""])
        if kind == "num":
            return rng.choice([0, -1, 2.5, 1e20])
        if kind == "lit":
            return rng.choice([True, False, None])
        if kind == "arr":
            return [value(depth + 1) for _ in range(rng.randint(0, 3))]
        return {rng.choice(["model", "state", "q", "x"]): value(depth + 1) for _ in range(rng.randint(0, 3))}

    seen = set()
    for _ in range(400):
        items = [(rng.choice(["state", "questions", "model", "other"]), value(0)) for _ in range(rng.randint(0, 4))]
        text = "{" + ", ".join(f"{json.dumps(k)}: {json.dumps(v, ensure_ascii=rng.random() < 0.5)}" for k, v in items) + "}"
        if rng.random() < 0.2:
            text = text.replace('"model"', '"mo\\u0064el"', 1)
        body = text.encode()
        expected = vllm_reads(body)
        seen.add(expected[0])
        assert reader.read(body) == expected, body
    assert seen == {"ok", "no_model", "duplicate_model", "model_not_string"}


def test_a_large_body_is_read_in_one_pass(reader: Reader) -> None:
    """256 KiB of question input (d3_router_max_request_kib's default) with the model last."""
    body = json.dumps({"state": {"ticket": "x" * 262_000, "notes": ["{[" * 50]}, "model": "d3-lite"}).encode()
    assert reader.read(body) == ("ok", "d3-lite")
