"""The LM policy's RL learner in float32 against bf16 autocast, on episodes a run recorded.

    .venv/bin/python benchmarks/lm_train_precision.py RUN_DIR [--group 0] [--reps 2]
        [--threads 2]

RUN_DIR is a `nestor train` run of the lm policy (e.g. runs/lm-arc6/rl-s2). The group's
episodes are re-scored by the policy that sampled them (the run's warm start for a group that
version 0 acted in, else the checkpoint of the version that acted), once in each precision:

- the IS ratio exp(learner logprob − sampler logprob) on every action token — what the loss
  would see on-policy: exactly 1 in float32 (the sampler's own arithmetic), off by the rounding
  in bf16 (quantiles, and the share of tokens beyond the run's clip ratio);
- one `train_step` on the group, each precision in turn, `--reps` times: seconds (wall and
  process CPU) of the forward + backward + Adam step.

The last line is one JSON object; `speedup` is float32's median CPU-seconds over bf16's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch


def group_items(run_dir: Path, group: int):
    """(the group's TrainItems with mean-centred advantages, the version that acted)."""
    from nestor.ledger import Ledger
    from nestor.outer.episodes import ledger_episodes
    from nestor.policy.base import TrainItem

    episodes = [e for e in ledger_episodes(Ledger(run_dir), run_dir) if e.group_id == group]
    if not episodes:
        raise SystemExit(f"{run_dir}: no finished episode of group {group} in its ledger")
    versions = {e.policy_version for e in episodes}
    if len(versions) != 1:
        raise SystemExit(f"group {group} was sampled by versions {sorted(versions)}: pick a "
                         "group one version acted in")
    mean = statistics.fmean(e.reward for e in episodes)
    return [TrainItem(e.turns, e.reward - mean, e.policy_version) for e in episodes], \
        versions.pop()


def acting_policy(run_dir: Path, version: int, precision: str):
    """The run's policy as it was when `version` acted, its learner in `precision`."""
    from nestor.outer.config import load_run_config
    from nestor.outer.episodes import make_policy

    config = load_run_config(run_dir / "config.toml")
    config = config.model_copy(update={"policy": config.policy.model_copy(
        update={"train_precision": precision})})
    policy = make_policy(config, run_dir)  # loads [policy] adapter: version 0
    if version > 0:
        ckpt = run_dir / "checkpoints" / f"step-{version:06d}" / "policy"
        if not ckpt.is_dir():
            raise SystemExit(f"{ckpt}: not kept; pick a group version 0 or a kept checkpoint "
                             "acted in")
        policy.load(ckpt)
    return policy, config.clip_ratio


@torch.no_grad()
def log_ratios(policy, items) -> torch.Tensor:
    """[A] learner − sampler logprob of every action token of the items' episodes."""
    from nestor.policy.lm_sequence import episode_sequence, turn_sequence

    out = []
    for item in items:
        packed = episode_sequence(item.turns)
        seqs = [packed] if packed is not None else [turn_sequence(t) for t in item.turns
                                                     if t.action_ids]
        for seq in seqs:  # scored as train_step scores it
            out.append(policy.score(seq).float() - torch.tensor(seq.sample_logprobs))
    return torch.cat(out)


def ratio_figures(log_ratio: torch.Tensor, clip: float) -> dict:
    ratio, dev = log_ratio.exp(), log_ratio.abs()
    q = torch.quantile(dev, torch.tensor([0.5, 0.9, 0.99])).tolist()
    return {"tokens": int(ratio.numel()), "ratio_mean": round(float(ratio.mean()), 5),
            "ratio_min": round(float(ratio.min()), 4), "ratio_max": round(float(ratio.max()), 4),
            "abs_log_ratio_q50_q90_q99": [round(x, 5) for x in q],
            "beyond_clip": round(float(((ratio - 1).abs() > clip).float().mean()), 5)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--group", type=int, default=0, help="the recorded group to train on")
    ap.add_argument("--reps", type=int, default=2, help="train steps per precision")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    items, version = group_items(args.run_dir, args.group)
    out: dict = {"run_dir": str(args.run_dir), "group": args.group, "acted_version": version,
                 "episodes": len(items), "threads": args.threads}
    policies = {}
    for precision in ("float32", "bfloat16"):
        policy, clip = acting_policy(args.run_dir, version, precision)
        policies[precision] = policy
        out[precision] = ratio_figures(log_ratios(policy, items), clip)
        print(json.dumps({precision: out[precision]}), flush=True)
    times: dict[str, list[tuple[float, float]]] = {p: [] for p in policies}
    for rep in range(args.reps):  # alternated, so both see the same machine
        for precision, policy in policies.items():
            wall, cpu = time.perf_counter(), time.process_time()
            stats = policy.train_step(items)
            times[precision].append((time.perf_counter() - wall, time.process_time() - cpu))
            print(json.dumps({"rep": rep, "precision": precision,
                              "wall_s": round(times[precision][-1][0], 1),
                              "cpu_s": round(times[precision][-1][1], 1),
                              "tokens": stats["tokens"], "ratio_mean": stats["ratio_mean"]}),
                  flush=True)
    for precision, runs in times.items():
        out[precision].update(step_wall_s=round(statistics.median(w for w, _ in runs), 1),
                              step_cpu_s=round(statistics.median(c for _, c in runs), 1))
    out["speedup"] = round(out["float32"]["step_cpu_s"] / out["bfloat16"]["step_cpu_s"], 2)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
