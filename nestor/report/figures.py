"""One function per figure. Each takes RunData and an Axes-free figure size, returns a matplotlib
Figure (or None when the run has no data for it yet). 12 inches at 100 dpi = 1200 px wide."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import matplotlib

matplotlib.use("Agg")  # headless: reports are made on servers and in CI
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from nestor.report.data import RunData  # noqa: E402

WIDTH, HEIGHT, DPI = 12, 4.2, 100


def _fig(title: str) -> tuple[Figure, plt.Axes]:
    fig, ax = plt.subplots(figsize=(WIDTH, HEIGHT), dpi=DPI, layout="constrained")
    ax.set_title(title, loc="left", fontsize=13)
    ax.grid(alpha=0.3)
    return fig, ax


def _series(data: RunData, key: str) -> tuple[list[int], list[float]]:
    rows = [(r["step"], r[key]) for r in data.steps if r.get(key) is not None]
    return [s for s, _ in rows], [v for _, v in rows]


def reward(data: RunData) -> Figure | None:
    """Mean reward per step, and beneath it the weighted terms that sum to it: positive terms
    stacked up from zero, negative ones (a job that made the model worse) stacked down."""
    rows = [r for r in data.steps if r.get("reward_mean") is not None]
    if not rows:
        return None
    fig, ax = _fig("Reward per outer step, and the weighted terms that sum to it")
    steps = [r["step"] for r in rows]
    names = sorted({k for r in rows for k in (r.get("reward_components") or {})
                    if k.startswith("weighted_")})
    up, down = [0.0] * len(rows), [0.0] * len(rows)
    for name in names:
        vals = [(r.get("reward_components") or {}).get(name) or 0.0 for r in rows]
        base = [u if v >= 0 else d for v, u, d in zip(vals, up, down, strict=True)]
        ax.bar(steps, vals, bottom=base, width=0.7, alpha=0.6,
               label=name.removeprefix("weighted_"))
        up = [u + max(v, 0.0) for u, v in zip(up, vals, strict=True)]
        down = [d + min(v, 0.0) for d, v in zip(down, vals, strict=True)]
    ax.plot(steps, [r["reward_mean"] for r in rows], color="black", lw=2, marker="o", ms=4,
            label="reward (mean)")
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xlabel("outer step")
    ax.set_ylabel("reward")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9)
    return fig


def reliability(data: RunData) -> Figure | None:
    """Rung one: validation pass rate and job failure rate."""
    steps, passed = _series(data, "validation_pass_rate")
    if not steps:
        return None
    fig, ax = _fig("Process reliability: validation pass rate and job failure rate")
    ax.plot(steps, passed, marker="o", ms=3, label="validation pass rate")
    fsteps, failed = _series(data, "job_failure_rate")
    if fsteps:
        ax.plot(fsteps, failed, marker="s", ms=3, label="job failure rate")
    ax.set_ylim(-0.03, 1.03)
    ax.set_xlabel("outer step")
    ax.legend(loc="best", fontsize=9)
    return fig


def pre_post(data: RunData) -> Figure | None:
    """Rung two: hidden-eval accuracy before and after each task's jobs."""
    by_task = data.pre_post_by_task()
    if not by_task:
        return None
    fig, ax = _fig("Hidden eval per task: base model (pre) vs trained (post), mean over jobs")
    tasks = sorted(by_task)
    xs = range(len(tasks))
    pre = [sum(by_task[t][0]) / len(by_task[t][0]) for t in tasks]
    post = [sum(by_task[t][1]) / len(by_task[t][1]) for t in tasks]
    ax.bar([x - 0.2 for x in xs], pre, width=0.4, label="pre")
    ax.bar([x + 0.2 for x in xs], post, width=0.4, label="post")
    ax.set_xticks(list(xs), [f"{t}\n(n={len(by_task[t][0])})" for t in tasks])
    ax.set_ylabel("accuracy")
    ax.legend(fontsize=9)
    return fig


def heldout(data: RunData) -> Figure | None:
    """Transfer: held-out family, current policy vs the untrained one, 95% intervals."""
    if not data.heldout:
        return None
    fig, ax = _fig("Held-out family: mean episode reward, trained vs untrained policy (95% CI)")
    arms = sorted({r["arm"] for r in data.heldout})
    for k, (arm, marker) in enumerate(zip(arms, itertools.cycle("os^"))):
        shift = 0.06 * (k - (len(arms) - 1) / 2)  # side by side, so equal arms stay visible
        by_step: dict[int, list[dict]] = {}
        for row in data.heldout:
            if row["arm"] == arm:
                by_step.setdefault(row["step"], []).append(row)
        steps = sorted(by_step)
        means = [sum(r["mean"] for r in by_step[s]) / len(by_step[s]) for s in steps]
        lo = [sum(r["ci95"][0] for r in by_step[s]) / len(by_step[s]) for s in steps]
        hi = [sum(r["ci95"][1] for r in by_step[s]) / len(by_step[s]) for s in steps]
        below = [m - a for m, a in zip(means, lo, strict=True)]
        above = [b - m for m, b in zip(means, hi, strict=True)]
        ax.errorbar([s + shift for s in steps], means, yerr=[below, above], marker=marker,
                    capsize=4, label=arm)
    ax.set_xlabel("outer step")
    ax.set_ylabel("reward")
    ax.legend(fontsize=9)
    return fig


def base_models(data: RunData) -> Figure | None:
    rows = [r for r in data.steps if r.get("base_model_share")]
    if not rows:
        return None
    fig, ax = _fig("Base-model share of jobs")
    names = sorted({m for r in rows for m in r["base_model_share"]})
    ax.stackplot([r["step"] for r in rows],
                 *[[r["base_model_share"].get(m, 0.0) for r in rows] for m in names],
                 labels=names, alpha=0.8)
    ax.set_ylim(0, 1)
    ax.set_xlabel("outer step")
    ax.legend(loc="upper left", fontsize=9)
    return fig


def hyperparameters(data: RunData) -> Figure | None:
    steps, use = _series(data, "hyperparameter_surface_use")
    if not steps:
        return None
    fig, ax = _fig("Hyperparameter-surface use: share of episodes changing ≥ 1 knob")
    ax.plot(steps, use, marker="o", ms=3)
    ax.set_ylim(-0.03, 1.03)
    ax.set_xlabel("outer step")
    return fig


def cost(data: RunData) -> Figure | None:
    steps, per_step = _series(data, "cost_usd")
    if not steps:
        return None
    fig, ax = _fig("Cost per step (bars) and cumulative (line), USD")
    ax.bar(steps, per_step, alpha=0.6, label="per step")
    ax2 = ax.twinx()
    ax2.plot(steps, list(itertools.accumulate(per_step)), color="black", label="cumulative")
    ax.set_xlabel("outer step")
    ax.set_ylabel("USD per step")
    ax2.set_ylabel("USD cumulative")
    return fig


def staleness(data: RunData) -> Figure | None:
    steps, mean = _series(data, "staleness_mean")
    if not steps:
        return None
    fig, ax = _fig("Off-policy staleness of trained groups (policy versions behind)")
    ax.plot(steps, mean, marker="o", ms=3, label="mean")
    msteps, mx = _series(data, "staleness_max")
    if msteps:
        ax.plot(msteps, mx, ls="--", label="max")
    dropped = [(r["step"], r.get("stale_groups_dropped", 0)) for r in data.steps]
    if any(d for _, d in dropped):
        ax.bar([s for s, _ in dropped], [d for _, d in dropped], alpha=0.3, label="groups dropped")
    ax.set_xlabel("outer step")
    ax.legend(fontsize=9)
    return fig


FIGURES: dict[str, tuple[str, Callable[[RunData], Figure | None]]] = {
    "reward": ("Reward", reward),
    "reliability": ("Validation and job failures", reliability),
    "pre_post": ("Hidden eval before and after", pre_post),
    "heldout": ("Held-out transfer", heldout),
    "base_models": ("Base-model choice", base_models),
    "hyperparameters": ("Hyperparameter surface", hyperparameters),
    "cost": ("Cost", cost),
    "staleness": ("Staleness", staleness),
}
