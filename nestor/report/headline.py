"""The write-up's five questions as one table: the report's top and `nestor runs show`.

The numbers and verdicts come from nestor.report.findings (their one definition); this module
only words and formats them."""

from __future__ import annotations

from typing import Any

from nestor.report import fmt
from nestor.report.data import RunData
from nestor.report.findings import NOT_ENOUGH, SATURATION, Findings, compute_findings

QUESTIONS = {
    "reward": "Did the reward rise? (first → peak → last)",
    "rungs": "Two rungs: validation saturates, then the improvement climbs",
    "strong_model": "Does it move to the stronger base model? (share of jobs)",
    "hp_use": "Does it use the hyperparameter surface? (share of episodes)",
    "transfer": "Does it transfer to the held-out family? (trained vs untrained)",
}
MARKS = {True: "target met", False: "target not met", None: NOT_ENOUGH}


def findings(data: RunData) -> Findings:
    return compute_findings(data.steps, data.heldout)


def _third_pair(first: float | None, last: float | None, as_pct: bool) -> str:
    f = fmt.pct if as_pct else fmt.num
    return f"{f(first)} → {f(last)} (first → last third)"


def _numbers(key: str, f: Findings, data: RunData) -> str:
    if key == "reward":
        r = f.reward
        if r["first"] is None:
            return fmt.DASH
        return (f"{fmt.num(r['first'])} → {fmt.num(r['peak'])} (step {r['peak_step']}) → "
                f"{fmt.num(r['last'])}")
    if key == "rungs":
        name = ("first-try validation" if f.validation.get("metric") == "first_try_pass_rate"
                else "validation")
        sat = (f"{name} ≥ {SATURATION:.0%} from step {f.validation_saturation_step}"
               if f.validation_saturation_step is not None else f"{name}: never saturated")
        climb = (f"improvement climbs from step {f.improvement_climb_step}"
                 if f.improvement_climb_step is not None else "improvement: no lasting climb")
        return f"{sat}; {climb}"
    if key == "strong_model":
        if f.strong_model is None:
            return fmt.DASH
        return f"{f.strong_model}: " + _third_pair(f.strong_share["first"],
                                                   f.strong_share["last"], True)
    if key == "hp_use":
        return _third_pair(f.hp_use["first"], f.hp_use["last"], True)
    if key == "transfer":
        t = f.transfer
        if t is None:
            return ("held-out rows without per-episode values" if data.heldout
                    else "no held-out evaluation (heldout_episodes = 0)")
        return (f"trained {fmt.num(t.trained.mean)} {fmt.interval(*t.trained.ci95)} "
                f"(n = {t.trained.n}) vs untrained {fmt.num(t.untrained.mean)} "
                f"{fmt.interval(*t.untrained.ci95)} (n = {t.untrained.n}), step {t.step}")
    raise KeyError(key)


def headline(data: RunData) -> list[dict[str, Any]]:
    """One row per question: question, numbers (formatted), mark, verdict (findings' own)."""
    f = findings(data)
    rows = []
    for key, question in QUESTIONS.items():
        met, verdict = f.targets.get(key), f.verdicts.get(key, NOT_ENOUGH)
        rows.append({"key": key, "question": question, "numbers": _numbers(key, f, data),
                     "met": met, "mark": MARKS[met],
                     "verdict": "" if verdict == MARKS[met] else verdict})
    return rows
