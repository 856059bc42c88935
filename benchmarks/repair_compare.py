"""Two adapters' repairs on the same held-out cases, paired: who fixed which.

repair_eval.py draws the same cases (composer jobs, slips) for any agent at one --seed, so two
arms can be compared case by case instead of rate against rate. A case counts where both arms'
probes caught its slip; a pair where exactly one arm repaired is a discordant pair, and under no
difference between the arms each such pair is a fair coin (exact McNemar). Since each case is
acted once per arm, discordant pairs are many even between equal arms: the test says so.

    python benchmarks/repair_compare.py --a runs/r/warm.json runs/r/warm-s1.json \\
        --b runs/r/rl.json runs/r/rl-s1.json

Each file is a repair_eval run's output (its last JSON line, with its rows). Prints both arms'
repairs on the shared cases, the discordant pairs, the McNemar p and, for contrast, the Fisher p
of the same counts unpaired; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from lm_arc_report import fisher_p, mcnemar_p


def load_rows(paths: list[Path]) -> dict[tuple, dict[str, Any]]:
    """(episode seed, task, kind) -> row, over one arm's repair_eval outputs."""
    rows: dict[tuple, dict[str, Any]] = {}
    for path in paths:
        lines = [x for x in path.read_text(encoding="utf-8").splitlines() if x.startswith("{")]
        if not lines or "rows" not in (out := json.loads(lines[-1])):
            raise SystemExit(f"{path}: no repair_eval rows in its last JSON line (outputs "
                             "before 2026-12-07 carry none: run repair_eval.py again)")
        for row in out["rows"]:
            key = (row["episode_seed"], row["task"], row["kind"])
            if key in rows:
                raise SystemExit(f"{path}: case {key} already read for this arm; give each "
                                 "--seed's run once")
            rows[key] = row
    return rows


def compare(a: dict[tuple, dict], b: dict[tuple, dict]) -> dict[str, Any]:
    shared = [k for k in a if k in b and a[k]["caught"] and b[k]["caught"]]
    if not shared:
        raise SystemExit("the two arms share no caught case: were they run with the same "
                         "--seed, --tasks and --kinds?")
    ka = sum(a[k]["repaired"] for k in shared)
    kb = sum(b[k]["repaired"] for k in shared)
    only_a = sum(a[k]["repaired"] and not b[k]["repaired"] for k in shared)
    only_b = sum(b[k]["repaired"] and not a[k]["repaired"] for k in shared)
    n = len(shared)
    return {"cases": n, "repaired_a": ka, "repaired_b": kb, "only_a": only_a, "only_b": only_b,
            "mcnemar_p": mcnemar_p(only_a, only_b), "fisher_p_unpaired": fisher_p(ka, n, kb, n),
            "unpaired_cases": len(set(a) ^ set(b))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--a", type=Path, nargs="+", required=True, help="arm A's repair_eval outputs")
    ap.add_argument("--b", type=Path, nargs="+", required=True, help="arm B's repair_eval outputs")
    args = ap.parse_args()
    r = compare(load_rows(args.a), load_rows(args.b))
    print(f"{r['cases']} cases both arms caught: A repaired {r['repaired_a']}, B "
          f"{r['repaired_b']}; only A {r['only_a']}, only B {r['only_b']}: McNemar p = "
          f"{r['mcnemar_p']:.3f} (unpaired Fisher p = {r['fisher_p_unpaired']:.3f})")
    print(json.dumps(r))


if __name__ == "__main__":
    main()
