"""How well warm starts clone demos they never saw: teacher-forced loss and token accuracy.

benchmarks/lm_arc.py's arms take about an hour of episodes on a laptop to say whether a clone
acts; this scores adapters in minutes, on held-out demos: by default the composer's short-form
jobs for every training task under another seed than the warm starts' (seed 0), kept when they
passed the probe, written once to OUT/demos.jsonl and reused. Per adapter (`none`: the
untrained model): the loss and the token accuracy over the demos' action tokens
(`nestor.sft.trainer.Trainer.evaluate`, the scoring `nestor sft --val-fraction` runs), and the
argmax's departures from a demo per episode, (1 - accuracy) × its action tokens.

Run:  .venv/bin/python benchmarks/clone_accuracy.py --adapters none runs/lm-arc4/sft runs/lm-arc5/sft
Last line: JSON.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "lm-arc.toml"


def held_out_demos(args, episode) -> list:
    from nestor.sft.demos import from_composer, read_demos, select, write_demos
    from nestor.tasks import TaskRegistry

    path = args.demos or args.out / "demos.jsonl"
    if path.is_file():
        return read_demos(path)
    tasks = [r.id for r in TaskRegistry().training_tasks()]
    demos = select(from_composer(args.per_task, tasks, args.out / "composer", episode=episode,
                                 seed=args.seed))
    write_demos(path, demos)
    return demos


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--adapters", nargs="+", required=True,
                    help="`nestor sft` output directories (or adapter directories); `none`: "
                    "the untrained model")
    ap.add_argument("--config", type=Path, default=CONFIG, help="the run config whose policy "
                    "and episode (system prompt) the warm starts were made for")
    ap.add_argument("--demos", type=Path, help="held-out demos (a demos.jsonl); default: the "
                    "composer writes them")
    ap.add_argument("--per-task", type=int, default=2, help="composer jobs per training task")
    ap.add_argument("--seed", type=int, default=1, help="the composer's seed (not the warm "
                    "starts' 0)")
    ap.add_argument("--out", type=Path, default=Path("runs/clone-accuracy"))
    args = ap.parse_args()

    from nestor.outer.config import load_run_config
    from nestor.sft.data import EncodeStats, encode_demo, policy_encoders
    from nestor.sft.run import make_policy
    from nestor.sft.trainer import SFTConfig, Trainer

    config = load_run_config(args.config)
    args.out.mkdir(parents=True, exist_ok=True)
    demos = held_out_demos(args, config.episode_config())
    if not demos:
        raise SystemExit("no held-out demo passed the probe: raise --per-task")
    pc = config.policy
    cfg = SFTConfig(model=pc.model, lora_rank=pc.lora_rank, lora_alpha=pc.lora_alpha,
                    max_new_tokens=pc.max_new_tokens)
    rows = []
    for adapter in args.adapters:
        t0 = time.perf_counter()
        policy = make_policy(cfg)
        if adapter != "none":
            policy.load_adapter(adapter)
        render, encode_action = policy_encoders(policy)
        stats = EncodeStats()
        sequences = [s for d in demos for s in encode_demo(d, render, encode_action, stats)]
        scored = Trainer(policy, cfg, args.out).evaluate(sequences)
        slips = (1 - scored["val_token_accuracy"]) * stats.target_tokens / len(demos)
        rows.append({"adapter": adapter, "loss": round(scored["val_loss"], 4),
                     "token_accuracy": round(scored["val_token_accuracy"], 4),
                     "argmax_departures_per_demo": round(slips, 1),
                     "seconds": round(time.perf_counter() - t0, 1)})
        print(f"{adapter:>28}: loss {scored['val_loss']:.3f}  token accuracy "
              f"{scored['val_token_accuracy']:.2%}  {slips:.1f} departures a demo", flush=True)
    print(json.dumps({"demos": len(demos), "action_tokens": stats.target_tokens,
                      "tokens": stats.tokens, "adapters": rows}))


if __name__ == "__main__":
    main()
