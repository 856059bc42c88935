"""The LM arc (issue 23): SmolLM2-135M-Instruct writes jobs — untrained, warm-started from
demonstrations, then RL-trained — measured on the training tasks and the held-out family.

Phases (configs/lm-arc.toml; every phase's files under --out):
1. warm start, once, cached: the composer writes --demos-per-task short-form jobs per task of
   --demo-tasks (default the config's; `all`: every training task), validated by the probe;
   `nestor sft` clones the ones that passed (OUT/sft/) on --sft-device. --demos-only stops after
   the demos, so the cloning can run on another machine (a GPU) and be copied back.
2. per seed: `nestor train` (IS-GRPO) from that adapter for --rl-steps steps (OUT/rl-sN/).
3. arms: untrained, warm-started, each seed's RL-trained policy (and with --composer the
   composer itself, untrained; with --composer-checkpoint a trained one; with --adapter-arm
   NAME=DIR the LM policy from any adapter, e.g. benchmarks/repair_rl.py's) each run
   --eval-episodes episodes per training task and --heldout-episodes per held-out task
   (OUT/eval-*/); jobs are trained on a local pool unless --validate-only (then reward and
   quality are n/a).
It prints benchmarks/lm_arc_report.py's tables (what they hold is said there) for the arms
and RL seeds it ran, and draws OUT/lm_arc.png; last line: one JSON object. The phases can run
apart (a seed a session, an arm on another machine): lm_arc_report.py prints the same tables
from what their directories recorded.

Full spec:  python benchmarks/lm_arc.py --seeds 0 1 2 --rl-steps 10 --demos-per-task 8
Small run:  python benchmarks/lm_arc.py --seeds 0 --rl-steps 2 --demos-per-task 1 \
                --sft-steps 10 --eval-episodes 1 --heldout-episodes 1 --validate-only
Report:     python benchmarks/lm_arc_report.py runs/lm-arc6 runs/lm-arc6-s1
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import zlib
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the report, beside this script
from lm_arc_report import conclude, episode_row, fmt, num, rl_summary, summarize  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "lm-arc.toml"


# ---- one arm: episodes of a policy --------------------------------------------------------

def run_arm(policy, name: str, config, out: Path, tasks: list[str], episodes: int, pool,
            seed: int, concurrency: int) -> list[dict[str, Any]]:
    from nestor.agent.episode import run_episode
    from nestor.ledger import Ledger
    from nestor.tasks import TaskRegistry

    reg, cfg = TaskRegistry(), config.episode_config()
    jobs = [(t, i) for t in tasks for i in range(episodes)]
    ledger = Ledger(out / f"eval-{name}")

    def one(job):
        task, i = job
        ref = reg.get(task)
        rec = run_episode(policy, ref.spec(cfg.difficulty), pool, ledger, cfg,
                          seed=seed * 7919 + zlib.crc32(task.encode()) % 1000 * 31 + i)
        row = episode_row(name, task, ref.family.name, rec.end_reason, rec.components,
                          rec.reward, rec.attempts, [t.parse_error for t in rec.turns],
                          ledger.run_dir / "episodes" / rec.id)
        print(f"  [{name}] {task}: {rec.end_reason}, first_try={row['first_try']}, "
              f"reward {rec.reward:.3f}", file=sys.stderr, flush=True)
        return row

    try:
        with ThreadPoolExecutor(concurrency) as ex:  # the LM policy batches concurrent turns
            return list(ex.map(one, jobs))
    finally:
        ledger.close()


# ---- phases -------------------------------------------------------------------------------

def demo_tasks(args, config) -> list[str]:
    """The tasks the composer's demos are written for: the RL run's (default), or `all`
    training tasks (more answer lengths to clone; never the held-out family)."""
    if args.demo_tasks == ["all"]:
        from nestor.tasks import TaskRegistry

        return [r.id for r in TaskRegistry().training_tasks()]
    return args.demo_tasks or config.tasks


def warm_start(args, config, out: Path) -> dict[str, Any]:
    from nestor.sft.run import gather_demos, run_sft
    from nestor.sft.trainer import SFTConfig, write_config

    sft_dir = out / "sft"
    if (sft_dir / "summary.json").is_file() and (sft_dir / "adapter").is_dir():
        summary = json.loads((sft_dir / "summary.json").read_text())
        print(f"warm start: cached in {sft_dir}", file=sys.stderr)
        return {**summary, "cached": True}
    pc = config.policy
    cfg = SFTConfig(model=pc.model, demos=f"composer:{args.demos_per_task}",
                    tasks=demo_tasks(args, config), slips_per_job=args.slips_per_job,
                    device=args.sft_device,
                    steps=args.sft_steps, batch_sequences=args.sft_batch,
                    learning_rate=args.sft_lr, warmup_steps=min(5, args.sft_steps // 4),
                    lora_rank=pc.lora_rank, lora_alpha=pc.lora_alpha,
                    max_new_tokens=pc.max_new_tokens,
                    prompt_style=config.episode_config().prompt_style,
                    checkpoint_every=max(1, args.sft_steps // 4),
                    precision=args.sft_precision,
                    gradient_checkpointing=args.sft_checkpointing,
                    val_fraction=args.sft_val_fraction, eval_every=max(1, args.sft_steps // 6))
    if args.demos_only:  # the SFT runs elsewhere (a GPU): it resumes from DIR/demos.jsonl
        write_config(cfg, sft_dir)
        kept, n_read = gather_demos(cfg, sft_dir, episode=config.episode_config())
        return {"demos_kept": len(kept), "demos_read": n_read, "demos_only": True,
                "demos_by_source": dict(Counter(d.source for d in kept))}
    t0 = time.time()
    summary = run_sft(cfg, sft_dir, resume=(sft_dir / "sft.json").is_file(),
                      episode=config.episode_config(),
                      on_step=lambda h: print(f"  sft step {h['step']}: " + ", ".join(
                          f"{k} {h[k]:.3f}" for k in ("loss", "token_accuracy", "val_loss",
                                                      "val_token_accuracy") if k in h),
                          file=sys.stderr, flush=True))
    return {**summary, "wall_s": round(time.time() - t0, 1), "cached": False}


def rl(args, config, out: Path, adapter: Path, seed: int) -> Path:
    from nestor.outer.checkpoint import latest_checkpoint
    from nestor.outer.config import parse_run_config
    from nestor.outer.metrics import read_jsonl
    from nestor.outer.run import train

    run_dir = out / f"rl-s{seed}"
    raw = config.model_dump(mode="json", exclude_none=True)
    raw.update(seed=seed, steps=args.rl_steps, heldout_episodes=0, name=f"lm-arc-s{seed}")
    raw["policy"]["adapter"] = str(adapter)
    if args.group_size:
        raw["group_size"] = args.group_size
    cfg = parse_run_config(raw, "lm-arc")
    if latest_checkpoint(run_dir) is None or not (run_dir / "metrics.jsonl").is_file():
        train(cfg, run_dir)
    elif len(read_jsonl(run_dir / "metrics.jsonl")) < args.rl_steps:
        train(cfg, run_dir, resume=True)
    return run_dir


def policy_file(path: Path) -> Path:
    """A trained policy's file from a run directory, a checkpoint directory or the file."""
    from nestor.outer.checkpoint import latest_checkpoint

    if (path / "checkpoints").is_dir():
        path = latest_checkpoint(path) or path
    if (path / "policy").is_file():
        path = path / "policy"
    if not path.is_file():
        raise SystemExit(f"--composer-checkpoint {path}: no policy there; give a run directory "
                         "with checkpoints/latest, a checkpoint directory or its policy file")
    return path


def from_adapter(config, adapter: Path | None):
    """The run config with its LM policy starting from `adapter` (None: the untrained model)."""
    arm = config.model_copy(deep=True)
    arm.policy.adapter = None if adapter is None else str(adapter)
    return arm


BUILT_IN_ARMS = {"composer", "composer-trained", "untrained", "warm-started", "rl-pooled"}


def adapter_arm(text: str) -> tuple[str, Path]:
    """--adapter-arm NAME=DIR: an arm's name (lower-case letters, digits, dashes; not one this
    script names itself, nor rl-sN) and a LoRA adapter directory that exists."""
    name, sep, path = text.partition("=")
    if not sep or not re.fullmatch(r"[a-z0-9][a-z0-9-]*", name) or name in BUILT_IN_ARMS \
            or re.fullmatch(r"rl-s\d+", name):
        raise argparse.ArgumentTypeError(
            f"{text!r}: give NAME=DIR, NAME of lower-case letters, digits and dashes and none "
            f"of {sorted(BUILT_IN_ARMS)} or rl-sN (e.g. rl-repair=runs/repair8/rl/policy)")
    if not Path(path).is_dir():
        raise argparse.ArgumentTypeError(f"{text!r}: {path} is not a directory (a `nestor sft` "
                                         "--out, a run's policy/ or its adapter/)")
    return name, Path(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, default=CONFIG)
    ap.add_argument("--out", type=Path, default=Path("runs/lm-arc"))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--rl-steps", type=int, default=10)
    ap.add_argument("--group-size", type=int, default=None)
    ap.add_argument("--demos-per-task", type=int, default=8)
    ap.add_argument("--slips-per-job", type=int, default=0, help="repair demos: each demo job "
                    "that passed first try replayed with K LM slips and their repairs")
    ap.add_argument("--sft-steps", type=int, default=60)
    ap.add_argument("--sft-batch", type=int, default=4)
    ap.add_argument("--sft-lr", type=float, default=2e-4)
    ap.add_argument("--sft-device", default="cpu", help="the warm start's torch device")
    ap.add_argument("--sft-precision", default="auto", choices=["auto", "float32", "bfloat16"],
                    help="the warm start's autocast (SFTConfig.precision)")
    ap.add_argument("--sft-checkpointing", action=argparse.BooleanOptionalAction, default=True,
                    help="gradient checkpointing in the warm start (off: faster, more memory)")
    ap.add_argument("--sft-val-fraction", type=float, default=0.0, help="demos held out of "
                    "the warm start and scored (loss, token accuracy) six times over it")
    ap.add_argument("--demo-tasks", nargs="*", default=None, help="tasks the composer's demos "
                    "are written for (default: the config's; `all`: every training task)")
    ap.add_argument("--demos-only", action="store_true", help="write the warm start's demos "
                    "(OUT/sft/demos.jsonl) and stop: a later run, on a GPU say, trains on them")
    ap.add_argument("--eval-tasks", nargs="*", default=None,
                    help="training tasks the arms are measured on (default: the config's; "
                    "the flag alone: none, the held-out family only)")
    ap.add_argument("--heldout-tasks", nargs="*", default=None,
                    help="held-out tasks the arms are measured on (default: all)")
    ap.add_argument("--eval-episodes", type=int, default=6, help="per training task and arm")
    ap.add_argument("--heldout-episodes", type=int, default=8, help="per held-out task and arm")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--validate-only", action="store_true",
                    help="arms' jobs are validated, not trained (reward/quality n/a)")
    ap.add_argument("--composer", action="store_true", help="also measure the composer "
                    "(untrained, short form: the demos' writer) as an arm on the same episodes")
    ap.add_argument("--composer-checkpoint", type=Path, help="also measure a trained composer "
                    "in the short form on the same episodes: a run directory (its latest "
                    "checkpoint, e.g. benchmarks/arc.py's runs/arc/arc-s0), a checkpoint "
                    "directory or a policy file")
    ap.add_argument("--adapter-arm", type=adapter_arm, action="append", default=[],
                    metavar="NAME=DIR", help="also measure the LM policy from the adapter in DIR "
                    "as arm NAME, on the same episodes (a name starting rl- counts as an "
                    "RL-trained arm against the warm start's held-out arm); repeatable")
    ap.add_argument("--skip", nargs="*", default=[],
                    choices=["untrained", "warm", "warm-eval", "rl"],
                    help="leave out the untrained arm, the warm start (and all after it), the "
                    "warm-started arm, or the RL phase")
    args = ap.parse_args()

    import torch

    from nestor.outer.config import load_run_config
    from nestor.outer.episodes import make_policy
    from nestor.tasks import TaskRegistry

    torch.set_num_threads(max(1, torch.get_num_threads()))
    config = load_run_config(args.config)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    reg = TaskRegistry()
    heldout = args.heldout_tasks or [r.id for r in reg.heldout_tasks()]
    eval_tasks = config.tasks if args.eval_tasks is None else args.eval_tasks  # none: held-out only
    pool = None
    if not args.validate_only:
        from nestor.pool.base import make_pool
        from nestor.pool.config import load_pool_config

        pool = make_pool(load_pool_config(workers=config.pool.get("workers", 1)))
    t0 = time.time()
    report: dict[str, Any] = {"config": str(args.config), "seeds": args.seeds,
                              "validate_only": args.validate_only, "heldout_tasks": heldout}
    rows: dict[str, dict[str, list]] = {}
    runs: dict[int, Path] = {}
    try:
        if "warm" not in args.skip:
            sft = warm_start(args, config, out)
            report["warm_start"] = sft
            if args.demos_only:
                print(json.dumps(report, default=str))
                return
            print(f"warm start: {sft['demos_kept']} of {sft['demos_read']} demos, loss "
                  f"{sft['loss_first']:.3f} → {sft['loss_last']:.3f} ({sft['steps']} steps)")

        def evaluate(name: str, policy, seed: int) -> None:
            tr = run_arm(policy, name, config, out, eval_tasks, args.eval_episodes, pool,
                         seed, args.concurrency)
            ho = run_arm(policy, name + "-heldout", config, out, heldout, args.heldout_episodes,
                         pool, seed, args.concurrency)
            rows[name] = {"train": tr, "heldout": ho}
            for split in ("train", "heldout"):
                print(f"{name:>14} {split:>7}: {fmt(summarize(rows[name][split], pool is not None))}",
                      flush=True)

        seed0 = args.seeds[0]
        if args.composer or args.composer_checkpoint:  # rows to compare with, same episodes
            from nestor.policy.composer import Composer, ComposerConfig

            ep = config.episode_config()

            def composer() -> Composer:
                return Composer(ComposerConfig(job_form="short", base_models=ep.models,
                                               seed=seed0, token_budget=ep.token_budget))

            if args.composer:  # untrained: the demos' writer
                evaluate("composer", composer(), seed0)
            if args.composer_checkpoint:
                trained = composer()
                trained.load(policy_file(args.composer_checkpoint))
                evaluate("composer-trained", trained, seed0)
        if "untrained" not in args.skip:
            evaluate("untrained", make_policy(from_adapter(config, None)), seed0)
        warm_cfg = from_adapter(config, out / "sft")
        if "warm" not in args.skip and "warm-eval" not in args.skip:
            evaluate("warm-started", make_policy(warm_cfg), seed0)
        for name, adapter in args.adapter_arm:  # e.g. benchmarks/repair_rl.py's policy/
            evaluate(name, make_policy(from_adapter(config, adapter)), seed0)
        if "rl" not in args.skip and "warm" not in args.skip:
            from nestor.outer.checkpoint import latest_checkpoint

            for seed in args.seeds:
                runs[seed] = rl(args, config, out, out / "sft", seed)
                curve = rl_summary(runs[seed])
                print(f"RL seed {seed}: reward first third {num(curve['thirds'][0])} → last "
                      f"third {num(curve['thirds'][1])}", flush=True)
                policy = make_policy(warm_cfg)
                policy.load(latest_checkpoint(runs[seed]) / "policy")
                evaluate(f"rl-s{seed}", policy, seed)
    finally:
        if pool is not None:
            pool.shutdown()
    conclude(report, rows, runs, pool is not None, out / "lm_arc.png")
    report["wall_s"] = round(time.time() - t0, 1)
    print(json.dumps(report, default=str))


if __name__ == "__main__":
    main()
