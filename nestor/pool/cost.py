"""The cost matrix: seconds and dollars per reference job for each worker type x base model.

`nestor bench matrix` measures it and stores it as JSON in the cache dir; the dispatcher reads it
to rank worker types. A worker's cost is wall time on it times its price per hour.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError

from nestor.pool.config import WorkerType

MATRIX_VERSION = 1


def job_cost(worker_type: WorkerType, seconds: float) -> float:
    """Dollars for holding one worker of this type for `seconds`."""
    return worker_type.price_per_hour * max(0.0, seconds) / 3600.0


class MatrixEntry(BaseModel):
    worker_type: str
    base_model: str
    seconds: float = Field(..., ge=0,
                           description="Wall seconds of the reference job on one worker.")
    dollars: float = Field(..., ge=0, description="seconds x price_per_hour / 3600.")
    status: str = Field("ok", description="The reference job's status; only 'ok' rows rank types.")


class CostMatrix(BaseModel):
    version: int = MATRIX_VERSION
    backend: str = "local"
    reference_job: str = ""
    measured_at: float = Field(default_factory=time.time)
    entries: list[MatrixEntry] = Field(default_factory=list)

    def get(self, worker_type: str, base_model: str) -> MatrixEntry | None:
        for e in self.entries:
            if e.worker_type == worker_type and e.base_model == base_model and e.status == "ok":
                return e
        return None

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(self.model_dump_json(indent=2), encoding="utf-8")
        tmp.replace(path)  # atomic: a reader never sees half a matrix

    @classmethod
    def load(cls, path: Path) -> CostMatrix | None:
        """The stored matrix, or None when there is none or it is unreadable (then ranking falls
        back to price per hour: a stale or corrupt cache must never stop the pool)."""
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            matrix = cls.model_validate(data)
        except (OSError, ValueError, ValidationError):
            return None
        return matrix if matrix.version == MATRIX_VERSION else None
