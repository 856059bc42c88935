"""One function per figure. Each takes RunData and returns a matplotlib Figure (or None when the
run has no data for it yet). 12 inches at 100 dpi = 1200 px wide.

Every per-step figure shares one step axis (the run's first to last step, integer ticks), and
noisy per-step series get a rolling mean drawn over faint raw points."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import matplotlib

matplotlib.use("Agg")  # headless: reports are made on servers and in CI
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import MaxNLocator, PercentFormatter  # noqa: E402

from nestor.report.data import RunData  # noqa: E402

WIDTH, HEIGHT, DPI = 12, 4.2, 100
ARM_COLOURS = {"untrained": "#9e9e9e", "trained": "#1f77b4"}
plt.rcParams.update({"axes.spines.top": False, "axes.spines.right": False, "font.size": 10})


def _fig(title: str, subtitle: str = "") -> tuple[Figure, plt.Axes]:
    fig, ax = plt.subplots(figsize=(WIDTH, HEIGHT), dpi=DPI, layout="constrained")
    fig.suptitle(title, x=0.01, ha="left", fontsize=13, fontweight="bold")
    if subtitle:
        ax.set_title(subtitle, loc="left", fontsize=9.5, color="#555")
    ax.grid(alpha=0.3)
    return fig, ax


def step_range(data: RunData) -> tuple[int, int] | None:
    """The run's step span: metrics rows and held-out evaluations together."""
    steps = [r["step"] for r in data.steps] + [r["step"] for r in data.heldout]
    return (min(steps), max(steps)) if steps else None


def _step_axis(ax: plt.Axes, data: RunData) -> None:
    span = step_range(data)
    if span is not None:
        ax.set_xlim(span[0] - 0.5, span[1] + 0.5)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("outer step")


def rolling(values: list[float], window: int) -> list[float]:
    """Trailing mean over up to `window` values (shorter at the start)."""
    out = []
    for i in range(len(values)):
        chunk = values[max(0, i - window + 1): i + 1]
        out.append(sum(chunk) / len(chunk))
    return out


def window_for(n: int) -> int:
    """No smoothing for a handful of steps; then ~a tenth of the run, at least 3."""
    return 1 if n < 6 else max(3, n // 10)


def _series(data: RunData, key: str) -> tuple[list[int], list[float]]:
    rows = [(r["step"], r[key]) for r in data.steps if r.get(key) is not None]
    return [s for s, _ in rows], [v for _, v in rows]


def _smoothed(ax: plt.Axes, steps: list[int], values: list[float], label: str, colour: str,
              marker: str = "o") -> None:
    """Raw points faint; the rolling mean (or the raw line, for a short run) bold."""
    w = window_for(len(values))
    if w == 1:
        ax.plot(steps, values, color=colour, lw=2, marker=marker, ms=5, label=label)
        return
    ax.plot(steps, values, color=colour, lw=0.8, alpha=0.35, marker=marker, ms=3,
            label=f"{label}, per step")
    ax.plot(steps, rolling(values, w), color=colour, lw=2.2,
            label=f"{label}, {w}-step rolling mean")


def reward(data: RunData) -> Figure | None:
    """Mean reward per step (rolling mean when noisy), and beneath it the weighted terms that
    sum to it: positive terms stacked up from zero, negative ones stacked down."""
    rows = [r for r in data.steps if r.get("reward_mean") is not None]
    if not rows:
        return None
    fig, ax = _fig("Reward per outer step", "bars: the weighted terms that sum to it")
    steps = [r["step"] for r in rows]
    names = sorted({k for r in rows for k in (r.get("reward_components") or {})
                    if k.startswith("weighted_")})
    up, down = [0.0] * len(rows), [0.0] * len(rows)
    for name in names:
        vals = [(r.get("reward_components") or {}).get(name) or 0.0 for r in rows]
        if not any(vals):
            continue
        base = [u if v >= 0 else d for v, u, d in zip(vals, up, down, strict=True)]
        ax.bar(steps, vals, bottom=base, width=0.7, alpha=0.45,
               label=name.removeprefix("weighted_"))
        up = [u + max(v, 0.0) for u, v in zip(up, vals, strict=True)]
        down = [d + min(v, 0.0) for d, v in zip(down, vals, strict=True)]
    _smoothed(ax, steps, [r["reward_mean"] for r in rows], "reward (mean)", "black")
    ax.axhline(0, color="grey", lw=0.8)
    _step_axis(ax, data)
    ax.set_ylabel("reward")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9, frameon=False)
    return fig


def reliability(data: RunData) -> Figure | None:
    """Rung one: validation pass rate and job failure rate."""
    steps, passed = _series(data, "validation_pass_rate")
    if not steps:
        return None
    fig, ax = _fig("Rung one: jobs that pass validation, and jobs that fail to train")
    _smoothed(ax, steps, passed, "validation pass rate (any attempt)", "#2ca02c")
    tsteps, first = _series(data, "first_try_pass_rate")
    if tsteps:  # what the validation term pays in full, and the rung's saturation measure
        _smoothed(ax, tsteps, first, "first-try pass rate", "#1f77b4", marker="^")
    fsteps, failed = _series(data, "job_failure_rate")
    if fsteps:
        _smoothed(ax, fsteps, failed, "job failure rate", "#d62728", marker="s")
    ax.set_ylim(-0.03, 1.03)
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    _step_axis(ax, data)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9, frameon=False)
    return fig


def pre_post(data: RunData) -> Figure | None:
    """Rung two: hidden-eval accuracy before and after, per task and base model."""
    by_task = data.pre_post_by_model()
    if not by_task:
        return None
    fig, ax = _fig("Rung two: hidden-eval accuracy before (light) and after (dark) training",
                   "per task and base model, mean over its jobs")
    tasks = sorted(by_task)
    models = sorted({m for t in tasks for m in by_task[t]})
    colours = dict(zip(models, itertools.cycle(plt.get_cmap("tab10").colors), strict=False))
    width = 0.8 / (2 * len(models))
    labelled: set[str] = set()
    for k, model in enumerate(models):
        for x, task in enumerate(tasks):
            if model not in by_task[task]:
                continue
            pre, post = by_task[task][model]
            left = x - 0.4 + 2 * k * width
            mpre, mpost = sum(pre) / len(pre), sum(post) / len(post)
            first = model not in labelled
            labelled.add(model)
            ax.bar(left + width / 2, mpre, width, color=colours[model], alpha=0.35,
                   label=f"{model} before" if first else None)
            ax.bar(left + 1.5 * width, mpost, width, color=colours[model],
                   label=f"{model} after" if first else None)
            ax.annotate(f"n={len(pre)}", (left + width, max(mpre, mpost)),
                        textcoords="offset points", xytext=(0, 3), ha="center", fontsize=8,
                        color="#555")
    ax.set_xticks(range(len(tasks)), tasks)
    ax.set_ylabel("hidden-eval accuracy")
    ax.set_ylim(0, max(0.05, max(max(max(p[0] + p[1]) for p in by_task[t].values())
                                 for t in tasks) * 1.2))
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9, frameon=False)
    return fig


def heldout(data: RunData) -> Figure | None:
    """Transfer: the held-out family, trained policy vs the untrained one, 95% intervals. Over
    steps when evaluated more than once; else two bars."""
    arms = data.heldout_by_step()
    if not arms:
        return None
    steps = sorted({p["step"] for points in arms.values() for p in points})
    if len(steps) == 1:
        fig, ax = _fig(f"Held-out family after step {steps[0]}: mean episode reward",
                       "whiskers: Student-t 95% interval of the mean, episodes pooled over the held-out tasks")
        names = sorted(arms, key=lambda a: a != "untrained")
        for x, arm in enumerate(names):
            (p,) = arms[arm]
            ax.bar(x, p["mean"], 0.55, color=ARM_COLOURS.get(arm, "#ff7f0e"), alpha=0.85)
            ax.errorbar(x, p["mean"], yerr=[[p["mean"] - p["ci95"][0]], [p["ci95"][1] - p["mean"]]],
                        color="black", capsize=8, lw=1.5)
            note = "" if p["ci95"][1] > p["ci95"][0] else "\n(no interval)"
            ax.annotate(f"{p['mean']:.3f}\nn = {p['n']} episodes{note}", (x, p["ci95"][1]),
                        textcoords="offset points", xytext=(0, 4), ha="center", fontsize=10)
        ax.set_xticks(range(len(names)), [f"{a} policy" for a in names])
        ax.set_xlim(-0.8, len(names) - 0.2)
        top = max(p["ci95"][1] for points in arms.values() for p in points)
        ax.set_ylim(min(0.0, min(p["ci95"][0] for pts in arms.values() for p in pts)),
                    max(0.1, top * 1.3))
        ax.set_ylabel("reward")
        return fig
    fig, ax = _fig("Held-out family: mean episode reward, trained vs untrained policy",
                   "bands: Student-t 95% interval of the mean, episodes pooled over the held-out tasks")
    for arm, points in sorted(arms.items()):
        xs = [p["step"] for p in points]
        colour = ARM_COLOURS.get(arm, "#ff7f0e")
        ax.plot(xs, [p["mean"] for p in points], marker="o", color=colour, lw=2,
                label=f"{arm} (n={points[-1]['n']} per evaluation)")
        ax.fill_between(xs, [p["ci95"][0] for p in points], [p["ci95"][1] for p in points],
                        color=colour, alpha=0.15)
    _step_axis(ax, data)
    ax.set_ylabel("reward")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9, frameon=False)
    return fig


def base_models(data: RunData) -> Figure | None:
    rows = [r for r in data.steps if r.get("base_model_share")]
    if not rows:
        return None
    fig, ax = _fig("Base-model choice: share of each step's jobs")
    names = sorted({m for r in rows for m in r["base_model_share"]})
    ax.stackplot([r["step"] for r in rows],
                 *[[r["base_model_share"].get(m, 0.0) for r in rows] for m in names],
                 labels=names, alpha=0.8)
    ax.set_ylim(0, 1)
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    _step_axis(ax, data)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9, frameon=False)
    return fig


def hyperparameters(data: RunData) -> Figure | None:
    steps, use = _series(data, "hyperparameter_surface_use")
    if not steps:
        return None
    fig, ax = _fig("Hyperparameter surface: share of episodes that move ≥ 1 knob off its default")
    _smoothed(ax, steps, use, "share of episodes", "#9467bd")
    ax.set_ylim(-0.03, 1.03)
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    _step_axis(ax, data)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9, frameon=False)
    return fig


def cost(data: RunData) -> Figure | None:
    steps, per_step = _series(data, "cost_usd")
    if not steps:
        return None
    fig, ax = _fig("Cost of inner jobs, USD", "bars: per step · line: cumulative")
    ax.bar(steps, per_step, alpha=0.6, width=0.7)
    ax2 = ax.twinx()
    ax2.plot(steps, list(itertools.accumulate(per_step)), color="black", lw=2)
    ax2.spines["right"].set_visible(True)
    _step_axis(ax, data)
    ax.set_ylabel("per step")
    ax2.set_ylabel("cumulative")
    return fig


def staleness(data: RunData) -> Figure | None:
    steps, mean = _series(data, "staleness_mean")
    if not steps:
        return None
    fig, ax = _fig("Off-policy staleness of trained groups (policy versions behind)")
    ax.plot(steps, mean, marker="o", ms=4, lw=2, label="mean")
    msteps, mx = _series(data, "staleness_max")
    if msteps:
        ax.plot(msteps, mx, ls="--", label="max")
    dropped = [(r["step"], r.get("stale_groups_dropped", 0)) for r in data.steps]
    if any(d for _, d in dropped):
        ax.bar([s for s, _ in dropped], [d for _, d in dropped], alpha=0.3, label="groups dropped")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    _step_axis(ax, data)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9, frameon=False)
    return fig


def compare_rewards(runs: list[tuple[str, RunData]]) -> Figure | None:
    """`nestor runs compare`: the runs' reward curves overlaid on one step axis."""
    runs = [(name, d) for name, d in runs if any(r.get("reward_mean") is not None
                                                 for r in d.steps)]
    if not runs:
        return None
    fig, ax = _fig("Reward per outer step", " vs ".join(name for name, _ in runs))
    colours = itertools.cycle(plt.get_cmap("tab10").colors)
    for (name, d), colour in zip(runs, colours, strict=False):
        steps, values = _series(d, "reward_mean")
        _smoothed(ax, steps, values, name, colour)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("outer step")
    ax.set_ylabel("reward")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9, frameon=False)
    return fig


CAPTIONS = {
    "reward": "Did the agent's reward rise? Mean episode reward of the groups each policy update "
              "used; the bars split it into its weighted terms.",
    "reliability": "The first rung: learning to write jobs that pass the validation probe and "
                   "then train without failing.",
    "pre_post": "The second rung: do its jobs make the base model better on the hidden eval? "
                "Light bars are the base model, dark bars the trained one.",
    "heldout": "Transfer: the same policy on a task family it never trained on, against an "
               "untrained policy. With few episodes the intervals are wide: read a direction.",
    "base_models": "Does the agent move its jobs to the stronger base model?",
    "hyperparameters": "Does the agent learn to use the hyperparameter surface instead of the "
                       "defaults?",
    "cost": "What the inner jobs cost (zero on a local pool).",
    "staleness": "How off-policy the trained groups were; stale groups are reweighted or "
                 "dropped.",
}

FIGURES: dict[str, tuple[str, Callable[[RunData], Figure | None]]] = {
    "reward": ("Reward", reward),
    "reliability": ("Rung one: validation and job failures", reliability),
    "pre_post": ("Rung two: hidden eval before and after", pre_post),
    "heldout": ("Held-out transfer", heldout),
    "base_models": ("Base-model choice", base_models),
    "hyperparameters": ("Hyperparameter surface", hyperparameters),
    "cost": ("Cost", cost),
    "staleness": ("Staleness", staleness),
}
