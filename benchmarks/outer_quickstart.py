"""Quickstart benchmark: `nestor quickstart --seed S` for several seeds, one after another.

For each seed: wall time, steps, mean reward of the first 2 and last 2 steps, whether it rose,
and pool utilisation (busy worker-seconds / available, since the first job). Last line: JSON.
Run: .venv/bin/python benchmarks/outer_quickstart.py [SEEDS...]   (default: 0 1 2)
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NESTOR = Path(sys.executable).with_name("nestor")


def run_seed(seed: int, root: Path) -> dict:
    run_dir = root / f"quickstart-seed{seed}"
    t0 = time.monotonic()
    proc = subprocess.run([str(NESTOR), "quickstart", "--seed", str(seed), "--run-dir",
                           str(run_dir), "--json"], capture_output=True, text=True)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        return {"seed": seed, "error": proc.stderr.strip().splitlines()[-1:], "wall_s": wall}
    summary = json.loads(proc.stdout)
    return {"seed": seed, "wall_s": round(wall, 1), "steps": summary["steps"],
            "first2_reward": summary.get("first2_reward"),
            "last2_reward": summary.get("last2_reward"),
            "reward_rose": summary.get("reward_rose"),
            "pool_utilisation": summary.get("pool_utilisation"), "run_dir": str(run_dir)}


def main() -> None:
    seeds = [int(s) for s in sys.argv[1:]] or [0, 1, 2]
    root = Path(tempfile.mkdtemp(prefix="nestor-quickstart-"))
    results = []
    for seed in seeds:
        res = run_seed(seed, root)
        results.append(res)
        print(json.dumps(res), flush=True)
    held = sum(1 for r in results if r.get("reward_rose"))
    within = sum(1 for r in results if "error" not in r and r["wall_s"] <= 720)
    print(f"reward rose in {held} of {len(results)} seeds; {within} finished within 12 minutes")
    print(json.dumps({"seeds": seeds, "reward_rose": held, "within_12_min": within,
                      "runs": results}))


if __name__ == "__main__":
    main()
