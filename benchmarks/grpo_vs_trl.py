"""Our GRPO trainer against TRL's GRPOTrainer on identical work, in one run.

Same job (its sandboxed reward server scores both), same base model weights, same settings:
prompts per step, group size, max new tokens, temperature, steps, AdamW lr, grad clip, clip
epsilon, no KL, advantages r - group mean without std scaling, token-level loss normalised by
the batch's completion tokens (TRL's `dapo`). TRL runs on CPU (`use_cpu=True`) with the base
model's `PreTrainedTokenizerFast` as its processing class.

    .venv/bin/python benchmarks/grpo_vs_trl.py [--job examples/jobs/good-reverse] [--steps 8]

Prints seconds per optimizer step for each (the first step, a warm-up, is left out), their
ratio, and both reward curves; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import torch

from nestor.inner.grpo import GRPOTrainer
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
            "reward_curve": [round(m["reward_mean"], 4) for m in hist]}


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
            self._t = self._c = 0.0

        def on_step_begin(self, args, state, control, **kw):
            self._t, self._c = time.perf_counter(), time.process_time()

        def on_step_end(self, args, state, control, **kw):
            self.step_s.append(time.perf_counter() - self._t)
            self.cpu_s.append(time.process_time() - self._c)

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "reward" in logs:
                self.rewards.append(round(float(logs["reward"]), 4))

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
    return {"step_s": timer.step_s, "cpu_s": timer.cpu_s, "reward_curve": timer.rewards}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--job", type=Path, default=ROOT / "examples/jobs/good-reverse")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--model", help="base model name or directory (default: the job's)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    warnings.filterwarnings("ignore")

    config = load_job_config(a.job / "config.toml").model_copy(update={"max_steps": a.steps})
    base, tokenizer = load_model(a.model or config.base_model)
    base = base.float()
    with JobTaskSource(a.job) as source:
        prompts = source.prompts()
        ours = run_ours(copy.deepcopy(base), tokenizer, prompts, source.score, config)
        trl = run_trl(copy.deepcopy(base), tokenizer, prompts, source.score, config)

    def per_step(xs: list[float]) -> float:
        return statistics.mean(xs[1:] if len(xs) > 1 else xs)

    ours_s, trl_s = per_step(ours["step_s"]), per_step(trl["step_s"])
    ours_cpu, trl_cpu = per_step(ours["cpu_s"]), per_step(trl["cpu_s"])
    summary = {
        "job": a.job.name, "model": a.model or config.base_model, "steps": a.steps, "threads": a.threads,
        "prompts_per_step": config.prompts_per_step, "group_size": config.group_size,
        "max_new_tokens": config.max_new_tokens,
        "ours_s_per_step": round(ours_s, 3), "trl_s_per_step": round(trl_s, 3),
        "ratio": round(ours_s / trl_s, 3),
        # CPU seconds of this process per step (the reward server's child excluded for both):
        # steadier than wall time when other work shares the machine.
        "ours_cpu_s_per_step": round(ours_cpu, 3), "trl_cpu_s_per_step": round(trl_cpu, 3),
        "cpu_ratio": round(ours_cpu / trl_cpu, 3),
        "ours_reward_curve": ours["reward_curve"], "trl_reward_curve": trl["reward_curve"],
    }
    print(f"ours {ours_s:.3f} s/step   TRL {trl_s:.3f} s/step   ratio {ours_s / trl_s:.2f}")
    print(f"CPU: ours {ours_cpu:.3f} s/step   TRL {trl_cpu:.3f} s/step   "
          f"ratio {ours_cpu / trl_cpu:.2f}")
    print(f"ours rewards: {ours['reward_curve']}")
    print(f"TRL rewards:  {trl['reward_curve']}")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
