"""Inner backend that trains a job with prime-rl on a GPU worker.

Steps: render the job as prime-rl's `rl.toml` (nestor.job.export) with our output layout; install
the job's taskset package into the worker's environment (`pip install -e job/env`, configurable);
launch `rl @ rl.toml`; follow its log for step lines (progress, rewards); when it exits, take the
newest HF safetensors weights it wrote (merging a LoRA adapter onto the base model with peft),
and score them with the trusted hidden-eval scorer in this process.

The trust wall on a pod: prime-rl imports the agent's taskset in its own processes, as it must;
the hidden eval is generated and scored only here, after prime-rl has exited, from the weights as
tensors. Install prime-rl in its own environment, without nestor, so the job cannot import the
hidden generators (docs/cluster.md).
"""

from __future__ import annotations

import os
import queue
import re
import shutil
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

from nestor.inner.types import JobRequest, JobResult
from nestor.job.export import INFER_MEMORY_FRACTION, launch_env

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# prime-rl's orchestrator and trainer both log "Step N | 1.23s | Reward 0.41 | ..." style lines.
_STEP = re.compile(r"\bStep (\d+) \|")
_FIELD = re.compile(r"\b(Reward|Loss|Entropy|Throughput) (-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "vocab.json", "merges.txt", "chat_template.jinja", "added_tokens.json")


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


class StepLog:
    """Progress parsed from prime-rl's log: the highest step seen and per-step metrics."""

    def __init__(self) -> None:
        self.step = 0
        self.by_step: dict[int, dict[str, float]] = {}

    def feed(self, line: str) -> bool:
        """Parse one line; True when it advanced the step count."""
        m = _STEP.search(line)
        if not m:
            return False
        step = int(m.group(1))
        row = self.by_step.setdefault(step, {"step": step})
        for name, value in _FIELD.findall(line):
            row[name.lower()] = float(value)
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


def latest_weights(output_dir: Path) -> Path | None:
    """The newest `step_N` directory under `output_dir` holding safetensors (its own or in a
    `weight/` subdir, prime-rl's checkpoint layout); complete ones (a STABLE marker) first."""
    found = []
    for d in output_dir.rglob("step_*"):
        m = re.fullmatch(r"step_(\d+)", d.name)
        if not m or not d.is_dir():
            continue
        for w in (d, d / "weight"):
            if w.is_dir() and any(w.glob("*.safetensors")):
                stable = (d / "STABLE").exists() or (w / "STABLE").exists()
                found.append((stable, int(m.group(1)), str(w)))
    return Path(max(found)[2]) if found else None


def materialise_checkpoint(weights: Path, base_dir: Path, out: Path) -> Path:
    """A self-contained HF model dir at `out`: full weights plus the base tokenizer. A LoRA
    adapter on a float32 base is merged; on a bf16/fp16 base (Qwen3) it stays unmerged beside
    the base weights (merging into bf16 rounds part of the update away), and load_model applies
    it (nestor/models/registry.UNMERGED), so the model scored is the one prime-rl trained."""
    from nestor.models.registry import ADAPTER_DIR, UNMERGED, checkpoint_dtype

    out.mkdir(parents=True, exist_ok=True)
    (out / UNMERGED).unlink(missing_ok=True)
    adapter = (weights / "adapter_config.json").is_file()
    if adapter and checkpoint_dtype(base_dir) in ("bfloat16", "float16"):
        for f in base_dir.iterdir():
            if f.is_file() and (f.suffix == ".safetensors" or f.name.endswith(".json")):
                _link_or_copy(f, out / f.name)
        (out / ADAPTER_DIR).mkdir(exist_ok=True)
        for f in weights.iterdir():
            if f.is_file() and f.name != "STABLE":
                _link_or_copy(f, out / ADAPTER_DIR / f.name)
        (out / UNMERGED).write_text(f"apply {ADAPTER_DIR}/ to these base weights\n")
    elif adapter:
        from peft import PeftModel
        from transformers import AutoModelForCausalLM

        base = AutoModelForCausalLM.from_pretrained(base_dir, local_files_only=True)
        merged = PeftModel.from_pretrained(base, weights).merge_and_unload()
        merged.save_pretrained(out, safe_serialization=True)
    else:
        for f in weights.iterdir():
            if f.is_file() and f.name != "STABLE":
                _link_or_copy(f, out / f.name)
    for name in TOKENIZER_FILES:
        if (base_dir / name).is_file() and not (out / name).exists():
            shutil.copy2(base_dir / name, out / name)
    return out


def _link_or_copy(src: Path, dst: Path) -> None:
    dst.unlink(missing_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


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
    """The base model's hidden-eval accuracy, cached on disk by (model, weights, task, n)."""
    from nestor.inner.evaluate import evaluate

    return evaluate(model, [task_id], difficulty=difficulty, n=n, use_cache=True,
                    device=_eval_device())[0].accuracy


class _Proc:
    """A child in its own process group whose merged output is read by a thread."""

    def __init__(self, argv: list[str], cwd: Path, env: dict[str, str], log_path: Path):
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.log = log_path.open("a", encoding="utf-8")
        self.p = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
                                  errors="replace", bufsize=1, start_new_session=True)
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.p.stdout:
            self.log.write(line)
            self.log.flush()
            self.lines.put(_ANSI.sub("", line.rstrip("\n")))
        self.lines.put(None)

    def kill(self) -> None:
        if self.p.poll() is None:
            try:
                os.killpg(self.p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.p.wait()
        self.log.close()


def _run_install(argv: list[str], cwd: Path, env: dict, timeout: float, log: Path) -> str | None:
    """None on success, else an error line with the installer's last output."""
    try:
        done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True,
                              errors="replace", timeout=timeout, start_new_session=True)
    except FileNotFoundError:
        return f"installer not found: {argv[0]!r} (set install_command)"
    except subprocess.TimeoutExpired:
        return f"installing the taskset package took over {timeout:.0f}s"
    log.write_text(done.stdout + done.stderr, encoding="utf-8")
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
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
    try:
        base_dir = resolve_model_dir(job.base_model)
    except ModelNotFoundError:
        base_dir = None  # prime-rl fetches it by HF id; post-scoring then needs it too
    # The job's code runs under prime-rl: it gets no API keys of this process, nor the hidden
    # eval's secret (nestor.tasks.secret; its file is another matter: docs/sandbox.md).
    env = {**{k: v for k, v in os.environ.items()
              if not k.endswith("_API_KEY") and k not in ("NESTOR_HIDDEN_SEED", "NESTOR_HOME")},
           **config.env}
    gpus = config.gpus or visible_gpus(env)
    try:
        rl = render_config(job_dir, work / "outputs", str(base_dir) if base_dir else None,
                           gpus=gpus, inference_memory=config.inference_memory_fraction)
    except Exception as exc:  # the export reads agent-written files: any problem is the job's
        return result("invalid", log_tail=f"export to rl.toml failed: {exc}",
                      base_model=job.base_model)
    import tomli_w

    rl_toml = work / "rl.toml"
    rl_toml.write_text(tomli_w.dumps(rl), encoding="utf-8")
    env.update(launch_env(gpus, env.get("CUDA_VISIBLE_DEVICES")))

    argv = [a.replace("{env_dir}", str(job_dir / "env")) for a in config.install_command]
    if err := _run_install(argv, work, env, config.install_timeout_s, work / "install.log"):
        return result("failed", log_tail=err, base_model=job.base_model)

    log = StepLog()
    tail: deque[str] = deque(maxlen=config.tail_lines)
    proc = None
    status, why = "ok", ""
    t_train = time.monotonic()
    try:
        try:
            proc = _Proc([*config.command, "@", str(rl_toml)], work, env, work / "rl.log")
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

    weights = latest_weights(work / "outputs")
    if weights is None:
        return result("failed", log_tail="\n".join([*tail, "prime-rl exited 0 but wrote no "
                      f"safetensors weights under {work / 'outputs'}"]), **common)
    try:
        base_dir = base_dir or resolve_model_dir(job.base_model)
        ckpt = materialise_checkpoint(weights, base_dir, work / "checkpoint")
        # `ok` alone is not training: the reward reads the change measured here, on the
        # weights prime-rl wrote against the base (inner/change.py; one optimizer step a step)
        from nestor.inner.change import checkpoint_change

        change = checkpoint_change(ckpt, base_dir, job.learning_rate, log.step)
        common.update(weight_change=change.change, step_efficiency=change.efficiency)
        pre = pre_score(job.base_model, request.task_id, request.difficulty, config.eval_n)
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
    if warm is not None and hasattr(warm, "pre_score"):  # a warm worker caches pre-scores
        return run_prime_rl(request, config,
                            pre_score=lambda model, task, diff, n: warm.pre_score(model, task, diff))
    return run_prime_rl(request, config)
