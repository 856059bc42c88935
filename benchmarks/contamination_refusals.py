"""How often the contamination check refuses an honest job, and whether it refuses a copier.

For each task and each of many installation secrets (throwaway ones, never the installation's
own), three jobs are judged by two rules on the same data:

- honest: `--rows` draws from the task's sampler;
- short first: the `--rows` shortest of 3 × `--rows` draws (an honest curriculum of easy
  inputs, whose rows a sampler's draw does not resemble);
- padded copier: `--rows` rows that are no task's input, plus `--copied` hidden items;
- blank copier: the same, the hidden items' answers written as "?" (its rubric in the sandbox
  can compute the true ones).

The rules: today's (nestor/inner/contamination.py: the job's hidden count beside its counts of
fresh evals drawn the same way, an exact test at FALSE_REFUSAL) and the rule before it (an item
held only by a task with its answer, the count set beside three draws from the task's sampler of
the job's size: their mean plus four standard deviations plus two). Printed per task and pooled: jobs refused by each rule, and each
rule's headroom on the honest job (the fewest hidden items refused, less the honest mean).

    .venv/bin/python benchmarks/contamination_refusals.py [--tasks reverse add] [--secrets 200]

The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import secrets
import statistics

from nestor.inner.contamination import (
    FALSE_REFUSAL,
    FRESH_EVALS,
    JobTasks,
    _words,  # the matcher before folded words as today's does
    fresh_evals,
    over_honest,
)
from nestor.tasks import TaskRegistry
from nestor.tasks.base import normalise
from nestor.tasks.hidden import hidden_eval
from nestor.tasks.secret import ENV_SEED

JOBS = ("honest", "short_first", "padded_copier", "blank_copier")


def sampler_counts(ref, size: int, draws: int = 3, max_draws: int = 200_000) -> list[int]:
    """The hidden items held by each of `draws` sets of `size` distinct inputs drawn from the
    task's sampler (difficulty 0, fresh seeds)."""
    hidden = {it.input for it in hidden_eval(ref).items}
    counts = []
    for _ in range(draws):
        rng = random.Random(secrets.token_hex(8))
        seen: set[str] = set()
        for _ in range(min(50 * max(size, 1), max_draws)):
            if len(seen) >= size:
                break
            seen.add(ref.task.sample(rng, 0))
        counts.append(len(seen & hidden))
    return counts


def _in_order(needle: list[str], haystack: list[str]) -> bool:
    it = iter(haystack)
    return all(w in it for w in needle)


def old_held(tasks: list[dict], items) -> int:
    """The matcher before (e0f29c2): an item is held by a task whose answer is the item's (or
    None) and whose prompt holds the item's own words in order."""
    items = {it.input: it for it in items}
    words = {x: [w for w in _words(it.prompt) if w.isalnum()] for x, it in items.items()}
    template = set.intersection(*(set(w) for w in words.values()))
    prompts: dict[str | None, list[list[str]]] = {}
    for t in tasks:
        answer = None if t.get("answer") is None else normalise(str(t["answer"]))
        prompts.setdefault(answer, []).append(_words(str(t.get("prompt", ""))))
    held = 0
    for x, item in items.items():
        own = [w for w in words[x] if w not in template] or words[x]
        held += any(_in_order(own, p) for p in
                    prompts.get(normalise(item.answer), []) + prompts.get(None, []))
    return held


def old_rule(held: int, counts: list[int]) -> bool:
    """The rule before: three sampler draws' mean + 4 sd (sd = √max(mean, 1)) + 2."""
    mean = sum(counts) / len(counts)
    return held > mean + 4 * math.sqrt(max(mean, 1.0)) + 2


def least_refused(rule, counts: list[int]) -> int:
    held = 1
    while not rule(held, counts):
        held += 1
    return held


def wilson_upper(k: int, n: int, z: float = 1.96) -> float:
    p = k / n
    centre = p + z * z / (2 * n)
    spread = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (centre + spread) / (1 + z * z / n)


def jobs(ref, rows: int, copied: int, rng: random.Random) -> dict[str, list[dict]]:
    def as_rows(inputs) -> list[dict]:
        return [{"prompt": ref.task.prompt(x), "answer": ref.task.solve(x)} for x in inputs]

    draws = [ref.task.sample(rng, 0) for _ in range(3 * rows)]
    padding = [{"prompt": f"filler {i}", "answer": f"f{i}"} for i in range(rows)]
    hidden = [{"prompt": it.prompt, "answer": it.answer} for it in hidden_eval(ref).items]
    return {"honest": as_rows(set(draws[:rows])),
            "short_first": as_rows(set(sorted(draws, key=len)[:rows])),
            "padded_copier": padding + hidden[:copied],
            "blank_copier": padding + [{**t, "answer": "?"} for t in hidden[:copied]]}


def one_task(ref, n_secrets: int, rows: int, copied: int, run_tag: str) -> dict:
    refused = {(job, rule): 0 for job in JOBS for rule in ("old", "new")}
    headroom: dict[str, list[float]] = {"old": [], "new": []}
    honest_held = []
    for k in range(n_secrets):
        os.environ[ENV_SEED] = f"{run_tag}-{k}"
        hidden = hidden_eval(ref).items
        for name, tasks in jobs(ref, rows, copied, random.Random(f"{run_tag}-job-{k}")).items():
            new_held, *new_counts = JobTasks(tasks).counts([hidden, *fresh_evals(ref, 0)])
            held = {"old": old_held(tasks, hidden), "new": new_held}
            counts = {"old": sampler_counts(ref, len({t["prompt"] for t in tasks})),
                      "new": new_counts}
            for rule, judge in (("old", old_rule), ("new", over_honest)):
                refused[name, rule] += judge(held[rule], counts[rule])
                if name == "honest":
                    mean = sum(counts[rule]) / len(counts[rule])
                    headroom[rule].append(least_refused(judge, counts[rule]) - mean)
            if name == "honest":
                honest_held.append(held["new"])
    return {"secrets": n_secrets, "honest_held_median": statistics.median(honest_held),
            **{f"{job}_refused_{rule}": n for (job, rule), n in refused.items()},
            **{f"headroom_{r}_median": round(statistics.median(h), 1)
               for r, h in headroom.items()}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", nargs="+", help="task ids (default: every built-in task)")
    ap.add_argument("--secrets", type=int, default=200, help="installation secrets per task")
    ap.add_argument("--rows", type=int, default=3000, help="rows of each job")
    ap.add_argument("--copied", type=int, default=20, help="hidden items the copier adds")
    args = ap.parse_args()
    registry = TaskRegistry()
    refs = ([registry.get(t) for t in args.tasks] if args.tasks
            else registry.tasks(include_heldout=True))
    run_tag = secrets.token_hex(8)
    saved = os.environ.get(ENV_SEED)
    tasks = {}
    try:
        for ref in refs:
            tasks[ref.id] = one_task(ref, args.secrets, args.rows, args.copied, run_tag)
            print(ref.id, tasks[ref.id], flush=True)
    finally:
        if saved is None:
            os.environ.pop(ENV_SEED, None)
        else:
            os.environ[ENV_SEED] = saved
    n = sum(t["secrets"] for t in tasks.values())
    pooled = {}
    for job in JOBS:
        for rule in ("old", "new"):
            k = sum(t[f"{job}_refused_{rule}"] for t in tasks.values())
            pooled[f"{job}_{rule}"] = {"refused": k, "rate": k / n,
                                       "rate_upper95": wilson_upper(k, n)}
    print(json.dumps({"rows": args.rows, "copied": args.copied, "fresh_evals": FRESH_EVALS,
                      "false_refusal": FALSE_REFUSAL, "jobs_per_kind": n, "pooled": pooled,
                      "tasks": tasks}))


if __name__ == "__main__":
    main()
