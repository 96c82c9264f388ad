"""Tests of the LAB STAND-IN NVIDIA layer (lab/nvidia, lab/roles/lab_nvidia_repo).

Unmarked tests run the built stand-in tools on this machine (env overrides point them at a
temporary "NVML" file and device directory). ``@pytest.mark.lab`` tests run the role, install
the packages from the served, signed repository into throwaway systemd containers (trixie:
podman 5.4, bookworm: podman 4.3) and check CDI end to end with a nested ``podman run``.
Containers and images are named ``nvlabtest-*``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import socket
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import labkit
import pytest
import yaml
from labkit import wait_until
from nvidia_smi import nvidia_smi_list, nvidia_smi_query_gpus, nvidia_smi_table

ROOT = Path(__file__).resolve().parents[2]
NVIDIA = ROOT / "lab" / "nvidia"
# committed copy of ../shared/fixtures/cdi (real nvidia-ctk output); tests/test_nvidia_smi.py checks the copies
FIXTURE_CDI = ROOT / "tests/fixtures/cdi/h200-driver580-nvidia.yaml"
DRIVER = "580.95.05"
QUERY = "index,name,uuid,memory.total,memory.used,driver_version,compute_cap"
CACHE = Path("/var/cache/d3-lab/nvlabtest")
MIRROR = "http://deb.debian.org/debian"
REPO_PORT = 8081




def run(*cmd: str, check: bool = True, env: dict[str, str] | None = None, **kw: Any) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, **kw)
    if check and proc.returncode != 0:
        raise AssertionError(f"{cmd} rc={proc.returncode}\nstdout:{proc.stdout}\nstderr:{proc.stderr}")
    return proc


# --------------------------------------------------------------------------- on this machine
@pytest.fixture(scope="module")
def debs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("debs")
    assert run(str(NVIDIA / "build-debs.sh"), str(out)).stdout.strip() == "built 9 packages"
    return out


@pytest.fixture(scope="module")
def unpacked(debs: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("root")
    for deb in ("lab-nvidia-driver_580.95.05-1_amd64.deb", "nvidia-container-toolkit-base_1.20.0-1_amd64.deb"):
        run("dpkg-deb", "-x", str(debs / deb), str(root))
    return root


def gpu_env(root: Path, tmp: Path, config: dict[str, Any]) -> dict[str, str]:
    """Run the stand-in setup against a temporary NVML file and /dev directory."""
    (tmp / "dev").mkdir(exist_ok=True)
    (tmp / "gpus.json").write_text(json.dumps(config))
    env = dict(os.environ, LAB_NVIDIA_NVML=str(tmp / f"libnvidia-ml.so.{DRIVER}"),
               LAB_NVIDIA_DEV_DIR=str(tmp / "dev"), LAB_NVIDIA_CONFIG=str(tmp / "gpus.json"),
               LAB_NVIDIA_HOSTNAME="l4-host-1", LAB_NVIDIA_CLAIMS_BASE=str(tmp / "lab-nvidia"),
               LAB_NVIDIA_CLAIMS_DIR=str(tmp / "lab-nvidia" / "claims"),
               LAB_NVIDIA_DRIVER_STATE=str(tmp / "state" / "driver-version"))
    run(str(root / "usr/lib/lab-nvidia/lab-nvidia-setup"), env=env)
    return env


L4X4 = {"count": 4, "name": "NVIDIA L4", "memory_mib": 23034, "compute_cap": "8.9"}


def test_build_is_cached_and_reproducible(debs: Path, tmp_path: Path) -> None:
    assert run(str(NVIDIA / "build-debs.sh"), str(debs)).stdout.strip() == "unchanged"
    again = tmp_path / "again"
    run(str(NVIDIA / "build-debs.sh"), str(again))
    names = sorted(p.name for p in debs.glob("*.deb"))
    assert len(names) == 9
    assert all((again / n).read_bytes() == (debs / n).read_bytes() for n in names)
    fields = run("dpkg-deb", "-f", str(debs / "nvidia-container-toolkit_1.17.8-1_amd64.deb"), "Depends").stdout
    assert "nvidia-container-toolkit-base (= 1.17.8-1)" in fields
    assert "libnvidia-container-tools (= 1.17.8-1)" in fields
    tools = run("dpkg-deb", "-f", str(debs / "libnvidia-container-tools_1.20.0-1_amd64.deb"), "Depends").stdout
    assert "libnvidia-container1 (= 1.20.0-1)" in tools
    new = run("dpkg-deb", "-c", str(debs / "nvidia-container-toolkit-base_1.20.0-1_amd64.deb")).stdout
    old = run("dpkg-deb", "-c", str(debs / "nvidia-container-toolkit-base_1.17.8-1_amd64.deb")).stdout
    assert "nvidia-cdi-refresh.service" in new and "nvidia-cdi-refresh.path" in new
    assert "nvidia-cdi-refresh" not in old


def test_stand_in_nvidia_smi_formats_parse(unpacked: Path, tmp_path: Path) -> None:
    env = gpu_env(unpacked, tmp_path, L4X4)
    smi = str(unpacked / "usr/bin/nvidia-smi")
    devs = sorted(p.name for p in (tmp_path / "dev").iterdir())
    assert devs == ["nvidia-uvm", "nvidia-uvm-tools", "nvidia0", "nvidia1", "nvidia2", "nvidia3", "nvidiactl"]
    assert os.major((tmp_path / "dev/nvidiactl").stat().st_rdev) == 195
    listed = nvidia_smi_list(run(smi, "-L", env=env).stdout)
    header = nvidia_smi_query_gpus(run(smi, f"--query-gpu={QUERY}", "--format=csv", env=env).stdout)
    bare = nvidia_smi_query_gpus(run(smi, f"--query-gpu={QUERY}", "--format=csv,noheader,nounits",
                                     env=env).stdout)
    table = nvidia_smi_table(run(smi, env=env).stdout)
    assert header == bare
    assert [g["index"] for g in bare] == [0, 1, 2, 3]
    assert {(g["name"], g["memory_total_mib"], g["compute_cap"], g["driver_version"]) for g in bare} == {
        ("NVIDIA L4", 23034, "8.9", DRIVER)}
    assert [g["uuid"] for g in listed] == [g["uuid"] for g in bare]
    assert len({g["uuid"] for g in bare}) == 4
    assert table["driver_version"] == DRIVER
    assert [(g["index"], g["memory_total_mib"]) for g in table["gpus"]] == [(i, 23034) for i in range(4)]
    # deterministic: same host, same UUIDs; another host, other UUIDs
    run(str(unpacked / "usr/lib/lab-nvidia/lab-nvidia-setup"), env=env)
    assert nvidia_smi_list(run(smi, "-L", env=env).stdout) == listed
    other = dict(env, LAB_NVIDIA_HOSTNAME="l4-host-2")
    run(str(unpacked / "usr/lib/lab-nvidia/lab-nvidia-setup"), env=other)
    assert not {g["uuid"] for g in nvidia_smi_list(run(smi, "-L", env=env).stdout)} & {g["uuid"] for g in listed}


def test_stand_in_nvidia_smi_reports_only_present_device_nodes(unpacked: Path, tmp_path: Path) -> None:
    env = gpu_env(unpacked, tmp_path, L4X4)
    smi = str(unpacked / "usr/bin/nvidia-smi")
    for idx in (0, 2, 3):
        (tmp_path / f"dev/nvidia{idx}").unlink()
    assert [g["index"] for g in nvidia_smi_list(run(smi, "-L", env=env).stdout)] == [1]
    assert run(smi, "--query-gpu=count", "--format=csv,noheader", env=env).stdout == "1\n"
    (tmp_path / "dev/nvidia1").unlink()
    none = run(smi, "-L", env=env, check=False)
    assert (none.returncode, none.stdout.strip()) == (6, "No devices were found")
    (tmp_path / "dev/nvidiactl").unlink()
    nodrv = run(smi, env=env, check=False)
    assert nodrv.returncode == 9 and "couldn't communicate with the NVIDIA driver" in nodrv.stderr
    bad = run(smi, "--query-gpu=bogus", "--format=csv", env=env, check=False)
    assert bad.returncode != 0


def hold_claim(claims: Path, gpus: dict[str, int]) -> int:
    """Publish a GPU memory claim like the simulator does (flock'd, renamed into place); returns the fd."""
    tmp = claims / ".test.tmp"
    fd = os.open(tmp, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, json.dumps({"pid": 4242, "process_name": "python3", "gpus": gpus}).encode())
    os.replace(tmp, claims / "test.json")
    return fd


def test_stand_in_nvidia_smi_counts_the_claims_of_live_processes(unpacked: Path, tmp_path: Path) -> None:
    env = gpu_env(unpacked, tmp_path, L4X4)
    smi = str(unpacked / "usr/bin/nvidia-smi")
    claims = Path(env["LAB_NVIDIA_CLAIMS_DIR"])
    assert oct(claims.stat().st_mode & 0o7777) == "0o1777"
    gpus = nvidia_smi_query_gpus(run(smi, f"--query-gpu={QUERY}", "--format=csv", env=env).stdout)
    query = [smi, "--query-gpu=index,memory.used,memory.reserved,memory.free", "--format=csv,noheader,nounits"]
    assert run(*query, env=env).stdout.splitlines()[1] == "1, 0, 434, 22600"
    fd = hold_claim(claims, {gpus[1]["uuid"]: 5000})
    # a dead process's claim (file present, lock free) does not count
    (claims / "dead.json").write_text(json.dumps({"pid": 1, "gpus": {gpus[1]["uuid"]: 7000}}))
    try:
        assert run(*query, env=env).stdout.splitlines() == [
            "0, 0, 434, 22600", "1, 5000, 434, 17600", "2, 0, 434, 22600", "3, 0, 434, 22600"]
        table = run(smi, env=env).stdout
        assert "|    5000MiB /  23034MiB |" in table
        assert re.search(r"\|\s+1\s+N/A\s+N/A\s+4242\s+C\s+python3\s+5000MiB \|", table), table
        assert all(len(line) == 91 for line in table.splitlines()[1:] if line.startswith(("|", "+")))
    finally:
        os.close(fd)
    assert run(*query, env=env).stdout.splitlines()[1] == "1, 0, 434, 22600"
    assert "No running processes found" in run(smi, env=env).stdout


def test_stand_in_driver_version_can_be_flipped(unpacked: Path, tmp_path: Path) -> None:
    env = gpu_env(unpacked, tmp_path, L4X4)
    smi, setup = str(unpacked / "usr/bin/nvidia-smi"), str(unpacked / "usr/lib/lab-nvidia/lab-nvidia-setup")
    ask = [smi, "--query-gpu=driver_version", "--format=csv,noheader"]
    assert run(*ask, env=env).stdout.split() == [DRIVER] * 4
    out = run(setup, "--driver-version", "570.195.03", env=env).stdout
    assert "driver version 570.195.03 (CUDA 12.8)" in out
    assert run(*ask, env=env).stdout.split() == ["570.195.03"] * 4
    table = nvidia_smi_table(run(smi, env=env).stdout)
    assert table["driver_version"] == "570.195.03"
    assert "CUDA Version: 12.8" in run(smi, env=env).stdout
    run(setup, env=env)  # a reboot keeps it
    assert run(*ask, env=env).stdout.split() == ["570.195.03"] * 4
    run(setup, "--driver-version", "default", env=env)
    assert run(*ask, env=env).stdout.split() == [DRIVER] * 4
    assert "CUDA Version: 13.0" in run(smi, env=env).stdout
    assert run(setup, "--driver-version", "latest", env=env, check=False).returncode != 0


def test_stand_in_table_layout_matches_real_h200(unpacked: Path, tmp_path: Path) -> None:
    real = (ROOT / "tests/fixtures/nvidia-smi/h200-driver580/nvidia-smi.txt").read_text().splitlines()
    env = gpu_env(unpacked, tmp_path, {"count": 1, "name": "NVIDIA H200", "memory_mib": 143771})
    ours = run(str(unpacked / "usr/bin/nvidia-smi"), env=env).stdout.splitlines()
    assert len(ours) == len(real)
    volatile = re.compile(r"580\.\S+|\d+C|P\d|\d+W|On |Off|Disabled|N/A|00000000:00:0.\.0|\w{3} \w{3} .*")
    for mine, theirs in zip(ours, real, strict=True):
        assert len(mine) == len(theirs), (mine, theirs)
        assert volatile.sub("#", mine).replace(" ", "") == volatile.sub("#", theirs).replace(" ", "")


def _shape(spec: dict[str, Any]) -> dict[str, Any]:
    edits = dict(spec["containerEdits"])
    # the lab's GPU memory claims directory is a lab stand-in detail (no real spec has it): not compared
    edits["mounts"] = [m for m in edits["mounts"] if not m["containerPath"].endswith("/lab-nvidia")]
    return {
        "top": list(spec),
        "device_keys": {tuple(d["containerEdits"]) for d in spec["devices"]},
        # minor is omitted when 0 (the fixture host had GPU 0 only)
        "node_keys": {tuple(k for k in n if k != "minor") for d in spec["devices"]
                      for n in d["containerEdits"]["deviceNodes"]},
        "edit_keys": sorted(edits),
        "shared_nodes": sorted(n["path"] for n in edits["deviceNodes"]),
        "env_names": sorted(e.split("=")[0] for e in edits["env"]),
        "hook_names": {h["hookName"] for h in edits["hooks"]},
        "hook_paths": {h["path"] for h in edits["hooks"]},
        "mount_keys": {tuple(m) for m in edits["mounts"]},
        "mount_options": {tuple(m["options"]) for m in edits["mounts"]},
    }


def check_spec(spec: dict[str, Any], gpus: list[dict[str, Any]]) -> None:
    """The generated spec has the real fixture's shape and one device per index, UUID and all."""
    assert _shape(spec) == _shape(yaml.safe_load(FIXTURE_CDI.read_text()))
    assert (spec["cdiVersion"], spec["kind"]) == ("0.5.0", "nvidia.com/gpu")
    names = [d["name"] for d in spec["devices"]]
    assert sorted(names) == sorted([str(g["index"]) for g in gpus] + [g["uuid"] for g in gpus] + ["all"])
    by_name = {d["name"]: d["containerEdits"]["deviceNodes"] for d in spec["devices"]}
    for gpu in gpus:
        for name in (str(gpu["index"]), gpu["uuid"]):
            [node] = by_name[name]
            assert (node["path"], node["major"], node.get("minor", 0)) == (
                f"/dev/nvidia{gpu['index']}", 195, gpu["index"])
    assert len(by_name["all"]) == len(gpus)
    edits = spec["containerEdits"]
    assert "NVIDIA_VISIBLE_DEVICES=void" in edits["env"]
    assert {(n["path"], n["major"], n.get("minor", 0)) for n in edits["deviceNodes"]} == {
        ("/dev/nvidiactl", 195, 255), ("/dev/nvidia-uvm", 238, 0), ("/dev/nvidia-uvm-tools", 238, 1)}
    mounts = {m["containerPath"]: m for m in edits["mounts"]}
    claims = [mounts.pop(p) for p in list(mounts) if p.endswith("/lab-nvidia")]
    assert [("ro" in m["options"], m["hostPath"] == m["containerPath"]) for m in claims] == [(False, True)]
    assert set(mounts) == {f"/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.{DRIVER}", "/usr/bin/nvidia-smi"}
    assert all(m["hostPath"] == path and "ro" in m["options"] for path, m in mounts.items())
    assert {h["path"] for h in edits["hooks"]} == {"/usr/bin/nvidia-cdi-hook"}


def test_nvidia_ctk_generate_and_list(unpacked: Path, tmp_path: Path) -> None:
    env = gpu_env(unpacked, tmp_path, L4X4)
    ctk = str(unpacked / "usr/bin/nvidia-ctk")
    gpus = nvidia_smi_query_gpus(run(str(unpacked / "usr/bin/nvidia-smi"), f"--query-gpu={QUERY}",
                                     "--format=csv", env=env).stdout)
    out = tmp_path / "cdi" / "nvidia.yaml"
    gen = run(ctk, "cdi", "generate", f"--output={out}", env=env)
    assert "Generated CDI spec with version 0.5.0" in gen.stderr
    assert oct(out.stat().st_mode & 0o777) == "0o644"
    text = out.read_text()
    assert text.startswith("---\ncdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n    - name: \"0\"\n")
    check_spec(yaml.safe_load(text), gpus)
    assert yaml.safe_load(run(ctk, "cdi", "generate", env=env).stdout) == yaml.safe_load(text)
    listed = run(ctk, "cdi", "list", f"--spec-dir={out.parent}", env=env)
    assert "Found 9 CDI devices" in listed.stderr
    assert sorted(listed.stdout.split()) == sorted(
        [f"nvidia.com/gpu={g['index']}" for g in gpus] + [f"nvidia.com/gpu={g['uuid']}" for g in gpus]
        + ["nvidia.com/gpu=all"])
    real = run(ctk, "cdi", "list", f"--spec-dir={FIXTURE_CDI.parent}", env=env)
    assert "Found 3 CDI devices" in real.stderr
    assert real.stdout.split() == ["nvidia.com/gpu=0", "nvidia.com/gpu=GPU-e5fbe540-703e-c54c-ccff-2132eb1f1a69",
                                   "nvidia.com/gpu=all"]
    assert run(ctk, "--version").stdout.startswith("NVIDIA Container Toolkit CLI version 1.20.0\n")
    assert run(ctk, "system", "create-device-nodes", "--control-devices").returncode == 0


# --------------------------------------------------------------------------- lab (containers)
def podman(*args: str, check: bool = True, timeout: int = 600) -> subprocess.CompletedProcess:
    return labkit.podman(*args, check=check, timeout=timeout)


def image_exists(name: str) -> bool:
    return podman("image", "exists", name, check=False).returncode == 0


def test_host_image(suite: str) -> str:
    """The lab host image with podman (labkit.host_image_with_podman, built once and kept), or a cached debootstrap
    stand-in for it (prefix nvlabtest, podman included)."""
    if image_exists(f"localhost/d3-lab-host-{suite}:latest"):
        return labkit.host_image_with_podman(suite)
    image = f"localhost/nvlabtest-host-{suite}:latest"
    if image_exists(image):
        return image
    CACHE.mkdir(parents=True, exist_ok=True)
    tar = CACHE / f"nvlabtest-rootfs-{suite}.tar"
    if not tar.exists():
        rootfs = CACHE / f"rootfs-{suite}"
        if not (rootfs / "usr/bin/podman").exists():
            shutil.rmtree(rootfs, ignore_errors=True)
            run("debootstrap", "--variant=minbase",
                "--include=systemd,systemd-sysv,dbus,python3,ca-certificates,procps,iproute2,"
                "podman,crun,netavark,aardvark-dns,iptables,fuse-overlayfs", suite, str(rootfs), MIRROR,
                timeout=1200)
        (rootfs / "etc/machine-id").write_text("")
        for unit in ("systemd-modules-load.service", "apt-daily.timer", "apt-daily-upgrade.timer",
                     "dpkg-db-backup.timer", "fstrim.timer", "getty@tty1.service", "systemd-pstore.service"):
            link = rootfs / "etc/systemd/system" / unit
            link.unlink(missing_ok=True)
            link.symlink_to("/dev/null")
        (rootfs / "etc/apt/sources.list").write_text(f"deb {MIRROR} {suite} main\n")
        run("chroot", str(rootfs), "apt-get", "clean")
        run("tar", "--numeric-owner", "--xattrs", "-C", str(rootfs), "-cf", f"{tar}.tmp", ".")
        os.replace(f"{tar}.tmp", tar)
    podman("import", "--change", 'CMD ["/sbin/init"]', "--change", "ENV container=podman",
           "--change", "STOPSIGNAL SIGRTMIN+3", str(tar), image)
    return image


test_host_image.__test__ = False  # type: ignore[attr-defined]  # a helper, not a test


@pytest.fixture(scope="module")
def repo() -> Path:
    """Run the lab_nvidia_repo role (idempotently) and return the served repository root."""
    play = Path("/tmp/nvlabtest-lab-nvidia-repo.yml")
    play.write_text("- hosts: localhost\n  gather_facts: false\n  roles: [lab_nvidia_repo]\n")
    cmd = ["ansible-playbook", "-i", "localhost,", "-c", "local",
           "-e", "ansible_python_interpreter=/usr/bin/python3", str(play)]
    run(*cmd, cwd=ROOT)
    second = run(*cmd, cwd=ROOT)
    assert re.search(r"localhost\s+: ok=\d+\s+changed=0\s", second.stdout), second.stdout
    return Path("/var/lib/d3-lab/apt")


class Host:
    def __init__(self, name: str) -> None:
        self.name = name

    def sh(self, script: str, check: bool = True, timeout: int = 600) -> subprocess.CompletedProcess:
        return podman("exec", self.name, "bash", "-c", script, check=check, timeout=timeout)


SOURCES = "/etc/apt/sources.list.d/lab-nvidia.list"
APT_ONLY_LAB = f"-o Dir::Etc::sourcelist={SOURCES} -o Dir::Etc::sourceparts=- -o APT::Get::List-Cleanup=0"


SUITES = ("trixie", "bookworm")


@pytest.fixture(scope="module")
def host_images() -> dict[str, str]:
    """Both releases' host images with podman, built side by side when missing (each mostly waits on apt)."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(SUITES, pool.map(test_host_image, SUITES), strict=True))


@pytest.fixture(scope="module", params=SUITES)
def host(request: pytest.FixtureRequest, repo: Path, host_images: dict[str, str]) -> Iterator[Host]:
    suite = request.param
    image = host_images[suite]
    name = f"nvlabtest-{suite}-{os.getpid()}"
    podman("run", "-d", "--name", name, "--hostname", name, "--privileged", "--systemd=always",
           "--network", "slirp4netns:allow_host_loopback=true", "--add-host", "lab-apt:10.0.2.2",
           image, "/sbin/init")
    box = Host(name)
    try:
        booted(box)
        box.sh("command -v podman >/dev/null || { apt-get update -qq && "
               "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman >/dev/null; }", timeout=900)
        box.sh("python3 -c \"import urllib.request as u; open('/usr/share/keyrings/lab-nvidia.asc','wb')"
               ".write(u.urlopen('http://lab-apt:8081/gpgkey').read())\"")
        box.sh(f"echo 'deb [signed-by=/usr/share/keyrings/lab-nvidia.asc] "
               f"http://lab-apt:{REPO_PORT}/stable/deb/$(ARCH) /' > {SOURCES}")
        yield box
    finally:
        podman("rm", "-f", "-t", "0", name, check=False)


def booted(box: Host, timeout: float = 60) -> None:
    wait_until(f"{box.name} to finish booting", lambda: box.sh("systemctl is-system-running", check=False)
             .stdout.strip() in ("running", "degraded"), timeout)


def install(host: Host, version: str) -> None:
    pkgs = " ".join(f"{p}={version}" for p in ("nvidia-container-toolkit", "nvidia-container-toolkit-base",
                                                 "libnvidia-container-tools", "libnvidia-container1"))
    host.sh(f"apt-get update {APT_ONLY_LAB} && DEBIAN_FRONTEND=noninteractive apt-get install -y "
            f"--allow-downgrades {APT_ONLY_LAB} lab-nvidia-driver {pkgs}")


PY_IMAGE = "localhost/nvlabtest-py:latest"


def ensure_py_image(host: Host) -> None:
    """A small image with python3 and ls (the stand-in nvidia-smi is a Python script), built in the host."""
    host.sh(
        f"set -e; podman image exists {PY_IMAGE} && exit 0; R=$(mktemp -d); "
        "for b in /usr/bin/python3 /usr/bin/ls; do r=$(readlink -f $b); cp --parents $r $R; "
        "[ $b = $r ] || ln -s $r $R$b; for l in $(ldd $r | awk '/=>/{print $3} /ld-linux/{print $1}'); do "
        "cp --parents -L $l $R; done; done; "
        "py=$(readlink -f /usr/bin/python3); cp -a --parents /usr/lib/$(basename $py) $R; "
        "rm -rf $R/usr/lib/python3*/test $R/usr/lib/python3*/config-*; "
        f"tar -C $R -c . | podman import - {PY_IMAGE} >/dev/null; rm -rf $R")


@contextlib.contextmanager
def serve(directory: Path) -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen(["python3", "-m", "http.server", str(port), "--bind", "127.0.0.1",
                             "--directory", str(directory)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    def listening() -> bool:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
        return False

    try:
        wait_until(f"http.server on port {port}", listening, timeout=10, poll=0.1)
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.lab
def test_apt_rejects_unsigned_and_tampered_repository(host: Host, repo: Path, tmp_path: Path) -> None:
    for case in ("unsigned", "tampered"):
        copy = tmp_path / case
        shutil.copytree(repo, copy)
        dist = copy / "stable/deb/amd64"
        if case == "unsigned":
            (dist / "InRelease").unlink()
            (dist / "Release.gpg").unlink()
        else:
            text = (dist / "InRelease").read_text()
            (dist / "InRelease").write_text(text.replace("Label: lab-", "Label: evil-"))
        with serve(copy) as port:
            src = f"/etc/apt/sources.list.d/nvlabtest-{case}.list"
            host.sh(f"echo 'deb [signed-by=/usr/share/keyrings/lab-nvidia.asc] "
                    f"http://10.0.2.2:{port}/stable/deb/$(ARCH) /' > {src}")
            res = host.sh(f"rm -rf /var/lib/apt/lists/10.0.2.2*; apt-get update -o Dir::Etc::sourcelist={src} "
                          "-o Dir::Etc::sourceparts=- -o APT::Get::List-Cleanup=0", check=False)
            host.sh(f"rm -f {src}")
        assert res.returncode != 0, res.stdout
        out = res.stdout + res.stderr
        if case == "unsigned":
            assert "is not signed" in out, out
        else:  # gpgv (bookworm) says BADSIG, sqv (trixie) "Message has been manipulated"
            assert "BADSIG" in out or "Message has been manipulated" in out, out


@pytest.mark.lab
def test_driver_and_toolkit_from_signed_repo(host: Host) -> None:
    install(host, "1.20.0-1")
    assert host.sh("systemctl is-active lab-nvidia-devices.service").stdout.strip() == "active"
    assert host.sh("systemctl is-enabled nvidia-cdi-refresh.path nvidia-cdi-refresh.service").stdout.split() == [
        "enabled", "enabled"]
    nodes = host.sh("stat -c '%n %t:%T %a' /dev/nvidia*").stdout.split("\n")
    assert sorted(filter(None, nodes)) == [
        "/dev/nvidia-uvm ee:0 666", "/dev/nvidia-uvm-tools ee:1 666", "/dev/nvidia0 c3:0 666",
        "/dev/nvidia1 c3:1 666", "/dev/nvidia2 c3:2 666", "/dev/nvidia3 c3:3 666", "/dev/nvidiactl c3:ff 666"]
    gpus = nvidia_smi_query_gpus(host.sh(f"nvidia-smi --query-gpu={QUERY} --format=csv").stdout)
    assert gpus == nvidia_smi_query_gpus(
        host.sh(f"nvidia-smi --query-gpu={QUERY} --format=csv,noheader,nounits").stdout)
    assert [(g["index"], g["name"], g["memory_total_mib"], g["compute_cap"]) for g in gpus] == [
        (i, "NVIDIA L4", 23034, "8.9") for i in range(4)]
    assert [g["uuid"] for g in nvidia_smi_list(host.sh("nvidia-smi -L").stdout)] == [g["uuid"] for g in gpus]
    assert nvidia_smi_table(host.sh("nvidia-smi").stdout)["driver_version"] == DRIVER
    # nvidia-cdi-refresh (postinst) wrote the spec to /var/run/cdi
    spec = yaml.safe_load(host.sh("cat /var/run/cdi/nvidia.yaml").stdout)
    check_spec(spec, gpus)
    listed = host.sh("nvidia-ctk cdi list")
    assert "Found 9 CDI devices" in listed.stderr
    assert sorted(listed.stdout.split()) == sorted(
        [f"nvidia.com/gpu={g['index']}" for g in gpus] + [f"nvidia.com/gpu={g['uuid']}" for g in gpus]
        + ["nvidia.com/gpu=all"])
    ensure_py_image(host)
    gpu1 = gpus[1]
    for device in ("1", gpu1["uuid"]):
        dev = host.sh(f"podman run --rm --network none --device nvidia.com/gpu={device} "
                      f"{PY_IMAGE} ls /dev").stdout.split()
        assert sorted(d for d in dev if d.startswith("nvidia")) == [
            "nvidia-uvm", "nvidia-uvm-tools", "nvidia1", "nvidiactl"]
        inside = nvidia_smi_list(host.sh(f"podman run --rm --network none --device nvidia.com/gpu={device} "
                                         f"{PY_IMAGE} nvidia-smi -L").stdout)
        assert [(g["index"], g["uuid"]) for g in inside] == [(1, gpu1["uuid"])]
    env = host.sh(f"podman run --rm --network none --device nvidia.com/gpu=all {PY_IMAGE} "
                  "python3 -c \"print(open('/proc/self/environ').read())\"").stdout
    assert "NVIDIA_VISIBLE_DEVICES=void" in env
    alls = host.sh(f"podman run --rm --network none --device nvidia.com/gpu=all {PY_IMAGE} "
                   f"nvidia-smi --query-gpu={QUERY} --format=csv").stdout
    assert nvidia_smi_query_gpus(alls) == gpus
    bad = host.sh(f"podman run --rm --network none --device nvidia.com/gpu=7 {PY_IMAGE} true",
                  check=False)
    assert bad.returncode != 0 and "unresolvable CDI devices nvidia.com/gpu=7" in bad.stderr


@pytest.mark.lab
def test_boot_writes_the_cdi_spec_from_the_refresh_unit(host: Host) -> None:
    """Like toolkit >= 1.18 on a real host: /var/run is a tmpfs, so after a reboot the spec exists only because
    nvidia-cdi-refresh.service (enabled, WantedBy=multi-user.target) wrote it again."""
    install(host, "1.20.0-1")
    assert host.sh("findmnt -n -o FSTYPE -T /var/run/cdi").stdout.strip() == "tmpfs"
    podman("stop", "-t", "10", host.name)
    podman("start", host.name)
    booted(host)
    show = host.sh("systemctl show -p ActiveState -p Result -p After -p Before -p UnitFileState "
                   "nvidia-cdi-refresh.service").stdout
    props = dict(line.split("=", 1) for line in show.splitlines() if "=" in line)
    assert (props["ActiveState"], props["Result"], props["UnitFileState"]) == ("active", "success", "enabled")
    assert "lab-nvidia-devices.service" in props["After"].split()
    assert "multi-user.target" not in props["After"].split()  # upstream PR #1746 (cycle, issue #1735)
    assert "docker.service" in props["Before"].split()  # the 10-container-engines.conf drop-in
    gpus = nvidia_smi_query_gpus(host.sh(f"nvidia-smi --query-gpu={QUERY} --format=csv").stdout)
    check_spec(yaml.safe_load(host.sh("cat /var/run/cdi/nvidia.yaml").stdout), gpus)
    assert host.sh("stat -c %a /run/lab-nvidia/claims").stdout.strip() == "1777"


HOLD = """import fcntl, json, os, sys, time
d = "/run/lab-nvidia/claims"
fd = os.open(d + "/.hold.tmp", os.O_CREAT | os.O_WRONLY, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
os.write(fd, json.dumps({"pid": os.getpid(), "process_name": "python3", "gpus": {sys.argv[1]: 5000}}).encode())
os.replace(d + "/.hold.tmp", d + "/hold.json")
print("holding", flush=True)
time.sleep(600)
"""


@pytest.mark.lab
def test_gpu_memory_claims_are_shared_across_containers(host: Host) -> None:
    install(host, "1.20.0-1")
    ensure_py_image(host)
    gpus = nvidia_smi_query_gpus(host.sh(f"nvidia-smi --query-gpu={QUERY} --format=csv").stdout)
    host.sh(f"cat > /tmp/nvlabtest-hold.py <<'EOF'\n{HOLD}EOF")
    holder = "nvlabtest-holder"
    host.sh(f"podman rm -f -t 0 {holder} >/dev/null 2>&1; podman run -d --name {holder} --network none "
            f"--device nvidia.com/gpu=1 -v /tmp/nvlabtest-hold.py:/hold.py:ro {PY_IMAGE} python3 /hold.py "
            f"{gpus[1]['uuid']}")
    used = "--query-gpu=index,memory.used --format=csv,noheader,nounits"
    try:
        wait_until("the claim on the host", lambda: host.sh(f"nvidia-smi {used}").stdout.splitlines()[1] == "1, 5000")
        inside = host.sh(f"podman run --rm --network none --device nvidia.com/gpu=1 {PY_IMAGE} nvidia-smi {used}")
        assert inside.stdout.strip() == "1, 5000"
    finally:
        host.sh(f"podman rm -f -t 0 {holder}")
    wait_until("the claim to go with its process",
             lambda: host.sh(f"nvidia-smi {used}").stdout.splitlines()[1] == "1, 0")


@pytest.mark.lab
def test_driver_version_flip_to_r570_and_back(host: Host) -> None:
    """The documented lab knob: lab-nvidia-setup --driver-version VERSION|default (the CDI spec follows)."""
    install(host, "1.20.0-1")
    ensure_py_image(host)
    setup = "/usr/lib/lab-nvidia/lab-nvidia-setup"
    try:
        host.sh(f"{setup} --driver-version 570.195.03")
        assert nvidia_smi_table(host.sh("nvidia-smi").stdout)["driver_version"] == "570.195.03"
        assert "CUDA Version: 12.8" in host.sh("nvidia-smi").stdout
        wait_until("the CDI spec for R570", lambda: "--host-driver-version=570.195.03" in host.sh(
            "cat /var/run/cdi/nvidia.yaml").stdout)
        inside = host.sh(f"podman run --rm --network none --device nvidia.com/gpu=0 {PY_IMAGE} "
                         "nvidia-smi --query-gpu=driver_version --format=csv,noheader")
        assert inside.stdout.strip() == "570.195.03"
    finally:
        host.sh(f"{setup} --driver-version default")
    assert nvidia_smi_table(host.sh("nvidia-smi").stdout)["driver_version"] == DRIVER
    wait_until("the CDI spec for R580", lambda: f"--host-driver-version={DRIVER}" in host.sh(
        "cat /var/run/cdi/nvidia.yaml").stdout)


@pytest.mark.lab
def test_toolkit_1_17_has_no_refresh_units(host: Host) -> None:
    install(host, "1.17.8-1")
    ensure_py_image(host)
    assert host.sh("nvidia-ctk --version").stdout.startswith("NVIDIA Container Toolkit CLI version 1.17.8")
    assert host.sh("systemctl cat nvidia-cdi-refresh.service", check=False).returncode != 0
    assert host.sh("ls /usr/lib/systemd/system/nvidia-cdi-refresh.path", check=False).returncode != 0
    # the role's job then: generate the spec itself
    host.sh("rm -f /var/run/cdi/nvidia.yaml && nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml")
    assert "Found 9 CDI devices" in host.sh("nvidia-ctk cdi list").stderr
    assert "nvidia1" in host.sh("podman run --rm --network none --device nvidia.com/gpu=1 "
                                f"{PY_IMAGE} ls /dev").stdout
