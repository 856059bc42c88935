"""Inner backend that trains a job with prime-rl on a GPU worker.

Steps: render the job as prime-rl's `rl.toml` (nestor.job.export) with our output layout; install
the job's taskset package into the worker's environment (`pip install -e job/env`, configurable);
launch `rl @ rl.toml`; follow its log for step lines (progress, rewards); when it exits, take the
newest HF safetensors weights it wrote (merging a LoRA adapter onto the base model with peft),
and score them with the trusted hidden-eval scorer in this process.

The trust wall on a pod: prime-rl imports the agent's taskset in its own processes, as it must,
unsandboxed, as the worker's user; so everything under its run directory and every line it logs
is treated as written by an adversary. The base model's pre-score is taken before any of the
job's code runs (the install included) and held in memory; the scored checkpoint is the base
model's own config, tokenizer and chat template plus only the weights prime-rl wrote; the hidden
eval is generated and scored only here, after prime-rl has exited. Install prime-rl in its own
environment, without nestor, so the job cannot import the hidden generators; what remains
open without a separate user is in docs/cluster.md ("Trust on a pod").
"""

from __future__ import annotations

import os
import queue
import socket
import tempfile
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, Field

from nestor.inner.prime_rl_checkpoint import (
    file_ids,
    latest_weights,
    materialise_checkpoint,
    trusted_files,
)
from nestor.inner.prime_rl_log import LoggedProcess, StepLog, run_install
from nestor.inner.types import JobRequest, JobResult
from nestor.job.export import INFER_MEMORY_FRACTION, launch_env


class PrimeRLConfig(BaseModel):
    command: list[str] = Field(["rl"], min_length=1, description="prime-rl's launcher; run as "
                               "`<command> @ rl.toml` (e.g. ['uv', 'run', 'rl']).")
    install_command: list[str] = Field(
        ["pip", "install", "-e", "{env_dir}"], min_length=1,
        description="Installs the job's taskset package into prime-rl's environment; "
        "`{env_dir}` is replaced by the job's env/ directory.")
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment for both.")
    install_timeout_s: float = Field(600, gt=0)
    startup_timeout_s: float = Field(900, gt=0, description="Longest wait for the first step "
                                     "line (model load, vLLM start-up).")
    stall_timeout_s: float = Field(300, gt=0, description="Longest wait between step advances; "
                                   "past it the job ends with status timeout.")
    gpus: int = Field(0, ge=0, description="GPUs prime-rl may use on this worker; 0 = those "
                      "visible to it (CUDA_VISIBLE_DEVICES, else all). On one, trainer and vLLM "
                      "share it; on more, vLLM takes one and the trainer the rest.")
    inference_memory_fraction: float = Field(
        INFER_MEMORY_FRACTION, gt=0, lt=1, description="Share of a GPU shared by trainer and "
        "vLLM that vLLM reserves (inference.vllm.gpu_memory_utilization).")
    eval_n: int = Field(200, ge=1, description="Hidden-eval items for the pre/post scores.")
    tail_lines: int = Field(40, ge=1, le=1000)
    max_log_bytes: int = Field(64 * 2**20, ge=4096, description="rl.log is rotated to rl.log.1 "
                               "past this size: at most twice it is kept on disk.")


def render_config(job_dir: Path, output_dir: Path, model_path: str | None = None, *,
                  gpus: int = 1, inference_memory: float = INFER_MEMORY_FRACTION) -> dict:
    """The job's rl.toml as a dict for a worker with `gpus` GPUs, pointed at `output_dir`
    with weights written to disk."""
    from nestor.job.export import to_prime_rl

    rl = to_prime_rl(job_dir, gpus=gpus, inference_memory=inference_memory)
    rl["output_dir"] = str(output_dir)
    rl["run"] = {**rl.get("run", {}), "name": "nestor"}
    rl["clean"] = True
    # Filesystem broadcast leaves HF safetensors under <run>/broadcasts/step_N (NCCL, the
    # default without LoRA, leaves nothing to score).
    rl["weight_broadcast"] = {"type": "filesystem"}
    if model_path:  # weights already on the worker: no download at start-up
        rl.setdefault("model", {})["name"] = model_path
    return rl


def visible_gpus(env: dict[str, str]) -> int:
    """GPUs this worker may use: those in CUDA_VISIBLE_DEVICES (Ray sets it for a GPU actor),
    else all torch sees; at least 1 (prime-rl itself refuses to start without one)."""
    ids = env.get("CUDA_VISIBLE_DEVICES")
    if ids is not None:
        return max(1, len([i for i in ids.split(",") if i.strip()]))
    try:
        import torch

        return max(1, torch.cuda.device_count())
    except Exception:
        return 1


Scorer = Callable[[str, str, int, int], float]  # (model name or dir, task id, difficulty, n)


def _eval_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def trusted_score(model: str, task_id: str, difficulty: int, n: int) -> float:
    """Hidden-eval accuracy, computed in this (trusted) process, on the worker's GPU if any."""
    from nestor.inner.evaluate import evaluate

    return evaluate(model, [task_id], difficulty=difficulty, n=n, use_cache=False,
                    device=_eval_device())[0].accuracy


def trusted_pre_score(model: str, task_id: str, difficulty: int, n: int) -> float:
    """The base model's hidden-eval accuracy as `trusted_score` computes it (same device and
    dtype), remembered in this process and in the keyed disk cache (evaluate.keyed_pre_score:
    entries carry a MAC, so one a job rewrote is recomputed). run_prime_rl calls it before any
    of the job's code runs, and frees the GPU memory it used before prime-rl starts."""
    import gc

    from nestor.inner.evaluate import keyed_pre_score

    device = _eval_device()
    try:
        return keyed_pre_score(model, task_id, difficulty=difficulty, n=n,
                               device=device).accuracy
    finally:
        gc.collect()
        if device == "cuda":
            import torch

            torch.cuda.empty_cache()  # vLLM sizes itself by the GPU memory it finds free


def run_prime_rl(request: JobRequest, config: PrimeRLConfig | None = None, *,
                 score: Scorer = trusted_score, pre_score: Scorer = trusted_pre_score,
                 on_step: Callable[[int, dict], None] | None = None) -> JobResult:
    """Train `request.job_dir` with prime-rl and score the result. Never raises for job
    problems: a bad job is `invalid`, a crash `failed`, no progress or overrun `timeout`."""
    from nestor.job.config import JobConfigError, load_job_config
    from nestor.models.registry import ModelNotFoundError, resolve_model_dir

    config = config or PrimeRLConfig()
    t0 = time.monotonic()
    job_dir = Path(request.job_dir).resolve()
    work = Path(request.out_dir or tempfile.mkdtemp(prefix="nestor-prime-rl-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    worker = socket.gethostname()

    def result(status, **kw) -> JobResult:
        return JobResult(status=status, wall_s=time.monotonic() - t0, worker=worker, **kw)

    try:
        job = load_job_config(job_dir / "config.toml")
    except JobConfigError as exc:
        return result("invalid", log_tail=str(exc))
    if err := job.budget_error(request.token_budget):
        return result("invalid", log_tail=err, base_model=job.base_model)
    try:  # on the worker before the job runs: a copy prime-rl fetched would be the job's
        base_dir = resolve_model_dir(job.base_model)
    except ModelNotFoundError as exc:
        return result("failed", log_tail=f"the base model is not on this worker ({exc}); the "
                      "prime-rl backend scores it before the job's code runs",
                      base_model=job.base_model)
    # The job's code runs under prime-rl: it gets no API keys of this process, nor the hidden
    # eval's secret (nestor.tasks.secret; its file is another matter: docs/sandbox.md).
    env = {**{k: v for k, v in os.environ.items()
              if not k.endswith("_API_KEY") and k not in ("NESTOR_HIDDEN_SEED", "NESTOR_HOME")},
           **config.env}
    gpus = config.gpus or visible_gpus(env)
    try:
        rl = render_config(job_dir, work / "outputs", str(base_dir),
                           gpus=gpus, inference_memory=config.inference_memory_fraction)
    except Exception as exc:  # the export reads agent-written files: any problem is the job's
        return result("invalid", log_tail=f"export to rl.toml failed: {exc}",
                      base_model=job.base_model)
    import tomli_w

    rl_toml = work / "rl.toml"
    rl_toml.write_text(tomli_w.dumps(rl), encoding="utf-8")
    env.update(launch_env(gpus, env.get("CUDA_VISIBLE_DEVICES")))

    # Before any of the job's code runs (its package's build hooks included): the pre-score,
    # held in memory for this job, and the base model's config/tokenizer files and file
    # identities. Nothing prime-rl's processes could have rewritten is read for scoring later.
    try:
        pre = pre_score(job.base_model, request.task_id, request.difficulty, config.eval_n)
        trusted = trusted_files(base_dir)
        base_files = file_ids(base_dir)
    except Exception as exc:
        return result("failed", log_tail=f"pre-scoring the base model failed: "
                      f"{type(exc).__name__}: {exc}", base_model=job.base_model)

    argv = [a.replace("{env_dir}", str(job_dir / "env")) for a in config.install_command]
    if err := run_install(argv, work, env, config.install_timeout_s, work / "install.log"):
        return result("failed", log_tail=err, base_model=job.base_model)

    log = StepLog(max_step=job.max_steps)
    tail: deque[str] = deque(maxlen=config.tail_lines)
    proc = None
    status, why = "ok", ""
    t_train = time.monotonic()
    try:
        try:
            proc = LoggedProcess([*config.command, "@", str(rl_toml)], work, env,
                                 work / "rl.log", config.max_log_bytes)
        except FileNotFoundError:
            return result("failed", log_tail=f"prime-rl launcher not found: "
                          f"{config.command[0]!r} (install prime-rl or set command)",
                          base_model=job.base_model)
        last_progress = time.monotonic()
        while True:
            try:
                line = proc.lines.get(timeout=0.2)
            except queue.Empty:
                line = ""
            if line is None:
                break
            if line:
                tail.append(line)
                if log.feed(line):
                    last_progress = time.monotonic()
                    if on_step:
                        on_step(log.step, log.by_step[log.step])
            now = time.monotonic()
            limit = config.stall_timeout_s if log.step else config.startup_timeout_s
            if now - last_progress > limit:
                status, why = "timeout", (f"no progress for {limit:g}s (last step "
                                          f"{log.step}); prime-rl killed")
                break
            if now - t0 > request.timeout_s:
                status, why = "timeout", f"job ran past its {request.timeout_s:g}s budget"
                break
    finally:
        if proc is not None:
            proc.kill()
    train_s = time.monotonic() - t_train
    common = dict(base_model=job.base_model, steps=log.step, reward_curve=log.rewards(),
                  metrics=log.metrics(), train_s=train_s)
    if status == "ok" and proc.p.returncode != 0:
        status, why = "failed", f"prime-rl exited with code {proc.p.returncode}"
    if status != "ok":
        return result(status, log_tail="\n".join([*tail, why]), **common)

    if file_ids(base_dir) != base_files:
        return result("failed", log_tail="\n".join([*tail, f"the base model's files in "
                      f"{base_dir} changed while the job ran"]), **common)
    weights = latest_weights(work / "outputs", max_steps=job.max_steps)
    if weights is None:
        return result("failed", log_tail="\n".join([*tail, "prime-rl exited 0 but wrote no "
                      f"safetensors weights under {work / 'outputs'}"]), **common)
    try:
        ckpt = materialise_checkpoint(weights, base_dir, work / "checkpoint", trusted)
        # `ok` alone is not training: the reward reads the change measured here, on the
        # weights prime-rl wrote against the base (inner/change.py; one optimizer step a step)
        from nestor.inner.change import checkpoint_change, lowest_lr

        change = checkpoint_change(ckpt, base_dir, job.learning_rate, log.step,
                                   lowest_lr(job.base_model))
        common.update(weight_change=change.change, step_efficiency=change.efficiency,
                      grid_steps=change.grid_steps)
        post = score(str(ckpt), request.task_id, request.difficulty, config.eval_n)
    except Exception as exc:  # unreadable weights are the job's failure, not the harness's
        return result("failed", log_tail="\n".join([*tail, f"scoring the weights failed: "
                      f"{type(exc).__name__}: {exc}"]), **common)
    return result("ok", pre_score=pre, post_score=post, improvement=post - pre,
                  checkpoint=str(ckpt), log_tail="\n".join(tail), **common)


def load_prime_rl_config(path: Path | None = None) -> PrimeRLConfig:
    """The `[prime_rl]` table of $NESTOR_TOML, else ./nestor.toml (optional: defaults). A Ray
    worker's cwd is Ray's, so pods point NESTOR_TOML at the file their setup wrote."""
    import tomllib

    from nestor.config import settings_file

    path = path or (Path(os.environ["NESTOR_TOML"]) if os.environ.get("NESTOR_TOML")
                    else settings_file())
    if path is None or not path.is_file():
        return PrimeRLConfig()
    return PrimeRLConfig.model_validate(tomllib.loads(path.read_text()).get("prime_rl", {}))


def run_job(request: JobRequest, *, warm=None, config: PrimeRLConfig | None = None) -> JobResult:
    """Same call shape as nestor.inner.run.run_job, so a pool runs this backend with
    `job_fn = "nestor.inner.prime_rl:run_job"` (config from nestor.toml's [prime_rl])."""
    try:
        config = config or load_prime_rl_config()
    except Exception as exc:  # a bad [prime_rl] table fails the job with the reason
        return JobResult(status="failed", log_tail=f"nestor.toml [prime_rl]: {exc}")
    # Not a warm worker's pre-score: its disk cache is the one a job can rewrite, and its model
    # may sit on another device or dtype than trusted_score's (trusted_pre_score remembers
    # its scores in this process instead).
    return run_prime_rl(request, config)
