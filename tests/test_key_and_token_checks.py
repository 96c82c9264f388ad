"""Supply chain checks that need no lab: the NVIDIA repository key pinned by fingerprint (key.yml: exactly one
key, its fingerprint equal to nvidia_toolkit_key_fingerprint, read with gpg on the controller), the https-only
key URL (nvidia_toolkit preflight) and no Hugging Face token to an http:// endpoint (d3_weights preflight).
The roles' own task files run against local aliases of this machine, one alias per case, all in one run
(testkit.aliased_run); the keys are generated here with gpg. The key's parsing itself: tests/test_nvidia_toolkit_key.py."""

from __future__ import annotations

import functools
import http.server
import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from testkit import ROOT, aliased_run

pytestmark = pytest.mark.playbook  # the cases share one ansible-playbook run (tests/conftest.py enforces the marker)

PLAY = """
- hosts: key_*
  gather_facts: false
  tasks:
    - ansible.builtin.import_role: {name: nvidia_toolkit, tasks_from: key.yml}
- hosts: toolkit_*
  gather_facts: false
  tasks:
    - ansible.builtin.import_role: {name: nvidia_toolkit, tasks_from: preflight.yml}
- hosts: weights_*
  gather_facts: false
  tasks:
    - ansible.builtin.import_role: {name: d3_weights, tasks_from: preflight.yml}
"""


def gen_key(home: Path, uid: str) -> tuple[str, str]:
    """A fresh ed25519 key: (armored public key, fingerprint)."""
    home.mkdir(mode=0o700)
    gpg = ["gpg", "--homedir", str(home), "--batch", "--pinentry-mode", "loopback", "--passphrase", ""]
    subprocess.run([*gpg, "--quick-gen-key", uid, "ed25519", "sign", "never"], check=True, capture_output=True)
    cols = subprocess.run([*gpg, "--with-colons", "--list-keys", uid], check=True, capture_output=True, text=True).stdout
    fpr = next(line.split(":")[9] for line in cols.splitlines() if line.startswith("fpr:"))
    armored = subprocess.run([*gpg, "--armor", "--export", fpr], check=True, capture_output=True, text=True).stdout
    return armored, fpr


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, str]]:
    base = tmp_path_factory.mktemp("keys")
    return {name: gen_key(base / name, f"d3-fleet test key {name} <{name}@d3-fleet.invalid>") for name in ("a", "b")}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, keys: dict[str, tuple[str, str]]) -> Iterator[str]:
    """A local web server with: a.asc, b.asc, both.asc (two keys in one file), portal.html (not a key)."""
    docroot = tmp_path_factory.mktemp("www")
    (docroot / "a.asc").write_text(keys["a"][0])
    (docroot / "b.asc").write_text(keys["b"][0])
    (docroot / "both.asc").write_text(keys["a"][0] + keys["b"][0])
    (docroot / "portal.html").write_text("<html>sign in to the proxy</html>")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(docroot))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


PREFLIGHT_BASE = {
    "nvidia_toolkit_gpus": [{"index": 0, "uuid": "GPU-0", "name": "NVIDIA L4", "driver_version": "580.95.05"}],
}
GOOD_FPR = "C95B321B61E88C1809C4F759DDCAE044F796ECB0"
GOOD_URL = "https://nvidia.github.io/libnvidia-container/gpgkey"
BAD_KEY_INPUTS = [
    ("http://nvidia.github.io/libnvidia-container/gpgkey", GOOD_FPR),
    ("ftp://nvidia.github.io/gpgkey", GOOD_FPR),
    (GOOD_URL + "\n", GOOD_FPR),
    (GOOD_URL, "F796ECB0"),
    (GOOD_URL, GOOD_FPR + "\n"),
    (GOOD_URL, ""),
]
TOKEN_PASSES = [("http://hf-mirror.example:8090", ""), ("https://hf-mirror.example", "T"), ("", "T")]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory, served: str, keys: dict[str, tuple[str, str]]) -> dict[str, dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("key-and-token")
    token = tmp / "token"
    token.write_text("hf_x\n")
    os.chmod(token, 0o600)
    fpr = keys["a"][1].lower()
    key = {"key_pinned": (f"{served}/a.asc", keys["a"][1]),
           "key_spaced": (f"{served}/a.asc", " ".join(fpr[i : i + 4] for i in range(0, 40, 4))),
           "key_other": (f"{served}/b.asc", keys["a"][1]),
           "key_two": (f"{served}/both.asc", keys["a"][1]),
           "key_portal": (f"{served}/portal.html", keys["a"][1]),
           "key_missing": (f"{served}/missing.asc", keys["a"][1])}  # fmt: skip
    # key.yml itself only reads; the https rule is preflight.yml's (the toolkit_ aliases), so a plain local server is fine
    hosts = {a: {"nvidia_toolkit_key_url": u, "nvidia_toolkit_key_fingerprint": f} for a, (u, f) in key.items()}
    hosts |= {f"toolkit_bad_{i}": {**PREFLIGHT_BASE, "nvidia_toolkit_key_url": u, "nvidia_toolkit_key_fingerprint": f}
              for i, (u, f) in enumerate(BAD_KEY_INPUTS)}  # fmt: skip
    hosts["toolkit_defaults"] = PREFLIGHT_BASE
    weights = {"d3_weights_models": []}
    hosts["weights_token_http"] = {**weights, "d3_weights_hf_endpoint": "http://hf-mirror.example:8090",
                                   "d3_weights_token_file": str(token)}  # fmt: skip
    hosts |= {f"weights_pass_{i}": {**weights, "d3_weights_hf_endpoint": e, "d3_weights_token_file": str(token) if t else ""}
              for i, (e, t) in enumerate(TOKEN_PASSES)}  # fmt: skip
    return aliased_run(tmp, PLAY, hosts)


def text(got: dict[str, Any]) -> str:
    return " ".join(got["text"].split())


def test_the_pinned_key_passes(results: dict[str, dict[str, Any]]) -> None:
    assert results["key_pinned"]["failed"] == [], text(results["key_pinned"])
    assert results["key_pinned"]["changed"] == []


def test_a_fingerprint_with_spaces_and_lower_case_passes(results: dict[str, dict[str, Any]]) -> None:
    assert results["key_spaced"]["failed"] == [], text(results["key_spaced"])


def test_another_key_is_refused_naming_both_fingerprints(results: dict[str, dict[str, Any]], keys: dict[str, tuple[str, str]]) -> None:
    got = results["key_other"]
    assert got["failed"], got
    out = text(got)
    assert f"it has fingerprint {keys['b'][1]}, the inventory pins {keys['a'][1]}" in out
    assert "key_other:" in out and "nvidia_toolkit_key_fingerprint" in out and "nvidia_toolkit_key_url" in out


def test_two_keys_in_one_file_are_refused(results: dict[str, dict[str, Any]]) -> None:
    assert results["key_two"]["failed"] and "it holds 2 keys" in text(results["key_two"])


def test_a_file_that_is_not_an_armored_key_is_refused(results: dict[str, dict[str, Any]]) -> None:
    got = results["key_portal"]
    assert got["failed"] and "did not return an ASCII-armored PGP public key" in text(got)


def test_an_unreachable_url_without_an_installed_key_is_refused(results: dict[str, dict[str, Any]]) -> None:
    got = results["key_missing"]
    assert got["failed"] and "cannot fetch the NVIDIA repository key" in text(got)


@pytest.mark.parametrize("case", range(len(BAD_KEY_INPUTS)))
def test_preflight_refuses_a_key_url_that_is_not_https_or_a_bad_fingerprint(results: dict[str, dict[str, Any]], case: int) -> None:
    got = results[f"toolkit_bad_{case}"]
    assert got["failed"], got
    out = text(got)
    assert f"toolkit_bad_{case}: bad nvidia_toolkit input" in out and "nvidia_toolkit_key_url=" in out and "Fix the inventory" in out


def test_preflight_passes_the_defaults(results: dict[str, dict[str, Any]]) -> None:
    assert results["toolkit_defaults"]["failed"] == [], text(results["toolkit_defaults"])


def test_the_default_fingerprint_is_the_contracts() -> None:
    contract = yaml.safe_load((ROOT / "tests/contracts/versions.yml").read_text())["nvidia_apt_key"]
    defaults = yaml.safe_load((ROOT / "roles/nvidia_toolkit/defaults/main.yml").read_text())
    assert defaults["nvidia_toolkit_key_fingerprint"] == contract["fingerprint"]
    assert defaults["nvidia_toolkit_key_url"] == contract["url"]


def test_a_token_to_an_http_endpoint_is_refused(results: dict[str, dict[str, Any]]) -> None:
    got = results["weights_token_http"]
    assert got["failed"], got
    assert "weights_token_http: d3_weights_token_file is set and d3_weights_hf_endpoint" in text(got) and "clear text" in text(got)


@pytest.mark.parametrize("case", range(len(TOKEN_PASSES)))
def test_http_without_a_token_and_https_with_one_pass_that_check(results: dict[str, dict[str, Any]], case: int) -> None:
    got = results[f"weights_pass_{case}"]
    assert "clear text" not in text(got)
    # the token file check that follows wants it root-owned: as root here it passes
    assert got["failed"] == [] or os.geteuid() != 0, text(got)
