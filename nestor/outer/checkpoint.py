"""One checkpoint per outer step: policy weights and optimizer (via `Policy.save`), version,
RNG states and the loop's in-flight bookkeeping.

Layout: RUN_DIR/checkpoints/step-NNNNNN/{policy/, state.json, rng.pt} and a `latest` file naming
the newest complete one. A checkpoint is written to a temp dir and renamed, and `latest` is
replaced atomically, so a kill at any moment leaves the previous checkpoint usable.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import torch

KEEP = 2  # older checkpoints are deleted; the journal and ledger keep the history


class CheckpointError(RuntimeError):
    """A run directory without a usable checkpoint or config."""


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def save_checkpoint(run_dir: Path, step: int, policy, state: dict[str, Any]) -> Path:
    root = run_dir / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    name = f"step-{step:06d}"
    tmp = root / f".{name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    policy.save(tmp / "policy")
    (tmp / "state.json").write_text(json.dumps(state), encoding="utf-8")
    torch.save({"torch": torch.get_rng_state(), "python": random.getstate()}, tmp / "rng.pt")
    final = root / name
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    _write_atomic(root / "latest", name)
    for old in sorted(p for p in root.glob("step-*") if p.is_dir())[:-KEEP]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(run_dir: Path) -> Path | None:
    marker = run_dir / "checkpoints" / "latest"
    if not marker.is_file():
        return None
    path = run_dir / "checkpoints" / marker.read_text(encoding="utf-8").strip()
    return path if (path / "state.json").is_file() else None


def load_checkpoint(path: Path, policy) -> dict[str, Any]:
    """Restore policy and RNGs from `path`; return the loop state saved with them."""
    try:
        state = json.loads((path / "state.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: unreadable checkpoint state: {exc}") from None
    policy.load(path / "policy")
    rng = torch.load(path / "rng.pt", weights_only=True)  # tensors and ints: no pickle
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    return state
