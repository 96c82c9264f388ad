"""d3_inputs, the collection's validation layer, table by table: every kind of d3_input_problems with values that
pass and values that must be refused at the edges of its pattern (whole-string matches: a trailing newline, a leading
space, a shell word), the exact messages, env_problems' names and secrets, vLLM's reading of a flag
(canonical_flag), and how a value is shown."""

from __future__ import annotations

from typing import Any

import d3_inputs
import pytest
from d3_inputs import canonical_flag, check, control_free, env_problems, input_problems, shown

PATH = "is not a plain absolute path (/dir/name: letters, digits, . _ - @ +; no .. or spaces)"
UNIT = 'is not a systemd service name (name.service) or ""'
SECRET = "is not a podman secret name (letters, digits, . _ -; starting with a letter or digit)"
SECONDS = "is not a whole number of seconds"
IP = "is not an IP address"
NETWORK = "is not an IP address or network (CIDR)"
HTTPS = "is not an https:// URL"
URL = 'is not an http(s):// URL or ""'
CONTROL = "contains a control character (newline, tab, escape...)"


@pytest.mark.parametrize(
    ("kind", "value", "problem"),
    [
        # path: absolute, plain names, no . or .. component, the root alone, one trailing slash
        ("path", "/", None),
        ("path", "/var/lib/d3", None),
        ("path", "/var/lib/d3/", None),
        ("path", "/a_b/c.d/e@f/g+h/i-j/K9", None),
        ("path", "/a/..b/.c/...", None),  # names that begin with dots are names
        ("path", "var/lib", PATH),
        ("path", "", PATH),
        ("path", " /var", PATH),
        ("path", "/var ", PATH),
        ("path", "/var/a b", PATH),
        ("path", "/var//lib", PATH),
        ("path", "//", PATH),
        ("path", "/var/$(id)", PATH),
        ("path", "/var;rm", PATH),
        ("path", "/a/../b", PATH),
        ("path", "/a/..", PATH),
        ("path", "/..", PATH),
        ("path", "/a/./b", PATH),
        ("path", "/a/.", PATH),
        ("path", "/.", PATH),
        ("path", "/var/lib\n", CONTROL),
        ("path", "/var\x7f", CONTROL),
        # unit: a service name, or "" (none)
        ("unit", "", None),
        ("unit", "d3-mini.service", None),
        ("unit", "a@b_c.d:e-F9.service", None),
        ("unit", "d3.socket", UNIT),
        ("unit", ".service", UNIT),
        ("unit", "a b.service", UNIT),
        ("unit", " a.service", UNIT),
        ("unit", "a.service ", UNIT),
        ("unit", "a.service.x", UNIT),
        ("unit", "a.service\n", CONTROL),
        # secret_name: a letter or digit, then up to 252 more of letters, digits, . _ -
        ("secret_name", "k", None),
        ("secret_name", "9d3_api.key-2", None),
        ("secret_name", "a" * 253, None),
        ("secret_name", "a" * 254, SECRET),
        ("secret_name", "", SECRET),
        ("secret_name", "-key", SECRET),
        ("secret_name", ".key", SECRET),
        ("secret_name", "_key", SECRET),
        ("secret_name", "a b", SECRET),
        ("secret_name", "key ", SECRET),
        ("secret_name", "key;id", SECRET),
        ("secret_name", "key/x", SECRET),
        ("secret_name", "key\t", CONTROL),
        # seconds: one to nine digits
        ("seconds", "0", None),
        ("seconds", 900, None),
        ("seconds", "123456789", None),
        ("seconds", "1234567890", SECONDS),
        ("seconds", "", SECONDS),
        ("seconds", "-1", SECONDS),
        ("seconds", "9 0", SECONDS),
        ("seconds", " 9", SECONDS),
        ("seconds", "1.5", SECONDS),
        ("seconds", 1.0, SECONDS),
        ("seconds", "9\n", CONTROL),
        # ip: one address, either family
        ("ip", "10.0.0.1", None),
        ("ip", "::1", None),
        ("ip", "fe80::1%eth0", None),
        ("ip", "10.0.0.256", IP),
        ("ip", "10.0.0.0/8", IP),
        ("ip", " 10.0.0.1", IP),
        ("ip", "", IP),
        ("ip", "localhost", IP),
        # network: an address or a CIDR, host bits allowed
        ("network", "10.0.0.0/8", None),
        ("network", "10.1.2.3/8", None),
        ("network", "10.0.0.1", None),
        ("network", "fd00::/8", None),
        ("network", "10.0.0.0/33", NETWORK),
        ("network", "x", NETWORK),
        ("network", "10.0.0.0/8 ", NETWORK),
        # https_url: https://host[:port][/path], nothing else
        ("https_url", "https://lab-apt:8443/gpgkey", None),
        ("https_url", "https://h", None),
        ("https_url", "https://h/", None),
        ("https_url", "https://h.example-1.org:65535/a._~%2F/+@=-", None),
        ("https_url", "https://h:1", None),
        ("https_url", "https://Lab-APT.Example:8443/Key/A", None),  # upper case in the host and the path
        ("https_url", "https://h:123456", HTTPS),
        ("https_url", "https://h:", HTTPS),
        ("https_url", "https://", HTTPS),
        ("https_url", "https:///gpgkey", HTTPS),
        ("https_url", "http://h/", HTTPS),
        ("https_url", "HTTPS://h/", HTTPS),
        ("https_url", " https://h/", HTTPS),
        ("https_url", "https://h/ x", HTTPS),
        ("https_url", "https://h/?q=1", HTTPS),
        ("https_url", "https://u@h/", HTTPS),
        ("https_url", "https://h/$(id)", HTTPS),
        ("https_url", "", HTTPS),
        # url: http or https, or "" (none)
        ("url", "", None),
        ("url", "http://h", None),
        ("url", "http://10.0.0.1:8000/v1", None),
        ("url", "https://h:8443/a", None),
        ("url", "http://Router.LAN/V1", None),
        ("url", "ftp://h", URL),
        ("url", "http://", URL),  # no host
        ("url", "http:///v1", URL),
        ("url", "http://h:123456", URL),
        ("url", "http://h/ x", URL),
        ("url", "http://h/#x", URL),
        ("url", " http://h", URL),
        # text: anything on one line
        ("text", "", None),
        ("text", "any words; $(id) `x` 'q' \"q\" ~", None),
        ("text", "é ü \x80", None),
        ("text", 1.5, None),
        ("text", "a\nb", CONTROL),
        ("text", "\x00", CONTROL),
        ("text", "\x1f", CONTROL),
        ("text", "\x7f", CONTROL),
        ("text", "\r", CONTROL),
        ("text", "tab\t", CONTROL),
        ("text", "\x1b[31m", CONTROL),
        # not text at all
        ("text", None, "expected text, got NoneType"),
        ("text", True, "expected text, got bool"),
        ("seconds", False, "expected text, got bool"),
        ("path", ["/a"], "expected text, got list"),
        ("text", {"a": 1}, "expected text, got dict"),
    ],
)
def test_check(kind: str, value: Any, problem: str | None) -> None:
    assert check(kind, value) == problem


def test_an_unknown_kind_is_a_bug_of_the_caller() -> None:
    with pytest.raises(ValueError) as refused:
        check("colour", "red")
    assert str(refused.value) == "unknown input kind 'colour'"


@pytest.mark.parametrize(
    ("value", "free"),
    [("", True), (" ~", True), ("é", True), ("\x00", False), ("\x1f", False), ("\x7f", False), ("a\n", False), (5, True)],
)
def test_control_free(value: Any, free: bool) -> None:
    assert control_free(value) is free


def test_shown_is_a_repr_cut_at_80_characters() -> None:
    assert shown("a\nb") == "'a\\nb'"
    assert shown(None) == "None"
    assert shown("x" * 78) == "'" + "x" * 78 + "'"  # 80 characters: whole
    assert shown("x" * 79) == "'" + "x" * 76 + "..."  # 81: cut to 77 and ...
    assert len(shown("x" * 500)) == 80


def test_input_problems_messages_with_and_without_a_host() -> None:
    checks = [
        {"name": "d3_a", "kind": "path", "value": "/ok"},
        {"name": "d3_b", "kind": "seconds", "value": "10s"},
        {"name": "d3_c", "kind": "unit"},  # no value: None
        {"name": "d3_d", "kind": "text", "value": "x\ny"},
    ]
    assert input_problems(checks, "h1") == [
        "host h1: d3_b = '10s' is not a whole number of seconds. Fix the inventory.",
        "host h1: d3_c = None expected text, got NoneType. Fix the inventory.",
        "host h1: d3_d = 'x\\ny' contains a control character (newline, tab, escape...). Fix the inventory.",
    ]
    assert input_problems(checks) == [
        "d3_b = '10s' is not a whole number of seconds. Fix the inventory.",
        "d3_c = None expected text, got NoneType. Fix the inventory.",
        "d3_d = 'x\\ny' contains a control character (newline, tab, escape...). Fix the inventory.",
    ]
    assert input_problems([]) == []
    assert input_problems([{"name": "d3_ok", "kind": "network", "value": "10.0.0.0/8"}], "h1") == []
    with pytest.raises(ValueError, match="unknown input kind"):
        input_problems([{"name": "d3_x", "kind": "colour", "value": "red"}])


def test_the_filter_plugin_exports_d3_input_problems_only() -> None:
    assert d3_inputs.FilterModule().filters() == {"d3_input_problems": input_problems}


NOT_ONE_LINE = "is not one line of text (no control characters)"
LOOKS_SECRET = ("looks like a secret (TOKEN/SECRET/PASSWORD/KEY): it would sit in the unit file (0644) and the plan JSON",
                "remove it; the API key is d3_units_api_key, the Hub token d3_weights_token_file")  # fmt: skip


@pytest.mark.parametrize(
    ("env", "problems"),
    [
        ({}, []),
        ({"A": "1", "_": "", "a_1": 2, "Z9": 1.5, "PATHS": "/a:/b"}, []),
        ({"1A": "x"}, [("env key '1A'", "is not a variable name ([A-Za-z_][A-Za-z0-9_]*)", "rename it")]),
        ({"A\n": "x"}, [("env key 'A\\n'", "is not a variable name ([A-Za-z_][A-Za-z0-9_]*)", "rename it")]),
        ({" A": "x"}, [("env key ' A'", "is not a variable name ([A-Za-z_][A-Za-z0-9_]*)", "rename it")]),
        ({"A-B": "x"}, [("env key 'A-B'", "is not a variable name ([A-Za-z_][A-Za-z0-9_]*)", "rename it")]),
        ({"": "x"}, [("env key ''", "is not a variable name ([A-Za-z_][A-Za-z0-9_]*)", "rename it")]),
        ({5: "x"}, [("env key '5'", "is not a variable name ([A-Za-z_][A-Za-z0-9_]*)", "rename it")]),
        # a bad name is reported once (its value is not looked at), and the next entries are still checked
        ({"1A": None, "B": "x\ny", "C": "ok"},
         [("env key '1A'", "is not a variable name ([A-Za-z_][A-Za-z0-9_]*)", "rename it"),
          ("env B", f"value 'x\\ny' {NOT_ONE_LINE}", "give a plain string")]),
        ({"A": None}, [("env A", f"value None {NOT_ONE_LINE}", "give a plain string")]),
        ({"A": [1]}, [("env A", f"value [1] {NOT_ONE_LINE}", "give a plain string")]),
        ({"A": {"b": 1}}, [("env A", f"value {{'b': 1}} {NOT_ONE_LINE}", "give a plain string")]),
        ({"A": "tab\t"}, [("env A", f"value 'tab\\t' {NOT_ONE_LINE}", "give a plain string")]),
        ({"A": "\x7f"}, [("env A", f"value '\\x7f' {NOT_ONE_LINE}", "give a plain string")]),
        ({"VLLM_API_KEY": "k"},
         [("env VLLM_API_KEY", "would put a secret in the unit file (0644) and the plan JSON",
           "remove it; use d3_units_api_key (kept in Ansible Vault; it reaches vLLM from a podman secret)")]),
        ({"HF_TOKEN": "t"},
         [("env HF_TOKEN", "would put a secret in the unit file (0644) and the plan JSON",
           "remove it; use d3_weights_token_file (a root-only file on the host; the units need no token: weights are "
           "cached)")]),
        ({"MY_TOKEN": "t"}, [("env MY_TOKEN", *LOOKS_SECRET)]),
        ({"DB_SECRET": "t"}, [("env DB_SECRET", *LOOKS_SECRET)]),
        ({"PASSWORD": "t"}, [("env PASSWORD", *LOOKS_SECRET)]),
        ({"SSH_KEY": "t"}, [("env SSH_KEY", *LOOKS_SECRET)]),
        ({"hf_token_path": "t"}, [("env hf_token_path", *LOOKS_SECRET)]),
        ({"Keyring": "t"}, [("env Keyring", *LOOKS_SECRET)]),
        # a secret's name with a bad value: both problems
        ({"MY_PASSWORD": None},
         [("env MY_PASSWORD", *LOOKS_SECRET), ("env MY_PASSWORD", f"value None {NOT_ONE_LINE}", "give a plain string")]),
        ({"HF_TOKEN": "a\nb"},
         [("env HF_TOKEN", "would put a secret in the unit file (0644) and the plan JSON",
           "remove it; use d3_weights_token_file (a root-only file on the host; the units need no token: weights are "
           "cached)"),
          ("env HF_TOKEN", f"value 'a\\nb' {NOT_ONE_LINE}", "give a plain string")]),
    ],
)  # fmt: skip
def test_env_problems(env: dict[Any, Any], problems: list[tuple[str, str, str]]) -> None:
    assert env_problems(env) == problems


@pytest.mark.parametrize("env", ["A=1", ["A=1"], 5, True])
def test_env_that_is_not_a_mapping(env: Any) -> None:
    assert env_problems(env) == [("env", f"expected a mapping of NAME: value, got {shown(env)}", "write `env: {NAME: value}`")]


KNOWN = ["--host", "--port", "--max-model-len", "--max-num-seqs", "--seed", "--seed-x", "--tensor-parallel-size"]


@pytest.mark.parametrize(
    ("token", "read"),
    [
        ("--host", ("--host", None, "")),
        ("--host=0.0.0.0", ("--host", "0.0.0.0", "")),
        ("--zz=b=c", ("--zz", "b=c", "")),  # split at the first =
        ("--h", ("--host", None, "")),  # the shortest unique prefix
        ("--ho=::", ("--host", "::", "")),
        ("--p", ("--port", None, "")),
        ("--max", ("--max", None, "")),  # a prefix of two known flags: kept
        ("--max-m", ("--max-model-len", None, "")),
        ("--max_num", ("--max-num-seqs", None, "")),  # _ is -
        ("--max_num_seqs=4", ("--max-num-seqs", "4", "")),
        ("--seed", ("--seed", None, "")),  # known exactly, though also the prefix of another
        ("--seed-", ("--seed-x", None, "")),
        ("--", ("--", None, "")),  # the empty name is no prefix of anything
        ("--=x", ("--", "x", "")),
        ("--port.a.b=1", ("--port", "1", "a.b")),  # the JSON key after the first .
        ("--po.a", ("--port", None, "a")),
        ("--unknown", ("--unknown", None, "")),
        ("-tp", ("--tensor-parallel-size", None, "")),
        ("-tp=2", ("--tensor-parallel-size", "2", "")),
        ("-q", ("--quantization", None, "")),
        ("-pp=2", ("--pipeline-parallel-size", "2", "")),
        ("-dp", ("--data-parallel-size", None, "")),
        ("-x=1", ("-x", "1", "")),  # neither an alias nor a long flag: as given
        ("-t", ("-t", None, "")),
        ("value", ("value", None, "")),
        ("a=b", ("a", "b", "")),
    ],
)
def test_canonical_flag(token: str, read: tuple[str, str | None, str]) -> None:
    assert canonical_flag(token, KNOWN) == read


def test_the_empty_flag_name_is_no_prefix_even_of_a_single_known_flag() -> None:
    # with one known flag, "--" would be its unique prefix: the name must be longer than "--" to abbreviate
    assert canonical_flag("--", ["--host"]) == ("--", None, "")
    assert canonical_flag("--=0.0.0.0", ["--host"]) == ("--", "0.0.0.0", "")
    assert canonical_flag("--h", ["--host"]) == ("--host", None, "")
