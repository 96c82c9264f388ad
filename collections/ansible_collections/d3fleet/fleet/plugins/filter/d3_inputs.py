"""The one validation layer for inventory values that reach a unit file, a command line or a shell.

Every check is a whole-string match (``\\A...\\Z``: ``$`` would accept a trailing newline) and refuses control
characters (a newline in a unit file value starts a new line, e.g. ``[Service]`` / ``ExecStartPre=``: a root
command). The planner (d3_planner.py) uses these for ``d3_models`` (names, ``env``, ``extra_args``) and its
options; the roles' asserts use the ``d3_input_problems`` filter for theirs (paths, unit names, secret names, ...).

vLLM's flags are recognised the way vLLM's own parser reads them (vllm-project/vllm
``vllm/utils/argparse_utils.py``, ``FlexibleArgumentParser.parse_args``: underscores in a flag's name become
dashes, ``--flag=value`` splits at the first ``=``, ``--flag.key value`` becomes a JSON value of ``--flag``,
``--config FILE`` pulls further flags from a YAML file; it keeps argparse's ``allow_abbrev``, so a unique prefix
such as ``--hos`` is ``--host``), with the short aliases of ``vllm/engine/arg_utils.py`` (``-tp``, ``-q``, ``-pp``, ``-dp``).
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any

CONTROL = re.compile(r"[\x00-\x1f\x7f]")
ENV_KEY = re.compile(r"\A[A-Za-z_][A-Za-z0-9_]*\Z")
# Environment names that carry secrets: they would sit in a 0644 unit file and in the plan JSON.
SECRET_ENV = {
    "VLLM_API_KEY": "d3_units_api_key (kept in Ansible Vault; it reaches vLLM from a podman secret)",
    "HF_TOKEN": "d3_weights_token_file (a root-only file on the host; the units need no token: weights are cached)",
}
SECRET_WORDS = ("TOKEN", "SECRET", "PASSWORD", "KEY")
PLAIN_PATH = re.compile(r"\A(/[A-Za-z0-9_.@+-]+)+/?\Z|\A/\Z")
UNIT_NAME = re.compile(r"\A[A-Za-z0-9@_.:-]+\.service\Z")
SECRET_NAME = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9_.-]{0,252}\Z")
WHOLE_SECONDS = re.compile(r"\A[0-9]{1,9}\Z")
# vllm/engine/arg_utils.py (EngineArgs.add_cli_args): the short names of the flags the planner reads or owns (those of
# the flags it refuses as not modelled, -O, -cc and -sc, are d3_planner.UNMODELLED_SHORT's, kept as the user spelled them)
SHORT_ALIASES = {"-tp": "--tensor-parallel-size", "-q": "--quantization", "-pp": "--pipeline-parallel-size",
                 "-dp": "--data-parallel-size"}  # fmt: skip


def control_free(value: Any) -> bool:
    return not CONTROL.search(str(value))


def shown(value: Any) -> str:
    """A value as a message shows it: repr, so a newline or an escape is visible, cut at 80 characters."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def canonical_flag(token: str, known: list[str] | tuple[str, ...] | set[str]) -> tuple[str, str | None, str]:
    """(flag, value given with '=' or None, JSON key after '.' or '') as vLLM reads ``token``; the flag is one of
    ``known`` when the token names it exactly or by a unique prefix, else the token's normalised name."""
    key, value = (token.split("=", 1)[0], token.split("=", 1)[1]) if "=" in token else (token, None)
    if key in SHORT_ALIASES:
        return SHORT_ALIASES[key], value, ""
    if not key.startswith("--"):
        return key, value, ""
    name, _, sub = key[2:].partition(".")
    flag = "--" + name.replace("_", "-")
    if len(flag) > 2:  # a known flag matches itself: alone it stays, with longer ones it is kept as given (the same)
        matches = [k for k in known if k.startswith(flag)]
        if len(matches) == 1:
            flag = matches[0]
    return flag, value, sub


def env_problems(env: Any) -> list[tuple[str, str, str]]:
    """(what, problem, fix) for each bad ``env`` entry: names as POSIX shells and systemd take them, no control
    characters in values, no secrets."""
    if env is None:
        return []
    if not isinstance(env, dict):
        return [("env", f"expected a mapping of NAME: value, got {shown(env)}", "write `env: {NAME: value}`")]
    problems = []
    for key, value in env.items():
        name = str(key)
        if not ENV_KEY.match(name):
            problems.append((f"env key {shown(name)}", "is not a variable name ([A-Za-z_][A-Za-z0-9_]*)", "rename it"))
            continue
        if name in SECRET_ENV:
            problems.append((f"env {name}", "would put a secret in the unit file (0644) and the plan JSON",
                             f"remove it; use {SECRET_ENV[name]}"))  # fmt: skip
        elif any(word in name.upper() for word in SECRET_WORDS):
            problems.append((f"env {name}", "looks like a secret (TOKEN/SECRET/PASSWORD/KEY): it would sit in the "
                             "unit file (0644) and the plan JSON",
                             "remove it; the API key is d3_units_api_key, the Hub token d3_weights_token_file"))  # fmt: skip
        if isinstance(value, (dict, list)) or value is None or not control_free(value):
            problems.append((f"env {name}", f"value {shown(value)} is not one line of text (no control characters)",
                             "give a plain string"))  # fmt: skip
    return problems


def check(kind: str, value: Any) -> str | None:
    """None when ``value`` is a valid ``kind``, else what is wrong with it."""
    if not isinstance(value, (str, int, float)) or isinstance(value, bool):
        return f"expected text, got {type(value).__name__}"
    text = str(value)
    if not control_free(text):
        return "contains a control character (newline, tab, escape...)"
    if kind == "path":
        if not PLAIN_PATH.match(text) or "/../" in text + "/" or "/./" in text + "/":
            return "is not a plain absolute path (/dir/name: letters, digits, . _ - @ +; no .. or spaces)"
    elif kind == "unit":
        if text and not UNIT_NAME.match(text):
            return 'is not a systemd service name (name.service) or ""'
    elif kind == "secret_name":
        if not SECRET_NAME.match(text):
            return "is not a podman secret name (letters, digits, . _ -; starting with a letter or digit)"
    elif kind == "seconds":
        if not WHOLE_SECONDS.match(text):
            return "is not a whole number of seconds"
    elif kind == "ip":
        try:
            ipaddress.ip_address(text)
        except ValueError:
            return "is not an IP address"
    elif kind == "network":
        try:
            ipaddress.ip_network(text, strict=False)
        except ValueError:
            return "is not an IP address or network (CIDR)"
    elif kind == "https_url":
        if not re.match(r"\Ahttps://[A-Za-z0-9.-]+(:[0-9]{1,5})?(/[A-Za-z0-9._~%/+@=-]*)?\Z", text):
            return "is not an https:// URL"
    elif kind == "url":
        if text and not re.match(r"\Ahttps?://[A-Za-z0-9.-]+(:[0-9]{1,5})?(/[A-Za-z0-9._~%/+@=-]*)?\Z", text):
            return 'is not an http(s):// URL or ""'
    elif kind == "text":
        pass
    else:
        raise ValueError(f"unknown input kind {kind!r}")
    return None


def input_problems(checks: list[dict[str, Any]], host: str = "") -> list[str]:
    """Messages for each ``{name, kind, value}`` that fails its check: ``host H: NAME = VALUE KIND-PROBLEM``."""
    out = []
    for c in checks:
        problem = check(str(c["kind"]), c.get("value"))
        if problem:
            out.append(f"host {host}: {c['name']} = {shown(c.get('value'))} {problem}. Fix the inventory."
                       if host else f"{c['name']} = {shown(c.get('value'))} {problem}. Fix the inventory.")  # fmt: skip
    return out


class FilterModule:
    """Ansible filters: d3_input_problems."""

    def filters(self) -> dict[str, Any]:
        return {"d3_input_problems": input_problems}
