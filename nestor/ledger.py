"""The run ledger: one SQLite file per run directory, the durable record of everything done.

Every record is committed before the caller acts on it (a turn before its tool calls run, an
attempt before its validation, a job before it goes to the pool), so a run killed at any point
leaves a ledger that reads cleanly and says exactly how far each episode got. WAL mode lets
readers (`nestor episode list`, the report) open it while a run writes.

One row per episode, turn (every message of the transcript), attempt, validation report, job,
job result, reward and policy version. Structured payloads are JSON text columns.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from nestor.text import no_surrogates

SCHEMA_VERSION = 1
LEDGER_FILE = "ledger.sqlite"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS episodes (
    id TEXT PRIMARY KEY, task_id TEXT NOT NULL, family TEXT NOT NULL, difficulty INTEGER NOT NULL,
    policy TEXT NOT NULL, policy_version INTEGER NOT NULL, group_id TEXT,
    status TEXT NOT NULL,            -- running | done
    end_reason TEXT, reward REAL, attempts INTEGER NOT NULL DEFAULT 0,
    config TEXT NOT NULL, started REAL NOT NULL, finished REAL);
CREATE TABLE IF NOT EXISTS turns (
    episode_id TEXT NOT NULL, idx INTEGER NOT NULL, role TEXT NOT NULL, content TEXT NOT NULL,
    tool_calls TEXT NOT NULL, tool_call_id TEXT, parse_error TEXT,
    action_keys TEXT NOT NULL, action_ids TEXT NOT NULL, sample_logprobs TEXT NOT NULL,
    context_ids TEXT NOT NULL, created REAL NOT NULL, PRIMARY KEY (episode_id, idx));
CREATE TABLE IF NOT EXISTS attempts (
    episode_id TEXT NOT NULL, n INTEGER NOT NULL, job_dir TEXT NOT NULL, created REAL NOT NULL,
    PRIMARY KEY (episode_id, n));
CREATE TABLE IF NOT EXISTS reports (
    episode_id TEXT NOT NULL, attempt INTEGER NOT NULL, passed INTEGER NOT NULL,
    checks TEXT NOT NULL, elapsed_s REAL NOT NULL, created REAL NOT NULL,
    PRIMARY KEY (episode_id, attempt));
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY, episode_id TEXT NOT NULL, request TEXT NOT NULL, submitted REAL NOT NULL);
CREATE TABLE IF NOT EXISTS results (
    job_id TEXT PRIMARY KEY, status TEXT NOT NULL, pre_score REAL, post_score REAL,
    improvement REAL, wall_s REAL, cost_usd REAL, worker TEXT, result TEXT NOT NULL,
    created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS rewards (
    episode_id TEXT PRIMARY KEY, reward REAL NOT NULL, components TEXT NOT NULL,
    created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS policy_versions (
    policy TEXT NOT NULL, version INTEGER NOT NULL, path TEXT, metrics TEXT NOT NULL,
    created REAL NOT NULL, PRIMARY KEY (policy, version));
"""


class LedgerError(RuntimeError):
    """The ledger file is unreadable or from an incompatible schema; the message says which."""


def _js(obj: Any) -> str:
    return json.dumps(obj, default=str)  # ASCII: a lone surrogate stays a \u escape


def _row(*values: Any) -> tuple:
    """A write's parameters, every text storable."""
    return tuple(no_surrogates(v) for v in values)


class Ledger:
    """`Ledger(run_dir)` opens (creating if needed) RUN_DIR/ledger.sqlite.

    Thread-safe: episodes running in threads share one connection behind a lock; each write
    is its own transaction, committed before the method returns.
    """

    def __init__(self, run_dir: Path | str, *, readonly: bool = False):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LEDGER_FILE
        self._lock = threading.Lock()
        self.readonly = readonly
        if readonly:
            if not self.path.is_file():
                raise LedgerError(f"no ledger at {self.path}; is {self.run_dir} a run directory?")
            uri = f"file:{self.path}?mode=ro"
            self._db = sqlite3.connect(uri, uri=True, check_same_thread=False, timeout=30)
        else:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, check_same_thread=False, timeout=30,
                                       isolation_level=None)  # we BEGIN/COMMIT ourselves
        self._db.row_factory = sqlite3.Row
        try:
            if not readonly:
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: durable on commit
                self._db.executescript(_SCHEMA)
                self._db.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)",
                                 (str(SCHEMA_VERSION),))
            row = self._db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        except sqlite3.DatabaseError as exc:
            raise LedgerError(f"{self.path}: not a readable nestor ledger ({exc})") from None
        if row is None or int(row["value"]) != SCHEMA_VERSION:
            raise LedgerError(f"{self.path}: schema version {row and row['value']}, this nestor "
                              f"reads {SCHEMA_VERSION}")

    # -- writing ------------------------------------------------------------------------------
    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def start_episode(self, episode_id: str, *, task_id: str, family: str, difficulty: int,
                      policy: str, policy_version: int, config: dict,
                      group_id: str | None = None) -> None:
        with self._tx() as db:
            db.execute("INSERT INTO episodes (id, task_id, family, difficulty, policy, "
                       "policy_version, group_id, status, config, started) "
                       "VALUES (?, ?, ?, ?, ?, ?, ?, 'running', ?, ?)",
                       _row(episode_id, task_id, family, difficulty, policy, policy_version,
                        group_id, _js(config), time.time()))

    def add_turn(self, episode_id: str, idx: int, turn: dict) -> None:
        """`turn`: a message dict (role, content, tool_calls, ...) plus, for policy turns, the
        action fields of `nestor.policy.base.Turn` (see `Turn.to_dict`)."""
        with self._tx() as db:
            db.execute("INSERT INTO turns VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       _row(episode_id, idx, turn["role"], turn.get("content", ""),
                        _js(turn.get("tool_calls", [])), turn.get("tool_call_id"),
                        turn.get("parse_error"), _js(turn.get("action_keys", [])),
                        _js(turn.get("action_ids", [])), _js(turn.get("sample_logprobs", [])),
                        _js(turn.get("context_ids", [])), time.time()))

    def add_attempt(self, episode_id: str, n: int, job_dir: Path) -> None:
        with self._tx() as db:
            db.execute("INSERT INTO attempts VALUES (?, ?, ?, ?)",
                       _row(episode_id, n, str(job_dir), time.time()))
            db.execute("UPDATE episodes SET attempts = ? WHERE id = ?", _row(n, episode_id))

    def add_report(self, episode_id: str, attempt: int, *, passed: bool, checks: list[dict],
                   elapsed_s: float) -> None:
        with self._tx() as db:
            db.execute("INSERT INTO reports VALUES (?, ?, ?, ?, ?, ?)",
                       _row(episode_id, attempt, int(passed), _js(checks), elapsed_s, time.time()))

    def add_job(self, job_id: str, episode_id: str, request: dict) -> None:
        with self._tx() as db:
            db.execute("INSERT INTO jobs VALUES (?, ?, ?, ?)",
                       _row(job_id, episode_id, _js(request), time.time()))

    def add_result(self, job_id: str, result: dict) -> None:
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO results VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       _row(job_id, result["status"], result.get("pre_score"),
                        result.get("post_score"), result.get("improvement"),
                        result.get("wall_s"), result.get("cost_usd"), result.get("worker"),
                        _js(result), time.time()))

    def finish_episode(self, episode_id: str, *, end_reason: str, reward: float,
                       components: dict) -> None:
        """The reward row and the episode's final state, in one transaction."""
        now = time.time()
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO rewards VALUES (?, ?, ?, ?)",
                       _row(episode_id, reward, _js(components), now))
            db.execute("UPDATE episodes SET status='done', end_reason=?, reward=?, finished=? "
                       "WHERE id=?", _row(end_reason, reward, now, episode_id))

    def close_orphans(self, end_reason: str = "orphaned", note: str = "") -> list[str]:
        """Close every episode still `running` (its process was killed, or the run ended
        before it): status done with `end_reason`, no reward; each job of it without a
        result gets a `lost` result. One transaction; returns the episode ids."""
        now = time.time()
        with self._tx() as db:
            ids = [r[0] for r in db.execute("SELECT id FROM episodes WHERE status='running'")]
            for eid in ids:
                for (job_id,) in db.execute(
                        "SELECT j.id FROM jobs j LEFT JOIN results r ON r.job_id = j.id "
                        "WHERE j.episode_id=? AND r.job_id IS NULL", (eid,)).fetchall():
                    db.execute("INSERT INTO results (job_id, status, result, created) "
                               "VALUES (?, 'lost', ?, ?)", _row(job_id, _js(
                                   {"status": "lost", "log_tail": note or end_reason}), now))
                db.execute("UPDATE episodes SET status='done', end_reason=?, finished=? "
                           "WHERE id=?", _row(end_reason, now, eid))
        return ids

    def add_policy_version(self, policy: str, version: int, *, path: str | None = None,
                           metrics: dict | None = None) -> None:
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO policy_versions VALUES (?, ?, ?, ?, ?)",
                       _row(policy, version, path, _js(metrics or {}), time.time()))

    # -- reading ------------------------------------------------------------------------------
    def _all(self, sql: str, args: tuple = ()) -> list[dict]:
        with self._lock:
            return [dict(r) for r in self._db.execute(sql, args).fetchall()]

    def episodes(self, *, status: str | None = None, task_id: str | None = None,
                 episode_id: str | None = None) -> list[dict]:
        """Episodes, oldest first; `components` and `config` decoded."""
        sql = ("SELECT e.*, r.components FROM episodes e LEFT JOIN rewards r "
               "ON r.episode_id = e.id WHERE 1=1")
        args: list[Any] = []
        if episode_id:
            sql += " AND e.id = ?"
            args.append(episode_id)
        if status:
            sql += " AND e.status = ?"
            args.append(status)
        if task_id:
            sql += " AND e.task_id = ?"
            args.append(task_id)
        rows = self._all(sql + " ORDER BY e.started", tuple(args))
        for row in rows:
            row["config"] = json.loads(row["config"])
            row["components"] = json.loads(row["components"]) if row["components"] else None
        return rows

    def episode(self, episode_id: str) -> dict:
        """One episode with its turns, reports, jobs and results (raises KeyError if unknown)."""
        rows = self.episodes(episode_id=episode_id)
        if not rows:
            raise KeyError(episode_id)
        ep = rows[0]
        ep["turns"] = self.turns(episode_id)
        ep["reports"] = self._all("SELECT * FROM reports WHERE episode_id=? ORDER BY attempt",
                                  (episode_id,))
        for rep in ep["reports"]:
            rep["checks"] = json.loads(rep["checks"])
            rep["passed"] = bool(rep["passed"])
        ep["jobs"] = self._all("SELECT j.id, j.request, j.submitted, r.result FROM jobs j LEFT "
                               "JOIN results r ON r.job_id = j.id WHERE j.episode_id=? "
                               "ORDER BY j.submitted", (episode_id,))
        for job in ep["jobs"]:
            job["request"] = json.loads(job["request"])
            job["result"] = json.loads(job["result"]) if job["result"] else None
        return ep

    def turns(self, episode_id: str) -> list[dict]:
        rows = self._all("SELECT * FROM turns WHERE episode_id=? ORDER BY idx", (episode_id,))
        for row in rows:
            for key in ("tool_calls", "action_keys", "action_ids", "sample_logprobs",
                        "context_ids"):
                row[key] = json.loads(row[key])
        return rows

    def pending_jobs(self) -> list[dict]:
        """Jobs submitted without a recorded result: what a resumed run must re-dispatch."""
        rows = self._all("SELECT j.* FROM jobs j LEFT JOIN results r ON r.job_id = j.id "
                         "WHERE r.job_id IS NULL ORDER BY j.submitted")
        for row in rows:
            row["request"] = json.loads(row["request"])
        return rows

    def policy_versions(self, policy: str | None = None) -> list[dict]:
        sql = "SELECT * FROM policy_versions"
        rows = self._all(sql + (" WHERE policy=?" if policy else "") + " ORDER BY created",
                         (policy,) if policy else ())
        for row in rows:
            row["metrics"] = json.loads(row["metrics"])
        return rows

    def job_results(self) -> list[dict]:
        """Every finished job with its episode's task: the rows a report plots."""
        return self._all("SELECT r.job_id, e.task_id, e.family, e.policy_version, r.status, "
                         "r.pre_score, r.post_score, r.improvement, r.wall_s, r.cost_usd, "
                         "r.worker, r.created FROM results r JOIN jobs j ON j.id = r.job_id "
                         "JOIN episodes e ON e.id = j.episode_id ORDER BY r.created")

    def close(self) -> None:
        """A writer leaves one file: the WAL is checkpointed into ledger.sqlite and the journal
        mode set back to DELETE, so no -wal/-shm stays beside a finished run (a reader, or a
        resume, opens it as before; a resume turns WAL on again)."""
        with self._lock:
            if not self.readonly:
                try:
                    self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                    self._db.execute("PRAGMA journal_mode=DELETE")
                except sqlite3.Error:  # another connection still has it open: it stays WAL
                    pass
            self._db.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
