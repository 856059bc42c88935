"""CPU-seconds and peak memory per episode of the LM agent: real episodes (the agent writes
files through the episode's tools; validation only, no inner training) G at a time, each group
followed by one IS-GRPO step on its episodes, as `nestor train` runs them.

    .venv/bin/python benchmarks/lm_episode_cost.py [--model smollm2-135m] [--mode both]
        [--episodes 4] [--group 2] [--turns 3] [--tokens 160] [--threads 1]
        [--train-precision float32|auto] [--adapter DIR] [--attempts 1]

--mode after: the laptop-cost agent (short prompt, contexts that extend the previous turn's
tokens so an episode trains in one forward pass, the prefix KV cache, gradient checkpointing).
--mode before: as configs/smollm-lm.toml ran it (compact prompt, the whole conversation
re-rendered each turn, no prefix cache, each turn re-scored with its whole context, no
checkpointing); with PYTHONPATH on an older checkout it measures that code as it was.
--mode both: each mode in its own process (peak RSS is per process), then the comparison.

CPU-seconds are the process's own (all threads; `time.process_time`), not wall time: the
machine is shared. Peak RSS is the process's maximum resident set. The last line is one JSON
object; targets (docs/agents.md): ≤ 40 CPU-s per episode and ≤ 4 GB peak RSS (after).
"""

from __future__ import annotations

import argparse
import inspect
import json
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

PREFIX = '<tool_call>{"name": "'  # as configs/smollm-lm.toml: a reply starts inside a call


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def make_policy(args):
    from nestor.policy.lm import LMPolicy

    # an untrained model is nudged into a call; a warm start writes its calls by itself
    kwargs = dict(max_new_tokens=args.tokens, temperature=0.7, seed=0, learning_rate=1e-4,
                  response_prefix="" if args.adapter else PREFIX, act_batch_size=args.group,
                  clip_ratio=0.2)
    knobs = inspect.signature(LMPolicy.__init__).parameters
    if "extend_contexts" in knobs:  # this checkout has the switches: set them all
        after = args.mode == "after"
        kwargs.update(gradient_checkpointing=after, extend_contexts=after,
                      prefix_cache_tokens=args.prefix_cache_tokens if after else 0,
                      **({"train_precision": args.train_precision} if after else {}))
    elif args.mode == "after":
        sys.exit("--mode after needs a checkout with LMPolicy(extend_contexts=...)")
    policy = LMPolicy.from_pretrained(args.model, **kwargs)
    if args.adapter:
        policy.load_adapter(args.adapter)
    return policy


def run_mode(args) -> dict:
    from nestor.agent.episode import EpisodeConfig, run_episode
    from nestor.ledger import Ledger
    from nestor.policy.base import TrainItem
    from nestor.tasks import TaskRegistry

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cpu0 = time.process_time()
    policy = make_policy(args)
    load_cpu = time.process_time() - cpu0
    spec = TaskRegistry([]).get(args.task).spec(0)
    style = "short" if args.mode == "after" else "compact"
    cfg = EpisodeConfig(max_turns=args.turns, max_attempts=args.attempts, prompt_style=style,
                        models=["tiny-m"], token_budget=3000, job_timeout_s=120)
    act_cpu = train_cpu = 0.0
    turns = tokens = one_pass = 0
    first_context = 0
    with tempfile.TemporaryDirectory() as tmp:
        ledger = Ledger(Path(tmp))
        for g in range(args.episodes // args.group):
            records: list = [None] * args.group
            c0 = time.process_time()

            def episode(i, g=g, records=records):
                records[i] = run_episode(policy, spec, None, ledger, cfg,
                                         episode_id=f"g{g}-{i}", seed=g * args.group + i)

            threads = [threading.Thread(target=episode, args=(i,)) for i in range(args.group)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            act_cpu += time.process_time() - c0
            rewards = [r.reward for r in records]
            mean = sum(rewards) / len(rewards)
            # a group without reward variance would not train; its cost is the point here
            adv = ([r - mean for r in rewards] if max(rewards) > min(rewards)
                   else [(-1.0) ** i for i in range(len(records))])
            items = [TrainItem(r.turns, a, r.policy_version) for r, a in zip(records, adv,
                                                                               strict=True)]
            c0 = time.process_time()
            stats = policy.train_step(items)
            train_cpu += time.process_time() - c0
            one_pass += int(stats.get("episodes_one_pass", 0))
            for r in records:
                turns += len(r.turns)
                tokens += sum(len(t.action_ids) for t in r.turns)
                if r.turns and not first_context:
                    first_context = len(r.turns[0].context_ids)
    n = (args.episodes // args.group) * args.group
    cache = getattr(policy, "prefix_cache", None)
    return {"mode": args.mode, "model": args.model, "episodes": n, "turns": turns,
            "sampled_tokens": tokens, "first_context_tokens": first_context,
            "cpu_s_per_episode": round((act_cpu + train_cpu) / n, 1),
            # episodes end early at random (a submit, a reply without a call): per turn and per
            # sampled token compare runs whose episodes happened to differ in length
            "cpu_s_per_turn": round((act_cpu + train_cpu) / max(1, turns), 1),
            "act_cpu_s_per_token": round(act_cpu / max(1, tokens), 3),
            "act_cpu_s_per_episode": round(act_cpu / n, 1),
            "train_cpu_s_per_episode": round(train_cpu / n, 1),
            "load_cpu_s": round(load_cpu, 1), "peak_rss_mb": round(peak_rss_mb()),
            "episodes_one_pass": one_pass,
            "prefix_tokens_reused": getattr(cache, "tokens_reused", 0),
            "prefix_tokens_computed": getattr(cache, "tokens_computed", 0),
            "threads": args.threads, "adapter": args.adapter,
            "train_precision": args.train_precision if args.mode == "after" else "float32"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--task", default="length")
    ap.add_argument("--mode", choices=["before", "after", "both"], default="both")
    ap.add_argument("--episodes", type=int, default=4)
    ap.add_argument("--group", type=int, default=2, help="episodes acting at once (G)")
    ap.add_argument("--turns", type=int, default=3, help="max turns per episode")
    ap.add_argument("--tokens", type=int, default=160, help="max new tokens per turn")
    ap.add_argument("--prefix-cache-tokens", type=int, default=8192)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--attempts", type=int, default=1, help="submits per episode")
    ap.add_argument("--adapter", default=None, help="a warm start (nestor sft --out DIR) to "
                    "act and train from; no response prefix then")
    ap.add_argument("--train-precision", default="float32", choices=["float32", "auto"],
                    help="after: the learner's forward (auto: bf16 autocast where native)")
    args = ap.parse_args()
    if args.model.startswith("smollm2"):
        from nestor.models.smollm import ensure_converted

        ensure_converted()
    if args.adapter and args.mode != "after":
        sys.exit("--adapter measures the agent as it runs now: use it with --mode after")
    if args.mode != "both":
        print(json.dumps(run_mode(args)))
        return
    out = {}
    for mode in ("before", "after"):
        cmd = [sys.executable, __file__, "--mode", mode] + [
            a for a in sys.argv[1:] if a not in ("--mode", "both")]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            sys.exit(f"{mode} failed:\n{proc.stderr[-3000:]}")
        out[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
        print(json.dumps(out[mode]), flush=True)
    b, a = out["before"], out["after"]
    print(json.dumps({**out, "cpu_per_episode_ratio": round(
        b["cpu_s_per_episode"] / max(a["cpu_s_per_episode"], 1e-9), 2),
        "targets_met": a["cpu_s_per_episode"] <= 40 and a["peak_rss_mb"] <= 4096}))


if __name__ == "__main__":
    main()
