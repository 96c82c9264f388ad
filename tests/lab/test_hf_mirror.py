"""Tests for the LAB STAND-IN Hugging Face mirror: lab/hf/build_repos.py and lab/roles/lab_hf_mirror.

The lab tests start the real mirror with the real role (ansible-playbook, on a free loopback port and a temporary
state directory, so a running `make lab` is not disturbed) and download with the real `hf` CLI /
huggingface_hub, exactly as the production role will on a fleet host.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from labkit import ANSIBLE_ENV, ROOT, VENV_BIN, free_port, recap_changed

BUILDER = ROOT / "lab" / "hf" / "build_repos.py"
MODEL_IDS = [f"vllm-sr/{n}" for n in ("d3", "d3-flash", "d3-mini", "d3-nano", "d3-lite", "d3-edge")]
SHA = re.compile(r"^[0-9a-f]{40}$")
PROBE_IMAGE = "localhost/d3-lab-hf-probe:latest"  # lab stand-in: busybox wget only

PLAYBOOK = """\
- name: Lab HF mirror (test)
  hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Run the lab_hf_mirror role
      ansible.builtin.include_role:
        name: lab_hf_mirror
        tasks_from: "{{ entry | default('main') }}"
"""


def load_builder() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_repos", BUILDER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["build_repos"] = module
    spec.loader.exec_module(module)
    return module


def run_builder(mirrors: Path, *extra: str) -> dict[str, object]:
    out = subprocess.run([sys.executable, str(BUILDER), "--mirrors", str(mirrors), *extra],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def parse_safetensors(blob: bytes) -> tuple[dict[str, object], bytes]:
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    return header, blob[8 + n:]


# --- the builder (needs only git) -----------------------------------------------------------------


def test_builder_commits_are_deterministic_and_idempotent(tmp_path: Path) -> None:
    first = run_builder(tmp_path / "a", "--revisions-file", str(tmp_path / "a.json"))
    second = run_builder(tmp_path / "b", "--no-revisions-file")  # other dir, other second: same SHAs
    assert first["changed"] is True
    assert first["revisions"] == second["revisions"]
    assert first["previous"] == second["previous"]
    revisions = first["revisions"]
    assert isinstance(revisions, dict)
    b = load_builder()
    assert sorted(revisions) == sorted(f"{b.ORG}/{n}" for n in [*b.MODELS, *b.VARIANTS])
    assert set(MODEL_IDS) <= set(revisions)
    assert all(SHA.match(s) for s in revisions.values())
    assert json.loads((tmp_path / "a.json").read_text()) == revisions
    mtime = (tmp_path / "a.json").stat().st_mtime_ns
    again = run_builder(tmp_path / "a", "--revisions-file", str(tmp_path / "a.json"))
    assert again["changed"] is False
    assert (tmp_path / "a.json").stat().st_mtime_ns == mtime
    log = subprocess.run(["git", "--git-dir", str(tmp_path / "a/models/vllm-sr/d3"), "log", "--format=%H %P",
                          "main"], capture_output=True, text=True, check=True).stdout.split("\n")
    assert log[0].split() == [revisions["vllm-sr/d3"], first["previous"]["vllm-sr/d3"]]  # type: ignore[index]


def test_config_json_is_the_architectures_fixture_and_old_pins_stay_valid(tmp_path: Path) -> None:
    """The pinned release serves each size's config.json from tests/contracts/d3-architectures.json (a variant adds
    its quantization_config); v3.1.0 keeps the commit the lab pinned before v3.2.0 existed."""
    b = load_builder()
    fixture = json.loads((ROOT / "tests/contracts/d3-architectures.json").read_text())["models"]
    for name in b.MODELS:
        config = b.config_json(name)
        assert {k: v for k, v in config.items() if k != "_lab_stand_in"} == fixture[name]["config"]
        assert "lab stand-in" in str(config["_lab_stand_in"]).lower()
        assert b.config_json(name, "v3.1.0") == b.legacy_config_json(name)
    fp8 = b.config_json("d3-FP8")
    assert fp8["text_config"] == fixture["d3"]["config"]["text_config"]
    assert fp8["quantization_config"]["quant_method"] == "compressed-tensors"
    previous = run_builder(tmp_path, "--no-revisions-file")["previous"]
    assert previous["vllm-sr/d3"] == "bad4ad607ceccfbd71c224332c1df24699ae7a78"  # type: ignore[index]


def test_safetensors_is_real_and_carries_bf16_size() -> None:
    b = load_builder()
    for name, spec in b.MODELS.items():
        header, data = parse_safetensors(b.safetensors_file(name, "v3.1.0", 1))
        meta = header.pop("__metadata__")
        assert meta["format"] == "pt"
        assert int(meta["d3_lab_simulated_bytes"]) == spec.params * 2
        ((tensor, info),) = header.items()
        assert info["dtype"] == "BF16"
        start, end = info["data_offsets"]
        assert end - start == 2 * info["shape"][0] * info["shape"][1] == len(data)
        assert tensor
    assert b.simulated_bytes("d3") == 52_180_000_000  # "d3 BF16 52.2 GB"


# --- the running mirror (lab) ---------------------------------------------------------------------


class Mirror:
    def __init__(self, state: Path, port: int, playbook: Path) -> None:
        self.state = state
        self.port = port
        self.playbook = playbook
        self.endpoint = f"http://127.0.0.1:{port}"
        self.log = state / "log" / "hf-mirror.log"

    def playbook_run(self, entry: str = "main") -> str:
        cmd = [str(VENV_BIN / "ansible-playbook"), "-i", "localhost,", str(self.playbook),
               "-e", f"ansible_python_interpreter={sys.executable}", "-e", f"entry={entry}",
               "-e", f"lab_hf_mirror_state_dir={self.state}", "-e", f"lab_hf_mirror_port={self.port}",
               "-e", f"lab_hf_mirror_venv={Path(sys.prefix)}"]
        out = subprocess.run(cmd, cwd=ROOT, env=ANSIBLE_ENV, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
        return out.stdout

    def revisions(self) -> dict[str, str]:
        return json.loads((self.state / "hf-revisions.json").read_text())

    def pid(self) -> int:
        return int((self.state / "run" / "hf-mirror.pid").read_text())

    def resolve_requests(self, repo: str) -> int:
        return self.log.read_text().count(f" /{repo}/resolve/")


@pytest.fixture(scope="module")
def mirror(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mirror]:
    root = tmp_path_factory.mktemp("hfmirror")
    (root / "hf.yml").write_text(PLAYBOOK)
    m = Mirror(root / "state", free_port(), root / "hf.yml")
    m.playbook_run()
    try:
        yield m
    finally:
        pid = m.pid()
        m.playbook_run("down")
        assert not Path(f"/proc/{pid}").exists(), "lab HF mirror still running after tasks/down.yml"


def hf(mirror: Mirror, home: Path, *args: str, offline: bool = False) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_ENDPOINT": mirror.endpoint, "HF_HOME": str(home), "HF_HUB_DISABLE_TELEMETRY": "1",
           "HF_HUB_OFFLINE": "1" if offline else "0", "NO_COLOR": "1"}
    env.pop("HF_TOKEN", None)
    return subprocess.run([str(VENV_BIN / "hf"), *args], env=env, capture_output=True, text=True, timeout=120)


def snapshot(home: Path, repo: str, sha: str) -> Path:
    return home / "hub" / f"models--{repo.replace('/', '--')}" / "snapshots" / sha


@pytest.mark.lab
def test_role_rerun_changes_nothing_and_keeps_the_process(mirror: Mirror) -> None:
    pid = mirror.pid()
    assert recap_changed(mirror.playbook_run()) == 0
    assert mirror.pid() == pid
    assert Path(f"/proc/{pid}").exists()


@pytest.mark.lab
def test_mirror_listens_on_loopback_only(mirror: Mirror) -> None:
    listening = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        addr, port = local.split(":")
        if state == "0A" and int(port, 16) == mirror.port:
            listening.add(addr)
    assert listening == {"0100007F"}  # 127.0.0.1, not 0.0.0.0


@pytest.mark.lab
@pytest.mark.parametrize("repo", MODEL_IDS)
def test_download_by_pinned_sha(mirror: Mirror, tmp_path: Path, repo: str) -> None:
    sha = mirror.revisions()[repo]
    out = hf(mirror, tmp_path, "download", repo, "--revision", sha, "--quiet")
    assert out.returncode == 0, out.stderr
    snap = snapshot(tmp_path, repo, sha)
    assert out.stdout.strip().endswith(str(snap))
    assert sorted(p.name for p in snap.iterdir()) == [
        "README.md", "config.json", "decision_config.json", "model.safetensors"]
    config = json.loads((snap / "config.json").read_text())
    assert config["architectures"] == ["D3ForSequenceClassification"]
    text = config["text_config"]  # the real base's numbers (tests/contracts/d3-architectures.json)
    assert text["max_position_embeddings"] == 262144
    assert text["full_attention_interval"] == 4
    assert text["layer_types"].count("full_attention") == text["num_hidden_layers"] // 4
    assert config == load_builder().config_json(repo.split("/")[1])
    header, _ = parse_safetensors((snap / "model.safetensors").read_bytes())
    meta = header["__metadata__"]
    assert meta["d3_model_id"] == repo
    assert meta["d3_release"] == "v3.2.0"
    assert int(meta["d3_lab_simulated_bytes"]) == load_builder().simulated_bytes(repo.split("/")[1])
    assert "lab stand-in" in (snap / "README.md").read_text().lower()


@pytest.mark.lab
def test_second_download_of_same_revision_fetches_nothing(mirror: Mirror, tmp_path: Path) -> None:
    repo = "vllm-sr/d3-edge"
    sha = mirror.revisions()[repo]
    before = mirror.resolve_requests(repo)
    assert hf(mirror, tmp_path, "download", repo, "--revision", sha, "--quiet").returncode == 0
    after_first = mirror.resolve_requests(repo)
    assert after_first - before >= 4  # the counter sees real file requests (HEAD/GET per file)
    blobs = tmp_path / "hub" / "models--vllm-sr--d3-edge" / "blobs"
    stats = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in blobs.iterdir()}
    assert len(stats) == 4
    assert hf(mirror, tmp_path, "download", repo, "--revision", sha, "--quiet").returncode == 0
    assert mirror.resolve_requests(repo) == after_first
    assert {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in blobs.iterdir()} == stats


@pytest.mark.lab
def test_older_revision_has_different_content(mirror: Mirror, tmp_path: Path) -> None:
    repo = "vllm-sr/d3"
    new = mirror.revisions()[repo]
    old = run_builder(tmp_path / "ref", "--no-revisions-file")["previous"][repo]  # type: ignore[index]
    assert old != new
    for sha in (old, new):
        assert hf(mirror, tmp_path, "download", repo, "--revision", sha, "--quiet").returncode == 0
    old_snap, new_snap = snapshot(tmp_path, repo, old), snapshot(tmp_path, repo, new)
    assert json.loads((old_snap / "decision_config.json").read_text())["release"] == "v3.1.0"
    assert json.loads((new_snap / "decision_config.json").read_text())["release"] == "v3.2.0"
    assert "text_config" not in json.loads((old_snap / "config.json").read_text())  # the early flat stand-in
    assert (old_snap / "model.safetensors").read_bytes() != (new_snap / "model.safetensors").read_bytes()


@pytest.mark.lab
def test_nonexistent_repo_or_revision_fails(mirror: Mirror, tmp_path: Path) -> None:
    missing = hf(mirror, tmp_path, "download", "vllm-sr/d3-nonexistent", "--quiet")
    assert missing.returncode != 0
    assert "not found" in (missing.stdout + missing.stderr).lower()
    bad_rev = hf(mirror, tmp_path, "download", "vllm-sr/d3-lite", "--revision", "0" * 40, "--quiet")
    assert bad_rev.returncode != 0
    assert not (tmp_path / "hub" / "models--vllm-sr--d3-nonexistent" / "snapshots").exists()


OFFLINE_LOAD = """
import sys
from huggingface_hub import snapshot_download
from huggingface_hub.errors import LocalEntryNotFoundError
try:
    print(snapshot_download(sys.argv[1], revision=sys.argv[2] or None))
except LocalEntryNotFoundError:
    print("LocalEntryNotFoundError")
"""


@pytest.mark.lab
def test_download_by_sha_leaves_no_refs_main(mirror: Mirror, tmp_path: Path) -> None:
    """The gotcha: by SHA -> no refs/main, so an offline consumer (vLLM) must get --revision <sha> too."""
    repo = "vllm-sr/d3-mini"
    sha = mirror.revisions()[repo]
    assert hf(mirror, tmp_path, "download", repo, "--revision", sha, "--quiet").returncode == 0
    refs = tmp_path / "hub" / "models--vllm-sr--d3-mini" / "refs"
    assert not (refs / "main").exists()

    env = {**os.environ, "HF_HOME": str(tmp_path), "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": mirror.endpoint}

    def offline(revision: str) -> str:
        return subprocess.run([sys.executable, "-c", OFFLINE_LOAD, repo, revision], env=env,
                              capture_output=True, text=True, check=True).stdout.strip()

    assert offline("") == "LocalEntryNotFoundError"  # what `vllm serve vllm-sr/d3-mini` without --revision hits
    assert offline(sha) == str(snapshot(tmp_path, repo, sha))
    # by branch (online) writes refs/main = the pinned commit, as the mirror's main is the pinned revision
    assert hf(mirror, tmp_path, "download", repo, "--quiet").returncode == 0
    assert (refs / "main").read_text() == sha


@pytest.mark.lab
def test_lab_host_network_reaches_mirror_via_slirp_host_loopback(mirror: Mirror, tmp_path: Path) -> None:
    """A container on slirp4netns with allow_host_loopback reaches the loopback-only mirror as 10.0.2.2."""
    busybox = Path("/bin/busybox")
    assert shutil.which("podman"), "the lab needs podman"
    assert busybox.is_file(), "the probe needs busybox-static (/bin/busybox): apt-get install busybox-static"
    root = tmp_path / "rootfs"
    (root / "bin").mkdir(parents=True)
    shutil.copy2(busybox, root / "bin" / "busybox")
    for applet in ("sh", "wget"):
        (root / "bin" / applet).symlink_to("busybox")
    subprocess.run(["tar", "-C", str(root), "-cf", str(tmp_path / "probe.tar"), "."], check=True)
    subprocess.run(["podman", "import", "-q", "--change", 'CMD ["/bin/sh"]', str(tmp_path / "probe.tar"),
                    PROBE_IMAGE], check=True, capture_output=True)
    repo, sha = "vllm-sr/d3-nano", mirror.revisions()["vllm-sr/d3-nano"]
    url = f"http://lab-hf:{mirror.port}/{repo}/resolve/{sha}/config.json"

    def probe(network: str, name: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["podman", "run", "--rm", "--name", name, "--network", network, "--add-host", "lab-hf:10.0.2.2",
             PROBE_IMAGE, "wget", "-q", "-O", "-", url],  # no -T: busybox-static 1.35 wget -T segfaults
            capture_output=True, text=True, timeout=60)

    try:
        ok = probe("slirp4netns:allow_host_loopback=true", f"d3-lab-hf-probe-{os.getpid()}-a")
        assert ok.returncode == 0, ok.stderr
        assert json.loads(ok.stdout)["architectures"] == ["D3ForSequenceClassification"]
        blocked = probe("slirp4netns", f"d3-lab-hf-probe-{os.getpid()}-b")
        assert blocked.returncode != 0
        assert "can't connect" in blocked.stderr  # "Network is unreachable": 10.0.2.2 needs allow_host_loopback
        assert "D3ForSequenceClassification" not in blocked.stdout
    finally:
        subprocess.run(["podman", "rmi", "-f", PROBE_IMAGE], capture_output=True)
