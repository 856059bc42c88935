"""The inner loop on a real pretrained model: SmolLM2-135M-Instruct, LoRA and full fine-tune,
on CPU, through the real `run_job` (the example good-<task> jobs, their sandboxed rubrics,
the trusted hidden eval before and after), with the job's config.toml rewritten for the model.

    .venv/bin/python benchmarks/smollm_inner.py [--tasks length vowels] [--modes lora full]
        [--steps 5] [--prompts 8] [--group 4] [--threads 1]

Per run: hidden-eval accuracy before/after (200 items), wall and CPU seconds per step (the
first, warm-up step left out), reward curve, share of zero-variance groups, and model FLOPs
utilisation against a float32 GEMM peak measured in this process at the start and the end
(see benchmarks/mfu.py). The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import tomli_w
from mfu import matmul_params, matmul_peak, step_flops

from nestor.inner.run import WarmState, run_job
from nestor.inner.types import JobRequest
from nestor.job.config import load_job_config
from nestor.models.testformat import test_format_ids

JOBS = Path(__file__).resolve().parents[1] / "examples" / "jobs"
LR = {"lora": 2e-3, "full": 5e-5}  # 135M: LoRA wants ~40x a full fine-tune's rate


def prepared_job(task: str, mode: str, args, out: Path) -> Path:
    """A copy of examples/jobs/good-<task> with its config set for this model and mode."""
    job = out / f"{task}-{mode}"
    shutil.copytree(JOBS / f"good-{task}", job)
    cfg = load_job_config(job / "config.toml").model_dump(mode="json")
    cfg.update(base_model=args.model, max_steps=args.steps, prompts_per_step=args.prompts,
               group_size=args.group, lora_rank=16 if mode == "lora" else 0, lora_alpha=32,
               learning_rate=args.lr_lora if mode == "lora" else args.lr_full)
    (job / "config.toml").write_bytes(tomli_w.dumps(cfg).encode())
    return job


def mean_prompt_tokens(job: Path, tokenizer) -> float:
    rows = [json.loads(line) for line in (job / "data" / "train.jsonl").read_text().splitlines()
            if line.strip()]
    return statistics.mean(len(test_format_ids(tokenizer, r["prompt"])) for r in rows[:200])


def run(task: str, mode: str, args, warm: WarmState, out: Path, peak: dict) -> dict:
    job = prepared_job(task, mode, args, out)
    base, tokenizer = warm.base(args.model)
    body, head = matmul_params(base)
    prompt_len = mean_prompt_tokens(job, tokenizer)
    cpu_marks = [time.process_time()]
    flops: list[float] = []

    def on_step(m: dict) -> None:
        cpu_marks.append(time.process_time())
        sampled = m["completion_len"] * args.prompts * args.group
        trained_rows = m["groups_trained"] * args.group
        flops.append(step_flops(
            body, head, prompt_tokens=round(args.prompts * prompt_len),
            completion_tokens=round(sampled),
            trained_prompt_tokens=round(m["groups_trained"] * prompt_len),
            trained_completion_tokens=round(trained_rows * m["completion_len"]),
            lora=mode == "lora")["flops"])
        print(f"  {task}/{mode} step {m['step']}: reward {m['reward_mean']:.3f} "
              f"zero-var {m['zero_var_frac']:.2f} {m['step_s']:.1f} s", flush=True)

    t0 = time.monotonic()
    r = run_job(JobRequest(job_dir=job, task_id=task, timeout_s=args.timeout,
                           out_dir=out / f"ckpt-{task}-{mode}"), warm=warm, on_step=on_step)
    steps = r.metrics
    cpu = [b - a for a, b in zip(cpu_marks, cpu_marks[1:], strict=False)]
    wall = [m["step_s"] for m in steps]
    skip = 1 if len(steps) > 1 else 0  # the first step warms allocators and caches
    wall_s = statistics.mean(wall[skip:]) if wall else None
    cpu_s = statistics.mean(cpu[skip:]) if cpu else None
    step_flop = statistics.mean(flops[skip:]) if flops else 0.0
    row = {
        "task": task, "mode": mode, "status": r.status, "pre": r.pre_score, "post": r.post_score,
        "improvement": r.improvement, "steps": r.steps,
        "learning_rate": args.lr_lora if mode == "lora" else args.lr_full,
        "wall_s_per_step": wall_s and round(wall_s, 2), "cpu_s_per_step": cpu_s and round(cpu_s, 2),
        "sample_s_per_step": round(statistics.mean(m["sample_s"] for m in steps[skip:]), 2)
        if steps else None,
        "reward_curve": r.reward_curve,
        "zero_var_frac": round(statistics.mean(m["zero_var_frac"] for m in steps), 3)
        if steps else None,
        "gflop_per_step": round(step_flop / 1e9, 1),
        "mfu_wall": round(step_flop / wall_s / 1e9 / peak["gflops_wall"], 4) if wall_s else None,
        "mfu_cpu": round(step_flop / cpu_s / 1e9 / peak["gflops_per_cpu_s"], 4) if cpu_s else None,
        "job_wall_s": round(time.monotonic() - t0, 1),
    }
    if r.status != "ok":
        print(r.log_tail[-1200:], flush=True)
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--tasks", nargs="+", default=["length", "vowels"])
    ap.add_argument("--modes", nargs="+", default=["lora", "full"], choices=["lora", "full"])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--lr-lora", type=float, default=LR["lora"])
    ap.add_argument("--lr-full", type=float, default=LR["full"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=1800)
    args = ap.parse_args()
    warnings.filterwarnings("ignore")

    load_start = os.getloadavg()[0]
    peak_start = matmul_peak(args.threads)
    warm = WarmState(threads=args.threads)
    out = Path(tempfile.mkdtemp(prefix="nestor-smollm-inner-"))
    rows = [run(t, m, args, warm, out, peak_start) for t in args.tasks for m in args.modes]
    peak_end = matmul_peak(args.threads)
    shutil.rmtree(out, ignore_errors=True)
    print(json.dumps({
        "model": args.model, "threads": args.threads, "steps": args.steps,
        "prompts_per_step": args.prompts, "group_size": args.group,
        "matmul_peak_start": peak_start, "matmul_peak_end": peak_end,
        "load_avg_start": round(load_start, 2), "load_avg_end": round(os.getloadavg()[0], 2),
        "runs": rows,
    }))


if __name__ == "__main__":
    main()
