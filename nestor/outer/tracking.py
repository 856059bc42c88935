"""Experiment tracking: every metrics.jsonl row (and every held-out evaluation) to TensorBoard
and/or Weights & Biases, configured by the run config's `[logging]` table.

Names follow what prime-rl and tinker-cookbook users know: `reward/mean`, `reward/std`,
`reward/<term>`, `env/<episode fact>`, `optim/<trainer stat>`, `loss/mean`, `entropy/mean`,
`async/<staleness>`, `perf/<pool>`, `cost/<usd>`, `time/total`, `progress/done_frac`,
`heldout/<arm>/mean`. Numbers only; lists (group ids, task ids) are not metrics.

Both backends are optional (`pip install 'nestor[tracking]'`); W&B defaults to offline mode,
which needs no network or account (`wandb sync RUN_DIR/wandb/offline-run-*` uploads later).
A logging failure mid-run is reported once and never stops training.
"""

from __future__ import annotations

import logging
import math
import uuid
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

log = logging.getLogger("nestor.tracking")

WANDB_ID_FILE = "wandb_id"


class LoggingConfig(BaseModel):
    """The `[logging]` table of a run config."""

    model_config = ConfigDict(extra="forbid")

    tensorboard: bool = Field(False, description="Write TensorBoard events to RUN_DIR/tensorboard/.")
    wandb: bool = Field(False, description="Log to Weights & Biases (files in RUN_DIR/wandb/).")
    wandb_mode: Literal["offline", "online", "disabled"] = Field(
        "offline", description="offline needs no network or account; `wandb sync` uploads later.")
    wandb_project: str = Field("nestor", min_length=1, max_length=128,
                               description="W&B project.")
    wandb_entity: str | None = Field(None, description="W&B entity (team or user); default yours.")
    wandb_tags: list[str] = Field(default_factory=list, description="W&B run tags.")


# metrics.jsonl key -> tracked name, for the scalar keys of nestor.outer.metrics.step_metrics
NAMES = {
    "reward_mean": "reward/mean", "reward_std": "reward/std",
    "validation_pass_rate": "env/validation_pass_rate", "mean_attempts": "env/mean_attempts",
    "first_try_pass_rate": "env/first_try_pass_rate",
    "episodes": "env/episodes", "jobs": "env/jobs", "job_failure_rate": "env/job_failure_rate",
    "hidden_eval_improvement": "env/hidden_eval_improvement",
    "hyperparameter_surface_use": "env/hyperparameter_surface_use",
    "malformed_tool_calls": "env/malformed_tool_calls",
    "groups": "async/groups", "groups_used": "async/groups_used",
    "zero_variance_groups": "async/zero_variance_groups",
    "stale_groups_kept": "async/stale_groups_kept",
    "stale_groups_dropped": "async/stale_groups_dropped",
    "staleness_mean": "async/staleness_mean", "staleness_max": "async/staleness_max",
    "episodes_in_flight": "async/episodes_in_flight",
    "pool_utilisation": "perf/pool_utilisation",
    "pool_utilisation_run": "perf/pool_utilisation_run",
    "cost_usd": "cost/step_usd", "cost_usd_total": "cost/total_usd",
    "elapsed_s": "time/total", "policy_version": "progress/policy_version",
}
# nested dicts: prefix per key
PREFIXES = {"reward_components": "reward/", "base_model_share": "env/base_model_share/",
            "end_reasons": "env/end_reason/", "counters": "counters/"}
TRAIN_NAMES = {"loss": "loss/mean", "entropy": "entropy/mean"}  # else optim/<key>


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    return None


def flatten(row: dict[str, Any], steps: int | None = None) -> dict[str, float]:
    """One metrics row as {tracked name: number}; unknown scalar keys go under `misc/`."""
    out: dict[str, float] = {}
    for key, value in row.items():
        if key == "step":
            continue
        if key in PREFIXES and isinstance(value, dict):
            for sub, v in value.items():
                if (n := _number(v)) is not None:
                    out[PREFIXES[key] + str(sub)] = n
        elif key == "train" and isinstance(value, dict):
            for sub, v in value.items():
                if (n := _number(v)) is not None:
                    out[TRAIN_NAMES.get(sub, f"optim/{sub}")] = n
        elif (n := _number(value)) is not None:
            out[NAMES.get(key, f"misc/{key}")] = n
    if steps and "step" in row:
        out["progress/done_frac"] = row["step"] / steps
    return out


def flatten_heldout(rows: list[dict[str, Any]]) -> dict[str, float]:
    """One held-out evaluation (rows of both arms) as heldout/<arm>/mean and per-task means."""
    out: dict[str, float] = {}
    by_arm: dict[str, list[dict]] = {}
    for row in rows:
        by_arm.setdefault(row["arm"], []).append(row)
        out[f"heldout/{row['arm']}/{row['task']}"] = float(row["mean"])
    for arm, arm_rows in by_arm.items():
        out[f"heldout/{arm}/mean"] = sum(r["mean"] for r in arm_rows) / len(arm_rows)
        out[f"heldout/{arm}/n"] = float(sum(r["n"] for r in arm_rows))
    if "trained" in by_arm and "untrained" in by_arm:
        out["heldout/transfer_gap"] = out["heldout/trained/mean"] - out["heldout/untrained/mean"]
    return out


class TrackingError(RuntimeError):
    """A backend asked for in [logging] cannot start; the message says how to get it."""


class Tracker:
    """Sends metric rows to the configured backends; a no-op when none is configured."""

    def __init__(self, config: LoggingConfig, run_dir: Path, *, name: str, steps: int,
                 run_config: dict[str, Any] | None = None):
        self.steps, self._writers, self._failed = steps, [], False
        run_dir = Path(run_dir)
        if config.tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise TrackingError("[logging] tensorboard = true needs the tensorboard package: "
                                    "pip install 'nestor[tracking]'") from None
            self._writers.append(_TensorBoard(SummaryWriter(str(run_dir / "tensorboard"))))
        if config.wandb and config.wandb_mode != "disabled":
            self._writers.append(_WandB(config, run_dir, name, run_config or {}))

    @property
    def active(self) -> bool:
        return bool(self._writers)

    def log_step(self, row: dict[str, Any]) -> None:
        self._send(flatten(row, self.steps), int(row["step"]))

    def log_heldout(self, rows: list[dict[str, Any]], step: int) -> None:
        if rows:
            self._send(flatten_heldout(rows), step)

    def _send(self, scalars: dict[str, float], step: int) -> None:
        for writer in self._writers:
            try:
                writer.log(scalars, step)
            except Exception as exc:  # tracking is a view of the run, never a reason to stop it
                if not self._failed:
                    log.warning("experiment tracking failed (%s: %s); metrics.jsonl still has "
                                "every row", type(exc).__name__, exc)
                self._failed = True

    def close(self) -> None:
        for writer in self._writers:
            try:
                writer.close()
            except Exception as exc:
                log.warning("closing experiment tracking failed: %s", exc)
        self._writers = []


class _TensorBoard:
    def __init__(self, writer):
        self.writer = writer

    def log(self, scalars: dict[str, float], step: int) -> None:
        for name, value in scalars.items():
            self.writer.add_scalar(name, value, global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class _WandB:
    def __init__(self, config: LoggingConfig, run_dir: Path, name: str, run_config: dict):
        try:
            import wandb
        except ImportError:
            raise TrackingError("[logging] wandb = true needs the wandb package: "
                                "pip install 'nestor[tracking]'") from None
        id_file = run_dir / WANDB_ID_FILE  # a resumed run continues the same W&B run
        run_id = id_file.read_text().strip() if id_file.is_file() else uuid.uuid4().hex[:8]
        id_file.write_text(run_id)
        self.run = wandb.init(project=config.wandb_project, entity=config.wandb_entity,
                              name=name, id=run_id, resume="allow", mode=config.wandb_mode,
                              dir=str(run_dir), tags=config.wandb_tags, config=run_config,
                              settings=wandb.Settings(silent=True, console="off"))
        self.run.define_metric("*", step_metric="outer_step")

    def log(self, scalars: dict[str, float], step: int) -> None:
        self.run.log({**scalars, "outer_step": step})

    def close(self) -> None:
        self.run.finish()
