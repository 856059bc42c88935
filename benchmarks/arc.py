"""The write-up's arc, measured: configs/arc.toml over several seeds, the five findings.

For each seed it trains a run (or reads one: --analyze RUN_DIR...), computes the findings with
nestor.report.findings.compute_findings, then pools them over seeds with 95% intervals, says
which targets each seed met, measures what the composer learned (which decisions' choice
frequencies changed from the first third of the episodes to the last, by how much, and whether
the changes raised the reward; per base model, how often its config was tuned and with which
learning rates), and draws one PNG with all five findings. Last line: JSON.

Run:  .venv/bin/python benchmarks/arc.py --seeds 0 1 2 [--steps N] [--parallel]
      .venv/bin/python benchmarks/arc.py --analyze runs/arc-s0 runs/arc-s1 ...
Overrides for a smaller measurement: --steps, --token-budget, --workers, --heldout-episodes,
--groups-per-step, --max-in-flight; any other key with --set KEY=VALUE.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

from nestor.outer.metrics import read_jsonl
from nestor.policy.composer_decisions import PLAN
from nestor.report.findings import FINDINGS, Findings, compute_findings, pool_findings

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "arc.toml"
NESTOR = Path(sys.executable).with_name("nestor")
TARGETS = {"reward": "reward's last-third mean >= 2 x its first-third mean",
           "rungs": "both rungs: first-try validation saturates after step 1, and the "
                    "improvement's last-third mean > its first-third mean",
           "strong_model": "stronger model's share rises (first third -> last third)",
           "hp_use": "hyperparameter-surface use rises (reported; not a target of issue 15)",
           "transfer": "trained held-out arm beats untrained, non-overlapping 95% intervals"}


def write_config(args, seed: int, path: Path) -> None:
    import tomllib

    import tomli_w

    cfg = tomllib.loads(CONFIG.read_text())
    cfg["seed"] = seed
    if args.steps:
        cfg["steps"] = args.steps
    if args.groups_per_step:
        cfg["groups_per_step"] = args.groups_per_step
    if args.max_in_flight:
        cfg["max_in_flight"] = args.max_in_flight
    if args.heldout_episodes is not None:
        cfg["heldout_episodes"] = args.heldout_episodes
    if args.workers:
        cfg["pool"]["workers"] = args.workers
    if args.token_budget:
        cfg["episode"]["token_budget"] = args.token_budget
    for item in args.set or []:  # e.g. policy.model_conditioned=false (a TOML value)
        key, _, value = item.partition("=")
        *tables, name = key.strip().split(".")
        node = cfg
        for t in tables:
            node = node.setdefault(t, {})
        node[name] = tomllib.loads(f"v = {value.strip()}")["v"]
    path.write_text(tomli_w.dumps(cfg))


def start_seed(args, seed: int, out: Path) -> tuple[subprocess.Popen, Path]:
    run_dir = out / f"arc-s{seed}"
    cfg = out / f"arc-s{seed}.toml"
    write_config(args, seed, cfg)
    log = (out / f"arc-s{seed}.log").open("w")
    proc = subprocess.Popen([str(NESTOR), "train", str(cfg), "--run-dir", str(run_dir), "--json"],
                            stdout=log, stderr=subprocess.STDOUT)
    return proc, run_dir


# -- what the composer learned -----------------------------------------------------------------
def _plan_values(ep: dict) -> dict | None:
    for turn in reversed(ep.get("turns", [])):
        content = (turn.get("message") or {}).get("content", "")
        if content.startswith(PLAN):
            try:
                return json.loads(content[len(PLAN):])["values"]
            except (json.JSONDecodeError, KeyError):
                return None
    return None


def episode_plans(run_dir: Path) -> list[tuple[dict, float]]:
    """(the plan's chosen values, reward) of every journaled episode with a plan, in the order
    they finished."""
    eps = sorted(read_jsonl(run_dir / "outer" / "episodes.jsonl"),
                 key=lambda e: e.get("finished_at", 0.0))
    return [(v, float(e["reward"])) for e in eps if (v := _plan_values(e)) is not None]


def decision_shifts(rows: list[tuple[dict, float]], top: int = 6) -> list[dict]:
    """Per decision: total-variation change of its choice frequencies from the first third of
    the episodes (`episode_plans`) to the last, and the reward that change is worth — Σ_c
    (f_last − f_first)_c × (mean reward of episodes choosing c − mean reward), over the run."""
    if len(rows) < 6:
        return []
    k = len(rows) // 3
    mean_r = statistics.fmean(r for _, r in rows)
    out = []
    for d in sorted({d for v, _ in rows for d in v}):
        def freq(part, d=d):
            vals = [str(v[d]) for v, _ in part if d in v]
            return {c: vals.count(c) / len(vals) for c in set(vals)} if vals else {}
        first, last = freq(rows[:k]), freq(rows[-k:])
        if not first or not last:
            continue
        by_choice = defaultdict(list)
        for v, r in rows:
            if d in v:
                by_choice[str(v[d])].append(r)
        value = {c: statistics.fmean(rs) - mean_r for c, rs in by_choice.items()}
        choices = set(first) | set(last)
        tv = sum(abs(last.get(c, 0) - first.get(c, 0)) for c in choices) / 2
        worth = sum((last.get(c, 0) - first.get(c, 0)) * value.get(c, 0) for c in choices)
        top_choice = max(last, key=last.get)
        out.append({"decision": d, "tv_change": round(tv, 3), "reward_worth": round(worth, 4),
                    "now_mostly": top_choice, "share": round(last[top_choice], 2),
                    "episodes_per_third": k})
    out.sort(key=lambda r: -r["tv_change"])
    return out[:top]


def config_by_model(rows: list[tuple[dict, float]]) -> dict[str, dict]:
    """Per base model: the share of its episodes that tuned the config, and the learning-rate
    choices of those that did, first third of the episodes (`episode_plans`) → last (the
    composer's config decisions are conditioned on the model)."""
    plans = [v for v, _ in rows]
    k = len(plans) // 3
    out = {}
    for model in sorted({str(v.get("base_model")) for v in plans}):
        row = {}
        for name, part in (("first", plans[:k]), ("last", plans[-k:])):
            mine = [v for v in part if str(v.get("base_model")) == model]
            tuned = [v for v in mine if v.get("config_mode") == "tune"]
            rates = [str(v.get("learning_rate")) for v in tuned]
            row[name] = {"episodes": len(mine),
                         "tune": round(len(tuned) / len(mine), 2) if mine else None,
                         "learning_rate": {c: rates.count(c) for c in sorted(set(rates))}}
        out[model] = row
    return out


# -- the figure -------------------------------------------------------------------------------
def figure(runs: dict[int, tuple[list[dict], list[dict], Findings]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 5, figsize=(25, 4.6), dpi=90, layout="constrained")
    titles = ["1. reward per step", "2. rungs: first-try pass rate (—), improvement (- -)",
              "3. stronger model's share of jobs", "4. hyperparameter-surface use",
              "5. held-out transfer (95% CI)"]
    for ax, title in zip(axes, titles, strict=True):
        ax.set_title(title, loc="left", fontsize=11)
        ax.grid(alpha=0.3)
    for i, (seed, (steps, _, f)) in enumerate(sorted(runs.items())):
        color = f"C{i}"

        def series(key, rows=steps):
            pts = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
            return [s for s, _ in pts], [v for _, v in pts]

        axes[0].plot(*series("reward_mean"), color=color, marker="o", ms=3, label=f"seed {seed}")
        axes[1].plot(*series(f.validation["metric"]), color=color)
        axes[1].plot(*series("hidden_eval_improvement"), color=color, ls="--")
        if f.strong_model:
            pts = [(r["step"], r["base_model_share"].get(f.strong_model, 0.0)) for r in steps
                   if r.get("base_model_share")]
            axes[2].plot([s for s, _ in pts], [v for _, v in pts], color=color, marker="o",
                         ms=3, label=f.strong_model)
        axes[3].plot(*series("hyperparameter_surface_use"), color=color, marker="o", ms=3)
        if f.transfer is not None:
            for j, arm in enumerate(("untrained", "trained")):
                a = getattr(f.transfer, arm)
                x = i * 3 + j
                axes[4].errorbar([x], [a.mean], yerr=[[a.mean - a.ci95[0]], [a.ci95[1] - a.mean]],
                                 fmt="o" if arm == "trained" else "s", color=color, capsize=4)
                axes[4].annotate(f"{arm[0]} n={a.n}", (x, a.ci95[1]), fontsize=7,
                                 ha="center", va="bottom")
    if all(f.transfer is None for _, _, f in runs.values()):
        axes[4].text(0.5, 0.5, "no held-out eval in these runs", ha="center",
                     transform=axes[4].transAxes)
    axes[0].legend(fontsize=8)
    axes[4].set_xticks([])
    for ax in axes[:4]:
        ax.set_xlabel("outer step")
    fig.savefig(path)
    plt.close(fig)


def fmt(p: dict | None) -> str:
    if not p:
        return "n/a"
    return f"{p['mean']:.3f} [{p['ci95'][0]:.3f}, {p['ci95'][1]:.3f}] (n={p['n']})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--analyze", type=Path, nargs="+", help="Only read these run dirs.")
    ap.add_argument("--out", type=Path, default=None, help="Where runs and the figure go.")
    ap.add_argument("--parallel", action="store_true", help="Run the seeds at the same time.")
    ap.add_argument("--steps", type=int)
    ap.add_argument("--groups-per-step", type=int)
    ap.add_argument("--max-in-flight", type=int)
    ap.add_argument("--heldout-episodes", type=int)
    ap.add_argument("--workers", type=int)
    ap.add_argument("--token-budget", type=int)
    ap.add_argument("--set", action="append", metavar="KEY=VALUE", help="Override any config "
                    "key (dotted, a TOML value), e.g. --set policy.model_conditioned=false.")
    args = ap.parse_args()

    out = args.out or ROOT / "runs" / f"arc-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    walls: dict[int, float] = {}
    if args.analyze:
        run_dirs = {i: Path(d) for i, d in enumerate(args.analyze)}
    else:
        run_dirs = {}
        pending = list(args.seeds)
        while pending:
            batch = pending if args.parallel else pending[:1]
            pending = pending[len(batch):]
            t0 = time.monotonic()
            procs = {s: start_seed(args, s, out) for s in batch}
            for s, (proc, run_dir) in procs.items():
                proc.wait()
                walls[s] = round(time.monotonic() - t0, 1)
                run_dirs[s] = run_dir
                print(f"seed {s}: exit {proc.returncode} after {walls[s]:.0f}s ({run_dir})",
                      flush=True)

    runs = {}
    per_seed = []
    for seed, run_dir in run_dirs.items():
        steps = read_jsonl(run_dir / "metrics.jsonl")
        heldout = read_jsonl(run_dir / "heldout.jsonl")
        f = compute_findings(steps, heldout)
        runs[seed] = (steps, heldout, f)
        plans = episode_plans(run_dir)
        shifts = decision_shifts(plans)
        elapsed = steps[-1].get("elapsed_s") if steps else None
        print(f"\n== seed {seed} ({run_dir}): {f.steps} steps, run time {elapsed} s")
        for key in FINDINGS:
            mark = {True: "MET", False: "missed", None: "n/a"}[f.targets.get(key)]
            print(f"  [{mark:6}] {key}: {f.verdicts[key]}")
        if shifts:
            print(f"  decisions that changed most (first {shifts[0]['episodes_per_third']} "
                  f"episodes -> last {shifts[0]['episodes_per_third']}; small samples are "
                  "noise):")
            for s in shifts:
                print(f"    {s['decision']:<18} TV {s['tv_change']:.2f}, now mostly "
                      f"{s['now_mostly']} ({s['share']:.0%}); worth {s['reward_worth']:+.3f} "
                      "reward")
        by_model = config_by_model(plans)
        for model, row in by_model.items():
            print(f"  {model}: episodes {row['first']['episodes']} -> {row['last']['episodes']}, "
                  f"tuned {row['first']['tune']} -> {row['last']['tune']}, learning rates of "
                  f"the tuned {row['first']['learning_rate']} -> {row['last']['learning_rate']}")
        per_seed.append({"seed": seed, "run_dir": str(run_dir), "wall_s": walls.get(seed),
                         "run_time_s": elapsed, "findings": f.to_json(),
                         "decision_shifts": shifts, "config_by_model": by_model})

    pooled = pool_findings([f for _, _, f in runs.values()])
    print(f"\n== pooled over {pooled['runs']} seeds (mean, 95% t-interval over seeds)")
    for key in ("reward_first", "reward_peak", "reward_last", "reward_first_third",
                "reward_last_third", "validation_first_third", "validation_last_third",
                "validation_saturation_step", "improvement_climb_step",
                "improvement_first_third", "improvement_last_third", "strong_share_first",
                "strong_share_last", "hp_use_first", "hp_use_last", "transfer_untrained",
                "transfer_trained", "transfer_gain"):
        print(f"  {key:<28} {fmt(pooled.get(key))}")
    print("  targets met (seeds):")
    for key in FINDINGS:
        print(f"    {key:<13} {pooled['targets_met'][key]} of {pooled['targets_known'][key]} "
              f"with data — {TARGETS[key]}")
    png = out / "arc.png"
    figure(runs, png)
    print(f"figure: {png}")
    print(json.dumps({"seeds": [p["seed"] for p in per_seed], "per_seed": per_seed,
                      "pooled": pooled, "figure": str(png)}, default=float))


if __name__ == "__main__":
    main()
