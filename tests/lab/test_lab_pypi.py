"""Tests for the LAB STAND-IN PyPI (lab/roles/lab_pypi): wheelhouse + PEP 503 simple index for the lab hosts.

The role runs for real (ansible-playbook, real `pip download` from PyPI into a temporary cache and root, so a
running `make lab` is not disturbed); a throwaway `python3 -m http.server` on a free loopback port serves it. The lab
hosts of both Debian releases install huggingface_hub from the lab's index (this role's output in `make lab`) with
pip in the session's converge (the production role d3_weights, `d3_weights_pip_env` pointing at the lab index).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml
from labkit import (
    ANSIBLE_ENV,
    LAB_GROUP,
    LAB_INVENTORY,
    LAB_STATE,
    ROOT,
    VENV_BIN,
    Run,
    free_port,
    host_per_suite,
    on_host,
    recap_changed,
    sha256,
    wait_for_port,
)

pytestmark = pytest.mark.lab

ROLE = ROOT / "lab" / "roles" / "lab_pypi"
SCRIPT = ROLE / "files" / "lab_pypi_index.py"
DEFAULTS = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
PINNED = ROOT / "roles" / "d3_weights" / "files" / "hub-requirements.txt"  # lab_pypi_requirements_file's default
HOST_PYTHON = {"trixie": "3.13", "bookworm": "3.11"}

PLAYBOOK = """\
- name: Lab PyPI (test)
  hosts: localhost
  connection: local
  gather_facts: false
  roles:
    - lab_pypi
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
               "-e", f"lab_pypi_check_url={idx.url}", "-e", f"lab_pypi_requirements_file={PINNED}"]
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
            *[f"--platform={p}" for p in DEFAULTS["lab_pypi_platforms"]], "--requirement", str(PINNED)]

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


def test_lab_hosts_pip_installed_huggingface_hub_from_the_lab_index(converged: list[str], converge_run: Run) -> None:
    """The session's converge installed huggingface_hub with pip (d3_weights: --require-hashes, binary wheels only) from
    the lab's index (this role's output in `make lab`, served by the lab apt server, whose log names every file it
    served) on a Debian 13 (CPython 3.13) and a Debian 12 (CPython 3.11) host: the wheels of both Pythons work."""
    group_vars = yaml.safe_load((LAB_INVENTORY / "group_vars" / LAB_GROUP / "lab.yml").read_text())
    index = group_vars["d3_weights_pip_env"]["PIP_INDEX_URL"]
    assert index == "http://lab-apt:8081/pypi/simple/"
    # this session's installs (pip's own output), not only the inventory's setting: every host whose venv the converge
    # installed (all on a fresh lab; at least the host test_lab_hosts.py re-creates before it) looked in the lab index
    task = "Install huggingface_hub into its virtualenv (pip --require-hashes)"
    installed = {d["host"]: d["res"] for d in converge_run.results() if d["task"] == task}
    assert installed, "no host installed huggingface_hub in this session's converge (a fresh lab, or with test_lab_hosts.py)"
    for host, res in installed.items():
        assert f"Looking in indexes: {index}" in res.get("stdout", ""), (host, res.get("stdout"))
    for suite, host in host_per_suite(converged).items():
        script = "import sys, hf_xet, yaml, huggingface_hub; print('%d.%d' % sys.version_info[:2], huggingface_hub.__version__)"
        assert on_host(host, f'/opt/d3/hf/bin/python -c "{script}"').split() == [HOST_PYTHON[suite], "2.4.0"], host
        assert re.search(r"version:\s*2\.4\.0", on_host(host, "/opt/d3/hf/bin/hf version")), host
    # (no other version: every wheel the lab index serves is hash-pinned, test_supply_chain.py)
    served = re.findall(r'"GET /pypi/files/([^ ]+) HTTP/1.1" 200', (LAB_STATE / "log" / "lab-apt.log").read_text())
    assert "huggingface_hub-2.4.0-py3-none-any.whl" in served, served[-20:]
    for py in ("cp311", "cp313"):  # PyYAML is compiled per CPython version: each host fetched its own
        assert any(f.startswith("pyyaml-") and f"-{py}-{py}-" in f for f in served), (py, served[-20:])
