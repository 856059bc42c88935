"""The Pool protocol every backend implements, and `make_pool` to build one from config."""

from __future__ import annotations

import importlib
from concurrent.futures import Future
from typing import Any, Protocol, runtime_checkable

from nestor.inner.types import JobRequest, JobResult
from nestor.pool.config import PoolConfig


class PoolError(RuntimeError):
    """The pool cannot start or run (bad config, unreachable cluster); the message says why."""


@runtime_checkable
class Pool(Protocol):
    def submit(self, request: JobRequest) -> Future[JobResult]:
        """Queue a job; the future resolves to its JobResult (never raises for job problems)."""

    def capacity(self) -> int:
        """How many jobs can run at once."""

    def shutdown(self) -> None:
        """Stop every worker; jobs still queued or running resolve with status 'lost'."""


def load_callable(path: str) -> Any:
    """'package.module:attr' -> the object; a clear ImportError message otherwise."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ImportError(f"{path!r} is not 'module:attribute'")
    module = importlib.import_module(module_name)
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ImportError(f"module {module_name!r} has no attribute {attr!r}") from None


def make_pool(config: PoolConfig | None = None) -> Pool:
    """A started pool of the configured backend; raises PoolError when it cannot start."""
    config = config or PoolConfig()
    if config.backend == "ray":
        from nestor.pool.ray_pool import RayPool

        return RayPool(config)
    from nestor.pool.local import LocalPool

    return LocalPool(config)
