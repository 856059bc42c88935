"""Learning target of the inner trainer: the good example jobs of several tasks, and a
wrong-rubric one, through the real `run_job` on the bundled tiny-m, one after another on one
warm state (the pre-scores are the trusted, cached hidden-eval scores).

    .venv/bin/python benchmarks/grpo_learning.py [--tasks length dedupe vowels] [--threads 1]

Targets (issue #5): the good jobs raise hidden-eval accuracy by >= +0.15 on average, each in
<= 120 s of training; the wrong-rubric job by < +0.05. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from nestor.inner.run import WarmState, run_job
from nestor.inner.types import JobRequest

JOBS = Path(__file__).resolve().parents[1] / "examples" / "jobs"


def run(job: Path, task: str, warm: WarmState, out: Path) -> dict:
    t0 = time.monotonic()
    r = run_job(JobRequest(job_dir=job, task_id=task, timeout_s=900, out_dir=out / job.name),
                warm=warm)
    row = {"job": job.name, "task": task, "status": r.status, "pre": r.pre_score,
           "post": r.post_score, "improvement": r.improvement, "steps": r.steps,
           "train_s": round(r.train_s or 0.0, 1), "wall_s": round(time.monotonic() - t0, 1)}
    print(json.dumps(row), flush=True)
    if r.status != "ok":
        print(r.log_tail[-1500:], flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", nargs="+", default=["length", "dedupe", "vowels"],
                    help="good-<task> jobs to run")
    ap.add_argument("--wrong", default="wrong-rubric-reverse", help="the wrong-rubric job")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    args = ap.parse_args()

    warm = WarmState(threads=args.threads)
    out = Path(tempfile.mkdtemp(prefix="nestor-learning-"))
    good = [run(JOBS / f"good-{t}", t, warm, out) for t in args.tasks]
    wrong_task = args.wrong.rsplit("-", 1)[-1]
    wrong = run(JOBS / args.wrong, wrong_task, warm, out) if args.wrong else None
    gains = [r["improvement"] or 0.0 for r in good]
    print(json.dumps({
        "good": good, "wrong_rubric": wrong,
        "mean_improvement": round(sum(gains) / len(gains), 4),
        "max_train_s": max(r["train_s"] for r in good),
        "wrong_rubric_improvement": wrong and wrong["improvement"],
    }))


if __name__ == "__main__":
    main()
