"""Measure the cost matrix: one reference job per (worker type x base model present).

The reference job is a real job directory with its base model swapped and its steps capped, so
every cell trains the same thing. Each cell runs pinned to its worker type on a pool with one
worker per type; locally the cells run one at a time (they would share the cores), on Ray each
model's cells run on all types at once.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from nestor.inner.types import JobRequest
from nestor.pool.config import PoolConfig
from nestor.pool.cost import CostMatrix, MatrixEntry, job_cost


def present_models(names: list[str]) -> tuple[list[str], dict[str, str]]:
    """Split registry names into those whose weights are here and those absent (with why)."""
    from nestor.models.registry import ModelNotFoundError, resolve_model_dir

    present, absent = [], {}
    for name in names:
        try:
            resolve_model_dir(name)
            present.append(name)
        except ModelNotFoundError as exc:
            absent[name] = str(exc).splitlines()[0]
    return present, absent


def candidate_models(config: PoolConfig, requested: list[str] | None) -> list[str]:
    if requested:
        return list(dict.fromkeys(requested))
    listed = [m for t in config.types() for m in t.models]
    if listed and all(t.models for t in config.types()):
        return list(dict.fromkeys(listed))
    from nestor.models.registry import MODEL_NAMES

    return list(MODEL_NAMES)


def reference_job(src: Path, base_model: str, max_steps: int, dest: Path) -> Path:
    """A copy of `src` training `base_model` for at most `max_steps` steps."""
    from nestor.job.config import load_job_config
    from nestor.job.safe_read import copy_tree
    from nestor.job.scaffold import config_toml

    copy_tree(src, dest)  # no link followed, no special file opened (raises UnsafeFileError)
    cfg = load_job_config(src / "config.toml")
    cfg = cfg.model_copy(update={"base_model": base_model,
                                 "max_steps": min(cfg.max_steps, max_steps)})
    (dest / "config.toml").write_text(config_toml(cfg), encoding="utf-8")
    return dest


def measure_matrix(config: PoolConfig, job_dir: Path, task_id: str, models: list[str],
                   *, max_steps: int = 3, timeout_s: float = 900.0,
                   on_row: Callable[[dict], None] | None = None) -> tuple[CostMatrix, list[dict]]:
    """Run the reference job per (type x model); returns the matrix and one row per cell
    (including cells that could not run: status 'absent' or the job's own status)."""
    from nestor.pool.base import make_pool

    one_each = [t.model_copy(update={"max_workers": 1}) for t in config.types()]
    pool = make_pool(config.model_copy(update={"worker_types": one_each}))
    rows: list[dict] = []

    def emit(row: dict) -> None:
        rows.append(row)
        if on_row is not None:
            on_row(row)

    absent_types = set(getattr(pool, "absent", lambda: [])())
    try:
        with tempfile.TemporaryDirectory(prefix="nestor-matrix-") as tmp:
            for model in models:
                cells = []
                for t in one_each:
                    if not t.runs(model):
                        continue
                    if t.name in absent_types:
                        emit({"worker_type": t.name, "base_model": model, "status": "absent",
                              "seconds": None, "dollars": None,
                              "note": "no node of the cluster offers its resources"})
                        continue
                    job = reference_job(job_dir, model, max_steps, Path(tmp) / f"{t.name}-{model}")
                    req = JobRequest(job_dir=job, task_id=task_id, timeout_s=timeout_s,
                                     out_dir=Path(tmp) / f"out-{t.name}-{model}")
                    cells.append((t, pool.submit(req, worker_type=t.name)))
                    if config.backend == "local":  # local cells would share the cores
                        cells[-1] = (t, _done(cells[-1][1]))
                for t, fut in cells:
                    r = fut.result()
                    why = "" if r.status == "ok" else (r.log_tail.splitlines() or [""])[-1]
                    emit({"worker_type": t.name, "base_model": model, "status": r.status,
                          "seconds": round(r.wall_s, 3),
                          "dollars": round(job_cost(t, r.wall_s), 6),
                          "note": why})
    finally:
        pool.shutdown()
    entries = [MatrixEntry(worker_type=r["worker_type"], base_model=r["base_model"],
                           seconds=r["seconds"], dollars=r["dollars"], status=r["status"])
               for r in rows if r["seconds"] is not None]
    matrix = CostMatrix(backend=config.backend, reference_job=str(job_dir),
                        measured_at=time.time(), entries=entries)
    return matrix, rows


def _done(future):
    future.result()
    return future
