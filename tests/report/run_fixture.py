"""Builds a small but complete run directory through the real Ledger and metrics writers."""

from __future__ import annotations

import json
import random
from pathlib import Path

from nestor.ledger import Ledger
from nestor.outer.metrics import append_jsonl


def make_run(run_dir: Path, *, steps: int = 6, crashed: bool = False) -> Path:
    rng = random.Random(0)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.toml").write_text('name = "fixture"\n[policy]\nkind = "composer"\n')
    with Ledger(run_dir) as ledger:
        for step in range(steps):
            for i in range(4):
                ep = f"ep-{step}-{i}"
                task = ["reverse", "add", "length"][i % 3]
                ledger.start_episode(ep, task_id=task, family="x", difficulty=0,
                                     policy="composer", policy_version=step, config={})
                ledger.add_job(f"job-{ep}", ep, {"task_id": task})
                pre = rng.uniform(0, 0.3)
                post = pre + rng.uniform(-0.05, 0.3) * step / steps
                ledger.add_result(f"job-{ep}", {"status": "ok" if i else "failed",
                                                "pre_score": pre, "post_score": post,
                                                "improvement": post - pre, "wall_s": 30.0,
                                                "cost_usd": 0.01})
                ledger.finish_episode(ep, end_reason="done", reward=post - pre + 0.1,
                                      components={"improvement": post - pre, "valid": 0.1})
            append_jsonl(run_dir / "metrics.jsonl", {
                "step": step, "reward_mean": 0.1 + 0.05 * step, "reward_std": 0.1,
                "reward_components": {"improvement": 0.05 * step, "validation_efficiency": 1.0,
                                      "weighted_improvement": 0.05 * step - 0.05,
                                      "weighted_validation": 0.1},
                "validation_pass_rate": min(1.0, 0.4 + 0.1 * step), "job_failure_rate": 0.25,
                "base_model_share": {"tiny-m": 0.5 + 0.08 * step, "tiny-s": 0.5 - 0.08 * step},
                "hyperparameter_surface_use": 0.2 + 0.1 * step, "staleness_mean": 0.5,
                "staleness_max": 1, "stale_groups_dropped": 0, "cost_usd": 0.04})
            for arm in ("untrained", "trained"):
                with (run_dir / "heldout.jsonl").open("a") as fh:
                    fh.write(json.dumps({"step": step, "arm": arm, "task": "dashes", "n": 4,
                                         "mean": 0.2 + (0.02 * step if arm == "trained" else 0),
                                         "ci95": [0.1, 0.4]}) + "\n")
        if crashed:  # an episode left running and a torn last metrics line
            ledger.start_episode("ep-crash", task_id="sort", family="x", difficulty=0,
                                 policy="composer", policy_version=steps, config={})
            with (run_dir / "metrics.jsonl").open("a") as fh:
                fh.write('{"step": 99, "reward_me')
    return run_dir
