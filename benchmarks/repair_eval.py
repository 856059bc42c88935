"""Repair rate: does an agent fix a job from the probe's report?

Warm-started SmolLM2 agents repaired 0 of 25 second submits (docs/lm-arc.md): each resubmitted
its first failure. An arm measures repairs only where the agent's own first attempt failed,
mixed with how well it writes jobs; this measures them alone. For each task (default: the
held-out family, which no demo covers) the composer writes short-form jobs that pass the probe
on the first try; each is replayed with one of nestor/sft/slips.py's slips written in, one call
a turn, and the real probe fails it. From that report on, the agent under test acts, with the
turns and submits configs/lm-arc.toml's episode leaves. A case is repaired when a later submit
passes. Prints per kind and pooled repair rates with Wilson 95% intervals, the agent's first
call after the report, and its malformed turns; the last line is one JSON object, with a row per
case. One --seed draws the same cases for any agent, so two adapters' runs pair case by case
(benchmarks/repair_compare.py).

    python benchmarks/repair_eval.py --agent scripted      # the slips' own repairs: all pass
    python benchmarks/repair_eval.py --agent resubmit      # submit again unchanged: none pass
    python benchmarks/repair_eval.py --agent lm --adapter runs/lm-arc/sft --concurrency 8

Jobs are validated, never trained (no pool), so a case costs the agent's repair turns and one
or two probes — a fix of a few tokens, not a job of ~1,000.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from lm_arc_report import TRAINED_ENDS, wilson

ROOT = Path(__file__).resolve().parents[1]


class Resubmit:
    """Submits the job again as it is: the failure warm starts showed, as a floor."""

    name, version = "resubmit", 0

    def act(self, obs):
        from nestor.policy.base import Message, ToolCall, Turn

        n = sum(m.role == "assistant" for m in obs.messages)
        return Turn(Message("assistant", "", [ToolCall("submit", {}, f"r{n}")]))


def clean_jobs(tasks: list[str], per_task: int, composer, ledger, episode, seed: int):
    """(task, episode seed, files) of jobs the composer wrote that passed on the first try."""
    from nestor.agent.episode import run_episode
    from nestor.sft.slips import written_files
    from nestor.tasks import TaskRegistry

    reg, jobs = TaskRegistry(), []
    for t, task in enumerate(tasks):
        spec, kept = reg.get(task).spec(episode.difficulty), 0
        for i in range(per_task * 6):  # about half pass first try
            if kept == per_task:
                break
            ep_seed = seed * 100_003 + t * 1009 + i
            rec = run_episode(composer, spec, None, ledger, episode, seed=ep_seed)
            if rec.components.get("validation_efficiency", 0) >= 1.0:
                jobs.append((task, ep_seed, written_files(
                    [c for m in rec.messages for c in m.tool_calls])))
                kept += 1
    return jobs


def repair_cases(tasks: list[str], per_task: int, kinds: list[str], composer, ledger, episode,
                 seed: int) -> list[tuple[str, int, str]]:
    """(task, episode seed, slip kind): each clean job replayed with every slip in `kinds`
    that applies to it."""
    from nestor.sft.slips import SLIPS, draw_kinds

    jobs = clean_jobs(tasks, per_task, composer, ledger, episode, seed)
    return [(task, s, k) for task, s, files in jobs
            for k in draw_kinds(files, s, len(SLIPS)) if k in kinds]


def repair_episode(case, composer, agent, ledger, episode, group_id: str | None = None):
    """(the episode's record, its row): the case's slip replayed, then `agent` repairing."""
    from nestor.agent.episode import run_episode
    from nestor.sft.slips import SlipThenRepair
    from nestor.tasks import TaskRegistry

    task, ep_seed, kind = case
    spec = TaskRegistry().get(task).spec(episode.difficulty)
    policy = SlipThenRepair(composer, kind, ep_seed, repairer=agent)
    rec = run_episode(policy, spec, None, ledger, episode, seed=ep_seed, group_id=group_id)
    caught = rec.components.get("validation_efficiency", 0) < 1.0  # the slip failed the probe
    reports = [k for k, m in enumerate(rec.messages) if m.role == "tool"
               and m.content.startswith("validation failed")]
    after = rec.messages[reports[0] + 1:] if reports else []
    own = [m for m in after if m.role == "assistant"]
    first_call = (own[0].tool_calls[0].name if own and own[0].tool_calls else "none")
    row = {"task": task, "episode_seed": ep_seed, "kind": kind, "caught": caught,
           "repaired": caught and rec.end_reason in TRAINED_ENDS, "end": rec.end_reason,
           "first_call": first_call, "turns": len(own),
           "malformed": sum(bool(t.parse_error) for t in rec.turns)}
    print(f"  {task} {kind}: {rec.end_reason}, repaired={row['repaired']}, first call "
          f"{first_call}", file=sys.stderr, flush=True)
    return rec, row


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    cases = [r for r in rows if r["caught"]]
    k = sum(r["repaired"] for r in cases)
    p, lo, hi = wilson(k, len(cases))
    by_kind: dict[str, list[int]] = {}
    for r in cases:
        by_kind.setdefault(r["kind"], [0, 0])
        by_kind[r["kind"]][0] += r["repaired"]
        by_kind[r["kind"]][1] += 1
    return {"cases": len(cases), "repaired": k, "rate": p, "ci95": [lo, hi],
            "by_kind": by_kind, "first_call": dict(Counter(r["first_call"] for r in cases)),
            "malformed_turns": sum(r["malformed"] for r in cases),
            "slips_not_caught": len(rows) - len(cases)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agent", choices=["scripted", "resubmit", "lm"], required=True)
    ap.add_argument("--config", type=Path, default=ROOT / "configs" / "lm-arc.toml",
                    help="the run config whose [episode] and [policy] (for --agent lm) apply")
    ap.add_argument("--adapter", type=Path, default=None, help="--agent lm: a `nestor sft` "
                    "adapter directory (default: the config's, else the untrained model)")
    ap.add_argument("--tasks", nargs="*", default=None, help="default: the held-out family")
    ap.add_argument("--jobs-per-task", type=int, default=1)
    ap.add_argument("--kinds", nargs="*", default=None, help="default: every slip")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--out", type=Path, default=Path("runs/repair-eval"))
    args = ap.parse_args()

    from nestor.ledger import Ledger
    from nestor.outer.config import load_run_config
    from nestor.sft.demos import demo_composer
    from nestor.sft.slips import SLIPS
    from nestor.tasks import TaskRegistry

    config = load_run_config(args.config)
    episode = config.episode_config()
    tasks = args.tasks or [r.id for r in TaskRegistry().heldout_tasks()]
    kinds = args.kinds or list(SLIPS)
    unknown = set(kinds) - set(SLIPS)
    if unknown:
        raise SystemExit(f"--kinds: no slip named {sorted(unknown)}; slips: {list(SLIPS)}")
    agent: Any = None  # scripted: SlipThenRepair writes the slip's own repair
    if args.agent == "resubmit":
        agent = Resubmit()
    elif args.agent == "lm":
        from nestor.outer.episodes import make_policy

        if args.adapter is not None:
            config.policy.adapter = str(args.adapter)
        agent = make_policy(config)
    t0 = time.time()
    composer = demo_composer(episode, args.seed)
    ledger = Ledger(args.out / args.agent)
    try:
        cases = repair_cases(tasks, args.jobs_per_task, kinds, composer, ledger, episode,
                             args.seed)
        print(f"{len(cases)} cases", file=sys.stderr, flush=True)
        with ThreadPoolExecutor(args.concurrency) as ex:  # the LM policy batches their turns
            rows = [row for _, row in ex.map(
                lambda c: repair_episode(c, composer, agent, ledger, episode), cases)]
    finally:
        ledger.close()
    s = summarize(rows)
    print(f"{args.agent}: repaired {s['repaired']}/{s['cases']}"
          + (f" = {s['rate']:.2f} [{s['ci95'][0]:.2f}, {s['ci95'][1]:.2f}]" if s["cases"] else "")
          + f"; by kind {s['by_kind']}; first call {s['first_call']}")
    print(json.dumps({"agent": args.agent, "adapter": str(args.adapter or config.policy.adapter),
                      "seed": args.seed, "tasks": tasks, "jobs": len({c[:2] for c in cases}),
                      **s, "rows": rows,  # per case: what repair_compare.py pairs across arms
                      "seconds": round(time.time() - t0, 1)}))


if __name__ == "__main__":
    main()
