"""A warm pool of rented GPU pods that join the run's Ray cluster as `worker:<type>` nodes.

One `Provisioner` per run. Each `tick()` reconciles what the cloud says with the pod ledger:
dead pods are terminated and replaced, the pool grows to the demand (at most `max_pods`) with
the cheapest GPU type in stock, shrinks after `idle_timeout_s` of lower demand, and everything
stops when the spend cap is reached. Every pod it created is terminated on normal exit, on
Ctrl-C / SIGTERM, and — through the ledger — at the next start or by `nestor pods reap` after
a crash.
"""

from __future__ import annotations

import atexit
import base64
import json
import logging
import shlex
import signal
import threading
import time
import tomllib
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from nestor.config import validation_problems
from nestor.pool.config import WorkerType
from nestor.pool.cost import CostMatrix
from nestor.pool.dispatch import rank_types
from nestor.pool.podapi import Pod, PodApi, PodApiError, PodSpec, StockOutError
from nestor.pool.podledger import PodLedger, PodRow, new_session

log = logging.getLogger("nestor.pods")

LIST_GRACE_S = 60.0  # the cloud's pod list may lag a create by a few seconds


class PodType(BaseModel):
    model_config = ConfigDict(extra="forbid")

    worker_type: str = Field(description="Pool worker type; the pod joins Ray with the custom "
                             "resource `worker:<worker_type>` and the cost matrix uses this name.")
    gpu_type_id: str = Field(description="Runpod GPU type id, e.g. 'NVIDIA A40' (runpod.get_gpus()).")
    price_per_hr: float = Field(gt=0, description="List price in $/h; the live price from the "
                                "stock query replaces it when Runpod reports one.")


DEFAULT_POD_TYPES = [  # Runpod secure-cloud list prices, 2026; the live price wins.
    PodType(worker_type="a40", gpu_type_id="NVIDIA A40", price_per_hr=0.44),
    PodType(worker_type="a6000", gpu_type_id="NVIDIA RTX A6000", price_per_hr=0.49),
    PodType(worker_type="l40s", gpu_type_id="NVIDIA L40S", price_per_hr=0.86),
    PodType(worker_type="a100", gpu_type_id="NVIDIA A100 80GB PCIe", price_per_hr=1.64),
    PodType(worker_type="h100", gpu_type_id="NVIDIA H100 PCIe", price_per_hr=2.39),
]


class RunpodConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ray_address: str = Field(description="host:port of the run's Ray head, reachable from the "
                             "pods (e.g. a public IP or a VPN address; port 6379 by default).")
    max_pods: int = Field(16, ge=1, le=256, description="Most pods alive at once.")
    min_pods: int = Field(0, ge=0, le=256, description="Pods kept warm even with no demand.")
    max_cost_usd: float = Field(50.0, gt=0, description="Hard spend cap for the run: Σ price/h × "
                                "hours alive over every pod it created. Reached = all terminated.")
    pod_types: list[PodType] = Field(default_factory=lambda: list(DEFAULT_POD_TYPES),
                                     min_length=1, description="GPU types this run may rent.")
    image: str = Field("runpod/pytorch:2.4.0-py3.11-cuda12.4.1-devel-ubuntu22.04",
                       description="Container image of each pod.")
    setup_command: str = Field("pip install -q 'ray[default]==2.60.0' nestor",
                               description="Shell run on each pod before it joins Ray: installs "
                               "nestor (a wheel URL, git URL or PyPI name) and the head's Ray.")
    gpu_count: int = Field(1, ge=1, le=8, description="GPUs per pod.")
    cloud_type: str = Field("SECURE", pattern="^(ALL|SECURE|COMMUNITY)$")
    container_disk_gb: int = Field(40, ge=10, le=2000)
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment on the pods "
                                "(e.g. HF_TOKEN); values must not contain quotes.")
    idle_timeout_s: float = Field(600, ge=0, description="Demand below the pod count for this "
                                  "long terminates the surplus (most expensive first).")
    boot_timeout_s: float = Field(900, gt=0, description="A pod whose container is not up "
                                  "after this is counted as dead and replaced.")
    poll_s: float = Field(30, gt=0, description="Seconds between reconciliation ticks.")
    cap_horizon_s: float = Field(600, ge=0, description="A new pod is refused unless the cap "
                                 "covers every alive pod, itself included, for this long more.")


class RunpodConfigError(ValueError):
    """The [runpod] table is missing or invalid; the message says what to fix."""


def load_runpod_config(path: Path) -> RunpodConfig:
    """The `[runpod]` table of a TOML file (e.g. cluster.toml or nestor.toml)."""
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RunpodConfigError(f"{path}: no such file") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise RunpodConfigError(f"{path}: not valid TOML: {exc}") from None
    if "runpod" not in data:
        raise RunpodConfigError(f"{path}: no [runpod] table (needs at least ray_address)")
    try:
        return RunpodConfig.model_validate(data["runpod"])
    except ValidationError as exc:
        problems = validation_problems(exc)
        raise RunpodConfigError(f"{path} [runpod]: {problems}") from None


def worker_types(config: RunpodConfig,
                 prices: dict[str, float] | None = None) -> list[WorkerType]:
    """The pool's view of the pod types: the Ray pool asks for exactly the `worker:<type>`
    resource a pod of that type advertises, at the same price."""
    prices = prices or {}
    return [WorkerType(name=t.worker_type,
                       price_per_hour=prices.get(t.gpu_type_id) or t.price_per_hr,
                       num_gpus=config.gpu_count, num_cpus=1,
                       resources={f"worker:{t.worker_type}": config.gpu_count},
                       max_workers=config.max_pods)
            for t in config.pod_types]


def cost_order(config: RunpodConfig, matrix: CostMatrix | None, base_model: str | None,
               prices: dict[str, float] | None = None) -> list[PodType]:
    """Pod types cheapest first, ranked exactly as the pool's dispatcher ranks worker types:
    measured $/job from the matrix, else price/h (see nestor.pool.dispatch)."""
    by_name = {t.worker_type: t for t in config.pod_types}
    ranked = rank_types(base_model, worker_types(config, prices), matrix)
    return [by_name[w.name] for w in ranked]


def bootstrap_args(config: RunpodConfig, pod_type: PodType) -> tuple[str, dict[str, str]]:
    """docker_args and env that make a fresh pod join the Ray cluster as a `worker:<type>` node.

    The script travels base64-encoded in an env var: the SDK pastes values into GraphQL between
    double quotes without escaping, and Ray's --resources JSON needs quotes.
    """
    resources = json.dumps({f"worker:{pod_type.worker_type}": config.gpu_count})
    script = "\n".join([
        "set -eu",
        config.setup_command,
        f"exec ray start --address={shlex.quote(config.ray_address)} "
        f"--num-gpus={config.gpu_count} --resources={shlex.quote(resources)} --block",
    ])
    env = {**config.env, "NESTOR_BOOTSTRAP": base64.b64encode(script.encode()).decode(),
           "NESTOR_WORKER_TYPE": pod_type.worker_type}
    return "bash -c 'echo $NESTOR_BOOTSTRAP | base64 -d | bash'", env


class Provisioner:
    """Keeps the warm pool; see the module docstring. Thread-safe: `run()` may loop in a thread
    while another thread or the exit hook calls `shutdown()`; a signal handler only stops it."""

    def __init__(self, config: RunpodConfig, api: PodApi, run_dir: Path, *,
                 demand: Callable[[], int] | None = None,
                 matrix: CostMatrix | None = None, base_model: str | None = None,
                 clock: Callable[[], float] = time.time):
        self.config, self.api, self.clock = config, api, clock
        self.ledger = PodLedger(run_dir)
        self.session = new_session()
        self.demand = demand or (lambda: config.max_pods)
        self.matrix, self.base_model = matrix, base_model
        self.capped = False
        self.closed = False
        self.events: list[tuple[str, str]] = []  # (kind, detail), for the CLI and the tests
        self._lock = threading.RLock()
        self._surplus_since: float | None = None
        self._counter = len(self.ledger.rows())
        self._stop = threading.Event()
        self._signal: str | None = None  # set by a signal handler: the pods' end reason

    # --- state -------------------------------------------------------------------------------
    def live(self) -> list[PodRow]:
        return self.ledger.rows(open_only=True, session=self.session)

    def spent_usd(self) -> float:
        return self.ledger.spent_usd(self.clock())

    def burn_per_hr(self) -> float:
        return sum(r.price_per_hr for r in self.live())

    def _event(self, kind: str, detail: str) -> None:
        self.events.append((kind, detail))
        log.info("%s: %s", kind, detail)

    # --- lifecycle ---------------------------------------------------------------------------
    def start(self, *, handlers: bool = True) -> list[str]:
        """Reap what an earlier, crashed session of this run left behind; arm exit handlers."""
        reaped = reap(self.ledger, self.api, self.clock, exclude_session=self.session)
        for pod_id in reaped:
            self._event("reaped", pod_id)
        if handlers:
            self.install_exit_handlers()
        return reaped

    def install_exit_handlers(self) -> None:
        atexit.register(self.shutdown, "exit")
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous = signal.getsignal(sig)

            def handler(signum, frame, previous=previous):
                # Only stop here: the pods are terminated once the interrupted frame has
                # unwound (run()'s or the caller's `finally`, or the atexit hook). Terminating
                # from the handler re-entered the cloud call the signal had landed in (a held
                # flock, an HTTP client's pool lock) and deadlocked.
                self._signal = signal.Signals(signum).name.lower()
                self._stop.set()
                self.closed = True  # a tick still in flight creates no pod
                if callable(previous):
                    previous(signum, frame)
                elif signum == signal.SIGINT:
                    raise KeyboardInterrupt
                else:
                    raise SystemExit(128 + signum)

            signal.signal(sig, handler)

    def shutdown(self, reason: str = "exit") -> None:
        """Terminate every pod this session created, for `reason` (or the signal that stopped
        us). Idempotent (a later call retries what a failed terminate left open); never
        raises: it runs from `finally` blocks and the exit hook."""
        reason = self._signal or reason
        self._stop.set()
        with self._lock:
            self.closed = True
            try:
                for row in self.live():
                    self._terminate(row, reason)
            except Exception as exc:  # e.g. the ledger closed at interpreter exit
                log.warning("shutdown: %s: %s (run `nestor pods reap`)", type(exc).__name__, exc)

    def __enter__(self) -> Provisioner:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown("exit" if exc[0] is None else "error")

    def run(self, should_stop: Callable[[], bool] = lambda: False) -> None:
        """Tick every `poll_s` until stopped, capped, or `should_stop()`; then shut down."""
        try:
            while not self._stop.is_set() and not should_stop() and not self.capped:
                self.tick()
                self._stop.wait(self.config.poll_s)
        finally:
            self.shutdown("exit")

    # --- one reconciliation pass ------------------------------------------------------------
    def tick(self) -> None:
        with self._lock:
            if self.closed:
                return
            self._replace_dead()
            if self._enforce_cap():
                return
            target = min(self.config.max_pods, max(self.config.min_pods, int(self.demand())))
            self._scale_up(target)
            self._scale_down(target)

    def _replace_dead(self) -> None:
        mine = self.live()
        if not mine:
            return
        try:
            seen = {p.id: p for p in self.api.list()}
        except PodApiError as exc:  # a flaky list call must not look like every pod dying
            self._event("list-failed", str(exc))
            return
        now = self.clock()
        for row in mine:
            pod = seen.get(row.pod_id)
            if pod is None and now - row.created_at < LIST_GRACE_S:
                continue  # a pod just created may not be listed yet
            if pod is None or not pod.alive:
                self._terminate(row, "died")
            elif not pod.ready and now - row.created_at > self.config.boot_timeout_s:
                self._terminate(row, "boot-timeout")

    def _enforce_cap(self) -> bool:
        # Stop a tick early: the pods keep billing until the next tick could act.
        horizon_usd = self.burn_per_hr() * self.config.poll_s / 3600.0
        if self.spent_usd() + horizon_usd < self.config.max_cost_usd:
            return False
        self._event("cap", f"spent ${self.spent_usd():.2f} of ${self.config.max_cost_usd:.2f}")
        for row in self.live():
            self._terminate(row, "cap")
        self.capped = True
        return True

    def _scale_up(self, target: int) -> None:
        missing = target - len(self.live())
        if missing <= 0:
            return
        ids = [t.gpu_type_id for t in self.config.pod_types]
        try:
            stock = self.api.gpu_stock(ids)
        except PodApiError as exc:  # no stock view: still try in cost order, create will tell
            self._event("stock-failed", str(exc))
            stock = {}
        prices = {k: v.price_per_hr for k, v in stock.items() if v.price_per_hr}
        order = cost_order(self.config, self.matrix, self.base_model, prices)
        out = {k for k, v in stock.items() if not v.available}
        for _ in range(missing):
            if self._create_one(order, out, prices) is None:
                break

    def _create_one(self, order: list[PodType], out: set[str],
                    prices: dict[str, float]) -> Pod | None:
        if self.closed:  # a signal handler shut us down mid-tick
            return None
        for pod_type in order:
            if pod_type.gpu_type_id in out:
                continue
            price = prices.get(pod_type.gpu_type_id) or pod_type.price_per_hr
            projected = (self.spent_usd() + (self.burn_per_hr() + price)
                         * self.config.cap_horizon_s / 3600.0)
            if projected > self.config.max_cost_usd:
                self._event("refused", f"{pod_type.worker_type}: projected ${projected:.2f} "
                            f"passes the cap ${self.config.max_cost_usd:.2f}")
                continue  # a cheaper type later in the order may still fit
            self._counter += 1
            name = f"{self.ledger.name_prefix()}{self._counter}"
            docker_args, env = bootstrap_args(self.config, pod_type)
            spec = PodSpec(name=name, gpu_type_id=pod_type.gpu_type_id, image=self.config.image,
                           docker_args=docker_args, env=env, cloud_type=self.config.cloud_type,
                           container_disk_gb=self.config.container_disk_gb)
            try:
                pod = self.api.create(spec)
            except StockOutError as exc:
                out.add(pod_type.gpu_type_id)
                self._event("stock-out", f"{pod_type.gpu_type_id}: {exc}")
                continue
            except PodApiError as exc:
                self._event("create-failed", f"{pod_type.gpu_type_id}: {exc}")
                continue
            self.ledger.add(pod.id, name, self.session, pod_type.gpu_type_id,
                            pod_type.worker_type, price, self.clock())
            self._event("created", f"{pod.id} {pod_type.worker_type} ${price:.2f}/h")
            return pod
        return None

    def _scale_down(self, target: int) -> None:
        live = self.live()
        if len(live) <= target:
            self._surplus_since = None
            return
        now = self.clock()
        if self._surplus_since is None:
            self._surplus_since = now
        if now - self._surplus_since < self.config.idle_timeout_s:
            return
        for row in sorted(live, key=lambda r: -r.price_per_hr)[:len(live) - target]:
            self._terminate(row, "idle")
        self._surplus_since = None

    def _terminate(self, row: PodRow, reason: str) -> None:
        try:
            self.api.terminate(row.pod_id)
        except PodApiError as exc:
            # Leave the row open: the next tick, start or `nestor pods reap` retries it.
            self._event("terminate-failed", f"{row.pod_id}: {exc}")
            return
        self.ledger.close_row(row.pod_id, self.clock(), reason)
        self._event(f"terminated-{reason}", row.pod_id)


def reap(ledger: PodLedger, api: PodApi, clock: Callable[[], float] = time.time, *,
         exclude_session: str | None = None) -> list[str]:
    """Terminate every pod of this run that is still open in the ledger, or that the cloud lists
    under the run's name prefix without a row (killed between create and insert)."""
    reaped = []
    rows = [r for r in ledger.rows(open_only=True) if r.session != exclude_session]
    listed = api.list()
    known = {r.pod_id for r in ledger.rows()}
    prefix = ledger.name_prefix()
    alive_ids = {p.id for p in listed}
    for row in rows:
        if row.pod_id in alive_ids:
            api.terminate(row.pod_id)
            reaped.append(row.pod_id)
        ledger.close_row(row.pod_id, clock(), "reaped")
    for pod in listed:  # an exited pod still bills for its disk: terminate it too
        if pod.name.startswith(prefix) and pod.id not in known:
            api.terminate(pod.id)
            reaped.append(pod.id)
    return reaped


def pool_demand(pool) -> Callable[[], int]:
    """Demand as a pool sees it: busy workers plus queued jobs. Pass it as `demand=` so pods
    follow the work and the surplus goes after `idle_timeout_s`."""
    def demand() -> int:
        busy = sum(1 for w in pool.workers() if w.get("busy"))
        queued = pool.queued() if hasattr(pool, "queued") else len(getattr(pool, "_pending", ()))
        return busy + queued
    return demand
