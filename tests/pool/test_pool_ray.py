"""The Ray backend against a real local Ray head (started once per session by conftest)."""

from __future__ import annotations

import os
import signal
import time

import pytest

from nestor.inner.types import JobRequest
from nestor.pool import PoolError, WorkerType, make_pool


def test_unreachable_address_is_a_clear_error_not_a_hang(pool_config, unused_port):
    port = unused_port  # nothing listens there
    t0 = time.monotonic()
    with pytest.raises(PoolError, match=f"127.0.0.1:{port} does not answer"):
        make_pool(pool_config(backend="ray", address=f"127.0.0.1:{port}"))
    assert time.monotonic() - t0 < 5
    with pytest.raises(PoolError, match="not 'auto', 'host:port'"):
        make_pool(pool_config(backend="ray", address="nonsense"))


def test_ray_actors_place_by_resource_and_retry_after_kill9(ray_head, pool_config, make_job):
    slow = make_job("slow", sleep=2.0)
    quick = make_job("quick", sleep=0.2)
    types = [WorkerType(name="a40", price_per_hour=0.4, num_gpus=1, resources={"worker:a40": 1},
                        models=["tiny-s", "qwen3-0.6b"]),
             WorkerType(name="cpu", price_per_hour=3.6, num_cpus=0.5, resources={"worker:cpu": 1},
                        max_workers=4, models=["tiny-s"])]
    config = pool_config(backend="ray", address=ray_head, worker_types=types,
                         placement_timeout_s=1.0)
    with make_pool(config) as pool:
        # the head has 2 CPUs and {"worker:cpu": 2}, no GPU: a40 is absent, cpu fits 2 actors
        assert pool.absent() == ["a40"]
        assert pool.capacity() == 2
        # a40 is cheaper but absent: tiny-s falls back to cpu; qwen3-0.6b (a40 only) must wait
        # for an a40 node, and fails once placement_timeout_s passes without one
        unplaceable = pool.submit(JobRequest(job_dir=make_job("big", base_model="qwen3-0.6b"),
                                             task_id="t"))
        victim = pool.submit(JobRequest(job_dir=slow, task_id="t", request_id="victim"))
        others = [pool.submit(JobRequest(job_dir=quick, task_id="t", request_id=f"q{i}"))
                  for i in range(3)]
        end = time.monotonic() + 60
        while not (slow / "pid-victim").exists():
            assert time.monotonic() < end, "the job never started on a Ray actor"
            time.sleep(0.05)
        time.sleep(0.1)
        pid = int((slow / "pid-victim").read_text())
        os.kill(pid, signal.SIGKILL)
        result = victim.result(timeout=90)
        rest = [f.result(timeout=90) for f in others]
        failed = unplaceable.result(timeout=30)
        # a no-wait job on a warm actor (its overhead: benchmarks/pool_scaling.py)
        noop = pool.submit(JobRequest(job_dir=make_job("noop"), task_id="t")).result(timeout=30)
    assert result.status == "ok", result.log_tail
    assert result.metrics[0]["pid"] != pid
    assert "ActorDiedError" in result.log_tail or "died" in result.log_tail
    assert all(r.status == "ok" and r.worker.startswith("cpu/") for r in rest)
    assert result.cost_usd > 0.002  # ~2 s at $3.6/h at least, plus the killed attempt
    assert noop.status == "ok"
    assert failed.status == "failed" and "no worker of type a40 joined" in failed.log_tail
