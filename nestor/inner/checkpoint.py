"""Saving a trained job's weights as a Hugging Face directory `load_model(path)` reads back.

A full fine-tune saves its weights; a LoRA run saves its adapter under `adapter/` (peft format,
safetensors) and the merged full weights at the top, so the checkpoint loads like any base
model and the adapter stays available for tools that want it (e.g. vLLM LoRA serving).
"""

from __future__ import annotations

import json
from pathlib import Path

ADAPTER_DIR = "adapter"
META_FILE = "nestor_job.json"


def is_peft(model) -> bool:
    try:
        from peft import PeftModel
    except ImportError:  # pragma: no cover - peft is a hard dependency
        return False
    return isinstance(model, PeftModel)


def save_checkpoint(model, tokenizer, out_dir: Path, *, meta: dict | None = None) -> Path:
    """Write config.json, model.safetensors, tokenizer files (and adapter/) into `out_dir`.

    A peft model is merged in place (its adapter layers are folded into the base weights and
    removed), so save last, after anything that still needs the adapter.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if is_peft(model):
        model.save_pretrained(out_dir / ADAPTER_DIR, safe_serialization=True)
        model = model.merge_and_unload()
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    if meta is not None:
        (out_dir / META_FILE).write_text(json.dumps(meta, indent=2, default=str) + "\n")
    return out_dir
