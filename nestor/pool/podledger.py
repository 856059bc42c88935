"""A durable record of every pod a run created, so that none is left billing after a crash.

A row is written the moment the cloud returns a pod id and closed when the pod is terminated.
Rows still open at the next start (or at `nestor pods reap`) belong to a process that died
without cleaning up; the reaper terminates them. Spend is computed from the same rows:
Σ price/h × hours alive.
"""

from __future__ import annotations

import os
import sqlite3
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

FILENAME = "pods.sqlite"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS pods (
  pod_id TEXT PRIMARY KEY,
  name TEXT NOT NULL,
  session TEXT NOT NULL,
  gpu_type_id TEXT NOT NULL,
  worker_type TEXT NOT NULL,
  price_per_hr REAL NOT NULL,
  created_at REAL NOT NULL,
  ended_at REAL,
  end_reason TEXT
);
"""


@dataclass(frozen=True)
class PodRow:
    pod_id: str
    name: str
    session: str
    gpu_type_id: str
    worker_type: str
    price_per_hr: float
    created_at: float
    ended_at: float | None
    end_reason: str | None

    @property
    def open(self) -> bool:
        return self.ended_at is None

    def cost_usd(self, now: float) -> float:
        end = self.ended_at if self.ended_at is not None else now
        return self.price_per_hr * max(0.0, end - self.created_at) / 3600.0


class PodLedger:
    """`RUN_DIR/pods.sqlite`. One writer per run at a time; WAL keeps readers (CLI) unblocked."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / FILENAME
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # The provisioner's loop thread and an exit/signal handler may both write; calls are serialised
        # by the provisioner's lock.
        self._db = sqlite3.connect(self.path, timeout=10, isolation_level=None,
                                   check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")  # a row must survive a SIGKILL right after
        self._db.executescript(_SCHEMA)

    @property
    def run_tag(self) -> str:
        """Stable per run dir: pod names start with `nestor-<tag>-`, so even a pod whose row was
        never written (killed between create and insert) is found by name."""
        row = self._db.execute("SELECT value FROM meta WHERE key='run_tag'").fetchone()
        if row:
            return row[0]
        tag = uuid.uuid4().hex[:8]
        self._db.execute("INSERT OR IGNORE INTO meta VALUES ('run_tag', ?)", (tag,))
        return self._db.execute("SELECT value FROM meta WHERE key='run_tag'").fetchone()[0]

    def name_prefix(self) -> str:
        return f"nestor-{self.run_tag}-"

    def add(self, pod_id: str, name: str, session: str, gpu_type_id: str, worker_type: str,
            price_per_hr: float, created_at: float) -> None:
        self._db.execute("INSERT OR REPLACE INTO pods VALUES (?,?,?,?,?,?,?,NULL,NULL)",
                         (pod_id, name, session, gpu_type_id, worker_type, price_per_hr,
                          created_at))

    def close_row(self, pod_id: str, ended_at: float, reason: str) -> None:
        self._db.execute("UPDATE pods SET ended_at=?, end_reason=? WHERE pod_id=? AND ended_at "
                         "IS NULL", (ended_at, reason, pod_id))

    def rows(self, *, open_only: bool = False, session: str | None = None) -> list[PodRow]:
        sql, args = "SELECT * FROM pods WHERE 1=1", []
        if open_only:
            sql += " AND ended_at IS NULL"
        if session is not None:
            sql += " AND session=?"
            args.append(session)
        return [PodRow(*r) for r in self._db.execute(sql + " ORDER BY created_at", args)]

    def spent_usd(self, now: float | None = None) -> float:
        now = time.time() if now is None else now
        return sum(r.cost_usd(now) for r in self.rows())

    def close(self) -> None:
        self._db.close()


def new_session() -> str:
    return f"{os.getpid()}-{uuid.uuid4().hex[:6]}"
