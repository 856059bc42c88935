"""The LM arc's report (benchmarks/lm_arc.py, issue 23): its tables, read back from what the
runs recorded, so that phases run apart (a seed a session, an arm on another machine) report as
one.

    python benchmarks/lm_arc_report.py runs/lm-arc6 runs/lm-arc6-s1

Each --out directory of lm_arc.py holds arms (eval-NAME/ the training-task split of arm NAME,
eval-NAME-heldout/ its held-out split: ledgers and episode directories) and RL runs (rl-sN/:
metrics.jsonl and a ledger). An arm recorded under several directories is pooled; an RL seed
found in several is read from the first. Printed per arm and pooled over the RL seeds: first-try
validation rate, validation rate, repairs, job quality and reward, with 95% intervals (Wilson for
rates, normal for means); per RL seed the reward's first third → last third, first-try jobs and
malformed turns by half, and the reward by acting policy version; held-out transfer (each
RL-trained arm's first-try rate against the warm-started arm's, Fisher exact p); one figure
(FIRST/lm_arc-report.png). Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import tomllib
from pathlib import Path
from typing import Any

TRAINED_ENDS = ("ok", "job_failed", "not_trained")  # the job passed validation


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


def fisher_p(k1: int, n1: int, k2: int, n2: int) -> float:
    """Two-sided Fisher exact test of k1/n1 against k2/n2: the chance, margins fixed, of a table
    no likelier than the one seen."""
    k, n = k1 + k2, n1 + n2

    def prob(a: int) -> float:  # hypergeometric: a of the k successes fall in the first sample
        return math.comb(n1, a) * math.comb(n2, k - a) / math.comb(n, k)

    seen = prob(k1)
    tables = range(max(0, k - n2), min(k, n1) + 1)
    return min(1.0, sum(p for a in tables if (p := prob(a)) <= seen * (1 + 1e-9)))


def mcnemar_p(only_a: int, only_b: int) -> float:
    """Two-sided exact McNemar test on paired outcomes: of the pairs where exactly one arm
    succeeded, `only_a` went to arm A; under no difference each such pair is a fair coin."""
    n = only_a + only_b
    tail = sum(math.comb(n, i) for i in range(min(only_a, only_b) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


# ---- an arm's rows: what each episode's job holds (files read as data, never run) ---------

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


def episode_row(arm: str, task: str, family: str, end: str, components: dict | None,
                reward: float | None, submits: int, parse_errors: list, ep_dir: Path) -> dict:
    """What an arm's table counts of one episode (`parse_errors`: one per policy turn)."""
    c = components or {}
    return {"arm": arm, "task": task, "family": family, "end": end,
            "first_try": float(c.get("validation_efficiency", 0.0)) >= 1.0,
            "passed": end in TRAINED_ENDS, "reward": reward, "quality": c.get("quality"),
            "turns": len(parse_errors), "malformed": sum(bool(e) for e in parse_errors),
            "submits": submits, **job_traits(ep_dir)}


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


def num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def fmt(s: dict[str, Any]) -> str:
    def rate(d):
        return "n/a" if d["rate"] is None else f"{d['rate']:.2f} [{d['ci95'][0]:.2f},{d['ci95'][1]:.2f}]"

    def mean(d):
        return "n/a" if d is None else f"{d['mean']:.3f} [{d['ci95'][0]:.3f},{d['ci95'][1]:.3f}]"

    return (f"n={s['n']:3d}  first-try {rate(s['first_try'])}  valid {rate(s['passed'])}  "
            f"repaired {s['repairs']['passed']}/{s['repairs']['of']}  "
            f"quality {mean(s['quality'])}  reward {mean(s['reward'])}")


# ---- an RL run ----------------------------------------------------------------------------

def rl_summary(run_dir: Path) -> dict[str, Any]:
    """An RL run, from its files: reward per step and first → last third, first-try jobs and
    malformed turns by half (metrics.jsonl), and [episodes, mean reward] per acting policy
    version (its ledger) — a step's group may have been sampled by an older version."""
    from nestor.ledger import Ledger
    from nestor.outer.metrics import read_jsonl

    steps = [r for r in read_jsonl(run_dir / "metrics.jsonl") if r.get("reward_mean") is not None]
    curve = [r["reward_mean"] for r in steps]
    by_version: dict[int, list[float]] = {}
    with Ledger(run_dir, readonly=True) as ledger:
        for ep in ledger.episodes(status="done"):
            by_version.setdefault(ep["policy_version"], []).append(ep["reward"] or 0.0)
    return {"reward": curve, "thirds": thirds(curve), "halves": halves(steps),
            "by_version": {v: [len(rs), statistics.fmean(rs)] for v, rs in sorted(by_version.items())}}


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


# ---- the report: arms and RL runs read back from their directories ------------------------

def recorded_rows(eval_dir: Path, arm: str) -> list[dict[str, Any]]:
    """The rows run_arm returned, read back from the arm's ledger and episode directories."""
    from nestor.ledger import Ledger

    with Ledger(eval_dir, readonly=True) as ledger:
        return [episode_row(arm, ep["task_id"], ep["family"], ep["end_reason"], ep["components"],
                            ep["reward"], ep["attempts"],
                            [t["parse_error"] for t in ledger.turns(ep["id"])
                             if t["role"] == "assistant"],
                            eval_dir / "episodes" / ep["id"])
                for ep in ledger.episodes(status="done")]


def recorded(dirs: list[Path]) -> tuple[dict[str, dict[str, list]], dict[int, Path]]:
    """Arms' rows (eval-NAME/ holds the training-task split, eval-NAME-heldout/ the held-out
    one; an arm recorded under several directories is pooled) and RL runs by seed (rl-sN/; the
    first directory given wins)."""
    rows: dict[str, dict[str, list]] = {}
    runs: dict[int, Path] = {}
    for d in dirs:
        if not d.is_dir():
            raise SystemExit(f"{d}: no such directory (give lm_arc.py --out directories)")
        for ev in sorted(d.glob("eval-*")):
            if (ev / "ledger.sqlite").is_file():
                name = ev.name.removeprefix("eval-")
                split = "heldout" if name.endswith("-heldout") else "train"
                name = name.removesuffix("-heldout")
                arm = rows.setdefault(name, {"train": [], "heldout": []})
                arm[split] += recorded_rows(ev, name)
        for run in sorted(d.glob("rl-s*")):
            if re.fullmatch(r"rl-s\d+", run.name) and (run / "metrics.jsonl").is_file():
                runs.setdefault(int(run.name[4:]), run)
    return rows, runs


def report_recorded(dirs: list[Path]) -> dict[str, Any]:
    rows, runs = recorded(dirs)
    trained = any(r["end"] in ("ok", "job_failed") for arm in rows.values()
                  for split in arm.values() for r in split)
    report: dict[str, Any] = {"report_of": [str(d) for d in dirs]}
    conclude(report, rows, runs, trained, dirs[0] / "lm_arc-report.png")
    return report


def conclude(report: dict[str, Any], rows: dict[str, dict[str, list]], runs: dict[int, Path],
             trained: bool, fig_path: Path) -> None:
    """Fill the report from the arms' rows and the RL runs, print the table, draw the figure."""
    seeds = [n for n in rows if re.fullmatch(r"rl-s\d+", n)]
    if len(seeds) > 1:  # the seeds' RL-trained arms pooled
        rows = {**rows, "rl-pooled": {split: [r for n in seeds for r in rows[n][split]]
                                      for split in ("train", "heldout")}}
    arms = {n: {split: summarize(r[split], trained) for split in ("train", "heldout")}
            for n, r in rows.items()}
    for name, arm in arms.items():
        for split in ("train", "heldout"):
            print(f"{name:>14} {split:>7}: {fmt(arm[split])}")
    rl_runs = {seed: rl_summary(run) for seed, run in sorted(runs.items())}
    for seed, r in rl_runs.items():
        print(f"RL seed {seed}: reward first third {num(r['thirds'][0])} → last third "
              f"{num(r['thirds'][1])} ({len(r['reward'])} steps); first-try valid by half "
              f"{r['halves']['first_try']}, malformed turns {r['halves']['malformed_turns']}")
    report["arms"] = arms
    report["rl_reward"] = {s: r["reward"] for s, r in rl_runs.items()}
    report["rl_reward_thirds"] = {s: r["thirds"] for s, r in rl_runs.items()}
    report["rl_halves"] = {s: r["halves"] for s, r in rl_runs.items()}
    report["rl_by_version"] = {s: r["by_version"] for s, r in rl_runs.items()}
    report["rl_lifted_seeds"] = sum(1 for f, la in report["rl_reward_thirds"].values()
                                    if f is not None and la > f)
    warm = rows.get("warm-started", {}).get("heldout")
    rl_arms = [n for n in arms if n.startswith("rl-") and arms[n]["heldout"]["n"]]
    if warm and rl_arms:  # held-out transfer: each RL-trained arm against the warm start
        hits = {n: [sum(r["first_try"] for r in rows[n]["heldout"]), len(rows[n]["heldout"])]
                for n in rl_arms}
        k_warm = sum(r["first_try"] for r in warm)
        report["heldout_transfer"] = {
            "warm_started_first_try": [k_warm, len(warm)], "rl_first_try": hits,
            "fisher_p": {n: fisher_p(k, m, k_warm, len(warm)) for n, (k, m) in hits.items()}}
        for n, (k, m) in hits.items():
            print(f"held-out first try: {n} {k}/{m} against warm-started {k_warm}/{len(warm)}, "
                  f"Fisher p = {report['heldout_transfer']['fisher_p'][n]:.2f}")
    fig = figure(fig_path, arms, report["rl_reward"])
    report["figure"] = str(fig) if fig else None


def figure(path: Path, arms: dict[str, dict], curves: dict[int, list[float]]) -> Path | None:
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
    fig.savefig(path, dpi=110)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", type=Path, nargs="+", metavar="DIR",
                    help="lm_arc.py --out directories")
    args = ap.parse_args()
    print(json.dumps(report_recorded(args.dirs), default=str))


if __name__ == "__main__":
    main()
