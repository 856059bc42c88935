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

import math
import os
import queue
import re
import signal
import socket
import subprocess
import tempfile
import threading
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
from nestor.inner.types import JobRequest, JobResult
from nestor.job.export import INFER_MEMORY_FRACTION, launch_env

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# prime-rl's orchestrator and trainer both log "Step N | 1.23s | Reward 0.41 | ..." style lines.
# The log is the job's to write: step numbers have at most 9 digits, values at most 64 chars.
_STEP = re.compile(r"\bStep (\d{1,9}) \|")
_FIELD = re.compile(r"\b(Reward|Loss|Entropy|Throughput) (-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)")
MAX_LINE = 4096  # characters of a log line kept (the rest of a longer line is dropped)
MAX_STEPS_KEPT = 100_000  # distinct steps a StepLog keeps metrics for


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


class StepLog:
    """Progress parsed from prime-rl's log: the highest step seen and per-step metrics. The
    log is the job's to write: steps past `max_step` (the job's max_steps), over-long numbers
    and non-finite values are ignored, and a line is read up to MAX_LINE characters."""

    def __init__(self, max_step: int | None = None) -> None:
        self.step = 0
        self.max_step = max_step
        self.by_step: dict[int, dict[str, float]] = {}

    def feed(self, line: str) -> bool:
        """Parse one line; True when it advanced the step count. Never raises."""
        line = line[:MAX_LINE]
        m = _STEP.search(line)
        if not m:
            return False
        step = int(m.group(1))
        if self.max_step is not None and step > self.max_step:
            return False
        if step not in self.by_step and len(self.by_step) >= MAX_STEPS_KEPT:
            return False
        row = self.by_step.setdefault(step, {"step": step})
        for name, text in _FIELD.findall(line):
            value = float(text) if len(text) <= 64 else math.inf
            if math.isfinite(value):  # inf/nan would make --json output non-standard
                row[name.lower()] = value
        advanced = step > self.step
        self.step = max(self.step, step)
        return advanced

    def rewards(self) -> list[float]:
        return [r["reward"] for _, r in sorted(self.by_step.items()) if "reward" in r]

    def metrics(self) -> list[dict]:
        return [r for _, r in sorted(self.by_step.items())]


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


class _Proc:
    """A child in its own process group whose merged output is read by a thread: lines cut at
    MAX_LINE characters, at most 10,000 waiting, the log file rotated past `max_log_bytes`
    (rl.log → rl.log.1), so a job that floods its output costs bounded memory and disk."""

    def __init__(self, argv: list[str], cwd: Path, env: dict[str, str], log_path: Path,
                 max_log_bytes: int = 64 * 2**20):
        self.lines: queue.Queue[str | None] = queue.Queue(maxsize=10_000)
        self.log_path, self.max_log_bytes = log_path, max_log_bytes
        self.log = log_path.open("a", encoding="utf-8")
        self.log_size = self.log.tell()
        self.closed = threading.Event()
        self._log_lock = threading.Lock()
        self.p = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
                                  errors="replace", bufsize=1, start_new_session=True)
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        out = self.p.stdout
        while line := out.readline(MAX_LINE):
            if len(line) >= MAX_LINE and not line.endswith("\n"):
                rest = line  # an over-long line: the rest of it is read and dropped
                while rest and not rest.endswith("\n"):
                    rest = out.readline(MAX_LINE)
                line += " [line cut]\n"
            self._write(line)
            self._put(_ANSI.sub("", line.rstrip("\n")))
        self._put(None)

    def _write(self, line: str) -> None:
        with self._log_lock:
            if not self.closed.is_set():
                self._write_locked(line)

    def _write_locked(self, line: str) -> None:
        if self.log_size + len(line) > self.max_log_bytes:
            self.log.close()
            os.replace(self.log_path, self.log_path.with_name(self.log_path.name + ".1"))
            self.log = self.log_path.open("w", encoding="utf-8")
            self.log_size = 0
        self.log.write(line)
        self.log.flush()
        self.log_size += len(line.encode("utf-8", "replace"))

    def _put(self, item: str | None) -> None:
        while not self.closed.is_set():
            try:
                self.lines.put(item, timeout=0.5)
                return
            except queue.Full:
                continue

    def kill(self) -> None:
        if self.p.poll() is None:
            try:
                os.killpg(self.p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.p.wait()
        with self._log_lock:
            self.closed.set()
            self.log.close()


def _run_install(argv: list[str], cwd: Path, env: dict, timeout: float, log: Path) -> str | None:
    """None on success, else an error line with the installer's last output (it runs the job
    package's build hooks: its output goes to `log`, and only its last 64 KiB is read back)."""
    try:
        with log.open("wb") as fh:
            done = subprocess.run(argv, cwd=cwd, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, timeout=timeout,
                                  start_new_session=True)
    except FileNotFoundError:
        return f"installer not found: {argv[0]!r} (set install_command)"
    except subprocess.TimeoutExpired:
        return f"installing the taskset package took over {timeout:.0f}s"
    if done.returncode != 0:
        with log.open("rb") as fh:
            fh.seek(max(0, log.stat().st_size - 65536))
            text = fh.read().decode("utf-8", "replace")
        tail = "\n".join(line[:MAX_LINE] for line in text.strip().splitlines()[-15:])
        return f"installing the taskset package failed (exit {done.returncode}):\n{tail}"
    return None


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
    if err := _run_install(argv, work, env, config.install_timeout_s, work / "install.log"):
        return result("failed", log_tail=err, base_model=job.base_model)

    log = StepLog(max_step=job.max_steps)
    tail: deque[str] = deque(maxlen=config.tail_lines)
    proc = None
    status, why = "ok", ""
    t_train = time.monotonic()
    try:
        try:
            proc = _Proc([*config.command, "@", str(rl_toml)], work, env, work / "rl.log",
                         config.max_log_bytes)
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
                                   lowest_lr(job.base_model, job.lora_rank > 0))
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
