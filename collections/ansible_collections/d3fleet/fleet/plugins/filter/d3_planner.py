"""Placement planner for D3 decision models on L4 hosts (Ansible filter plugin ``d3_plan``).

Pure functions: given the catalog (roles/d3/vars/main.yml), a host's desired instances (``d3_models``)
and its GPUs, compute where every instance runs (GPUs, port, unit name), its full vLLM command line,
its environment and a VRAM budget per GPU, or refuse with messages that name the host, the instance,
the variable and the fix. Nothing here touches a host.
"""

from __future__ import annotations

import ipaddress
import json
import re
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

try:  # under Ansible: the collection's own module
    from ansible_collections.d3fleet.fleet.plugins.filter.d3_inputs import (
        canonical_flag,
        check,
        control_free,
        env_problems,
        shown,
    )
except ImportError:  # the unit tests import the filters as top-level modules
    from d3_inputs import canonical_flag, check, control_free, env_problems, shown  # type: ignore[no-redef]
from ansible_collections.d3fleet.fleet.plugins.module_utils import d3_labels as label

GIB = 1024**3
MIB = 1024**2

# vLLM flags the planner owns: they come from instance keys or the catalog, never from extra_args.
OWNED_FLAGS = {
    "--model": "the catalog's hf_repo (choose the model with `model:`)",
    "--revision": "d3_model_revisions",
    "--served-model-name": "the instance `name:`",
    "--host": "d3_listen_address",
    "--port": "the instance `port:`",
    "--api-key": "d3_units_api_key (the key must not appear on a command line)",
    # each instance gets its GPUs through tensor parallelism only: the planner counts GPUs as TP
    "--pipeline-parallel-size": "the instance's GPUs through --tensor-parallel-size (the planner counts GPUs as TP)",
    "--data-parallel-size": "one instance per d3_models item (the planner counts GPUs as TP)",
    # pulls further flags (any of these) from a file the planner does not read
    "--config": "each flag in extra_args itself",
    # a secret on the command line (ps, the unit file, the plan JSON); the weights are cached before any start
    "--hf-token": "d3_weights_token_file (the units need no token: HF_HUB_OFFLINE=1)",
    # where vLLM looks for the weights: the planner mounts the cache at the image's HF_HOME
    "--download-dir": "d3_hf_home",
}
# Catalog flags an instance may override through extra_args.
CATALOG_FLAGS = (
    "--tensor-parallel-size",
    "--max-model-len",
    "--gpu-memory-utilization",
    "--quantization",
)
BOOLEAN_FLAGS = {
    "--enforce-eager",
    "--no-enforce-eager",
    "--trust-remote-code",
    "--disable-custom-all-reduce",
    "--enable-prefix-caching",
    "--no-enable-prefix-caching",
    "--disable-log-stats",
    "--enable-chunked-prefill",
    "--no-enable-chunked-prefill",
    "--skip-mm-profiling",
    "--language-model-only",
    "--mm-encoder-only",
    "--disable-hybrid-kv-cache-manager",
}
# vLLM flags that change what vLLM computes at startup in a way the planner does not model: with one of them the plan
# would print figures (or refusals) it cannot predict, so the planner refuses it and names it. What each changes:
UNMODELLED_FLAGS = {
    "--block-size": "the KV cache block size, which the planner derives from HybridAttentionMambaModelConfig's "
    "alignment and the Gated DeltaNet state",
    "--mamba-ssm-cache-dtype": "the Gated DeltaNet temporal state's dtype (MambaStateDtypeCalculator."
    "gated_delta_net_state_dtype), so the state page and the attention block size",
    "--mamba-cache-dtype": "the Gated DeltaNet states' dtype (MambaStateDtypeCalculator.gated_delta_net_state_dtype), "
    "so the state page and the attention block size",
    "--performance-mode": "vLLM's serving defaults, which the planner has not traced in vLLM's source",
    "--num-gpu-blocks-override": "the number of KV cache blocks, which the planner computes from the memory left",
    "--no-enable-chunked-prefill": "chunked prefill, whose default for a pooling model vLLM decides from the model's "
    "attention and pooling (ModelConfig.is_chunked_prefill_supported; docs/capacity.md, unsettled questions)",
    "--skip-mm-profiling": "the profile run: it skips the vision encoder's pass, which the field report's measured "
    "point includes",
    "--language-model-only": "the model built: no vision tower (its TP checks, its weights in GPU memory)",
    "--mm-encoder-tp-mode": "how the vision tower is split ('data': replicated on every rank, no TP check of its "
    "heads, its whole weights on every GPU)",
    # the third review: flags that pass through vLLM's parser and change the accounting
    "--dtype": "the model dtype: weights, activations and the GDN conv state (the planner takes config.json's)",
    "--cpu-offload-gb": "the weights in GPU memory (part of them kept in CPU memory)",
    "--hf-overrides": "config.json's numbers (layers, heads, dims, dtypes), which every figure starts from",
    "--mamba-block-size": "the Gated DeltaNet state's block (one per sequence at max_model_len, prefix caching off)",
    "--mamba-cache-mode": "the Gated DeltaNet state blocks per sequence ('all'/'align' keep states per block)",
    "--pooler-config": "the pooling, and with it whether chunked prefill is on (ModelConfig."
    "is_chunked_prefill_supported; docs/capacity.md, unsettled questions)",
    "--runner": "the runner (generate or pooling) and with it the model class, its defaults and its chunked prefill",
    "--convert": "the model class (a converted pooling or generation adapter), its defaults and its chunked prefill",
    "--compilation-config": "the compilation (mode 3 compiles with Inductor even beside --enforce-eager) and CUDA "
    "graphs: the profile run's activations and the graph memory the planner counts for eager mode only",
    "--optimization-level": "vLLM's -O level: the compilation and CUDA graph defaults (the planner counts eager mode)",
    "--speculative-config": "the models loaded (a draft model's weights and KV cache) and the mamba cache mode",
    # the fourth review: the mirror of --language-model-only, the KV cache manager, the other weight offloading flags
    # (vllm/config/offload.py: UVAOffloadConfig, PrefetchOffloadConfig, OffloadConfig.offload_backend)
    "--mm-encoder-only": "the model built: no language model (MultiModalConfig.mm_encoder_only: it 'skips the language "
    "component of the model', vllm/config/multimodal.py), so no language-model weights and no KV cache",
    "--disable-hybrid-kv-cache-manager": "the KV cache manager: one KV cache spec for every layer (vLLM's "
    "unify_hybrid_kv_cache_specs), where the planner counts the hybrid manager's groups",
    "--cpu-offload-params": "which weights --cpu-offload-gb keeps in CPU memory, so the weights in GPU memory",
    "--offload-backend": "the weight offloading backend (uva, prefetch), so the weights in GPU memory",
    "--offload-group-size": "the weights in GPU memory (prefetch offloading: the last --offload-num-in-group layers of "
    "every group of this many kept in CPU memory)",
    "--offload-num-in-group": "the weights in GPU memory (how many layers of each --offload-group-size group stay in CPU)",
    "--offload-prefetch-step": "the GPU memory of prefetch offloading (the layers prefetched ahead: 'Higher values hide "
    "more latency but use more GPU memory')",
    "--offload-params": "which weights prefetch offloading keeps in CPU memory, so the weights in GPU memory",
    # KV cache offloading (vllm/config/cache.py CacheConfig.kv_offloading_size, kv_offloading_backend): a size makes
    # VllmConfig._post_init_kv_transfer_config (vllm/config/vllm.py) set a KV connector (native: OffloadingConnector),
    # as --kv-transfer-config does by hand; the connector's effect on the hybrid KV cache manager and the GPU blocks
    # has not been traced here (the leftover of the fourth capacity review)
    "--kv-offloading-size": "the KV cache: a KV connector (OffloadingConnector) with CPU blocks beside the GPU's, "
    "which the planner has not traced",
    "--kv-offloading-backend": "the KV cache's offloading connector (native or lmcache), which the planner has not traced",
    "--kv-transfer-config": "the KV cache: a KV connector and its blocks, which the planner has not traced",
}
# Values of unmodelled flags that say what the planner already assumes (vLLM's defaults for D3), so they are planned:
# the model dtype config.json gives ("auto" keeps it), the pooling runner of a classification model ("auto" picks
# it), no conversion (D3 is a sequence-classification class itself), the default offload backend ("auto": none
# without an offload size).
PLANNED_VALUES = {"--dtype": ("auto",), "--runner": ("auto", "pooling"), "--convert": ("auto", "none"), "--offload-backend": ("auto",)}
# vLLM's single-dash spellings of unmodelled flags, by the group of UNMODELLED_SHORT that reads them: -O3, -O 3 (the
# parser's own -O handling), -cc.mode=3, -cc '{...}' (the docstring of VllmConfig.compilation_config, vllm/config/vllm.py),
# -sc '{...}' (`add_argument("--speculative-config", "-sc", ...)`, vllm/engine/arg_utils.py). FlexibleArgumentParser
# reads a JSON key after a single-dash name too (`processed_arg.startswith("-") and "." in processed_arg`): -sc.method.
UNMODELLED_SHORT_FLAGS = {"o": "--optimization-level", "cc": "--compilation-config", "sc": "--speculative-config"}
UNMODELLED_SHORT = re.compile(r"\A(?:(?P<o>-O(?:\d+)?(?:\..*)?)|(?P<cc>-cc(?:\..*)?)|(?P<sc>-sc(?:\..*)?))\Z")
# The modalities Qwen3.5's vision tower serves (_mark_tower_model(vllm_config, {"image", "video"}), qwen3_5.py)
TOWER_MODALITIES = ("image", "video")
# Flags the planner reads or owns: an extra_args flag naming one of them, exactly or by a unique prefix as vLLM's
# parser allows, is that flag (d3_inputs.canonical_flag).
KNOWN_FLAGS = (*OWNED_FLAGS, *CATALOG_FLAGS, *sorted(BOOLEAN_FLAGS), "--kv-cache-dtype", "--max-num-batched-tokens",
               "--kv-cache-memory-bytes", "--max-num-seqs", "--limit-mm-per-prompt",
               *sorted(set(UNMODELLED_FLAGS) - BOOLEAN_FLAGS))  # fmt: skip
NAME_RE = re.compile(r"\A[a-z0-9][a-z0-9-]{0,62}\Z")
SHA_RE = re.compile(r"\A[0-9a-f]{40}\Z")
ITEM_KEYS = {"model", "variant", "gpus", "port", "name", "served_name", "extra_args", "env"}
# Compute capability of GPUs known by name, for a variant's min_compute_capability when nvidia-smi's compute_cap is
# not in the GPU list (declared GPUs): the L4 is Ada Lovelace, sm_89 (domain-facts 9).
KNOWN_COMPUTE_CAPABILITY = {"L4": 8.9}

# -- vLLM's startup memory, term by term (docs/capacity.md names each term's source) ---------------------------------
# Bytes per element of the dtypes config.json names (vllm/utils/torch_utils.py STR_DTYPE_TO_TORCH_DTYPE, get_dtype_size).
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
# HybridAttentionMambaModelConfig.verify_and_update_config (vllm/model_executor/models/config.py): FlashAttention
# block sizes are multiples of 16 (Blackwell's head-size-256 case, 32, does not apply to an L4).
KERNEL_BLOCK_ALIGNMENT = 16
# EngineArgs.get_batch_defaults (vllm/engine/arg_utils.py): `vllm serve` (UsageContext.OPENAI_API_SERVER) defaults
# max_num_batched_tokens to 2048 and max_num_seqs to 256, and to 8192 and 1024 when `device_memory >= 70 * GiB_bytes
# and "a100" not in device_name`, device_name being `current_platform.get_device_name().lower()` (an A100 80GB keeps
# the small defaults; large_batch_defaults reads the GPU's name as nvidia-smi gives it, case-insensitively);
# _set_default_max_num_seqs_and_batched_tokens_args raises the default to max_model_len when
# chunked prefill is off and caps it at max_num_seqs x max_model_len. An explicit --max-num-batched-tokens is kept.
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048
LARGE_GPU_MAX_NUM_BATCHED_TOKENS = 8192
LARGE_GPU_MIB = 70 * 1024
DEFAULT_MAX_NUM_SEQS = 256
LARGE_GPU_MAX_NUM_SEQS = 1024
# vllm/config/cache.py CacheDType (vllm-project/vllm commit 002f10e0): the --kv-cache-dtype values vLLM's parser
# accepts. The first three store the KV cache unquantized (2 bytes for D3's BF16); every other one is a quantized KV
# cache, which D3's encoder attention refuses on the first request that reaches it (the field report, domain-facts 2.4).
VLLM_KV_CACHE_DTYPES = (
    "auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla", "nvfp4_ds_mla",
    "turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc", "int4_per_token_head",
    "int8_per_token_head", "fp8_per_token_head", "nvfp4", "nvfp4_4over6",
)  # fmt: skip
UNQUANTIZED_KV_CACHE_DTYPES = ("auto", "float16", "bfloat16")
# The field report's fixed vision-encoder allocation at CUDA graph capture (skipped by --enforce-eager): "18.4 GB"
# beside "Model weights: 13.0 GB", which is vLLM's "Model loading took 13.0 GiB": GiB, as vLLM logs.
ENCODER_PROBE_GIB = 18.4
# Memory outside vLLM's accounting: the CUDA context (and NCCL's buffers at TP > 1) exist before vLLM's first memory
# snapshot, so they sit outside the --gpu-memory-utilization share but inside the GPU. No source gives the number;
# the field report bounds it: its 0.95 share started on an L4, so context + NCCL <= 5 % of the total torch sees
# (22,560 MiB, the share's base: not nvidia-smi's 23,034) = 1,128 MiB.
CUDA_CONTEXT_MIB = 512
# The sentence vLLM ends its KV cache refusals with (kv_cache_utils.py _check_enough_kv_cache_memory; as vLLM's logs
# print it: the URL ends in "/", not ".html")
CONSERVING_MEMORY = "See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details."
# Memory the profile run allocates outside torch's allocator (cuBLAS / NCCL workspaces): vLLM measures it
# (memory_profiling's non_torch_increase); its size is not in the source. A margin, d3_vram_overhead_mib.
NON_TORCH_MIB = 512


class PlanError(ValueError):
    """Raised by callers that want an exception instead of the ``errors`` list."""


@dataclass
class Options:
    """Fleet-wide planner settings (the ``d3_*`` inventory variables)."""

    port_base: int = 8000
    listen_address: str = "127.0.0.1"
    revisions: dict[str, str] = field(default_factory=dict)
    allow_non_l4: bool = False
    allow_cuda_graphs: bool = False
    require_revisions: bool = False
    # memory vLLM's profile run allocates outside torch (cuBLAS / NCCL workspaces): a margin (NON_TORCH_MIB)
    vram_overhead_mib: int = NON_TORCH_MIB
    # the least "Maximum concurrency for --max-model-len tokens per request" vLLM may log for a planned instance
    min_concurrency: float = 1.0
    # Sum of --gpu-memory-utilization allowed on a GPU that several instances share: vLLM refuses to start when
    # free memory is below its share x total, and the driver keeps some (tests/contracts/versions.yml).
    gpu_share_cap: float = 0.92
    # The host's own addresses (from facts); None = unknown (plan.yml without facts): the bind check is skipped.
    host_addresses: list[str] | None = None
    # R535+ driver in CUDA forward-compatibility mode (d3_cuda_compat).
    cuda_compat: bool = False
    # The host's Hugging Face cache (d3_hf_home): the weights role downloads into it, every instance mounts it.
    hf_home: str = "/var/lib/d3/huggingface"
    # The image every instance runs, as the inventory names it (d3_image_name, or repository@digest when pinned);
    # the d3_image role resolves a tag to the fleet's digest and the units run that.
    image: str = "IMAGE"
    # d3_units_api_key is set; d3_allow_unauthenticated: serve a non-loopback address without a key anyway
    api_key_set: bool = False
    allow_unauthenticated: bool = False
    # capabilities given back to every container (d3_container_capabilities); all others are dropped
    capabilities: list[str] = field(default_factory=list)

    @classmethod
    def from_dict(cls, raw: dict[str, Any] | None) -> Options:
        """Options from the role's variables; a None value means "not set in the inventory": the default here
        applies (this class is the one place that knows the planner's defaults)."""
        raw = {k: v for k, v in dict(raw or {}).items() if v is not None}
        known = {k: raw.pop(k) for k in list(raw) if k in cls.__dataclass_fields__}
        if raw:
            raise PlanError(f"unknown planner option(s): {', '.join(sorted(raw))}")
        # inventory values may arrive as strings ("8000"): take them as the type of the default
        for name, value in known.items():
            default = cls.__dataclass_fields__[name].default
            if isinstance(default, (int, float)) and not isinstance(default, bool) and not isinstance(value, bool):
                try:
                    known[name] = type(default)(value)
                except (TypeError, ValueError) as exc:
                    raise PlanError(f"d3_{name}: {value!r} is not a number") from exc
        return cls(**known)


def split_args(args: list[Any]) -> list[tuple[str, str | None]]:
    """Split a vLLM argument list into (flag, value) pairs as vLLM's parser reads it (d3_inputs.canonical_flag);
    value is None for boolean flags. A flag with a JSON key (``--flag.key``) keeps it: ``--flag.key``."""
    pairs: list[tuple[str, str | None]] = []
    items = [a if isinstance(a, str) else str(a) for a in args]
    for token in items:
        if not control_free(token):
            raise ValueError(f"{shown(token)} contains a control character (newline, tab, escape...)")
    i = 0
    while i < len(items):
        token = items[i]
        if not token.startswith("-") or token in ("-", "--"):
            raise ValueError(f"'{token}' is not a flag (extra_args items are --flag, --flag=value or --flag value)")
        flag, value, sub = canonical_flag(token, KNOWN_FLAGS)
        flag = flag + ("." + sub if sub else "")
        if value is not None:
            pairs.append((flag, value))
            i += 1
        elif flag in BOOLEAN_FLAGS or i + 1 >= len(items) or items[i + 1].startswith("--"):
            pairs.append((flag, None))
            i += 1
        else:
            pairs.append((flag, items[i + 1]))
            i += 2
    return pairs


def _merged(original: dict[str, Any], update: dict[str, Any]) -> None:
    """FlexibleArgumentParser.parse_args' recursive_dict_update (vllm/utils/argparse_utils.py): mappings merge key by
    key, lists extend, anything else replaces."""
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(original.get(key), dict):
            _merged(original[key], value)
        elif isinstance(value, list) and isinstance(original.get(key), list):
            original[key] += value
        else:
            original[key] = value


def mm_limits(pairs: list[tuple[str, str | None]]) -> dict[str, Any]:
    """The per-prompt count of each modality the --limit-mm-per-prompt arguments (split_args' pairs) set, as vLLM reads
    them. FlexibleArgumentParser.parse_args (vllm/utils/argparse_utils.py) nests a dotted one, `--json-arg.key2.key3
    value` being `{"key2": {"key3": value}}` (the value read as JSON, else as text; a key ending in + appends to a
    list), and merges the dotted ones into one JSON argument placed after the whole ones. argparse then keeps the last
    value; the planner merges them all instead (a whole one first), so that at worst it refuses a tower vLLM would
    build. MultiModalConfig (vllm/config/multimodal.py, _validate_limit_per_prompt) takes an int as the count and a
    mapping's "count" (BaseDummyOptions: 999 when absent), get_limit_per_prompt gives an unlisted modality 999, and
    _mark_tower_model builds no tower when every one of its modalities is 0. A count that reads as the number 0 ("0",
    0.0) is taken as 0; a whole value that is not JSON is left to vLLM's parser (it refuses it)."""
    parsed: dict[str, Any] = {}
    for flag, value in sorted(pairs, key=lambda pair: "." in pair[0]):  # the whole ones first, in their order
        if value is None:
            continue
        if "." not in flag:
            try:
                whole = json.loads(value)
            except ValueError:
                continue
            _merged(parsed, whole if isinstance(whole, dict) else {})
            continue
        keys = flag.split(".")[1:]
        nested: Any
        if keys[-1].endswith("+"):
            keys[-1], nested = keys[-1][:-1], value.split(",")
        else:
            try:
                nested = json.loads(value)
            except ValueError:
                nested = value
        for key in reversed(keys):
            nested = {key: nested}
        _merged(parsed, nested)
    counts: dict[str, Any] = {}
    for modality, limit in parsed.items():
        count = limit.get("count", 999) if isinstance(limit, dict) else limit
        try:
            counts[str(modality)] = 0 if float(count) == 0 else count
        except (TypeError, ValueError):
            counts[str(modality)] = count
    return counts


def mib_of_gb(gb: float) -> int:
    return round(gb * 1e9 / MIB)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _mib_text(nbytes: int) -> str:
    """Bytes in MiB as the refusals print them: whole MiB bare, else to two decimals (a share is
    int(total x --gpu-memory-utilization) bytes, request_memory's own rounding, seldom a whole MiB)."""
    return str(nbytes // MIB) if nbytes % MIB == 0 else f"{nbytes / MIB:.2f}"


def _gib(value: int) -> str:
    """vLLM's format_gib (vllm/utils/mem_utils.py) and gpu_worker.py's GiB(): `round(b / GiB_bytes, 2)`, a float
    printed as Python prints it: 3.3, not 3.30."""
    return str(round(value / GIB, 2))


def _gib2(value: int) -> str:
    """GiB with two decimals (torch's style, in this project's out-of-memory wording)."""
    return f"{value / GIB:.2f}"


def parse_bytes(text: Any) -> int:
    """vLLM's human_readable_int (vllm/engine/arg_utils.py), the type of --kv-cache-memory-bytes: a plain integer, or a
    number with a decimal (k, m, g, t) or binary (K, M, G, T; whole numbers only) suffix. Raises ValueError."""
    value = str(text).strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", value)
    if match is None:
        return int(value)
    number, suffix = match.groups()
    if suffix.islower():
        return int(float(number) * 1000 ** "kmgt".index(suffix) * 1000)
    return int(number) * 1024 ** ("KMGT".index(suffix) + 1)


def large_batch_defaults(gpu_total_mib: int, gpu_name: str = "") -> bool:
    """get_batch_defaults' test for its larger defaults: 70 GiB of device memory or more, and not an A100."""
    return gpu_total_mib >= LARGE_GPU_MIB and "a100" not in gpu_name.lower()


def default_batched_tokens(max_len: int, chunked: bool, gpu_total_mib: int, max_num_seqs: int | None = None,
                           gpu_name: str = "") -> int:  # fmt: skip
    """max_num_batched_tokens as `vllm serve` sets it when --max-num-batched-tokens is not given (EngineArgs.
    get_batch_defaults and _set_default_max_num_seqs_and_batched_tokens_args, vllm/engine/arg_utils.py): the cap is
    max_num_seqs (--max-num-seqs, or the default, default_max_num_seqs, before it is itself capped) x max_model_len."""
    large = large_batch_defaults(gpu_total_mib, gpu_name)
    batched = LARGE_GPU_MAX_NUM_BATCHED_TOKENS if large else DEFAULT_MAX_NUM_BATCHED_TOKENS
    if not chunked:  # "If max_model_len is too short, use the default for higher throughput."
        batched = max(max_len, batched)
    return min((default_max_num_seqs(gpu_total_mib, gpu_name) if max_num_seqs is None else max_num_seqs) * max_len, batched)


def default_max_num_seqs(gpu_total_mib: int, gpu_name: str = "") -> int:
    """get_batch_defaults' max_num_seqs for `vllm serve`: 1024 with its larger defaults (large_batch_defaults), else 256."""
    return LARGE_GPU_MAX_NUM_SEQS if large_batch_defaults(gpu_total_mib, gpu_name) else DEFAULT_MAX_NUM_SEQS


def resolved_max_num_seqs(given: int | None, batched: int, gpu_total_mib: int, gpu_name: str = "") -> int:
    """max_num_seqs as vLLM resolves it (_set_default_max_num_seqs_and_batched_tokens_args, vllm/engine/arg_utils.py):
    --max-num-seqs when given, else `min(self.max_num_seqs, self.max_num_batched_tokens)` of the default."""
    return given if given is not None else min(default_max_num_seqs(gpu_total_mib, gpu_name), batched)


def layer_counts(text: dict[str, Any]) -> tuple[int, int]:
    """(full-attention layers, Gated DeltaNet layers) of a Qwen3.5 text config: every full_attention_interval-th layer
    is full attention, the others GDN. A size with both is hybrid: its KV cache has two spec types (FullAttentionSpec,
    MambaSpec), which vLLM's hybrid KV cache manager groups (kv_cache_figures)."""
    layers = int(text["num_hidden_layers"])
    full = layers // int(text["full_attention_interval"])
    return full, layers - full


def tp_refusal(text: dict[str, Any], tp: int, vision: dict[str, Any] | None = None) -> str | None:
    """Why vLLM refuses to start a Qwen3.5 hybrid (config.json ``text``, and ``vision``, its vision_config) at tensor
    parallel size ``tp``, in vLLM's words and in the order vLLM meets the checks; None when every split is even.
    The order is current vLLM's: ``VllmConfig.__post_init__`` (vllm/config/vllm.py) runs ``try_verify_and_update_config``
    first, but its ``HybridAttentionMambaModelConfig.verify_and_update_config`` (vllm/model_executor/models/config.py)
    now leaves the GDN state's shape to ``Platform.update_block_size_for_backend``, called after the model is built;
    in older vLLM it sized the state there, so ``divide(conv_dim, tp)`` came first (docs/capacity.md).

    1. ``ModelConfig.verify_with_parallel_config`` (vllm/config/model.py), before any worker: the attention heads.
    2. The vision tower, built before the language model (vllm/model_executor/models/qwen3_5.py,
       ``Qwen3_5ForConditionalGeneration.__init__``: ``self.visual = Qwen3_VisionTransformer(...)`` under
       ``_mark_tower_model``, then ``self.language_model``): each ``Qwen3_VisionBlock`` (qwen3_vl.py) builds a
       ``Qwen2_5_VisionAttention`` (qwen2_5_vl.py), whose ``__init__`` calls ``dist_utils.divide(num_heads, tp_size)``
       (tp_size 1 only with ``--mm-encoder-tp-mode data``, which the planner refuses as not modelled), then its
       ``Qwen3_VisionMLP``'s ``ColumnParallelLinear(dim, intermediate_size)``: ``divide(intermediate_size, tp)``.
       D3's own class (D3ForSequenceClassification) is not public: the planner takes it to build Qwen3.5's vision
       tower as Qwen3.5 does (the field report's vision-encoder allocation says it has one).
    3. Building the language model (vllm/model_executor/models/qwen3_5.py: layer 0 is a Gated DeltaNet layer,
       ``GatedDeltaNetAttention.__init__`` in vllm/model_executor/layers/mamba/gdn_linear_attn.py): its ``conv1d``
       ``ColumnParallelLinear(output_size=conv_dim)`` calls ``divide(conv_dim, tp)``, whose
       ``ensure_divisibility`` (vllm/distributed/utils.py) asserts "{numerator} is not divisible by {denominator}";
       then ``in_proj_qkvz`` (key and value dims, a bare assert in ``MergedColumnParallelLinear``) and
       ``A_log = divide(num_v_heads, tp)``; the state shapes ``MambaStateShapeCalculator.gated_delta_net_state_shape``
       divide conv_dim and the value heads again, and the layer's forward splits the key heads by ``num_k_heads // tp``.
    4. The first full-attention layer (``Qwen3NextAttention.__init__``, vllm/model_executor/models/qwen3_next.py):
       KV heads at or above TP are split (``assert self.total_num_kv_heads % tp_size == 0``), KV heads below TP are
       replicated (``assert tp_size % self.total_num_kv_heads == 0``: each rank then holds one, ``get_num_kv_heads``)."""
    heads = int(text["num_attention_heads"])
    if heads % tp:
        return f"ValueError: Total number of attention heads ({heads}) must be divisible by tensor parallel size ({tp})."
    # the vision tower: Qwen2_5_VisionAttention's divide(num_heads, tp), then Qwen3_VisionMLP's linear_fc1
    for dim in (int(vision["num_heads"]), int(vision["intermediate_size"])) if vision else ():
        if dim % tp:
            return f"AssertionError: {dim} is not divisible by {tp}"
    k_heads, v_heads = int(text["linear_num_key_heads"]), int(text["linear_num_value_heads"])
    key_dim, value_dim = k_heads * int(text["linear_key_head_dim"]), v_heads * int(text["linear_value_head_dim"])
    # conv1d (conv_dim), in_proj_qkvz (the key dims): divide() -> ensure_divisibility's assertion
    for dim in (2 * key_dim + value_dim, key_dim):
        if dim % tp:
            return f"AssertionError: {dim} is not divisible by {tp}"
    if k_heads % tp:  # no assertion in vLLM: the layer's forward views by num_k_heads // tp_size
        return (f"RuntimeError: the linear-attention key heads ({k_heads}) do not split over {tp} ranks "
                "(GatedDeltaNetAttention forward: num_k_heads // tp_size)")  # fmt: skip
    if v_heads % tp:  # A_log = divide(num_v_heads, tp)
        return f"AssertionError: {v_heads} is not divisible by {tp}"
    kv_heads = int(text["num_key_value_heads"])
    if kv_heads >= tp and kv_heads % tp:
        return "AssertionError: assert self.total_num_kv_heads % tp_size == 0"
    if kv_heads < tp and tp % kv_heads:  # replicated KV heads: TP a multiple of them
        return "AssertionError: assert tp_size % self.total_num_kv_heads == 0"
    return None


def tp_sizes(text: dict[str, Any], vision: dict[str, Any] | None = None) -> list[int]:
    """The tensor parallel sizes vLLM starts this architecture at (tp_refusal), up to its attention heads."""
    return [t for t in range(1, int(text["num_attention_heads"]) + 1) if tp_refusal(text, t, vision) is None]


def kv_cache_figures(
    arch: dict[str, Any],
    flags: dict[str, Any],
    gpu_total_mib: int,
    tp: int,
    weights_mib: int = 0,
    non_torch_mib: int = NON_TORCH_MIB,
    cuda_context_mib: int = CUDA_CONTEXT_MIB,
) -> dict[str, Any]:
    """What vLLM computes at startup for a hybrid Qwen3.5 (D3) model on one GPU whose total, as vLLM sees it
    (torch.cuda.mem_get_info, vllm_total_mib), is ``gpu_total_mib``, at tensor parallel size ``tp``: the KV cache spec
    (attention block size, page size, groups), the memory the profile run leaves to the KV cache, and the two figures
    vLLM logs, ``GPU KV cache size: N tokens`` and ``Maximum concurrency for N tokens per request: Xx``; or the refusal
    vLLM would raise (``refusal``: kind and vLLM's message).

    ``arch``: the catalog's ``architecture`` (``text``: config.json text_config numbers). ``flags``: vLLM flag values,
    ``--max-model-len`` and ``--gpu-memory-utilization`` (required), ``--enforce-eager``, ``--max-num-batched-tokens``,
    ``--enable-chunked-prefill``, ``--kv-cache-memory-bytes`` (bytes), ``--quantization``; ``fp8_activations`` (not a
    flag: the checkpoint quantizes activations to FP8, as --quantization fp8 does), ``gpu_name`` (not a flag: the GPU's
    name, for get_batch_defaults' A100 exception). ``weights_mib``: the whole checkpoint's weights in GPU memory. Each
    term's source is in docs/capacity.md."""
    text = arch["text"]
    full, linear = layer_counts(text)
    dtype = DTYPE_BYTES[str(text["dtype"])]
    kv_heads = max(1, int(text["num_key_value_heads"]) // tp)  # ModelConfig.get_num_kv_heads
    head_dim = int(text["head_dim"])
    # FullAttentionSpec.page_size_bytes for one token: K and V, kv-cache dtype "auto" = the model's dtype
    attn_token = 2 * kv_heads * head_dim * dtype
    # MambaStateShapeCalculator.gated_delta_net_state_shape + MambaSpec.page_size_bytes: a conv state of
    # (conv_kernel - 1) x conv_dim / tp in the model dtype, and a temporal state of value heads / tp x k x v dims in
    # mamba_ssm_dtype. UNSETTLED (docs/capacity.md, last section): vLLM takes the temporal state's dtype from
    # cache_config.mamba_ssm_cache_dtype ("auto": the model dtype, BF16); config.json's float32 is copied into it only
    # by Qwen3_5ForConditionalGenerationConfig, which MODELS_CONFIG_MAP keys on the architecture name, and D3's is
    # D3ForSequenceClassification. The planner keeps config.json's float32 until a D3 startup log settles it.
    key_dim = int(text["linear_num_key_heads"]) * int(text["linear_key_head_dim"])
    value_dim = int(text["linear_num_value_heads"]) * int(text["linear_value_head_dim"])
    conv_bytes = (int(text["linear_conv_kernel_dim"]) - 1) * ((2 * key_dim + value_dim) // tp) * dtype
    ssm_bytes = (
        int(text["linear_num_value_heads"]) // tp * int(text["linear_key_head_dim"]) * int(text["linear_value_head_dim"])
        * DTYPE_BYTES[str(text["mamba_ssm_dtype"])]
    )  # fmt: skip
    mamba_page = conv_bytes + ssm_bytes
    # HybridAttentionMambaModelConfig (mamba cache mode "none"): the smallest aligned attention block whose page
    # holds a mamba state; the mamba page is padded to that page
    block_size = KERNEL_BLOCK_ALIGNMENT * _cdiv(mamba_page, KERNEL_BLOCK_ALIGNMENT * attn_token)
    page = block_size * attn_token
    # _get_kv_cache_groups_uniform_page_size: groups of the smaller layer count (the larger when under 1.5 x)
    group_size = min(full, linear) if max(full, linear) >= 1.5 * min(full, linear) else max(full, linear)
    attn_groups, mamba_groups = _cdiv(full, group_size), _cdiv(linear, group_size)
    groups = attn_groups + mamba_groups

    max_len = int(flags["--max-model-len"])
    util = float(flags["--gpu-memory-utilization"])
    chunked = bool(flags.get("--enable-chunked-prefill"))
    given_seqs = flags.get("--max-num-seqs")
    given_seqs = None if given_seqs is None else int(given_seqs)
    batched = flags.get("--max-num-batched-tokens")
    gpu_name = str(flags.get("gpu_name") or "")
    batched = default_batched_tokens(max_len, chunked, int(gpu_total_mib), given_seqs, gpu_name) if batched is None else int(batched)
    max_num_seqs = resolved_max_num_seqs(given_seqs, batched, int(gpu_total_mib), gpu_name)
    # the profile run's activation peak per token on one GPU: the residual stream plus the largest layer transient
    hidden, inter = int(text["hidden_size"]), int(text["intermediate_size"])
    q8 = 1 if flags.get("fp8_activations", flags.get("--quantization") == "fp8") else 0
    residual = 2 * hidden * dtype
    mlp = (2 * inter // tp + inter // tp) * dtype + (inter // tp + hidden) * q8 + hidden * dtype
    # Gated DeltaNet (GatedDeltaNetAttention.forward, vllm/model_executor/layers/mamba/gdn_linear_attn.py): in the
    # profile run attn_metadata is None and _forward_core returns early ("V1 profile run"), so no convolution output
    # and no recurrence exist; what does: in_proj_qkvz's output, core_attn_out (torch.zeros, value dim; the gated
    # norm's output of the same size replaces it), out_proj's output (hidden). in_proj_ba's and b/a's few values per
    # value head are left out (no D3 size's peak is a GDN layer's).
    gdn = ((2 * key_dim + 2 * value_dim) // tp + value_dim // tp + hidden) * dtype + hidden * q8
    heads = int(text["num_attention_heads"])
    attn = (3 * heads * head_dim // tp + 2 * kv_heads * head_dim + hidden) * dtype + hidden * q8
    per_token = residual + max(mlp, gdn, attn)
    # in bytes, as vLLM counts them (the MiB figures below are for reading, rounded up)
    peak = batched * per_token
    # without --enforce-eager: the CUDA-graph term, the field report's fixed vision-encoder allocation at capture
    probe = 0 if flags.get("--enforce-eager", True) else round(ENCODER_PROBE_GIB * GIB)
    weights_bytes = _cdiv(int(weights_mib) * MIB, tp)
    non_kv = weights_bytes + peak + int(non_torch_mib) * MIB + probe
    peak_mib, probe_mib, weights = _cdiv(peak, MIB), _cdiv(probe, MIB), _cdiv(int(weights_mib), tp)
    non_kv_mib = weights + peak_mib + int(non_torch_mib) + probe_mib
    requested = int(gpu_total_mib * MIB * util)  # request_memory: init_snapshot.total_memory * gpu_memory_utilization
    fixed = flags.get("--kv-cache-memory-bytes")
    # determine_available_memory: --kv-cache-memory-bytes as given (no profiling), else requested - non_kv_cache_memory
    available = requested - non_kv if fixed is None else int(fixed)
    per_seq_blocks = attn_groups * _cdiv(max_len, block_size) + mamba_groups
    needed = group_size * page * per_seq_blocks  # _max_memory_usage_bytes_from_groups
    num_blocks = max(available, 0) // page // group_size  # get_num_blocks
    fits_blocks = max(available, 0) // (group_size * page) - mamba_groups
    estimated = min(max_len, block_size * (fits_blocks // attn_groups)) if fits_blocks > 0 else 0
    figures: dict[str, Any] = {
        "block_size": block_size,
        "page_size_bytes": page,
        "mamba_page_bytes": mamba_page,
        "kv_groups": groups,
        "group_size": group_size,
        "max_num_batched_tokens": batched,
        "max_num_seqs": max_num_seqs,
        "activation_bytes_per_token": per_token,
        "gpu_total_mib": int(gpu_total_mib),
        "weights_mib": weights,
        "activation_peak_mib": peak_mib,
        "non_torch_mib": int(non_torch_mib),
        "encoder_probe_mib": probe_mib,
        "non_kv_mib": non_kv_mib,
        "requested_mib": requested // MIB,
        "kv_cache_memory_bytes": fixed,
        "kv_pool_mib": num_blocks * page * group_size // MIB,
        "sequence_mib": _cdiv(needed, MIB),
        "num_gpu_blocks": num_blocks,
        # _report_kv_cache_config: num_blocks // groups x the smallest block_size of the groups; a GDN group's
        # MambaSpec block_size is max_model_len (MambaModelConfig.verify_and_update_config, prefix caching off:
        # mamba_block_size = model_config.max_model_len), so a context shorter than the attention block counts
        "gpu_kv_cache_tokens": num_blocks // groups * (min(block_size, max_len) if mamba_groups else block_size),
        "max_concurrency": num_blocks / per_seq_blocks,  # get_max_concurrency_for_kv_cache_config
        "estimated_max_model_len": estimated,
        "refusal": None,
    }
    # the GPU holds the profile run (and a fixed KV cache) beside the CUDA context, or torch runs out of memory
    in_gpu = non_kv + (0 if fixed is None else int(fixed))
    if not chunked and batched < max_len:
        figures["refusal"] = {"kind": "batched_tokens", "message": f"max_num_batched_tokens ({batched}) is smaller than "
                              f"max_model_len ({max_len}). This effectively limits the maximum sequence length to "
                              "max_num_batched_tokens and makes vLLM reject longer sequences. Please increase "
                              "max_num_batched_tokens or decrease max_model_len."}  # fmt: skip
    elif batched < max_num_seqs:  # SchedulerConfig.verify_max_model_len (vllm/config/scheduler.py), chunked or not
        figures["refusal"] = {"kind": "max_num_seqs", "message": f"max_num_batched_tokens ({batched}) must be greater than "
                              f"or equal to max_num_seqs ({max_num_seqs})."}  # fmt: skip
    elif in_gpu > (int(gpu_total_mib) - int(cuda_context_mib)) * MIB:
        # torch's OutOfMemoryError, in this project's words (torch's own names sizes no model gives): at CUDA graph
        # capture when the profile run alone fits, else in the profile run
        total = int(gpu_total_mib) * MIB
        if probe and in_gpu - probe <= total - int(cuda_context_mib) * MIB:
            oom = (f"CUDA out of memory during CUDA graph capture. Tried to allocate {ENCODER_PROBE_GIB:.2f} GiB (fixed "
                   f"vision-encoder profiling allocation). GPU 0 has a total capacity of {_gib2(total)} GiB of which "
                   f"{_gib2(max(0, total - in_gpu + probe))} GiB is free. Use --enforce-eager.")  # fmt: skip
        else:
            oom = (f"CUDA out of memory. GPU 0 has a total capacity of {_gib2(total)} GiB (weights {_gib2(weights_bytes)} GiB, "
                   f"profile run {_gib2(peak)} GiB at {batched} tokens, non-torch {_gib2(int(non_torch_mib) * MIB)} GiB, CUDA "
                   f"graphs {_gib2(probe)} GiB" + ("" if fixed is None else f", KV cache {_gib2(int(fixed))} GiB") + ").")
        figures["refusal"] = {"kind": "profile_oom", "message": oom}
    elif available <= 0:
        figures["refusal"] = {"kind": "no_kv_memory", "message": "No available memory for the cache blocks. Try "
                              f"increasing `gpu_memory_utilization` when initializing the engine. {CONSERVING_MEMORY}"}  # fmt: skip
    elif needed > available:
        based = (f"Based on the available memory, the estimated maximum model length is {estimated}. "
                 if estimated > 0 else "")  # fmt: skip
        figures["refusal"] = {
            "kind": "max_seq_len",
            "message": f"To serve at least one request with the models's max seq len ({max_len}), ({_gib(needed)} GiB KV "
            f"cache is needed, which is larger than the available KV cache memory ({_gib(available)} GiB). {based}Try "
            f"increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine. {CONSERVING_MEMORY}",
        }
    return figures


def vllm_total_mib(gpu: dict[str, Any], gpu_models: dict[str, Any] | None) -> int:
    """A GPU's total memory as vLLM sees it (torch.cuda.mem_get_info, the base of --gpu-memory-utilization): the
    catalog's figure (d3_catalog_common.gpu_models, with its source) for a GPU model it knows at nvidia-smi's
    memory.total; nvidia-smi's memory.total otherwise (not known: docs/capacity.md)."""
    mib = int(gpu["memory_total_mib"])
    for word in str(gpu["name"]).split():
        known = (gpu_models or {}).get(word)
        if known and int(known["nvidia_smi_total_mib"]) == mib:
            return int(known["vllm_total_mib"])
    return mib


def host_gpus(count: int, memory_mib: int, name: str) -> list[dict[str, Any]]:
    """GPUs declared in inventory (d3_gpu_count / d3_gpu_memory_mib / d3_gpu_name; the role passes the catalog's
    l4_memory_mib when d3_gpu_memory_mib is not set)."""
    return [{"index": i, "name": name, "memory_total_mib": int(memory_mib)} for i in range(int(count))]


def _fmt(value: float) -> str:
    text = f"{value:.4f}".rstrip("0").rstrip(".")
    return text or "0"


def _util(value: float) -> str:
    """A --gpu-memory-utilization (or d3_gpu_share_cap) as the refusals print it: as Python prints the float, every digit
    given (0.22733, not _fmt's 0.2273), which is also how vLLM's own messages print it."""
    return str(float(value))


def _exact(value: Decimal) -> str:
    """A decimal sum or product of shares, in full (20755.4256, not 20755): what the cap check compares, unrounded."""
    return format(value.normalize(), "f")


class _Planner:
    def __init__(
        self,
        host: str,
        models: list[dict[str, Any]],
        catalog: dict[str, Any],
        common: dict[str, Any],
        gpus: list[dict[str, Any]],
        options: Options,
    ) -> None:
        self.host = host
        self.models = models
        self.catalog = catalog
        self.common = common
        self.gpus = sorted(gpus, key=lambda g: int(g["index"]))
        self.opt = options
        self.errors: list[str] = []
        self.util: dict[int, float] = {int(g["index"]): 0.0 for g in self.gpus}
        self.use: dict[int, list[dict[str, Any]]] = {int(g["index"]): [] for g in self.gpus}

    def refuse(self, where: str, problem: str, fix: str) -> None:
        self.errors.append(f"host {self.host}: {where}: {problem}. Fix: {fix}")

    # -- per-instance resolution ------------------------------------------------------------
    def resolve(self, pos: int, item: Any) -> dict[str, Any] | None:
        where = f"d3_models[{pos}]"
        if not isinstance(item, dict):
            self.refuse(where, f"expected a mapping with a `model:` key, got {item!r}", "write `- model: d3-mini`")
            return None
        unknown = sorted(set(item) - ITEM_KEYS)
        if unknown:
            self.refuse(where, f"unknown key(s) {unknown}", f"use only {sorted(ITEM_KEYS)}")
            return None
        model = item.get("model")
        if model not in self.catalog:
            self.refuse(
                where,
                f"unknown model {model!r}",
                f"set d3_models[{pos}].model to one of: {', '.join(sorted(self.catalog))}",
            )
            return None
        entry = self.catalog[model]
        name = str(item.get("name") or entry["instance_name"])
        where = f"d3_models[{pos}] ({name})"
        if not NAME_RE.match(name):
            self.refuse(where, f"name {name!r} is not a valid unit name", "use lowercase letters, digits and '-'")
            return None
        # the model name clients send (--served-model-name): the instance name, or one shared by replicas on one host
        # (d3_fleet_place's spread: false replicas NAME-1, NAME-2 serve NAME)
        served = item.get("served_name", name)
        if not isinstance(served, str) or not NAME_RE.match(served):
            self.refuse(where, f"served_name {served!r} is not a valid model name", "use lowercase letters, digits and '-'")
            return None
        variant = self.variant(pos, where, model, entry, item.get("variant"))
        if variant is None:
            return None

        try:
            pairs = split_args(list(item.get("extra_args") or []))
        except ValueError as exc:
            self.refuse(where, f"d3_models[{pos}].extra_args: {exc}", "write each flag as '--flag=value'")
            return None
        flags: dict[str, str | None] = {
            "--tensor-parallel-size": str(variant["tensor_parallel_size"]),
            "--max-model-len": str(variant["max_model_len"]),
            "--gpu-memory-utilization": _fmt(float(variant["gpu_memory_utilization"])),
            "--quantization": variant["quantization_flag"],
        }
        eager = bool(self.common["enforce_eager"])
        extra: list[tuple[str, str | None]] = []
        mm_args: list[tuple[str, str | None]] = []
        for flag, value in pairs:
            base = flag.split(".", 1)[0]
            short = UNMODELLED_SHORT.match(flag)
            if short:
                base = next(UNMODELLED_SHORT_FLAGS[group] for group, spelled in short.groupdict().items() if spelled)
            if base in OWNED_FLAGS:
                self.refuse(where, f"extra_args sets {base}, which the planner owns", f"remove it; set {OWNED_FLAGS[base]}")
                return None
            if base == "--disable-hybrid-kv-cache-manager" and all(counts := layer_counts(entry["architecture"]["text"])):
                full, linear = counts
                self.refuse(
                    where,
                    f"extra_args sets {base}, with which vLLM refuses to start {model}: 'ValueError: Hybrid KV cache "
                    "manager is disabled but failed to convert the KV cache specs to one unified type.' "
                    f"(unify_hybrid_kv_cache_specs, vllm/v1/core/kv_cache_utils.py: its {linear} Gated DeltaNet layers "
                    f"(MambaSpec) and {full} full-attention layers (FullAttentionSpec) convert to no one spec)",
                    f"remove {flag} from d3_models[{pos}].extra_args (the planner counts vLLM's hybrid KV cache manager)",
                )
                return None
            planned = (*PLANNED_VALUES.get(base, ()), *((entry["architecture"]["text"]["dtype"],) if base == "--dtype" else ()))
            if base in UNMODELLED_FLAGS and not (flag == base and value in planned):
                self.refuse(
                    where,
                    f"extra_args sets {base}, which changes {UNMODELLED_FLAGS[base]}; the planner does not model it, "
                    "so it cannot predict vLLM's startup figures or refusals with it",
                    f"remove {flag} from d3_models[{pos}].extra_args",
                )
                return None
            if base == "--limit-mm-per-prompt":  # passed to vLLM, whole or by key; read for the tower's modalities
                mm_args.append((flag, value))
                extra.append((flag, value))
                continue
            if "." in flag and base in KNOWN_FLAGS:
                self.refuse(
                    where,
                    f"extra_args sets {flag} (a JSON key of {base}), which the planner reads as a whole",
                    f"give {base} VALUE instead",
                )
                return None
            if flag == "--enforce-eager":
                eager = True
            elif flag == "--no-enforce-eager":
                eager = False
            elif flag in CATALOG_FLAGS:
                flags[flag] = value
            else:
                extra.append((flag, value))

        limits = mm_limits(mm_args)
        if all(limits.get(m) == 0 for m in TOWER_MODALITIES):
            # every modality of the tower at 0: vLLM builds no vision tower, as with --language-model-only ("setting
            # all multimodal modalities to 0", vLLM's multimodal docs; domain facts 2.1)
            self.refuse(
                where,
                f"extra_args sets --limit-mm-per-prompt to 0 for {' and '.join(TOWER_MODALITIES)}, which builds no "
                "vision tower, as --language-model-only does (its TP checks, its weights in GPU memory); the planner "
                "does not model it, so it cannot predict vLLM's startup figures or refusals with it",
                f"remove the 0 limits from d3_models[{pos}].extra_args (a limit above 0, or size hints, are planned)",
            )
            return None

        quant = flags["--quantization"]
        if variant["pre_quantized"] and quant is not None and quant != variant["quant_method"]:
            # vLLM ModelConfig._verify_quantization (vllm/config/model.py): the checkpoint's quant_method wins
            self.refuse(
                where,
                f"variant {variant['name']!r} ({variant['hf_repo']}) is a pre-quantized checkpoint "
                f"(quant_method {variant['quant_method'] or 'set by the checkpoint'}); with --quantization {quant} vLLM "
                f"refuses to start: 'Quantization method specified in the model config ({variant['quant_method']}) "
                f"does not match the quantization method specified in the `quantization` argument ({quant}).'",
                f"remove --quantization from d3_models[{pos}].extra_args (vLLM reads it from the checkpoint)",
            )
            return None
        kv = dict(extra).get("--kv-cache-dtype")
        if kv is not None and kv not in VLLM_KV_CACHE_DTYPES:
            self.refuse(
                where,
                f"--kv-cache-dtype {kv} is not one of vLLM's KV cache dtypes: vLLM's argument parser refuses it "
                f"(\"argument --kv-cache-dtype: invalid choice: '{kv}'\", vllm/config/cache.py CacheDType)",
                f"remove --kv-cache-dtype from d3_models[{pos}].extra_args (auto: the model's BF16)",
            )
        elif kv is not None and kv not in UNQUANTIZED_KV_CACHE_DTYPES:
            self.refuse(
                where,
                f"--kv-cache-dtype {kv} is a quantized KV cache, which crashes D3 on the first request that reaches "
                "encoder attention ('quantized KV cache is not supported for encoder attention')",
                f"remove --kv-cache-dtype from d3_models[{pos}].extra_args",
            )
        if "--enable-prefix-caching" in dict(extra):
            chunked_on = "--enable-chunked-prefill" in dict(extra)
            self.refuse(
                where,
                "--enable-prefix-caching on a Gated DeltaNet hybrid selects vLLM's mamba cache mode 'align', "
                + ("whose block size and per-request state blocks the planner does not model (docs/capacity.md)"
                   if chunked_on else "which D3 cannot start with, chunked prefill being off: vLLM refuses at startup "
                   "with 'Chunked prefill is required for mamba cache mode 'align'.' "
                   "(vllm/model_executor/models/config.py)"),
                f"remove --enable-prefix-caching from d3_models[{pos}].extra_args",
            )  # fmt: skip
        if not eager and not self.opt.allow_cuda_graphs:
            self.refuse(
                where,
                "dropping --enforce-eager makes vLLM capture CUDA graphs, which OOMs on a 24 GB L4 "
                "(fixed 18.4 GB vision-encoder profiling allocation)",
                "remove --no-enforce-eager, or set d3_allow_cuda_graphs: true to acknowledge the risk",
            )
        if str(flags["--max-model-len"]).strip().lower() in ("auto", "-1"):
            # vLLM takes them: _auto_fit_max_model_len (vllm/v1/core/kv_cache_utils.py) fits the length to the memory
            # left at startup; every figure here (the profile batch, the KV cache, the refusals) starts from the length
            self.refuse(
                where,
                f"--max-model-len {flags['--max-model-len']}: vLLM would fit the length to the memory left at startup "
                "(_auto_fit_max_model_len), but the planner needs an explicit number: the profile run's batch, the KV "
                "cache figures and the refusals all depend on it",
                f"give a number in d3_models[{pos}].extra_args, e.g. --max-model-len={variant['max_model_len']} (the "
                "catalog's)",
            )
            return None
        try:
            tp = int(str(flags["--tensor-parallel-size"]))
            max_len = int(str(flags["--max-model-len"]))
            util = float(str(flags["--gpu-memory-utilization"]))
        except ValueError as exc:
            self.refuse(where, f"a numeric flag in extra_args does not parse ({exc})", "give numbers")
            return None
        if tp < 1:
            self.refuse(where, f"--tensor-parallel-size {tp} is below 1", "use 1 or more")
            return None
        arch_text, arch_vision = entry["architecture"]["text"], entry["architecture"].get("vision")
        split = tp_refusal(arch_text, tp, arch_vision)
        if split:
            # tp_refusal: vLLM's checks in its order (ModelConfig.verify_with_parallel_config, then vLLM's divide()
            # while the vision tower, then the Gated DeltaNet and attention layers are built)
            self.refuse(
                where,
                f"vLLM refuses to start {model} at --tensor-parallel-size {tp}: '{split}'",
                f"set --tensor-parallel-size to one of {', '.join(str(t) for t in tp_sizes(arch_text, arch_vision))} "
                f"in d3_models[{pos}].extra_args",
            )
            return None
        length_ok = 1 <= max_len <= int(self.common["max_position_embeddings"])
        if not length_ok:
            self.refuse(
                where,
                f"--max-model-len {max_len} is outside 1..{self.common['max_position_embeddings']} (max_position_embeddings)",
                f"set --max-model-len within 1..{self.common['max_position_embeddings']} in d3_models[{pos}].extra_args",
            )
        if not 0.0 < util <= 1.0:
            self.refuse(where, f"--gpu-memory-utilization {util} is outside (0, 1]", "use a fraction such as 0.45")
            return None

        weights_mib = mib_of_gb(float(variant["weights_gb"]))
        # True: the field report ran this variant at this TP on L4s; False: nobody did (a chosen variant, or the
        # default at another TP); None: a default recipe the field report's sizing table lists without a run
        measured: bool | None = bool(self.gpus) and all(self.is_l4(g) for g in self.gpus) and tp in variant["measured_on_l4_tp"]
        if not measured and not variant["chosen"] and not variant["measured_on_l4_tp"]:
            measured = None
        extra_flags = dict(extra)
        try:
            batched = extra_flags.get("--max-num-batched-tokens")
            batched = None if batched is None else parse_bytes(batched)
            fixed = extra_flags.get("--kv-cache-memory-bytes")
            fixed = None if fixed is None else parse_bytes(fixed)
            seqs = extra_flags.get("--max-num-seqs")
            seqs = None if seqs is None else int(str(seqs))
        except ValueError as exc:
            self.refuse(where, f"--max-num-batched-tokens, --max-num-seqs or --kv-cache-memory-bytes in extra_args does "
                        f"not parse ({exc})", "give a number (e.g. 8192, 8k or 4G)")  # fmt: skip
            return None
        vllm_flags = {
            "--max-model-len": max_len,
            "--gpu-memory-utilization": util,
            "--enforce-eager": eager,
            "--quantization": flags["--quantization"],
            "--max-num-batched-tokens": batched,
            "--max-num-seqs": seqs,
            "--kv-cache-memory-bytes": fixed,
            "--enable-chunked-prefill": "--enable-chunked-prefill" in extra_flags,
            "fp8_activations": flags["--quantization"] == "fp8" or variant["activations"] == "fp8",
        }
        min_mem, vllm_flags["gpu_name"] = self.smallest_gpu()
        figures = self.figures(entry, vllm_flags, min_mem, tp, weights_mib)  # no GPU: refused at placement
        short = self.memory_shortfall(figures, max_len)
        if self.gpus and short and length_ok:
            self.refuse(
                where,
                f"{model}{variant['label']} at TP {tp} {short}",
                self.memory_fix(pos, entry, vllm_flags, min_mem, tp, weights_mib),
            )
            return None

        problems = env_problems(item.get("env"))
        for what, problem, fix in problems:
            self.refuse(where, f"d3_models[{pos}].{what} {problem}", fix)
        if problems:
            return None
        env = {str(k): str(v) for k, v in self.common["env"].items()}
        env.update({str(k): str(v) for k, v in (item.get("env") or {}).items()})
        env["HF_HUB_OFFLINE"] = "1"
        if self.opt.cuda_compat:
            env["VLLM_ENABLE_CUDA_COMPATIBILITY"] = "1"
        # d3_model_revisions is keyed by the variant's repository name ("d3", "d3-FP8"); the full repository id
        # ("vllm-sr/d3-FP8") is accepted too. A default variant's repository name is the model id.
        key = variant["revision_key"]
        revision = self.opt.revisions.get(variant["hf_repo"], self.opt.revisions.get(key))
        record = f" (vllm-sr v3.1.0 record: {entry['release_revision_short']}...)" if variant["hf_repo"] == entry["hf_repo"] else ""
        if revision is not None and not SHA_RE.match(str(revision)):
            self.refuse(
                where,
                f"d3_model_revisions['{key}'] = {revision!r} is not a 40-hex commit SHA",
                "pin the full commit SHA from the Hub (a branch or tag can move)",
            )
        elif revision is None and self.opt.require_revisions:
            self.refuse(
                where,
                f"no pinned revision for {key}" + ("" if key == model else f" ({model} variant {variant['name']})"),
                f"set d3_model_revisions['{key}'] to the full commit SHA of {variant['hf_repo']}{record}",
            )
        return {
            "pos": pos,
            "name": name,
            "served": served,
            "model": model,
            "variant": variant,
            "hf_repo": variant["hf_repo"],
            "revision": revision,
            "tp": tp,
            "max_model_len": max_len,
            "util": util,
            "flags": flags,
            "eager": eager,
            "extra": extra,
            "env": env,
            "shm_size": variant["shm_size"],
            "weights_mib": weights_mib,
            "figures": figures,
            "vllm_flags": vllm_flags,
            "measured": measured,
            "gpus_wanted": item.get("gpus"),
            "port_wanted": item.get("port"),
        }

    # -- variants ---------------------------------------------------------------------------------
    @staticmethod
    def is_l4(gpu: dict[str, Any]) -> bool:
        return "L4" in str(gpu["name"]).split()

    @staticmethod
    def compute_capability(gpu: dict[str, Any]) -> float | None:
        raw = gpu.get("compute_cap")
        if raw not in (None, ""):
            try:
                return float(str(raw))
            except ValueError:
                return None
        for word in str(gpu["name"]).split():
            if word in KNOWN_COMPUTE_CAPABILITY:
                return KNOWN_COMPUTE_CAPABILITY[word]
        return None

    def variant(self, pos: int, where: str, model: str, entry: dict[str, Any], wanted: Any) -> dict[str, Any] | None:
        """The instance's checkpoint variant with every field resolved (the size's own values where it has none);
        refuses a variant that does not exist or does not apply to the host's GPUs."""
        variants = entry.get("variants") or {}
        name = wanted if wanted is not None else entry.get("default_variant")
        if name is None and not variants:  # a catalog entry without variants: the size's own checkpoint
            raw: dict[str, Any] = {}
        elif not variants:
            self.refuse(
                where,
                f"{model} has no variant {name!r}: it has only its default checkpoint ({entry['hf_repo']}), no variants to choose from",
                f"remove `variant:` from d3_models[{pos}] to run that checkpoint",
            )
            return None
        elif not isinstance(name, str) or name not in variants:
            self.refuse(
                where,
                f"{model} has no variant {name!r}",
                f"set d3_models[{pos}].variant to one of: {', '.join(variants)} (or leave it out for {entry.get('default_variant')})",
            )
            return None
        else:
            raw = dict(variants[name] or {})
        hf_repo = str(raw.get("hf_repo", entry["hf_repo"]))
        quant_method = raw.get("quant_method")
        flag = raw["quantization_flag"] if "quantization_flag" in raw else self.common["quantization"]
        resolved = {
            "name": name or "default",
            "label": "" if wanted is None else f" variant {name}",
            "chosen": name != entry.get("default_variant"),
            "hf_repo": hf_repo,
            "revision_key": hf_repo.rsplit("/", 1)[-1],
            "weights_gb": raw.get("weights_gb", entry["weights_fp8_gb"]),
            "download_gb": raw.get("download_gb", entry["download_gb"]),
            "quant_method": quant_method,
            "pre_quantized": bool(raw.get("pre_quantized", quant_method is not None)),
            "quantization_flag": None if flag is None else str(flag),
            "measured_on_l4_tp": [int(t) for t in raw.get("measured_on_l4_tp") or []],
            "activations": raw.get("activations"),
        }
        for key in ("tensor_parallel_size", "max_model_len", "gpu_memory_utilization", "shm_size"):
            resolved[key] = raw.get(key, entry[key])
        need = raw.get("min_compute_capability")
        if need is not None:
            for gpu in self.gpus:
                have = self.compute_capability(gpu)
                if have is None or have < float(need):
                    # a policy floor above what vLLM needs says so: vLLM would run it, the catalog does not plan it
                    floor = (f"is planned on compute capability {need} and newer only (policy: {raw['policy']})"
                             if raw.get("policy") else f"needs compute capability {need}"
                             + (f" ({raw['requires']})" if raw.get("requires") else ""))  # fmt: skip
                    self.refuse(
                        where,
                        f"variant {name!r} ({hf_repo}) {floor}"
                        + f"; GPU {gpu['index']} is a {gpu['name']}"
                        + (f" (compute capability {have})" if have is not None else " (compute capability unknown)"),
                        f"choose another variant for d3_models[{pos}].variant: "
                        + ", ".join(
                            v
                            for v, spec in variants.items()
                            if (spec or {}).get("min_compute_capability") is None
                            or (have is not None and have >= float((spec or {})["min_compute_capability"]))
                        ),
                    )
                    return None
        return resolved

    def smallest_gpu(self, indices: list[int] | None = None) -> tuple[int, str]:
        """The GPU the figures are computed on: the smallest as vLLM sees it (vllm_total_mib), of ``indices`` or of the
        host; its total and its name ((0, "") without GPUs: refused at placement)."""
        gpus = [g for g in self.gpus if indices is None or int(g["index"]) in indices]
        smallest = min(gpus, key=lambda g: vllm_total_mib(g, self.common.get("gpu_models")), default=None)
        return (0, "") if smallest is None else (vllm_total_mib(smallest, self.common.get("gpu_models")), str(smallest["name"]))

    def figures(self, entry: dict[str, Any], flags: dict[str, Any], total_mib: int, tp: int, weights_mib: int) -> dict[str, Any]:
        """kv_cache_figures for a catalog entry on a GPU of total_mib (d3_vram_overhead_mib: the non-torch margin)."""
        return kv_cache_figures(entry["architecture"], flags, total_mib, tp, weights_mib, int(self.opt.vram_overhead_mib))

    def starts(self, fig: dict[str, Any]) -> bool:
        """vLLM starts with these figures, at or above d3_min_concurrency (1 while that is refused on its own)."""
        floor = float(self.opt.min_concurrency) if self.floor_problem() is None else 1.0
        return fig["refusal"] is None and fig["max_concurrency"] >= floor

    def memory_shortfall(self, fig: dict[str, Any], max_len: int) -> str:
        """Why vLLM would refuse (or start below d3_min_concurrency) with these figures, in MiB; "" when it starts."""
        parts = (
            f"weights {fig['weights_mib']} + profile-run peak {fig['activation_peak_mib']} ({fig['max_num_batched_tokens']} "
            f"tokens x {fig['activation_bytes_per_token']} B) + non-torch {fig['non_torch_mib']}"
            + (f" + encoder probe {fig['encoder_probe_mib']} (CUDA graph capture without --enforce-eager)"
               if fig["encoder_probe_mib"] else "")
            + f" = {fig['non_kv_mib']} MiB per GPU"
        )  # fmt: skip
        share = f"its share (--gpu-memory-utilization x GPU memory) of {fig['requested_mib']} MiB"
        refusal = fig["refusal"]
        if self.starts(fig):
            return ""
        if refusal is None:
            return (
                f"would start with 'GPU KV cache size: {fig['gpu_kv_cache_tokens']:,} tokens' and 'Maximum concurrency for "
                f"{max_len:,} tokens per request: {fig['max_concurrency']:.2f}x', below d3_min_concurrency "
                f"{_fmt(float(self.opt.min_concurrency))} ({parts} of {share} leave a KV cache of {fig['kv_pool_mib']} MiB; "
                f"one {max_len}-token sequence takes {fig['sequence_mib']} MiB)"
            )
        if refusal["kind"] == "batched_tokens":
            return f"is refused by vLLM at startup: '{refusal['message']}' (chunked prefill is off for D3: the field report)"
        if refusal["kind"] == "max_num_seqs":
            return f"is refused by vLLM at startup: '{refusal['message']}' (vllm/config/scheduler.py)"
        if refusal["kind"] == "profile_oom":
            return (
                f"runs out of memory in vLLM's profile run ('torch.OutOfMemoryError: CUDA out of memory'): {parts}, more "
                f"than the GPU holds beside the CUDA context ({refusal['message']})"
            )
        if refusal["kind"] == "no_kv_memory":
            return f"is refused by vLLM at startup: '{refusal['message']}': {parts} fill {share}"
        return (
            f"is refused by vLLM at startup, its KV cache being too small for one sequence of --max-model-len "
            f"{max_len} ({fig['sequence_mib']} MiB): '{refusal['message']}' ({parts} of {share})"
        )

    def memory_fix(self, pos: int, entry: dict[str, Any], flags: dict[str, Any], total_mib: int, tp: int, weights_mib: int) -> str:
        """Changes that each make the instance start, checked with the same arithmetic: the longest --max-model-len,
        the smallest --gpu-memory-utilization (up to 0.97: the CUDA context needs the rest), the smallest larger TP."""

        def works(changes: dict[str, Any], size: int = tp) -> bool:
            return self.starts(self.figures(entry, {**flags, **changes}, total_mib, size, weights_mib))

        fixes = []
        lo, hi = 1, int(flags["--max-model-len"]) - 1
        while lo <= hi:
            mid = (lo + hi) // 2
            if works({"--max-model-len": mid}):
                lo = mid + 1
            else:
                hi = mid - 1
        if hi >= 1:
            fixes.append(f"set --max-model-len={hi} (the longest that fits)")
        step = next(
            (
                u
                for u in range(round(float(flags["--gpu-memory-utilization"]) * 100) + 1, 98)
                if works({"--gpu-memory-utilization": u / 100})
            ),
            None,
        )
        if step is not None:
            fixes.append(f"set --gpu-memory-utilization={_fmt(step / 100)}")
        arch = entry["architecture"]
        size = next((t for t in tp_sizes(arch["text"], arch.get("vision")) if t > tp and works({}, t)), None)
        if size is not None:
            fixes.append(f"set --tensor-parallel-size={size} ({size} GPUs; the host has {len(self.gpus)})")
        batched = flags["--max-num-batched-tokens"]
        if batched is not None and batched < flags["--max-model-len"] and not flags["--enable-chunked-prefill"]:
            fixes.insert(0, "remove --max-num-batched-tokens (vLLM then takes --max-model-len)")
        seqs = flags.get("--max-num-seqs")
        if seqs is not None and seqs > self.figures(entry, flags, total_mib, tp, weights_mib)["max_num_batched_tokens"]:
            fixes.insert(0, "remove --max-num-seqs (vLLM then takes at most --max-num-batched-tokens), or raise "
                         "--max-num-batched-tokens to it")
        fix = f"in d3_models[{pos}].extra_args " + ", or ".join(fixes) if fixes else f"pick a smaller model or variant for d3_models[{pos}]"
        return fix + ("" if flags["--enforce-eager"] else "; or keep --enforce-eager (remove --no-enforce-eager)")

    # -- GPU placement --------------------------------------------------------------------------
    def fits(self, idx: int, inst: dict[str, Any]) -> bool:
        """vLLM starts on this GPU beside the instances already on it (free_at_start), and a shared GPU keeps the sum
        of shares within gpu_share_cap (policy)."""
        if self.free_at_start(idx, inst) < self.requested(idx, inst["util"]):
            return False
        return not self.use[idx] or self.util[idx] + inst["util"] <= float(self.opt.gpu_share_cap) + 1e-9

    def requested(self, idx: int, util: float) -> int:
        """request_memory (vllm/v1/worker/gpu_worker.py): total_memory x gpu_memory_utilization, in bytes."""
        return int(self.memory(idx) * MIB * util)

    def free_at_start(self, idx: int, inst: dict[str, Any]) -> int:
        """What is left of GPU idx for ``inst``'s share when every instance on it runs at its share (bytes): the total
        as torch sees it less this process's CUDA context and, for each other process, its share and its own CUDA
        context. Alone on a GPU this is what Worker.init_device compares with the share at startup ("Free memory on
        device ... on startup is less than desired GPU memory utilization"). Beside others it is the planner's own
        bound, not vLLM's startup check: memory_profiling empties torch's cache after the profile run, so a freshly
        started instance holds about its weights, non-torch memory and KV cache (and its CUDA context), not its whole
        share, and vLLM would often start one more; under load each instance's activations grow back towards its
        share, and shares that do not fit beside the contexts run out of memory then."""
        others = [o for o in self.use[idx] if o is not inst]
        held = sum(self.requested(idx, o["util"]) + CUDA_CONTEXT_MIB * MIB for o in others)
        return self.memory(idx) * MIB - CUDA_CONTEXT_MIB * MIB - held

    def take(self, inst: dict[str, Any], indices: list[int]) -> None:
        for idx in indices:
            self.util[idx] += inst["util"]
            self.use[idx].append(inst)
        inst["gpus"] = indices

    def place_fixed(self, inst: dict[str, Any]) -> None:
        where = f"d3_models[{inst['pos']}] ({inst['name']})"
        wanted = inst["gpus_wanted"]
        if not isinstance(wanted, list) or not all(isinstance(g, int) and not isinstance(g, bool) for g in wanted):
            self.refuse(where, f"gpus {wanted!r} is not a list of GPU indices", "write `gpus: [0, 1]`")
            return
        dupes = sorted({g for g in wanted if wanted.count(g) > 1})
        if dupes:
            self.refuse(where, f"GPU {dupes} listed twice in d3_models[{inst['pos']}].gpus", "list each GPU once")
            return
        bad = [g for g in wanted if g not in self.util]
        if bad:
            self.refuse(
                where,
                f"GPU index {bad} out of range: the host has {len(self.gpus)} GPU(s) ({', '.join(str(i) for i in self.util) or 'none'})",
                "use indices from nvidia-smi, or correct d3_gpu_count",
            )
            return
        if len(wanted) != inst["tp"]:
            self.refuse(
                where,
                f"tensor parallel size {inst['tp']} needs {inst['tp']} GPU(s) but d3_models[{inst['pos']}].gpus gives {len(wanted)}",
                f"list exactly {inst['tp']} GPU(s), or set --tensor-parallel-size={len(wanted)} in extra_args",
            )
            return
        over = [g for g in wanted if not self.fits(g, inst)]
        if over:
            self.refuse(where, self._over_budget(over[0], inst), self._share_fix(inst, over))
            return
        self.take(inst, list(wanted))

    def _mib(self, idx: int, util: float) -> int:
        return int(self.memory(idx) * util)

    def memory(self, idx: int) -> int:
        """GPU idx's total as vLLM sees it (vllm_total_mib: torch.cuda.mem_get_info), the base of every share."""
        return next(vllm_total_mib(g, self.common.get("gpu_models")) for g in self.gpus if int(g["index"]) == idx)

    def _users(self, idx: int) -> str:
        """Who holds how much of a GPU: each instance's share in MiB (and its --gpu-memory-utilization)."""
        return ", ".join(f"{o['name']} {_mib_text(self.requested(idx, o['util']))} MiB ({_util(o['util'])})"
                         for o in self.use[idx]) or "nothing"  # fmt: skip

    def _share_refusal(self, idx: int, inst: dict[str, Any]) -> str:
        """Why the instance's share does not fit on GPU idx (free_at_start): alone, vLLM's own startup refusal
        (Worker.init_device); beside other instances, the planner's refusal with its arithmetic (vLLM may well start
        it: the others have freed their profile runs' activations)."""
        free, want, total = self.free_at_start(idx, inst), self.requested(idx, inst["util"]), self.memory(idx) * MIB
        others = [o for o in self.use[idx] if o is not inst]
        if not others:
            return (
                f"vLLM refuses to start it on GPU {idx}: 'ValueError: Free memory on device cuda:0 ({_gib(max(free, 0))}/"
                f"{_gib(total)} GiB) on startup is less than desired GPU memory utilization ({_util(inst['util'])}, "
                f"{_gib(want)} GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.' (its "
                f"CUDA context of {CUDA_CONTEXT_MIB} MiB sits outside the share: {total // MIB} MiB as torch sees the GPU)"
            )
        # the check's own arithmetic (fits: free_at_start < requested, in bytes), printed in MiB; in bytes as well
        # when a share is not a whole MiB (whole-MiB shares would round the sum below the total it passes)
        shares, mine = sum(self.requested(idx, o["util"]) for o in others), want
        contexts = CUDA_CONTEXT_MIB * MIB * (len(others) + 1)
        whole = shares % MIB == 0 and mine % MIB == 0
        exact = "" if whole else f" (in bytes: {shares} + {mine} + {contexts} = {shares + mine + contexts} > {total})"
        return (
            f"its share does not fit on GPU {idx} beside {self._users(idx)}: {_mib_text(shares)} MiB of their shares "
            f"+ its {_mib_text(mine)} MiB + {contexts // MIB} MiB of CUDA contexts ({len(others) + 1} x "
            f"{CUDA_CONTEXT_MIB}) = {_mib_text(shares + mine + contexts)} MiB{exact}, more than the {total // MIB} MiB "
            "torch sees (this is the planner's "
            "refusal, not vLLM's startup check: a started instance frees its profile run's activations and holds less "
            "than its share, so vLLM may start this one, but under load each instance grows towards its share and "
            "the GPU runs out of memory)"
        )

    def _over_budget(self, idx: int, inst: dict[str, Any]) -> str:
        """The policy cap's refusal when the shares pass it, else _share_refusal's (the CUDA contexts beside the shares)."""
        cap = float(self.opt.gpu_share_cap)
        if not self.use[idx] or self.util[idx] + inst["util"] <= cap + 1e-9:
            return self._share_refusal(idx, inst)
        # the check's own arithmetic: the fractions summed against the cap, printed in full (a whole-MiB sum once read
        # "makes 20754 MiB, over the 20755 MiB" for 0.46 + 0.46001 > 0.92), and what they are of the GPU, exactly
        utils = [o["util"] for o in self.use[idx]] + [inst["util"]]
        shares, mem = sum(Decimal(_util(u)) for u in utils), self.memory(idx)
        return (
            f"VRAM over budget on GPU {idx}: its share of {_mib_text(self.requested(idx, inst['util']))} MiB "
            f"(--gpu-memory-utilization {_util(inst['util'])} x {mem} MiB) on top of {self._users(idx)} makes "
            f"{' + '.join(_util(u) for u in utils)} = {_exact(shares)} of the GPU ({_exact(shares * mem)} MiB), over the "
            f"{_util(cap)} ({_exact(Decimal(_util(cap)) * mem)} MiB) that d3_gpu_share_cap allows on a shared GPU (vLLM "
            "needs its share free at start, and the driver keeps some)"
        )

    def _share_fix(self, inst: dict[str, Any], gpus: list[int]) -> str:
        """Where to put the flag: a smaller --gpu-memory-utilization in extra_args, when the instance still starts
        with it (the same arithmetic), or another GPU."""
        # the cap's room and the share vLLM finds free (free_at_start) on each GPU, the smaller
        left = min(min(float(self.opt.gpu_share_cap) - self.util[g] if self.use[g] else 1.0,
                       self.free_at_start(g, inst) / (self.memory(g) * MIB)) for g in gpus)  # fmt: skip
        util = int(left * 100 + 1e-9) / 100
        fix = f"move d3_models[{inst['pos']}] to another GPU (its `gpus:`) or host"
        if util > 0:
            total, name = self.smallest_gpu(gpus)
            fig = self.figures(self.catalog[inst["model"]], {**inst["vllm_flags"], "--gpu-memory-utilization": util,
                                                             "gpu_name": name}, total, inst["tp"], inst["weights_mib"])  # fmt: skip
            if self.starts(fig):
                return f"set --gpu-memory-utilization={_fmt(util)} in d3_models[{inst['pos']}].extra_args (what is left), or " + fix
            fix += (
                f" (at the {_fmt(util)} left, {inst['name']} itself would not start: {self.memory_shortfall(fig, inst['max_model_len'])})"
            )
        return fix

    def place_auto(self, inst: dict[str, Any]) -> None:
        where = f"d3_models[{inst['pos']}] ({inst['name']})"
        if inst["tp"] > len(self.gpus):
            self.refuse(
                where,
                f"tensor parallel size {inst['tp']} is larger than the {len(self.gpus)} GPU(s) the host has",
                "place this model on a host with enough GPUs, or correct d3_gpu_count",
            )
            return
        free = [i for i in self.util if self.fits(i, inst)]
        if len(free) < inst["tp"]:
            state = "; ".join(f"GPU {i}: {self._users(i)}" for i in self.util)
            emptiest = sorted(self.util, key=lambda i: self.util[i])[: inst["tp"]]
            cap = float(self.opt.gpu_share_cap)
            vllm = [i for i in emptiest if (not self.use[i] or self.util[i] + inst["util"] <= cap + 1e-9)
                    and self.free_at_start(i, inst) < self.requested(i, inst["util"])]  # fmt: skip
            self.refuse(
                where,
                self._share_refusal(vllm[0], inst) if vllm else
                f"VRAM over budget: no {inst['tp']} GPU(s) with {self._mib(next(iter(self.util)), inst['util'])} MiB "
                f"(--gpu-memory-utilization {_util(inst['util'])}) left within d3_gpu_share_cap "
                f"{_util(self.opt.gpu_share_cap)} of each GPU's memory ({state})",
                self._share_fix(inst, emptiest),
            )  # fmt: skip
            return
        self.take(inst, free[: inst["tp"]])

    # -- ports -------------------------------------------------------------------------------------
    def assign_ports(self, placed: list[dict[str, Any]]) -> None:
        taken: dict[int, str] = {}
        for inst in placed:
            port = inst["port_wanted"]
            if port is None:
                continue
            where = f"d3_models[{inst['pos']}] ({inst['name']})"
            if not isinstance(port, int) or isinstance(port, bool) or not 1024 <= port <= 65535:
                self.refuse(where, f"port {port!r} is outside 1024-65535", "choose a port in 1024-65535")
                continue
            if port in taken:
                self.refuse(where, f"port {port} collides with instance {taken[port]}", "give each instance its own port")
                continue
            taken[port] = inst["name"]
            inst["port"] = port
        next_port = int(self.opt.port_base)
        for inst in placed:
            if inst["port_wanted"] is not None:
                continue
            while next_port in taken:
                next_port += 1
            if next_port > 65535:
                self.refuse(f"d3_models[{inst['pos']}] ({inst['name']})", "no free port left", "lower d3_port_base")
                continue
            taken[next_port] = inst["name"]
            inst["port"] = next_port

    # -- output --------------------------------------------------------------------------------------
    def emit(self, inst: dict[str, Any]) -> dict[str, Any]:
        fig = inst["figures"]
        args = ["--model", inst["hf_repo"]]
        if inst["revision"]:
            args += ["--revision", inst["revision"]]
        args += ["--served-model-name", inst["served"], "--host", self.opt.listen_address, "--port", str(inst["port"])]
        for flag in CATALOG_FLAGS:
            if inst["flags"][flag] is not None:  # a pre-quantized variant gets no --quantization
                args += [flag, str(inst["flags"][flag])]
        if inst["eager"]:
            args.append("--enforce-eager")
        for flag, value in inst["extra"]:
            args += [flag] if value is None else [flag, value]
        container_hf_home = str(self.common["container_hf_home"])
        hf_home = str(self.opt.hf_home).rstrip("/") or "/"
        url = f"http://{self.connect_host()}:{inst['port']}"
        return {
            "name": inst["name"],
            "unit": inst["name"],
            "model": inst["model"],
            "hf_repo": inst["hf_repo"],
            "revision": inst["revision"],
            "served_model_name": inst["served"],
            "gpus": inst["gpus"],
            "cdi_devices": [f"nvidia.com/gpu={i}" for i in inst["gpus"]],
            "port": inst["port"],
            "tensor_parallel_size": inst["tp"],
            "gpu_memory_utilization": inst["util"],
            "max_model_len": inst["max_model_len"],
            "args": args,
            # the container's environment: where the cache is mounted, then the catalog's and the instance's
            "env": {"HF_HOME": container_hf_home, **dict(sorted(inst["env"].items()))},
            "shm_size": inst["shm_size"],
            "image": self.opt.image,
            "bind_address": self.opt.listen_address,
            "url": url,
            "hf_home": hf_home,
            "cache_path": f"{hf_home}/hub/models--{inst['hf_repo'].replace('/', '--')}/snapshots/{inst['revision'] or 'UNPINNED'}",
            "volumes": [f"{hf_home}:{container_hf_home}:ro"],
            "labels": {
                label.INSTANCE: inst["name"],
                label.MODEL: inst["model"],
                label.REVISION: inst["revision"] or "unpinned",
            },
            # the API key reaches vLLM only as this variable, from the podman secret named by d3_units_api_key_secret
            "secret_env": "VLLM_API_KEY",
            # no privilege gain through setuid files, no capabilities but those given back (d3_container_capabilities)
            "no_new_privileges": True,
            "capabilities": sorted({str(c).upper().removeprefix("CAP_") for c in self.opt.capabilities}),
            "weights_mib": inst["weights_mib"],
            # what one GPU needs to start: everything but the KV cache, plus one --max-model-len sequence of it
            "vram_need_mib_per_gpu": fig["non_kv_mib"] + fig["sequence_mib"],
            "variant": inst["variant"]["name"],
            "quant_method": inst["variant"]["quant_method"],
            "download_bytes": int(float(inst["variant"]["download_gb"]) * 1e9),
            "vram_arithmetic_mib_per_gpu": {
                **{
                    k: fig[k]
                    for k in ("weights_mib", "activation_peak_mib", "non_torch_mib", "encoder_probe_mib", "requested_mib", "kv_pool_mib")
                },
                "sequence_kv_mib": fig["sequence_mib"],
                "total_mib": fig["non_kv_mib"] + fig["sequence_mib"],
            },
            # the two figures vLLM logs at startup (vllm/v1/core/kv_cache_utils.py _report_kv_cache_config), predicted
            "kv_cache": {
                "gpu_kv_cache_tokens": fig["gpu_kv_cache_tokens"],
                "max_concurrency": round(fig["max_concurrency"], 2),
                "block_size": fig["block_size"],
                "max_num_batched_tokens": fig["max_num_batched_tokens"],
                "measured_on_hardware": False,
                "note": "predicted from vLLM's source (docs/capacity.md); not yet measured on hardware; not modelled: the "
                "vision encoder's own profiling, whether D3's attention is causal (and chunked prefill off), the GDN state's dtype",
            },
            "measured_on_hardware": inst["measured"],
            "hardware_note": {
                True: "the field report ran this recipe on L4 hardware",
                None: "the field report's sizing table lists this size on one L4 (no run of it is recorded)",
                False: f"{inst['model']} {inst['variant']['name']} at TP {inst['tp']} on "
                f"{self.gpus[0]['name'] if self.gpus else 'no GPU'} is planned from the arithmetic only",
            }[inst["measured"]],
            # where the host itself reaches the instance (0.0.0.0 / :: bind every address, loopback among them)
            "health_url": f"{url}/health",
            "start_after": inst.get("start_after", []),
            "wait_ready": inst.get("wait_ready", False),
        }

    def run(self) -> dict[str, Any]:
        if not self.opt.allow_non_l4:
            for g in self.gpus:
                if "L4" not in str(g["name"]).split():
                    self.refuse(
                        f"GPU {g['index']}",
                        f"is a {g['name']}, not an NVIDIA L4; the catalog's flags are tuned for L4",
                        "set d3_allow_non_l4: true to plan for it anyway",
                    )
        if not isinstance(self.models, list):
            self.refuse("d3_models", f"expected a list, got {type(self.models).__name__}", "write a YAML list")
            return self.result([])
        resolved = [r for pos, item in enumerate(self.models) if (r := self.resolve(pos, item))]
        seen: dict[str, int] = {}
        for inst in resolved:
            if inst["name"] in seen:
                self.refuse(
                    f"d3_models[{inst['pos']}] ({inst['name']})",
                    f"instance name {inst['name']!r} is also used by d3_models[{seen[inst['name']]}]",
                    f"give d3_models[{inst['pos']}] a distinct `name:`",
                )
            seen.setdefault(inst["name"], inst["pos"])
        for inst in resolved:
            if inst["gpus_wanted"] is not None:
                self.place_fixed(inst)
        # Largest first (TP, then memory share) so that small instances do not fragment the GPUs.
        auto = [i for i in resolved if i["gpus_wanted"] is None]
        for inst in sorted(auto, key=lambda i: (-i["tp"], -i["util"])):
            self.place_auto(inst)
        placed = [i for i in resolved if "gpus" in i]
        # a fixed port is checked even when its instance was not placed (a GPU listed twice): one run names both
        self.assign_ports([i for i in resolved if "gpus" in i or i["port_wanted"] is not None])
        self.check_listen_address()
        self.check_options()
        ready = [i for i in placed if "port" in i]
        self.order_starts(ready)
        return self.result(ready)

    def connect_host(self) -> str:
        raw = str(self.opt.listen_address)
        try:
            address = ipaddress.ip_address(raw)
        except ValueError:
            return raw
        if address.is_unspecified:
            address = ipaddress.ip_address("::1" if address.version == 6 else "127.0.0.1")
        return f"[{address}]" if address.version == 6 else str(address)

    # -- start order ---------------------------------------------------------------------------------
    @staticmethod
    def order_starts(placed: list[dict[str, Any]]) -> None:
        """Instances that share a GPU start one after another, in d3_models order: each orders after the earlier
        ones on its GPUs, and those wait for readiness before their start counts as done, so that no two
        profile the GPU's memory at the same moment."""
        for pos, inst in enumerate(placed):
            earlier = [o for o in placed[:pos] if set(o["gpus"]) & set(inst["gpus"])]
            inst["start_after"] = [o["name"] for o in earlier]
            for other in earlier:
                other["wait_ready"] = True

    def floor_problem(self) -> str | None:
        floor = self.opt.min_concurrency
        if isinstance(floor, bool) or not 0 < float(floor) < float("inf"):
            return f"{floor!r} is not a number above 0"
        return None

    # -- fleet inputs that reach the unit files ----------------------------------------------------
    def check_options(self) -> None:
        if self.floor_problem():
            self.refuse("d3_min_concurrency", str(self.floor_problem()),
                        "set the least maximum concurrency vLLM may log, e.g. 1 (what vLLM needs to start) or 4")  # fmt: skip
        problem = check("path", self.opt.hf_home)
        if problem:
            self.refuse("d3_hf_home", f"{shown(self.opt.hf_home)} {problem}", "give a plain absolute directory")
        bad = [c for c in self.opt.capabilities if not re.match(r"\A(CAP_)?[A-Za-z_]{2,32}\Z", str(c))]
        if not isinstance(self.opt.capabilities, list) or bad:
            self.refuse("d3_container_capabilities", f"{shown(bad or self.opt.capabilities)} is not a list of capability "
                        "names (e.g. SYS_NICE)", "fix the inventory")  # fmt: skip
        if not control_free(self.opt.image):
            self.refuse("d3_image_name", f"{shown(self.opt.image)} contains a control character", "fix the inventory")

    # -- listen address ------------------------------------------------------------------------------
    def check_listen_address(self) -> None:
        raw = str(self.opt.listen_address)
        try:
            address = ipaddress.ip_address(raw)
        except ValueError:
            self.refuse(
                "d3_listen_address",
                f"{raw!r} is not an IP address (vLLM binds it with --host)",
                "set d3_listen_address to 127.0.0.1, 0.0.0.0 or one of the host's own addresses",
            )
            return
        if not address.is_loopback and not self.opt.api_key_set and not self.opt.allow_unauthenticated:
            self.refuse(
                "d3_listen_address",
                f"{raw} lets every client that reaches this host use the models without a key (vLLM checks "
                "d3_units_api_key on /v1 only when one is set)",
                "set d3_units_api_key (Ansible Vault), listen on 127.0.0.1, or set d3_allow_unauthenticated: true to "
                "serve without a key on purpose (e.g. behind d3_firewall)",
            )
        if address.is_loopback or address.is_unspecified or self.opt.host_addresses is None:
            return
        own = set()
        for text in self.opt.host_addresses:
            try:
                own.add(ipaddress.ip_address(str(text).split("%", 1)[0]))
            except ValueError:
                continue
        if address not in own:
            self.refuse(
                "d3_listen_address",
                f"{raw} is not an address of this host (its addresses: "
                f"{', '.join(sorted(str(a) for a in own)) or 'none'}), so vLLM could not bind it and would crash-loop",
                "set d3_listen_address to one of those, to 127.0.0.1 (local clients only) or to 0.0.0.0 "
                "(e.g. \"{{ ansible_facts['default_ipv4']['address'] }}\")",
            )

    def result(self, placed: list[dict[str, Any]]) -> dict[str, Any]:
        gpus = []
        for g in self.gpus:
            idx = int(g["index"])
            mem = self.memory(idx)  # vLLM's total: every share is of it
            budget = [{"instance": i["name"], "utilization": i["util"], "budget_mib": self._mib(idx, i["util"])} for i in self.use[idx]]
            used = sum(b["budget_mib"] for b in budget)
            gpus.append(
                {
                    "index": idx,
                    "name": g["name"],
                    "memory_total_mib": int(g["memory_total_mib"]),  # nvidia-smi's
                    "vllm_total_mib": mem,
                    "budget": budget,
                    "budget_mib": used,
                    # each process's CUDA context, outside its share (CUDA_CONTEXT_MIB: no source gives its size)
                    "cuda_context_mib": CUDA_CONTEXT_MIB * len(budget),
                    "free_mib": mem - used - CUDA_CONTEXT_MIB * len(budget),
                }
            )
        emitted = [self.emit(i) for i in placed]
        return {
            "host": self.host,
            "hf_home": str(self.opt.hf_home).rstrip("/") or "/",
            "instances": emitted if not self.errors else [],
            "gpus": gpus,
            "errors": list(self.errors),
            # a refused host's plan so far: what would run where if the errors were fixed (nothing is changed)
            "partial": self.partial(emitted, gpus) if self.errors else [],
        }

    @staticmethod
    def partial(emitted: list[dict[str, Any]], gpus: list[dict[str, Any]]) -> list[str]:
        lines = [
            f"{i['name']}: {i['model']} on GPU {','.join(str(g) for g in i['gpus'])}, port {i['port']}, needs "
            f"{i['vram_need_mib_per_gpu']} MiB/GPU of its {i['vram_arithmetic_mib_per_gpu']['requested_mib']} MiB share; "
            f"GPU KV cache size: {i['kv_cache']['gpu_kv_cache_tokens']:,} tokens, maximum concurrency "
            f"{i['kv_cache']['max_concurrency']:.2f}x at {i['max_model_len']:,} tokens (predicted)"
            for i in emitted
        ]
        return lines + [
            f"GPU {g['index']}: {g['budget_mib']}/{g['vllm_total_mib']} MiB in shares ("
            + (", ".join(f"{b['instance']} {b['budget_mib']} MiB" for b in g["budget"]) or "idle")
            + ")"
            for g in gpus
        ]


def d3_plan(
    models: list[dict[str, Any]] | None,
    catalog: dict[str, Any],
    common: dict[str, Any],
    gpus: list[dict[str, Any]],
    host: str = "localhost",
    options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Plan one host. Returns ``{host, instances, gpus, errors}``; instances is empty when errors is not."""
    return _Planner(host, [] if models is None else models, catalog, common, gpus, Options.from_dict(options)).run()


def state_instances(instances: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The part of each planned instance a deployment record keeps: what runs, where, at which revision."""
    keys = ("model", "hf_repo", "revision", "port", "gpus", "unit")
    return {i["name"]: {k: i[k] for k in keys} for i in instances}


class FilterModule:
    """Ansible filters: d3_plan, d3_host_gpus, d3_state_instances (the plan is rendered by d3_render)."""

    def filters(self) -> dict[str, Any]:
        return {
            "d3_plan": d3_plan,
            "d3_host_gpus": host_gpus,
            "d3_state_instances": state_instances,
        }
