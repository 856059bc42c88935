"""The LM arc (issue 23): SmolLM2-135M-Instruct writes jobs — untrained, warm-started from
demonstrations, then RL-trained — measured on the training tasks and the held-out family.

Phases (configs/lm-arc.toml; every phase's files under --out):
1. warm start, once, cached: the composer writes --demos-per-task short-form jobs per task of
   --demo-tasks (default the config's; `all`: every training task), validated by the probe;
   `nestor sft` clones the ones that passed (OUT/sft/) on --sft-device. --demos-only stops after
   the demos, so the cloning can run on another machine (a GPU) and be copied back.
2. per seed: `nestor train` (IS-GRPO) from that adapter for --rl-steps steps (OUT/rl-sN/).
3. arms: untrained, warm-started, each seed's RL-trained policy (and with --composer the
   composer itself, untrained; with --composer-checkpoint a trained one) each run
   --eval-episodes episodes per training task and --heldout-episodes per held-out task
   (OUT/eval-*/); jobs are trained on a local pool unless --validate-only (then reward and
   quality are n/a).
It prints per arm (per seed for RL) and pooled: first-try validation rate, validation rate,
job quality and reward, with 95% intervals (Wilson for rates, normal for means); the RL reward's
first third → last third per seed, and its first half → second half of first-try jobs and
malformed turns; what moved in the jobs (base-model share, config knobs
written, rubric forms); held-out transfer (RL-trained vs warm-started arm); one figure
(OUT/lm_arc.png). Last line: one JSON object.

Full spec:  python benchmarks/lm_arc.py --seeds 0 1 2 --rl-steps 10 --demos-per-task 8
Small run:  python benchmarks/lm_arc.py --seeds 0 --rl-steps 2 --demos-per-task 1 \
                --sft-steps 10 --eval-episodes 1 --heldout-episodes 1 --validate-only
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
import time
import tomllib
import zlib
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "lm-arc.toml"
TRAINED_ENDS = ("ok", "job_failed", "not_trained")


# ---- statistics ---------------------------------------------------------------------------

def wilson(k: int, n: int) -> tuple[float | None, float | None, float | None]:
    if n == 0:
        return None, None, None
    p, z = k / n, 1.96
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return p, max(0.0, centre - half), min(1.0, centre + half)


def mean_ci(xs: list[float]) -> tuple[float | None, float | None, float | None]:
    if not xs:
        return None, None, None
    m = statistics.fmean(xs)
    half = 1.96 * statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else float("nan")
    return m, m - half, m + half


# ---- what a written job holds (files read as data, never run) ----------------------------

def job_traits(ep_dir: Path) -> dict[str, Any]:
    attempts = sorted(ep_dir.glob("attempt-*"), key=lambda p: int(p.name.split("-")[1]))
    job = ep_dir / "job" if (ep_dir / "job").is_dir() else (attempts[-1] if attempts else None)
    out: dict[str, Any] = {"base_model": None, "knobs": [], "rubrics": [], "short_form": None}
    if job is None:
        return out
    try:
        cfg = tomllib.loads((job / "config.toml").read_text(encoding="utf-8"))
        out["base_model"] = cfg.get("base_model", "tiny-m")
        out["knobs"] = sorted(k for k in cfg if k != "base_model")
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        pass
    for init in job.glob("env/*/__init__.py"):
        text = init.read_text(encoding="utf-8", errors="replace")
        out["rubrics"] = re.findall(r"@vf\.reward\([^)]*\)\s*(?:async\s+)?def\s+(\w+)", text)
    out["short_form"] = not (job / "data" / "train.jsonl").is_file()
    return out


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
        c = rec.components
        row = {"arm": name, "task": task, "family": ref.family.name, "end": rec.end_reason,
               "first_try": float(c.get("validation_efficiency", 0.0)) >= 1.0,
               "passed": rec.end_reason in TRAINED_ENDS, "reward": rec.reward,
               "quality": c.get("quality"), "trained": pool is not None,
               "turns": len(rec.turns), "malformed": sum(bool(t.parse_error) for t in rec.turns),
               "submits": rec.attempts,
               **job_traits(ledger.run_dir / "episodes" / rec.id)}
        print(f"  [{name}] {task}: {rec.end_reason}, first_try={row['first_try']}, "
              f"reward {rec.reward:.3f}", file=sys.stderr, flush=True)
        return row

    try:
        with ThreadPoolExecutor(concurrency) as ex:  # the LM policy batches concurrent turns
            return list(ex.map(one, jobs))
    finally:
        ledger.close()


def summarize(rows: list[dict[str, Any]], trained: bool) -> dict[str, Any]:
    n = len(rows)
    out: dict[str, Any] = {"n": n}
    for key in ("first_try", "passed"):
        p, lo, hi = wilson(sum(r[key] for r in rows), n)
        out[key] = {"rate": p, "ci95": [lo, hi]}
    for key in ("reward", "quality"):
        if trained:
            m, lo, hi = mean_ci([float(r[key] or 0.0) for r in rows])
            out[key] = {"mean": m, "ci95": [lo, hi]}
        else:
            out[key] = None  # jobs were validated, not trained
    models = [r["base_model"] for r in rows if r["base_model"]]
    out["tiny_m_share"] = models.count("tiny-m") / len(models) if models else None
    out["knobs_written_mean"] = statistics.fmean(len(r["knobs"]) for r in rows) if rows else None
    forms: dict[str, int] = {}
    for r in rows:
        for f in r["rubrics"]:
            forms[f] = forms.get(f, 0) + 1
    out["rubric_forms"] = forms
    out["malformed_turns"] = sum(r["malformed"] for r in rows)
    # an episode ends at its first passing submit, so a second submit means the first failed
    resubmitted = [r for r in rows if r.get("submits", 0) >= 2]
    out["repairs"] = {"passed": sum(r["passed"] for r in resubmitted), "of": len(resubmitted)}
    return out


def fmt(s: dict[str, Any]) -> str:
    def rate(d):
        return "n/a" if d["rate"] is None else f"{d['rate']:.2f} [{d['ci95'][0]:.2f},{d['ci95'][1]:.2f}]"

    def mean(d):
        return "n/a" if d is None else f"{d['mean']:.3f} [{d['ci95'][0]:.3f},{d['ci95'][1]:.3f}]"

    return (f"n={s['n']:3d}  first-try {rate(s['first_try'])}  valid {rate(s['passed'])}  "
            f"repaired {s['repairs']['passed']}/{s['repairs']['of']}  "
            f"quality {mean(s['quality'])}  reward {mean(s['reward'])}")


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


def rl(args, config, out: Path, adapter: Path, seed: int) -> tuple[Path, list[dict]]:
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
    from nestor.outer.checkpoint import latest_checkpoint

    if latest_checkpoint(run_dir) is None or not (run_dir / "metrics.jsonl").is_file():
        train(cfg, run_dir)
    elif len(read_jsonl(run_dir / "metrics.jsonl")) < args.rl_steps:
        train(cfg, run_dir, resume=True)
    return run_dir, [r for r in read_jsonl(run_dir / "metrics.jsonl")
                     if r.get("reward_mean") is not None]


def thirds(xs: list[float]) -> tuple[float | None, float | None]:
    if not xs:
        return None, None
    k = max(1, len(xs) // 3)
    return statistics.fmean(xs[:k]), statistics.fmean(xs[-k:])


def halves(steps: list[dict]) -> dict[str, list]:
    """What changed from the RL run's first half of steps to its second: jobs valid on the first
    submit [k, n] and malformed turns, each half (metrics.jsonl rows)."""
    k = len(steps) // 2
    out: dict[str, list] = {"first_try": [], "malformed_turns": []}
    for half in (steps[:k], steps[k:]):
        out["first_try"].append([round(sum(r["first_try_pass_rate"] * r["episodes"] for r in half)),
                                 sum(r["episodes"] for r in half)])
        out["malformed_turns"].append(sum(r.get("malformed_tool_calls", 0) for r in half))
    return out


def figure(out: Path, arms: dict[str, dict], curves: dict[int, list[float]]) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    names = list(arms)
    for j, split in enumerate(("train", "heldout")):
        vals = [arms[n][split]["first_try"]["rate"] or 0.0 for n in names]
        los = [v - (arms[n][split]["first_try"]["ci95"][0] or 0.0) for v, n in zip(vals, names, strict=True)]
        his = [(arms[n][split]["first_try"]["ci95"][1] or 0.0) - v for v, n in zip(vals, names, strict=True)]
        a.bar([i + 0.4 * j for i in range(len(names))], vals, 0.4, yerr=[los, his],
              label=split, capsize=3)
    a.set_xticks([i + 0.2 for i in range(len(names))], names, rotation=20)
    a.set_ylabel("first-try validation rate (95% CI)")
    a.legend()
    for seed, ys in curves.items():
        b.plot(range(1, len(ys) + 1), ys, marker="o", label=f"seed {seed}")
    b.set_xlabel("RL step")
    b.set_ylabel("mean episode reward")
    if curves:  # no RL run here: an empty panel, no legend
        b.legend()
    fig.suptitle("SmolLM2-135M as the job writer: untrained, warm-started, RL-trained")
    fig.tight_layout()
    path = out / "lm_arc.png"
    fig.savefig(path, dpi=110)
    return path


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
    arms: dict[str, dict] = {}
    rows: dict[str, dict[str, list]] = {}
    curves: dict[int, list[float]] = {}
    by_half: dict[int, dict[str, list]] = {}
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
            arms[name] = {"train": summarize(tr, pool is not None),
                          "heldout": summarize(ho, pool is not None)}
            for split in ("train", "heldout"):
                print(f"{name:>14} {split:>7}: {fmt(arms[name][split])}", flush=True)

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
            untrained = config.model_copy(deep=True)
            untrained.policy.adapter = None
            evaluate("untrained", make_policy(untrained), seed0)
        warm_cfg = config.model_copy(deep=True)
        warm_cfg.policy.adapter = str(out / "sft")
        if "warm" not in args.skip and "warm-eval" not in args.skip:
            evaluate("warm-started", make_policy(warm_cfg), seed0)
        if "rl" not in args.skip and "warm" not in args.skip:
            from nestor.outer.checkpoint import latest_checkpoint

            for seed in args.seeds:
                run_dir, steps = rl(args, config, out, out / "sft", seed)
                curves[seed] = [r["reward_mean"] for r in steps]
                by_half[seed] = halves(steps)
                first, last = thirds(curves[seed])
                print(f"RL seed {seed}: reward first third {first} → last third {last} "
                      f"({len(steps)} steps); first-try valid by half {by_half[seed]['first_try']}, "
                      f"malformed turns {by_half[seed]['malformed_turns']}")
                policy = make_policy(warm_cfg)
                policy.load(latest_checkpoint(run_dir) / "policy")
                evaluate(f"rl-s{seed}", policy, seed)
    finally:
        if pool is not None:
            pool.shutdown()
    rl_arms = [n for n in arms if n.startswith("rl-")]
    if len(rl_arms) > 1:  # the seeds' RL-trained arms pooled
        arms["rl-pooled"] = {split: summarize([r for n in rl_arms for r in rows[n][split]],
                                              pool is not None) for split in ("train", "heldout")}
        for split in ("train", "heldout"):
            print(f"{'rl-pooled':>14} {split:>7}: {fmt(arms['rl-pooled'][split])}")
    report["arms"] = arms
    report["rl_reward_thirds"] = {s: thirds(c) for s, c in curves.items()}
    report["rl_halves"] = by_half
    report["rl_lifted_seeds"] = sum(1 for f, la in report["rl_reward_thirds"].values()
                                    if f is not None and la > f)
    if rl_arms and "warm-started" in arms:
        report["heldout_transfer"] = {
            "warm_started_first_try": arms["warm-started"]["heldout"]["first_try"],
            "rl_first_try": {n: arms[n]["heldout"]["first_try"] for n in rl_arms}}
    fig = figure(out, arms, curves)
    report["figure"] = str(fig) if fig else None
    report["wall_s"] = round(time.time() - t0, 1)
    print(json.dumps(report, default=str))


if __name__ == "__main__":
    main()
