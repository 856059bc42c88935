"""The trusted hidden-eval scorer: greedy decoding in the model's chat template, scored by the
task's HiddenEval. Besides the CLI's `eval`, this is the only importer of `nestor.tasks.hidden`;
it runs in the trusted process and never hands items to agent-visible code.

Pre-scores of base models are cached on disk under `Settings.cache_dir`, keyed by model, a
fingerprint of its weights, task, eval version, difficulty, n, and the device type and dtype the
model was scored in: a job's improvement is post − pre, so both must come from the same
function — greedy decoding in bf16 on a GPU and in float32 on a CPU differ.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path

from pydantic import BaseModel, Field

from nestor.models.sampler import sample
from nestor.models.testformat import test_format_ids
from nestor.tasks import TaskRegistry
from nestor.tasks.hidden import DEFAULT_N, EVAL_VERSION, HiddenEval, hidden_eval
from nestor.tasks.secret import secret_id


class EvalResult(BaseModel):
    task: str
    accuracy: float = Field(ge=0, le=1)
    n: int = Field(ge=0)
    ci95: tuple[float, float] = Field(description="Wilson 95% interval of the accuracy")


def wilson(correct: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval: sane at 0 and n correct, unlike the normal approximation."""
    if n == 0:
        return (0.0, 1.0)
    p = correct / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (round(max(0.0, centre - half), 4), round(min(1.0, centre + half), 4))


def chat_prompt_ids(tokenizer, prompt: str) -> list[int]:
    """The test format: one user message, no system prompt, generation prompt appended."""
    return test_format_ids(tokenizer, prompt)


def score_model(model, tokenizer, evaluation: HiddenEval, batch_size: int = 256) -> EvalResult:
    """Greedy replies to every item, cut at the task's max new tokens; accuracy and interval."""
    items = evaluation.items
    prompts = [chat_prompt_ids(tokenizer, item.prompt) for item in items]
    order = sorted(range(len(items)), key=lambda i: len(prompts[i]))  # less padding per batch
    was_training = model.training
    model.eval()
    correct = 0
    try:
        for start in range(0, len(order), batch_size):
            batch = order[start:start + batch_size]
            out = sample(model, [prompts[i] for i in batch], evaluation.max_new_tokens,
                         eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id,
                         greedy=True, tokenizer=tokenizer)
            correct += sum(HiddenEval.score(text, items[i])
                           for text, i in zip(out.texts, batch, strict=True))
    finally:
        model.train(was_training)
    n = len(items)
    return EvalResult(task=evaluation.task_id, accuracy=correct / n if n else 0.0, n=n,
                      ci95=wilson(correct, n))


def _registry() -> TaskRegistry:
    from nestor.config import load_settings

    return TaskRegistry(load_settings().task_modules)


def score_task(model, tokenizer, task_id: str, *, difficulty: int = 0, n: int = DEFAULT_N,
               registry: TaskRegistry | None = None, batch_size: int = 256) -> EvalResult:
    """Score an in-memory model (e.g. a fresh checkpoint) on one task's hidden eval."""
    ref = (registry or _registry()).get(task_id)
    return score_model(model, tokenizer, hidden_eval(ref, n=n, difficulty=difficulty), batch_size)


# --- the pre-score cache ------------------------------------------------------------------

_FINGERPRINTS: dict[tuple, str] = {}
_HASH_LIMIT = 256 * 2**20  # hash contents below this size; larger weights hash their stat data


def weights_fingerprint(model_dir: Path) -> str:
    """A hash of the model's weight files (contents when small, else names, sizes, mtimes)."""
    files = sorted(p for p in model_dir.iterdir() if p.suffix in (".safetensors", ".bin"))
    stat_key = tuple((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files)
    if stat_key in _FINGERPRINTS:
        return _FINGERPRINTS[stat_key]
    digest = hashlib.sha256()
    if sum(size for _, size, _ in stat_key) <= _HASH_LIMIT:
        for p in files:
            digest.update(p.name.encode())
            digest.update(p.read_bytes())
    else:
        digest.update(repr(stat_key).encode())
    _FINGERPRINTS[stat_key] = digest.hexdigest()[:16]
    return _FINGERPRINTS[stat_key]


def dtype_name(dtype) -> str:
    """torch.bfloat16 -> 'bfloat16' (names as in config.json and WorkerType.dtype)."""
    return str(dtype).removeprefix("torch.")


def score_dtype(model_dir: Path, device: str, dtype: str | None = None) -> str:
    """The dtype a base model is scored and trained in: `dtype` if given ('auto' = the
    checkpoint's); otherwise float32 on a CPU and the checkpoint's own dtype (bf16 for Qwen3)
    on an accelerator."""
    import torch

    if dtype and dtype != "auto":
        return dtype_name(dtype)
    if dtype is None and torch.device(device).type == "cpu":
        return "float32"
    config = json.loads((model_dir / "config.json").read_text())
    return dtype_name(config.get("dtype") or config.get("torch_dtype") or "float32")


def score_key(device: str) -> list[str]:
    """What changes a score besides the weights, task and dtype: the kind of device, on an
    accelerator its model (kernels and their rounding differ between GPU types), and the
    versions of the libraries that compute it. Part of the pre-score cache key. Not the
    thread count: greedy replies agree under one thread and two (tests/inner/test_evaluate.py)."""
    import tokenizers
    import torch
    import transformers

    dev = torch.device(device)
    on_gpu = dev.type == "cuda" and torch.cuda.is_available()  # (a key may name a GPU not here)
    kind = torch.cuda.get_device_name(dev) if on_gpu else dev.type
    return [kind, f"torch {torch.__version__}", f"transformers {transformers.__version__}",
            f"tokenizers {tokenizers.__version__}"]


def cache_path(model_name: str, model_dir: Path, task_id: str, difficulty: int, n: int,
               device: str = "cpu", dtype: str = "float32") -> Path:
    from nestor.config import load_settings

    key = json.dumps([model_name, weights_fingerprint(model_dir), task_id, EVAL_VERSION,
                      difficulty, n, *score_key(device), dtype_name(dtype),
                      secret_id()])  # other items under another secret: the hash, never it
    name = hashlib.sha256(key.encode()).hexdigest()[:24]
    return Path(load_settings().cache_dir) / "prescores" / f"{name}.json"


def _read_cache(path: Path) -> EvalResult | None:
    try:
        return EvalResult.model_validate_json(path.read_text())
    except (OSError, ValueError):  # absent or corrupt: recompute
        return None


def _write_cache(path: Path, result: EvalResult) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(result.model_dump_json())
    tmp.replace(path)  # atomic: concurrent workers never read half a file


# --- the keyed pre-score cache (the prime-rl backend) ---------------------------------------
# A job's code on the prime-rl backend runs unsandboxed as the worker's user and can rewrite
# any file of the cache above. Its pre-scores are kept apart, each entry with a MAC under a key
# derived from the installation's secret; an entry whose MAC does not verify is recomputed.
# This stops a job that rewrites cache files; not one that reads the secret's file, which the
# worker's user can (docs/cluster.md, "Trust on a pod").

_KEYED_DIR = "prescores-keyed"
_KEYED_MEMO: dict[str, EvalResult] = {}  # this process's own results: never re-read from disk


def _mac(name: str, payload: str) -> str:
    import hmac

    from nestor.tasks.secret import keyed_seed

    key = keyed_seed("nestor pre-score cache key\0").encode()  # derived: never written
    return hmac.new(key, f"{name}\0{payload}".encode(), hashlib.sha256).hexdigest()


def _read_keyed(path: Path) -> EvalResult | None:
    import hmac

    try:
        if path.stat().st_size > 65536:
            return None
        entry = json.loads(path.read_text())
        payload = entry["result"]
        if not hmac.compare_digest(str(entry["mac"]), _mac(path.stem, payload)):
            return None
        return EvalResult.model_validate_json(payload)
    except (OSError, ValueError, KeyError, TypeError):  # absent, corrupt or forged: recompute
        return None


def _write_keyed(path: Path, result: EvalResult) -> None:
    payload = result.model_dump_json()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"result": payload, "mac": _mac(path.stem, payload)}))
    tmp.replace(path)


def keyed_pre_score(model_name: str, task_id: str, *, difficulty: int = 0, n: int = DEFAULT_N,
                    device: str = "cpu", registry: TaskRegistry | None = None) -> EvalResult:
    """A base model's score as `evaluate(..., use_cache=False)` computes it (same device, same
    dtype), remembered in this process and on disk in the keyed cache. Call it before any
    untrusted code has run for the job it scores (the prime-rl backend does)."""
    from nestor.models.registry import resolve_model_dir

    registry = registry or _registry()
    ref = registry.get(task_id)
    model_dir = resolve_model_dir(model_name)
    dtype = score_dtype(model_dir, device)
    path = cache_path(model_name, model_dir, ref.id, difficulty, n, device, dtype)
    name = path.stem
    path = path.parent.parent / _KEYED_DIR / path.name
    result = _KEYED_MEMO.get(name) or _read_keyed(path)
    if result is None:
        result = evaluate(model_name, [ref.id], difficulty=difficulty, n=n, use_cache=False,
                          device=device, dtype=dtype, registry=registry)[0]
        _write_keyed(path, result)
    _KEYED_MEMO[name] = result
    return result


def evaluate(model_name_or_path: str, task_ids: list[str], *, difficulty: int = 0,
             n: int = DEFAULT_N, use_cache: bool = True, device: str = "cpu",
             dtype: str | None = None, registry: TaskRegistry | None = None,
             on_result=None) -> list[EvalResult]:
    """Score a base model (registry name or directory) on tasks, on `device` in
    `score_dtype(...)`; loads the model only when a task is not already cached. Raises
    ModelNotFoundError / TaskError on bad names."""
    import torch

    from nestor.models.registry import load_model, resolve_model_dir

    registry = registry or _registry()
    refs = [registry.get(t) for t in task_ids]  # unknown ids fail before any work
    model_dir = resolve_model_dir(model_name_or_path)
    dtype = score_dtype(model_dir, device, dtype)
    model = tokenizer = None
    results = []
    for ref in refs:
        path = cache_path(str(model_name_or_path), model_dir, ref.id, difficulty, n, device,
                          dtype)
        result = _read_cache(path) if use_cache else None
        if result is None:
            if model is None:
                model, tokenizer = load_model(model_dir, device=device,
                                              dtype=getattr(torch, dtype))
            result = score_model(model, tokenizer, hidden_eval(ref, n=n, difficulty=difficulty))
            _write_cache(path, result)
        results.append(result)
        if on_result is not None:
            on_result(result)
    return results


def pre_score(model_name: str, task_id: str, difficulty: int = 0, n: int = DEFAULT_N,
              registry: TaskRegistry | None = None, *, model=None, tokenizer=None,
              device: str = "cpu", dtype: str | None = None) -> EvalResult:
    """The cached score of a base model on one task (what a job's improvement is measured from).

    With `model` (a loaded base model: a warm worker's), that very model is scored, so the
    pre-score comes from the function the post-score will use (same device, same dtype); the
    cache key takes its device and dtype. Without, the model is loaded on `device`."""
    if model is None:
        return evaluate(model_name, [task_id], difficulty=difficulty, n=n, registry=registry,
                        device=device, dtype=dtype)[0]
    from nestor.models.registry import resolve_model_dir

    ref = (registry or _registry()).get(task_id)
    param = next(model.parameters())
    path = cache_path(model_name, resolve_model_dir(model_name), ref.id, difficulty, n,
                      str(param.device), dtype_name(param.dtype))
    result = _read_cache(path)
    if result is None:
        result = score_model(model, tokenizer, hidden_eval(ref, n=n, difficulty=difficulty))
        _write_cache(path, result)
    return result
