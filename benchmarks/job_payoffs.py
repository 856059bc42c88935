"""What a job earns on each base model: the payoff table behind the arc's stronger-model finding.

For each task and each (base model, job recipe) it writes the job with the composer (the same
files an episode submits), trains it through the real `run_job` (sandboxed reward server,
trusted hidden eval) several times, and prints the pre-score, post-score, uplift and the seed
preset's job-quality term (0.25 × post + 0.75 × uplift). Recipes:

* `naive` — the naive writer's job: the scaffold's whole config, prompts framed with an
  `Answer:` marker, a normalised-match rubric (what an untrained composer writes most often).
* `tuned` — the test's own framing, resampled and widened inputs, partial credit, and a third of
  the base model's default learning rate.

    .venv/bin/python benchmarks/job_payoffs.py [--tasks length vowels add max] [--seeds 3]

Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from nestor.agent.reward import RewardConfig, compute_reward
from nestor.inner.run import WarmState, run_job
from nestor.inner.types import JobRequest
from nestor.policy.composer import Composer, ComposerConfig
from nestor.policy.composer_decisions import CONFIG_KNOBS
from nestor.tasks import TaskRegistry

NAIVE = {"config_mode": "keep_scaffold", "data_source": "augmented", "n_rows": 256,
         "input_range": "observed", "framing": "marker", "rubric": "normalised",
         "extract": "whole", "reward_def": "async_def", "exports": "all", "row_keys": "prompt"}
TUNED = {**NAIVE, "config_mode": "tune", "learning_rate": "third", "framing": "exact",
         "rubric": "partial", "data_source": "resampled", "input_range": "widened"}
RECIPES = {"naive": NAIVE, "tuned": TUNED}


def choices(comp: Composer, values: dict) -> dict[str, int]:
    """Choice indices of a recipe; knobs it does not name keep the scaffold's value."""
    out = {d: [str(c) for c in comp.decisions[d]].index(str(v)) for d, v in values.items()}
    if values["config_mode"] == "tune":
        for knob in CONFIG_KNOBS:
            out.setdefault(knob, 0)
    return out


def write_job(comp: Composer, spec, picks: dict[str, int], seed: int, root: Path) -> Path:
    for call in comp._write_calls(spec, picks, seed):
        if call.name == "write_file":
            path = root / call.arguments["path"]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(call.arguments["content"])
    return root


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", nargs="+", default=["length", "vowels", "add", "max"])
    ap.add_argument("--models", nargs="+", default=["tiny-s", "tiny-m"])
    ap.add_argument("--recipes", nargs="+", default=list(RECIPES), choices=list(RECIPES))
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--token-budget", type=int, default=5000)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()

    seed_preset = RewardConfig(preset="seed")
    post_share = seed_preset.weights()["post_share"]
    registry = TaskRegistry()
    comp = Composer(ComposerConfig(base_models=args.models, token_budget=args.token_budget))
    warm = WarmState(threads=args.threads)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for task in args.tasks:
            spec = registry.get(task).spec()
            for model in args.models:
                for recipe in args.recipes:
                    picks = choices(comp, {**RECIPES[recipe], "base_model": model})
                    runs = []
                    for seed in range(args.seeds):
                        job = write_job(comp, spec, picks, 1000 + seed,
                                        Path(tmp) / f"{task}-{model}-{recipe}-{seed}")
                        t0 = time.monotonic()
                        r = run_job(JobRequest(job_dir=job, task_id=task, timeout_s=300,
                                               token_budget=args.token_budget), warm=warm)
                        runs.append(r)
                        print(f"{task:<7} {model:<7} {recipe:<6} seed {seed}: {r.status}, "
                              f"{r.pre_score} -> {r.post_score} ({time.monotonic() - t0:.1f} s)",
                              flush=True)
                    scored = [r for r in runs if r.post_score is not None]
                    if not scored:
                        continue
                    # the reward module's own terms (post, uplift, quality) for each job
                    terms = [compute_reward(r, passed_on=1, max_attempts=1, timeout_s=300,
                                            config=seed_preset)[1] for r in scored]
                    rows.append({"task": task, "model": model, "recipe": recipe,
                                 "n": len(scored), "pre": scored[0].pre_score,
                                 **{name: round(statistics.fmean(t[key] for t in terms), 3)
                                    for name, key in (("post", "post"), ("uplift", "improvement"),
                                                      ("quality", "quality"))},
                                 "uplifts": [round(t["improvement"], 3) for t in terms]})
    print(f"\n{'task':<8}{'model':<8}{'recipe':<8}{'pre':>6}{'post':>7}{'uplift':>8}"
          f"{'quality':>9}  (seed preset: {post_share} post + {1 - post_share} uplift)")
    for r in rows:
        print(f"{r['task']:<8}{r['model']:<8}{r['recipe']:<8}{r['pre']:>6.3f}{r['post']:>7.3f}"
              f"{r['uplift']:>+8.3f}{r['quality']:>9.3f}")
    best = {}
    for r in rows:
        if r["quality"] > best.get(r["task"], {"quality": -1})["quality"]:
            best[r["task"]] = r
    for task, r in best.items():
        print(f"best on {task}: {r['model']} {r['recipe']} (quality {r['quality']:.3f})")
    print(json.dumps({"rows": rows, "best": {t: f"{r['model']}/{r['recipe']}"
                                             for t, r in best.items()}}))


if __name__ == "__main__":
    main()
