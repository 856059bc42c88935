"""One warm start, start to end: demos in, a LoRA adapter out (what `nestor sft` runs).

DIR/ holds sft.json (the resolved config), demos.jsonl (the demos kept, nestor's format),
checkpoint/ (resumable), adapter/ (the result) and summary.json.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nestor.sft.data import EncodeStats, encode_demo, policy_encoders
from nestor.sft.demos import Demo, load_source, read_demos, select, write_demos
from nestor.sft.trainer import SFTConfig, Trainer, write_config


def make_policy(cfg: SFTConfig):
    from nestor.policy.lm import LMPolicy

    return LMPolicy.from_pretrained(cfg.model, device=cfg.device, lora_rank=cfg.lora_rank,
                                    lora_alpha=cfg.lora_alpha, max_new_tokens=cfg.max_new_tokens,
                                    seed=cfg.seed, response_prefix=cfg.response_prefix)


def gather_demos(cfg: SFTConfig, out: Path, *, pool: Any = None, resume: bool = False,
                 on_demo: Callable[[Demo], None] | None = None,
                 episode: Any = None) -> tuple[list[Demo], int]:
    """(the demos kept, how many were read). A resumed run reuses DIR/demos.jsonl.
    `episode`: the EpisodeConfig the composer's demos run under — the RL run's own, so the
    system prompt cloned is the one the policy reads later (default: cfg.prompt_style's)."""
    kept_file = out / "demos.jsonl"
    if resume and kept_file.is_file():
        demos = read_demos(kept_file)
        return demos, len(demos)
    kw: dict[str, Any] = {}
    if cfg.demos.startswith("composer:"):
        from nestor.agent.episode import EpisodeConfig

        kw = {"tasks": cfg.tasks, "pool": pool, "seed": cfg.seed, "on_episode": on_demo,
              "slips_per_job": cfg.slips_per_job,
              "episode": episode or EpisodeConfig(prompt_style=cfg.prompt_style)}
    demos = load_source(cfg.demos, out, **kw)
    kept = select(demos, passed=cfg.passed_only, min_reward=cfg.min_reward,
                  best_of_group=cfg.best_of_group)
    write_demos(kept_file, kept)
    return kept, len(demos)


def split_demos(demos: list[Demo], fraction: float, seed: int) -> tuple[list[Demo], list[Demo]]:
    """(train, held out): round(fraction × n) whole demos, at least one when fraction > 0 and
    at most n - 1, drawn by `seed` — the same split on a resume."""
    n_val = min(len(demos) - 1, max(1, round(fraction * len(demos)))) if fraction > 0 else 0
    order = list(range(len(demos)))
    random.Random(f"val:{seed}").shuffle(order)
    held = set(order[:n_val])
    return ([d for i, d in enumerate(demos) if i not in held],
            [d for i, d in enumerate(demos) if i in held])


def run_sft(cfg: SFTConfig, out: Path, *, resume: bool = False, pool: Any = None,
            policy: Any = None, on_demo: Callable[[Demo], None] | None = None,
            on_step: Callable[[dict], None] | None = None,
            episode: Any = None) -> dict[str, Any]:
    out = Path(out)
    write_config(cfg, out)
    demos, n_read = gather_demos(cfg, out, pool=pool, resume=resume, on_demo=on_demo,
                                 episode=episode)
    if not demos:
        raise ValueError(f"no demos left of {n_read} read from {cfg.demos} after the filters "
                         f"(passed_only={cfg.passed_only}, min_reward={cfg.min_reward}); "
                         "loosen them or bring more demos")
    policy = policy or make_policy(cfg)
    render, encode_action = policy_encoders(policy)
    train_demos, val_demos = split_demos(demos, cfg.val_fraction, cfg.seed)
    stats = EncodeStats()
    sequences = [s for d in train_demos for s in encode_demo(
        d, render, encode_action, stats, train_failed=cfg.train_failed_attempts)]
    val = [s for d in val_demos for s in encode_demo(
        d, render, encode_action, train_failed=cfg.train_failed_attempts)]
    trainer = Trainer(policy, cfg, out)
    resumed_from = trainer.step if resume and trainer.resume() else 0
    history = trainer.train(sequences, on_step=on_step, val=val)
    third = max(1, len(history) // 3)

    def mean_of(key: str, rows: list[dict]) -> float | None:
        values = [h[key] for h in rows if key in h]  # a resumed older run's steps may lack one
        return sum(values) / len(values) if values else None

    scored = [h for h in history if "val_loss" in h]
    summary = {
        "out": str(out), "adapter": str(out / "adapter"), "model": cfg.model,
        "demos_read": n_read, "demos_kept": len(demos), "demos_held_out": len(val_demos),
        "demos_by_source": dict(Counter(d.source for d in demos)),
        "turns": stats.turns, "turns_dropped_too_long": stats.dropped_long,
        "turns_context_only": stats.context_only, "sequences": stats.sequences,
        "target_tokens": stats.target_tokens, "tokens": stats.tokens,
        "steps": trainer.step, "resumed_from_step": resumed_from,
        "autocast": "bfloat16" if trainer.autocast is not None else "float32",
        "loss_first": mean_of("loss", history[:third]),
        "loss_last": mean_of("loss", history[-third:]),
        "token_accuracy_last": mean_of("token_accuracy", history[-third:]),
        "val_loss": scored[-1]["val_loss"] if scored else None,
        "val_token_accuracy": scored[-1]["val_token_accuracy"] if scored else None,
        "seconds": round(sum(h["seconds"] for h in history[resumed_from:]), 1),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary
