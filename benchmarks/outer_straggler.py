"""Straggler benchmark: one episode of the first group is made 10x slower than the rest.

Prints how many policy updates the loop made while the straggler ran (a synchronous loop makes
none), the staleness its group was trained with, and pool-free wall times. Last line: JSON.
Uses the test bandit policy and a sleeping episode (no jobs), so it isolates the scheduler.
Run: .venv/bin/python benchmarks/outer_straggler.py
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "outer"))

from bandit import BanditPolicy, make_episode_fn  # noqa: E402

from nestor.outer.config import RunConfig  # noqa: E402
from nestor.outer.loop import OuterLoop  # noqa: E402


def main() -> None:
    delay, factor = 0.2, 10.0
    calls: list = []
    fn = make_episode_fn(delay=delay, slow={(0, 0): factor}, calls=calls,
                         reward_fn=lambda arm, t: float(t.slot))
    cfg = RunConfig(tasks=["a", "b", "c"], group_size=4, groups_per_step=1, max_in_flight=8,
                    steps=30, seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        policy = BanditPolicy()  # built first: torch.optim's first import takes seconds
        t0 = time.monotonic()
        loop = OuterLoop(cfg, policy, fn, Path(tmp))
        rows = loop.run()
        wall = time.monotonic() - t0
    straggler_step = next(r["step"] for r in rows if 0 in r["group_ids"])
    out = {"episode_s": delay, "straggler_s": delay * factor, "steps": len(rows),
           "updates_before_straggler_group": straggler_step - 1,
           "straggler_group_staleness": rows[straggler_step - 1]["staleness_max"],
           "wall_s": round(wall, 2),
           # a synchronous loop waits for every batch's slowest episode
           "synchronous_lower_bound_s": round(delay * factor + (cfg.steps - 1) * delay, 2)}
    print(f"{out['updates_before_straggler_group']} updates happened while the straggler ran; "
          f"its group was trained {out['straggler_group_staleness']} versions stale")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
