"""The checkpoint the prime-rl backend scores, made only of what it can trust.

prime-rl's output folder is written by the job's own processes (they run unsandboxed on a pod:
nestor/inner/prime_rl.py), so nothing of it is read as configuration: the scored model is the
trusted base model's config, tokenizer and chat template, read before the job ran, plus only
weights from the output — safetensors files, or a LoRA adapter whose config is checked.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
from pathlib import Path

# What a scored checkpoint takes from the trusted base model, always (never from prime-rl's
# output): its config (architecture, dtype) and everything the tokenizer and chat template
# are made of.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "vocab.json", "merges.txt", "chat_template.jinja", "chat_template.json",
                   "added_tokens.json", "tokenizer.model")
TRUSTED_FILES = ("config.json", *TOKENIZER_FILES)
WEIGHTS_INDEX = "model.safetensors.index.json"


def latest_weights(output_dir: Path, max_steps: int | None = None) -> Path | None:
    """The newest `step_N` directory under `output_dir` holding safetensors (its own or in a
    `weight/` subdir, prime-rl's checkpoint layout); complete ones (a STABLE marker) first.
    With `max_steps` (the job's), a higher N is never chosen: prime-rl does not reach it, so
    such a folder was planted. Symlinked folders are skipped."""
    found = []
    for d in output_dir.rglob("step_*"):
        m = re.fullmatch(r"step_(\d{1,9})", d.name)
        if not m or d.is_symlink() or not d.is_dir():
            continue
        if max_steps is not None and int(m.group(1)) > max_steps:
            continue
        for w in (d, d / "weight"):
            if w.is_dir() and not w.is_symlink() and any(w.glob("*.safetensors")):
                stable = (d / "STABLE").exists() or (w / "STABLE").exists()
                found.append((stable, int(m.group(1)), str(w)))
    return Path(max(found)[2]) if found else None


def trusted_files(base_dir: Path) -> dict[str, bytes]:
    """The base model's config, tokenizer and chat-template files, read now (the prime-rl
    backend reads them before the job's code runs and builds the checkpoint from these)."""
    return {name: (base_dir / name).read_bytes() for name in TRUSTED_FILES
            if (base_dir / name).is_file()}


def _job_file(folder: Path, name: str) -> Path | None:
    """`folder/name` if it is a regular file (never a symlink, which could point anywhere)."""
    path = folder / name
    if path.is_symlink():
        raise ValueError(f"{path} is a symlink; prime-rl writes plain files")
    return path if path.is_file() else None


def _checked_index(path: Path, shards: set[str]) -> None:
    """A sharded checkpoint's index must name only the shards taken beside it."""
    index = json.loads(path.read_text(encoding="utf-8"))
    files = set((index.get("weight_map") or {}).values()) if isinstance(index, dict) else None
    if not files or not all(isinstance(f, str) for f in files) or not files <= shards:
        raise ValueError(f"{path} names weight files that are not beside it")


# Keys of a peft adapter_config.json that only say which weights the adapter has and how they
# scale (or are bookkeeping); any other key must hold peft's default, since peft's variants
# (DoRA, layer replication, aLoRA, ...) change what is computed beyond the weights.
_ADAPTER_KEYS = {"task_type", "peft_type", "auto_mapping", "peft_version",
                 "base_model_name_or_path", "revision", "inference_mode", "r", "target_modules",
                 "exclude_modules", "lora_alpha", "lora_dropout", "fan_in_fan_out", "bias",
                 "use_rslora", "modules_to_save", "init_lora_weights", "layers_to_transform",
                 "layers_pattern", "rank_pattern", "alpha_pattern", "target_parameters",
                 "lora_bias", "megatron_core", "runtime_config", "qalora_group_size",
                 "ensure_weight_tying"}


def _checked_adapter_config(path: Path, base_dir: Path) -> dict:
    """The adapter's config, checked: a LoRA adapter for a causal LM whose other settings are
    peft's defaults; the base it names is replaced by the trusted one."""
    import dataclasses

    from peft import LoraConfig

    cfg = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(cfg, dict) or cfg.get("peft_type") != "LORA":
        raise ValueError(f"{path}: not a LoRA adapter config")
    if cfg.get("task_type") not in (None, "CAUSAL_LM"):
        raise ValueError(f"{path}: task_type {cfg.get('task_type')!r} is not CAUSAL_LM")
    r, alpha = cfg.get("r"), cfg.get("lora_alpha")
    if not (isinstance(r, int) and 1 <= r <= 4096 and isinstance(alpha, (int, float))
            and math.isfinite(alpha)):
        raise ValueError(f"{path}: bad r / lora_alpha")
    known = {f.name for f in dataclasses.fields(LoraConfig)}
    defaults = json.loads(json.dumps(LoraConfig().to_dict(), default=str))
    for key, value in cfg.items():
        if key in known and key not in _ADAPTER_KEYS and value != defaults.get(key):
            raise ValueError(f"{path}: {key} = {value!r} is not accepted in a scored adapter")
    cfg = {k: v for k, v in cfg.items() if k in _ADAPTER_KEYS and k in known | {"peft_type"}}
    # the base named is the trusted one; the initialisation is peft's plain one (the weights
    # replace it), never one that rewrites the base weights on load (PiSSA, OLoRA, ...)
    cfg.update(base_model_name_or_path=str(base_dir), revision=None, auto_mapping=None,
               init_lora_weights=True)
    LoraConfig(**{k: v for k, v in cfg.items() if k not in ("peft_type", "runtime_config")})
    return cfg


def materialise_checkpoint(weights: Path, base_dir: Path, out: Path,
                           trusted: dict[str, bytes] | None = None) -> Path:
    """A self-contained HF model dir at `out`, made afresh: the base model's own config,
    tokenizer and chat template (`trusted`, read from `base_dir` before the job ran; else read
    now), and from `weights` (prime-rl's output, written by the job's processes) only weights:
    `*.safetensors` (+ their index), or a LoRA adapter's `adapter_model.safetensors` with an
    `adapter_config.json` that is checked. Every other file there is ignored.

    A LoRA adapter on a float32 base is merged; on a bf16/fp16 base (Qwen3) it stays unmerged
    beside the base weights (merging into bf16 rounds part of the update away), and load_model
    applies it (nestor/models/registry.UNMERGED), so the model scored is the one prime-rl
    trained."""
    from nestor.models.registry import ADAPTER_DIR, UNMERGED

    trusted = trusted if trusted is not None else trusted_files(base_dir)
    if "config.json" not in trusted:
        raise ValueError(f"the base model {base_dir} has no config.json")
    if out.is_symlink() or out.is_file():
        out.unlink()
    elif out.exists():
        shutil.rmtree(out)  # nothing the job put there is kept
    out.mkdir(parents=True)
    adapter = _job_file(weights, "adapter_config.json") is not None
    base_dtype = json.loads(trusted["config.json"])
    base_dtype = str(base_dtype.get("dtype") or base_dtype.get("torch_dtype") or "float32")
    if adapter:
        adapter_cfg = _checked_adapter_config(weights / "adapter_config.json", base_dir)
        adapter_weights = _job_file(weights, "adapter_model.safetensors")
        if adapter_weights is None:
            raise ValueError(f"{weights} has an adapter config but no adapter_model.safetensors")
        staged = out / ADAPTER_DIR
        staged.mkdir()
        _link_or_copy(adapter_weights, staged / "adapter_model.safetensors")
        (staged / "adapter_config.json").write_text(json.dumps(adapter_cfg, indent=2))
    if adapter and base_dtype in ("bfloat16", "float16"):
        for f in base_dir.iterdir():
            if f.is_file() and (f.suffix == ".safetensors" or f.name == WEIGHTS_INDEX):
                _link_or_copy(f, out / f.name)
        (out / UNMERGED).write_text(f"apply {ADAPTER_DIR}/ to these base weights\n")
    elif adapter:
        from peft import PeftModel
        from transformers import AutoModelForCausalLM

        base = AutoModelForCausalLM.from_pretrained(base_dir, local_files_only=True)
        merged = PeftModel.from_pretrained(base, out / ADAPTER_DIR).merge_and_unload()
        merged.save_pretrained(out, safe_serialization=True)
        shutil.rmtree(out / ADAPTER_DIR)
    else:
        shards = set()
        for f in sorted(weights.iterdir()):
            if f.suffix == ".safetensors" and _job_file(weights, f.name) is not None:
                _link_or_copy(f, out / f.name)
                shards.add(f.name)
        if len(shards) > 1 or _job_file(weights, WEIGHTS_INDEX) is not None:
            _checked_index(weights / WEIGHTS_INDEX, shards)
            shutil.copyfile(weights / WEIGHTS_INDEX, out / WEIGHTS_INDEX)
    for name, data in trusted.items():  # always the base's: over whatever save_pretrained wrote
        (out / name).write_bytes(data)
    return out


def file_ids(model_dir: Path) -> list[tuple]:
    """Identity of each file of a model dir, as far as its owner cannot forge it: a rewrite,
    `touch -d` or a replacement changes the inode's ctime (settable only through the clock)."""
    ids = []
    for f in sorted(model_dir.iterdir()):
        if not f.is_file():
            continue
        st = f.stat()
        ids.append((f.name, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
    return ids


def _link_or_copy(src: Path, dst: Path) -> None:
    dst.unlink(missing_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
