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


def test_a_lone_caller_waits_only_the_window():
    batcher = RequestBatcher(lambda items: items, window_s=0.05)
    t0 = time.monotonic()
    assert batcher("a") == "a"
    assert time.monotonic() - t0 < 1.0 and batcher.batch_sizes == [1]


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


def test_exclusive_waits_for_shared_and_blocks_new_shared():
    lock = SharedExclusiveLock()
    order = []
    first_in = threading.Event()

    def reader(name, hold):
        with lock.shared():
            order.append(f"{name}+")
            first_in.set()
            time.sleep(hold)
            order.append(f"{name}-")

    def writer():
        with lock.exclusive():
            order.append("W")

    r1 = threading.Thread(target=reader, args=("r1", 0.3))
    r1.start()
    first_in.wait(5)
    w = threading.Thread(target=writer)
    w.start()
    time.sleep(0.05)  # the writer is waiting now: a new reader queues behind it
    r2 = threading.Thread(target=reader, args=("r2", 0.0))
    r2.start()
    for t in (r1, w, r2):
        t.join(timeout=10)
    assert order == ["r1+", "r1-", "W", "r2+", "r2-"]
