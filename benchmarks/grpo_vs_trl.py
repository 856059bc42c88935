"""Our GRPO trainer against TRL's GRPOTrainer on identical work, in one run.

Same job (its sandboxed reward server scores both), same base model weights, same settings:
prompts per step, group size, max new tokens, temperature, steps, AdamW lr, grad clip, clip
epsilon, no KL, advantages r - group mean without std scaling, token-level loss normalised by
the batch's completion tokens (TRL's `dapo`). TRL runs on CPU (`use_cpu=True`) with the base
model's `PreTrainedTokenizerFast` as its processing class.

    .venv/bin/python benchmarks/grpo_vs_trl.py [--job examples/jobs/good-reverse] [--steps 8]
        [--model tiny-m smollm2-135m]

Prints seconds per optimizer step for each (the first step, a warm-up, is left out), their
ratio, both reward curves, and each trainer's model FLOPs utilisation against a float32 GEMM
peak measured in this process (benchmarks/mfu.py; each trainer's own work counted: ours
prefills and trains each distinct prompt once per group, TRL once per completion). With
several models, one row each; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import torch
from mfu import matmul_params, matmul_peak, step_flops

from nestor.inner.grpo import GRPOTrainer, render_prompt
from nestor.job.config import load_job_config
from nestor.job.tasksource import JobTaskSource
from nestor.models.registry import load_model

ROOT = Path(__file__).resolve().parents[1]


def run_ours(model, tokenizer, prompts, score, config) -> dict:
    trainer = GRPOTrainer(model, tokenizer, prompts, score, config)
    cpu = [time.process_time()]

    def on_step(m: dict) -> None:
        cpu.append(time.process_time())

    hist = trainer.train(on_step=on_step)
    return {"step_s": [m["step_s"] for m in hist],
            "cpu_s": [b - a for a, b in zip(cpu, cpu[1:], strict=False)],
            "reward_curve": [round(m["reward_mean"], 4) for m in hist],
            "completion_len": [m["completion_len"] for m in hist],
            "groups_trained": [m["groups_trained"] for m in hist]}


def run_trl(model, tokenizer, prompts, score, config) -> dict:
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig
    from trl import GRPOTrainer as TRLTrainer

    class Timer(TrainerCallback):
        def __init__(self):
            self.step_s: list[float] = []
            self.cpu_s: list[float] = []
            self.rewards: list[float] = []
            self.lengths: list[float] = []
            self._t = self._c = 0.0

        def on_step_begin(self, args, state, control, **kw):
            self._t, self._c = time.perf_counter(), time.process_time()

        def on_step_end(self, args, state, control, **kw):
            self.step_s.append(time.perf_counter() - self._t)
            self.cpu_s.append(time.process_time() - self._c)

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "reward" in logs:
                self.rewards.append(round(float(logs["reward"]), 4))
            if logs and "completions/mean_length" in logs:
                self.lengths.append(float(logs["completions/mean_length"]))

    def reward(prompts, completions, task, **kw):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return score([int(t) for t in task], texts)

    rows = [{"prompt": [{"role": "user", "content": p}], "task": i} for i, p in enumerate(prompts)]
    dataset = Dataset.from_list(rows)
    batch = config.prompts_per_step * config.group_size
    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(
            output_dir=out, use_cpu=True, report_to=[], save_strategy="no", logging_steps=1,
            seed=config.seed, max_steps=config.max_steps, per_device_train_batch_size=batch,
            gradient_accumulation_steps=1, num_generations=config.group_size,
            max_completion_length=config.max_new_tokens, temperature=config.temperature,
            learning_rate=config.learning_rate, lr_scheduler_type="constant", warmup_steps=0,
            adam_beta2=0.99, weight_decay=config.weight_decay, max_grad_norm=config.grad_clip,
            epsilon=config.clip_ratio, beta=0.0, scale_rewards="none", loss_type="dapo",
            num_iterations=1, top_k=0, disable_tqdm=True, dataloader_num_workers=0,
            bf16=False, fp16=False)
        timer = Timer()
        trainer = TRLTrainer(model=model, reward_funcs=reward, args=args, train_dataset=dataset,
                             processing_class=tokenizer, callbacks=[timer])
        trainer.train()
    return {"step_s": timer.step_s, "cpu_s": timer.cpu_s, "reward_curve": timer.rewards,
            "completion_len": timer.lengths or [float(config.max_new_tokens)]}


def mfu(run: dict, *, body: int, head: int, prompt_len: float, config, shared: bool,
        peak: dict) -> dict:
    """Mean FLOPs per step (warm-up step left out) and utilisation of wall and CPU time."""
    P, G = config.prompts_per_step, config.group_size
    lengths = run["completion_len"]
    flops = []
    for i in range(len(run["step_s"])):
        lc = lengths[min(i, len(lengths) - 1)]
        trained_groups = run.get("groups_trained", [P] * len(run["step_s"]))[i]
        flops.append(step_flops(
            body, head, prompt_tokens=round((P if shared else P * G) * prompt_len),
            completion_tokens=round(P * G * lc),
            trained_prompt_tokens=round((trained_groups if shared else P * G) * prompt_len),
            trained_completion_tokens=round((trained_groups if shared else P) * G * lc),
            lora=config.lora_rank > 0)["flops"])
    sl = slice(1, None) if len(flops) > 1 else slice(None)
    f = statistics.mean(flops[sl])
    wall, cpu = statistics.mean(run["step_s"][sl]), statistics.mean(run["cpu_s"][sl])
    return {"gflop_per_step": round(f / 1e9, 1),
            "mfu_wall": round(f / wall / 1e9 / peak["gflops_wall"], 4),
            "mfu_cpu": round(f / cpu / 1e9 / peak["gflops_per_cpu_s"], 4)}


def compare(model_name: str, config, source, threads: int) -> dict:
    base, tokenizer = load_model(model_name)
    base = base.float()
    prompts = source.prompts()
    body, head = matmul_params(base)
    prompt_len = statistics.mean(len(render_prompt(tokenizer, p)) for p in prompts[:200])
    peak = matmul_peak(threads)
    ours = run_ours(copy.deepcopy(base), tokenizer, prompts, source.score, config)
    trl = run_trl(copy.deepcopy(base), tokenizer, prompts, source.score, config)

    def per_step(xs: list[float]) -> float:
        return statistics.mean(xs[1:] if len(xs) > 1 else xs)

    ours_s, trl_s = per_step(ours["step_s"]), per_step(trl["step_s"])
    ours_cpu, trl_cpu = per_step(ours["cpu_s"]), per_step(trl["cpu_s"])
    common = {"body": body, "head": head, "prompt_len": prompt_len, "config": config,
              "peak": peak}
    row = {
        "model": model_name, "parameters": sum(p.numel() for p in base.parameters()),
        "ours_s_per_step": round(ours_s, 3), "trl_s_per_step": round(trl_s, 3),
        "ratio": round(ours_s / trl_s, 3),
        # CPU seconds of this process per step (the reward server's child excluded for both):
        # steadier than wall time when other work shares the machine.
        "ours_cpu_s_per_step": round(ours_cpu, 3), "trl_cpu_s_per_step": round(trl_cpu, 3),
        "cpu_ratio": round(ours_cpu / trl_cpu, 3),
        "ours_mfu": mfu(ours, shared=True, **common), "trl_mfu": mfu(trl, shared=False, **common),
        "matmul_peak": peak,
        "ours_reward_curve": ours["reward_curve"], "trl_reward_curve": trl["reward_curve"],
    }
    print(f"[{model_name}] ours {ours_s:.3f} s/step   TRL {trl_s:.3f} s/step   "
          f"ratio {ours_s / trl_s:.2f}")
    print(f"[{model_name}] CPU: ours {ours_cpu:.3f} s/step   TRL {trl_cpu:.3f} s/step   "
          f"ratio {ours_cpu / trl_cpu:.2f}")
    print(f"[{model_name}] MFU (wall): ours {row['ours_mfu']['mfu_wall']:.1%}   "
          f"TRL {row['trl_mfu']['mfu_wall']:.1%} of {peak['gflops_wall']} GFLOP/s")
    print(f"[{model_name}] ours rewards: {ours['reward_curve']}")
    print(f"[{model_name}] TRL rewards:  {trl['reward_curve']}", flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--job", type=Path, default=ROOT / "examples/jobs/good-reverse")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--model", nargs="+", help="base model names or directories (default: the "
                    "job's); e.g. --model tiny-m smollm2-135m")
    ap.add_argument("--prompts", type=int, help="prompts per step (default: the job's)")
    ap.add_argument("--group", type=int, help="group size (default: the job's)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    warnings.filterwarnings("ignore")

    config = load_job_config(a.job / "config.toml").model_copy(update={"max_steps": a.steps})
    if a.prompts:
        config = config.model_copy(update={"prompts_per_step": a.prompts})
    if a.group:
        config = config.model_copy(update={"group_size": a.group})
    load = os.getloadavg()[0]
    with JobTaskSource(a.job) as source:
        rows = [compare(m, config, source, a.threads) for m in a.model or [config.base_model]]
    summary = {
        "job": a.job.name, "steps": a.steps, "threads": a.threads,
        "prompts_per_step": config.prompts_per_step, "group_size": config.group_size,
        "max_new_tokens": config.max_new_tokens, "lora_rank": config.lora_rank,
        "load_avg_start": round(load, 2), "load_avg_end": round(os.getloadavg()[0], 2),
        **({k: v for k, v in rows[0].items()} if len(rows) == 1 else {}), "runs": rows,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
