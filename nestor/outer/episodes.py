"""Wiring the loop to real episodes: the policy factory and the episode adapter.

`make_episode_fn` runs `nestor.agent.episode.run_episode` for a ticket and condenses its
EpisodeRecord into the EpisodeSummary the loop journals, trains on and measures.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from nestor.outer.config import RunConfig
from nestor.outer.groups import EpisodeSummary

KNOBS_IGNORED = {"base_model", "seed"}  # reported separately / not a training choice


def make_policy(config: RunConfig, run_dir: Path | None = None):
    """The run's policy, untrained (a resume loads its checkpoint afterwards). A tinker
    policy on the local stand-in keeps its saved states under RUN_DIR/tinker-local."""
    pc = config.policy
    if pc.kind == "tinker":
        from nestor.outer.config import RunConfigError
        from nestor.policy.tinker import TinkerPolicyError

        try:
            return _tinker_policy(config, run_dir)
        except TinkerPolicyError as exc:  # no key, wrong checkpoint: one line from the CLI
            raise RunConfigError(f"[policy] {exc}") from None
    if pc.kind == "lm":
        from nestor.policy.lm import LMPolicy

        policy = LMPolicy.from_pretrained(
            pc.model, device=pc.device, learning_rate=config.learning_rate,
            lora_rank=pc.lora_rank, lora_alpha=pc.lora_alpha, temperature=pc.temperature,
            max_new_tokens=pc.max_new_tokens, clip_ratio=config.clip_ratio,
            tis_cap=config.tis_cap, seed=config.seed, response_prefix=pc.response_prefix,
            dtype=pc.dtype, max_context=pc.max_context,
            gradient_checkpointing=pc.gradient_checkpointing,
            prefix_cache_tokens=pc.prefix_cache_tokens, extend_contexts=pc.extend_contexts,
            merge_lora=pc.merge_lora, tool_format=pc.tool_format,
            stop_repeats=pc.stop_repeats, train_precision=pc.train_precision)
        if pc.adapter:  # the warm start (nestor sft): RL starts from the cloned behaviour
            policy.load_adapter(pc.adapter)
        return policy
    from nestor.policy.composer import Composer, ComposerConfig

    episode = config.episode_config()
    return Composer(ComposerConfig(base_models=episode.models, lr=config.learning_rate,
                                   clip_ratio=config.clip_ratio, seed=config.seed,
                                   credit=pc.credit, credit_lr=pc.credit_lr, p_slip=pc.p_slip,
                                   model_conditioned=pc.model_conditioned,
                                   token_budget=episode.token_budget))


def _tinker_policy(config: RunConfig, run_dir: Path | None):
    from nestor.policy.tinker import TinkerPolicy, make_service

    pc = config.policy
    service = make_service(pc.tinker_service, api_key_env=pc.tinker_api_key_env,
                           base_url=pc.tinker_base_url,
                           local_root=run_dir / "tinker-local" if run_dir else None)
    policy = TinkerPolicy(
        pc.model, service=service, lora_rank=pc.lora_rank, learning_rate=config.learning_rate,
        temperature=pc.temperature, max_new_tokens=pc.max_new_tokens,
        max_context=pc.max_context, clip_ratio=config.clip_ratio, tis_cap=config.tis_cap,
        seed=config.seed, tool_format=pc.tool_format)
    if pc.init_checkpoint:
        policy.load(Path(pc.init_checkpoint), weights_only=True)
    return policy


def knobs_changed(job_dir: Path, max_new_tokens: int, token_budget: int) -> int | None:
    """How many JobConfig knobs (besides base model and seed) differ from the scaffold's config
    for the same base model, task and budget (nestor/job/scaffold.py: scaffold_config). An
    episode that changes ≥ 1 uses the hyperparameter surface (docs/outer.md)."""
    from nestor.job.config import JobConfig, load_job_config
    from nestor.job.scaffold import scaffold_config

    try:  # a metric only: whatever a bad config.toml raises must not fail the episode
        cfg = load_job_config(job_dir / "config.toml")
    except (ValueError, RecursionError):  # JobConfigError is a ValueError
        return None
    ref = scaffold_config(cfg.base_model, max_new_tokens, token_budget)
    return sum(1 for k in JobConfig.model_fields
               if k not in KNOBS_IGNORED and getattr(cfg, k) != getattr(ref, k))


def summarize(rec: Any, run_dir: Path, max_new_tokens: int, token_budget: int) -> EpisodeSummary:
    """An EpisodeRecord condensed to what training and metrics need."""
    ep_dir = run_dir / "episodes" / rec.id
    attempts = sorted(ep_dir.glob("attempt-*"), key=lambda p: int(p.name.split("-")[1]))
    job_dir = ep_dir / "job" if (ep_dir / "job").is_dir() else (attempts[-1] if attempts else None)
    result = rec.result
    counted = [r for r in rec.reports if not getattr(r, "harness_failure", False)]
    info: dict[str, Any] = {
        "episode_id": rec.id,
        "attempts": rec.attempts,
        "validated": any(getattr(r, "passed", False) for r in rec.reports),
        "first_try": bool(counted) and bool(getattr(counted[0], "passed", False)),
        "end_reason": rec.end_reason,
        "malformed_calls": sum(1 for t in rec.turns if t.parse_error),
        "knobs_changed": (knobs_changed(job_dir, max_new_tokens, token_budget)
                          if job_dir is not None else None),
        "cost_usd": float(result.cost_usd) if result is not None else 0.0,
    }
    if isinstance(rec.components.get("error"), str):  # why the policy failed (policy_error)
        info["error"] = rec.components["error"][-500:]
    if result is not None:
        info.update(job_status=result.status, improvement=result.improvement,
                    base_model=result.base_model, job_wall_s=result.wall_s)
    components = {k: float(v) for k, v in rec.components.items()
                  if isinstance(v, int | float) and not isinstance(v, bool)}
    return EpisodeSummary(group_id=-1, slot=-1, task_id=rec.task_id, reward=float(rec.reward),
                          policy_version=rec.policy_version, turns=list(rec.turns),
                          components=components, info=info)


def ledger_episodes(ledger, run_dir: Path, specs: dict[str, Any] | None = None,
                    token_budget: int = 0) -> list[EpisodeSummary]:
    """Finished episodes of this loop as recorded in the ledger (group_id "G:SLOT").

    A resume reuses them: an episode that finished just before a kill, after the ledger
    recorded it but before the loop's journal did, is not run again. Episodes cut short by the
    end of a run (policy stopped, pool shut down) are not reused: their rewards are not real.
    """
    from nestor.policy.base import Turn

    out = []
    for row in ledger.episodes(status="done"):
        gid, sep, slot = (row.get("group_id") or "").partition(":")
        if not sep or not gid.isdigit() or not slot.isdigit():
            continue
        if row["end_reason"] in ("stopped", "orphaned"):  # cut short: their rewards are not real
            continue
        full = ledger.episode(row["id"])
        results = [j["result"] for j in full["jobs"] if j["result"]]
        if any(r["status"] == "lost" for r in results):  # the pool went away: run it again
            continue
        turns = [Turn.from_dict(t) for t in full["turns"] if t["role"] == "assistant"]
        job_dir = run_dir / "episodes" / row["id"] / "job"
        info: dict[str, Any] = {
            "episode_id": row["id"], "attempts": row["attempts"],
            "validated": any(r["passed"] for r in full["reports"]),
            "end_reason": row["end_reason"],
            "malformed_calls": sum(1 for t in turns if t.parse_error),
            "knobs_changed": (knobs_changed(job_dir, specs[row["task_id"]].max_new_tokens,
                                            token_budget)
                              if job_dir.is_dir() and row["task_id"] in (specs or {}) else None),
            "cost_usd": 0.0}
        if results:
            res = results[-1]
            info.update(job_status=res["status"], improvement=res.get("improvement"),
                        base_model=res.get("base_model"), job_wall_s=res.get("wall_s"),
                        cost_usd=float(res.get("cost_usd") or 0.0))
        components = {k: float(v) for k, v in (row["components"] or {}).items()
                      if isinstance(v, int | float) and not isinstance(v, bool)}
        out.append(EpisodeSummary(int(gid), int(slot), row["task_id"], float(row["reward"]),
                                  row["policy_version"], turns, components, info,
                                  finished_at=float(row["finished"] or 0.0)))
    return out


def make_episode_fn(config: RunConfig, registry, pool, ledger, run_dir: Path):
    """(policy, ticket) -> EpisodeSummary running one real episode on the ticket's task."""
    from nestor.agent.episode import run_episode

    episode_cfg = config.episode_config()
    specs = {t: registry.get(t).spec(config.difficulty) for t in config.tasks}

    def episode(policy, ticket) -> EpisodeSummary:
        episode_id = f"g{ticket.group_id:05d}-s{ticket.slot:02d}-{uuid.uuid4().hex[:6]}"
        rec = run_episode(policy, specs[ticket.task_id], pool, ledger, episode_cfg,
                          episode_id=episode_id, group_id=f"{ticket.group_id}:{ticket.slot}",
                          seed=ticket.seed)
        return summarize(rec, run_dir, specs[ticket.task_id].max_new_tokens,
                         episode_cfg.token_budget)

    return episode
