"""The one helper module for the lab tests (tests/lab/): paths, ports, podman, the lab inventory, the lab hosts,
ansible-runner and recap parsing. Fixtures built on these live in tests/lab/conftest.py; test modules import
from here and never from each other.

The lab is a STAND-IN for a real L4 fleet (lab/README.md): every function here reads what `make lab` generated
or talks to the lab's containers and services. A missing part raises (AssertionError / CalledProcessError):
under `-m lab` it must fail, not skip."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ansible_runner
import yaml

# --- paths ------------------------------------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
LAB_INVENTORY = ROOT / "inventories" / "lab"
LAB_GROUP = "l4-nodes"
ROUTER_GROUP = "d3-routers"
LAB_STATE = Path("/var/lib/d3-lab")
ANSIBLE_ENV = {
    **os.environ,
    "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
    "ANSIBLE_NOCOLOR": "1",
    "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
}
# ansible-runner starts ansible-playbook from PATH: use the one next to this Python (the project's .venv)
os.environ["PATH"] = ANSIBLE_ENV["PATH"]

# lab services on the machine's loopback (docs/design.md), by the names lab hosts know them by
LAB_SERVICES = {"lab-registry": 5000, "lab-apt": 8081, "lab-hf": 8090}
LAB_REGISTRY = "127.0.0.1:5000"
IMAGE = "docker.io/vllm/vllm-openai"


def venv_tool(name: str) -> str:
    local = VENV_BIN / name
    return str(local) if local.exists() else (shutil.which(name) or name)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- ports ------------------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex((host, port)) == 0


def wait_until(what: str, check: Callable[[], Any], timeout: float = 30, poll: float = 0.1) -> Any:
    """Poll check() until it returns something truthy; fail naming `what` after timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(poll)


def wait_for_port(port: int, timeout: float = 10, what: str = "") -> None:
    wait_until(what or f"127.0.0.1:{port} accepting connections", lambda: port_open(port), timeout)


# --- podman (on this machine: the lab's containers, images and registry) ----------------------------------------


def podman(*args: str, timeout: float = 300, check: bool = False) -> subprocess.CompletedProcess[str]:
    """podman on this machine, output captured; check=True fails on a non-zero exit, showing the command's output."""
    proc = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, check=False)
    assert not check or proc.returncode == 0, f"podman {' '.join(args)}: rc={proc.returncode}\nstdout:{proc.stdout}\nstderr:{proc.stderr}"
    return proc


def podman_json(*args: str) -> Any:
    proc = podman(*args, timeout=60)
    assert proc.returncode == 0, f"podman {' '.join(args)}: {proc.stderr}"
    return json.loads(proc.stdout)


def image_exists(ref: str) -> bool:
    return podman("image", "exists", ref, timeout=60).returncode == 0


def host_image_with_podman(suite: str) -> str:
    """The lab host image of a Debian release (make lab-images) plus podman from the Debian archive, built once per
    base image (its tag is the base image's id) and kept: the throwaway hosts of the NVIDIA stand-in tests and the
    unit-file checks (Quadlet generator, systemd-analyze) start from it instead of installing podman each time. A
    lab host itself gets podman only from the production podman role."""
    base = f"localhost/d3-lab-host-{suite}:latest"
    proc = podman("image", "inspect", "--format", "{{.Id}}", base, timeout=60)
    assert proc.returncode == 0, f"{base} is missing: run `make lab-images`"
    image = f"localhost/d3-lab-host-{suite}-podman:{proc.stdout.strip()[:12]}"
    if image_exists(image):
        return image
    builder = f"d3-lab-podman-build-{suite}-{os.getpid()}"
    try:
        podman(
            "run", "--name", builder, "--network", "slirp4netns", base, "sh", "-c",
            "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman >/dev/null"
            " && rm -rf /var/lib/apt/lists/*",
            timeout=900, check=True,
        )  # fmt: skip
        podman("commit", "-q", "--change", 'CMD ["/sbin/init"]', builder, image, timeout=300, check=True)
    finally:
        podman("rm", "-f", builder, timeout=60)
    return image


def registry_digest(tag: str, repo: str = "vllm/vllm-openai") -> str:
    """The digest the lab registry serves for a tag (what a pull of IMAGE:tag through the mirror resolves to)."""
    out = subprocess.run(
        ["skopeo", "inspect", "--tls-verify=false", "--no-tags", "--format", "{{.Digest}}", f"docker://{LAB_REGISTRY}/{repo}:{tag}"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 0, f"lab registry {LAB_REGISTRY} does not serve {repo}:{tag}: {out.stderr}"
    digest = out.stdout.strip()
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", digest), digest
    return digest


# --- the lab inventory and hosts --------------------------------------------------------------------------------


@dataclass(frozen=True)
class LabHost:
    name: str
    port: int
    user: str
    key: str


def lab_inventory() -> dict[str, Any]:
    hosts_file = LAB_INVENTORY / "hosts.yml"
    assert hosts_file.is_file(), f"no lab inventory ({hosts_file}): run `make lab` first"
    return yaml.safe_load(hosts_file.read_text())


def monitor_intervals() -> tuple[int, int]:
    """The lab monitor's scrape and evaluation intervals in seconds, from the lab inventory (d3-monitors' vars, in
    whole seconds as the lab writes them: "5s"): the one place the lab's tests learn them."""
    found = lab_inventory()["all"]["children"]["d3-monitors"]["vars"]
    scrape, evaluation = (str(found[f"d3_metrics_{key}_interval"]) for key in ("scrape", "evaluation"))
    assert scrape.endswith("s") and evaluation.endswith("s"), (scrape, evaluation)
    return int(scrape[:-1]), int(evaluation[:-1])


def lab_host_list() -> list[LabHost]:
    """The lab hosts with their SSH access, in inventory order (d3-lab-host1, d3-lab-host2, ...)."""
    inventory = lab_inventory()
    group = inventory["all"]["children"][LAB_GROUP]
    gvars = inventory["all"]["vars"]  # the connection settings, shared with the router group
    return [
        LabHost(name, int(hvars["ansible_port"]), gvars["ansible_user"], gvars["ansible_ssh_private_key_file"])
        for name, hvars in group["hosts"].items()
    ]


def lab_hosts() -> list[str]:
    """The lab host names, sorted."""
    return sorted(h.name for h in lab_host_list())


def host_vars(host: str) -> dict[str, Any]:
    path = LAB_INVENTORY / "host_vars" / f"{host}.yml"
    assert path.is_file(), f"{path} is missing: run `make lab`"
    return yaml.safe_load(path.read_text()) or {}


def ssh(host: LabHost, command: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """Run a shell command on a lab host over SSH as the fleet user (the way a fleet is reached)."""
    argv = [
        "ssh", "-i", host.key, "-p", str(host.port),
        "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
        "-o", "LogLevel=ERROR", "-o", "ConnectTimeout=5",
        f"{host.user}@127.0.0.1", command,
    ]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, check=check, timeout=timeout)


def on_host(host: str, script: str, check: bool = True) -> str:
    """Run a shell script inside a lab host container (the lab's own access, not the roles')."""
    proc = subprocess.run(["podman", "exec", host, "sh", "-c", script], capture_output=True, text=True, timeout=120, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"{host}: {script!r} failed (rc {proc.returncode}): {proc.stderr}")
    return proc.stdout


# What a unit change alters on a host. Read from real fields (podman inspect, stat, sha256sum); any error raises.
_UNIT_FILES = r"""
set -eu
for f in /etc/containers/systemd/*.container /etc/systemd/system/*.service; do
  [ -f "$f" ] || continue
  if grep -q io.d3-fleet.instance= "$f"; then
    printf '%s %s %s\n' "$f" "$(sha256sum < "$f" | cut -d' ' -f1)" "$(stat -c %.9Y "$f")"
  fi
done
"""


def d3_containers(host: str) -> dict[str, dict[str, Any]]:
    """name -> podman inspect of every D3 container on a lab host (running or not); raises on any podman error."""
    ids = on_host(host, "podman ps -a -q --no-trunc --filter label=io.d3-fleet.instance").split()
    if not ids:
        return {}
    return {c["Name"]: c for c in json.loads(on_host(host, "podman inspect " + " ".join(ids)))}


def unit_state(host: str) -> dict[str, Any]:
    """What a unit change would alter on a host: every D3 unit file (path -> sha256, mtime) and every D3 container
    (name -> id, image id, image name with digest, state, StartedAt). Raises when podman or a file read fails."""
    state: dict[str, Any] = {}
    for line in on_host(host, _UNIT_FILES).splitlines():
        path, digest, mtime = line.split()
        state[path] = {"sha256": digest, "mtime": mtime}
    for name, info in d3_containers(host).items():
        state[f"ctr:{name}"] = {
            "id": info["Id"],
            "image_id": info["Image"],
            "image_name": info["ImageName"],
            "status": info["State"]["Status"],
            "started_at": info["State"]["StartedAt"],
        }
    return state


def suite_of(host: str) -> str:
    """The lab host's Debian release (odd hosts trixie: podman 5.4, Quadlet; even hosts bookworm: podman 4.3, classic)."""
    return on_host(host, ". /etc/os-release; echo $VERSION_CODENAME").strip()


def host_per_suite(host_names: list[str], fewest: bool = True) -> dict[str, str]:
    """One lab host of each Debian release: the one that runs the fewest instances (a test that restarts or waits for
    instances restarts as few as it can), or with fewest=False the first."""
    out: dict[str, str] = {}
    order = sorted(host_names, key=lambda h: len(host_vars(h)["d3_models"])) if fewest else host_names
    for host in order:
        out.setdefault(suite_of(host), host)
    assert {"bookworm", "trixie"} <= set(out), f"the lab needs a bookworm and a trixie host: {out}"
    return out


def restart_sec(host: str, unit: str) -> float:
    """The unit's RestartSec as systemd loaded it (RestartUSec, e.g. "2s", "10s", "500ms")."""
    value = on_host(host, f"systemctl show -p RestartUSec --value {unit}.service").strip()
    match = re.fullmatch(r"(?:(\d+)min ?)?(?:(\d+)s ?)?(?:(\d+)ms)?", value)
    assert match and value, f"{host}: {unit}.service RestartUSec={value!r}"
    minutes, seconds, millis = (int(g or 0) for g in match.groups())
    return minutes * 60 + seconds + millis / 1000


def running(host: str) -> dict[str, tuple[str, str]]:
    """instance -> (image, start time) of the running D3 containers on a lab host."""
    return {
        name: (info["ImageName"], info["State"]["StartedAt"])
        for name, info in d3_containers(host).items()
        if info["State"]["Status"] == "running"
    }


# --- the lab HF mirror and the weights on a lab host -------------------------------------------------------------

HF_HOME = "/var/lib/d3/huggingface"  # d3_hf_home, the planner's default (d3_planner.Options.hf_home)
MIRROR = "http://127.0.0.1:8090"


def tree_bytes(repo: str, sha: str) -> int:
    """Bytes of every file of a repository at a revision, as the lab HF mirror lists them."""
    with urllib.request.urlopen(f"{MIRROR}/api/models/{repo}/tree/{sha}?recursive=true", timeout=30) as resp:
        return sum(e["size"] for e in json.load(resp) if e.get("type") == "file")


def snapshot_facts(host: str, repo: str, sha: str) -> dict[str, Any]:
    """Bytes on disk of a lab host's snapshot, the safetensors metadata of its weights and its config's
    quantization method (read on the host)."""
    snap = f"{HF_HOME}/hub/models--{repo.replace('/', '--')}/snapshots/{sha}"
    script = (
        "import json, pathlib, struct, sys\n"
        f"snap = pathlib.Path({snap!r})\n"
        "files = [p for p in snap.rglob('*') if p.is_file()]\n"
        "raw = (snap / 'model.safetensors').read_bytes()\n"
        "(n,) = struct.unpack('<Q', raw[:8])\n"
        "meta = json.loads(raw[8:8 + n])['__metadata__']\n"
        "config = json.loads((snap / 'config.json').read_text())\n"
        "print(json.dumps({'bytes': sum(p.stat().st_size for p in files), 'meta': meta,\n"
        "                  'quant': (config.get('quantization_config') or {}).get('quant_method')}))\n"
    )
    return json.loads(on_host(host, f"python3 - <<'EOF'\n{script}EOF\n"))


def container_args(host: str, name: str) -> list[str]:
    """The command line of a running D3 container on a lab host."""
    info = d3_containers(host)[name]
    assert info["State"]["Status"] == "running", info["State"]
    return list(info["Config"]["Cmd"] or info["Args"])


# --- ansible-runner and recap parsing ---------------------------------------------------------------------------

TASK_EVENTS = ("runner_on_ok", "runner_on_failed")


@dataclass
class Run:
    status: str
    rc: int
    stats: dict[str, Any]
    events: list[dict[str, Any]]
    stdout: str

    def results(self, host: str | None = None) -> list[dict[str, Any]]:
        """event_data of every task result (ok or failed, not skipped), optionally of one host."""
        return [
            e["event_data"]
            for e in self.events
            if e.get("event") in TASK_EVENTS and (host is None or e["event_data"].get("host") == host)
        ]

    def failures(self, host: str | None = None) -> list[dict[str, Any]]:
        return [
            e["event_data"]
            for e in self.events
            if e.get("event") == "runner_on_failed" and (host is None or e["event_data"].get("host") == host)
        ]

    def failure_text(self, host: str | None = None) -> str:
        """Each failed task's message, with the command's stderr when it has one (a template's `validate`, a
        command: "failed to validate" alone says nothing of why)."""
        lines = []
        for f in self.failures(host):
            res = f.get("res", {})
            stderr = str(res.get("stderr") or "").strip()
            lines.append(json.dumps(res.get("msg", res))
                         + (f"\n  stderr: {stderr[-2000:]}" if stderr else ""))  # fmt: skip
        return "\n".join(lines)

    def tasks_run(self, host: str) -> list[str]:
        """Names of tasks that ran (ok, changed or failed, not skipped) on the host."""
        return [d["task"] for d in self.results(host)]

    def roles_run(self, host: str) -> list[str]:
        """The role of every task that ran on the host (ansible-runner's own 'role' field; '' for play tasks)."""
        return [d.get("role") or "" for d in self.results(host)]

    def changed_tasks(self, host: str) -> list[str]:
        return [d["task"] for d in self.results(host) if (d.get("res") or {}).get("changed")]

    def changed(self, host: str) -> int:
        return int(self.stats.get("changed", {}).get(host, 0))

    def published_fact(self, host: str, name: str, role: str, group: str) -> Any:
        """The fact `name` a role set on `host` in this run (e.g. d3_router_models, d3_metrics_targets); fails naming
        the role and the lab inventory group the host should be in when the run did not set it."""
        for event in self.events:
            data = event.get("event_data", {})
            facts = (data.get("res") or {}).get("ansible_facts") or {}
            if event.get("event") == "runner_on_ok" and data.get("host") == host and name in facts:
                return facts[name]
        raise AssertionError(f"the converge did not run {role} on {host} (is it in the lab inventory's {group}?)")

    def failed(self, host: str) -> int:
        return int(self.stats.get("failures", {}).get(host, 0))


def run_playbook(
    playbook: str,
    limit: str | None = None,
    extravars: dict[str, Any] | None = None,
    cmdline: str | None = None,
    inventory: Path = LAB_INVENTORY,
    timeout: int = 1800,
) -> Run:
    with tempfile.TemporaryDirectory(prefix="d3-runner-") as pdd:
        result = ansible_runner.run(
            private_data_dir=pdd,
            project_dir=str(ROOT),
            playbook=playbook,
            inventory=str(inventory),
            limit=limit,
            extravars=extravars or {},
            cmdline=cmdline,
            envvars={"ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"},
            quiet=True,
            timeout=timeout,
            suppress_env_files=True,
        )
        events = list(result.events)
        profile(playbook, limit, events)
        return Run(result.status, result.rc, result.stats or {}, events, result.stdout.read())


def profile(playbook: str, limit: str | None, events: list[dict[str, Any]]) -> None:
    """With D3_LAB_PROFILE=FILE set: append the run's task durations (host, task, seconds, from ansible-runner's
    events) to FILE as one JSON line: where a lab test's time goes (docs/testing.md). Not set (the suite): nothing."""
    out = os.environ.get("D3_LAB_PROFILE")
    if not out:
        return
    tasks = [(e["event_data"].get("host"), e["event_data"].get("task"), round(float(e["event_data"]["duration"]), 2))
             for e in events if e.get("event", "").startswith("runner_on_") and "duration" in e.get("event_data", {})]
    first = min((e["created"] for e in events if "created" in e), default="")
    last = max((e["created"] for e in events if "created" in e), default="")
    starts = [(e["created"], e["event_data"].get("task")) for e in events if e.get("event") == "playbook_on_task_start"]
    with open(out, "a", encoding="utf-8") as f:
        f.write(json.dumps({"playbook": playbook, "limit": limit, "first": first, "last": last, "tasks": tasks,
                            "starts": starts}) + "\n")  # fmt: skip


def recap(stdout: str, host: str = "localhost") -> dict[str, int]:
    """One host's PLAY RECAP counters (ok, changed, unreachable, failed, skipped, rescued, ignored)."""
    m = re.search(rf"^{re.escape(host)}\s*:\s*((?:\w+=\d+\s*)+)$", stdout, re.M)
    assert m, f"no PLAY RECAP line for {host}:\n{stdout[-3000:]}"
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(1))}


def recap_changed(stdout: str, host: str = "localhost") -> int:
    """changed= of a host's PLAY RECAP line; asserts the run had no unreachable or failed task."""
    counts = recap(stdout, host)
    assert counts["unreachable"] == 0 and counts["failed"] == 0, stdout[-3000:]
    return counts["changed"]


def ansible_playbook(*args: str, timeout: int = 900, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """ansible-playbook from the venv with the project's ansible.cfg (output uncoloured)."""
    return subprocess.run(
        [venv_tool("ansible-playbook"), *args], capture_output=True, text=True, env=ANSIBLE_ENV, cwd=cwd, timeout=timeout, check=False
    )
