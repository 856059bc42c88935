"""Everything a report or a run summary reads from a run directory, tolerant of a run that is
still going (a half-written last line) or that crashed (no final step, episodes left running)."""

from __future__ import annotations

import statistics
import tomllib
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nestor.ledger import LEDGER_FILE, Ledger
from nestor.outer.metrics import first_last, read_jsonl

METRICS_FILE = "metrics.jsonl"
HELDOUT_FILE = "heldout.jsonl"
CUT_SHORT = ("stopped", "orphaned")  # end reasons of episodes a run's end or a kill cut short


class RunDirError(ValueError):
    """Not a run directory (no metrics, no ledger)."""


def job_checkpoint(path: Path) -> dict[str, Any] | None:
    """The metadata of a trained job's checkpoint in `path` or `path/checkpoint/` (what
    `nestor job train --out` writes), else None."""
    import json

    from nestor.inner.checkpoint import META_FILE

    for meta in (Path(path) / META_FILE, Path(path) / "checkpoint" / META_FILE):
        if meta.is_file():
            try:
                return {"checkpoint": str(meta.parent), **json.loads(meta.read_text())}
            except (OSError, ValueError):
                return {"checkpoint": str(meta.parent)}
    return None


@dataclass
class RunData:
    run_dir: Path
    config: dict[str, Any]
    steps: list[dict[str, Any]]  # metrics.jsonl rows, one per outer step
    heldout: list[dict[str, Any]]  # heldout.jsonl rows: step, arm, task, n, mean, ci95
    episodes: list[dict[str, Any]] = field(default_factory=list)  # ledger rows
    jobs: list[dict[str, Any]] = field(default_factory=list)  # task_id, pre, post, status, cost

    @classmethod
    def load(cls, run_dir: Path) -> RunData:
        run_dir = Path(run_dir)
        if job_checkpoint(run_dir) is not None:
            raise RunDirError(f"{run_dir} holds a job checkpoint, not a run: score it with "
                              f"`nestor eval --model {run_dir} --tasks TASK`")
        has_ledger = (run_dir / LEDGER_FILE).is_file()
        if not run_dir.is_dir() or not (has_ledger or (run_dir / METRICS_FILE).is_file()):
            raise RunDirError(f"{run_dir} is not a run directory "
                              f"(no {METRICS_FILE} and no {LEDGER_FILE})")
        config: dict[str, Any] = {}
        if (run_dir / "config.toml").is_file():
            try:
                config = tomllib.loads((run_dir / "config.toml").read_text())
            except tomllib.TOMLDecodeError:
                config = {}
        data = cls(run_dir, config, read_jsonl(run_dir / METRICS_FILE),
                   read_jsonl(run_dir / HELDOUT_FILE))
        if has_ledger:
            with Ledger(run_dir, readonly=True) as ledger:
                data.episodes = ledger.episodes()
                data.jobs = ledger.job_results()
                models = {r["job_id"]: r["model"] for r in ledger._all(  # in each job's result
                    "SELECT job_id, json_extract(result, '$.base_model') AS model FROM results")}
            for job in data.jobs:
                job["base_model"] = models.get(job["job_id"])
        return data

    # -- summaries -----------------------------------------------------------------------------
    def kind(self) -> str:
        """train (an outer-loop run), bench (`bench agents`) or episodes (`episode run`)."""
        if self.steps or self.config.get("policy"):
            return "train"
        if self.episodes and all((e.get("group_id") or "").startswith("bench:")
                                 for e in self.episodes):
            return "bench"
        return "episodes"

    def status(self) -> str:
        if any(e["status"] == "running" for e in self.episodes):
            return "in progress (or crashed)"
        if self.kind() != "train":  # no outer steps to wait for: its episodes are the run
            return "finished" if self.episodes else "empty"
        return "finished" if self.steps else "no steps yet"

    def summary(self) -> dict[str, Any]:
        # an episode cut short by the end of a run or a kill has no real reward: not averaged
        done = [e for e in self.episodes if e["status"] == "done"
                and e.get("end_reason") not in CUT_SHORT]
        rewards = [e["reward"] for e in done if e["reward"] is not None]
        first, last, k = first_last([r["reward_mean"] for r in self.steps
                                     if r.get("reward_mean") is not None])
        # the reward's own `trained` (ok and moved its weights); a ledger older than it: `ok`
        trained = sum(bool((e.get("components") or {}).get("trained", e["end_reason"] == "ok"))
                      for e in done)
        return {
            "run_dir": str(self.run_dir),
            "name": self.config.get("name", self.run_dir.name),
            "kind": self.kind(),
            # a run's config names its policy; a run dir of `nestor episode run` has only the ledger
            "policy": (self.config.get("policy") or {}).get("kind")
            or ", ".join(sorted({e["policy"] for e in self.episodes})) or None,
            "status": self.status(),
            "steps": len(self.steps),
            "episodes": len(self.episodes),
            "episodes_done": len(done),
            "reward_mean": statistics.fmean(rewards) if rewards else None,
            "reward_compared_steps": k,  # first k → last k never share a step; 0: too short
            "reward_first_2_steps": first,
            "reward_last_2_steps": last,
            "jobs": len(self.jobs),
            "jobs_ok": sum(j["status"] == "ok" for j in self.jobs),
            "jobs_trained": trained,  # the reward's `trained`: ok and moved its weights
            "cost_usd": round(sum(j.get("cost_usd") or 0.0 for j in self.jobs), 4),
            "heldout": self.heldout_latest(),
            "findings": self.findings().to_json(),
        }

    def findings(self):
        """The write-up's five findings (nestor.report.findings, their one definition)."""
        from nestor.report.findings import compute_findings

        return compute_findings(self.steps, self.heldout)

    def summary_rows(self) -> list[tuple[str, str]]:
        """The summary as (label, value) pairs formatted for people: the report's table and
        `nestor runs show`."""
        from nestor.report import fmt

        s = self.summary()
        k = s["reward_compared_steps"]
        rows = [("policy", s["policy"] or fmt.DASH), ("status", s["status"]),
                ("outer steps", fmt.num(s["steps"])),
                ("episodes", f"{fmt.num(s['episodes'])} ({fmt.num(s['episodes_done'])} finished)"),
                ("mean episode reward", fmt.num(s["reward_mean"])),
                ("reward, first steps → last",
                 f"{fmt.arrow(s['reward_first_2_steps'], s['reward_last_2_steps'])} "
                 f"(first {k} → last {k})" if k else
                 f"{fmt.DASH} (too short to compare: {s['steps']} step(s))"),
                ("jobs trained", f"{fmt.num(s['jobs_trained'])} of {fmt.num(s['jobs'])} "
                                 f"({fmt.num(s['jobs_ok'])} finished ok)"),
                ("cost of inner jobs", fmt.usd(s["cost_usd"]))]
        if self.steps and self.steps[-1].get("elapsed_s") is not None:
            rows.insert(3, ("wall time", fmt.duration(self.steps[-1]["elapsed_s"])))
        for arm, h in sorted(s["heldout"].items()):
            rows.append((f"held-out, {arm} policy",
                         f"{fmt.num(h['mean'])} (n = {h['n']}, step {h['step']})"))
        return rows

    def heldout_latest(self) -> dict[str, Any]:
        """Per arm, the mean over held-out tasks at its latest step."""
        by_arm: dict[str, dict[int, list[dict]]] = defaultdict(lambda: defaultdict(list))
        for row in self.heldout:
            by_arm[row["arm"]][row["step"]].append(row)
        out = {}
        for arm, steps in by_arm.items():
            step = max(steps)
            rows = steps[step]
            out[arm] = {"step": step, "mean": statistics.fmean(r["mean"] for r in rows),
                        "n": sum(r["n"] for r in rows)}
        return out

    def heldout_by_step(self) -> dict[str, list[dict[str, Any]]]:
        """Per arm, one point per step: every episode's reward pooled over the held-out tasks,
        its mean and 95% interval as nestor.report.findings defines them (no interval for rows
        written before held-out rows kept per-episode values)."""
        from nestor.report.findings import _arm_values, mean_ci95

        by: dict[str, dict[int, list[dict]]] = defaultdict(lambda: defaultdict(list))
        for row in self.heldout:
            by[row["arm"]][row["step"]].append(row)
        out: dict[str, list[dict[str, Any]]] = {}
        for arm, steps in sorted(by.items()):
            points = []
            for step, rows in sorted(steps.items()):
                values = _arm_values(rows)
                if values:
                    mean, ci = mean_ci95(values)
                else:
                    mean = statistics.fmean(r["mean"] for r in rows)
                    ci = [mean, mean]
                points.append({"step": step, "mean": mean, "ci95": ci, "n": len(values) or
                               sum(r["n"] for r in rows), "tasks": len(rows)})
            out[arm] = points
        return out

    def pre_post_by_model(self) -> dict[str, dict[str, tuple[list[float], list[float]]]]:
        """task -> base model -> (pre scores, post scores) of its trained jobs."""
        out: dict[str, dict[str, tuple[list[float], list[float]]]] = {}
        for job in self.jobs:
            if job["status"] == "ok" and job["pre_score"] is not None and \
                    job["post_score"] is not None:
                model = job.get("base_model") or "?"
                pre, post = out.setdefault(job["task_id"], {}).setdefault(model, ([], []))
                pre.append(job["pre_score"])
                post.append(job["post_score"])
        return out

    def pre_post_by_task(self) -> dict[str, tuple[list[float], list[float]]]:
        out: dict[str, tuple[list[float], list[float]]] = {}
        for job in self.jobs:
            if job["status"] == "ok" and job["pre_score"] is not None and job["post_score"] is not None:
                pre, post = out.setdefault(job["task_id"], ([], []))
                pre.append(job["pre_score"])
                post.append(job["post_score"])
        return out
