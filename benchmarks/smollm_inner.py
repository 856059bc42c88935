"""The inner loop on a real pretrained model: SmolLM2-135M-Instruct, LoRA and full fine-tune,
on CPU: the example good-<task> jobs (their data and sandboxed rubrics, served by the real
`JobTaskSource`), their config.toml rewritten for the model and mode, trained by the real
`GRPOTrainer` and scored by the trusted hidden eval before and after (`score_task`; `--n`
items, so a shared laptop can afford it: a 200-item eval of this model costs ~2 CPU-minutes).

    .venv/bin/python benchmarks/smollm_inner.py [--tasks length vowels] [--modes lora full]
        [--steps 5] [--prompts 8] [--group 4] [--n 100] [--threads 1]

Per run: hidden-eval accuracy before/after, wall and CPU seconds per step (the first,
warm-up step left out), reward curve, share of zero-variance groups, and model FLOPs
utilisation against a float32 GEMM peak measured in this process at the start and the end
(see benchmarks/mfu.py). The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import tomli_w
import torch
from mfu import matmul_params, matmul_peak, step_flops

from nestor.inner.evaluate import score_task
from nestor.inner.grpo import GRPOTrainer
from nestor.job.config import JobConfig, load_job_config
from nestor.job.tasksource import JobTaskSource
from nestor.models.registry import load_model
from nestor.models.testformat import test_format_ids

JOBS = Path(__file__).resolve().parents[1] / "examples" / "jobs"
LR = {"lora": 2e-3, "full": 5e-5}  # 135M: LoRA wants ~40x a full fine-tune's rate


def prepared_job(task: str, mode: str, args, out: Path) -> tuple[Path, JobConfig]:
    """A copy of examples/jobs/good-<task> with its config set for this model and mode."""
    job = out / f"{task}-{mode}"
    shutil.copytree(JOBS / f"good-{task}", job)
    cfg = load_job_config(job / "config.toml").model_dump(mode="json")
    cfg.update(base_model=args.model, max_steps=args.steps, prompts_per_step=args.prompts,
               group_size=args.group, lora_rank=16 if mode == "lora" else 0, lora_alpha=32,
               learning_rate=args.lr_lora if mode == "lora" else args.lr_full)
    (job / "config.toml").write_bytes(tomli_w.dumps(cfg).encode())
    return job, load_job_config(job / "config.toml")


def mean_prompt_tokens(job: Path, tokenizer) -> float:
    rows = [json.loads(line) for line in (job / "data" / "train.jsonl").read_text().splitlines()
            if line.strip()]
    return statistics.mean(len(test_format_ids(tokenizer, r["prompt"])) for r in rows[:200])


def run(task: str, mode: str, args, base, tokenizer, pre: dict, out: Path,
        peak: dict) -> dict:
    job, config = prepared_job(task, mode, args, out)
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
    model = copy.deepcopy(base).requires_grad_(True).train()
    with JobTaskSource(job, warm=True) as source:
        trainer = GRPOTrainer(model, tokenizer, source.prompts(), source.score, config,
                              ref_model=base)
        steps = trainer.train(on_step=on_step)
    post = score_task(trainer.model, tokenizer, task, n=args.n)
    cpu = [b - a for a, b in zip(cpu_marks, cpu_marks[1:], strict=False)]
    wall = [m["step_s"] for m in steps]
    skip = 1 if len(steps) > 1 else 0  # the first step warms allocators and caches
    wall_s = statistics.mean(wall[skip:])
    cpu_s = statistics.mean(cpu[skip:])
    step_flop = statistics.mean(flops[skip:])
    row = {
        "task": task, "mode": mode, "pre": pre[task].accuracy, "pre_ci95": pre[task].ci95,
        "post": post.accuracy, "post_ci95": post.ci95,
        "improvement": round(post.accuracy - pre[task].accuracy, 4), "steps": len(steps),
        "learning_rate": config.learning_rate,
        "wall_s_per_step": round(wall_s, 2), "cpu_s_per_step": round(cpu_s, 2),
        "sample_s_per_step": round(statistics.mean(m["sample_s"] for m in steps[skip:]), 2),
        "reward_curve": [round(m["reward_mean"], 3) for m in steps],
        "zero_var_frac": round(statistics.mean(m["zero_var_frac"] for m in steps), 3),
        "gflop_per_step": round(step_flop / 1e9, 1),
        "mfu_wall": round(step_flop / wall_s / 1e9 / peak["gflops_wall"], 4),
        "mfu_cpu": round(step_flop / cpu_s / 1e9 / peak["gflops_per_cpu_s"], 4),
        "job_wall_s": round(time.monotonic() - t0, 1),
    }
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
    ap.add_argument("--n", type=int, default=100, help="hidden-eval items before and after")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)

    load_start = os.getloadavg()[0]
    peak_start = matmul_peak(args.threads)
    base, tokenizer = load_model(args.model)
    base = base.float().requires_grad_(False)
    pre = {}
    for t in args.tasks:
        pre[t] = score_task(base, tokenizer, t, n=args.n)
        print(f"{t}: pre-score {pre[t].accuracy:.3f} {pre[t].ci95}", flush=True)
    out = Path(tempfile.mkdtemp(prefix="nestor-smollm-inner-"))
    rows = [run(t, m, args, base, tokenizer, pre, out, peak_start)
            for t in args.tasks for m in args.modes]
    peak_end = matmul_peak(args.threads)
    shutil.rmtree(out, ignore_errors=True)
    print(json.dumps({
        "model": args.model, "threads": args.threads, "steps": args.steps, "n": args.n,
        "prompts_per_step": args.prompts, "group_size": args.group,
        "matmul_peak_start": peak_start, "matmul_peak_end": peak_end,
        "load_avg_start": round(load_start, 2), "load_avg_end": round(os.getloadavg()[0], 2),
        "runs": rows,
    }))


if __name__ == "__main__":
    main()
