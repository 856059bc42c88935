"""Render a job as a prime-rl `rl.toml`, for running it on a cluster with `rl @ rl.toml`.

Every key written is one of prime-rl's config classes at the commit recorded in
`nestor/job/prime_rl_schema.json` (tests/job/test_export.py holds every export to it, and
`benchmarks/prime_rl_check.py` runs prime-rl's own loader on them). Knobs of the built-in
trainer that prime-rl has no key for are listed, with why, in `NOT_CARRIED`.

The run is complete on the GPUs a worker has: `[inference]` makes `rl` start its vLLM server;
on one GPU trainer and inference share it (vLLM takes `INFER_MEMORY_FRACTION` of it, the
launcher is given the GPU twice: `CUDA_VISIBLE_DEVICES=0,0`, see `launch_env`), and weights go
from trainer to vLLM through the filesystem (NCCL cannot join two ranks on one device).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import tomli_w

from nestor.job.config import JobConfig, load_job_config
from nestor.job.layout import DATA, MAX_DATA_BYTES, LayoutError, read_layout
from nestor.job.safe_read import UnsafeFileError, is_plain_file, read_bytes

HF_REPOS = {"qwen3-0.6b": "Qwen/Qwen3-0.6B", "qwen3-1.7b": "Qwen/Qwen3-1.7B"}
# prime-rl renders chats itself (`[orchestrator.renderer]`). "auto" resolves only Hub ids in
# renderers' MODEL_RENDERER_MAP, never a local path, so the renderer is always named: Qwen3's
# own; for the bundled tiny models (their own chat template) "default", which applies it.
RENDERERS = {"qwen3-0.6b": "qwen3", "qwen3-1.7b": "qwen3"}
DEFAULT_RENDERER = "default"
INFER_MEMORY_FRACTION = 0.35  # of a shared GPU for vLLM (weights + KV cache); the rest trains
TEMPLATE_TOKENS = 32  # chat-template overhead around one user message, generously
ADAM_BETAS = (0.9, 0.99)  # the built-in trainer's (nestor/inner/grpo.py)
# JobConfig knob -> the prime-rl key that carries it (to_prime_rl writes each).
CARRIED = {
    "base_model": "model.name",
    "learning_rate": "trainer.optim.lr",
    "max_steps": "max_steps",
    "prompts_per_step": "orchestrator.batch_size",  # × group_size: prime-rl counts rollouts
    "group_size": "orchestrator.group_size",
    "max_new_tokens": "orchestrator.train.sampling.max_completion_tokens",
    "temperature": "orchestrator.train.sampling.temperature",
    "lora_rank": "trainer.model.lora.rank",
    "lora_alpha": "trainer.model.lora.alpha",
    "skip_zero_variance": "orchestrator.train.filter_zero_advantages",
    "weight_decay": "trainer.optim.weight_decay",  # prime-rl's default is 0.01, ours 0.0
    "grad_clip": "trainer.optim.max_norm",  # 0 (no clipping) is written as inf
    "seed": "inference.vllm.seed",
}
# JobConfig knobs without a prime-rl key, and what prime-rl does instead.
NOT_CARRIED = {
    "clip_ratio": "prime-rl masks tokens whose ratio leaves [1-0.2, 1+0.2] "
                  "(trainer.loss.dppo_mask_low/high) instead of PPO-clipping",
    "kl_coef": "no KL penalty to the base model (trainer.loss.kl_tau is not one)",
    "updates_per_step": "one optimizer step per batch",
    "scale_rewards": "advantage = reward - group mean, never divided by the std",
    "micro_batch_prompts": "prime-rl packs micro-batches by seq_len itself",
    "loss": "prime-rl's own token-level loss (trainer.loss)",
}
SHORT_FORM_PROMPT_CHARS = 480  # seq_len's stand-in for a short-form job's longest prompt


def _model_name(base_model: str) -> str:
    """A name the pod resolves: the Hub repo of a Qwen3 model; a bundled tiny model's registry
    name (never a path into this checkout). The prime-rl backend swaps in a local path when the
    weights are already on the worker (nestor.inner.prime_rl.render_config)."""
    return HF_REPOS.get(base_model, base_model)


def renderer(base_model: str) -> str:
    return RENDERERS.get(base_model, DEFAULT_RENDERER)


def launch_env(gpus: int, visible: str | None) -> dict[str, str]:
    """Environment for the `rl` launcher: on one GPU it is listed twice, so prime-rl places
    inference (its first id) and the trainer (its second) on the same device."""
    if gpus != 1:
        return {}
    first = (visible or "0").split(",")[0].strip() or "0"
    return {"CUDA_VISIBLE_DEVICES": f"{first},{first}"}


def static_problems(job_dir: Path | str) -> list[str]:
    """What the probe's trusted checks (files, config, base model, budget, dataset) reject, so
    an export never carries a job `nestor job validate` would refuse."""
    from nestor.job.file_checks import static_checks

    return [f"{c.name}: {c.message}" for c in static_checks(job_dir) if not c.ok]


def _seq_len(root: Path, max_new_tokens: int) -> int:
    """A power of two covering the longest prompt (characters bound tokens from above for
    every tokenizer we use) plus the completion. The data is read without following links."""
    longest = 0
    if not is_plain_file(root, DATA):  # short form: load() makes the prompts, and only the
        data = ""  # sandbox runs it; a generous bound stands in for the longest
        longest = SHORT_FORM_PROMPT_CHARS
    else:
        try:
            data = read_bytes(root, DATA, MAX_DATA_BYTES).decode("utf-8", errors="replace")
        except UnsafeFileError as exc:
            raise LayoutError(str(exc)) from None
    for line in data.split("\n"):
        try:
            longest = max(longest, len(json.loads(line).get("prompt", "")))
        except (ValueError, AttributeError, TypeError, RecursionError):
            continue
    need, size = longest + TEMPLATE_TOKENS + max_new_tokens, 256
    while size < need:
        size *= 2
    return size


def to_prime_rl(job_dir: Path | str, *, gpus: int = 1,
                inference_memory: float = INFER_MEMORY_FRACTION) -> dict:
    """The rl.toml of a job as a dict, for a worker with `gpus` GPUs (1: trainer and inference
    share it; more: one for inference, the rest train). LayoutError / JobConfigError for a
    broken job."""
    if gpus < 1:
        raise ValueError(f"prime-rl needs a GPU; got gpus={gpus}")
    layout = read_layout(job_dir)
    config: JobConfig = load_job_config(layout.config)
    seq_len = _seq_len(layout.root, config.max_new_tokens)
    source = {
        "env": {
            "taskset": {"id": layout.taskset_id},
            "agent": {"harness": {"id": "null"}, "runtime": {"type": "subprocess"}},
        },
    }
    trainer: dict = {"optim": {
        "type": "adamw", "lr": config.learning_rate, "weight_decay": config.weight_decay,
        "max_norm": config.grad_clip if config.grad_clip > 0 else math.inf,  # 0 = no clip
        "betas1": ADAM_BETAS[0], "betas2": ADAM_BETAS[1]}}
    if config.lora_rank > 0:
        trainer["model"] = {"lora": {"rank": config.lora_rank, "alpha": config.lora_alpha}}
    vllm: dict = {"max_model_len": seq_len, "seed": config.seed}
    if gpus == 1:
        vllm["gpu_memory_utilization"] = inference_memory
    return {
        "max_steps": config.max_steps,
        "seq_len": seq_len,
        "model": {"name": _model_name(config.base_model)},
        "deployment": {"type": "single_node", "num_train_gpus": max(1, gpus - 1),
                       "num_infer_gpus": 1},
        "weight_broadcast": {"type": "filesystem"},
        "inference": {"vllm": vllm},
        "orchestrator": {
            "batch_size": config.prompts_per_step * config.group_size,
            "group_size": config.group_size,
            "max_off_policy_steps": 0,  # on-policy, as the built-in trainer
            "renderer": {"name": renderer(config.base_model)},
            "train": {
                "filter_zero_advantages": config.skip_zero_variance,
                "sampling": {"temperature": config.temperature,
                             "max_completion_tokens": config.max_new_tokens},
                "source": [source],
            },
        },
        "trainer": trainer,
    }


def to_prime_rl_toml(job_dir: Path | str, *, gpus: int = 1) -> str:
    layout = read_layout(job_dir)
    config = load_job_config(layout.config)
    env = layout.env.resolve()
    bundled = config.base_model not in HF_REPOS
    launch = ("CUDA_VISIBLE_DEVICES=0,0 rl @ rl.toml   (one GPU, shared by trainer and vLLM)"
              if gpus == 1 else "rl @ rl.toml")
    header = [
        f"# prime-rl config for the nestor job {layout.root.resolve()}",
        *([f"# {config.base_model} is bundled with nestor, not on the Hub: on the pod, "
           "`pip install nestor` and set [model] name",
           "# to the path printed by `nestor models list` (the nestor pool does this itself)."]
          if bundled else []),
        f"# Install the taskset first (editable: it reads {layout.data.name} from the job):"
        if layout.has_data else "# Install the taskset first (its load() makes the rows):",
        f"#   uv pip install -e {env}",
        f"# then run:  {launch}",
        "# Advantages there are reward - group mean; batch_size counts rollouts per step.",
        "# seed seeds vLLM's sampling only; prompt order is prime-rl's.",
        "# Not carried over (no prime-rl key):",
        *(f"#   {k}={getattr(config, k)}: {why}" for k, why in NOT_CARRIED.items()),
        "",
    ]
    return "\n".join(header) + tomli_w.dumps(to_prime_rl(job_dir, gpus=gpus))
