"""The write-up's five findings, computed from one run's metrics.jsonl and heldout.jsonl rows.

This module is the single definition (docs/outer.md, "The arc's findings", states it in prose);
`benchmarks/arc.py` and `nestor report` both call `compute_findings`. Definitions:

* **Thirds.** Rows sorted by step; with n steps, k = max(1, n // 3); the first third is the
  first k rows, the last third the last k. Fewer than 3 steps: "not enough data".
* **Reward.** first, peak (and its step), last `reward_mean`; thirds' means. Target: the
  last-third mean at least doubles the first-third mean (if the first third is ≤ 0: the last
  third is > 0 and above it).
* **Rungs.** The validation series is `first_try_pass_rate` (the share of the step's episodes
  whose job passed validation on its first submit: what the validation term pays in full);
  runs recorded before it existed fall back to `validation_pass_rate` (passed on any attempt),
  and `validation["metric"]` names the one used. `validation_saturation_step` is the first step
  s from which the forward rolling mean of that series over WINDOW steps (fewer at the end) is
  ≥ SATURATION at s and at every later step. `improvement_climb_step` is the first step s from
  which the forward rolling mean of `hidden_eval_improvement` stays above the first-third mean
  + CLIMB_MARGIN at s and at every later step. Rung 1 is shown when validation saturates at a
  step after the run's first (saturated from the first step: there was nothing to learn);
  rung 2 when the improvement's last-third mean exceeds its first-third mean. Target (and the
  verdict's "two rungs"): both shown. `rungs_shown` holds each.
* **Stronger model.** Its share of the step's trained jobs (0 in a step with jobs on other
  models only; steps without jobs skipped), first-third mean → last-third mean. Target: rises.
  Unnamed, it is the strongest model seen, by the registry's order (weakest first).
* **Hyperparameter surface.** `hyperparameter_surface_use`, first-third mean → last-third mean.
* **Transfer.** At the last step with a trained held-out arm: every episode's reward of each
  arm, pooled over the held-out tasks (rows' `values`; a row without them counts only if n=1),
  mean and a Student-t 95% interval. Target: the intervals do not overlap, trained above.
  Fewer than 2 episodes in an arm: "not enough data".
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

SATURATION = 0.8  # first-try validation pass rate counted as saturated
WINDOW = 3  # steps in the forward rolling means of the rung definitions
CLIMB_MARGIN = 0.02  # improvement above the first third's mean that counts as a climb
MIN_STEPS = 3
NOT_ENOUGH = "not enough data"
FINDINGS = ("reward", "rungs", "strong_model", "hp_use", "transfer")

# two-sided 95% Student-t quantiles by degrees of freedom (df > 30: the normal 1.96 region)
_T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
        9: 2.262, 10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120,
        17: 2.110, 18: 2.101, 19: 2.093, 20: 2.086, 22: 2.074, 24: 2.064, 26: 2.056,
        28: 2.048, 30: 2.042}


def t95(df: int) -> float:
    """The two-sided 95% Student-t quantile (a conservative table look-up)."""
    if df < 1:
        return math.inf
    if df > 30:
        return 2.042 if df < 40 else 2.021 if df < 60 else 2.0 if df < 120 else 1.96
    return _T95.get(df) or _T95[max(k for k in _T95 if k <= df)]


def mean_ci95(values: list[float]) -> tuple[float, list[float]]:
    """Mean and Student-t 95% interval of the mean ([mean, mean] for one value)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, [mean, mean]
    half = t95(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return mean, [mean - half, mean + half]


@dataclass
class Arm:
    mean: float
    ci95: list[float]
    n: int


@dataclass
class Transfer:
    step: int
    trained: Arm
    untrained: Arm


@dataclass
class Findings:
    steps: int
    reward: dict[str, float | int | None]  # first, peak, peak_step, last, first_third, last_third
    validation_saturation_step: int | None
    improvement_climb_step: int | None
    validation: dict[str, Any]  # metric (the series used), first_third, last_third
    improvement: dict[str, float | None]  # first_third, last_third
    rungs_shown: dict[str, bool | None]  # validation (rung 1), improvement (rung 2)
    strong_model: str | None
    strong_share: dict[str, float | None]  # first, last (thirds' means)
    hp_use: dict[str, float | None]  # first, last (thirds' means)
    transfer: Transfer | None
    verdicts: dict[str, str] = field(default_factory=dict)
    targets: dict[str, bool | None] = field(default_factory=dict)  # None: not enough data

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _num(v: Any) -> float | None:
    return None if v is None else float(v)


def _series(rows: list[dict], key: str) -> list[tuple[int, float]]:
    return [(int(r["step"]), float(r[key])) for r in rows if r.get(key) is not None]


def _thirds(values: list[float]) -> tuple[float | None, float | None]:
    if len(values) < MIN_STEPS:
        return None, None
    k = max(1, len(values) // 3)
    return statistics.fmean(values[:k]), statistics.fmean(values[-k:])


def _stays_from(series: list[tuple[int, float]], ok) -> int | None:
    """First step whose forward rolling mean, and every later one's, satisfies `ok`."""
    vals = [v for _, v in series]
    rolling = [statistics.fmean(vals[i:i + WINDOW]) for i in range(len(vals))]
    found = None
    for (step, _), m in zip(reversed(series), reversed(rolling), strict=True):
        if not ok(m):
            break
        found = step
    return found


def _strongest(models: set[str]) -> str | None:
    from nestor.models.registry import MODEL_NAMES

    known = [m for m in MODEL_NAMES if m in models]
    return known[-1] if known else None


def _arm_values(rows: list[dict]) -> list[float]:
    values: list[float] = []
    for r in rows:
        if r.get("values") is not None:
            values += [float(v) for v in r["values"]]
        elif int(r.get("n", 0)) == 1 and r.get("mean") is not None:
            values.append(float(r["mean"]))
    return values


def _transfer(heldout: list[dict]) -> Transfer | None:
    trained_steps = [int(r["step"]) for r in heldout if r.get("arm") == "trained"]
    if not trained_steps:
        return None
    step = max(trained_steps)
    arms = {}
    for arm in ("trained", "untrained"):
        rows = [r for r in heldout if r.get("arm") == arm and int(r["step"]) == step]
        if not rows and arm == "untrained":  # cached once; any step's copy is the same
            first = min((int(r["step"]) for r in heldout if r.get("arm") == arm), default=None)
            rows = [r for r in heldout if r.get("arm") == arm and int(r["step"]) == first]
        values = _arm_values(rows)
        if not values:
            return None
        mean, ci = mean_ci95(values)
        arms[arm] = Arm(mean, ci, len(values))
    return Transfer(step, arms["trained"], arms["untrained"])


def _f(x: float | None) -> str:
    return "?" if x is None else f"{x:.3f}"


def compute_findings(steps: list[dict], heldout: list[dict],
                     strong_model: str | None = None) -> Findings:
    """The five findings of one run (see the module docstring for every definition)."""
    rows = sorted((r for r in steps if "step" in r), key=lambda r: int(r["step"]))
    verdicts: dict[str, str] = {}
    targets: dict[str, bool | None] = {}

    # 1. reward: first -> peak -> last, thirds
    rew = _series(rows, "reward_mean")
    reward: dict[str, float | int | None] = dict.fromkeys(
        ("first", "peak", "peak_step", "last", "first_third", "last_third"))
    if rew:
        peak_step, peak = max(rew, key=lambda sv: sv[1])
        reward.update(first=rew[0][1], peak=peak, peak_step=peak_step, last=rew[-1][1])
    reward["first_third"], reward["last_third"] = _thirds([v for _, v in rew])
    a, b = reward["first_third"], reward["last_third"]
    if a is None or b is None:
        verdicts["reward"], targets["reward"] = NOT_ENOUGH, None
    else:
        met = b >= 2 * a if a > 0 else (b > 0 and b > a)
        targets["reward"] = met
        verdicts["reward"] = (
            f"reward {_f(reward['first'])} → peak {_f(reward['peak'])} (step "
            f"{reward['peak_step']}) → {_f(reward['last'])}; last third {_f(b)} "
            + ("at least doubles" if met else "does not double") + f" first third {_f(a)}")

    # 2. the two rungs: validation saturates, then the improvement climbs
    metric = ("first_try_pass_rate" if any(r.get("first_try_pass_rate") is not None for r in rows)
              else "validation_pass_rate")
    val = _series(rows, metric)
    imp = _series(rows, "hidden_eval_improvement")
    saturation = _stays_from(val, lambda m: m >= SATURATION) if len(val) >= MIN_STEPS else None
    v_first, v_last = _thirds([v for _, v in val])
    i_first, i_last = _thirds([v for _, v in imp])
    climb = None
    if i_first is not None:
        climb = _stays_from(imp, lambda m: m > i_first + CLIMB_MARGIN)
    validation = {"metric": metric, "first_third": v_first, "last_third": v_last}
    improvement = {"first_third": i_first, "last_third": i_last}
    rung1 = None if v_first is None else (saturation is not None and saturation > val[0][0])
    rung2 = None if i_first is None or i_last is None else i_last > i_first
    rungs_shown = {"validation": rung1, "improvement": rung2}
    if rung1 is None or rung2 is None:
        verdicts["rungs"], targets["rungs"] = NOT_ENOUGH, None
    else:
        targets["rungs"] = rung1 and rung2
        name = "first-try validation" if metric == "first_try_pass_rate" else "validation"
        sat = (f"saturated (≥{SATURATION:.0%}) from step {saturation}"
               if saturation is not None else "never saturated")
        if saturation is not None and not rung1:
            sat += " (the first step: nothing to learn)"
        clb = (f"climbed from step {climb}" if climb is not None
               else "never climbed for good")
        verdicts["rungs"] = (
            ("two rungs: " if rung1 and rung2 else "rungs not both shown: ")
            + f"rung 1 {'shown' if rung1 else 'not shown'}: {name} {_f(v_first)} (first "
            f"third) → {_f(v_last)} (last third), {sat}; rung 2 "
            f"{'shown' if rung2 else 'not shown'}: improvement {_f(i_first)} → {_f(i_last)}, "
            f"{clb}")

    # 3. the stronger model's share of jobs
    shares_rows = [r for r in rows if r.get("base_model_share")]
    strong = strong_model or _strongest({m for r in shares_rows for m in r["base_model_share"]})
    s_first = s_last = None
    if strong is not None:
        s_first, s_last = _thirds([float(r["base_model_share"].get(strong, 0.0))
                                   for r in shares_rows])
    if s_first is None or s_last is None:
        verdicts["strong_model"], targets["strong_model"] = NOT_ENOUGH, None
    else:
        targets["strong_model"] = s_last > s_first
        word = "rose" if s_last > s_first else "fell" if s_last < s_first else "stayed"
        verdicts["strong_model"] = (f"{strong}'s share of jobs {word}: {_f(s_first)} → "
                                    f"{_f(s_last)}")

    # 4. hyperparameter-surface use
    h_first, h_last = _thirds([v for _, v in _series(rows, "hyperparameter_surface_use")])
    if h_first is None or h_last is None:
        verdicts["hp_use"], targets["hp_use"] = NOT_ENOUGH, None
    else:
        targets["hp_use"] = h_last > h_first
        word = "rose" if h_last > h_first else "fell" if h_last < h_first else "stayed"
        verdicts["hp_use"] = f"hyperparameter-surface use {word}: {_f(h_first)} → {_f(h_last)}"

    # 5. held-out transfer
    transfer = _transfer(heldout)
    if transfer is None or min(transfer.trained.n, transfer.untrained.n) < 2:
        verdicts["transfer"], targets["transfer"] = NOT_ENOUGH, None
    else:
        tr, un = transfer.trained, transfer.untrained
        met = tr.ci95[0] > un.ci95[1]
        targets["transfer"] = met
        how = ("beats" if met else "is above, intervals overlapping," if tr.mean > un.mean
               else "does not beat")
        verdicts["transfer"] = (
            f"trained arm {_f(tr.mean)} [{_f(tr.ci95[0])}, {_f(tr.ci95[1])}] (n={tr.n}) {how} "
            f"untrained {_f(un.mean)} [{_f(un.ci95[0])}, {_f(un.ci95[1])}] (n={un.n})")

    return Findings(
        steps=len(rows), reward=reward, validation_saturation_step=saturation,
        improvement_climb_step=climb, validation=validation, improvement=improvement,
        rungs_shown=rungs_shown, strong_model=strong,
        strong_share={"first": s_first, "last": s_last},
        hp_use={"first": h_first, "last": h_last}, transfer=transfer,
        verdicts=verdicts, targets=targets)


def pool_findings(runs: list[Findings]) -> dict[str, Any]:
    """Across seeds: each scalar's mean and Student-t 95% interval over the runs that have it,
    and how many runs met each target."""
    def pooled(get) -> dict[str, Any] | None:
        vals = [v for v in (get(f) for f in runs) if v is not None]
        if not vals:
            return None
        mean, ci = mean_ci95([float(v) for v in vals])
        return {"mean": mean, "ci95": ci, "n": len(vals)}

    out: dict[str, Any] = {"runs": len(runs)}
    for key in ("first", "peak", "last", "first_third", "last_third"):
        out[f"reward_{key}"] = pooled(lambda f, k=key: f.reward.get(k))
    out["validation_saturation_step"] = pooled(lambda f: f.validation_saturation_step)
    out["improvement_climb_step"] = pooled(lambda f: f.improvement_climb_step)
    for key in ("first_third", "last_third"):
        out[f"validation_{key}"] = pooled(lambda f, k=key: f.validation[k])
        out[f"improvement_{key}"] = pooled(lambda f, k=key: f.improvement[k])
    for key in ("first", "last"):
        out[f"strong_share_{key}"] = pooled(lambda f, k=key: f.strong_share[k])
        out[f"hp_use_{key}"] = pooled(lambda f, k=key: f.hp_use[k])
    out["transfer_trained"] = pooled(lambda f: f.transfer.trained.mean if f.transfer else None)
    out["transfer_untrained"] = pooled(
        lambda f: f.transfer.untrained.mean if f.transfer else None)
    # paired by seed (both arms of a run share its tasks and pool): the seed is the unit
    out["transfer_gain"] = pooled(
        lambda f: f.transfer.trained.mean - f.transfer.untrained.mean if f.transfer else None)
    out["targets_met"] = {k: sum(1 for f in runs if f.targets.get(k)) for k in FINDINGS}
    out["targets_known"] = {k: sum(1 for f in runs if f.targets.get(k) is not None)
                            for k in FINDINGS}
    return out
