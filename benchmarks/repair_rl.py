"""RL on repair alone: IS-GRPO pays the LM agent for fixing a job the probe failed.

In a full episode a repair is rare (one per several groups), so ten steps of the LM arc could
not tell whether RL teaches it (docs/lm-arc.md). Here every episode is one: a composer job of a
training task, replayed with one of nestor/sft/slips.py's slips, fails the real probe, and the
agent acts from the report with the turns and submits configs/lm-arc.toml's episode leaves
(benchmarks/repair_eval.py's episode). A step is one case acted G times (the group), reward 1
when a later submit passes, else 0; the advantage is reward − group mean
(nestor/outer/groups.py; a group all of one outcome teaches nothing and is skipped), and one
`LMPolicy.train_step` — the arc's IS loss, on-policy here — updates the LoRA. Cases come from
the training tasks only; whether the skill transfers is repair_eval's held-out figure, with
this run's policy as the adapter:

    python benchmarks/repair_eval.py --agent lm --adapter runs/lm-arc6/sft --concurrency 27
    python benchmarks/repair_rl.py --adapter runs/lm-arc6/sft --steps 16 --group 6
    python benchmarks/repair_eval.py --agent lm --adapter runs/repair-rl/policy --concurrency 27

A run's policy/ is also an adapter to go on from (`--adapter runs/repair-rl/policy --seed 1`:
other cases, the optimizer's moments fresh).

Prints a line a step; the last line is one JSON object: each step's case, rewards and learner
figures, and the repair rate over the first and the last half of the steps.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from repair_eval import repair_cases, repair_episode

ROOT = Path(__file__).resolve().parents[1]


def train_group(agent, results: list[tuple[Any, dict]]) -> dict[str, float] | None:
    """One update on a group of repair episodes (record, row): reward 1 for a repair. None when
    every episode scored the same (zero variance: no signal, no step)."""
    from nestor.outer.groups import group_advantages

    advantages = group_advantages([float(row["repaired"]) for _, row in results])
    if advantages is None:
        return None
    return agent.train_step([rec.train_item(a) for (rec, _), a in zip(results, advantages,
                                                                       strict=True)])


def half_rates(steps: list[dict[str, Any]]) -> list[float | None]:
    """The share of episodes repaired over the first and over the last half of the steps."""
    half = len(steps) // 2
    out = []
    for part in (steps[:half], steps[len(steps) - half:]):
        rewards = [r for s in part for r in s["rewards"]]
        out.append(sum(rewards) / len(rewards) if rewards else None)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, default=ROOT / "configs" / "lm-arc.toml",
                    help="the run config whose [episode] and [policy] apply")
    ap.add_argument("--adapter", type=Path, default=None,
                    help="the warm start to train from (default: the config's)")
    ap.add_argument("--model", default=None, help="default: the config's [policy] model")
    ap.add_argument("--learning-rate", type=float, default=None,
                    help="Adam on the LoRA (default: the config's)")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--group", type=int, default=6, help="episodes a case is acted a step")
    ap.add_argument("--tasks", nargs="*", default=None, help="default: the training tasks")
    ap.add_argument("--jobs-per-task", type=int, default=1)
    ap.add_argument("--kinds", nargs="*", default=None, help="default: every slip")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("runs/repair-rl"))
    args = ap.parse_args()
    if args.steps < 1 or args.group < 2:
        raise SystemExit("--steps must be ≥ 1 and --group ≥ 2 (an advantage needs a group)")

    from nestor.ledger import Ledger
    from nestor.outer.config import (
        RunConfigError,
        load_run_config,
        parse_run_config,
        save_run_config,
    )
    from nestor.outer.episodes import make_policy
    from nestor.sft.demos import demo_composer
    from nestor.sft.slips import SLIPS
    from nestor.tasks import TaskRegistry

    data = load_run_config(args.config).model_dump(exclude_none=True)
    overrides = {"adapter": args.adapter and str(args.adapter), "model": args.model}
    data["policy"].update({k: v for k, v in overrides.items() if v is not None})
    if args.learning_rate is not None:
        data["learning_rate"] = args.learning_rate
    try:  # the overrides validated as the config's own values are
        config = parse_run_config(data, f"{args.config} with the command line's values")
    except RunConfigError as exc:
        raise SystemExit(str(exc)) from None
    if config.policy.kind != "lm":
        raise SystemExit(f"{args.config}: [policy] kind is {config.policy.kind!r}; repair RL "
                         "trains an lm policy")
    kinds = args.kinds or list(SLIPS)
    if set(kinds) - set(SLIPS):
        raise SystemExit(f"--kinds: no slip named {sorted(set(kinds) - set(SLIPS))}; "
                         f"slips: {list(SLIPS)}")
    episode = config.episode_config()
    tasks = args.tasks or [r.id for r in TaskRegistry().training_tasks()]
    agent = make_policy(config)
    composer = demo_composer(episode, args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    save_run_config(config, args.out / "config.toml")  # the adapter it began from, the lr
    t0 = time.time()
    steps: list[dict[str, Any]] = []
    ledger = Ledger(args.out / "ledger")
    try:
        cases = repair_cases(tasks, args.jobs_per_task, kinds, composer, ledger, episode,
                             args.seed)
        if not cases:
            raise SystemExit(f"no repair case on {tasks} with slips {kinds}")
        random.Random(args.seed).shuffle(cases)
        print(f"{len(cases)} cases on {len(tasks)} training tasks", file=sys.stderr, flush=True)
        with ThreadPoolExecutor(args.group) as ex:  # the group's turns sample as one batch
            for step in range(args.steps):
                case, group_id = cases[step % len(cases)], uuid.uuid4().hex[:12]
                w = time.time()
                results = [f.result() for f in [
                    ex.submit(repair_episode, case, composer, agent, ledger, episode, group_id)
                    for _ in range(args.group)]]
                acted = time.time() - w
                stats = train_group(agent, results)
                row = {"step": step + 1, "task": case[0], "kind": case[2],
                       "rewards": [int(r["repaired"]) for _, r in results],
                       "caught": all(r["caught"] for _, r in results),
                       "malformed_turns": sum(r["malformed"] for _, r in results),
                       "updated": stats is not None, "acting_s": round(acted, 1),
                       "seconds": round(time.time() - w, 1),
                       **{k: round(stats[k], 5) for k in ("loss", "tokens", "grad_norm",
                                                          "ratio_mean", "ratio_max")
                          if stats is not None}}
                steps.append(row)
                print(f"step {row['step']}: {case[0]} {case[2]} repaired "
                      f"{sum(row['rewards'])}/{args.group}"
                      + (f", grad norm {row['grad_norm']:.2f}, ratio max {row['ratio_max']:.3f}"
                         if stats else ", no update (one outcome)")
                      + f", {row['seconds']:.0f} s", file=sys.stderr, flush=True)
    finally:
        ledger.close()
    agent.save(args.out / "policy")  # policy/adapter: what repair_eval's --adapter loads
    first, last = half_rates(steps)
    print(json.dumps({"adapter": config.policy.adapter, "learning_rate": config.learning_rate,
                      "group": args.group, "cases": len(cases), "steps": steps,
                      "updates": sum(s["updated"] for s in steps),
                      "repaired_first_half": first, "repaired_last_half": last,
                      "policy": str(args.out / "policy"),
                      "seconds": round(time.time() - t0, 1)}))


if __name__ == "__main__":
    main()
