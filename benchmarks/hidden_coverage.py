"""How much of each task's hidden eval an honest dataset holds by chance.

For every built-in task: the input space's size (estimated by capture-recapture over the task's
sampler), and the share of the 200 hidden items that honest datasets of 500, 2,000 and 10,000
draws hold by chance (docs/tasks.md). Runs under a throwaway secret (NESTOR_HIDDEN_SEED), so it
never touches the installation's own.

    .venv/bin/python benchmarks/hidden_coverage.py [--sizes 500 2000 10000]

The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets

os.environ["NESTOR_HIDDEN_SEED"] = secrets.token_hex(16)  # before anything reads the secret

from contamination_refusals import sampler_counts  # noqa: E402

from nestor.tasks import TaskRegistry  # noqa: E402
from nestor.tasks.hidden import DEFAULT_N  # noqa: E402


def space_size(ref, draws: int = 20_000) -> float:
    """Lincoln-Petersen: two samples of `draws`; inf when they share nothing."""
    rng_a, rng_b = random.Random(11), random.Random(12)
    a = {ref.task.sample(rng_a, 0) for _ in range(draws)}
    b = {ref.task.sample(rng_b, 0) for _ in range(draws)}
    both = len(a & b)
    return round(len(a) * len(b) / both) if both else float("inf")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[500, 2000, 10_000])
    args = ap.parse_args()
    rows = {}
    for ref in TaskRegistry().tasks(include_heldout=True):
        row = {"space": space_size(ref)}
        for size in args.sizes:
            counts = sampler_counts(ref, size)
            row[f"held_of_{DEFAULT_N}_at_{size}"] = round(sum(counts) / len(counts), 1)
        rows[ref.id] = row
        print(ref.id, row, flush=True)
    print(json.dumps({"hidden_n": DEFAULT_N, "difficulty": 0, "tasks": rows}))


if __name__ == "__main__":
    main()
