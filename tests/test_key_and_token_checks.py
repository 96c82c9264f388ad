"""Supply chain checks that need no lab: the NVIDIA repository key pinned by fingerprint (key.yml: exactly one
key, its fingerprint equal to nvidia_toolkit_key_fingerprint, read with gpg on the controller), the https-only
key URL (nvidia_toolkit preflight) and no Hugging Face token to an http:// endpoint (d3_weights preflight).
Each runs the role's own task file against localhost; the keys are generated here with gpg."""

from __future__ import annotations

import functools
import http.server
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def play(tmp_path: Path, tasks_from: str, role: str, extra: dict[str, object]) -> subprocess.CompletedProcess[str]:
    book = tmp_path / "play.yml"
    book.write_text(
        "- hosts: localhost\n  gather_facts: false\n  tasks:\n"
        f"    - ansible.builtin.import_role: {{name: {role}, tasks_from: {tasks_from}}}\n"
    )
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_ROLES_PATH=str(ROOT / "roles"))
    argv = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local", str(book),
            "-e", json.dumps({"ansible_python_interpreter": sys.executable, **extra})]  # fmt: skip
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=180, check=False)


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
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def key_check(tmp_path: Path, url: str, fingerprint: str) -> subprocess.CompletedProcess[str]:
    # key.yml itself only reads; the https rule is preflight.yml's (tested below), so a plain local server is fine here
    return play(tmp_path, "key.yml", "nvidia_toolkit", {"nvidia_toolkit_key_url": url, "nvidia_toolkit_key_fingerprint": fingerprint})


@pytest.mark.playbook
def test_the_pinned_key_passes(tmp_path: Path, served: str, keys: dict[str, tuple[str, str]]) -> None:
    proc = key_check(tmp_path, f"{served}/a.asc", keys["a"][1])
    assert proc.returncode == 0, proc.stdout
    assert "changed=0" in proc.stdout


@pytest.mark.playbook
def test_a_fingerprint_with_spaces_and_lower_case_passes(tmp_path: Path, served: str, keys: dict[str, tuple[str, str]]) -> None:
    fpr = keys["a"][1].lower()
    spaced = " ".join(fpr[i : i + 4] for i in range(0, 40, 4))
    assert key_check(tmp_path, f"{served}/a.asc", spaced).returncode == 0


@pytest.mark.playbook
def test_another_key_is_refused_naming_both_fingerprints(tmp_path: Path, served: str, keys: dict[str, tuple[str, str]]) -> None:
    proc = key_check(tmp_path, f"{served}/b.asc", keys["a"][1])
    assert proc.returncode != 0
    out = " ".join(proc.stdout.split())
    assert f"it has fingerprint {keys['b'][1]}, the inventory pins {keys['a'][1]}" in out
    assert "localhost:" in out and "nvidia_toolkit_key_fingerprint" in out and "nvidia_toolkit_key_url" in out


@pytest.mark.playbook
def test_two_keys_in_one_file_are_refused(tmp_path: Path, served: str, keys: dict[str, tuple[str, str]]) -> None:
    proc = key_check(tmp_path, f"{served}/both.asc", keys["a"][1])
    assert proc.returncode != 0
    assert "it holds 2 keys" in " ".join(proc.stdout.split())


@pytest.mark.playbook
def test_a_file_that_is_not_an_armored_key_is_refused(tmp_path: Path, served: str, keys: dict[str, tuple[str, str]]) -> None:
    proc = key_check(tmp_path, f"{served}/portal.html", keys["a"][1])
    assert proc.returncode != 0
    assert "did not return an ASCII-armored PGP public key" in " ".join(proc.stdout.split())


@pytest.mark.playbook
def test_an_unreachable_url_without_an_installed_key_is_refused(tmp_path: Path, served: str, keys: dict[str, tuple[str, str]]) -> None:
    proc = key_check(tmp_path, f"{served}/missing.asc", keys["a"][1])
    assert proc.returncode != 0
    assert "cannot fetch the NVIDIA repository key" in " ".join(proc.stdout.split())


PREFLIGHT_BASE = {
    "nvidia_toolkit_gpus": [{"index": 0, "uuid": "GPU-0", "name": "NVIDIA L4", "driver_version": "580.95.05"}],
}


@pytest.mark.playbook
@pytest.mark.parametrize(
    ("url", "fingerprint"),
    [
        ("http://nvidia.github.io/libnvidia-container/gpgkey", "C95B321B61E88C1809C4F759DDCAE044F796ECB0"),
        ("ftp://nvidia.github.io/gpgkey", "C95B321B61E88C1809C4F759DDCAE044F796ECB0"),
        ("https://nvidia.github.io/libnvidia-container/gpgkey\n", "C95B321B61E88C1809C4F759DDCAE044F796ECB0"),
        ("https://nvidia.github.io/libnvidia-container/gpgkey", "F796ECB0"),
        ("https://nvidia.github.io/libnvidia-container/gpgkey", "C95B321B61E88C1809C4F759DDCAE044F796ECB0\n"),
        ("https://nvidia.github.io/libnvidia-container/gpgkey", ""),
    ],
)
def test_preflight_refuses_a_key_url_that_is_not_https_or_a_bad_fingerprint(tmp_path: Path, url: str, fingerprint: str) -> None:
    proc = play(tmp_path, "preflight.yml", "nvidia_toolkit",
                {**PREFLIGHT_BASE, "nvidia_toolkit_key_url": url, "nvidia_toolkit_key_fingerprint": fingerprint})  # fmt: skip
    assert proc.returncode != 0
    out = " ".join(proc.stdout.split())
    assert "localhost: bad nvidia_toolkit input" in out and "nvidia_toolkit_key_url=" in out and "Fix the inventory" in out


@pytest.mark.playbook
def test_preflight_passes_the_defaults(tmp_path: Path) -> None:
    proc = play(tmp_path, "preflight.yml", "nvidia_toolkit", PREFLIGHT_BASE)
    assert proc.returncode == 0, proc.stdout


def test_the_default_fingerprint_is_the_contracts() -> None:
    contract = yaml.safe_load((ROOT / "tests/contracts/versions.yml").read_text())["nvidia_apt_key"]
    defaults = yaml.safe_load((ROOT / "roles/nvidia_toolkit/defaults/main.yml").read_text())
    assert defaults["nvidia_toolkit_key_fingerprint"] == contract["fingerprint"]
    assert defaults["nvidia_toolkit_key_url"] == contract["url"]


def weights_preflight(tmp_path: Path, endpoint: str, token_file: str) -> subprocess.CompletedProcess[str]:
    return play(tmp_path, "preflight.yml", "d3_weights",
                {"d3_weights_models": [], "d3_weights_hf_endpoint": endpoint, "d3_weights_token_file": token_file})  # fmt: skip


@pytest.mark.playbook
def test_a_token_to_an_http_endpoint_is_refused(tmp_path: Path) -> None:
    proc = weights_preflight(tmp_path, "http://hf-mirror.example:8090", str(tmp_path / "token"))
    assert proc.returncode != 0
    out = " ".join(proc.stdout.split())
    assert "localhost: d3_weights_token_file is set and d3_weights_hf_endpoint" in out and "clear text" in out


@pytest.mark.playbook
@pytest.mark.parametrize(("endpoint", "token"), [("http://hf-mirror.example:8090", ""), ("https://hf-mirror.example", "T"), ("", "T")])
def test_http_without_a_token_and_https_with_one_pass_that_check(tmp_path: Path, endpoint: str, token: str) -> None:
    token_file = ""
    if token:
        token_file = str(tmp_path / "token")
        Path(token_file).write_text("hf_x\n")
        os.chmod(token_file, 0o600)
    proc = weights_preflight(tmp_path, endpoint, token_file)
    out = " ".join(proc.stdout.split())
    assert "clear text" not in out
    # the token file check that follows wants it root-owned: as root here it passes
    assert proc.returncode == 0 or os.geteuid() != 0, out
