"""JobConfig: the hyperparameter surface of one inner training job (`config.toml`).

Every knob has a default that trains something on the tiny models, a range, and a description;
the agent reads this surface (docs/job-format.md) and a good agent moves off the defaults.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from nestor.config import validation_problems
from nestor.models.registry import LR_MAX, learning_rate_ranges

DEFAULT_TOKEN_BUDGET = 150_000  # sampled tokens per job; callers may set their own cap
# A job's config.toml and env/pyproject.toml are < 4 KB in practice; the caps keep tomllib
# fast (deep dotted keys parse super-quadratically: 64 KiB of `x.x.x… = 1` takes ~30 s).
MAX_CONFIG_BYTES = MAX_TOML_BYTES = 16 << 10
MAX_KEY_DEPTH = 16
TOO_DEEP = "not valid TOML: arrays or tables nested too deeply to parse; keep them shallow"
_SEG = r"""(?:[A-Za-z0-9_-]++|"[^"\n]*+"|'[^'\n]*+')"""  # a bare or quoted key part
# The lookbehind starts a match only at a key part's start, so the scan stays linear.
_DEEP_KEY = re.compile(rf"(?<![\w-]){_SEG}(?:[ \t]*+\.[ \t]*+{_SEG}){{{MAX_KEY_DEPTH},}}")


class JobConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    base_model: str = Field("tiny-m", description="Base model to train, by registry name "
                            "(tiny-s, tiny-m; qwen3-0.6b, qwen3-1.7b on a cluster).")
    learning_rate: float = Field(3e-4, gt=0, le=LR_MAX, description="AdamW learning rate; "
                                 "by model scale (full fine-tune): " + learning_rate_ranges() + ".")
    max_steps: int = Field(30, ge=1, le=2000, description="Optimizer steps (one batch of prompts each).")
    prompts_per_step: int = Field(16, ge=1, le=256, description="Distinct prompts sampled per step.")
    group_size: int = Field(8, ge=2, le=64, description="Completions per prompt; the advantage "
                            "baseline is their mean reward.")
    max_new_tokens: int = Field(12, ge=1, le=1024, description="Completion length cap in tokens.")
    temperature: float = Field(1.0, ge=0.05, le=2.0, description="Sampling temperature for rollouts.")
    lora_rank: int = Field(0, ge=0, le=256, description="LoRA rank; 0 = full fine-tune.")
    lora_alpha: int = Field(32, ge=1, le=1024, description="LoRA scaling alpha (ignored when rank is 0).")
    clip_ratio: float = Field(0.2, ge=0.0, le=1.0, description="PPO-style clip of the importance "
                              "ratio to [1-c, 1+c]; 0 disables clipping.")
    kl_coef: float = Field(0.0, ge=0.0, le=1.0, description="Weight of a k3 KL penalty to the base model.")
    updates_per_step: int = Field(1, ge=1, le=4, description="Optimizer passes over each sampled "
                                  "batch; >1 makes the importance ratio and clipping bite.")
    scale_rewards: bool = Field(False, description="Divide advantages by the group's reward std.")
    skip_zero_variance: bool = Field(True, description="Drop groups whose rewards are all equal "
                                     "(they carry no signal).")
    weight_decay: float = Field(0.0, ge=0.0, le=0.5, description="AdamW weight decay.")
    grad_clip: float = Field(1.0, ge=0.0, le=100.0, description="Global gradient-norm clip; 0 disables.")
    micro_batch_prompts: int = Field(0, ge=0, le=256, description="Prompt groups per "
                                     "forward/backward pass, gradients accumulated (a memory "
                                     "knob: same loss); 0 = the whole step at once.")
    seed: int = Field(0, ge=0, le=2**31 - 1, description="Seed for sampling and initialisation.")
    loss: Literal["token_is"] = Field("token_is", description="Token-level importance-ratio policy gradient.")

    def sampled_tokens(self) -> int:
        """Upper bound on tokens sampled: what the budget rule counts."""
        return self.max_steps * self.prompts_per_step * self.group_size * self.max_new_tokens

    def budget_error(self, cap: int = DEFAULT_TOKEN_BUDGET) -> str | None:
        used = self.sampled_tokens()
        if used <= cap:
            return None
        per_step = self.prompts_per_step * self.group_size * self.max_new_tokens
        # The fix as a number to copy (a small LM repairs by copying, not by dividing).
        fix = (f"max_steps = {cap // per_step} fits" if cap >= per_step else
               f"even one step is over: prompts_per_step × group_size ≤ "
               f"{cap // self.max_new_tokens} fits at this max_new_tokens")
        return (f"budget: max_steps × prompts_per_step × group_size × max_new_tokens = "
                f"{self.max_steps}×{self.prompts_per_step}×{self.group_size}×{self.max_new_tokens} "
                f"= {used:,} sampled tokens, over the cap of {cap:,}; lower one of them "
                f"({fix})")


class JobConfigError(ValueError):
    """config.toml is missing, not TOML, or out of range; the message says what to fix."""


def read_toml(root: Path | str, rel: str) -> dict:
    """The TOML file `rel` of a job directory, read without following a link and parsed only
    if it is small and shallow; JobConfigError says what to fix."""
    from nestor.job.safe_read import UnsafeFileError, read_text

    try:
        text = read_text(root, rel, MAX_TOML_BYTES)
    except UnsafeFileError as exc:
        raise JobConfigError(str(exc)) from None
    deep = _DEEP_KEY.search(text)
    if deep:
        raise JobConfigError(f"{rel}: a key or table name is dotted more than {MAX_KEY_DEPTH} "
                             f"levels deep ({deep.group()[:40]}…); keep keys shallow")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise JobConfigError(f"{rel}: not valid TOML: {exc}") from None
    except RecursionError:  # a few KB of `[[[[...` exhausts the parser's stack
        raise JobConfigError(f"{rel}: {TOO_DEEP}") from None
    except ValueError:  # tomllib's int() of thousands of digits: over Python's digit limit
        raise JobConfigError(f"{rel}: not valid TOML: a number has too many digits to read; "
                             "write numbers of a few digits") from None


def job_config(data: dict, name: str = "config.toml") -> JobConfig:
    """`data` (a parsed config.toml) as a JobConfig, or JobConfigError naming the problems."""
    try:
        return JobConfig.model_validate(data)
    except ValidationError as exc:
        problems = validation_problems(exc, JobConfig)
        raise JobConfigError(f"{name}: {problems}") from None


def load_job_config(path: Path) -> JobConfig:
    """The JobConfig in `path` (a job's config.toml), read without following a link."""
    path = Path(path)
    return job_config(read_toml(path.parent, path.name), path.name)
