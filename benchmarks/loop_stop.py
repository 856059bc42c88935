"""The loop stop, replayed on recorded turns: which replies would it have ended, where, and
which healthy ones would it have cut?

An LM agent's malformed turns were mostly replies looping until the turn's cap (docs/lm-arc.md,
RL from warm start 5). The lm policy's sampler now ends a reply once its tail is one piece
repeated (nestor/models/loops.py, `[policy] stop_repeats`). This reads every turn recorded in
run directories (episodes' transcript.json: the sampled ids) and applies the sampler's rule at
its check points. A stop is harmless only where it never fires on a well-formed turn; it pays
by the tokens it does not sample. Also times the check. The last line is one JSON object.

    python benchmarks/loop_stop.py runs/lm-arc6 [--min-span 48]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from nestor.models.loops import LOOP_MIN_SPAN, check_window, is_check_point, repeat_period


def first_stop(ids: list[int], min_span: int) -> int | None:
    """Where the sampler would have ended this reply (its length then), or None."""
    for n in range(1, len(ids) + 1):
        if is_check_point(n, min_span) and repeat_period(ids[:n], min_span) is not None:
            return n
    return None


def turns(dirs: list[Path]):
    """(sampled ids, well-formed) of every LM turn under `dirs`."""
    for d in dirs:
        for path in sorted(d.glob("**/transcript.json")):
            for turn in json.loads(path.read_text()).get("turns", []):
                ids = turn.get("action_ids") or []
                ids = json.loads(ids) if isinstance(ids, str) else ids
                if not ids:
                    continue  # the composer's turns carry decisions, not tokens
                yield ids, turn.get("parse_error") in (None, "None")


def replay(dirs: list[Path], min_span: int, eos_id: int | None = None) -> dict:
    kinds = {k: {"turns": 0, "stopped": 0, "at": [], "tokens": 0, "saved": 0}
             for k in ("well_formed", "malformed_ended", "malformed_cut")}
    for ids, ok in turns(dirs):
        ended = eos_id is not None and ids[-1] == eos_id
        kind = kinds["well_formed" if ok else "malformed_ended" if ended else "malformed_cut"]
        stop = first_stop(ids[:-1] if ended else ids, min_span)
        kind["turns"] += 1
        kind["tokens"] += len(ids)
        if stop is not None:
            kind["stopped"] += 1
            kind["at"].append(stop)
            kind["saved"] += len(ids) - stop
    for k in kinds.values():
        k["median_stop_at"] = statistics.median(k["at"]) if k["at"] else None
        del k["at"]
    return kinds


def check_cost_us(n_tokens: int = 640, repeats: int = 20) -> float:
    """Microseconds of loop checks per sampled token, on a reply with no loop (the worst case:
    every period is tried at every check)."""
    ids = list(range(n_tokens))
    t0 = time.perf_counter()
    for _ in range(repeats):
        for n in range(1, n_tokens + 1):
            if is_check_point(n, LOOP_MIN_SPAN):
                repeat_period(ids[max(0, n - check_window(LOOP_MIN_SPAN)):n], LOOP_MIN_SPAN)
    return (time.perf_counter() - t0) / (repeats * n_tokens) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dirs", nargs="+", type=Path, help="run directories (or any folder above "
                    "episodes' transcript.json files)")
    ap.add_argument("--min-span", type=int, default=LOOP_MIN_SPAN)
    ap.add_argument("--eos-id", type=int, default=2, help="the agent's eos token id "
                    "(SmolLM2's <|im_end|> is 2): a reply ending in it ended on its own")
    args = ap.parse_args()
    kinds = replay(args.dirs, args.min_span, args.eos_id)
    for name, k in kinds.items():
        print(f"{name:>16}: {k['turns']:4d} turns, {k['stopped']:3d} stopped "
              f"(median at {k['median_stop_at']} tokens), {k['saved']:6d} of {k['tokens']:6d} "
              "sampled tokens saved")
    total = sum(k["tokens"] for k in kinds.values())
    saved = sum(k["saved"] for k in kinds.values())
    report = {"min_span": args.min_span, "kinds": kinds,
              "saved_share": round(saved / total, 4) if total else None,
              "check_us_per_token": round(check_cost_us(), 2)}
    print(json.dumps(report))


if __name__ == "__main__":
    main()
