#!/usr/bin/env python3
"""LAB STAND-IN: build tiny D3-shaped git repositories for the lab Hugging Face mirror (olah).

Nothing here is a real model. Each repository under ``<mirrors>/models/vllm-sr/<name>`` (olah's
``mirrors-path`` layout) is a bare git repository with branch ``main`` and two deterministic commits
(fixed author, committer and dates, no signing), so the commit SHAs are identical on every machine:

* ``v3.0.0`` - an older revision (tagged), to test that revision pinning really pins;
* ``v3.1.0`` - the revision the lab pinned until 2026-12-01 (tagged);
* ``v3.2.0`` - the newest revision (tagged, ``main``); the lab inventory pins this one. Its ``config.json`` is the
  size's from ``tests/contracts/d3-architectures.json`` (the real base's architecture numbers: layers, layer types,
  heads, Gated DeltaNet state dims), which the vLLM simulator reads at startup as vLLM does; v3.0.0 and v3.1.0 keep
  the earlier flat stand-in config.json so that the SHAs already pinned stay valid.

Files per revision: ``config.json`` (the D3 architecture on the Qwen3.5 backbone), ``decision_config.json``,
``README.md`` (model card saying it is a lab stand-in) and ``model.safetensors``: a real safetensors file with
one tiny tensor whose ``__metadata__`` carries ``d3_lab_simulated_bytes`` = the size of the real checkpoint's
weights (BF16 for the six sizes), for the vLLM simulator's memory arithmetic (see docs/design.md, "HF mirror").

Checkpoint variants (VARIANTS; roles/d3/vars/main.yml ``variants``) are served the same way, e.g.
``vllm-sr/d3-FP8``: the base size's config.json plus the ``quantization_config`` shape of the real checkpoint
(compressed-tensors, as its model card says), and the real checkpoint's size in the metadata.

Usage: build_repos.py --mirrors DIR [--revisions-file FILE]
Prints one JSON object: {"changed": bool, "revisions": {id: sha}, "previous": {id: sha}}.
Re-running with unchanged content changes nothing on disk (idempotent; "changed": false).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ORG = "vllm-sr"
DEFAULT_REVISIONS_FILE = "/var/lib/d3-lab/hf-revisions.json"


@dataclass(frozen=True)
class Spec:
    """One D3 model: parameter count (the ONE place for it) and its Qwen3.5 backbone shape."""

    params: int
    base: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    head_dim: int = 256


# Parameter counts (BF16 = 2 bytes/param -> d3_lab_simulated_bytes). Sources:
# - d3: model card "26.09B incl. 0.46B vision encoder" and "d3 BF16 52.2 GB" (huggingface.co/vllm-sr/d3,
#   vllm-sr/d3-FP8; /work/shared/notes/domain-facts.md section 1.1). Field report: "27B".
# - d3-flash/-mini/-nano/-lite: exact counts of their bases Qwen3.5-9B/-4B/-2B/-0.8B from a d3 family code file
#   (domain-facts.md 1.1). NOTE: the field report (/work/shared/seed/d3-on-l4-field-report.txt) says d3-lite 1.2B
#   and d3-nano 2.5B; no public source matches that, so the public bases are used here.
# - d3-edge: "Qwen3.5-0.8B architecture cut to 12 layers" (huggingface.co/FastFlowLM/D3-Edge-NPU2, semantic-router
#   decision3-parity.md: v3.1.0 has 12 layers); 0.6B per inference.sh; the count below is an ESTIMATE
#   (0.873B minus 12 of 24 decoder layers of ~21.6M each).
# Backbone shapes: Qwen3.5-27B 64x5120, 24 heads / 4 KV, head_dim 256, ffn 17408 (THUDM/slime
# scripts/models/qwen3.5-27B.sh); Qwen3.5-0.8B 24x1024, 8 / 2, head_dim 256, ffn 3584 (slime qwen3.5-0.8B.sh);
# 9B = vLLM's Qwen3_5TextConfig defaults 32x4096, 16 / 4, ffn 12288 (vllm transformers_utils/configs/qwen3_5.py).
# 4B and 2B shapes are PLAUSIBLE GUESSES (not verified against the real config.json).
MODELS: dict[str, Spec] = {
    "d3": Spec(26_090_000_000, "Qwen/Qwen3.5-27B", 64, 5120, 24, 4, 17408),
    "d3-flash": Spec(9_653_104_368, "Qwen/Qwen3.5-9B", 32, 4096, 16, 4, 12288),
    "d3-mini": Spec(4_659_865_088, "Qwen/Qwen3.5-4B", 32, 2560, 16, 4, 9216),
    "d3-nano": Spec(2_274_069_824, "Qwen/Qwen3.5-2B", 24, 2048, 8, 2, 6144),
    "d3-lite": Spec(873_438_784, "Qwen/Qwen3.5-0.8B", 24, 1024, 8, 2, 3584),
    "d3-edge": Spec(614_000_000, "Qwen/Qwen3.5-0.8B (cut to 12 layers)", 12, 1024, 8, 2, 3584),
}


@dataclass(frozen=True)
class Variant:
    """A pre-quantized checkpoint of a size: its base size, the real checkpoint's bytes (model card) and the
    quantization_config its config.json carries (what vLLM detects; roles/d3/vars/main.yml quotes vLLM)."""

    base: str
    checkpoint_bytes: int
    quantization_config: dict[str, object]
    card: str


def _compressed_tensors(weights: dict[str, object], inputs: dict[str, object] | None, fmt: str,
                        ignore: list[str]) -> dict[str, object]:
    """The shape llm-compressor writes into config.json for a compressed-tensors checkpoint (quant_method,
    format, config_groups with weights / input_activations, ignore, quantization_status). The real checkpoints'
    exact ignore lists were not read (UNCONFIRMED); the card says the Gated DeltaNet input projections stay BF16."""
    base_args = {"actorder": None, "block_structure": None, "dynamic": False, "group_size": None,
                 "observer": "minmax", "observer_kwargs": {}, "symmetric": True}
    return {
        "config_groups": {"group_0": {
            "input_activations": None if inputs is None else {**base_args, "observer": None, **inputs},
            "output_activations": None,
            "targets": ["Linear"],
            "weights": {**base_args, **weights},
        }},
        "format": fmt,
        "global_compression_ratio": None,
        "ignore": ignore,
        "kv_cache_scheme": None,
        "quant_method": "compressed-tensors",
        "quantization_status": "compressed",
    }


_IGNORE = ["lm_head", "score", "re:.*visual.*", "re:.*linear_attn.in_proj.*"]

# Sources: huggingface.co/vllm-sr/d3-FP8 ("FP8 W8A8 (compressed-tensors float-quantized, FP8_DYNAMIC)", 31.9 GB) and
# huggingface.co/vllm-sr/d3-W4A16-AWQ ("compressed-tensors pack-quantized int4, group 128", 16.2 GB), domain-facts
# 1.1. The NVFP4 variants are not served: the planner refuses them on L4 (Blackwell FP4 tensor cores only).
VARIANTS: dict[str, Variant] = {
    "d3-FP8": Variant("d3", 31_900_000_000, _compressed_tensors(
        {"num_bits": 8, "type": "float", "strategy": "channel"},
        {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True},
        "float-quantized", _IGNORE), "FP8 W8A8 (compressed-tensors float-quantized, FP8_DYNAMIC)"),
    "d3-W4A16-AWQ": Variant("d3", 16_200_000_000, _compressed_tensors(
        {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128},
        None, "pack-quantized", _IGNORE), "W4A16 (compressed-tensors pack-quantized int4, group 128)"),
}

BF16_BYTES_PER_PARAM = 2
FULL_ATTENTION_INTERVAL = 4  # Qwen3.5 GDN hybrid: every 4th layer is full attention (field report)
MAX_POSITION_EMBEDDINGS = 262144  # "All models have max_position_embeddings: 262144" (field report)

# (tag, date, message): the older revisions first; the last one is ``main`` and the pinned one.
RELEASES: list[tuple[str, str, str]] = [
    ("v3.0.0", "2026-08-20T12:00:00+00:00", "Lab stand-in release v3.0.0"),
    ("v3.1.0", "2026-10-11T12:00:00+00:00", "Lab stand-in release v3.1.0"),
    ("v3.2.0", "2026-12-01T12:00:00+00:00", "Lab stand-in release v3.2.0: config.json with the real architecture numbers"),
]
# Releases whose config.json is the early flat stand-in (legacy_config_json), kept byte-identical so that the commit
# SHAs inventories already pin stay valid; later releases serve ARCHITECTURES' config.json.
LEGACY_RELEASES = ("v3.0.0", "v3.1.0")
# Per size, the real base's config.json numbers with their sources (written by the capacity work; config.json-shaped)
ARCHITECTURES = Path(__file__).resolve().parents[2] / "tests" / "contracts" / "d3-architectures.json"
AUTHOR = ("D3 Lab Stand-in", "lab-stand-in@d3-fleet.invalid")


def simulated_bytes(name: str) -> int:
    """Size of the real checkpoint's weights: BF16 for a size, the model card's size for a variant."""
    if name in VARIANTS:
        return VARIANTS[name].checkpoint_bytes
    return MODELS[name].params * BF16_BYTES_PER_PARAM


def config_json(name: str, release: str = RELEASES[-1][0]) -> dict[str, object]:
    """config.json of a size or variant at a release: a variant is its base size's plus its quantization_config."""
    if name in VARIANTS:
        v = VARIANTS[name]
        return {**config_json(v.base, release), "quantization_config": v.quantization_config}
    if release in LEGACY_RELEASES:
        return legacy_config_json(name)
    entry = json.loads(ARCHITECTURES.read_text())["models"][name]
    return {"_lab_stand_in": f"LAB STAND-IN repository; config.json numbers of {entry['base']} from "
                             "tests/contracts/d3-architectures.json (sources named there)",
            **entry["config"]}


def legacy_config_json(name: str) -> dict[str, object]:
    """The flat config.json of releases v3.0.0 and v3.1.0 (kept as it was: their commits are pinned)."""
    s = MODELS[name]
    layer_types = [
        "full_attention" if (i + 1) % FULL_ATTENTION_INTERVAL == 0 else "linear_attention"
        for i in range(s.layers)
    ]
    return {
        "_lab_stand_in": "LAB STAND-IN config, not the real vllm-sr model",
        "architectures": ["D3ForSequenceClassification"],
        "model_type": "qwen3_5",  # HF tag of vllm-sr/d3 (domain-facts.md 1.1)
        "base_model": s.base,
        "torch_dtype": "bfloat16",
        "max_position_embeddings": MAX_POSITION_EMBEDDINGS,
        "num_hidden_layers": s.layers,
        "hidden_size": s.hidden,
        "intermediate_size": s.intermediate,
        "num_attention_heads": s.heads,
        "num_key_value_heads": s.kv_heads,
        "head_dim": s.head_dim,
        "full_attention_interval": FULL_ATTENTION_INTERVAL,
        "layer_types": layer_types,
        "vocab_size": 248320,
        "vision_config": {"model_type": "qwen3_5_vision", "depth": 24 if s.params > 2e9 else 12},
    }


def decision_config_json(name: str, release: str) -> dict[str, object]:
    # Plausible content; the real file's fields are UNCONFIRMED (domain-facts.md 2.4 and 10).
    return {
        "_lab_stand_in": "LAB STAND-IN decision config",
        "model_id": f"{ORG}/{name}",
        "release": release,
        "attention_mode": "bidirectional",
        "readout": "classify",
        "question_types": ["choice", "noul", "score"],
        "label_space": {
            "choice": [chr(ord("A") + i) for i in range(26)],
            "noul": ["false", "true"],
            "score": [str(i) for i in range(1, 11)],
        },
        "limits": {"max_questions": 64, "max_choice_options": 26, "max_score_levels": 10,
                   "max_question_tokens": 32768},
    }


def readme(name: str, release: str) -> str:
    if name in VARIANTS:
        v = VARIANTS[name]
        return (
            "---\nlicense: apache-2.0\npipeline_tag: zero-shot-classification\n"
            "tags: [decision-model, system-one, lab-stand-in]\n---\n"
            f"# {ORG}/{name} (LAB STAND-IN, {release})\n\n"
            "This repository is a **lab stand-in** built by d3-fleet's `lab/hf/build_repos.py`. It holds no real\n"
            f"weights: `model.safetensors` has one tiny tensor, and its metadata records the size of the real {name}\n"
            f"checkpoint ({v.checkpoint_bytes / 1e9:.1f} GB, {v.card}); config.json carries its quantization_config.\n"
        )
    s = MODELS[name]
    return (
        "---\nlicense: apache-2.0\npipeline_tag: zero-shot-classification\n"
        "tags: [decision-model, system-one, lab-stand-in]\n---\n"
        f"# {ORG}/{name} (LAB STAND-IN, {release})\n\n"
        "This repository is a **lab stand-in** built by d3-fleet's `lab/hf/build_repos.py` for the offline\n"
        "Hugging Face mirror of the test lab. It holds no real weights: `model.safetensors` has one tiny tensor,\n"
        f"and its metadata records the BF16 size of the real {name} ({s.params:,} parameters, base {s.base}).\n"
    )


def bf16(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0] >> 16


def safetensors_file(name: str, release: str, index: int) -> bytes:
    """A valid safetensors file: u64 LE header length, JSON header (space padded to 8), data."""
    values = [bf16((index + 1) * 0.5 + i * 0.25) for i in range(8)]
    data = struct.pack(f"<{len(values)}H", *values)
    header = {
        "__metadata__": {
            "format": "pt",
            "d3_lab_simulated_bytes": str(simulated_bytes(name)),
            "d3_lab_stand_in": "true",
            "d3_model_id": f"{ORG}/{name}",
            "d3_release": release,
        },
        "lab_stand_in.weight": {"dtype": "BF16", "shape": [2, 4], "data_offsets": [0, len(data)]},
    }
    raw = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + data


def files_for(name: str, release: str, index: int) -> dict[str, bytes]:
    def dump(obj: object) -> bytes:
        return (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode()

    return {
        "README.md": readme(name, release).encode(),
        "config.json": dump(config_json(name, release)),
        "decision_config.json": dump(decision_config_json(name, release)),
        "model.safetensors": safetensors_file(name, release, index),
    }


def git(git_dir: Path, *args: str, data: bytes | None = None, date: str | None = None) -> str:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(git_dir),  # no user/global config can leak in
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_DIR": str(git_dir),
        "LC_ALL": "C",
        "TZ": "UTC",
    }
    if date is not None:
        env |= {
            "GIT_AUTHOR_NAME": AUTHOR[0], "GIT_AUTHOR_EMAIL": AUTHOR[1], "GIT_AUTHOR_DATE": date,
            "GIT_COMMITTER_NAME": AUTHOR[0], "GIT_COMMITTER_EMAIL": AUTHOR[1], "GIT_COMMITTER_DATE": date,
        }
    out = subprocess.run(["git", *args], input=data, env=env, capture_output=True, check=True)
    return out.stdout.decode().strip()


def build_repo(git_dir: Path, name: str) -> list[str]:
    """Create a bare repo at git_dir with one commit per release; returns the commit SHAs (oldest first)."""
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(git_dir)], check=True,
                   env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(git_dir.parent),
                        "GIT_CONFIG_NOSYSTEM": "1"})
    shas: list[str] = []
    for index, (tag, date, message) in enumerate(RELEASES):
        entries = []
        for path, content in sorted(files_for(name, tag, index).items()):
            blob = git(git_dir, "hash-object", "-w", "--stdin", data=content)
            entries.append(f"100644 blob {blob}\t{path}\n")
        tree = git(git_dir, "mktree", data="".join(entries).encode())
        parents = ["-p", shas[-1]] if shas else []
        commit = git(git_dir, "commit-tree", tree, *parents, "-m", message, date=date)
        git(git_dir, "tag", tag, commit)
        shas.append(commit)
    git(git_dir, "update-ref", "refs/heads/main", shas[-1])
    return shas


def existing_shas(git_dir: Path) -> list[str] | None:
    try:
        return [git(git_dir, "rev-parse", "--verify", f"refs/tags/{tag}^{{commit}}") for tag, _, _ in RELEASES] + [
            git(git_dir, "rev-parse", "--verify", "refs/heads/main")
        ]
    except (subprocess.CalledProcessError, FileNotFoundError):
        return None


def write_if_changed(path: Path, content: str) -> bool:
    if path.exists() and path.read_text() == content:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(content)
    tmp.chmod(0o644)
    tmp.replace(path)
    return True


def build_all(mirrors: Path, revisions_file: Path | None) -> dict[str, object]:
    org_dir = mirrors / "models" / ORG
    org_dir.mkdir(parents=True, exist_ok=True)
    changed = False
    revisions: dict[str, str] = {}
    previous: dict[str, str] = {}
    for name in [*MODELS, *VARIANTS]:
        target = org_dir / name
        with tempfile.TemporaryDirectory(prefix=f".{name}.", dir=org_dir) as tmp:
            fresh = Path(tmp) / "repo.git"
            shas = build_repo(fresh, name)
            if existing_shas(target) != [*shas, shas[-1]]:
                shutil.rmtree(target, ignore_errors=True)
                fresh.rename(target)
                changed = True
        revisions[f"{ORG}/{name}"] = shas[-1]
        previous[f"{ORG}/{name}"] = shas[-2]
    if revisions_file is not None:
        changed |= write_if_changed(revisions_file, json.dumps(revisions, indent=2, sort_keys=True) + "\n")
    return {"changed": changed, "revisions": revisions, "previous": previous}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mirrors", required=True, type=Path, help="olah mirrors-path (repos go to models/vllm-sr/)")
    parser.add_argument("--revisions-file", type=Path, default=Path(DEFAULT_REVISIONS_FILE),
                        help=f"where to write {{model id: sha}} (default {DEFAULT_REVISIONS_FILE})")
    parser.add_argument("--no-revisions-file", action="store_true", help="do not write the revisions file")
    args = parser.parse_args(argv)
    result = build_all(args.mirrors, None if args.no_revisions_file else args.revisions_file)
    json.dump(result, sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
