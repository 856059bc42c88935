"""Render a job as a prime-rl `rl.toml`, for running it on a cluster with `rl @ rl.toml`.

Only keys seen in prime-rl's config classes are written (see DESIGN.md); knobs of the built-in
trainer that have no such key are listed in a comment instead of being guessed at.
"""

from __future__ import annotations

import json
from pathlib import Path

import tomli_w

from nestor.job.config import JobConfig, load_job_config
from nestor.job.layout import DATA, MAX_DATA_BYTES, LayoutError, read_layout
from nestor.job.safe_read import UnsafeFileError, is_plain_file, read_bytes

HF_REPOS = {"qwen3-0.6b": "Qwen/Qwen3-0.6B", "qwen3-1.7b": "Qwen/Qwen3-1.7B"}
NOT_CARRIED = ("clip_ratio", "kl_coef", "updates_per_step", "scale_rewards",
               "skip_zero_variance", "weight_decay", "grad_clip", "seed", "loss")
TEMPLATE_TOKENS = 32  # chat-template overhead around one user message, generously
SHORT_FORM_PROMPT_CHARS = 480  # seq_len's stand-in for a short-form job's longest prompt


def _model_name(base_model: str) -> str:
    """A name the pod resolves: the Hub repo of a Qwen3 model; a bundled tiny model's registry
    name (never a path into this checkout). The prime-rl backend swaps in a local path when the
    weights are already on the worker (nestor.inner.prime_rl.render_config)."""
    return HF_REPOS.get(base_model, base_model)


def static_problems(job_dir: Path | str) -> list[str]:
    """What the probe's trusted checks (files, config, base model, budget, dataset) reject, so
    an export never carries a job `nestor job validate` would refuse."""
    from nestor.job.validate import static_checks

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


def to_prime_rl(job_dir: Path | str) -> dict:
    """The rl.toml of a job as a dict (LayoutError / JobConfigError for a broken job)."""
    layout = read_layout(job_dir)
    config: JobConfig = load_job_config(layout.config)
    source = {
        "env": {
            "taskset": {"id": layout.taskset_id},
            "agent": {"harness": {"id": "null"}, "runtime": {"type": "subprocess"}},
        },
    }
    trainer: dict = {"optim": {"lr": config.learning_rate}}
    if config.lora_rank > 0:
        trainer["model"] = {"lora": {"rank": config.lora_rank, "alpha": config.lora_alpha}}
    return {
        "max_steps": config.max_steps,
        "seq_len": _seq_len(layout.root, config.max_new_tokens),
        "model": {"name": _model_name(config.base_model)},
        "deployment": {"num_train_gpus": 1, "num_infer_gpus": 1},
        "orchestrator": {
            "batch_size": config.prompts_per_step * config.group_size,
            "group_size": config.group_size,
            "max_off_policy_steps": 1,
            "train": {
                "sampling": {"temperature": config.temperature,
                             "max_completion_tokens": config.max_new_tokens},
                "source": [source],
            },
        },
        "trainer": trainer,
    }


def to_prime_rl_toml(job_dir: Path | str) -> str:
    layout = read_layout(job_dir)
    config = load_job_config(layout.config)
    env = layout.env.resolve()
    bundled = config.base_model not in HF_REPOS
    header = [
        f"# prime-rl config for the nestor job {layout.root.resolve()}",
        *([f"# {config.base_model} is bundled with nestor, not on the Hub: on the pod, "
           "`pip install nestor` and set [model] name",
           "# to the path printed by `nestor models list` (the nestor pool does this itself)."]
          if bundled else []),
        f"# Install the taskset first (editable: it reads {layout.data.name} from the job):"
        if layout.has_data else "# Install the taskset first (its load() makes the rows):",
        f"#   uv pip install -e {env}",
        "# then run:  rl @ rl.toml",
        "# Advantages there are reward - group mean; batch_size counts rollouts per step.",
        "# Not carried over (no prime-rl key): " + ", ".join(
            f"{k}={getattr(config, k)}" for k in NOT_CARRIED),
        "",
    ]
    return "\n".join(header) + tomli_w.dumps(to_prime_rl(job_dir))
