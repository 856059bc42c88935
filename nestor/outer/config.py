"""The run config (`nestor train CONFIG`): a TOML file validated into `RunConfig`.

Every field has a default, a range and a description; the resolved config is written to
RUN_DIR/config.toml so that a run can be resumed (and reproduced) from its directory alone.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal

import tomli_w
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from nestor.agent.reward import RewardConfig
from nestor.config import validation_problems
from nestor.models.loops import LOOP_MIN_SPAN
from nestor.models.precision import Precision
from nestor.outer.tracking import LoggingConfig


class RunConfigError(ValueError):
    """The run config is missing, not TOML, out of range or names a held-out task."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PolicyConfig(_Section):
    kind: Literal["composer", "lm", "tinker"] = Field(
        "composer", description="Who writes jobs: the structured composer, an HF chat LM "
        "trained here, or a model LoRA-trained through Tinker's API.")
    model: str = Field("tiny-m", description="lm: registry name or local path of the chat "
                       "model; tinker: the service's base model (e.g. Qwen/Qwen3-8B).")
    lora_rank: int = Field(8, ge=1, le=256, description="lm, tinker: LoRA rank of the trained "
                           "adapter (tinker-cookbook uses 32).")
    lora_alpha: int = Field(16, ge=1, le=1024, description="lm: LoRA scaling alpha.")
    temperature: float = Field(1.0, ge=0.05, le=2.0, description="lm, tinker: sampling "
                               "temperature (tinker trains on plain logits: keep 1.0 for "
                               "on-policy ratios).")
    max_new_tokens: int | None = Field(
        None, ge=1, le=32768, description="lm: token cap per turn; default a quarter of the "
        "model's context, within 256..4096 (a turn may write a whole dataset file).")
    stop_repeats: int = Field(
        LOOP_MIN_SPAN, ge=0, le=32768, description="lm: end a reply, unfinished, once its last "
        "N tokens or more are one piece (of up to 128 tokens) repeated three times or more — a "
        "loop that would run to the turn's cap; the agent is told so. 0: never.")
    device: str = Field("cpu", description="lm: torch device of the policy model.")
    tool_format: Literal["auto", "json", "qwen3_5"] = Field(
        "auto", description="lm, tinker: how the model writes tool calls: json (Qwen3, Hermes) or "
        "qwen3_5 (Qwen3.5/3.6 XML); auto reads the model's chat template.")
    tinker_service: Literal["remote", "local"] = Field(
        "remote", description="tinker: the real API ($TINKER_API_KEY) or the offline stand-in "
        "on a local model (nestor/policy/tinker_local.py; tests, CPU dry runs).")
    tinker_base_url: str | None = Field(None, description="tinker: API base URL (default the "
                                        "SDK's).")
    tinker_api_key_env: str = Field("TINKER_API_KEY", description="tinker: environment "
                                    "variable holding the API key.")
    init_checkpoint: str | None = Field(
        None, description="tinker: a policy checkpoint directory (holding tinker.json, e.g. a "
        "warm start's) whose weights the run starts from, with a fresh optimizer.")
    adapter: str | None = Field(
        None, description="lm: start from this LoRA adapter, a `nestor sft` warm start (its "
        "--out DIR); lora_rank and lora_alpha must match it. A resumed run loads its own "
        "checkpoint instead.")
    response_prefix: str = Field(
        "", max_length=200, description="lm: text every reply starts with, given in the context "
        "(never sampled, never trained), e.g. '<tool_call>{\"name\": \"' for a model too small "
        "to call a tool unprompted.")
    max_context: int | None = Field(
        None, ge=256, le=262144, description="lm: context window in tokens (default the "
        "model's max_position_embeddings, 36,864+ for Qwen3): a turn's context keeps its most "
        "recent max_context - max_new_tokens tokens. Lower it when a long episode runs out of "
        "memory. tinker: default what the service reports for the model.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="lm: dtype of the model's frozen weights (auto: float32 on the CPU, "
        "the checkpoint's own elsewhere, bf16 for Qwen3); the LoRA and its Adam state are "
        "always float32.")
    gradient_checkpointing: bool = Field(
        True, description="lm: recompute activations in the backward pass (memory ~ one layer "
        "of a sequence, not all of them; ~30% more compute).")
    train_precision: Precision = Field(
        "float32", description="lm: the learner's forward pass: float32 (on-policy the IS "
        "ratio is exactly 1) or bf16 autocast (auto: where the device computes bf16 natively; "
        "measured ~2x faster on a bf16 CPU, the ratio then off 1 by the rounding, which the "
        "truncated IS ratio absorbs). The LoRA and Adam stay float32.")
    prefix_cache_tokens: int = Field(
        8192, ge=0, le=1_000_000, description="lm: tokens of shared prompt prefixes whose KV "
        "cache is kept across sampling calls (the system prompt, a lone episode's last "
        "context); 0 = off.")
    extend_contexts: bool = Field(
        True, description="lm: a turn's context is the previous turn's context + its sampled "
        "tokens + the new messages (the model sees its own tokens and an episode trains in one "
        "forward pass); false: the chat template re-renders the whole conversation each turn.")
    merge_lora: bool = Field(
        True, description="lm: act with the LoRA merged into float32 base weights (one "
        "matmul per layer instead of three); training sees it apart. Never merged into "
        "bf16/fp16 weights.")
    credit: Literal["marginal", "episode"] = Field(
        "marginal", description="composer: marginal (each decision learns from its choices' "
        "pooled mean advantages, SGD at credit_lr) or episode (IS-GRPO with Adam at "
        "learning_rate).")
    credit_lr: float = Field(5.0, gt=0, le=1000, description="composer, marginal credit: SGD "
                             "rate on the decision logits.")
    p_slip: float = Field(0.1, ge=0, lt=1, description="composer: version-0 probability of "
                          "each naive-writer slip (docs/agent.md); each fails validation.")
    model_conditioned: bool = Field(True, description="composer: a per-base-model offset on "
                                    "the config decisions (the right config depends on the "
                                    "model).")

    @model_validator(mode="after")
    def _turn_fits_the_context(self) -> PolicyConfig:
        if self.max_context and self.max_new_tokens and self.max_new_tokens >= self.max_context:
            raise ValueError(f"max_new_tokens ({self.max_new_tokens}) must be below max_context "
                             f"({self.max_context}): a turn's context needs room too")
        return self


class RunConfig(_Section):
    name: str = Field("run", min_length=1, max_length=64, description="Run name (run-dir prefix).")
    seed: int = Field(0, ge=0, le=2**31 - 1, description="Seed of task order, policy and sampling.")
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    tasks: list[str] = Field(min_length=1, description="Training task ids; held-out ones refused.")
    difficulty: int = Field(0, ge=0, le=3, description="Task difficulty level.")
    group_size: int = Field(4, ge=2, le=64, description="G: episodes per task spec in a group.")
    groups_per_step: int = Field(2, ge=1, le=64, description="B: completed groups per update.")
    max_in_flight: int = Field(8, ge=1, le=1024, description="Episodes running at once.")
    max_steps_off_policy: int = Field(
        2, ge=0, le=100, description="Groups sampled more policy versions ago than this are stale.")
    stale_groups: Literal["reweight", "drop"] = Field(
        "reweight", description="Stale groups: kept with importance weights, or dropped.")
    loss: Literal["importance_sampling"] = Field(
        "importance_sampling", description="Sum over policy actions of -exp(logp - logp_sample)*A.")
    clip_ratio: float = Field(0.0, ge=0.0, le=10.0, description="PPO-style clip of the ratio to "
                              "[1-c, 1+c] (pessimistic min); 0 = plain importance sampling.")
    tis_cap: float = Field(2.0, ge=0.0, le=100.0, description="lm, tinker: truncate each token's "
                           "importance ratio at this value (truncated IS); 0 = no cap.")
    token_max_staleness: int = Field(
        4, ge=0, le=100, description="lm, tinker: groups sampled more than this many policy versions "
        "ago are dropped even when stale_groups = 'reweight'.")
    learning_rate: float = Field(0.05, gt=0.0, le=10.0, description="Policy learning rate "
                                 "(composer logits like ~0.05; LoRA on an LM ~1e-4..1e-5).")
    steps: int = Field(10, ge=1, le=100000, description="Outer training steps (policy updates).")
    reward: RewardConfig = Field(default_factory=RewardConfig, description="The episode reward: "
                                 "a preset and optional weight overrides (nestor/agent/reward.py).")
    pool: dict[str, Any] = Field(default_factory=lambda: {"backend": "local"}, description=
                                 "The pool's config (nestor.pool.config.PoolConfig): backend, "
                                 "workers, worker_types, ...")
    episode: dict[str, Any] = Field(default_factory=dict, description="Episode options "
                                    "(nestor.agent.episode.EpisodeConfig: max_turns, "
                                    "max_attempts, job_timeout_s, models, ...).")

    heldout_every: int = Field(0, ge=0, le=100000, description="Held-out transfer eval every "
                               "N steps (0 = only after the last step); see heldout_episodes.")
    heldout_episodes: int = Field(0, ge=0, le=1000, description="Episodes per held-out task "
                                  "and arm (trained / untrained) per eval; 0 = no held-out eval.")
    logging: LoggingConfig = Field(default_factory=LoggingConfig, description="Experiment "
                                   "tracking: TensorBoard and/or W&B (nestor.outer.tracking).")

    def pool_config(self):
        """The [pool] table as the pool's own config; errors become one line."""
        from nestor.pool.config import PoolConfig

        return _validate(PoolConfig, self.pool, "pool")

    def episode_config(self):
        """The [episode] table plus difficulty and the [reward] table, as the episode's config."""
        from nestor.agent.episode import EpisodeConfig

        data = {**self.episode, "difficulty": self.difficulty}
        data["reward"] = {**data.get("reward", {}),
                          **self.reward.model_dump(exclude_none=True)}
        return _validate(EpisodeConfig, data, "episode")

    def check(self, registry) -> None:
        """Everything that needs other rooms: tasks, pool and episode tables."""
        self.check_tasks(registry)
        self.pool_config()
        self.episode_config()

    def check_tasks(self, registry) -> None:
        """Refuse unknown and held-out tasks with one actionable line."""
        from nestor.tasks import TaskError

        for task_id in self.tasks:
            try:
                ref = registry.get(task_id)
            except TaskError as exc:
                raise RunConfigError(f"tasks: {exc}") from None
            if ref.heldout:
                raise RunConfigError(
                    f"tasks: {task_id!r} belongs to the held-out family {ref.family.name!r}, which "
                    "is kept for transfer evals only; remove it from the run's tasks")


def _validate(model, data: dict[str, Any], table: str):
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise RunConfigError(f"[{table}] {validation_problems(exc, model)}") from None


def parse_run_config(data: dict[str, Any], source: str = "config") -> RunConfig:
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        raise RunConfigError(f"{source}: {validation_problems(exc, RunConfig)}") from None


def load_run_config(path: Path) -> RunConfig:
    if not path.is_file():
        raise RunConfigError(f"{path}: no such config file")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise RunConfigError(f"{path}: not valid TOML: {exc}") from None
    return parse_run_config(data, str(path))


def _drop_none(data: Any) -> Any:
    """TOML has no null: unset optional fields are left out of the resolved config."""
    if isinstance(data, dict):
        return {k: _drop_none(v) for k, v in data.items() if v is not None}
    return data


def save_run_config(config: RunConfig, path: Path) -> None:
    path.write_text(tomli_w.dumps(_drop_none(config.model_dump(mode="json"))), encoding="utf-8")
