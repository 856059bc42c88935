"""Validation-probe latency on a good example job (targets: warm p50 ≤ 2 s, p95 ≤ 6 s).

Three series. `warm`, as an episode or pool worker sees it: the job's sandboxed host (started
ahead: interpreter + `import verifiers`) is up when the probe starts. `cold`: the probe starts
its own host (seconds). `back_to_back`: probes with no pause in between: each finds the host
its predecessor ended cleanly (fresh namespaces per job), or, where the host cannot make them,
only the successor host its predecessor started on close, possibly not ready yet. All run in one process, so the base model and tokenizer stay
loaded after the first probe.

    .venv/bin/python benchmarks/validate_speed.py [--runs 10] [--cold-runs 3] [--b2b-runs 3]
                                                  [--job DIR --task ID]

The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from nestor.job.tasksource import prewarm
from nestor.job.validate import PROBE_LIMITS, validate_job
from nestor.tasks import TaskRegistry

ROOT = Path(__file__).resolve().parents[1]


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--cold-runs", type=int, default=3)
    ap.add_argument("--b2b-runs", type=int, default=3)
    ap.add_argument("--job", default=str(ROOT / "examples/jobs/good-reverse"))
    ap.add_argument("--task", default="reverse")
    args = ap.parse_args()
    torch.set_num_threads(1)
    spec = TaskRegistry().get(args.task).spec()

    t0 = time.perf_counter()
    first = validate_job(args.job, spec, warm=False)
    first_s = time.perf_counter() - t0
    assert first.passed, first.summary()
    print(f"first probe (loads the base model): {first_s:.2f} s")

    series: dict[str, list[float]] = {"warm": [], "cold": [], "back_to_back": []}
    for i in range(args.runs):
        for kind in ("warm", "cold") if i < args.cold_runs else ("warm",):
            if kind == "warm":
                prewarm(PROBE_LIMITS, wait=True)  # the agent is still writing its job
            t0 = time.perf_counter()
            report = validate_job(args.job, spec, warm=kind == "warm")
            series[kind].append(time.perf_counter() - t0)
            assert report.passed, report.summary()
        cold = f", cold {series['cold'][-1]:.2f} s" if i < args.cold_runs else ""
        print(f"run {i + 1}/{args.runs}: warm {series['warm'][-1]:.2f} s{cold}")
    for i in range(args.b2b_runs):
        t0 = time.perf_counter()
        assert validate_job(args.job, spec, warm=True).passed
        series["back_to_back"].append(time.perf_counter() - t0)
        print(f"back-to-back {i + 1}/{args.b2b_runs}: {series['back_to_back'][-1]:.2f} s")
    out = {"job": Path(args.job).name, "runs": args.runs, "cold_runs": args.cold_runs,
           "first_s": round(first_s, 3)}
    for kind, xs in series.items():
        if not xs:
            continue
        out[f"{kind}_p50_s"] = round(statistics.median(xs), 3)
        out[f"{kind}_p95_s"] = round(percentile(xs, 0.95), 3)
    out["target_met"] = out["warm_p50_s"] <= 2.0 and out["warm_p95_s"] <= 6.0
    print(json.dumps(out))


if __name__ == "__main__":
    main()
