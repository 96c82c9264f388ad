"""Tests for the LAB STAND-IN PyPI (lab/roles/lab_pypi): wheelhouse + PEP 503 simple index for the lab hosts.

The role runs for real (ansible-playbook, real `pip download` from PyPI into a temporary cache and root, so a
running `make lab` is not disturbed); a throwaway `python3 -m http.server` on a free loopback port serves it, and
throwaway containers of both lab host images (`pypitest-*`) install huggingface_hub from it with pip, the way the
production role d3_weights does with `d3_weights_pip_env` pointing at the lab index.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml
from labkit import ANSIBLE_ENV, ROOT, VENV_BIN, free_port, recap_changed, sha256, wait_for_port

pytestmark = pytest.mark.lab

ROLE = ROOT / "lab" / "roles" / "lab_pypi"
SCRIPT = ROLE / "files" / "lab_pypi_index.py"
DEFAULTS = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
HOST_IMAGES = {"trixie": "localhost/d3-lab-host-trixie:latest", "bookworm": "localhost/d3-lab-host-bookworm:latest"}
HOST_PYTHON = {"trixie": "3.13", "bookworm": "3.11"}

PLAYBOOK = """\
- name: Lab PyPI (test)
  hosts: localhost
  connection: local
  gather_facts: false
  roles:
    - lab_pypi
"""

# Inside a lab host: python3-venv from the Debian archive (reachable), then pip from the lab index only.
IN_HOST = r"""
set -eu
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends python3-venv >/dev/null 2>&1
python3 -m venv /opt/hf
PIP_INDEX_URL="$INDEX" PIP_TRUSTED_HOST=lab-apt /opt/hf/bin/pip install --disable-pip-version-check huggingface_hub==2.4.0
/opt/hf/bin/hf version
/opt/hf/bin/python -c 'import sys, hf_xet, yaml, huggingface_hub as h; print("PYVER", sys.version.split()[0], h.__version__)'
if PIP_INDEX_URL="$INDEX" PIP_TRUSTED_HOST=lab-apt /opt/hf/bin/pip download -q -d /tmp/x --no-deps huggingface_hub==2.3.0; then
  echo "UNEXPECTED: 2.3.0 found"; exit 1
fi
"""


class Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            d = dict(attrs)
            self.links.append((d.get("href") or "", d))


def links(text: str) -> list[tuple[str, dict[str, str | None]]]:
    p = Links()
    p.feed(text)
    return p.links


@dataclass
class Index:
    root: Path  # served as http://127.0.0.1:<port>/pypi/
    cache: Path
    port: int
    runs: list[str]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/pypi/simple/"


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Index]:
    base = tmp_path_factory.mktemp("labpypi")
    (base / "srv").mkdir()
    (base / "pypi.yml").write_text(PLAYBOOK)
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                               "--directory", str(base / "srv")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        idx = Index(base / "srv" / "pypi", base / "cache", port, [])
        wait_for_port(port, timeout=10, what="test http.server")
        cmd = [str(VENV_BIN / "ansible-playbook"), "-i", "localhost,", str(base / "pypi.yml"),
               "-e", f"ansible_python_interpreter={sys.executable}", "-e", f"lab_pypi_pip={VENV_BIN / 'pip'}",
               "-e", f"lab_pypi_cache_dir={idx.cache}", "-e", f"lab_pypi_root={idx.root}",
               "-e", f"lab_pypi_check_url={idx.url}"]
        for _ in range(2):
            out = subprocess.run(cmd, cwd=ROOT, env=ANSIBLE_ENV, capture_output=True, text=True, timeout=600)
            assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
            idx.runs.append(out.stdout)
        yield idx
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_role_downloads_both_pythons_once(index: Index) -> None:
    assert recap_changed(index.runs[0]) >= 1
    assert recap_changed(index.runs[1]) == 0, index.runs[1][-3000:]  # cached: no download, no rewrite
    dirs = sorted(p.name for p in index.cache.iterdir())
    assert [d.split("-")[0] for d in dirs] == ["cp311", "cp313"], dirs
    for d in dirs:
        assert (index.cache / d / ".complete").is_file()
    files = sorted(p.name for p in (index.root / "files").iterdir())
    assert "huggingface_hub-2.4.0-py3-none-any.whl" in files
    assert any(f.startswith("hf_xet-") and "manylinux" in f and "x86_64" in f for f in files), files
    for py in ("cp311", "cp313"):  # PyYAML is compiled per CPython version
        assert any(f.startswith("pyyaml-") and f"-{py}-{py}-" in f for f in files), files
    assert not [f for f in files if not f.endswith(".whl")], files  # binary wheels only, no sdist


def test_simple_index_is_pep503_with_matching_hashes(index: Index) -> None:
    simple, files = index.root / "simple", index.root / "files"
    projects = [href.rstrip("/") for href, _ in links((simple / "index.html").read_text())]
    assert "huggingface-hub" in projects and "hf-xet" in projects and "typing-extensions" in projects
    assert all(re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", p) for p in projects), projects  # normalized names
    linked: list[str] = []
    for project in projects:
        served = urllib.request.urlopen(f"{index.url}{project}/", timeout=10).read().decode()
        assert served == (simple / project / "index.html").read_text()
        for href, attrs in links(served):
            m = re.fullmatch(r"\.\./\.\./files/([^#/]+)#sha256=([0-9a-f]{64})", href)
            assert m, href
            wheel = files / m.group(1)
            assert sha256(wheel) == m.group(2), wheel
            assert re.sub(r"[-_.]+", "-", wheel.name.split("-")[0]).lower() == project
            assert attrs.get("data-requires-python", "").startswith(">="), attrs  # type: ignore[union-attr]
            cached = list(index.cache.glob(f"*/{wheel.name}"))
            assert cached and any(os.path.samefile(c, wheel) for c in cached)  # hard link, no copy
            linked.append(wheel.name)
    assert sorted(linked) == sorted(p.name for p in files.iterdir())  # every wheel linked exactly once


def test_index_script_skips_cached_downloads_repairs_and_prunes(index: Index, tmp_path: Path) -> None:
    argv = [sys.executable, str(SCRIPT), "--pip", "/nonexistent/pip",  # a download attempt would fail
            "--cache", str(index.cache), "--root", str(tmp_path / "pypi"),
            *[f"--python-version={v}" for v in DEFAULTS["lab_pypi_python_versions"]],
            *[f"--platform={p}" for p in DEFAULTS["lab_pypi_platforms"]], *DEFAULTS["lab_pypi_requirements"]]

    def run() -> dict[str, object]:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr[-2000:]
        return json.loads(out.stdout)

    first = run()
    assert first["changed"] is True and first["downloaded"] == []
    built = {p.relative_to(tmp_path): p.read_bytes() for p in (tmp_path / "pypi").rglob("*") if p.is_file()}
    assert built == {p.relative_to(index.root.parent): p.read_bytes() for p in index.root.rglob("*") if p.is_file()}
    victim = tmp_path / "pypi" / "files" / "huggingface_hub-2.4.0-py3-none-any.whl"
    victim.unlink()
    (tmp_path / "pypi" / "files" / "stale-1.0-py3-none-any.whl").write_bytes(b"x")
    (tmp_path / "pypi" / "simple" / "stale").mkdir()
    assert run()["changed"] is True
    assert victim.is_file() and not (tmp_path / "pypi" / "files" / "stale-1.0-py3-none-any.whl").exists()
    assert not (tmp_path / "pypi" / "simple" / "stale").exists()
    assert run()["changed"] is False


def _install_in_host(dist: str, index: Index) -> tuple[str, subprocess.CompletedProcess[str], float]:
    name = f"pypitest-{dist}-{os.getpid()}"
    t0 = time.monotonic()
    try:
        out = subprocess.run(
            ["podman", "run", "--rm", "--name", name, "--network", "slirp4netns:allow_host_loopback=true",
             "--add-host", "lab-apt:10.0.2.2", "-e", f"INDEX=http://lab-apt:{index.port}/pypi/simple/",
             HOST_IMAGES[dist], "bash", "-c", IN_HOST],
            capture_output=True, text=True, timeout=300)
    finally:
        subprocess.run(["podman", "rm", "-f", "--ignore", name], capture_output=True)
    return dist, out, time.monotonic() - t0


def test_lab_hosts_pip_install_huggingface_hub_from_the_index(index: Index) -> None:
    assert shutil.which("podman"), "the lab needs podman"
    missing = [img for img in HOST_IMAGES.values()
               if subprocess.run(["podman", "image", "exists", img], capture_output=True).returncode != 0]
    assert not missing, f"lab host images missing (make lab-images): {missing}"
    with ThreadPoolExecutor(max_workers=2) as pool:  # ~50 s for both in parallel (apt ~20-30 s, pip ~20 s)
        results = list(pool.map(lambda d: _install_in_host(d, index), HOST_IMAGES))
    for dist, out, _seconds in results:
        text = out.stdout + out.stderr
        assert out.returncode == 0, f"{dist}: {text[-3000:]}"
        assert f"Looking in indexes: http://lab-apt:{index.port}/pypi/simple/" in text, f"{dist}: {text[-3000:]}"
        assert "Successfully installed" in text and "huggingface_hub-2.4.0" in text, f"{dist}: {text[-3000:]}"
        assert re.search(r"version:\s*2\.4\.0", text), f"{dist}: {text[-3000:]}"
        m = re.search(r"^PYVER (\d+\.\d+)\.\d+ 2\.4\.0$", out.stdout, re.M)
        assert m and m.group(1) == HOST_PYTHON[dist], f"{dist}: {out.stdout[-2000:]}"
