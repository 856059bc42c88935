"""Builds a small but complete run directory through the real Ledger and metrics writers:
metrics, held-out rows, and episodes with transcripts, attempts, reports, job files and results.
`hostile` puts markup and script into everything the agent could have written."""

from __future__ import annotations

import json
import random
from pathlib import Path

from nestor.ledger import Ledger
from nestor.outer.metrics import append_jsonl

HOSTILE = ('</textarea></pre></script><script>window.PWNED=1</script>'
           '<img src=x onerror="window.PWNED=2"> "quotes" \'single\' & ampersand {{ jinja }}')


def _episode(ledger: Ledger, run_dir: Path, ep: str, task: str, step: int, i: int,
             rng: random.Random, hostile: bool) -> None:
    model = "tiny-m" if (i + step) % 3 else "tiny-s"
    ledger.start_episode(ep, task_id=task, family="x", difficulty=0, policy="composer",
                         policy_version=step, config={}, group_id=f"g{step}-{i // 2}")
    extra = HOSTILE if hostile else ""
    turns = [
        {"role": "system", "content": "You write RL training jobs." + extra},
        {"role": "user", "content": f"Task: {task}"},
        {"role": "assistant", "content": "I'll write the config." + extra,
         "tool_calls": [{"id": "c1", "name": "write_file",
                         "arguments": {"path": "config.toml", "content": f'base_model = "{model}"'}},
                        {"id": "c2", "name": "submit", "arguments": {}}]},
        {"role": "tool", "content": "wrote config.toml" + extra, "tool_call_id": "c1"},
        {"role": "tool", "content": "validation passed (attempt 1 of 3); the job was sent for "
                                    "training.\nok   files: fine", "tool_call_id": "c2"},
    ]
    for k, turn in enumerate(turns):
        ledger.add_turn(ep, k, turn)
    job_dir = run_dir / "episodes" / ep / "job"
    (job_dir / "data").mkdir(parents=True, exist_ok=True)
    (job_dir / "config.toml").write_text(f'base_model = "{model}"\nmax_steps = 10\n' + (
        f"# {extra}\n" if hostile else ""))
    (job_dir / "data" / "train.jsonl").write_text(
        json.dumps({"prompt": f"{task} abc" + extra, "answer": "cba"}) + "\n")
    ledger.add_attempt(ep, 1, job_dir)
    ledger.add_report(ep, 1, passed=True, elapsed_s=3.2, checks=[
        {"name": "files", "ok": True, "message": "config.toml, data/train.jsonl" + extra},
        {"name": "budget", "ok": i != 3, "message": "12,000 of 150,000 sampled tokens"}])
    ledger.add_job(f"job-{ep}", ep, {"task_id": task, "job_dir": str(job_dir)})
    pre = rng.uniform(0, 0.3)
    post = pre + rng.uniform(-0.05, 0.3) * step / 6
    ok = i != 0
    ledger.add_result(f"job-{ep}", {
        "status": "ok" if ok else "failed", "pre_score": pre if ok else None,
        "post_score": post if ok else None, "improvement": post - pre if ok else None,
        "wall_s": 30.0, "cost_usd": 0.01, "base_model": model, "steps": 10,
        "reward_curve": [round(0.1 + 0.03 * k + rng.uniform(0, 0.05), 3) for k in range(10)],
        "log_tail": "step 10 loss 0.12" + extra})
    ledger.finish_episode(ep, end_reason="ok" if ok else "job_failed",
                          reward=post - pre + 0.1 if ok else 0.0,
                          components={"improvement": post - pre, "validation_efficiency": 1.0,
                                      "speed": 0.5, "speed_counted": False})


def make_run(run_dir: Path, *, steps: int = 6, crashed: bool = False,
             hostile: bool = False) -> Path:
    rng = random.Random(0)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.toml").write_text('name = "fixture"\n[policy]\nkind = "composer"\n')
    with Ledger(run_dir) as ledger:
        for step in range(steps):
            for i in range(4):
                task = ["reverse", "add", "length"][i % 3]
                _episode(ledger, run_dir, f"ep-{step}-{i}", task, step, i, rng, hostile)
            append_jsonl(run_dir / "metrics.jsonl", {
                "step": step, "policy_version": step, "elapsed_s": 10.0 * (step + 1),
                "episodes": 4, "reward_mean": 0.1 + 0.05 * step, "reward_std": 0.1,
                "reward_components": {"improvement": 0.05 * step, "validation_efficiency": 1.0,
                                      "weighted_quality": 0.05 * step - 0.05,
                                      "weighted_validation": 0.1},
                "validation_pass_rate": min(1.0, 0.4 + 0.1 * step), "job_failure_rate": 0.25,
                "hidden_eval_improvement": 0.02 * step, "mean_attempts": 1.5, "jobs": 4,
                "base_model_share": {"tiny-m": min(1.0, 0.5 + 0.08 * step),
                                     "tiny-s": max(0.0, 0.5 - 0.08 * step)},
                "hyperparameter_surface_use": min(1.0, 0.2 + 0.1 * step), "staleness_mean": 0.5,
                "staleness_max": 1, "stale_groups_dropped": 0, "cost_usd": 0.04,
                "end_reasons": {"ok": 3, "job_failed": 1}, "pool_utilisation": 0.9,
                "train": {"loss": 0.5 - 0.05 * step, "grad_norm": 1.0, "lr": 1e-4}})
            for arm in ("untrained", "trained"):
                centre = 0.2 + (0.02 * step if arm == "trained" else 0)
                values = [round(centre + d, 4) for d in (-0.1, -0.05, 0.05, 0.1)]
                with (run_dir / "heldout.jsonl").open("a") as fh:
                    fh.write(json.dumps({"step": step, "arm": arm, "task": "dashes", "n": 4,
                                         "mean": centre, "ci95": [centre - 0.1, centre + 0.1],
                                         "values": values}) + "\n")
        if crashed:  # an episode left running and a torn last metrics line
            ledger.start_episode("ep-crash", task_id="sort", family="x", difficulty=0,
                                 policy="composer", policy_version=steps, config={})
            with (run_dir / "metrics.jsonl").open("a") as fh:
                fh.write('{"step": 99, "reward_me')
    return run_dir
