"""What goes into and comes out of one inner training job. Pool and agent speak these."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from nestor.inner.canary import CanaryConfig
from nestor.job.config import DEFAULT_TOKEN_BUDGET
from nestor.job.memory import DEFAULT_MEMORY_CAP_MB

JobStatus = Literal["ok", "invalid", "failed", "timeout", "lost"]


class JobRequest(BaseModel):
    job_dir: Path
    task_id: str
    difficulty: int = 0
    out_dir: Path | None = Field(None, description="Where the checkpoint goes; a temp dir if None.")
    token_budget: int = DEFAULT_TOKEN_BUDGET
    timeout_s: float = Field(600.0, gt=0)
    request_id: str = ""
    tasks_modules: list[str] = Field(default_factory=list)
    memory_cap_mb: int = Field(DEFAULT_MEMORY_CAP_MB, ge=64, description="Refuse (invalid) a "
                               "job whose estimated trainer peak is over this (job/memory.py).")
    max_steps: int | None = Field(None, ge=1, le=2000, description="Train this many steps "
                                  "instead of config.toml's max_steps (a smoke run; the job's "
                                  "files are not changed, nor copied).")
    canary: CanaryConfig = Field(default_factory=CanaryConfig, description="Canary replies "
                                 "mixed into the reward batches (inner/canary.py).")


class JobResult(BaseModel):
    status: JobStatus
    pre_score: float | None = None
    post_score: float | None = None
    improvement: float | None = None
    wall_s: float = 0.0
    train_s: float = 0.0
    steps: int = 0
    reward_curve: list[float] = Field(default_factory=list)
    checkpoint: str | None = None
    base_model: str | None = None
    cost_usd: float = 0.0
    worker: str | None = None
    log_tail: str = ""
    metrics: list[dict] = Field(default_factory=list, description="Per-step trainer metrics.")
    eval_n: int | None = Field(None, description="Hidden-eval items behind pre and post.")
    weight_change: float | None = Field(None, description="||Δθ||/||θ|| of the trained weights "
                                        "against the base, weight decay's own shrink removed, "
                                        "measured by the trusted side (inner/change.py); None "
                                        "when it was not measured. Recorded, not gated.")
    step_efficiency: float | None = Field(None, description="||Δθ|| / (lr · optimizer steps "
                                          "· sqrt(weights trained)): a weight's mean step in "
                                          "units of the learning rate (inner/change.py); "
                                          "None when it was not measured.")
    grid_steps: float | None = Field(None, description="The rms change of the weights the "
                                     "model computes with (LoRA: the merged delta) over the "
                                     "bottom of the base model's learning-rate grid: how many "
                                     "AdamW steps there they moved (inner/change.py). "
                                     "The reward pays validation and speed only when it and "
                                     "step_efficiency clear their floors.")
