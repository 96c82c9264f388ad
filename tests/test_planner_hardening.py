"""Issue 11's hostile inputs against the planner: nothing that reaches a unit file or a command line can inject a
line or a flag, owned flags are recognised the way vLLM's parser reads them, secrets stay out of `env`, and a
listen address other than loopback needs an API key."""

from __future__ import annotations

from typing import Any

import pytest
from d3_inputs import canonical_flag, check, env_problems, input_problems
from d3_planner import KNOWN_FLAGS, d3_plan
from d3_render import quadlet_container
from l4 import l4_gpus

SHA = "0123456789abcdef0123456789abcdef01234567"


def plan(catalog_vars: dict[str, Any], item: dict[str, Any], **options: Any) -> dict[str, Any]:
    options = {"revisions": {"d3-edge": SHA}, **options}
    return d3_plan([{"model": "d3-edge", **item}], catalog_vars["d3_catalog"], catalog_vars["d3_catalog_common"],
                   l4_gpus(1), host="l4-a", options=options)  # fmt: skip


def refused(catalog_vars: dict[str, Any], item: dict[str, Any], **options: Any) -> str:
    result = plan(catalog_vars, item, **options)
    assert result["instances"] == [], "a refused plan renders no unit"
    assert len(result["errors"]) == 1, result["errors"]
    return result["errors"][0]


@pytest.mark.parametrize(
    ("extra", "flag"),
    [
        (["--api_key", "SECRET-1"], "--api-key"),  # vLLM turns _ into -
        (["--api-key=SECRET-1"], "--api-key"),
        (["--hos", "0.0.0.0"], "--host"),  # argparse's unique prefix
        (["--ho=0.0.0.0"], "--host"),
        (["--served_model_name", "x"], "--served-model-name"),
        (["--por", "9999"], "--port"),
        (["--revis", SHA], "--revision"),
        (["--mod", "other/model"], "--model"),
        (["--config", "/etc/passwd"], "--config"),
        (["--config=/tmp/x.yaml"], "--config"),
        (["--hf-token", "SECRET-1"], "--hf-token"),
        (["--hf_token=SECRET-1"], "--hf-token"),
        (["--download-dir", "/tmp"], "--download-dir"),
        (["-pp", "2"], "--pipeline-parallel-size"),
        (["-dp=2"], "--data-parallel-size"),
        (["--pipeline_parallel_size", "2"], "--pipeline-parallel-size"),
    ],
)
def test_owned_flags_are_recognised_as_vllm_reads_them(catalog_vars: dict[str, Any], extra: list[str], flag: str) -> None:
    error = refused(catalog_vars, {"extra_args": extra})
    assert f"extra_args sets {flag}, which the planner owns" in error, error
    assert "SECRET-1" not in error  # the refusal does not echo a secret


def test_a_json_key_of_an_owned_or_read_flag_is_refused(catalog_vars: dict[str, Any]) -> None:
    assert "extra_args sets --port, which the planner owns" in refused(catalog_vars, {"extra_args": ["--port.x", "1"]})
    error = refused(catalog_vars, {"extra_args": ["--max-model-len.x", "1"]})
    assert "extra_args sets --max-model-len.x (a JSON key of --max-model-len), which the planner reads as a whole" in error


def test_prefixes_of_the_flags_the_planner_reads_are_those_flags(catalog_vars: dict[str, Any]) -> None:
    # fp8 KV cache through a prefix is still refused; an override through a prefix is still budgeted
    crash = "--kv-cache-dtype fp8 is a quantized KV cache, which crashes D3"
    assert crash in refused(catalog_vars, {"extra_args": ["--kv-cache-d", "fp8"]})
    assert crash in refused(catalog_vars, {"extra_args": ["--kv_cache_dtype=fp8"]})
    (inst,) = plan(catalog_vars, {"extra_args": ["--gpu-memory-util", "0.3", "--max_model_len=4096"]})["instances"]
    assert inst["gpu_memory_utilization"] == 0.3 and inst["max_model_len"] == 4096
    assert inst["args"].count("--gpu-memory-utilization") == 1 and "--gpu-memory-util" not in inst["args"]
    assert "-q" not in plan(catalog_vars, {"extra_args": ["-q", "fp8"]})["instances"][0]["args"]


@pytest.mark.parametrize(
    "extra",
    [["--max-num-seqs", "4\n[Service]\nExecStartPre=/bin/touch /pwned"], ["--seed\n[Service]"], ["--x", "a\rb"],
     ["--x", "tab\there"], ["--x=\x1b[2J"]],
)  # fmt: skip
def test_control_characters_in_extra_args_are_refused(catalog_vars: dict[str, Any], extra: list[str]) -> None:
    error = refused(catalog_vars, {"extra_args": extra})
    assert "contains a control character" in error and "d3_models[0].extra_args" in error


@pytest.mark.parametrize(
    ("env", "want"),
    [
        ({"A": "1\n[Service]\nExecStartPre=/bin/touch /pwned"}, "env A value '1\\n[Service]"),
        ({"A\n[Service]": "1"}, "is not a variable name"),
        ({"A\n": "1"}, "is not a variable name"),  # `$` would take the trailing newline
        ({"1A": "1"}, "is not a variable name"),
        ({"A-B": "1"}, "is not a variable name"),
        ({"": "1"}, "is not a variable name"),
        ({"A": {"x": 1}}, "is not one line of text"),
        ({"VLLM_API_KEY": "s3cret"}, "env VLLM_API_KEY would put a secret in the unit file (0644) and the plan JSON. "
                                     "Fix: remove it; use d3_units_api_key"),
        ({"HF_TOKEN": "s3cret"}, "Fix: remove it; use d3_weights_token_file"),
        ({"my_db_password": "s3cret"}, "env my_db_password looks like a secret"),
        ({"OPENAI_KEY": "s3cret"}, "env OPENAI_KEY looks like a secret"),
        ({"CLIENT_SECRET": "s3cret"}, "looks like a secret"),
    ],
)
def test_bad_env_is_refused(catalog_vars: dict[str, Any], env: dict[str, Any], want: str) -> None:
    error = refused(catalog_vars, {"env": env})
    assert want in error, error
    assert "s3cret" not in error


def test_env_that_is_not_a_mapping_and_good_env() -> None:
    assert env_problems("A=1") == [("env", "expected a mapping of NAME: value, got 'A=1'", "write `env: {NAME: value}`")]
    assert env_problems({"VLLM_LOGGING_LEVEL": "DEBUG", "_X1": 2}) == []
    assert env_problems(None) == []


@pytest.mark.parametrize("name", ["d3-mini\n", "d3-mini\n[Service]", "D3", "-x", "a" * 64, "a b"])
def test_names_are_whole_string_matches(catalog_vars: dict[str, Any], name: str) -> None:
    assert "is not a valid unit name" in refused(catalog_vars, {"name": name})


def test_a_revision_with_a_trailing_newline_is_not_pinned(catalog_vars: dict[str, Any]) -> None:
    result = plan(catalog_vars, {}, revisions={"d3-edge": SHA + "\n"}, require_revisions=True)
    assert result["instances"] == [] and "d3_model_revisions" in result["errors"][0], result["errors"]


@pytest.mark.parametrize("path", ["relative/dir", "/var/lib/d3\n[Service]", "/a/../b", "/a b", "/a/./b", ""])
def test_the_cache_directory_is_a_plain_absolute_path(catalog_vars: dict[str, Any], path: str) -> None:
    result = plan(catalog_vars, {}, hf_home=path)
    assert any(e.startswith("host l4-a: d3_hf_home: ") and ("is not a plain absolute path" in e or "control character" in e)
               for e in result["errors"]), result


@pytest.mark.parametrize(("address", "key", "allow", "ok"), [
    ("10.0.0.5", False, False, False), ("0.0.0.0", False, False, False), ("::", False, False, False),
    ("10.0.0.5", True, False, True), ("0.0.0.0", False, True, True), ("127.0.0.1", False, False, True),
    ("::1", False, False, True),
])  # fmt: skip
def test_a_network_address_needs_an_api_key(catalog_vars: dict[str, Any], address: str, key: bool, allow: bool, ok: bool) -> None:
    result = plan(catalog_vars, {}, listen_address=address, host_addresses=["10.0.0.5"], api_key_set=key,
                  allow_unauthenticated=allow)  # fmt: skip
    if ok:
        assert result["errors"] == []
    else:
        assert result["errors"] == [
            f"host l4-a: d3_listen_address: {address} lets every client that reaches this host use the models without a "
            "key (vLLM checks d3_units_api_key on /v1 only when one is set). Fix: set d3_units_api_key (Ansible Vault), "
            "listen on 127.0.0.1, or set d3_allow_unauthenticated: true to serve without a key on purpose (e.g. behind "
            "d3_firewall)"]


def test_a_clean_instance_renders_no_line_an_input_made(catalog_vars: dict[str, Any]) -> None:
    (inst,) = plan(catalog_vars, {"env": {"A": "x y"}, "extra_args": ["--max-num-seqs", "4"]})["instances"]
    lines = quadlet_container(inst, "img", "")
    assert all("\n" not in line for line in lines)
    assert 'Environment="A=x y"' in lines


def test_canonical_flag_and_input_checks() -> None:
    assert canonical_flag("--gpu_memory_utilization=0.5", KNOWN_FLAGS) == ("--gpu-memory-utilization", "0.5", "")
    assert canonical_flag("--unknown-thing", KNOWN_FLAGS) == ("--unknown-thing", None, "")
    assert canonical_flag("--max-m.a.b=1", KNOWN_FLAGS) == ("--max-model-len", "1", "a.b")  # a unique prefix
    assert canonical_flag("--max-num-b=1", KNOWN_FLAGS) == ("--max-num-batched-tokens", "1", "")
    assert canonical_flag("--max-n=1", KNOWN_FLAGS) == ("--max-n", "1", "")  # --max-num-seqs too: ambiguous
    assert canonical_flag("--max=1", KNOWN_FLAGS) == ("--max", "1", "")  # ambiguous, as in vLLM's parser
    assert canonical_flag("--enable", KNOWN_FLAGS) == ("--enable", None, "")  # ambiguous among the known: kept
    assert canonical_flag("-tp=2", KNOWN_FLAGS) == ("--tensor-parallel-size", "2", "")
    assert check("path", "/var/lib/d3") is None and check("path", "/") is None
    assert check("unit", "") is None and check("unit", "x.service\n") is not None
    assert check("secret_name", "d3-api-key") is None and check("secret_name", "a b") is not None
    assert check("seconds", "900") is None and check("seconds", "9 0") is not None
    assert check("ip", "10.0.0.1") is None and check("ip", "10.0.0.1\n") is not None
    assert check("network", "10.0.0.0/8") is None and check("network", "x") is not None
    assert check("https_url", "https://lab-apt:8443/gpgkey") is None and check("https_url", "http://x/") is not None
    assert check("url", "") is None and check("url", "ftp://x") is not None
    assert check("path", None) == "expected text, got NoneType" and check("text", True) == "expected text, got bool"
    with pytest.raises(ValueError):
        check("colour", "red")
    assert input_problems([{"name": "d3_x", "kind": "path", "value": "rel"}], "h1") == [
        "host h1: d3_x = 'rel' is not a plain absolute path (/dir/name: letters, digits, . _ - @ +; no .. or spaces). "
        "Fix the inventory."]
    assert input_problems([{"name": "d3_x", "kind": "ip", "value": "::1"}]) == []
