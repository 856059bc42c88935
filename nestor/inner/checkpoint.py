"""Saving a trained job's weights as a Hugging Face directory `load_model(path)` reads back.

A full fine-tune saves its weights; a LoRA run saves its adapter under `adapter/` (peft format,
safetensors). In float32 the merged full weights go at the top, so the checkpoint loads like any
base model. In bf16/fp16 merging would round part of the update away (the scored model and the
saved one would differ), so the top holds the base weights unmerged with an `UNMERGED_ADAPTER`
marker, and `load_model` applies the adapter: what loads is exactly what was scored.
"""

from __future__ import annotations

import json
from pathlib import Path

from nestor.models.registry import ADAPTER_DIR, UNMERGED

META_FILE = "nestor_job.json"


def is_peft(model) -> bool:
    try:
        from peft import PeftModel
    except ImportError:  # pragma: no cover - peft is a hard dependency
        return False
    return isinstance(model, PeftModel)


def save_checkpoint(model, tokenizer, out_dir: Path, *, meta: dict | None = None) -> Path:
    """Write config.json, model.safetensors, tokenizer files (and adapter/) into `out_dir`.

    A peft model loses its adapter layers (merged in place, or unloaded), so save last, after
    anything that still needs the adapter.
    """
    import torch

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    unmerged = False
    if is_peft(model):
        model.save_pretrained(out_dir / ADAPTER_DIR, safe_serialization=True)
        base_dtype = next(model.get_base_model().parameters()).dtype
        unmerged = base_dtype in (torch.bfloat16, torch.float16)
        model = model.unload() if unmerged else model.merge_and_unload()
    model.save_pretrained(out_dir, safe_serialization=True)
    (out_dir / UNMERGED).unlink(missing_ok=True)
    if unmerged:
        (out_dir / UNMERGED).write_text(f"apply {ADAPTER_DIR}/ to these base weights\n")
    tokenizer.save_pretrained(out_dir)
    if meta is not None:
        (out_dir / META_FILE).write_text(json.dumps(meta, indent=2, default=str) + "\n")
    return out_dir
