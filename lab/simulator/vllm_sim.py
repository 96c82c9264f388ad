#!/usr/bin/env python3
"""LAB STAND-IN: a *simulator* of `vllm serve` (docker.io/vllm/vllm-openai:nightly) serving D3 decision models.

This is NOT vLLM. It exists only for the d3-fleet lab (no GPUs, no Hugging Face, no container registries
reachable). It reproduces the observable behaviour the fleet automation depends on:

* the command line of the vllm-openai entrypoint (argparse; unknown flags -> exit 2 like vLLM),
* GPU discovery like vLLM: /dev/nvidiaN device nodes + `nvidia-smi` (from the CDI mounts), CUDA_VISIBLE_DEVICES,
* offline model resolution from the Hugging Face cache ($HF_HOME/hub/models--ORG--NAME/snapshots/<rev>),
* vLLM's startup memory accounting (startup_memory: the profile batch, the share of the total torch sees, the
  profile run's peak, non-torch memory, --kv-cache-memory-bytes, the CUDA-graph estimate), ported from vLLM's source
  as separate code from the d3-fleet planner (it imports nothing of it; the stand-in values, one fixture and this
  project's out-of-memory wording are the same on both sides: docs/capacity.md "The second opinion"), fp8 KV cache
  dying on the first request,
* a cold start during which the port is not bound (connection refused), then /health, /v1/models,
  /v1/systemone, /v1/decisions and /metrics.

Memory model (per GPU; checked in vLLM's order, each failure exits 1 with vLLM's exception text; sources at
startup_memory):
  total   = torch.cuda.mem_get_info()'s total: STAND-IN table TORCH_TOTAL_MIB (an L4: 22.03 GiB), else nvidia-smi's
  budget  = --gpu-memory-utilization x total; free memory must cover it, free as torch sees it: total - what every
            process holds (nvidia-smi's memory.used: the lab claims, each with its CUDA context, 512 MiB STAND-IN)
  weights = d3_lab_simulated_bytes (the checkpoint's bytes, safetensors __metadata__) / TP, halved by --quantization
            fp8 on a BF16 checkpoint (online FP8); a pre-quantized checkpoint (config.json quantization_config, see
            checkpoint_quantization) counts as it is, and --quantization that disagrees with it is refused like vLLM
  profile = max_num_batched_tokens as `vllm serve` sets it x a STAND-IN activation per token (the Qwen3.5 forward's
            largest transient); + STAND-IN non-torch memory (512 MiB); + without --enforce-eager the CUDA-graph
            estimate, the field report's fixed 18.40 GiB vision-encoder capture allocation
  weights + profile (+ a --kv-cache-memory-bytes pool) must fit the total beside a STAND-IN CUDA context (512 MiB)
                                                                  -> torch.OutOfMemoryError
  KV pool = budget - weights - profile (or --kv-cache-memory-bytes); its layout is vLLM's from the model's
            config.json (kv_layout: full-attention pages with the attention block raised to hold a Gated DeltaNet
            state, state pages padded to it, layers in groups); one sequence of max_model_len must fit -> ValueError
            (vLLM's "... larger than the available KV cache memory ..."); then vLLM's two lines "GPU KV cache size: N
            tokens" and "Maximum concurrency for N tokens per request: Xx"

Driver (CUDA 13 image): driver >= 580, or >= 535 with VLLM_ENABLE_CUDA_COMPATIBILITY=1 (forward compatibility);
otherwise CUDA initialisation fails with cudaErrorInsufficientDriver (see check_driver).

GPU memory held (lab stand-in detail): the simulator writes a claim file per process into the lab driver's shared
claims directory ($LAB_NVIDIA_CLAIMS_DIR, default /run/lab-nvidia/claims, mounted into containers by the lab CDI
spec) and holds an exclusive flock on it while it lives; the lab nvidia-smi adds up the claims whose lock is still
held, so a dead process's memory is free again (like a real GPU). See GpuClaim.

Environment knobs (simulator only):
  D3_SIM_COLD_START_S     cold start in seconds, overriding the per-size default (tests)
  D3_SIM_COLD_START_SCALE factor on the per-size cold start (default 1.0: 150 s for d3's 52.2 GB of BF16 weights,
                          the field report's 2.5 min, proportional to the checkpoint size); the lab image sets it
  D3_SIM_REQUEST_MS       STAND-IN: the latency in ms of one /v1/systemone answer served alone, whatever its
                          questions, replacing the per-size latency below (e.g. 1000 for clients whose requests take
                          >= 1 s; the batch slowdown and the max_num_seqs queue still add to it)
  D3_SIM_MS_PER_QUESTION  fixed request latency per question in ms, overriding the per-size latency below (tests)
  D3_SIM_LATENCY_SCALE    factor on the request latency, whichever of the three gives it (default 1.0; the
                          nightly-next image bakes 1.5: "the next nightly answers slower", see build.sh)
  D3_SIM_MAX_NUM_SEQS     requests served at once when --max-num-seqs is not given (default 8, a small
                          --max-num-seqs); more wait in a queue
  D3_SIM_BATCH_SLOWDOWN   each request already running adds this fraction to a new one's latency (default 0.3)
  D3_SIM_FLIP_STATES      STAND-IN seeded regression (bench-compare's paired accuracy test): comma-separated words;
                          the answers to a state containing one are turned around (see seeded_flip)
  D3_SIM_WEDGE_FILE       STAND-IN for a wedged engine (default /tmp/d3-sim-wedge): while this file exists, a request
                          that reaches an engine slot holds it and never finishes (running stays up, nothing is
                          counted finished, /health still answers), as a hung vLLM engine looks from outside; the
                          held requests finish once it is removed. tests/lab/test_monitor.py's wedge drill
  VLLM_HTTP_TIMEOUT_KEEP_ALIVE  vLLM's own (vllm/envs.py, default 5): an idle keep-alive connection is closed this
                          many seconds after its last response, like uvicorn (see Handler.handle_one_request)

Request latency and answers per model size (LAB STAND-IN, for playbooks/bench.yml; see SizeProfile): a request
takes REQUEST_BASE_MS + questions x per-question ms, the per-question ms growing with the weights per GPU, fitted
to the field report's two measured points (d3 27B TP 2: 4 questions ~470 ms; d3-flash: ~215 ms), so lab latencies
resemble them BY CONSTRUCTION and say nothing about D3. Answers follow the state's words (keyword and concept
overlap) plus deterministic per-model noise that is larger for smaller checkpoints, so a decision suite's accuracy
differs per case and per model. Every figure measured against the simulator is simulated.
  D3_SIM_BEHAVIOUR=never-ready (baked into the nightly-broken tag).
Stdlib only; Python 3.11.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import math
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import traceback
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, NoReturn

SIM_VERSION = "0.33.1.dev0+d3sim"  # what /version reports; "d3sim" marks the simulator
GIB = 1024**3
MIB = 1024**2
# Field report: vLLM's profiling of the Qwen3.5 vision encoder during CUDA graph capture allocates a fixed 18.4 GB.
VISION_PROBE_GIB = 18.40
DEFAULT_MAX_POSITIONS = 262144
# --kv-cache-dtype choices this simulator models (vllm/config/cache.py CacheDType has these and more): the unquantized
# three (2 bytes for D3) and the FP8 spellings (1 byte; they die on D3's first encoder-attention request)
KV_DTYPES = ("auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2")
QUANTIZATIONS = ("fp8", "awq", "awq_marlin", "gptq", "gptq_marlin", "compressed-tensors", "bitsandbytes",
                 "gguf", "modelopt", "fbgemm_fp8", "mxfp4", "experts_int8")
MAX_QUESTIONS = 64
# The labels' share of the probability over the vocabulary (vLLM multiplies it into `confidence`).
LABEL_MASS = 0.98
MAX_CHOICES = 26
# vLLM StructuredDecisionRequest / QuestionSpec (vllm-project/vllm
# vllm/entrypoints/generate/structured_decisions/protocol.py). Both derive from OpenAIBaseModel
# (vllm/entrypoints/openai/engine/protocol.py: ConfigDict(extra="allow") + __log_extra_fields__), so an unknown
# *request* field is accepted, ignored and logged ("The following fields were present in the request but ignored");
# an unknown *question* field is refused by serving.py ("question {qid!r}: unknown field(s) [...]").
REQUEST_FIELDS = {"model", "state", "questions", "instructions", "decision_template", "chat_template_kwargs", "seed",
                  "priority", "request_id"}
QUESTION_FIELDS = {"type", "instructions", "criteria"}
# Cold start: the field report's d3 (27B, 52.2 GB BF16 checkpoint, domain-facts 1.1) took 2.5 min to serve on L4s;
# other sizes scale with their checkpoint bytes.
D3_COLD_START_S = 150.0
D3_BF16_BYTES = 52_200_000_000
# CUDA 13 (vLLM's Dockerfile pins CUDA_VERSION=13.0.x) needs driver R580+; R535+ data-center drivers run it in
# forward-compatibility mode (VLLM_ENABLE_CUDA_COMPATIBILITY=1, vllm/envs.py). tests/contracts/versions.yml.
CUDA_RUNTIME = (13, 0)
MIN_DRIVER = 580
MIN_COMPAT_DRIVER = 535
CLAIMS_DIR_DEFAULT = "/run/lab-nvidia/claims"


class SimExit(Exception):
    """Startup failure: printed like vLLM's traceback, then the process exits with `code`."""

    def __init__(self, exc_type: str, message: str, where: str = "vllm/v1/engine/core.py", code: int = 1):
        super().__init__(message)
        self.exc_type = exc_type
        self.message = message
        self.where = where
        self.code = code


# --------------------------------------------------------------------------------------------- logging
def log(level: str, where: str, msg: str) -> None:
    """Print a vLLM-style log line: `INFO 11-29 10:00:00 [api_server.py:1234] message`."""
    stamp = time.strftime("%m-%d %H:%M:%S")
    print(f"{level} {stamp} [{where}] {msg}", flush=True)


def die(err: SimExit) -> NoReturn:
    log("ERROR", "core.py:708", "EngineCore failed to start.")
    print("Traceback (most recent call last):", flush=True)
    print(f'  File "/usr/local/lib/python3.12/dist-packages/{err.where}", line 1, in <module>', flush=True)
    print(f"{err.exc_type}: {err.message}", flush=True)
    print("RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
          flush=True)
    sys.exit(err.code)


# --------------------------------------------------------------------------------------------- arguments
def parse_len(text: str) -> int:
    """vLLM's human_readable_int (vllm/engine/arg_utils.py), the type of --max-num-batched-tokens and
    --kv-cache-memory-bytes: '25.6k' -> 25,600 (decimal suffixes k m g t take decimals), '1K' -> 1,024 (binary K M G T
    take whole numbers only: '1.5G' is refused), else a plain int()."""
    value = text.strip()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", value)
    if m:
        number, suffix = m.groups()
        if suffix in "kmgt":
            return int(float(number) * 10 ** (3 * ("kmgt".index(suffix) + 1)))
        try:
            return int(number) * 2 ** (10 * ("KMGT".index(suffix) + 1))
        except ValueError:
            raise argparse.ArgumentTypeError(f"Decimals are not allowed with binary suffixes like {suffix}. Did you "
                                             f"mean to use {number}{suffix.lower()} instead?") from None
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vllm serve", description="Launch a local OpenAI-compatible API server "
                                "(d3-fleet LAB SIMULATOR, not vLLM).", allow_abbrev=False)
    p.add_argument("model_tag", nargs="?", default=None, help="model (positional form, newer images)")
    p.add_argument("--model", default=None)
    p.add_argument("--revision", default=None)
    p.add_argument("--served-model-name", nargs="+", default=None)
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    p.add_argument("--max-model-len", type=parse_len, default=None)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--quantization", "-q", choices=QUANTIZATIONS, default=None)
    p.add_argument("--enforce-eager", action=argparse.BooleanOptionalAction, default=False)
    p.add_argument("--kv-cache-dtype", choices=KV_DTYPES, default="auto")
    p.add_argument("--api-key", nargs="+", default=None)
    p.add_argument("--max-num-batched-tokens", type=parse_len, default=None)
    p.add_argument("--kv-cache-memory-bytes", type=parse_len, default=None)
    p.add_argument("--max-num-seqs", type=int, default=None)
    # SchedulerConfig: without chunked prefill `vllm serve` profiles max(--max-model-len, 2048) tokens
    p.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--disable-custom-all-reduce", action="store_true")
    p.add_argument("--uvicorn-log-level", choices=("debug", "info", "warning", "error", "critical", "trace"),
                   default="info")
    p.add_argument("--trust-remote-code", action="store_true")
    # needed for a request's own decision_template (protocol.py: "Needs the server to run with
    # --trust-request-chat-template")
    p.add_argument("--trust-request-chat-template", action="store_true")
    return p


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)  # unknown flag -> "vllm serve: error: unrecognized arguments", exit 2
    if args.model_tag and args.model and args.model_tag != args.model:
        parser.error(f"model given twice: positional {args.model_tag!r} and --model {args.model!r}")
    args.model = args.model_tag or args.model or "Qwen/Qwen3-0.6B"  # vLLM's default model
    if not 0.0 < args.gpu_memory_utilization <= 1.0:
        parser.error("argument --gpu-memory-utilization: must be in (0, 1]")
    if args.tensor_parallel_size < 1:
        parser.error("argument --tensor-parallel-size/-tp: must be >= 1")
    if args.api_key is None and os.environ.get("VLLM_API_KEY"):
        args.api_key = [os.environ["VLLM_API_KEY"]]
    args.served_model_name = args.served_model_name or [args.model]
    return args


# --------------------------------------------------------------------------------------------- GPUs
@dataclass
class Gpu:
    index: int
    name: str
    uuid: str
    total_mib: int
    used_mib: int
    driver: str
    compute_cap: str
    free_mib: int = -1  # memory.free (total - reserved - used); -1: not reported, use total - used

    @property
    def free(self) -> int:
        return self.free_mib if self.free_mib >= 0 else self.total_mib - self.used_mib


NO_GPU = SimExit("RuntimeError", "No CUDA GPUs are available", "torch/cuda/__init__.py")


def parse_nvidia_smi(text: str) -> list[Gpu]:
    """Rows of `--query-gpu=index,name,uuid,memory.total,memory.used,driver_version,compute_cap[,memory.free]
    --format=csv,noheader,nounits`."""
    gpus = []
    for line in text.splitlines():
        if not line.strip():
            continue
        f = [x.strip() for x in line.split(",")]
        if len(f) < 7:
            raise ValueError(f"unexpected nvidia-smi line: {line!r}")
        free = int(float(f[7])) if len(f) > 7 and f[7] else -1
        gpus.append(Gpu(int(f[0]), f[1], f[2], int(float(f[3])), int(float(f[4])), f[5], f[6], free))
    return gpus


def device_node_indices(dev: Path = Path("/dev")) -> list[int]:
    try:
        names = os.listdir(dev)
    except OSError:
        return []
    return sorted(int(n[6:]) for n in names if re.fullmatch(r"nvidia\d+", n))


def apply_cuda_visible(gpus: list[Gpu], spec: str | None) -> list[Gpu]:
    """CUDA_VISIBLE_DEVICES: ordinals or UUID (prefixes); like CUDA, an invalid entry ends the list."""
    if spec is None:
        return gpus
    chosen: list[Gpu] = []
    for item in (s.strip() for s in spec.split(",")):
        match: Gpu | None = None
        if item.isdigit():
            match = gpus[int(item)] if int(item) < len(gpus) else None
        elif item:
            hits = [g for g in gpus if g.uuid.startswith(item) or g.uuid.startswith("GPU-" + item)]
            match = hits[0] if len(hits) == 1 else None
        if match is None or match in chosen:
            break
        chosen.append(match)
    return chosen


def query_gpus() -> list[Gpu]:
    """All GPUs nvidia-smi reports, with their memory now (raises NO_GPU)."""
    query = ["nvidia-smi",
             "--query-gpu=index,name,uuid,memory.total,memory.used,driver_version,compute_cap,memory.free",
             "--format=csv,noheader,nounits"]
    try:
        out = subprocess.run(query, capture_output=True, text=True, timeout=30, check=True).stdout
        return parse_nvidia_smi(out)
    except (OSError, subprocess.SubprocessError, ValueError):
        raise NO_GPU from None


def torch_free_mib(gpu: Gpu) -> int:
    """What torch.cuda.mem_get_info() reports free: torch's total (torch_total_mib, 22,560 MiB for an L4, not
    nvidia-smi's 23,034) less the memory every process holds, which nvidia-smi's memory.used adds up (in the lab the
    stand-in driver sums the live claims, each process's CUDA context included: GpuClaim)."""
    return torch_total_mib(gpu.name, gpu.total_mib) - gpu.used_mib


def free_mib(gpus: list[Gpu]) -> dict[str, int]:
    """Free MiB per GPU UUID now, as torch sees it (torch_free_mib). This process's own memory is in nvidia-smi's
    figure when its claim is published; otherwise (no claims directory) it is taken off here."""
    now = {g.uuid: torch_free_mib(g) for g in query_gpus()}
    own = {} if CLAIM.published else CLAIM.current
    return {g.uuid: now.get(g.uuid, torch_free_mib(g)) - own.get(g.uuid, 0) for g in gpus}


def detect_gpus() -> list[Gpu]:
    nodes = device_node_indices()
    if not nodes:
        raise NO_GPU
    rows = query_gpus()
    # Only GPUs whose device node was given to the container are usable (like NVML in a container).
    usable = [g for g in rows if g.index in nodes]
    if len(usable) < min(len(nodes), len(rows)):
        usable = rows[: len(nodes)]
    usable = apply_cuda_visible(usable, os.environ.get("CUDA_VISIBLE_DEVICES"))
    if not usable:
        raise NO_GPU
    return usable


def driver_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text)[:3]) or (0,)


# CUDA version each driver branch supports natively (NVIDIA CUDA Toolkit release notes, "CUDA Toolkit and Minimum
# Required Driver Version"; not fetched in this session: UNCONFIRMED per branch, R580 = 13.0 is in versions.yml).
DRIVER_CUDA = ((580, (13, 0)), (575, (12, 9)), (570, (12, 8)), (560, (12, 6)), (555, (12, 5)), (550, (12, 4)),
               (545, (12, 3)), (535, (12, 2)), (530, (12, 1)), (525, (12, 0)))


def driver_cuda(major: int) -> tuple[int, int]:
    return next((cuda for branch, cuda in DRIVER_CUDA if major >= branch), (11, 8))


def check_driver(gpus: list[Gpu]) -> None:
    """CUDA 13 runtime on this driver? Like the real image: R580+, or R535+ in forward-compatibility mode.

    Error texts: the CUDA runtime's cudaErrorInsufficientDriver (35) string "CUDA driver version is insufficient
    for CUDA runtime version" (cuda_runtime_api.h / cudaGetErrorString) and PyTorch's wording for it, raised by
    torch.cuda's lazy init (c10/cuda/CUDAFunctions.cpp): "The NVIDIA driver on your system is too old (found
    version 12080). ...". Which of the two a given vLLM nightly prints first is UNCONFIRMED; both are printed.
    """
    major = driver_tuple(gpus[0].driver)[0]
    compat = os.environ.get("VLLM_ENABLE_CUDA_COMPATIBILITY", "0").strip().lower() in ("1", "true", "yes")
    if major >= MIN_DRIVER:
        return
    if compat and major >= MIN_COMPAT_DRIVER:
        log("INFO", "platforms/cuda.py:96", f"VLLM_ENABLE_CUDA_COMPATIBILITY=1: driver {gpus[0].driver} runs CUDA "
            f"{CUDA_RUNTIME[0]}.{CUDA_RUNTIME[1]} through the CUDA forward-compatibility libraries (data-center GPU)")
        return
    cuda = driver_cuda(major)
    found = cuda[0] * 1000 + cuda[1] * 10
    log("WARNING", "torch/cuda/__init__.py:182", "CUDA initialization: CUDA driver version is insufficient for CUDA "
        "runtime version (cudaErrorInsufficientDriver)")
    raise SimExit("RuntimeError", f"The NVIDIA driver on your system is too old (found version {found}). Please "
                  "update your GPU driver by downloading and installing a new version from the URL: "
                  "http://www.nvidia.com/Download/index.aspx Alternatively, go to: https://pytorch.org to install a "
                  "PyTorch version that has been compiled with your version of the CUDA driver.",
                  "torch/cuda/__init__.py")


class GpuClaim:
    """LAB STAND-IN detail: the GPU memory this process holds, published for the lab nvidia-smi.

    One JSON file per process in the claims directory ({"pid", "process_name", "gpus": {uuid: MiB}}), exclusively
    flock'd for the process's lifetime: when the process dies the kernel drops the lock and the lab nvidia-smi no
    longer counts the file (flock works across containers on the same bind-mounted host directory). A change is
    written to a new locked file that is renamed over the old one, so a reader never sees a claim half-written or
    unlocked. Without the directory (a container not started through the lab CDI spec) nothing is published.
    """

    def __init__(self, directory: str | None = None) -> None:
        self.dir = Path(directory or os.environ.get("LAB_NVIDIA_CLAIMS_DIR") or CLAIMS_DIR_DEFAULT)
        self.name = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}.json"
        self.fd: int | None = None
        self.current: dict[str, int] = {}

    @property
    def published(self) -> bool:
        return self.fd is not None

    @property
    def path(self) -> Path:
        return self.dir / self.name

    def set(self, per_gpu_mib: dict[str, int]) -> None:
        self.current = {k: int(v) for k, v in per_gpu_mib.items()}
        if not self.dir.is_dir():
            return
        tmp = self.dir / f".{self.name}.{uuid.uuid4().hex[:6]}.tmp"
        fd = os.open(tmp, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, json.dumps({"pid": os.getpid(), "process_name": "python3",
                                 "gpus": {k: int(v) for k, v in per_gpu_mib.items()}}).encode())
        os.fchmod(fd, 0o644)
        os.replace(tmp, self.path)
        old, self.fd = self.fd, fd
        if old is not None:
            os.close(old)

    def release(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                self.path.unlink()
            os.close(self.fd)
            self.fd = None
        self.current = {}


CLAIM = GpuClaim()


def gib2(b: float) -> float:
    """vLLM's `GiB = lambda b: round(b / GiB_bytes, 2)` in Worker.init_device."""
    return round(b / GIB, 2)


# --------------------------------------------------------------------------------------------- model
@dataclass
class Model:
    repo: str
    snapshot: Path
    config: dict[str, Any]
    bf16_bytes: int  # the checkpoint's weight bytes (BF16 for the six sizes; quantized for a variant)
    quant_method: str | None = None  # detected from config.json (checkpoint_quantization)


def hf_hub_dir() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    return Path(os.environ.get("HF_HOME", "/root/.cache/huggingface")) / "hub"


def model_missing(repo: str, revision: str | None) -> SimExit:
    offline = os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on")
    why = ("Cannot find an appropriate cached snapshot folder for the specified revision on the local disk and "
           "outgoing traffic has been disabled. To enable repo look-ups and downloads online, pass "
           "'local_files_only=False' or set HF_HUB_OFFLINE=0." if offline else
           "We couldn't connect to 'https://huggingface.co' to load the files, and couldn't find them in the "
           "cached files (simulator: never online).")
    return SimExit("huggingface_hub.errors.LocalEntryNotFoundError",
                   f"Cannot find the requested files in the local cache for {repo!r} "
                   f"(revision {revision or 'main'!r}, cache {hf_hub_dir()}). {why}",
                   "huggingface_hub/file_download.py")


def resolve_snapshot(repo: str, revision: str | None) -> Path:
    local = Path(repo)
    if local.is_absolute() and (local / "config.json").is_file():
        return local
    repo_dir = hf_hub_dir() / ("models--" + repo.replace("/", "--"))
    rev = revision or "main"
    if re.fullmatch(r"[0-9a-f]{40}", rev):
        commit = rev
    else:
        ref = repo_dir / "refs" / rev
        if not ref.is_file():
            raise model_missing(repo, revision)
        commit = ref.read_text().strip()
    snap = repo_dir / "snapshots" / commit
    if not (snap / "config.json").is_file():
        raise model_missing(repo, revision)
    return snap


def safetensors_header(path: Path) -> dict[str, Any]:
    with path.open("rb") as fh:
        (size,) = struct.unpack("<Q", fh.read(8))
        if size > 100 * MIB:
            raise ValueError(f"{path}: implausible safetensors header size {size}")
        header = json.loads(fh.read(size))
    if not isinstance(header, dict):
        raise ValueError(f"{path}: safetensors header is not an object")
    return header


def load_model(repo: str, revision: str | None) -> Model:
    snap = resolve_snapshot(repo, revision)
    config = json.loads((snap / "config.json").read_text())
    total = 0
    shards = sorted(snap.glob("*.safetensors"))
    if not shards:
        raise SimExit("RuntimeError", f"Cannot find any model weights with `{repo}` (no *.safetensors in {snap})",
                      "vllm/model_executor/model_loader/default_loader.py")
    for shard in shards:
        header = safetensors_header(shard)
        meta = header.get("__metadata__") or {}
        if "d3_lab_simulated_bytes" in meta:
            total += int(meta["d3_lab_simulated_bytes"])
        else:  # no lab metadata: the real tensor bytes
            total += max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
    return Model(repo, snap, config, total)


class QuantizationMismatch(Exception):
    """vLLM's ModelConfig validation error (raised in the API server process, before any engine starts)."""


def checkpoint_quantization(config: dict[str, Any]) -> tuple[bool, str | None]:
    """(has a quantization config, its quant_method) like vLLM's ModelConfig (vllm-project/vllm vllm/config/model.py,
    commit 0052a5b8): `_parse_quant_hf_config` reads config.json's `quantization_config`, else `compression_config`
    (compressed-tensors), else the multimodal `text_config`'s; `_verify_quantization` then takes
        quant_method = quant_cfg.get("quant_method", "").lower()
        quant_method = quant_method.replace("compressed_tensors", "compressed-tensors")
        ...
        quant_method = quant_method if quant_method != "" else None
    (vLLM's per-method overrides, e.g. awq -> awq_marlin, are not simulated: the lab's checkpoints are
    compressed-tensors, which vLLM keeps as it is)."""
    def parse(cfg: dict[str, Any]) -> Any:
        quant = cfg.get("quantization_config")
        return cfg.get("compression_config") if quant is None else quant

    quant_cfg = parse(config)
    if quant_cfg is None and isinstance(config.get("text_config"), dict):
        quant_cfg = parse(config["text_config"])
    if not isinstance(quant_cfg, dict):
        return False, None
    method = str(quant_cfg.get("quant_method", "")).lower().replace("compressed_tensors", "compressed-tensors")
    return True, method or None


def verify_quantization(args: argparse.Namespace, model: Model) -> None:
    """vLLM's check, verbatim in its message:
        if self.quantization is None:
            self.quantization = quant_method
        elif self.quantization != quant_method:
            raise ValueError(
                "Quantization method specified in the model config "
                f"({quant_method}) does not match the quantization "
                f"method specified in the `quantization` argument "
                f"({self.quantization}).")
    ModelConfig is a pydantic dataclass, so the ValueError surfaces as a pydantic ValidationError."""
    present, method = checkpoint_quantization(model.config)
    if not present:
        return
    model.quant_method = method
    if args.quantization is None:
        args.quantization = method
        log("INFO", "model.py:1012", f"(simulator) quantization {method} detected from the checkpoint's config.json")
    elif args.quantization != method:
        raise QuantizationMismatch(
            "Quantization method specified in the model config "
            f"({method}) does not match the quantization "
            f"method specified in the `quantization` argument "
            f"({args.quantization})."
        )


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    tc = config.get("text_config")
    return {**config, **tc} if isinstance(tc, dict) else config


# vLLM's KV cache arithmetic for a Qwen3.5 Gated DeltaNet hybrid, per GPU (each TP rank holds every layer, a 1/TP
# share of its heads). Sources, vllm-project/vllm:
#  - vllm/v1/kv_cache_interface.py: a full-attention layer's page = 2 (K, V) x block_size x KV heads x head_dim x
#    dtype bytes; FullAttentionSpec.max_memory_usage_bytes = cdiv(max_model_len, block_size) x page; a MambaSpec page
#    = sum(prod(shape) x dtype bytes) of its states, padded to page_size_padded; one block per sequence
#    (mamba_cache_mode "none": prefix caching off; UNCONFIRMED for D3's pooling runner), block_size = max_model_len.
#  - vllm/model_executor/layers/mamba/mamba_utils.py MambaStateShapeCalculator.gated_delta_net_state_shape:
#    conv_dim = head_k_dim x num_k_heads x 2 + head_v_dim x num_v_heads; conv state (kernel - 1, conv_dim / TP)
#    in the model dtype, temporal state (num_v_heads / TP, head_v_dim, head_k_dim) in mamba_ssm_dtype.
#  - vllm/platforms/interface.py _align_hybrid_block_size (earlier HybridAttentionMambaModelConfig in
#    vllm/model_executor/models/config.py): attn_block_size = alignment x cdiv(mamba page, alignment x attention
#    page of one token) ("Setting attention block size to %d tokens ..."), mamba page padded to the attention page.
#  - vllm/v1/core/kv_cache_utils.py (commit 001cabc1): _get_kv_cache_groups_uniform_page_size (layers grouped by
#    type in groups of min(#layers per type), or of the max when max < 1.5 x min), get_num_blocks
#    (available // page // group_size), _max_memory_usage_bytes_from_groups (group_size x page x sum of blocks one
#    max_model_len sequence needs per group), _check_enough_kv_cache_memory (the two ValueErrors, verbatim below),
#    _report_kv_cache_config (GPU KV cache size = num_blocks // #groups x smallest block size;
#    get_max_concurrency_for_kv_cache_config = num_blocks / blocks per sequence).
# STAND-IN assumption: the alignment is 16, the default --block-size and the smallest kernel block of the CUDA
# attention backends (max of the two in _align_hybrid_block_size); which backend an L4 picks is not simulated.
KV_ALIGNMENT = 16
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4}
# Qwen3_5TextConfig's defaults (vllm/transformers_utils/configs/qwen3_5.py), used when config.json omits a key
QWEN3_5_DEFAULTS = {"num_hidden_layers": 32, "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 256,
                    "hidden_size": 4096, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
                    "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
                    "full_attention_interval": 4}


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class KvLayout:
    """One GPU's KV cache layout: attention tokens per block, the (uniform) page bytes of one block of one layer,
    layers per group, and the number of full-attention and GDN-state groups."""

    block_size: int
    page_bytes: int
    group_size: int
    attn_groups: int
    state_groups: int
    state_page_bytes: int = 0  # the GDN state before padding (0: no GDN layers)

    @property
    def groups(self) -> int:
        return self.attn_groups + self.state_groups

    def blocks_per_sequence(self, max_len: int) -> int:
        return self.attn_groups * cdiv(max_len, self.block_size) + self.state_groups

    def needed_bytes(self, max_len: int) -> int:
        """_max_memory_usage_bytes_from_groups: one sequence of max_len tokens."""
        return self.group_size * self.page_bytes * self.blocks_per_sequence(max_len)

    def num_blocks(self, available: float) -> int:
        return max(int(available // self.page_bytes // self.group_size), 0)

    def capacity(self, available: float, max_len: int) -> tuple[int, float]:
        """(GPU KV cache size in tokens, maximum concurrency) as _report_kv_cache_config logs them."""
        blocks = self.num_blocks(available)
        smallest = min(self.block_size, max_len) if self.state_groups else self.block_size
        return blocks // self.groups * smallest, blocks / self.blocks_per_sequence(max_len)

    def estimate_max_model_len(self, available: float, max_len: int) -> int:
        """_estimate_max_model_len_from_groups: the longest max_model_len (<= max_len) that fits, 0 if none."""
        if self.needed_bytes(1) > available:
            return 0
        lo, hi, best = 1, max_len, 1
        while lo <= hi:
            mid = (lo + hi) // 2
            if self.needed_bytes(mid) <= available:
                best, lo = mid, mid + 1
            else:
                hi = mid - 1
        return best


def kv_layout(config: dict[str, Any], kv_dtype: str, tp: int) -> KvLayout:
    """vLLM's KV cache spec of this config.json per GPU (see the sources above)."""
    c = {**QWEN3_5_DEFAULTS, **text_config(config)}
    layers = int(c["num_hidden_layers"])
    types = c.get("layer_types")
    if not (isinstance(types, list) and len(types) == layers):
        interval = int(c["full_attention_interval"])
        types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(layers)]
    n_attn = sum(1 for t in types if t == "full_attention")
    n_state = sum(1 for t in types if t == "linear_attention")
    model_bytes = DTYPE_BYTES.get(str(c.get("dtype") or c.get("torch_dtype") or "bfloat16"), 2)
    kv_bytes = 1 if kv_dtype.startswith("fp8") else model_bytes
    kv_heads = max(1, int(c["num_key_value_heads"]) // tp)  # ModelConfig.get_num_kv_heads
    attn_1tok = 2 * kv_heads * int(c["head_dim"]) * kv_bytes
    if n_state == 0:
        return KvLayout(KV_ALIGNMENT, KV_ALIGNMENT * attn_1tok, n_attn, 1 if n_attn else 0, 0)
    k_heads, v_heads = int(c["linear_num_key_heads"]), int(c["linear_num_value_heads"])
    k_dim, v_dim = int(c["linear_key_head_dim"]), int(c["linear_value_head_dim"])
    conv_dim = k_dim * k_heads * 2 + v_dim * v_heads
    # UNSETTLED: vLLM's temporal-state dtype is cache_config.mamba_ssm_cache_dtype (MambaStateDtypeCalculator.
    # gated_delta_net_state_dtype; "auto" = the model dtype); config.json's mamba_ssm_dtype reaches it only through
    # Qwen3_5ForConditionalGenerationConfig (vllm/model_executor/models/config.py MODELS_CONFIG_MAP, keyed on the
    # architecture name: D3's is D3ForSequenceClassification). Taken from config.json here (docs/capacity.md).
    ssm_bytes = DTYPE_BYTES.get(str(c.get("mamba_ssm_dtype") or "float32"), 4)
    state = ((int(c["linear_conv_kernel_dim"]) - 1) * (conv_dim // tp) * model_bytes
             + (v_heads // tp) * v_dim * k_dim * ssm_bytes)
    block = max(KV_ALIGNMENT, KV_ALIGNMENT * cdiv(state, KV_ALIGNMENT * attn_1tok)) if n_attn else KV_ALIGNMENT
    page = block * attn_1tok if n_attn else state
    small, large = min(n_attn, n_state) or max(n_attn, n_state), max(n_attn, n_state)
    group = large if large < small * 1.5 else small
    return KvLayout(block, page, group, cdiv(n_attn, group), cdiv(n_state, group), state)


# vLLM's startup memory accounting, per GPU, ported from vLLM's source (NOT from the d3-fleet planner: the lab's
# startup log is a second opinion on it; tests/test_capacity_second_opinion.py compares the two). Sources,
# vllm-project/vllm:
#  - vllm/v1/worker/gpu_worker.py init_device: init_snapshot = MemorySnapshot (torch.cuda.mem_get_info: free, total);
#    requested_memory = request_memory(init_snapshot, cache_config) = total_memory * gpu_memory_utilization.
#  - gpu_worker.py determine_available_memory: `if kv_cache_memory_bytes := cache_config.kv_cache_memory_bytes:`
#    profile_run(), log "... reserved X GiB memory for KV Cache as specified by kv_cache_memory_bytes config and
#    skipped memory profiling ...", return it; else memory_profiling(init_snapshot, weights_memory=model_memory_usage)
#    around profile_run(): non_kv_cache_memory = non_torch_increase + torch_peak_increase + weights_memory;
#    cudagraph_memory_estimate = profile_cudagraph_memory() when cudagraph_mode != NONE (--enforce-eager: NONE),
#    applied when VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS (default on since v0.21);
#    available_kv_cache_memory_bytes = requested_memory - non_kv_cache_memory - cudagraph_memory_estimate_applied.
#  - vllm/engine/arg_utils.py get_batch_defaults: `vllm serve` (UsageContext.OPENAI_API_SERVER) takes
#    max_num_batched_tokens 2048 and max_num_seqs 256, or 8192 and 1024 when `device_memory >= 70 * GiB_bytes and
#    "a100" not in device_name` (device_name = current_platform.get_device_name().lower(): for CUDA the NVML name of
#    the process's device 0, the first GPU it is given, as nvidia-smi names it);
#    _set_default_max_num_seqs_and_batched_tokens_args: if the user gave none, without chunked prefill
#    max(max_model_len, default), then min(max_num_seqs * max_model_len, that). profile_run() runs
#    _dummy_run(max_num_tokens) with max_num_tokens = max_num_batched_tokens.
# What the simulator cannot measure is a STAND-IN, labelled where it is defined: the torch peak of the profile run
# (profile_activation_bytes_per_token), the non-torch increase (NON_TORCH_STAND_IN_MIB), the CUDA-graph estimate
# (the field report's VISION_PROBE_GIB), the CUDA context outside the share (CUDA_CONTEXT_STAND_IN_MIB) and the total
# torch reports for a GPU (TORCH_TOTAL_MIB).
SERVE_BATCHED_TOKENS = {False: 2048, True: 8192}  # get_batch_defaults, OPENAI_API_SERVER: small / large defaults
SERVE_MAX_NUM_SEQS = 256  # get_batch_defaults, OPENAI_API_SERVER, below 70 GiB
SERVE_MAX_NUM_SEQS_FROM_70_GIB = 1024
# STAND-IN: memory_profiling's non_torch_increase (cuBLAS / NCCL workspaces), measured by vLLM, in no source: 512 MiB
NON_TORCH_STAND_IN_MIB = int(os.environ.get("D3_SIM_NON_TORCH_MIB", "512"))
# STAND-IN: the CUDA context and NCCL buffers, outside the share (allocated before the init snapshot); no source
CUDA_CONTEXT_STAND_IN_MIB = 512
# STAND-IN: torch.cuda.mem_get_info()'s total for a GPU model at nvidia-smi's memory.total. An L4 (23034 MiB in
# nvidia-smi) is "GPU 0 has a total capacity of 22.03 GiB" in PyTorch's own OOM messages: 22560 MiB
# (tests/contracts/vllm/gpu-memory.json). Any other GPU: nvidia-smi's total (not known).
TORCH_TOTAL_MIB = {("NVIDIA L4", 23034): 22560}


def torch_total_mib(name: str, nvidia_smi_total_mib: int) -> int:
    return TORCH_TOTAL_MIB.get((name, nvidia_smi_total_mib), nvidia_smi_total_mib)


def serve_large_defaults(total_bytes: int, device_name: str) -> bool:
    """get_batch_defaults: `device_memory >= 70 * GiB_bytes and "a100" not in device_name` (the name lowercased)."""
    return total_bytes >= 70 * GIB and "a100" not in device_name.lower()


def serve_max_num_batched_tokens(given: int | None, max_len: int, chunked: bool, total_bytes: int,
                                 seqs: int | None = None, device_name: str = "") -> int:
    """max_num_batched_tokens as `vllm serve` resolves it (arg_utils.py, see above); `seqs`: --max-num-seqs."""
    if given is not None:
        return given
    tokens = SERVE_BATCHED_TOKENS[serve_large_defaults(total_bytes, device_name)]
    if not chunked:
        tokens = max(max_len, tokens)
    return min((serve_default_max_num_seqs(total_bytes, device_name) if seqs is None else seqs) * max_len, tokens)


def serve_default_max_num_seqs(total_bytes: int, device_name: str = "") -> int:
    return SERVE_MAX_NUM_SEQS_FROM_70_GIB if serve_large_defaults(total_bytes, device_name) else SERVE_MAX_NUM_SEQS


def serve_max_num_seqs(given: int | None, batched: int, total_bytes: int, device_name: str = "") -> int:
    """_set_default_max_num_seqs_and_batched_tokens_args (vllm/engine/arg_utils.py): `if orig_max_num_seqs is None:
    self.max_num_seqs = min(self.max_num_seqs, self.max_num_batched_tokens)`; a given --max-num-seqs is kept."""
    return min(serve_default_max_num_seqs(total_bytes, device_name), batched) if given is None else given


def scheduler_config_error(batched: int, seqs: int, max_len: int, chunked: bool) -> str | None:
    """SchedulerConfig.verify_max_model_len (vllm/config/scheduler.py), its two ValueErrors in their order."""
    if batched < max_len and not chunked:
        return (f"max_num_batched_tokens ({batched}) is smaller than max_model_len ({max_len}). This effectively limits "
                "the maximum sequence length to max_num_batched_tokens and makes vLLM reject longer sequences. Please "
                "increase max_num_batched_tokens or decrease max_model_len.")
    if batched < seqs:
        return f"max_num_batched_tokens ({batched}) must be greater than or equal to max_num_seqs ({seqs})."
    return None


def tensor_parallel_error(config: dict[str, Any], tp: int) -> tuple[str, str, str] | None:
    """What stops a Qwen3.5 model at tensor parallel size tp: (exception, message, where), in vLLM's order.
    The order of current vLLM: HybridAttentionMambaModelConfig.verify_and_update_config (vllm/model_executor/models/
    config.py, run by VllmConfig.__post_init__'s try_verify_and_update_config before verify_with_parallel_config) no
    longer sizes the GDN state ("Block size alignment ... is handled later by Platform.update_block_size_for_backend(),
    which runs after model layers are constructed"); older vLLM did, and met divide(conv_dim, tp) first
    (docs/capacity.md).
    - vllm/config/model.py ModelConfig.verify_with_parallel_config: total_num_attention_heads % tensor_parallel_size
      -> ValueError "Total number of attention heads (H) must be divisible by tensor parallel size (T)."
    - building the model: the vision tower first (vllm/model_executor/models/qwen3_5.py,
      Qwen3_5ForConditionalGeneration.__init__ builds self.visual = Qwen3_VisionTransformer(config.vision_config) before
      self.language_model). Each Qwen3_VisionBlock (qwen3_vl.py) builds Qwen2_5_VisionAttention (qwen2_5_vl.py):
      self.num_attention_heads_per_partition = dist_utils.divide(num_heads, self.tp_size) (tp_size 1 only when the
      encoder runs data-parallel, mm_encoder_tp_mode "data", which the simulator does not take), then Qwen3_VisionMLP's
      linear_fc1 = ColumnParallelLinear(dim, intermediate_size) -> divide(intermediate_size, tp). A config.json
      without vision_config (a text-only config) skips these. D3's own class (D3ForSequenceClassification) is not
      public: taken to build Qwen3.5's vision tower first, as Qwen3.5 does.
    - then the language model: layer 0 of Qwen3.5 is linear attention, so GatedDeltaNetAttention.__init__
      (vllm/model_executor/layers/mamba/gdn_linear_attn.py) comes first: self.conv1d = ColumnParallelLinear(
      output_size=self.conv_dim) -> divide(conv_dim, tp) -> vllm/distributed/utils.py ensure_divisibility:
      `assert numerator % denominator == 0, "{} is not divisible by {}".format(numerator, denominator)`;
      then in_proj_qkvz (output sizes key_dim, key_dim, value_dim, value_dim) and
      self.A_log = divide(self.num_v_heads, self.tp_size). The forward reshapes by num_k_heads // tp_size.
    - Qwen3NextAttention.__init__ (vllm/model_executor/models/qwen3_next.py): if total_num_kv_heads >= tp_size:
      assert total_num_kv_heads % tp_size == 0, else (replicated KV heads) assert tp_size % total_num_kv_heads == 0."""
    c = {**QWEN3_5_DEFAULTS, **text_config(config)}
    heads = int(c["num_attention_heads"])
    if heads % tp != 0:
        return ("ValueError", f"Total number of attention heads ({heads}) must be divisible by tensor parallel size "
                f"({tp}).", "vllm/config/model.py")
    divided = "vllm/distributed/utils.py"
    vision = config.get("vision_config")
    if isinstance(vision, dict):
        # attention, then the MLP; a key config.json leaves out (the lab's legacy stand-in configs) is not checked:
        # the transformers default vLLM would take for it is not read here
        for numerator in (int(vision[k]) for k in ("num_heads", "intermediate_size") if k in vision):
            if numerator % tp != 0:
                return ("AssertionError", f"{numerator} is not divisible by {tp}", divided)
    key_dim = int(c["linear_key_head_dim"]) * int(c["linear_num_key_heads"])
    value_dim = int(c["linear_value_head_dim"]) * int(c["linear_num_value_heads"])
    if (key_dim * 2 + value_dim) % tp != 0:  # conv1d: ColumnParallelLinear(output_size=self.conv_dim)
        return ("AssertionError", f"{key_dim * 2 + value_dim} is not divisible by {tp}", divided)
    if key_dim % tp != 0:  # in_proj_qkvz: output sizes [key_dim, key_dim, value_dim, value_dim]
        return ("AssertionError", f"{key_dim} is not divisible by {tp}", divided)
    if int(c["linear_num_key_heads"]) % tp != 0:  # no assertion: the forward's num_k_heads // tp_size
        return ("RuntimeError", f"the linear-attention key heads ({c['linear_num_key_heads']}) do not split over {tp} "
                "ranks (GatedDeltaNetAttention forward: num_k_heads // tp_size)",
                "vllm/model_executor/layers/mamba/gdn_linear_attn.py")
    if int(c["linear_num_value_heads"]) % tp != 0:  # self.A_log: divide(self.num_v_heads, self.tp_size)
        return ("AssertionError", f"{c['linear_num_value_heads']} is not divisible by {tp}", divided)
    kv = int(c["num_key_value_heads"])
    attention = "vllm/model_executor/models/qwen3_next.py"
    if kv >= tp and kv % tp != 0:
        return ("AssertionError", "assert self.total_num_kv_heads % tp_size == 0", attention)
    if kv < tp and tp % kv != 0:  # fewer KV heads than ranks: replicated, tp a multiple of them
        return ("AssertionError", "assert tp_size % self.total_num_kv_heads == 0", attention)
    return None


def activations_fp8(config: dict[str, Any], quantization: str | None) -> bool:
    """The linear layers quantize their input activations to FP8: online --quantization fp8 on an unquantized
    checkpoint, or a compressed-tensors checkpoint whose input_activations are 8-bit floats (FP8_DYNAMIC)."""
    present, _ = checkpoint_quantization(config)
    if not present:
        return quantization == "fp8"
    quant = config.get("quantization_config") or config.get("compression_config") or {}
    for group in (quant.get("config_groups") or {}).values():
        acts = (group or {}).get("input_activations") or {}
        if acts.get("type") == "float" and int(acts.get("num_bits") or 0) == 8:
            return True
    return False


def profile_activation_bytes_per_token(config: dict[str, Any], tp: int, fp8: bool) -> int:
    """STAND-IN for torch_peak_increase / max_num_batched_tokens: the bytes one token holds at the profile run's peak on
    one TP rank, read from the Qwen3.5 decoder layer's forward (vllm/model_executor/models/qwen3_5.py,
    qwen3_next.py): the hidden states and the residual, plus the largest set of tensors one layer holds at once
    (allocator reuse and torch.compile fusions not simulated)."""
    c = {**QWEN3_5_DEFAULTS, **text_config(config)}
    b = DTYPE_BYTES.get(str(c.get("dtype") or c.get("torch_dtype") or "bfloat16"), 2)
    hidden, inter = int(c["hidden_size"]), int(c.get("intermediate_size", 4 * int(c["hidden_size"])))
    heads, kv_heads, head_dim = int(c["num_attention_heads"]), int(c["num_key_value_heads"]), int(c["head_dim"])
    k_dim = int(c["linear_num_key_heads"]) * int(c["linear_key_head_dim"])
    v_dim = int(c["linear_num_value_heads"]) * int(c["linear_value_head_dim"])
    q8 = 1 if fp8 else 0
    # (elements, bytes each) of what one layer kind holds at its peak
    layer_kinds = {
        "mlp": [(2 * inter // tp, b), (inter // tp, b), (hidden, b), (hidden, q8), (inter // tp, q8)],
        # GatedDeltaNetAttention.forward (vllm/model_executor/layers/mamba/gdn_linear_attn.py) in the profile run:
        # mixed_qkvz from in_proj_qkvz, core_attn_out = torch.zeros(tokens, v_heads / tp, head_v_dim), then the
        # gated norm of it and out_proj; the custom op's _forward_core returns at once when attn_metadata is None
        # ("V1 profile run"), so causal_conv1d_fn's output is never made. in_proj_ba (2 x v_heads / tp) not counted.
        "gated_deltanet": [((2 * k_dim + 2 * v_dim) // tp, b), (v_dim // tp, b), (hidden, b), (hidden, q8)],
        "full_attention": [(3 * heads * head_dim // tp, b), (2 * max(1, kv_heads // tp) * head_dim, b), (hidden, b),
                           (hidden, q8)],
    }
    stream = 2 * hidden * b  # hidden states + residual
    return stream + max(sum(n * size for n, size in parts) for parts in layer_kinds.values())


def startup_memory(config: dict[str, Any], weight_bytes: int, tp: int, util: float, total_bytes: int, max_len: int,
                   batched: int | None = None, chunked: bool = False, eager: bool = True, kv_dtype: str = "auto",
                   kv_cache_memory_bytes: int | None = None, fp8: bool = False, others: int = 0,
                   max_num_seqs: int | None = None, device_name: str = "") -> dict[str, Any]:
    """vLLM's startup accounting on one GPU (torch's total_bytes) for a checkpoint of weight_bytes in GPU memory (all
    ranks): the pool, the KV layout and the two figures vLLM logs, or why it stops (``stop``: kind and message).
    ``others``: memory other processes took during the profile run (counted in non_torch_increase by vLLM).
    ``device_name``: the GPU's name (get_batch_defaults' A100 exception)."""
    tokens = serve_max_num_batched_tokens(batched, max_len, chunked, total_bytes, max_num_seqs, device_name)
    seqs = serve_max_num_seqs(max_num_seqs, tokens, total_bytes, device_name)
    requested = int(total_bytes * util)
    weights = cdiv(weight_bytes, tp)
    peak = tokens * profile_activation_bytes_per_token(config, tp, fp8)
    non_torch = NON_TORCH_STAND_IN_MIB * MIB
    graphs = 0 if eager else round(VISION_PROBE_GIB * GIB)  # profile_cudagraph_memory: the field report's capture
    non_kv = weights + peak + non_torch + graphs
    kv = requested - non_kv - others if kv_cache_memory_bytes is None else kv_cache_memory_bytes
    layout = kv_layout(config, kv_dtype, tp)
    out: dict[str, Any] = {"max_num_batched_tokens": tokens, "max_num_seqs": seqs, "requested": requested, "weights": weights, "peak": peak,
                           "non_torch": non_torch, "cudagraph": graphs, "non_kv": non_kv, "kv": kv, "layout": layout,
                           "stop": None, "tokens": 0, "concurrency": 0.0, "fp8": fp8}
    conserving = "See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details."
    in_gpu = non_kv + (0 if kv_cache_memory_bytes is None else kv_cache_memory_bytes)
    scheduler = scheduler_config_error(tokens, seqs, max_len, chunked)
    if scheduler:
        out["stop"] = ("ValueError", scheduler)
    elif in_gpu > total_bytes - CUDA_CONTEXT_STAND_IN_MIB * MIB and graphs and in_gpu - graphs <= total_bytes - \
            CUDA_CONTEXT_STAND_IN_MIB * MIB:  # profile_cudagraph_memory captures the graphs: that is where it fails
        out["stop"] = ("torch.OutOfMemoryError", f"CUDA out of memory during CUDA graph capture. Tried to allocate "
                       f"{VISION_PROBE_GIB:.2f} GiB (fixed vision-encoder profiling allocation). GPU 0 has a total "
                       f"capacity of {gib(total_bytes)} of which {gib(max(0, total_bytes - in_gpu + graphs))} is free. "
                       "Use --enforce-eager.")
    elif in_gpu > total_bytes - CUDA_CONTEXT_STAND_IN_MIB * MIB:
        out["stop"] = ("torch.OutOfMemoryError", f"CUDA out of memory. GPU 0 has a total capacity of {gib(total_bytes)}"
                       f" (weights {gib(weights)}, profile run {gib(peak)} at {tokens} tokens, non-torch "
                       f"{gib(non_torch)}, CUDA graphs {gib(graphs)}"
                       + ("" if kv_cache_memory_bytes is None else f", KV cache {gib(kv_cache_memory_bytes)}") + ").")
    elif kv <= 0:
        out["stop"] = ("ValueError", "No available memory for the cache blocks. Try increasing "
                       f"`gpu_memory_utilization` when initializing the engine. {conserving}")
    elif layout.needed_bytes(max_len) > kv:
        est = layout.estimate_max_model_len(kv, max_len)
        est_msg = f"Based on the available memory, the estimated maximum model length is {est}. " if est > 0 else ""
        out["stop"] = ("ValueError", f"To serve at least one request with the models's max seq len ({max_len}), "
                       f"({gib2(layout.needed_bytes(max_len))} GiB KV cache is needed, which is larger than the available "
                       f"KV cache memory ({gib2(kv)} GiB). {est_msg}Try increasing `gpu_memory_utilization` or "
                       f"decreasing `max_model_len` when initializing the engine. {conserving}")
    else:
        out["tokens"], out["concurrency"] = layout.capacity(kv, max_len)
    return out


def model_weight_bytes(args: argparse.Namespace, model: Model) -> int:
    """The checkpoint's weights in GPU memory, all ranks: online FP8 halves a BF16 checkpoint; a pre-quantized
    checkpoint's bytes are what it loads."""
    return model.bf16_bytes // (2 if args.quantization == "fp8" and model.quant_method is None else 1)


# --------------------------------------------------------------------------------------------- startup
@dataclass
class Plan:
    max_model_len: int
    kv_tokens: int
    weights_gib: float
    kv_gib: float


def gib(x: float) -> str:
    return f"{x / GIB:.2f} GiB"


def check_and_plan(args: argparse.Namespace, gpus: list[Gpu], model: Model, sleep: Any) -> Plan:
    """Reproduce vLLM's startup checks in vLLM's order; `sleep(fraction)` spends part of the cold start."""
    tp = args.tensor_parallel_size
    c = text_config(model.config)
    max_pos = int(c.get("max_position_embeddings", DEFAULT_MAX_POSITIONS))
    max_len = args.max_model_len or max_pos
    if max_len > max_pos and os.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN") != "1":
        raise SimExit("ValueError", f"User-specified max_model_len ({max_len}) is greater than the derived "
                      f"max_model_len (max_position_embeddings={max_pos} or model_max_length=None in model's "
                      "config.json). To allow overriding this maximum, set the env var "
                      "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1.", "vllm/config/model.py")
    split = tensor_parallel_error(model.config, tp)
    if split and split[0] == "ValueError":  # ModelConfig (VllmConfig), before any worker or GPU
        raise SimExit(*split)
    if tp > len(gpus):
        raise SimExit("RuntimeError", f"Tensor parallel world size ({tp}) is larger than the number of "
                      f"available GPUs ({len(gpus)}) in this node. Reduce --tensor-parallel-size or make more "
                      "GPUs visible (CUDA_VISIBLE_DEVICES / --device).", "vllm/v1/executor/multiproc_executor.py")
    used = gpus[:tp]
    # what torch.cuda.mem_get_info() reports as the total (STAND-IN table: TORCH_TOTAL_MIB)
    total = min(torch_total_mib(g.name, g.total_mib) for g in used) * MIB
    mem = startup_memory(model.config, model_weight_bytes(args, model), tp, args.gpu_memory_utilization, total, max_len,
                         batched=args.max_num_batched_tokens, chunked=bool(args.enable_chunked_prefill),
                         eager=args.enforce_eager, kv_dtype=args.kv_cache_dtype,
                         kv_cache_memory_bytes=args.kv_cache_memory_bytes, fp8=activations_fp8(model.config, args.quantization),
                         max_num_seqs=args.max_num_seqs, device_name=used[0].name)
    if mem["stop"] and mem["stop"][1].startswith("max_num_batched_tokens"):  # SchedulerConfig, before any engine
        raise SimExit(*mem["stop"], "vllm/config/scheduler.py")
    budget = mem["requested"]
    # vLLM Worker.init_device (vllm/v1/worker/gpu_worker.py): a MemorySnapshot of free device memory, then
    #   if self.init_snapshot.free_memory < self.requested_memory: raise ValueError(
    #       f"Free memory on device ({GiB(free)}/{GiB(total)} GiB) on startup is less than desired GPU memory "
    #       f"utilization ({gpu_memory_utilization}, {GiB(requested)} GiB). Decrease GPU memory utilization or "
    #       "reduce GPU memory used by other processes.")
    # (newer builds name the device, "on device cuda:0 (...)", as quoted in field logs).
    # the CUDA context (and NCCL's buffers) exist before the snapshot: this process holds them from here on, outside
    # its share (CUDA_CONTEXT_STAND_IN_MIB); every later claim keeps them
    context = CUDA_CONTEXT_STAND_IN_MIB
    CLAIM.set({g.uuid: context for g in used})
    init_free = free_mib(used)
    for i, g in enumerate(used):
        free = init_free[g.uuid] * MIB
        if free < budget:
            raise SimExit("ValueError", f"Free memory on device cuda:{i} ({gib2(free)}/{gib2(total)} "
                          f"GiB) on startup is less than desired GPU memory utilization "
                          f"({args.gpu_memory_utilization}, {gib2(budget)} GiB). Decrease GPU memory utilization "
                          "or reduce GPU memory used by other processes.", "vllm/v1/worker/gpu_worker.py")
    log("INFO", "gpu_model_runner.py:2602", f"Starting to load model {model.repo}...")
    if split:  # the model's layers are built before its weights load: vLLM's divide() asserts
        raise SimExit(*split)
    weights = mem["weights"]
    overhead = mem["peak"] + mem["non_torch"] + mem["cudagraph"]
    # the CUDA context and the weights now live on the GPU(s)
    CLAIM.set({g.uuid: int(min(weights + overhead, budget) // MIB) + context for g in used})
    sleep(0.5)
    log("INFO", "gpu_model_runner.py:2650", f"Model loading took {gib(weights)} per GPU (TP={tp}, "
        f"quantization={args.quantization})")
    if not args.enforce_eager:  # profile_cudagraph_memory (default since v0.21) captures during the profile
        log("INFO", "gpu_model_runner.py:3420", "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): "
            "profiling the vision encoder")
        sleep(0.15)
    if mem["stop"] and mem["stop"][0] == "torch.OutOfMemoryError":
        raise SimExit(*mem["stop"], "torch/cuda/memory.py")
    # Worker.determine_available_memory: memory_profiling() around a profile run, then
    #   # NOTE(woosuk): Here we assume that the other processes using the same GPU did not change their memory
    #   # usage during the profiling.
    #   assert self.init_snapshot.free_memory > free_gpu_memory, ("Error in memory profiling. Initial free memory
    #       {GiB} GiB, current free memory {GiB} GiB. This happens when other processes sharing the same container
    #       release GPU memory while vLLM is profiling during initialization. ...")
    # and the device's non-torch increase (which includes other processes' allocations in the window) is charged
    # to this instance: available KV = requested - (weights + peak activation + non-torch increase).
    mine = int(min(weights + overhead, budget) // MIB)
    sleep(0.2)
    after_free = free_mib(used)
    others = 0
    for g in used:
        if not init_free[g.uuid] * MIB > after_free[g.uuid] * MIB:
            raise SimExit("AssertionError", f"Error in memory profiling. Initial free memory "
                          f"{init_free[g.uuid] * MIB / GIB} GiB, current free memory {after_free[g.uuid] * MIB / GIB} "
                          "GiB. This happens when other processes sharing the same container release GPU memory "
                          "while vLLM is profiling during initialization. To fix this, ensure consistent GPU memory "
                          "allocation or isolate vLLM in its own container.", "vllm/v1/worker/gpu_worker.py")
        others = max(others, (init_free[g.uuid] - after_free[g.uuid] - mine) * MIB)
    if others > 0 and args.kv_cache_memory_bytes is None:
        log("INFO", "gpu_worker.py:290", f"Memory profiling: {gib(others)} more in use on the device than this "
            "process allocated (another process allocated during profiling; charged to this instance)")
        mem = startup_memory(model.config, model_weight_bytes(args, model), tp, args.gpu_memory_utilization, total,
                             max_len, args.max_num_batched_tokens, bool(args.enable_chunked_prefill), args.enforce_eager,
                             args.kv_cache_dtype, None, mem["fp8"], others, max_num_seqs=args.max_num_seqs,
                             device_name=used[0].name)
    kv_avail = mem["kv"]
    layout = mem["layout"]
    if layout.state_groups and layout.block_size > KV_ALIGNMENT:
        log("INFO", "interface.py:904", f"Setting attention block size to {layout.block_size} tokens to ensure that "
            "attention page size is >= mamba page size.")
    if layout.state_groups and layout.page_bytes > layout.state_page_bytes:
        log("INFO", "interface.py:926", f"Padding mamba page size by "
            f"{100 * (layout.page_bytes - layout.state_page_bytes) / layout.state_page_bytes:.2f}% to ensure that "
            "mamba page size and attention page size are exactly equal.")
    if args.kv_cache_memory_bytes is not None:
        log("INFO", "gpu_worker.py:280", f"Initial free memory {min(init_free.values()) * MIB / GIB:.2f} GiB, reserved "
            f"{kv_avail / GIB:.2f} GiB memory for KV Cache as specified by kv_cache_memory_bytes config and skipped "
            "memory profiling. This does not respect the gpu_memory_utilization config.")
    else:
        log("INFO", "gpu_worker.py:298", f"Available KV cache memory: {kv_avail / GIB:.2f} GiB")
    if mem["stop"]:
        raise SimExit(*mem["stop"], "vllm/v1/core/kv_cache_utils.py")
    kv_tokens, concurrency = mem["tokens"], mem["concurrency"]
    # the KV cache takes the rest of the budget: the process now holds --gpu-memory-utilization x total per GPU.
    # GAP (not vLLM's behaviour, left as it is): vLLM's memory_profiling empties torch's cache after the profile run,
    # so a started vLLM holds about its weights, non-torch memory and KV cache (and its CUDA context), not its whole
    # share; its activations grow back only under load. Claiming the whole share here makes a later instance on the
    # same GPU see less free memory at its startup check than it would beside a real vLLM (it is refused where vLLM
    # might start it). Not changed because the lab tests count on it (tests/lab/test_simulator.py held_mib, the
    # shares tests); docs/capacity.md ("A GPU shared by several instances") names the gap.
    CLAIM.set({g.uuid: int(budget // MIB) + context for g in used})
    log("INFO", "kv_cache_utils.py:1252", f"GPU KV cache size: {kv_tokens:,} tokens")
    log("INFO", "kv_cache_utils.py:1259", f"Maximum concurrency for {max_len:,} tokens per request: {concurrency:.2f}x")
    if args.enforce_eager:
        log("INFO", "core.py:210", "CUDA graphs disabled (--enforce-eager); skipping graph capture")
    else:
        log("INFO", "gpu_model_runner.py:3480", "Graph capturing finished.")
    return Plan(max_len, kv_tokens, weights / GIB, kv_avail / GIB)


# --------------------------------------------------------------------------------------------- decisions
class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param

    def body(self) -> dict[str, Any]:
        kind = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError",
                500: "InternalServerError"}.get(self.status, "Error")
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.status}}


def validate_request(body: Any, served: list[str], trust_template: bool = False) -> tuple[str, dict[str, Any]]:
    """Validate a /v1/systemone body; return (model name, questions). Raises ApiError."""
    if not isinstance(body, dict):
        raise ApiError(400, "Request body must be a JSON object")
    extra = set(body) - REQUEST_FIELDS
    if extra:  # OpenAIBaseModel.__log_extra_fields__: accepted, ignored, logged
        log("WARNING", "protocol.py:78", f"The following fields were present in the request but ignored: {extra}")
    model = body.get("model") or served[0]
    if model not in served:
        raise ApiError(404, f"The model `{model}` does not exist.", "model")
    if not isinstance(body.get("state"), (str, dict, list)):
        raise ApiError(400, "`state` is required and must be a string or JSON", "state")
    for key, typ in (("instructions", str), ("decision_template", str), ("chat_template_kwargs", dict),
                     ("seed", int), ("request_id", str)):
        if key in body and body[key] is not None and (not isinstance(body[key], typ) or isinstance(body[key], bool)):
            raise ApiError(400, f"`{key}` has the wrong type", key)
    prio = body.get("priority", 0)
    if not isinstance(prio, int) or isinstance(prio, bool) or not -(2**63) <= prio <= 2**63 - 1:
        raise ApiError(400, "`priority` must be an integer", "priority")
    if body.get("decision_template") is not None and not trust_template:
        # UNCONFIRMED wording: protocol.py says only that the field "Needs the server to run with
        # --trust-request-chat-template"; the exact refusal text was not found.
        raise ApiError(400, "decision_template in a request needs the server to run with "
                       "--trust-request-chat-template", "decision_template")
    qs = body.get("questions")
    if not isinstance(qs, dict) or not qs:
        raise ApiError(400, "`questions` must be a non-empty object of id -> question", "questions")
    if len(qs) > MAX_QUESTIONS:
        raise ApiError(400, f"At most {MAX_QUESTIONS} questions per request (got {len(qs)})", "questions")
    for qid, q in qs.items():
        validate_question(qid, q)
    return model, qs


def validate_question(qid: str, q: Any) -> None:
    where = f"questions.{qid}"
    if not qid or not isinstance(q, dict):
        raise ApiError(400, f"{where}: a question must be an object", where)
    extra = sorted(set(q) - QUESTION_FIELDS)
    if extra:  # serving.py: "Unknown fields are refused: a field this server ignores could be one that changes..."
        raise ApiError(400, f"question {qid!r}: unknown field(s) {extra}", where)
    if not isinstance(q.get("instructions"), str) or not q["instructions"].strip():
        raise ApiError(400, f"{where}.instructions: a non-empty string is required", where)
    kind, crit = q.get("type"), q.get("criteria")
    if kind == "choice":
        if not isinstance(crit, dict) or not 2 <= len(crit) <= MAX_CHOICES:
            raise ApiError(400, f"{where}.criteria: choice needs 2-{MAX_CHOICES} options", where)
        if not all(isinstance(k, str) and k and (v is None or isinstance(v, str)) for k, v in crit.items()):
            raise ApiError(400, f"{where}.criteria: option -> description (string or null)", where)
    elif kind == "noul":
        if crit is not None and not (isinstance(crit, dict) and set(crit) == {"true", "false"}
                                     and all(isinstance(v, str) for v in crit.values())):
            raise ApiError(400, f'{where}.criteria: noul criteria must be null or {{"true": ..., "false": ...}}',
                           where)
    elif kind == "score":
        if (not isinstance(crit, list) or not 2 <= len(crit) <= 10 or len(set(map(str, crit))) != len(crit)
                or not all(isinstance(x, str) and x for x in crit)):
            raise ApiError(400, f"{where}.criteria: score needs an ordered list of 2-10 distinct levels", where)
    else:
        raise ApiError(400, f"{where}.type: must be one of choice, noul, score", where)


# Tiny concept lexicon: words in one group count as overlapping (so "charged twice" relates to "payments").
CONCEPTS = [
    {"bill", "billing", "charge", "charged", "card", "payment", "payments", "pay", "paid", "refund", "refunds",
     "invoice", "price", "money", "twice", "double", "fee", "subscription"},
    {"ship", "shipping", "delivery", "deliveries", "deliver", "package", "parcel", "order", "arrive", "courier",
     "tracking", "late"},
    {"security", "account", "access", "password", "login", "hacked", "fraud", "locked", "2fa"},
    {"urgent", "asap", "immediately", "now", "hour", "today", "quickly", "emergency"},
    {"angry", "furious", "upset", "annoyed", "unacceptable", "terrible", "worst", "twice"},
    {"yes", "true", "positive", "good", "correct"},
    {"calm", "thanks", "thank", "please", "rush", "whenever", "fine", "kindly", "wait", "patient", "later"},
]


def words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z0-9]+", text.lower()) if len(w) > 2}


NEGATIONS = {"not", "no", "never", "nobody", "without", "only"}


def words_read(text: str) -> set[str]:
    """words() without the two words after a negation ("not urgent", "no access problem"): how the larger
    simulated models read a state (SizeProfile.reads_negation)."""
    seq = re.findall(r"[a-z0-9]+", text.lower())
    skip = {j for i, w in enumerate(seq) if w in NEGATIONS for j in (i + 1, i + 2)}
    return {w for i, w in enumerate(seq) if len(w) > 2 and i not in skip}


def concepts(ws: set[str]) -> set[int]:
    return {i for i, group in enumerate(CONCEPTS) if ws & group}


def state_text(state: Any) -> str:
    return state if isinstance(state, str) else json.dumps(state, sort_keys=True, ensure_ascii=False)


def noise(*parts: str) -> float:
    """Deterministic pseudo-random number in [-1, 1) from a hash of the parts."""
    digest = hashlib.sha256("\x1f".join(parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**63 - 1.0


def relevance(state_words: set[str], text: str) -> float:
    """Exact word overlap + 1.5 per state word that shares a concept group with the text."""
    ws = words(text)
    shared = concepts(state_words) & concepts(ws)
    return 1.0 * len(state_words & ws) + 1.5 * sum(len(state_words & CONCEPTS[i]) for i in shared)


def softmax(logits: list[float]) -> list[float]:
    m = max(logits)
    ex = [math.exp(x - m) for x in logits]
    s = sum(ex)
    return [x / s for x in ex]


def answer(state: Any, qid: str, q: dict[str, Any], instructions: str = "",
           profile: SizeProfile | None = None) -> dict[str, Any]:
    """Deterministic simulated answer: hash noise + keyword/concept overlap with the state. Without a profile the
    noise has amplitude 0.5 and is the same for every model; with one it is seeded by the model and scaled."""
    st = state_text(state)
    read = words_read if profile is not None and profile.reads_negation else words
    sw = read(st) | (words(instructions) if instructions else set())
    ctx: tuple[str, ...] = (st, qid, q["instructions"])
    amp = 1.0
    if profile is not None:
        ctx = (*ctx, profile.key)
        amp = profile.amplitude / 0.5
    kind, crit = q["type"], q.get("criteria")
    if kind == "choice":
        opts = list(crit)
        logits = [amp * 0.5 * noise(*ctx, o) + relevance(sw, f"{o} {crit[o] or ''}") for o in opts]
        probs = dict(zip(opts, softmax(logits), strict=True))
        best = max(opts, key=lambda o: probs[o])
        return {"type": "choice", "choice": best, "probabilities": probs, "confidence": probs[best] * LABEL_MASS}
    if kind == "noul":
        yes_text = f"yes {q['instructions']} {(crit or {}).get('true', '')}"
        no_text = f"no {(crit or {}).get('false', '')}"
        p_yes = softmax([amp * 0.5 * noise(*ctx, "true") + 0.5 * relevance(sw, yes_text),
                         amp * 0.5 * noise(*ctx, "false") + 0.5 * relevance(sw, no_text)])[0]
        # vLLM NoulQuestion.answer: noul = P(yes), probabilities keyed yes/no (tests/contracts/vllm/)
        return {"type": "noul", "noul": p_yes, "probabilities": {"yes": p_yes, "no": 1.0 - p_yes},
                "confidence": max(p_yes, 1.0 - p_yes) * LABEL_MASS}
    levels = [str(x) for x in crit]
    n = len(levels)
    # intensity in [0, 1]: overlap with the question and with the top level push up the scale, overlap with the
    # bottom level pushes it down, the hash wiggles it
    lean = relevance(sw, levels[-1]) - relevance(sw, levels[0])
    intensity = min(1.0, max(0.0, 0.5 + amp * 0.25 * noise(*ctx) + 0.1 * relevance(sw, q["instructions"]) + 0.08 * lean))
    logits = [-((i / (n - 1) - intensity) ** 2) * 8.0 + amp * 0.2 * noise(*ctx, lv) for i, lv in enumerate(levels)]
    probs = softmax(logits)
    # vLLM ScoreQuestion.answer: score = expected 0-based level index; legend and probabilities keyed "0".."n-1"
    return {"type": "score", "score": sum(i * p for i, p in enumerate(probs)),
            "legend": {str(i): lv for i, lv in enumerate(levels)},
            "probabilities": {str(i): p for i, p in enumerate(probs)},
            "confidence": max(probs) * LABEL_MASS}


def prompt_tokens(body: dict[str, Any], questions: dict[str, Any]) -> int:
    """Simulated prompt length: 4/3 tokens per word of the state and the questions."""
    return len(re.findall(r"\S+", state_text(body["state"]) + json.dumps(questions))) * 4 // 3


def decide(body: dict[str, Any], model: str, questions: dict[str, Any],
           profile: SizeProfile | None = None) -> dict[str, Any]:
    instr = body.get("instructions") or ""
    answers = {qid: answer(body["state"], qid, q, instr, profile) for qid, q in questions.items()}
    if seeded_flip(body["state"]):
        answers = {qid: flip_answer(a) for qid, a in answers.items()}
    n_prompt = prompt_tokens(body, questions)
    return {
        "id": "sd-" + uuid.uuid4().hex,
        "object": "structured_decision",
        "created": int(time.time()),
        "model": model,
        "answers": answers,
        # vLLM StructuredDecisionResponse: usage {input_tokens, output_tokens}, diagnostics per question
        "usage": {"input_tokens": n_prompt, "output_tokens": len(questions)},
        "diagnostics": {qid: {"label_mass": LABEL_MASS, "argmax_is_label": True} for qid in questions},
    }


# --------------------------------------------------------------------------------------------- seeded regression
# STAND-IN (lab only, issue 34), separate from everything above: D3_SIM_FLIP_STATES, a comma-separated list of
# words; a request whose state contains one of them gets every answer turned around (choice: its most and least
# probable options swap; noul: P(yes) becomes P(no); score: the levels mirrored). A seeded accuracy regression on a
# known set of cases, for bench-compare's paired test; unset (the default), nothing changes.
def seeded_flip(state: Any) -> bool:
    words_ = [w.strip() for w in os.environ.get("D3_SIM_FLIP_STATES", "").split(",") if w.strip()]
    return any(w in state_text(state) for w in words_)


def flip_answer(a: dict[str, Any]) -> dict[str, Any]:
    """One answer turned around (see D3_SIM_FLIP_STATES)."""
    probs = dict(a["probabilities"])
    if a["type"] == "choice":
        best, worst = max(probs, key=probs.__getitem__), min(probs, key=probs.__getitem__)
        probs[best], probs[worst] = probs[worst], probs[best]
        return {**a, "choice": worst, "probabilities": probs}
    if a["type"] == "noul":
        return {**a, "noul": 1.0 - a["noul"], "probabilities": {"yes": probs["no"], "no": probs["yes"]}}
    n = len(probs)
    mirrored = {str(i): probs[str(n - 1 - i)] for i in range(n)}
    return {**a, "score": (n - 1) - a["score"], "probabilities": mirrored}


# --------------------------------------------------------------------------------------------- per-size behaviour
# LAB STAND-IN calibration (not a property of D3): the field report's latencies, 4 questions, enforce-eager +
# expandable_segments: d3 (27B, FP8 online, TP 2: 12.15 GiB of weights per GPU) ~470 ms; d3-flash (9B, 9.03 GiB)
# ~215 ms. Per-question ms = 1 + A x (GiB of weights per GPU) ** P through those two points (8 ms per request).
REQUEST_BASE_MS = 8.0
_FIT = ((12.15, (470.0 - REQUEST_BASE_MS) / 4 - 1.0), (9.03, (215.0 - REQUEST_BASE_MS) / 4 - 1.0))
LATENCY_P = math.log(_FIT[0][1] / _FIT[1][1]) / math.log(_FIT[0][0] / _FIT[1][0])
LATENCY_A = _FIT[0][1] / _FIT[0][0] ** LATENCY_P


def per_question_ms(weights_gib_per_gpu: float) -> float:
    """Simulated ms per question for a model holding this many GiB of weights per GPU (see _FIT)."""
    return 1.0 + LATENCY_A * max(0.0, weights_gib_per_gpu) ** LATENCY_P


@dataclass(frozen=True)
class SizeProfile:
    """Per-model answer behaviour: `key` (the checkpoint repository) seeds the noise, `amplitude` scales it.
    Larger checkpoints follow the state's words more closely: amplitude = 0.3 + 1.1 / sqrt(checkpoint GB), so
    d3 (52.2 GB) 0.45, d3-flash 0.55, d3-mini 0.66, d3-nano 0.81, d3-lite 1.12, d3-edge 1.23 (below 1.5, so the
    smoke test's billing ticket, 3.0 logits ahead, is still answered billing by every size). Checkpoints of 8 GB
    and more (d3-flash, d3, d3-mini) also skip the two words after a negation (words_read), so they avoid some traps
    ("not urgent") that the smaller ones fall into."""

    key: str
    amplitude: float
    reads_negation: bool = False

    @classmethod
    def of(cls, repo: str, checkpoint_bytes: int) -> SizeProfile:
        return cls(repo, round(0.3 + 1.1 / math.sqrt(max(checkpoint_bytes, 1e8) / 1e9), 4), checkpoint_bytes >= 8e9)


@contextlib.contextmanager
def engine_slot(st: State, tokens: int = 0) -> Any:
    """Hold one of the engine's max_num_seqs slots for a sequence of `tokens` tokens: counted waiting while all slots
    are taken, then running, its KV blocks in use meanwhile. The time it waited goes to the queue-time histogram when
    the request finishes, as vLLM records it (vllm/v1/metrics/loggers.py PrometheusStatLogger.record: queued_time of
    iteration_stats.finished_requests), so a request that never finishes is never in it. While the STAND-IN wedge
    file exists (D3_SIM_WEDGE_FILE) a request holds its slot without finishing."""
    if st.slots is None:
        with st.lock:
            if st.slots is None:
                st.slots = threading.BoundedSemaphore(max(1, st.max_num_seqs))
    blocks = -(-tokens // KV_BLOCK_TOKENS) * KV_BLOCK_TOKENS
    queued = time.monotonic()
    with st.lock:
        st.waiting += 1
    try:
        st.slots.acquire()
    finally:
        with st.lock:
            st.waiting -= 1
    try:
        with st.lock:
            st.running += 1
            st.kv_tokens_used += blocks
        waited = time.monotonic() - queued
        while wedged():  # STAND-IN: a hung engine holds the request
            time.sleep(0.2)
        yield
        with st.lock:  # finished: vLLM records the queue time now
            st.observe("vllm:request_queue_time_seconds", waited)
    finally:
        with st.lock:
            st.running -= 1
            st.kv_tokens_used -= blocks
        st.slots.release()


def wedged() -> bool:
    """STAND-IN: the wedge switch (D3_SIM_WEDGE_FILE exists)."""
    return Path(os.environ.get("D3_SIM_WEDGE_FILE") or "/tmp/d3-sim-wedge").exists()


# --------------------------------------------------------------------------------------------- metrics
# vLLM's Prometheus metrics (vllm-project/vllm vllm/v1/metrics/loggers.py, PrometheusStatLogger, commit 005a810b;
# contract tests/contracts/metrics/names.yml, help texts quoted from the same file): labels model_name (the first
# served name) and engine ("0"), request_success also finished_reason. Exposition as prometheus_client writes it:
# a counter's TYPE line names it without the suffix and its sample ends in _total; a histogram has cumulative
# _bucket{le=...} samples, _count, _sum. (prometheus_client's _created samples are not written: no alert reads them.)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                           240.0, 480.0, 960.0, 1920.0, 7680.0)
GAUGES = (("vllm:num_requests_running", "Number of requests in model execution batches."),
          ("vllm:num_requests_waiting", "Number of requests waiting to be processed."),
          ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."))
COUNTERS = (("vllm:prompt_tokens", "Number of prefill tokens processed."),
            ("vllm:generation_tokens", "Number of generation tokens processed."),
            ("vllm:request_success", "Count of successfully processed requests."))
HISTOGRAMS = (("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds."),
              ("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request."))
FINISH_REASONS = ("stop", "length", "abort")  # vllm/v1/engine/__init__.py FINISH_REASON_STRINGS (that commit)
# STAND-IN: KV blocks of 16 tokens (vLLM's default --block-size on CUDA); a running sequence holds its prompt and
# output tokens rounded up to whole blocks, and kv_cache_usage_perc = tokens in held blocks / GPU KV cache size.
KV_BLOCK_TOKENS = 16


def go_float(x: float) -> str:
    """prometheus_client's floatToGoString for the values written here."""
    return "+Inf" if x == math.inf else repr(float(x))


def render_metrics(st: State) -> str:
    """/metrics in Prometheus text format, vLLM's names, types, help and labels."""
    name = st.args.served_model_name[0].replace("\\", "\\\\").replace('"', '\\"')
    lab = f'model_name="{name}",engine="0"'
    with st.lock:
        kv_total = st.plan.kv_tokens if st.plan is not None else 0
        gauges = {"vllm:num_requests_running": st.running, "vllm:num_requests_waiting": st.waiting,
                  "vllm:kv_cache_usage_perc": st.kv_tokens_used / kv_total if kv_total > 0 else 0.0}
        counters = {"vllm:prompt_tokens": st.counters.get("prompt_tokens", 0),
                    "vllm:generation_tokens": st.counters.get("questions", 0)}  # one output token per question
        success = {r: st.counters.get(f"finished_{r}", 0) for r in FINISH_REASONS}
        hists = {h: (list(st.hist.get(h, ([0] * len(REQUEST_LATENCY_BUCKETS), 0.0, 0))[0]),
                     *st.hist.get(h, (None, 0.0, 0))[1:]) for h, _ in HISTOGRAMS}
    out: list[str] = []
    for metric, helptext in GAUGES:
        out += [f"# HELP {metric} {helptext}", f"# TYPE {metric} gauge", f"{metric}{{{lab}}} {go_float(gauges[metric])}"]
    for metric, helptext in COUNTERS:
        out += [f"# HELP {metric} {helptext}", f"# TYPE {metric} counter"]
        if metric == "vllm:request_success":
            out += [f'{metric}_total{{{lab},finished_reason="{r}"}} {go_float(n)}' for r, n in success.items()]
        else:
            out.append(f"{metric}_total{{{lab}}} {go_float(counters[metric])}")
    for metric, helptext in HISTOGRAMS:
        buckets, total, count = hists[metric]
        out += [f"# HELP {metric} {helptext}", f"# TYPE {metric} histogram"]
        acc = 0
        for le, n in zip(REQUEST_LATENCY_BUCKETS, buckets, strict=True):
            acc += n
            out.append(f'{metric}_bucket{{{lab},le="{go_float(le)}"}} {go_float(acc)}')
        out += [f'{metric}_bucket{{{lab},le="+Inf"}} {go_float(count)}', f"{metric}_count{{{lab}}} {go_float(count)}",
                f"{metric}_sum{{{lab}}} {go_float(total)}"]
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------------------------- server
@dataclass
class State:
    args: argparse.Namespace
    plan: Plan
    engine_dead: bool = False
    fp8_failed: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)
    counters: dict[str, int] = field(default_factory=dict)
    ms_per_question: float = 5.0
    base_ms: float = 0.0  # per request, whatever its questions
    profile: SizeProfile | None = None  # per-model answer noise; None: the size-independent answers (tests)
    max_num_seqs: int = 8
    batch_slowdown: float = 0.3
    running: int = 0
    waiting: int = 0
    kv_tokens_used: int = 0  # tokens in the KV blocks the running sequences hold
    hist: dict[str, tuple[list[int], float, int]] = field(default_factory=dict)  # per-bucket counts, sum, count
    slots: threading.BoundedSemaphore | None = None
    # uvicorn's timeout_keep_alive, which vLLM sets from VLLM_HTTP_TIMEOUT_KEEP_ALIVE (vllm/envs.py, default 5)
    keep_alive_s: float = 5.0

    def service_time_s(self, questions: int) -> float:
        """Seconds one request of `questions` questions takes with the requests already running (called with a
        slot held): every other running request adds batch_slowdown of its solo latency (a batching engine)."""
        solo = (self.base_ms + self.ms_per_question * questions) / 1000.0
        with self.lock:
            others = self.running - 1
        return solo * (1.0 + self.batch_slowdown * max(0, others))

    def count(self, key: str, n: int = 1) -> None:
        with self.lock:
            self.counters[key] = self.counters.get(key, 0) + n

    def observe(self, metric: str, seconds: float) -> None:
        """One observation of a request-latency histogram (called with the lock held)."""
        buckets, total, count = self.hist.get(metric, ([0] * len(REQUEST_LATENCY_BUCKETS), 0.0, 0))
        i = next((k for k, le in enumerate(REQUEST_LATENCY_BUCKETS) if seconds <= le), None)
        if i is not None:
            buckets[i] += 1
        self.hist[metric] = (buckets, total + seconds, count + 1)


class SimHTTPServer(ThreadingHTTPServer):
    """One thread per connection; uvicorn's listen backlog (2048, its --backlog default) instead of socketserver's 5,
    so a burst of connections queues instead of being reset."""

    request_queue_size = 2048
    daemon_threads = True


def make_handler(st: State) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "uvicorn"
        sys_version = ""
        protocol_version = "HTTP/1.1"
        # a buffered writer: the status line, headers and body leave in one segment when the handler flushes
        # (unbuffered, they are separate writes and Nagle + delayed ACK add ~40 ms to every keep-alive request,
        # which uvicorn does not)
        wbufsize = 1 << 16

        def setup(self) -> None:
            super().setup()
            self.answered = False

        def handle_one_request(self) -> None:
            """uvicorn's keep-alive (encode/uvicorn uvicorn/protocols/http/h11_impl.py): once a response is complete
            it arms `call_later(timeout_keep_alive, timeout_keep_alive_handler)`, which closes the connection
            without a response; any data received cancels it. No timer before the first request. vLLM passes
            timeout_keep_alive=envs.VLLM_HTTP_TIMEOUT_KEEP_ALIVE (5 s by default)."""
            if self.answered:
                self.connection.settimeout(st.keep_alive_s)
                try:
                    idle_closed = not self.rfile.peek(1)
                except (TimeoutError, OSError):
                    idle_closed = True
                if idle_closed:
                    self.close_connection = True
                    return
                self.connection.settimeout(None)
            super().handle_one_request()
            self.answered = True

        def log_message(self, format: str, *a: Any) -> None:
            if st.args.uvicorn_log_level in ("debug", "info", "trace"):
                log("INFO", "uvicorn", f'{self.client_address[0]}:{self.client_address[1]} - "{self.command} '
                    f'{self.path} {self.request_version}" {a[1] if len(a) > 1 else ""}')

        def send(self, status: int, body: bytes = b"", ctype: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("content-type", ctype)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            self.wfile.flush()

        def send_json(self, status: int, obj: Any) -> None:
            self.send(status, json.dumps(obj).encode())

        def authorized(self) -> bool:
            if not st.args.api_key or not self.path.startswith("/v1"):
                return True
            auth = self.headers.get("Authorization", "")
            return any(auth == f"Bearer {k}" for k in st.args.api_key)

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path in ("/health", "/ping"):
                self.send(503 if st.engine_dead else 200, b"", "text/plain")
            elif path == "/version":
                self.send_json(200, {"version": SIM_VERSION})
            elif path == "/metrics":
                self.send(200, self.metrics().encode(), "text/plain; version=0.0.4; charset=utf-8")
            elif not self.authorized():
                self.send_json(401, {"error": "Unauthorized"})
            elif path == "/v1/models":
                now = int(time.time())
                self.send_json(200, {"object": "list", "data": [
                    {"id": n, "object": "model", "created": now, "owned_by": "vllm", "root": st.args.model,
                     "parent": None, "max_model_len": st.plan.max_model_len} for n in st.args.served_model_name]})
            else:
                self.send_json(404, {"detail": "Not Found"})

        def do_POST(self) -> None:
            path = self.path.split("?", 1)[0]
            if path not in ("/v1/systemone", "/v1/decisions"):
                self.send_json(404, {"detail": "Not Found"})
                return
            if not self.authorized():
                self.send_json(401, {"error": "Unauthorized"})
                return
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length) if length else b""
            arrived = time.monotonic()
            st.count("requests")
            try:
                if st.engine_dead:
                    raise ApiError(500, "EngineCore encountered an issue. See stack trace for the root cause.")
                try:
                    body = json.loads(raw or b"null")
                except json.JSONDecodeError as exc:
                    raise ApiError(400, f"Invalid JSON body: {exc}") from None
                model, questions = validate_request(body, st.args.served_model_name,
                                                    st.args.trust_request_chat_template)
                if st.args.kv_cache_dtype.startswith("fp8"):
                    self.fp8_crash()
                    return
                n_prompt = prompt_tokens(body, questions)
                with engine_slot(st, n_prompt + len(questions)):
                    time.sleep(st.service_time_s(len(questions)))
                result = decide(body, model, questions, st.profile)
            except ApiError as err:
                st.count(f"status_{err.status}")
                self.send_json(err.status, err.body())
                return
            st.count("status_200")
            st.count("questions", len(questions))
            st.count("prompt_tokens", n_prompt)
            # UNCONFIRMED: which finish reason vLLM's structured decisions report (one token per question: "length")
            st.count("finished_length")
            with st.lock:
                st.observe("vllm:e2e_request_latency_seconds", time.monotonic() - arrived)
            self.send_json(200, result)

        def fp8_crash(self) -> None:
            with st.lock:
                st.engine_dead = True
            msg = "quantized KV cache is not supported for encoder attention"
            log("ERROR", "core.py:934", "EngineCore encountered a fatal error.")
            print("Traceback (most recent call last):\n  File \"/usr/local/lib/python3.12/dist-packages/vllm/v1/"
                  f"attention/backends/triton_attn.py\", line 1, in forward_encoder_attention\nRuntimeError: {msg}",
                  flush=True)
            st.count("status_500")
            self.send_json(500, ApiError(500, f"RuntimeError: {msg}").body())
            log("ERROR", "async_llm.py:525", "AsyncLLM output_handler failed. EngineDeadError: EngineCore "
                "encountered an issue. Shutting down the API server.")
            threading.Timer(0.3, lambda: os._exit(1)).start()

        def metrics(self) -> str:
            return render_metrics(st)

    return Handler


# --------------------------------------------------------------------------------------------- main
def env_float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


def cold_start_s(model: Model) -> float:
    """Seconds from start to serving: D3_SIM_COLD_START_S if set, else the field report's 150 s for d3 (52.2 GB)
    scaled by this checkpoint's size, times D3_SIM_COLD_START_SCALE (the lab image shortens it)."""
    if os.environ.get("D3_SIM_COLD_START_S", "").strip():
        return max(0.0, env_float("D3_SIM_COLD_START_S", 5.0))
    scale = max(0.0, env_float("D3_SIM_COLD_START_SCALE", 1.0))
    return D3_COLD_START_S * model.bf16_bytes / D3_BF16_BYTES * scale


def make_state(args: argparse.Namespace, plan: Plan, model: Model) -> State:
    """The serving state: latency and answer noise from the model's size. D3_SIM_REQUEST_MS (STAND-IN: a fixed
    latency per answer) or D3_SIM_MS_PER_QUESTION (a fixed per-question latency, no per-request base) replace the
    per-size latency; D3_SIM_LATENCY_SCALE multiplies whichever applies. The engine serves --max-num-seqs requests
    at once (D3_SIM_MAX_NUM_SEQS when the flag is not given)."""
    scale = max(0.0, env_float("D3_SIM_LATENCY_SCALE", 1.0))
    if os.environ.get("D3_SIM_REQUEST_MS", "").strip():
        base, per_q, why = max(0.0, env_float("D3_SIM_REQUEST_MS", 0.0)), 0.0, "D3_SIM_REQUEST_MS, a lab stand-in"
    elif os.environ.get("D3_SIM_MS_PER_QUESTION", "").strip():
        base, per_q, why = 0.0, env_float("D3_SIM_MS_PER_QUESTION", 5.0), "D3_SIM_MS_PER_QUESTION"
    else:
        base, per_q = REQUEST_BASE_MS, per_question_ms(plan.weights_gib)
        why = f"{plan.weights_gib:.2f} GiB of weights per GPU; calibrated on the field report, not measured"
    base, per_q = base * scale, per_q * scale
    log("INFO", "serving.py:88", f"(simulator) request latency {base:.1f} ms + {per_q:.1f} ms per question "
        f"(x{scale:g}; {why})")
    seqs = args.max_num_seqs if args.max_num_seqs is not None else int(env_float("D3_SIM_MAX_NUM_SEQS", 8))
    return State(args=args, plan=plan, ms_per_question=per_q, base_ms=base,
                 profile=SizeProfile.of(model.repo, model.bf16_bytes),
                 max_num_seqs=max(1, seqs),
                 batch_slowdown=max(0.0, env_float("D3_SIM_BATCH_SLOWDOWN", 0.3)),
                 keep_alive_s=env_float("VLLM_HTTP_TIMEOUT_KEEP_ALIVE", 5))


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # we may be PID 1 in the container
    args = parse_args(sys.argv[1:] if argv is None else argv)
    cold = 0.0
    log("INFO", "api_server.py:1912", f"vLLM API server version {SIM_VERSION} (d3-fleet LAB SIMULATOR, not vLLM)")
    shown = {k: v for k, v in vars(args).items() if k not in ("model_tag", "api_key")}
    log("INFO", "utils.py:328", f"non-default args: {shown}")
    try:
        gpus = detect_gpus()
        for i, g in enumerate(gpus):
            log("INFO", "platforms/cuda.py:120", f"cuda:{i} = {g.name} {g.uuid} {g.total_mib} MiB "
                f"(driver {g.driver}, compute capability {g.compute_cap})")
        check_driver(gpus)
        model = load_model(args.model, args.revision)
        try:
            verify_quantization(args, model)
        except QuantizationMismatch as err:
            CLAIM.release()
            print("Traceback (most recent call last):", flush=True)
            print('  File "/usr/local/lib/python3.12/dist-packages/vllm/engine/arg_utils.py", line 1, in '
                  "create_model_config", flush=True)
            print("pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig", flush=True)
            print(f"  Value error, {err} [type=value_error, input_type=ArgsKwargs]", flush=True)
            sys.exit(1)
        cold = cold_start_s(model)
        log("INFO", "model.py:548", f"(simulator) cold start {cold:.2f} s for {model.bf16_bytes / 1e9:.1f} GB of "
            "weights (the field report's 150 s for d3's 52.2 GB, scaled)")
        log("INFO", "model.py:547", f"Resolved architecture: {(model.config.get('architectures') or ['?'])[0]} "
            f"from {model.snapshot}")
        if args.kv_cache_dtype.startswith("fp8"):
            log("INFO", "cache.py:189", "Using fp8 data type to store kv cache. It reduces the GPU memory "
                "footprint and boosts the performance.")
        plan = check_and_plan(args, gpus, model, lambda frac: time.sleep(cold * frac))
    except SimExit as err:
        CLAIM.release()
        die(err)
    if os.environ.get("D3_SIM_BEHAVIOUR") == "never-ready":
        log("INFO", "core.py:95", "Initializing a V1 LLM engine ... (simulator behaviour never-ready: "
            "the API server will never start)")
        while True:
            time.sleep(3600)
    time.sleep(cold * 0.15)
    state = make_state(args, plan, model)
    httpd = SimHTTPServer((args.host, args.port), make_handler(state))
    log("INFO", "launcher.py:37", f"Available routes are: /health, /metrics, /version, /v1/models, "
        f"/v1/systemone, /v1/decisions ({len(args.served_model_name)} served name(s))")
    log("INFO", "api_server.py:2010", f"Starting vLLM API server 0 on http://{args.host}:{args.port}")
    log("INFO", "uvicorn", "Application startup complete.")
    try:
        httpd.serve_forever(poll_interval=0.2)
    finally:
        httpd.server_close()
        CLAIM.release()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except SystemExit:
        raise
    except Exception:  # unexpected simulator bug: show it like a vLLM crash
        traceback.print_exc()
        sys.exit(1)
