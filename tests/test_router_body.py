"""The fleet endpoint's body reader (roles/d3_router/files/d3-router.lua, HAProxy's Lua action d3_read_model) against
what vLLM does with the same body: Python's json (through pydantic) keeps the LAST of duplicate keys and decodes
escapes in keys, so the router must route by the one top-level "model" vLLM will read, or refuse the body (400).

Run in Lua 5.3 (Debian 12's HAProxy 2.6 links liblua5.3) and 5.4 (Debian 13's HAProxy 3.0) through lupa, with a stand-in
for the two parts of HAProxy's Lua API the action uses (doc/lua-api/index.rst: core.register_action; TXN.f:req_body()
and TXN:set_var()). The real HAProxy runs it in the lab (tests/lab/test_router.py) and ran it on loopback
(tests/contracts/haproxy/loopback-2.6.12-3.0.11.json; the encodings, tests/contracts/haproxy/body-encodings.json)."""

from __future__ import annotations

import json
import random
import re
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
        # encoding None: Lua's strings reach Python as the bytes they are (a model may hold an encoded lone surrogate)
        self.lua = runtime.LuaRuntime(unpack_returned_tuples=True, encoding=None)
        self.actions: dict[bytes, Any] = {}
        core = self.lua.table_from({b"register_action": self._register})
        self.lua.globals()[b"core"] = core
        self.lua.execute(SCRIPT.encode())

    def _register(self, name: bytes, kinds: Any, func: Any, nargs: int) -> None:
        assert list(kinds.values()) == [b"http-req"] and nargs == 0
        self.actions[name] = func

    def read(self, body: bytes) -> tuple[str, str | None]:
        found: dict[bytes, bytes] = {}
        fetches = self.lua.table_from({b"req_body": lambda _self: body})
        txn = self.lua.table_from({b"f": fetches, b"set_var": lambda _self, name, value: found.__setitem__(name, value)})
        self.actions[b"d3_read_model"](txn)
        assert set(found) <= {b"txn.d3_body", b"txn.d3_model"}
        model = found.get(b"txn.d3_model")
        # HAProxy compares the variable's bytes with the served names' UTF-8; lone surrogates as 'surrogatepass'
        return found[b"txn.d3_body"].decode(), None if model is None else model.decode("utf-8", "surrogatepass")


@pytest.fixture(scope="module", params=sorted(RUNTIMES))
def reader(request: pytest.FixtureRequest) -> Reader:
    return Reader(RUNTIMES[request.param])


def vllm_reads(body: bytes) -> tuple[str, str | None]:
    """What the router must conclude, from Python's json as vLLM parses the body: ok and the model vLLM serves, or why
    it is refused."""
    pairs: list[list[tuple[str, Any]]] = []
    try:
        value = json.loads(body, object_pairs_hook=lambda items: pairs.append(items) or dict(items))
    except (ValueError, RecursionError):  # too deep: FastAPI answers 400 for any exception but a JSONDecodeError
        return "not_json", None
    if not isinstance(value, dict):
        return "not_json", None
    top = [v for k, v in pairs[-1] if k == "model"]  # the outermost object is built last
    if not top:
        return "no_model", None
    if len(top) > 1:
        return "duplicate_model", None
    if not isinstance(top[0], str):
        return "model_not_string", None
    # HAProxy's `-m str` compares up to the first NUL: a model holding one is not handed to it (d3-router.lua), so the
    # router answers its unknown-model 404 as vLLM would (no served name holds a NUL)
    return ("ok", None) if "\0" in top[0] else ("ok", top[0])


CASES = {
    b'{"model": "d3-lite", "state": {"ticket": "x"}, "questions": {"q": {"type": "noul"}}}': ("ok", "d3-lite"),
    # a "model" key inside the state or the questions is the client's data, not the routing key
    b'{"state": {"model": "car"}, "questions": {"model": {"type": "noul"}}, "model": "d3-mini"}': ("ok", "d3-mini"),
    b'{"model": "d3-lite", "state": {}, "model": "d3-27b"}': ("duplicate_model", None),
    b'{"model": "d3-lite", "mod\\u0065l": "d3-27b"}': ("duplicate_model", None),
    b'{"mod\\u0065l": "d3-27b"}': ("ok", "d3-27b"),
    b'{"model": "d3-\\u006cite"}': ("ok", "d3-lite"),
    b'{"model": 7}': ("model_not_string", None),
    b'{"model": "d3-lite\\u0000evil"}': ("ok", None),  # a NUL: HAProxy would have matched "d3-lite" (review 2026-12-05)
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
    # the review of 2026-12-04: what Python's json.loads(bytes) accepts and the reader refused. DEL (0x7f) is no JSON
    # control character (those are U+0000-U+001F); a UTF-8 byte-order mark is dropped ('utf-8-sig'); UTF-16 and
    # UTF-32, with or without a byte-order mark, are decoded (json.detect_encoding)
    b'{"model": "d3-lite", "note": "a\x7fb"}': ("ok", "d3-lite"),
    b'{"model": "d3-\x7flite"}': ("ok", "d3-\x7flite"),
    b'{"mod\x7fel": "d3-lite", "model": "d3-mini"}': ("ok", "d3-mini"),
    b'\xef\xbb\xbf{"model": "d3-lite"}': ("ok", "d3-lite"),
    b'\xef\xbb\xbf\xef\xbb\xbf{"model": "d3-lite"}': ("not_json", None),  # only one mark is dropped
    b' \xef\xbb\xbf{"model": "d3-lite"}': ("not_json", None),
    '{"model": "d3-lite", "s": "\u00fc"}'.encode("utf-16"): ("ok", "d3-lite"),
    '{"model": "d3-lite"}'.encode("utf-16-le"): ("ok", "d3-lite"),
    '{"model": "d3-lite"}'.encode("utf-16-be"): ("ok", "d3-lite"),
    '{"model": "d3-lite"}'.encode("utf-32"): ("ok", "d3-lite"),
    '{"model": "d3-lite"}'.encode("utf-32-le"): ("ok", "d3-lite"),
    '{"model": "d3-lite"}'.encode("utf-32-be"): ("ok", "d3-lite"),
    '{"model": "d3-lite", "model": "x"}'.encode("utf-16"): ("duplicate_model", None),
    '{"model": "d3-\U0001f600"}'.encode("utf-16-le"): ("ok", "d3-\U0001f600"),
    '{"model": "d3-lite"}'.encode("utf-16")[:-1]: ("not_json", None),  # a truncated unit does not decode
    '{"model": "d3-lite"}'.encode("utf-32")[:-2]: ("not_json", None),
    b"\xff\xfe\x00\x00" + b"\x00\x00\x11\x00": ("not_json", None),  # UTF-32 past U+10FFFF
    # an escaped surrogate pair is one character, a lone surrogate stays one
    b'{"model": "d3-\\ud83d\\ude00"}': ("ok", "d3-\U0001f600"),
    b'{"model": "d3-\\ud83d"}': ("ok", "d3-\ud83d"),
    b'{"model": "d3-\\ud83dx"}': ("ok", "d3-\ud83dx"),
    b'{"model": "d3-\\ud83d\\u0041"}': ("ok", "d3-\ud83dA"),
    b'{"model": "d3-\\ude00\\ud83d"}': ("ok", "d3-\ude00\ud83d"),
    b'{"model": "d3-\\ud83d\\uzzzz"}': ("not_json", None),
    # bytes that are not UTF-8 do not decode; encoded surrogates do ('surrogatepass')
    b'{"model": "d3-lite", "s": "\xff"}': ("not_json", None),
    b'{"model": "d3-lite", "s": "\xc0\x80"}': ("not_json", None),
    b'{"model": "d3-lite", "s": "\xf4\x90\x80\x80"}': ("not_json", None),
    b'{"model": "d3-lite", "s": "\xf5\x80\x80\x80"}': ("not_json", None),
    b'{"model": "d3-lite", "s": "\xe2\x82"}': ("not_json", None),
    b'{"model": "d3-lite", "s": "\xf4\x8f\xbf\xbf"}': ("ok", "d3-lite"),
    b'{"model": "d3-\xed\xa0\x80"}': ("ok", "d3-\ud800"),
    # two bytes: UTF-16 when one is zero
    b"{\x00": ("not_json", None),
    b"\x00{": ("not_json", None),
}


@pytest.mark.parametrize("body", list(CASES), ids=[repr(b)[:60] for b in CASES])
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


# The review of 2026-12-05: the values inside the top-level object were skipped loosely (brackets counted, a number or
# literal any run of letters, digits and signs), so bodies Python's json refuses were routed. Each of these the reader
# before the fix routed (ok or model_not_string); Python's json, and now the reader, refuse them.
STRICT_CASES = {
    b'{"model": "m", "x": [1 2]}': "a missing comma in an array",
    b'{"model": "m", "x": {"a": 1 "b": 2}}': "a missing comma in an object",
    b'{"model": "m", "x": {"a" 1}}': "a missing colon",
    b'{"model": "m", "x": {"a": 1,}}': "a trailing comma in an object",
    b'{"model": "m", "x": [1,]}': "a trailing comma in an array",
    b'{"model": "m", "x": [,1]}': "a leading comma",
    b'{"model": "m", "x": [1,,2]}': "two commas",
    b'{"model": "m", "x": {1: 2}}': "a key that is not a string",
    b'{"model": "m", "x": {"a"}}': "a key without a value",
    b'{"model": "m", "x": -}': "a lone minus",
    b'{"model": "m", "x": tru}': "true misspelt",
    b'{"model": "m", "x": True}': "Python's True",
    b'{"model": "m", "x": nul}': "null misspelt",
    b'{"model": "m", "x": falsey}': "false and more letters",
    b'{"model": "m", "x": 01}': "a leading zero",
    b'{"model": "m", "x": -01}': "a leading zero after a minus",
    b'{"model": "m", "x": 1.}': "a point without digits",
    b'{"model": "m", "x": .5}': "digits without an integer part",
    b'{"model": "m", "x": 1e}': "an exponent without digits",
    b'{"model": "m", "x": 1e+}': "an exponent's sign without digits",
    b'{"model": "m", "x": +1}': "a plus sign",
    b'{"model": "m", "x": 0x10}': "hexadecimal",
    b'{"model": "m", "x": 1-2}': "a minus inside a number",
    b'{"model": "m", "x": 1.5.5}': "two points",
    b'{"model": "m", "x": -NaN}': "a minus before NaN",
    b'{"model": "m", "x": nan}': "NaN in lower case",
    b'{"model": "m", "x": infinity}': "Infinity in lower case",
    b'{"model": "m", "x": Inf}': "Infinity cut short",
    b'{"model": "m", "x": [1\x0b]}': "a vertical tab as whitespace",
    b'{"model": "m", "x": [1\x0c]}': "a form feed as whitespace",
    '{"model": "m", "x": [1\u00a0]}'.encode(): "a no-break space as whitespace",
    b'{"model": "m", "x": ' + b"1" * 4301 + b"}": "an integer of 4301 digits (Python's int limit)",
    b'{"model": ' + b"1" * 4301 + b"}": "the model an integer of 4301 digits",
    b'{"model": 01}': "the model a number with a leading zero",
    b'{"model": tru}': "the model true misspelt",
    b'{"model": [1 2]}': "the model an array without its comma",
    b'{"model": "m", "x": ' + b"[" * 2000 + b"]" * 2000 + b"}": "2,000 levels of arrays (RecursionError in Python)",
    b'{"model": "m", "x": ' + b'{"a":' * 2000 + b"1" + b"}" * 2000 + b"}": "2,000 levels of objects",
}


@pytest.mark.parametrize("body", list(STRICT_CASES), ids=list(STRICT_CASES.values()))
def test_a_value_pythons_json_refuses_is_refused(reader: Reader, body: bytes) -> None:
    assert vllm_reads(body) == ("not_json", None)
    assert reader.read(body) == ("not_json", None)


# what Python's json takes, each beside a near twin it refuses: the reader draws the line where Python does
TWINS = [
    (b"NaN", b"-NaN"),
    (b"Infinity", b"infinity"),
    (b"-Infinity", b"-Infinit"),
    (b"[NaN, Infinity, -Infinity]", b"[NaN, Infinity, +Infinity]"),
    (b"0", b"00"),
    (b"-0", b"-"),
    (b"0.5", b"0."),
    (b"-0.0e-0", b"-0.0e-"),
    (b"1E+2", b"1E+"),
    (b"1e5", b"1e5e5"),
    (b"10", b"010"),
    (b"123.456e78", b"123.456.78"),
    (b"1" * 4300, b"1" * 4301),
    (b"-" + b"1" * 4300, b"-" + b"1" * 4301),
    (b"1" * 4301 + b".5", b"1" * 4301 + b"."),  # a float has no digit limit
    (b"1" * 4301 + b"e5", b"1" * 4301 + b"e"),
    (b"true", b"tru"),
    (b"false", b"fals"),
    (b"null", b"nil"),
    (b"[]", b"[,]"),
    (b"{}", b"{,}"),
    (b"[ ]", b"[\x0b]"),
    (b"{ \t\r\n}", b"{ \t\r\n,}"),
    (b'{"a": [1, {"b": null}], "c": {}}', b'{"a": [1, {"b": null}], "c": {}'),
    (b'[1, "2", [3], {"4": 5}]', b'[1, "2", [3], {"4": 5}'),
    (b" [ 1 , 2 ] ", b" [ 1 , 2 , ] "),
    (b'{"model": "nested"}', b'{"model" "nested"}'),
    (b'"\\ud83d"', b'"\\ud83"'),
    # refused by the reader before the fix too, and kept so: closers that do not pair, strings and keys inside
    (b"[1]", b"[1}"),
    (b'{"a": []}', b'{"a": [}}'),
    (b"[[1]]", b"[[1]"),
    (b'["a"]', b'["a\x01"]'),
    (b'{"a\\n": 1}', b'{"a\\q": 1}'),
    (b'["\\u0012"]', b'["\\u12"]'),
]


def test_values_python_takes_are_taken_and_their_near_twins_refused(reader: Reader) -> None:
    for good, bad in TWINS:
        for value, verdict in ((good, "ok"), (bad, "not_json")):
            body = b'{"model": "m", "x": ' + value + b"}"
            assert vllm_reads(body) == reader.read(body) == (verdict, "m" if verdict == "ok" else None), body[:80]


MAX_DEPTH = 512  # the reader's (d3-router.lua's MAX_DEPTH)


@pytest.mark.parametrize("open_, close", [(b"[", b"]"), (b'{"a": ', b"}")], ids=["arrays", "objects"])
def test_nesting_deeper_than_the_readers_limit_is_refused(reader: Reader, open_: bytes, close: bytes) -> None:
    """The reader nests MAX_DEPTH levels, the top-level object counting one, and refuses a body nested deeper. Python
    reads deeper (993 on 3.11 from a bare script, 1497 on 3.12): between the two the router refuses what vLLM would
    read, deliberately (no fixed limit matches Python's, which depends on the interpreter's recursion limits; D3's
    requests are a few levels deep); far deeper, both refuse."""

    def nested(levels: int) -> bytes:  # a body `levels` deep in all, the top-level object included
        inner = levels - 1
        return b'{"model": "m", "x": ' + open_ * inner + b"1" + close * inner + b"}"

    assert reader.read(nested(MAX_DEPTH)) == vllm_reads(nested(MAX_DEPTH)) == ("ok", "m")
    assert reader.read(nested(MAX_DEPTH + 1)) == ("not_json", None)
    assert vllm_reads(nested(MAX_DEPTH + 1)) == ("ok", "m")  # Python still reads it: the one deliberate difference
    assert reader.read(nested(2000)) == vllm_reads(nested(2000)) == ("not_json", None)
    # a deep body that is wrong deep down is refused for that, below the limit too
    assert reader.read(nested(300).replace(b"1", b"01", 1)) == ("not_json", None)
    assert re.search(r"^local MAX_DEPTH = 512$", SCRIPT, re.M)


def test_random_and_mutated_bodies_conclude_as_python_reads_them(reader: Reader) -> None:
    """A differential fuzz: values of every JSON kind (NaN and Infinity too, odd numbers, whitespace, nesting), taken
    whole, spliced from JSON-ish pieces, or with one character deleted, inserted or replaced; the reader's verdict and
    model equal what Python's json concludes for each body."""
    rng = random.Random(20261205)
    pieces = [
        "{",
        "}",
        "[",
        "]",
        ",",
        ":",
        '"a"',
        '"model"',
        '"m"',
        "0",
        "1",
        "-",
        ".",
        "e",
        "E",
        "+",
        "01",
        "1.5",
        "-0",
        "1e5",
        "true",
        "tru",
        "false",
        "null",
        "NaN",
        "Infinity",
        "-Infinity",
        " ",
        "\t",
        "\n",
        "\r",
        "\x0b",
        "\u00a0",
        '"\\u00e9"',
        '"\\ud83d"',
        '"\\x"',
        "\x01",
    ]
    alphabet = '{}[],:"\\ -+.0123456789eEaNIflnrstu\t\n\x0b'

    def number() -> str:
        text = rng.choice(["", "-"]) + rng.choice(["0", str(rng.randint(1, 10 ** rng.randint(1, 20)))])
        if rng.random() < 0.4:
            text += "." + str(rng.randint(0, 999))
        if rng.random() < 0.3:
            text += rng.choice("eE") + rng.choice(["", "+", "-"]) + str(rng.randint(0, 400))
        return text

    def value(depth: int) -> str:
        kind = rng.choice(["str", "num", "num", "lit", "obj", "arr"] if depth < 5 else ["str", "num", "lit"])
        space = rng.choice(["", "", " ", "\n", "\t ", "\r\n  "])
        if kind == "str":
            return json.dumps(rng.choice(["d3-lite", "}{", "a,b", "[1 2]", "\\", "\u00fc", "model", ""]), ensure_ascii=rng.random() < 0.5)
        if kind == "num":
            return number()
        if kind == "lit":
            return rng.choice(["true", "false", "null", "NaN", "Infinity", "-Infinity"])
        if kind == "arr":
            return "[" + space + ("," + space).join(value(depth + 1) for _ in range(rng.randint(0, 4))) + space + "]"
        items = (json.dumps(rng.choice(["model", "a", "b"])) + space + ":" + space + value(depth + 1) for _ in range(rng.randint(0, 4)))
        return "{" + space + ("," + space).join(items) + space + "}"

    def body() -> str:
        items = [(rng.choice(["state", "x", "q", "model"]), value(0)) for _ in range(rng.randint(0, 4))]
        if rng.random() < 0.7:  # mostly a request vLLM would serve, so that its mutations matter
            items.insert(rng.randint(0, len(items)), ("model", json.dumps(rng.choice(["d3-lite", "d3-\u00fc", "m"]))))
        return "{" + ", ".join(f"{json.dumps(k)}: {v}" for k, v in items) + "}"

    verdicts: dict[str, int] = {}
    for round_ in range(3000):
        text = body()
        way = round_ % 4
        if way == 1:  # JSON-ish pieces as a value
            text = '{"model": "m", "x": ' + "".join(rng.choice(pieces) for _ in range(rng.randint(1, 6))) + "}"
        elif way == 2:  # one character deleted
            at = rng.randrange(len(text))
            text = text[:at] + text[at + 1 :]
        elif way == 3:  # one character inserted or replaced
            at = rng.randrange(len(text))
            text = text[:at] + rng.choice(alphabet) + text[at + rng.randint(0, 1) :]
        data = text.encode()
        expected = vllm_reads(data)
        verdicts[expected[0]] = verdicts.get(expected[0], 0) + 1
        assert reader.read(data) == expected, data
    # every verdict came up, and refusals and acceptances both in numbers
    assert set(verdicts) == {"ok", "not_json", "no_model", "duplicate_model", "model_not_string"}
    assert verdicts["not_json"] > 600 and verdicts["ok"] > 600, verdicts


@pytest.mark.parametrize("encoding", ["utf-8-sig", "utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le", "utf-32-be"])
def test_every_encoding_pythons_json_detects_reads_as_its_utf_8(reader: Reader, encoding: str) -> None:
    """The same generated bodies, in each encoding json.detect_encoding tells apart (vLLM reads them all): the reader
    concludes what Python's json concludes, and the model it routes by is the one vLLM reads."""
    rng = random.Random(7)
    names = ["d3-lite", "d3-\u00fc", "d3-\U0001f600", "d\x7f3", "model"]
    for _ in range(60):
        items = [(rng.choice(["model", "state", "x"]), rng.choice([*names, 7, None, {"model": "y"}])) for _ in range(rng.randint(0, 3))]
        text = "{" + ", ".join(f"{json.dumps(k)}: {json.dumps(v, ensure_ascii=rng.random() < 0.5)}" for k, v in items) + "}"
        body = text.encode(encoding, "surrogatepass")
        expected = vllm_reads(body)
        assert reader.read(body) == expected, (encoding, body)
        assert expected == vllm_reads(text.encode())  # the encoding changes nothing for vLLM


ENCODINGS = json.loads((ROOT / "tests/contracts/haproxy/body-encodings.json").read_text())


@pytest.mark.parametrize("case", sorted(ENCODINGS["bodies_hex"]))
def test_what_the_real_haproxy_read_is_what_python_reads_and_what_this_reader_reads(reader: Reader, case: str) -> None:
    """tests/contracts/haproxy/body-encodings.json: the reader inside Debian's 2.6.12 (Lua 5.3) and 3.0.11 (Lua 5.4)
    concluded what Python's json.loads(bytes) concludes; so does this file's reader here, for the same bytes."""
    body = bytes.fromhex(ENCODINGS["bodies_hex"][case])
    verdict, model = ENCODINGS["python"][case]
    assert list(vllm_reads(body)) == [verdict, None if model is None else bytes.fromhex(model).decode("utf-8", "surrogatepass")]
    for version in ("2.6.12-1+deb12u4", "3.0.11-1+deb13u4"):
        assert ENCODINGS["after"][version][case] == [verdict, model]
    got = reader.read(body)
    assert [got[0], None if got[1] is None else got[1].encode("utf-8", "surrogatepass").hex()] == [verdict, model]


def test_the_reader_before_the_fix_refused_what_vllm_reads() -> None:
    """The captures of the reader before 2026-12-04 on both versions: DEL, a byte-order mark and UTF-16/32 refused
    (400 where vLLM answers), bytes that are not UTF-8 taken, an escaped surrogate pair as two characters."""
    for version in ("2.6.12-1+deb12u4", "3.0.11-1+deb13u4"):
        before = ENCODINGS["before"][version]
        for case in ("DEL in a string value", "DEL in the model", "UTF-8 byte-order mark", "UTF-16 with its mark", "UTF-32 with its mark"):
            assert before[case] == ["not_json", None] and ENCODINGS["python"][case][0] == "ok"
        assert before["not UTF-8"][0] == "ok" and ENCODINGS["python"]["not UTF-8"][0] == "not_json"
        assert before["escaped surrogate pair"] != ENCODINGS["python"]["escaped surrogate pair"]


def test_the_reader_before_the_strict_values_routed_what_vllm_refuses() -> None:
    """The captures of the reader between 2026-12-04's fix and 2026-12-05's on both versions: the review's bodies,
    which Python's json refuses, were routed (a missing comma, a lone minus, 'tru', '01', 2,000 levels of nesting);
    after the fix both versions refuse them, and take what Python takes (NaN, Infinity, every form of number, 512
    levels)."""
    refused = [
        "a missing comma in an array",
        "a lone minus",
        "true misspelt",
        "a leading zero",
        "2,000 levels of arrays",
        "2,000 levels of objects",
        "an integer of 4301 digits",
        "a vertical tab as whitespace",
    ]
    taken = ["NaN, Infinity and -Infinity", "numbers of every form", "a float of 4301 digits", "512 levels (the reader's limit)"]
    for version in ("2.6.12-1+deb12u4", "3.0.11-1+deb13u4"):
        before, after = ENCODINGS["before_2026_12_05"][version], ENCODINGS["after"][version]
        for case in refused:
            assert ENCODINGS["python"][case] == after[case] == ["not_json", None] and before[case][0] == "ok", case
        assert before["the model a number with a leading zero"] == ["model_not_string", None]
        assert after["the model a number with a leading zero"] == ["not_json", None]
        for case in taken:
            assert ENCODINGS["python"][case] == after[case] == before[case] == ["ok", b"d3-lite".hex()], case
