"""Pool configuration: which backend, which worker types, and what a worker runs.

Read from the `[pool]` table of `nestor.toml` (optional) or built in code; every field has a
default, so `PoolConfig()` is the embedded local pool on this machine's cores.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from nestor.config import validation_problems

DEFAULT_JOB_FN = "nestor.inner.run:run_job"
DEFAULT_WARM_STATE = "nestor.inner.run:WarmState"


def usable_cpus() -> int:
    """CPUs this process may run on (a container's or taskset's limit, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def default_workers() -> int:
    return max(1, min(usable_cpus(), 16))


class WorkerType(BaseModel):
    """One kind of worker: what it costs, what it asks the cluster for, which models it runs."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(..., pattern=r"^[A-Za-z0-9_.:-]{1,64}$", description="Short id, e.g. 'a40'.")
    price_per_hour: float = Field(0.0, ge=0.0, le=1000.0, description="Dollars per worker-hour.")
    num_cpus: float = Field(1.0, ge=0.0, le=256.0,
                            description="Ray CPUs per worker (ignored locally).")
    num_gpus: float = Field(0.0, ge=0.0, le=16.0,
                            description="Ray GPUs per worker (ignored locally).")
    resources: dict[str, float] = Field(
        default_factory=dict, description="Ray custom resources per worker, e.g. "
        "{'worker:a40': 1}; only nodes that advertise them host this type.")
    models: list[str] = Field(
        default_factory=list, description="Base models this type can run; empty = any.")
    max_workers: int = Field(1, ge=1, le=1024, description="Most workers of this type at once.")
    device: str | None = Field(
        None, pattern=r"^(cpu|cuda(:\d+)?|mps)$", description="Torch device the built-in "
        "trainer and scorer use; default 'cuda' when num_gpus > 0, else 'cpu'.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] | None = Field(
        None, description="Weights dtype of base models on this type; default float32 on a "
        "CPU and the checkpoint's own (bf16 for Qwen3) on a GPU. Full fine-tunes keep float32 "
        "master weights whatever this is.")

    def runs(self, base_model: str | None) -> bool:
        return not self.models or base_model is None or base_model in self.models

    def torch_device(self) -> str:
        return self.device or ("cuda" if self.num_gpus > 0 else "cpu")

    def warm_kwargs(self) -> dict[str, str]:
        """Keyword arguments for the warm state (WarmState(device=..., dtype=...)); empty on the
        CPU default, so a custom warm_state class need not take them."""
        out = {}
        if self.torch_device() != "cpu":
            out["device"] = self.torch_device()
        if self.dtype is not None:
            out["dtype"] = self.dtype
        return out


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker is started with (pickled to a spawned process or a Ray actor)."""

    job_fn: str  # 'module:function' run per job
    warm_state: str | None  # 'module:Class' built once, passed to every job as warm=
    threads: int  # torch / OpenMP threads
    python_path: tuple[str, ...] = ()  # extra import paths
    preload: tuple[str, ...] = ()  # base models the warm state loads before the worker is ready
    warm_kwargs: tuple[tuple[str, str], ...] = ()  # the warm state's device / dtype, if not CPU


class PoolConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    backend: Literal["local", "ray"] = Field("local", description="Local worker processes or Ray.")
    workers: int | None = Field(
        None, ge=1, le=1024, description="Workers when no worker_types are given "
        "(local default: this machine's cores, at most 16; Ray default: the cluster's CPUs).")
    worker_types: list[WorkerType] = Field(
        default_factory=list, description="Kinds of worker with prices; empty = one free type "
        "('local' or 'ray-cpu') that runs any model.")
    address: str = Field("auto",
                         description="Ray cluster: 'auto', 'host:port' or 'ray://host:port'.")
    connect_timeout_s: float = Field(10.0, gt=0, le=300,
                                     description="Give up reaching Ray after this many seconds.")
    job_fn: str = Field(DEFAULT_JOB_FN, description="'module:function' each worker runs per job.")
    warm_state: str | None = Field(
        DEFAULT_WARM_STATE, description="'module:Class' built once per worker and passed to every "
        "job as warm= (loaded models, tokenizers, pre-scores); None = no warm state.")
    max_retries: int = Field(2, ge=0, le=10, description="Re-runs of a job whose worker died.")
    timeout_grace_s: float = Field(
        30.0, ge=0.0, le=3600, description="Seconds past a job's own timeout_s before the pool "
        "kills its worker (the job may stop itself cleanly first).")
    placement_timeout_s: float = Field(
        600.0, gt=0, le=86400, description="A job that only absent worker types (no node offers "
        "their resources) can run fails after waiting this long for one to join.")
    threads_per_worker: int | None = Field(
        None, ge=1, le=256, description="Torch/OMP threads per worker; default cores / workers.")
    python_path: list[str] = Field(
        default_factory=list, description="Extra import paths on every worker (for a job_fn or "
        "warm_state outside installed packages).")
    preload_models: list[str] = Field(
        default_factory=lambda: ["tiny-s", "tiny-m"], description="Base models each worker "
        "loads (with the sandboxed reward host) before it reports ready, so that no job pays "
        "the start-up; those absent here, or that a worker type cannot run, are skipped.")
    cost_matrix: Path | None = Field(
        None, description="Cost matrix JSON; default <cache_dir>/cost_matrix.json.")

    @model_validator(mode="after")
    def _unique_names(self) -> PoolConfig:
        names = [t.name for t in self.worker_types]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"worker_types: duplicate name(s) {', '.join(dupes)}")
        return self

    def worker_spec(self, wtype: WorkerType, threads: int) -> WorkerSpec:
        """What a worker of `wtype` is started with."""
        return WorkerSpec(self.job_fn, self.warm_state, threads, tuple(self.python_path),
                          tuple(m for m in self.preload_models if wtype.runs(m)),
                          tuple(sorted(wtype.warm_kwargs().items())))

    def types(self, cluster_cpus: int | None = None) -> list[WorkerType]:
        """The configured worker types, or the one default type of this backend."""
        if self.worker_types:
            return list(self.worker_types)
        if self.backend == "local":
            return [WorkerType(name="local", max_workers=self.workers or default_workers())]
        return [WorkerType(name="ray-cpu", max_workers=self.workers or max(1, cluster_cpus or 1))]

    def matrix_path(self) -> Path:
        if self.cost_matrix is not None:
            return self.cost_matrix
        from nestor.config import load_settings

        return load_settings().cache_dir / "cost_matrix.json"


class PoolConfigError(ValueError):
    """The [pool] table is not valid; the message says what to fix."""


def load_pool_config(path: Path | None = None, **overrides) -> PoolConfig:
    """`[pool]` from nestor.toml (if present), with non-None keyword overrides on top."""
    from nestor.config import settings_file

    path = path or settings_file()
    data: dict = {}
    if path is not None and path.is_file():
        try:
            data = dict(tomllib.loads(path.read_text(encoding="utf-8")).get("pool", {}))
        except tomllib.TOMLDecodeError as exc:
            raise PoolConfigError(f"{path}: not valid TOML: {exc}") from None
    data.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return PoolConfig.model_validate(data)
    except ValidationError as exc:
        problems = validation_problems(exc)
        raise PoolConfigError(f"pool config: {problems}") from None
