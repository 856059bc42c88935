"""Concurrency for policies that act for many episodes at once.

Episodes run in threads; a token policy samples far faster per token in one batched forward
than in N forwards of batch 1 (a GPU most of all). `RequestBatcher` gathers the requests that
arrive together into one call; `SharedExclusiveLock` lets those acts overlap while a training
step (or save/load) still runs alone.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class _Request:
    item: Any
    result: Any = None
    error: BaseException | None = None
    done: bool = False


class RequestBatcher:
    """`batcher(item)` -> `fn([items])[i]`, with concurrent callers served by one call of `fn`.

    The first caller to find no batch running leads: it waits up to `window_s` for others (or
    until `max_batch` are queued), runs `fn` on the queue, and hands every caller its own result
    (or the exception: `fn` raising fails the whole batch; `fn` returning an exception in a
    row's place fails that row's caller only). Requests that arrive while a batch runs form the next batch, so under
    load batches fill by themselves; a lone caller pays at most `window_s`.
    """

    def __init__(self, fn: Callable[[list[Any]], list[Any]], *, max_batch: int = 8,
                 window_s: float = 0.01):
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1 (got {max_batch})")
        self.fn, self.max_batch, self.window_s = fn, max_batch, window_s
        self._cond = threading.Condition()
        self._queue: list[_Request] = []
        self._running = False
        self.batch_sizes: list[int] = []  # every batch run, for metrics and tests

    def __call__(self, item: Any) -> Any:
        req = _Request(item)
        with self._cond:
            self._queue.append(req)
            self._cond.notify_all()
            while not req.done:
                if self._running:
                    self._cond.wait()
                    continue
                self._lead()
        if req.error is not None:
            raise req.error
        return req.result

    def _lead(self) -> None:
        """Run one batch (called with the condition held; releases it around `fn`)."""
        self._running = True
        deadline = time.monotonic() + self.window_s
        while len(self._queue) < self.max_batch and (left := deadline - time.monotonic()) > 0:
            self._cond.wait(left)
        batch, self._queue = self._queue[:self.max_batch], self._queue[self.max_batch:]
        self.batch_sizes.append(len(batch))
        self._cond.release()
        try:
            results = self.fn([r.item for r in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"batched call returned {len(results)} results for "
                                   f"{len(batch)} requests")
            for r, out in zip(batch, results, strict=True):  # an exception: that caller's
                if isinstance(out, BaseException):
                    r.error = out
                else:
                    r.result = out
        except BaseException as exc:  # every caller of the batch sees it
            for r in batch:
                r.error = exc
        finally:
            self._cond.acquire()
            for r in batch:
                r.done = True
            self._running = False
            self._cond.notify_all()


class SharedExclusiveLock:
    """Many holders of `shared()` at once, or one of `exclusive()`; a waiting exclusive holder
    goes before new shared ones (a training step is not starved by a stream of acts)."""

    def __init__(self):
        self._cond = threading.Condition()
        self._shared = 0
        self._exclusive = False
        self._waiting = 0

    def shared(self) -> _Held:
        return _Held(self._acquire_shared, self._release_shared)

    def exclusive(self) -> _Held:
        return _Held(self._acquire_exclusive, self._release_exclusive)

    def _acquire_shared(self) -> None:
        with self._cond:
            while self._exclusive or self._waiting:
                self._cond.wait()
            self._shared += 1

    def _release_shared(self) -> None:
        with self._cond:
            self._shared -= 1
            self._cond.notify_all()

    def _acquire_exclusive(self) -> None:
        with self._cond:
            self._waiting += 1
            while self._exclusive or self._shared:
                self._cond.wait()
            self._waiting -= 1
            self._exclusive = True

    def _release_exclusive(self) -> None:
        with self._cond:
            self._exclusive = False
            self._cond.notify_all()


class _Held:
    def __init__(self, acquire: Callable[[], None], release: Callable[[], None]):
        self._acquire, self._release = acquire, release

    def __enter__(self) -> None:
        self._acquire()

    def __exit__(self, *exc: object) -> None:
        self._release()
