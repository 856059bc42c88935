"""RequestBatcher and SharedExclusiveLock: concurrent calls batched, errors delivered, and a
training step that waits for running acts and blocks new ones."""

import threading
import time

import pytest

from nestor.policy.batching import RequestBatcher, SharedExclusiveLock


def test_batcher_serves_each_caller_its_own_result():
    calls = []

    def double(items):
        calls.append(list(items))
        return [2 * x for x in items]

    batcher = RequestBatcher(double, max_batch=3, window_s=2.0)
    results = {}
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, batcher(i)))
               for i in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    assert results == {i: 2 * i for i in range(5)}
    assert sorted(len(c) for c in calls) == [2, 3]  # capped at max_batch, the rest next
    assert sorted(x for c in calls for x in c) == list(range(5))


def test_a_lone_caller_waits_the_window_not_for_a_full_batch():
    # served after the window (the batch never fills); its latency is benchmarks/unit_latency.py's
    batcher = RequestBatcher(lambda items: items, max_batch=8, window_s=0.2)
    served = []
    t0 = time.monotonic()
    caller = threading.Thread(target=lambda: served.append((batcher("a"), time.monotonic() - t0)),
                              daemon=True)
    caller.start()
    caller.join(timeout=60)  # generous: a wait for the batch to fill would never end
    assert served, "a lone caller waited for a batch that never fills"
    assert served[0][0] == "a" and served[0][1] >= 0.2 and batcher.batch_sizes == [1]


def test_batch_errors_reach_every_caller_and_the_next_batch_runs():
    def fn(items):
        if "bad" in items:
            raise ValueError("boom")
        return items

    batcher = RequestBatcher(fn, window_s=0.0)
    with pytest.raises(ValueError, match="boom"):
        batcher("bad")
    assert batcher("ok") == "ok"
    short = RequestBatcher(lambda items: [], window_s=0.0)
    with pytest.raises(RuntimeError, match="0 results for 1"):
        short("x")


class _WatchedCondition(threading.Condition):
    """The lock's condition, reporting which threads have blocked in wait()."""

    def __init__(self):
        super().__init__()
        self.blocked = {name: threading.Event() for name in ("W", "r2")}

    def wait(self, timeout=None):
        name = threading.current_thread().name
        if name in self.blocked:
            self.blocked[name].set()
        return super().wait(timeout)


def test_exclusive_waits_for_shared_and_blocks_new_shared():
    lock = SharedExclusiveLock()
    lock._cond = cond = _WatchedCondition()
    order = []
    r1_in, r1_release = threading.Event(), threading.Event()

    def reader(name, release):
        with lock.shared():
            order.append(f"{name}+")
            if release is not None:
                r1_in.set()
                assert release.wait(10)
            order.append(f"{name}-")

    def writer():
        with lock.exclusive():
            order.append("W")

    r1 = threading.Thread(target=reader, args=("r1", r1_release), name="r1")
    r1.start()
    assert r1_in.wait(10)
    w = threading.Thread(target=writer, name="W")
    w.start()
    assert cond.blocked["W"].wait(10)  # the writer waits for r1 ...
    r2 = threading.Thread(target=reader, args=("r2", None), name="r2")
    r2.start()
    cond.blocked["r2"].wait(2)  # ... and a new reader queues behind it (never set if it got in)
    r1_release.set()
    for t in (r1, w, r2):
        t.join(timeout=10)
    assert order == ["r1+", "r1-", "W", "r2+", "r2-"]
