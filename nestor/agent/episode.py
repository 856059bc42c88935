"""One outer-loop episode: a task spec in; a job written, validated and trained; a reward out.

The policy sees the conversation and the tool schemas and answers with turns of tool calls.
File tools act on the episode's workspace; `submit` freezes a copy of the workspace as an
attempt, runs the validation probe on it and answers with the report. After a failed submit
the policy keeps working, up to `max_attempts` submits. A job that passes goes to the pool and
the episode ends with its JobResult; otherwise it ends with a reason.

Durability: every message, attempt, report, job and result is committed to the ledger before
the next step acts on it. Files: RUN_DIR/episodes/<id>/{workspace,attempt-N,job}/ and
transcript.json.
"""

from __future__ import annotations

import json
import time
import traceback
import uuid
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from nestor.agent.prompt import system_prompt, task_message
from nestor.agent.reward import JOB_FILES, RewardConfig, compute_reward
from nestor.inner.types import JobRequest, JobResult
from nestor.job.config import DEFAULT_TOKEN_BUDGET
from nestor.job.memory import DEFAULT_MEMORY_CAP_MB
from nestor.ledger import Ledger
from nestor.policy.base import Message, Observation, Policy, PolicyClosed, TrainItem, Turn
from nestor.tasks import TaskSpec
from nestor.text import no_surrogates

EndReason = Literal["ok", "job_failed", "invalid", "no_submit", "turn_limit", "token_limit",
                    "policy_error", "harness_error", "not_trained", "stopped", "orphaned"]


class EpisodeConfig(BaseModel):
    max_turns: int = Field(12, ge=1, le=200, description="Policy turns before `turn_limit`.")
    max_tokens: int = Field(60_000, ge=1, description="Tokens the policy may produce over the "
                            "episode (its sampled actions; ~4 characters each for a policy that "
                            "reports none) before `token_limit`.")
    max_attempts: int = Field(3, ge=1, le=10, description="Submits (validation probes) allowed.")
    max_calls_per_turn: int = Field(16, ge=1, le=1000, description="Tool calls run per turn; "
                                    "each one past it is answered with an error, not run (one "
                                    "turn of 100 reads of a 200 KB file would otherwise store "
                                    "20 MB). An honest job is 3-4 files and a submit.")
    max_tool_bytes: int = Field(1_000_000, ge=10_000, description="UTF-8 bytes of tool results "
                                "(file reads, reports) the agent may receive over the episode; "
                                "past it each result is cut to a note. Honest episodes receive "
                                "a few KB; every byte is stored in the ledger, the transcript "
                                "and the next turn's context.")
    token_budget: int = Field(DEFAULT_TOKEN_BUDGET, gt=0, description="Sampled-token cap of "
                              "the inner job (the validation probe enforces it).")
    memory_cap_mb: int = Field(DEFAULT_MEMORY_CAP_MB, ge=64, description="Cap on the inner "
                               "trainer's estimated peak memory, MiB (the probe's `memory` check).")
    job_timeout_s: float = Field(600.0, gt=0, description="Wall-clock cap of the inner job; "
                                 "also the scale of the speed tie-breaker.")
    difficulty: int = Field(0, ge=0, le=3, description="Task difficulty (input size level).")
    models: list[str] = Field(["tiny-s", "tiny-m"], description="Base models offered.")
    prompt_style: Literal["full", "compact", "short"] = Field(
        "full", description="System prompt: the full job format and config surface (~4,200 "
        "SmolLM2 tokens), a compact one (one worked job: ~1,200, ~2,000 with the tool "
        "schemas) for small-context models, or a short one (no worked job; for a model "
        "warm-started by `nestor sft`).")
    reward: RewardConfig = Field(default_factory=RewardConfig)


@dataclass
class EpisodeRecord:
    id: str
    task_id: str
    family: str
    policy: str
    policy_version: int
    reward: float = 0.0
    components: dict[str, Any] = field(default_factory=dict)
    attempts: int = 0
    result: JobResult | None = None
    end_reason: EndReason = "no_submit"
    turns: list[Turn] = field(default_factory=list)  # the policy's turns only
    reports: list[Any] = field(default_factory=list)  # ValidationReport per attempt
    messages: list[Message] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {"episode_id": self.id, "task": self.task_id, "policy": self.policy,
                "policy_version": self.policy_version, "reward": self.reward,
                "components": self.components, "attempts": self.attempts,
                "result": self.result.model_dump(mode="json") if self.result else None,
                "end_reason": self.end_reason}

    def train_item(self, advantage: float) -> TrainItem:
        return TrainItem(turns=self.turns, advantage=advantage,
                         policy_version=self.policy_version)


# Probes per episode that may fail for the harness's own reasons (a sandbox that did not start in
# time on a loaded machine) without costing the agent an attempt; past this, they count.
MAX_HARNESS_FAILURES = 2


FAILED_SUBMIT = "validation failed"  # how the submit tool's answer to a failed job begins


def format_report(report: Any, attempt: int, max_attempts: int, trained: bool = True) -> str:
    """The submit tool's answer: a verdict line, then one `ok|FAIL name: message` line per check."""
    checks = list(report.checks)
    failed = [c for c in checks if not c.ok]
    then = "the job was sent for training." if trained else "the job is final (not trained here)."
    head = (f"validation passed (attempt {attempt} of {max_attempts}); {then}" if report.passed else
            f"{FAILED_SUBMIT} (attempt {attempt} of {max_attempts}): {len(failed)} of "
            f"{len(checks)} checks failed.")
    lines = [f"{'ok  ' if c.ok else 'FAIL'} {c.name}: {c.message}" for c in checks]
    return "\n".join([head, *lines])


def _turn_tokens(turn: Turn) -> int:
    """What the policy produced: its sampled actions (tokens of an LM, decisions of the
    composer), or ~4 characters a token for a policy that reports none (an API model)."""
    if turn.action_ids:
        return len(turn.action_ids)
    text = turn.message.content + json.dumps([c.arguments for c in turn.message.tool_calls])
    return len(text) // 4 + 1


class _Episode:
    """The mutable state of one run of `run_episode`."""

    def __init__(self, policy: Policy, spec: TaskSpec, pool: Any, ledger: Ledger,
                 cfg: EpisodeConfig, episode_id: str, seed: int | None = None):
        from nestor.sandbox.workspace import TOOL_SCHEMAS, Workspace

        self.policy, self.spec, self.pool, self.ledger, self.cfg = policy, spec, pool, ledger, cfg
        self.dir = ledger.run_dir / "episodes" / episode_id
        (self.dir / "workspace").mkdir(parents=True, exist_ok=True)
        self.workspace = Workspace(self.dir / "workspace")
        self.tools = TOOL_SCHEMAS
        self.rec = EpisodeRecord(episode_id, spec.id, spec.family, policy.name, policy.version)
        self.passed_on: int | None = None
        self.harness_failures = 0  # probes that failed for our reasons: not counted as attempts
        self.seed = seed
        self.files_written: set[str] = set()  # paths a write_file/edit_file call changed
        self.tool_bytes = 0  # of tool results given to the agent so far (max_tool_bytes)

    def log(self, msg: Message, turn: Turn | None = None) -> None:
        """Append to the transcript, committed to the ledger first."""
        row = turn.to_dict() if turn is not None else msg.to_dict()
        self.ledger.add_turn(self.rec.id, len(self.rec.messages), row)
        self.rec.messages.append(msg)

    def run(self) -> EndReason:
        tokens = 0
        for _ in range(self.cfg.max_turns):
            obs = Observation(list(self.rec.messages), self.tools, self.spec, self.seed)
            try:
                turn = self.policy.act(obs)
            except PolicyClosed:  # the training run ended: not the policy's fault
                return "stopped"
            except Exception as exc:  # a broken policy ends its episode, not the run
                self.rec.components["error"] = "".join(
                    traceback.format_exception_only(type(exc), exc)).strip()
                return "policy_error"
            # any policy's text (an API policy parses its own calls) made encodable everywhere
            msg = turn.message
            msg.content = no_surrogates(msg.content)
            for call in msg.tool_calls:
                call.name, call.arguments = no_surrogates(call.name), no_surrogates(call.arguments)
            self.rec.turns.append(turn)
            self.log(turn.message, turn)
            tokens += _turn_tokens(turn)
            if turn.parse_error:
                self.log(Message("user", f"error: your last reply had a malformed tool call: "
                                         f"{turn.parse_error}. Answer with tool calls."))
            elif not turn.message.tool_calls:
                return "no_submit" if self.rec.attempts == 0 else "invalid"
            for i, call in enumerate(turn.message.tool_calls):
                if i >= self.cfg.max_calls_per_turn:
                    text, end = (f"error: at most {self.cfg.max_calls_per_turn} tool calls a "
                                 "turn; this one was not run"), None
                elif call.name == "submit":
                    text, end = self.submit()
                else:
                    text, end = self.workspace.call(call.name, call.arguments), None
                    self._note_write(call, text)
                self.log(Message("tool", self._capped(no_surrogates(text)),
                                 tool_call_id=call.id or None))
                if end is not None:
                    return end
            if tokens > self.cfg.max_tokens:
                return "token_limit"
        return "turn_limit"

    def _capped(self, text: str) -> str:
        """`text`, cut once the episode's tool results reach `max_tool_bytes`: every byte an
        agent makes the harness produce is stored three times (ledger, messages, transcript)."""
        data = text.encode("utf-8")
        left = max(0, self.cfg.max_tool_bytes - self.tool_bytes)
        self.tool_bytes += min(len(data), left)
        if len(data) <= left:
            return text
        return (data[:left].decode("utf-8", errors="ignore")
                + f"\n… cut: {len(data) - left:,} more bytes not shown (the episode's tool "
                f"results reached their cap of {self.cfg.max_tool_bytes:,} bytes)")

    def _note_write(self, call: Any, text: str) -> None:
        if call.name in ("write_file", "edit_file") and text.startswith("ok"):
            args = call.arguments if isinstance(call.arguments, dict) else {}
            path = args.get("path")
            if isinstance(path, str):
                self.files_written.add(path.strip("/"))

    def signals(self) -> dict[str, float]:
        """First-rung shaping signals (recorded always; weighted by `w_wellformed`, `w_files`,
        `w_probe`, 0 by default): see nestor/agent/reward.py."""
        turns = self.rec.turns
        wellformed = sum(1 for t in turns if t.message.tool_calls and not t.parse_error)
        probe = [sum(c.ok for c in r.checks) / len(r.checks) for r in self.rec.reports
                 if list(r.checks)]
        return {"wellformed_rate": wellformed / len(turns) if turns else 0.0,
                "files_written": float(len(self.files_written)),
                "files_score": min(1.0, len(self.files_written) / JOB_FILES),
                "probe_fraction": max(probe, default=0.0)}

    def submit(self) -> tuple[str, EndReason | None]:
        from nestor.job.report import Check, ValidationReport
        from nestor.job.safe_read import UnsafeFileError, copy_tree
        from nestor.job.validate import validate_job

        n = self.rec.attempts + 1
        snap = self.dir / f"attempt-{n}"
        t0 = time.perf_counter()
        try:  # as the sandbox's staging copy: no link followed, no special file opened
            copy_tree(self.workspace.root, snap)
            copied = None
        except (UnsafeFileError, OSError) as exc:
            copied = f"the workspace cannot be submitted: {exc}"
        self.ledger.add_attempt(self.rec.id, n, snap)
        self.rec.attempts = n
        try:
            if copied is not None:  # what the probe's files check would say of it
                report = ValidationReport(passed=False, elapsed_s=0.0, checks=[
                    Check(name="files", ok=False, message=copied)])
            else:
                report = validate_job(snap, self.spec, token_budget=self.cfg.token_budget,
                                      memory_cap_mb=self.cfg.memory_cap_mb)
        except Exception as exc:  # the probe promises not to raise; if it does, the job failed
            report = ValidationReport(passed=False, elapsed_s=time.perf_counter() - t0, checks=[
                Check(name="probe", ok=False, message=f"{type(exc).__name__}: {exc}")])
        self.rec.reports.append(report)
        self.ledger.add_report(self.rec.id, n, passed=report.passed,
                               checks=[c.model_dump() for c in report.checks],
                               elapsed_s=report.elapsed_s)
        if report.harness_failure and self.harness_failures < MAX_HARNESS_FAILURES:
            self.harness_failures += 1
            return (format_report(report, n - self.harness_failures + 1, self.cfg.max_attempts)
                    + "\nThe probe could not run (not your job's fault): this submit does not "
                    "count as an attempt; submit again."), None
        n -= self.harness_failures  # the attempts that count against the agent
        text = format_report(report, n, self.cfg.max_attempts, trained=self.pool is not None)
        if report.passed:
            self.passed_on = n
            return text, self.train(snap)
        if n >= self.cfg.max_attempts:
            return text + "\nNo attempts left.", "invalid"
        return text, None

    def train(self, snap: Path) -> EndReason:
        from nestor.job.safe_read import copy_tree

        job_dir = self.dir / "job"  # the final job files, frozen (a copy of the plain snapshot)
        copy_tree(snap, job_dir)
        if self.pool is None:
            return "not_trained"
        job_id = f"{self.rec.id}-job"
        request = JobRequest(job_dir=job_dir, task_id=self.spec.id,
                             difficulty=self.cfg.difficulty, out_dir=self.dir / "checkpoint",
                             token_budget=self.cfg.token_budget,
                             memory_cap_mb=self.cfg.memory_cap_mb,
                             timeout_s=self.cfg.job_timeout_s, request_id=job_id)
        self.ledger.add_job(job_id, self.rec.id, request.model_dump(mode="json"))
        try:
            future = self.pool.submit(request)
            # the pool enforces the job's own timeout; this only guards against a lost worker
            result = future.result(timeout=self.cfg.job_timeout_s * 2 + 120)
        except FutureTimeout:
            result = JobResult(status="lost", log_tail="no result from the pool in time")
        except Exception as exc:
            result = JobResult(status="lost", log_tail=f"pool error: {type(exc).__name__}: {exc}")
        self.ledger.add_result(job_id, result.model_dump(mode="json"))
        self.rec.result = result
        if result.status == "lost" and getattr(self.policy, "closed", False):
            return "stopped"  # the run ended and its pool shut down: not the job's failure
        return "ok" if result.status == "ok" else "job_failed"


def run_episode(policy: Policy, spec: TaskSpec, pool: Any, ledger: Ledger,
                config: EpisodeConfig | None = None, *, episode_id: str | None = None,
                group_id: str | None = None, seed: int | None = None) -> EpisodeRecord:
    """Run one episode to its end; `pool=None` validates without training. `seed` reaches the
    policy in every observation (a per-episode seed: reproducible sampling)."""
    cfg = config or EpisodeConfig()
    episode_id = episode_id or uuid.uuid4().hex[:12]
    ledger.start_episode(episode_id, task_id=spec.id, family=spec.family,
                         difficulty=cfg.difficulty, policy=policy.name,
                         policy_version=policy.version, config=cfg.model_dump(mode="json"),
                         group_id=group_id)
    ep = _Episode(policy, spec, pool, ledger, cfg, episode_id, seed)
    ep.log(Message("system", system_prompt(spec, models=cfg.models,
                                           token_budget=cfg.token_budget,
                                           max_attempts=cfg.max_attempts,
                                           style=cfg.prompt_style)))
    ep.log(Message("user", task_message(spec)))
    try:
        end = ep.run()
    except Exception as exc:  # e.g. the ledger refused a write: the episode ends, recorded
        ep.rec.components["error"] = "".join(
            traceback.format_exception_only(type(exc), exc)).strip()
        end = "harness_error"
    rec = ep.rec
    rec.end_reason = end
    rec.reward, comps = compute_reward(rec.result, passed_on=ep.passed_on,
                                       max_attempts=cfg.max_attempts,
                                       timeout_s=cfg.job_timeout_s, config=cfg.reward,
                                       signals=ep.signals())
    rec.components = {**comps, **rec.components}
    ledger.finish_episode(episode_id, end_reason=end, reward=rec.reward,
                          components=rec.components)
    (ep.dir / "transcript.json").write_text(json.dumps(
        {**rec.summary(), "messages": [m.to_dict() for m in rec.messages],
         "turns": [t.to_dict() for t in rec.turns]}, indent=1, default=str))
    return rec
