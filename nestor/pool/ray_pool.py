"""The cluster backend: warm workers as Ray actors on an existing Ray cluster.

Each worker type becomes actors that request its CPUs, GPUs and custom resources (e.g.
{"worker:a40": 1}), so Ray places them only on nodes that advertise them. How many actors of a
type the pool keeps is what the cluster's totals fit (capped by max_workers), re-checked every
few seconds so nodes that join later (rented pods) get workers. An actor that dies mid-job
(node lost, kill -9) surfaces as an actor error; the supervisor retries the job elsewhere.

`ray.init` on an address nobody answers retries for minutes, so the pool first opens a plain TCP
connection to the address and runs `ray.init` under a deadline: a dead address is a one-line
PoolError within `connect_timeout_s`.
"""

from __future__ import annotations

import logging
import math
import socket
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass

import ray
from ray.exceptions import RayActorError, RayError

from nestor.pool.base import PoolError
from nestor.pool.config import PoolConfig, WorkerType
from nestor.pool.scheduler import Event, ScheduledPool, Slot
from nestor.pool.worker import WarmWorker, WorkerSpec, start_error

REFRESH_EVERY_S = 5.0


class _ActorWorker:
    """The actor body: a WarmWorker, with start-up failures reported instead of raised (so the
    pool sees the reason, not a bare 'actor died')."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.error = None
        try:
            self.worker = WarmWorker(spec)
        except BaseException as exc:
            self.error = start_error(exc)

    def ready(self) -> tuple[str, object]:
        if self.error:
            return "error", self.error
        return "ready", {**self.worker.info(), "node": ray.get_runtime_context().get_node_id()}

    def run(self, request_json: str) -> str:
        return self.worker.run(request_json)


_RemoteWorker = ray.remote(max_restarts=0, max_task_retries=0)(_ActorWorker)


def _host_port(address: str) -> tuple[str, int]:
    """'auto' | 'host:port' | 'ray://host:port' -> (host, port), or PoolError."""
    target = address
    if address == "auto":
        from ray._private.services import canonicalize_bootstrap_address_or_die

        try:
            target = canonicalize_bootstrap_address_or_die("auto")
        except (ConnectionError, ValueError) as exc:
            raise PoolError(f"no Ray cluster found for address 'auto' ({exc}); start one with "
                            "`ray start --head` or set pool.address") from None
    host, sep, port = target.removeprefix("ray://").rpartition(":")
    if not sep or not host or not port.isdigit():
        raise PoolError(f"Ray address {address!r} is not 'auto', 'host:port' or 'ray://host:port'")
    return host, int(port)


class _QuietThreadInit(logging.Filter):
    """ray.init off the main thread warns that it set no SIGTERM handler: intended here (the
    harness, not Ray, decides what SIGTERM does), so the warning is noise."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "SIGTERM handler is not set" not in record.getMessage()


logging.getLogger("ray._private.worker").addFilter(_QuietThreadInit())


def connect(address: str, timeout_s: float) -> bool:
    """Connect this process to the cluster; True if we initialised Ray (and should shut it down).
    Raises PoolError quickly when the address does not answer."""
    if ray.is_initialized():
        return False
    host, port = _host_port(address)
    try:
        socket.create_connection((host, port), timeout=min(timeout_s, 5.0)).close()
    except OSError as exc:
        raise PoolError(f"Ray cluster at {host}:{port} does not answer ({exc.strerror or exc}); "
                        "is `ray start --head` running there, and is pool.address right?") from None
    outcome: dict = {}

    def init() -> None:
        try:
            ray.init(address=address if address.startswith("ray://") else f"{host}:{port}",
                     log_to_driver=False, namespace="nestor", configure_logging=False)
            outcome["ok"] = True
        except Exception as exc:  # reported below as one line
            outcome["error"] = exc

    thread = threading.Thread(target=init, name="ray-connect", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise PoolError(f"Ray cluster at {host}:{port} accepted a connection but did not complete "
                        f"the handshake in {timeout_s:g}s; is it a Ray GCS port?")
    if "error" in outcome:
        raise PoolError(f"cannot join the Ray cluster at {host}:{port}: {outcome['error']}")
    return True


def fits(wtype: WorkerType, totals: dict[str, float]) -> int:
    """How many workers of this type the cluster's resource totals can hold."""
    asks = {"CPU": wtype.num_cpus, "GPU": wtype.num_gpus, **wtype.resources}
    n = wtype.max_workers
    for key, amount in asks.items():
        if amount > 0:
            n = min(n, int(math.floor(totals.get(key, 0.0) / amount + 1e-9)))
    return max(0, n)


@dataclass
class _Actor:
    actor: object
    ready_ref: object | None
    job_ref: object | None = None


class RayPool(ScheduledPool):
    backend = "ray"

    def __init__(self, config: PoolConfig | None = None) -> None:
        config = config or PoolConfig(backend="ray")
        self._owns_ray = connect(config.address, config.connect_timeout_s)
        totals = ray.cluster_resources()
        types = config.types(cluster_cpus=int(totals.get("CPU", 0)))
        self._fits = {t.name: fits(t, totals) for t in types}
        if not any(self._fits.values()):
            asks = "; ".join(f"{t.name}: CPU {t.num_cpus:g}, GPU {t.num_gpus:g}, {t.resources}"
                             for t in types)
            self._disconnect()
            raise PoolError(f"no node of the Ray cluster offers what any worker type asks for "
                            f"({asks}); cluster has {dict(totals)}")
        super().__init__(config, types)
        self._last_refresh = time.monotonic()
        self.start()

    def target(self, wtype: WorkerType) -> int:
        return self._fits.get(wtype.name, 0)

    def absent(self) -> list[str]:
        """Configured worker types that no node of the cluster can host right now."""
        return [name for name, n in self._fits.items() if n == 0]

    def _refresh(self) -> None:
        if time.monotonic() - self._last_refresh < REFRESH_EVERY_S:
            return
        self._last_refresh = time.monotonic()
        totals = ray.cluster_resources()
        for t in self.types:
            self._fits[t.name] = fits(t, totals)
            mine = [s for s in self._slots if s.wtype.name == t.name]
            for _ in range(self._fits[t.name] - len(mine)):  # nodes joined: more workers
                if t.name not in self._broken:
                    self._add_slot(t)
            # nodes left: drop actors that can no longer be placed (never busy ones)
            starting = [s for s in mine if not s.ready and s.job is None]
            for slot in starting[:max(0, len(mine) - self._fits[t.name])]:
                self._kill(slot)
                self._slots.remove(slot)

    def _spawn(self, slot: Slot) -> None:
        t = slot.wtype
        threads = self.config.threads_per_worker or max(1, int(t.num_cpus))
        actor = _RemoteWorker.options(
            num_cpus=t.num_cpus, num_gpus=t.num_gpus, resources=dict(t.resources) or None,
            name=None, max_concurrency=1,
        ).remote(self.config.worker_spec(t, threads))
        slot.handle = _Actor(actor, actor.ready.remote())

    def _send(self, slot: Slot, request_json: str) -> None:
        slot.handle.job_ref = slot.handle.actor.run.remote(request_json)

    def _kill(self, slot: Slot) -> None:
        try:
            ray.kill(slot.handle.actor, no_restart=True)
        except RayError:
            pass  # already gone

    def _poll(self, timeout: float) -> Iterable[Event]:
        refs = {}
        for s in self._slots:
            h: _Actor = s.handle
            if h.ready_ref is not None:
                refs[h.ready_ref] = (s, "ready")
            if h.job_ref is not None:
                refs[h.job_ref] = (s, "result")
        if not refs:
            time.sleep(min(timeout, 0.05))
            return []
        # short waits: a new submission is noticed within 50 ms without a wake-up channel
        done, _ = ray.wait(list(refs), num_returns=1, timeout=min(timeout, 0.05))
        if done:
            rest = [r for r in refs if r not in done]
            more, _ = ray.wait(rest, num_returns=len(rest), timeout=0) if rest else ([], [])
            done = [*done, *more]
        events: list[Event] = []
        for ref in done:
            slot, kind = refs[ref]
            try:
                value = ray.get(ref)
            except RayActorError as exc:
                events.append((slot, "died", _first_line(exc)))
                continue
            except RayError as exc:
                events.append((slot, "died", _first_line(exc)))
                continue
            if kind == "ready":
                slot.handle.ready_ref = None
                events.append((slot, *value))
            else:
                slot.handle.job_ref = None
                events.append((slot, "result", value))
        return events

    def _close(self) -> None:
        self._disconnect()

    def _disconnect(self) -> None:
        if self._owns_ray and ray.is_initialized():
            ray.shutdown()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]
