"""One inner job, end to end: config -> budget -> base model -> pre -> GRPO -> post -> checkpoint.

`run_job` never raises for a problem of the job: a bad config is `invalid`, a crash of the
job's code (or of its sandboxed reward server) is `failed` with a log tail, and a job that
runs past `request.timeout_s` is `timeout` (checked between steps; the weights it trained are
still post-scored; every request to the reward server has its own timeout, so nothing waits
forever).

Trust: the job's code runs only in the sandboxed `JobTaskSource`. Pre and post are hidden-eval
scores computed here, in the trusted process, on weights held as tensors.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import socket
import tempfile
import time
import traceback
from collections import deque
from collections.abc import Callable
from pathlib import Path

from nestor.inner.types import JobRequest, JobResult
from nestor.job.config import JobConfigError, load_job_config
from nestor.job.layout import LayoutError, read_layout

LOG_LINES = 40


class WarmState:
    """What a warm worker keeps across jobs: loaded base models (never trained: each job gets a
    copy) and pre-scores of (model, task, difficulty).

    `device` and `dtype` come from the worker type (a GPU type trains on "cuda"); dtype None is
    float32 on a CPU and the checkpoint's own (bf16 for Qwen3) elsewhere. The base model is
    loaded once in that device and dtype, and both the pre-score and each job's trained copy
    (hence its post-score) come from it: a job that changes nothing improves by exactly 0."""

    def __init__(self, device: str = "cpu", threads: int | None = None, dtype: str | None = None):
        self.device = device
        self.dtype = dtype
        if threads:  # tiny models gain little from more threads, and lose a lot when the
            import torch  # cores are oversubscribed (OpenMP threads spin-wait on each other)

            torch.set_num_threads(threads)
        self._models: dict[str, tuple] = {}
        self._pre: dict[tuple[str, str, int], float] = {}

    def base(self, name: str):
        """(frozen base model, tokenizer), loaded once."""
        if name not in self._models:
            import torch

            from nestor.inner.evaluate import score_dtype
            from nestor.models.registry import load_model, resolve_model_dir

            dtype = score_dtype(resolve_model_dir(name), self.device, self.dtype)
            model, tokenizer = load_model(name, device=self.device, dtype=getattr(torch, dtype))
            model.eval().requires_grad_(False)
            self._models[name] = (model, tokenizer)
        return self._models[name]

    def warm_up(self, models: tuple[str, ...] | list[str]) -> list[str]:
        """Pay a fresh worker's one-time costs before its first job: the sandboxed reward
        host's `import verifiers` (started first, it runs alongside), then the import of
        transformers and the base models' load. Returns the models loaded; those not present
        here are skipped (a job that names one fails on its own, with the reason)."""
        from nestor.job.tasksource import prewarm
        from nestor.models.registry import ModelNotFoundError

        with contextlib.suppress(Exception):  # only a head start, as in run_job
            prewarm()
        loaded = []
        for name in models:
            with contextlib.suppress(ModelNotFoundError):
                self.base(name)
                loaded.append(name)
        with contextlib.suppress(Exception):
            prewarm(wait=True)
        return loaded

    def trainable_copy(self, name: str):
        model, tokenizer = self.base(name)
        return copy.deepcopy(model), tokenizer

    def pre_score(self, name: str, task_id: str, difficulty: int, registry=None) -> float:
        """Hidden-eval accuracy of the warm base model itself (cached here, and on disk keyed
        by its device and dtype): the scorer the post-score uses, on the same weights."""
        key = (name, task_id, difficulty)
        if key not in self._pre:
            from nestor.inner.evaluate import pre_score

            model, tokenizer = self.base(name)
            self._pre[key] = float(pre_score(name, task_id, difficulty, registry=registry,
                                             model=model, tokenizer=tokenizer).accuracy)
        return self._pre[key]


class _Log:
    """The last lines of a job's log, for JobResult.log_tail."""

    def __init__(self):
        self.lines: deque[str] = deque(maxlen=LOG_LINES)

    def __call__(self, line: str) -> None:  # a job's text may hold lone surrogates
        from nestor.job.tasksource import clean_text

        self.lines.append(clean_text(line))

    def tail(self) -> str:
        return "\n".join(self.lines)


def _step_line(m: dict) -> str:
    return (f"step {m['step']}: reward {m['reward_mean']:.3f}±{m['reward_std']:.3f} "
            f"zero-var {m['zero_var_frac']:.2f} len {m['completion_len']:.1f} "
            f"entropy {m.get('entropy', float('nan')):.3f} {m['tokens_per_s']:.0f} tok/s")


def run_job(request: JobRequest, *, warm: WarmState | None = None,
            on_step: Callable[[dict], None] | None = None) -> JobResult:
    """Train one job and score it. `on_step` gets each step's metrics (for progress bars).
    Returns a status for every job: whatever a job's files make the trusted side trip on
    (a parser's RecursionError, an overflow, undecodable text) is that job's `failed`."""
    t0 = time.monotonic()
    try:
        return _run_job(request, warm, on_step)
    except Exception as exc:  # outside _run_job's own handler: config, registry, staging
        from nestor.job.tasksource import clean_text

        why = clean_text("".join(traceback.format_exception_only(type(exc), exc)).strip())[:2000]
        return JobResult(status="failed", wall_s=time.monotonic() - t0,
                         worker=f"{socket.gethostname()}:{os.getpid()}",
                         log_tail=f"the job could not be run: {why}")


def _run_job(request: JobRequest, warm: WarmState | None,
             on_step: Callable[[dict], None] | None) -> JobResult:
    t0 = time.monotonic()
    log = _Log()
    worker = f"{socket.gethostname()}:{os.getpid()}"
    result = {"worker": worker}

    def done(status: str, **kw) -> JobResult:
        if kw.get("log_tail") is None:
            kw["log_tail"] = log.tail()
        return JobResult(status=status, wall_s=time.monotonic() - t0, **{**result, **kw})

    job_dir = Path(request.job_dir)
    try:  # the same files check as validation: no link in the job is ever followed
        read_layout(job_dir)
        config = load_job_config(job_dir / "config.toml")
    except (LayoutError, JobConfigError) as exc:
        return done("invalid", log_tail=str(exc))
    if request.max_steps is not None:  # the user's override, applied here: no copy of the job
        config = config.model_copy(update={"max_steps": request.max_steps})
    if (err := config.budget_error(request.token_budget)) is not None:
        return done("invalid", log_tail=err)
    result["base_model"] = config.base_model
    from nestor.models.registry import MODEL_NAMES, ModelNotFoundError

    if config.base_model not in MODEL_NAMES:
        return done("invalid", log_tail=f"config.toml: base_model {config.base_model!r} is not "
                    f"one of {', '.join(MODEL_NAMES)}")
    from nestor.tasks import TaskError, TaskRegistry

    try:
        registry = TaskRegistry(request.tasks_modules)
        task = registry.get(request.task_id)
    except TaskError as exc:
        return done("invalid", log_tail=str(exc))

    warm = warm or WarmState()
    from nestor.job.tasksource import prewarm

    with contextlib.suppress(Exception):  # only a head start; JobTaskSource reports real trouble
        prewarm()  # the reward server's child imports verifiers while we load and pre-score
    history: list[dict] = []
    train_s = 0.0
    timings: dict[str, float] = {}
    mark = [time.monotonic()]

    def lap(name: str) -> None:
        now = time.monotonic()
        timings[name] = round(now - mark[0], 2)
        mark[0] = now
    try:
        try:
            base, _ = warm.base(config.base_model)
            model, tokenizer = warm.trainable_copy(config.base_model)
        except ModelNotFoundError as exc:
            return done("failed", log_tail=f"base model: {exc}")
        lap("load_model_s")
        pre = warm.pre_score(config.base_model, request.task_id, request.difficulty, registry)
        result["pre_score"] = pre
        weight = next(base.parameters())
        log(f"{config.base_model} on {request.task_id}: pre-score {pre:.3f} "
            f"({weight.device}, {str(weight.dtype).removeprefix('torch.')})")
        lap("pre_score_s")
        deadline = t0 + request.timeout_s

        from nestor.inner.canary import CanaryReward
        from nestor.inner.grpo import GRPOTrainer
        from nestor.job.memory import check as memory_check
        from nestor.job.memory import worker_target
        from nestor.job.tasksource import JobTaskSource

        if time.monotonic() > deadline:
            log(f"timeout: {request.timeout_s:g} s passed before training started")
            return done("timeout")
        with JobTaskSource(job_dir, warm=True) as source:
            prompts = source.prompts()
            log(f"reward server up: {len(prompts)} tasks")
            from nestor.job.report import CheckLog
            from nestor.job.validate import check_context, check_tasks

            rows = CheckLog()  # the probe's row checks again: load() may yield other rows now
            if not (check_tasks(source.load(), source, rows)
                    and check_context(source.load(), config, tokenizer, rows)):
                failed = rows.checks[-1]
                return done("invalid", log_tail=f"{failed.name}: {failed.message}")
            # sized here, by this worker's device, dtype and memory (job/memory.py)
            target = worker_target(weight.device, weight.dtype, request.memory_cap_mb)
            if (err := memory_check(config, prompts, tokenizer, target.cap_mb,
                                    target.dtype_bytes)):
                return done("invalid", log_tail=f"memory ({target.describe()}): {err}")
            from nestor.inner.contamination import contamination_error

            if (err := contamination_error(task, request.difficulty, source.load())):
                return done("invalid", log_tail=f"data: {err}")
            lap("reward_server_s")
            # The rubric is re-probed and watched with canary replies (inner/canary.py).
            reward = CanaryReward(source, task.spec(request.difficulty), request.canary,
                                  seed=config.seed, log=log)
            trainer = GRPOTrainer(model, tokenizer, prompts, reward, config, ref_model=base)

            def step_done(m: dict) -> None:
                history.append(m)
                log(_step_line(m))
                if on_step is not None:
                    on_step(m)

            t_train = time.monotonic()
            trainer.train(should_stop=lambda: time.monotonic() > deadline, on_step=step_done)
            train_s = time.monotonic() - t_train
            lap("train_s")
        from nestor.inner.change import trainer_change

        change = trainer_change(trainer, base)
        result.update(weight_change=change.change, step_efficiency=change.efficiency,
                      grid_steps=change.grid_steps)
        log(f"weights moved {change.change:.2e} (||Δθ||/||θ||), {change.efficiency:.2e} lr "
            f"per step per weight, {change.grid_steps:.2g} steps at the bottom of the model's "
            f"learning-rate grid: {'trained' if change.moved() else 'did not train'}")
        result.update(steps=len(history), train_s=train_s, metrics=history,
                      reward_curve=[round(m["reward_mean"], 4) for m in history])
        timed_out = time.monotonic() > deadline
        if timed_out:
            log(f"timeout: {request.timeout_s:g} s passed after {len(history)} of "
                f"{config.max_steps} steps")
            if not history:
                return done("timeout")
        # a timeout post-scores the weights it has: a job that trained most of the way is
        # scored on what it did (the pool's grace period past timeout_s covers the hidden eval)
        post, result["eval_n"] = _post_score(trainer.model, tokenizer, task, request.difficulty)
        log(f"post-score {post:.3f} ({post - pre:+.3f})")
        lap("post_score_s")
        if timed_out:
            return done("timeout", post_score=post, improvement=post - pre)
        out_dir = Path(request.out_dir) if request.out_dir else Path(
            tempfile.mkdtemp(prefix="nestor-job-"))
        ckpt = _save(trainer.model, tokenizer, out_dir, config, request, history)
        lap("save_s")
        log("timings: " + ", ".join(f"{k} {v:g}" for k, v in timings.items()))
        return done("ok", post_score=post, improvement=post - pre, checkpoint=str(ckpt))
    except Exception as exc:  # the job's code, its reward server or the trainer failed
        result.update(steps=len(history), train_s=train_s, metrics=history,
                      reward_curve=[round(m["reward_mean"], 4) for m in history])
        tb = traceback.format_exception_only(type(exc), exc)
        log(f"failed after {len(history)} steps: {''.join(tb).strip()}")
        if getattr(exc, "stage", None) is None:  # not the job's code: keep where it broke
            log("".join(traceback.format_tb(exc.__traceback__)[-3:]).rstrip())
        return done("failed")


def _post_score(model, tokenizer, task, difficulty: int) -> tuple[float, int]:
    """Hidden eval of the trained weights, in this trusted process: (accuracy, items)."""
    from nestor.inner.evaluate import score_model
    from nestor.tasks.hidden import hidden_eval

    model.eval()
    scored = score_model(model, tokenizer, hidden_eval(task, difficulty=difficulty))
    return float(scored.accuracy), scored.n


def _save(model, tokenizer, out_dir: Path, config, request: JobRequest,
          history: list[dict]) -> Path:
    from nestor.inner.checkpoint import save_checkpoint

    out_dir.mkdir(parents=True, exist_ok=True)
    with (out_dir / "metrics.jsonl").open("w") as fh:
        for m in history:
            fh.write(json.dumps(m) + "\n")
    meta = {"task_id": request.task_id, "difficulty": request.difficulty,
            "job_dir": str(request.job_dir), "config": config.model_dump(),
            "steps": len(history)}
    return save_checkpoint(model, tokenizer, out_dir, meta=meta)
