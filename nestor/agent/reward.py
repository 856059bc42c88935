"""The outer reward: what one episode earned. The one reward module of the project.

    reward = w_valid   × validation × paid      # paid = 1 only if the job trained (below)
           + w_quality × (post_share × post × moved + (1 − post_share) × uplift)
           + w_speed   × speed × paid
           + w_wellformed × wellformed_rate + w_files × files_score + w_probe × probe_fraction

validation = 1 for a first-try pass, 1 − (k−1)/max_attempts for a pass on try k, 0 if never.
post = the hidden-eval accuracy of the trained weights, uplift = post − pre (both 0 without a
post-score: a job that failed or never ran). speed = clip(1 − wall_s / timeout_s, 0, 1).

No safe harbour: pay for training, not for running. `moved` is 1 only when the trusted side
measured that training changed the weights (nestor/inner/change.py: relative weight change and
the mean step per weight in units of the learning rate, each above its floor; a backend that
reports no measure never counts). `paid` is 1 only when the job *trained* — it finished
(`ok`), ran at least one optimizer step, at least one step updated on a group with reward
variance, and it moved the weights. A `learning_rate = 1e-12` or `grad_clip = 1e-9` job runs
every step and changes nothing: it earns no validation, no speed, and no post-score share of
quality (that share is the base model's own score when nothing changed: choosing a strong model
is worth something only to a job that trains it); its uplift is 0. A validated job that fails,
times out or does not move the model therefore earns less than one that trained. A timeout
still post-scores the weights it has (nestor/inner/run.py), so its quality term counts when
they moved: a job that trained most of the way is not worth zero.

Presets (`[reward] preset`; any weight set explicitly overrides the preset's):

* `seed` (default) — the original write-up's reward: 0.35 × validation + 0.60 × quality
  (0.25 × post + 0.75 × uplift) + 0.05 × speed. Why the default: it is the reward whose arc
  the project reproduces; the post-score share is what makes the stronger base model worth
  choosing (uplift alone favours a weak model whose pre-score sits near 0, measured in issue
  15); and the validation term, paid only for jobs that trained, gives the first rung
  (stop failing validation) a signal without rewarding no-op jobs.
* `uplift` — uplift alone with small validation/speed terms (1.0 / 0.1 / 0.02, post_share 0):
  the earlier default, kept for comparison.

Shaping terms for token policies that rarely call tools at first (weights 0 in every preset;
the episode records the signals either way): `wellformed_rate` (share of the policy's turns
with at least one tool call and no malformed call), `files_score` (distinct job files
written / 4, capped at 1), `probe_fraction` (the best attempt's share of passed probe checks).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from nestor.inner.change import moved as change_moved
from nestor.inner.types import JobResult

PRESETS: dict[str, dict[str, float]] = {
    "seed": {"w_valid": 0.35, "w_quality": 0.60, "post_share": 0.25, "w_speed": 0.05},
    "uplift": {"w_valid": 0.1, "w_quality": 1.0, "post_share": 0.0, "w_speed": 0.02},
}
JOB_FILES = 4  # config.toml, data/train.jsonl, env/pyproject.toml, env/<pkg>/__init__.py
_W = {"ge": 0.0, "le": 10.0}


class RewardConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    preset: Literal["seed", "uplift"] = Field("seed", description="Named weights: `seed` (the "
                                              "write-up's 0.35/0.60/0.05) or `uplift`.")
    w_valid: float | None = Field(None, **_W, description="Weight of validation efficiency "
                                  "(paid only when the job trained); None = the preset's.")
    w_quality: float | None = Field(None, **_W, validation_alias=AliasChoices(
        "w_quality", "w_improvement"), description="Weight of job quality (post_share × post + "
        "(1 − post_share) × uplift); None = the preset's. `w_improvement` is accepted too.")
    post_share: float | None = Field(None, ge=0.0, le=1.0, description="Share of the "
                                     "post-score in quality (the rest is uplift).")
    w_speed: float | None = Field(None, **_W, description="Weight of speed "
                                  "(1 − wall/timeout), paid only when the job trained.")
    w_wellformed: float = Field(0.0, **_W, description="Shaping: weight of the share of "
                                "turns with well-formed tool calls.")
    w_files: float = Field(0.0, **_W, description="Shaping: weight of job files written / 4.")
    w_probe: float = Field(0.0, **_W, description="Shaping: weight of the best attempt's share "
                           "of passed probe checks.")

    def weights(self) -> dict[str, float]:
        """The resolved weights: the preset's, overridden by any set explicitly."""
        base = PRESETS[self.preset]
        out = {k: float(getattr(self, k) if getattr(self, k) is not None else v)
               for k, v in base.items()}
        out.update(w_wellformed=self.w_wellformed, w_files=self.w_files, w_probe=self.w_probe)
        return out


def validation_efficiency(passed_on: int | None, max_attempts: int) -> float:
    """1.0 for a pass on the first attempt, linearly less per extra attempt, 0 if never."""
    if passed_on is None:
        return 0.0
    return max(0.0, 1.0 - (passed_on - 1) / max_attempts)


def speed_score(result: JobResult | None, timeout_s: float) -> float:
    if result is None or result.status != "ok" or timeout_s <= 0:
        return 0.0
    return min(1.0, max(0.0, 1.0 - result.wall_s / timeout_s))


def scores_of(result: JobResult | None) -> tuple[float, float]:
    """(post, uplift) of a job that was post-scored (finished or timed out), else (0, 0)."""
    if result is None or result.status not in ("ok", "timeout") or result.post_score is None:
        return 0.0, 0.0
    post = float(result.post_score)
    if result.improvement is not None:
        return post, float(result.improvement)
    return post, post - float(result.pre_score or 0.0)


def improvement_of(result: JobResult | None) -> float:
    return scores_of(result)[1]


def moved(result: JobResult | None) -> bool:
    """The trusted side measured that training changed the weights (inner/change.py)."""
    return result is not None and change_moved(result.step_efficiency, result.grid_steps)


def trained(result: JobResult | None) -> bool:
    """The job finished and moved its weights: ≥ 1 step, ≥ 1 step on a group with reward
    variance (a step that skipped every group updated nothing), and a measured change above
    the floors (steps that changed nothing are running, not training)."""
    if result is None or result.status != "ok" or result.steps < 1:
        return False
    used = [m.get("groups_trained") for m in result.metrics if isinstance(m, dict)]
    if used and all(u is not None for u in used) and sum(used) == 0:
        return False
    return moved(result)


def compute_reward(result: JobResult | None, *, passed_on: int | None, max_attempts: int,
                   timeout_s: float, config: RewardConfig | None = None,
                   signals: dict[str, float] | None = None) -> tuple[float, dict[str, Any]]:
    """(reward, components): every term, its weight, and the facts it was computed from."""
    cfg = config or RewardConfig()
    w = cfg.weights()
    sig = {"wellformed_rate": 0.0, "files_score": 0.0, "probe_fraction": 0.0, **(signals or {})}
    post, uplift = scores_of(result)
    paid = trained(result)
    changed = moved(result)
    efficiency = validation_efficiency(passed_on, max_attempts)
    speed = speed_score(result, timeout_s)
    quality = w["post_share"] * post * changed + (1.0 - w["post_share"]) * uplift
    # The weighted terms sum to the reward; reports stack them.
    terms = {"weighted_validation": w["w_valid"] * efficiency * paid,
             "weighted_quality": w["w_quality"] * quality,
             "weighted_speed": w["w_speed"] * speed * paid,
             "weighted_wellformed": w["w_wellformed"] * float(sig["wellformed_rate"]),
             "weighted_files": w["w_files"] * float(sig["files_score"]),
             "weighted_probe": w["w_probe"] * float(sig["probe_fraction"])}
    reward = sum(terms.values())
    components = {
        "preset": cfg.preset,
        "validation_efficiency": efficiency,
        "trained": float(paid),
        "moved": float(changed),
        "weight_change": None if result is None else result.weight_change,
        "step_efficiency": None if result is None else result.step_efficiency,
        "grid_steps": None if result is None else result.grid_steps,
        "post": post,
        "improvement": uplift,
        "quality": quality,
        "speed": speed,
        "speed_counted": paid,
        **{k: float(v) for k, v in sig.items()},
        "weights": w,
        **terms,
        "reward": reward,
    }
    return reward, components
