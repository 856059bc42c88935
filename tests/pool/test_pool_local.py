"""The local backend with real worker processes running small real job functions."""

from __future__ import annotations

import os
import signal
import time

import pytest

from nestor.inner.types import JobRequest
from nestor.pool import Pool, WorkerType, make_pool


def wait_for(path, timeout=30.0):
    end = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < end, f"{path} never appeared"
        time.sleep(0.02)
    time.sleep(0.05)  # let the writer finish
    return path.read_text()


def test_jobs_run_in_parallel_on_warm_workers(make_job, pool_config):
    job = make_job(sleep=0.6)
    with make_pool(pool_config(workers=2)) as pool:
        assert isinstance(pool, Pool) and pool.capacity() == 2
        assert pool.wait_ready(60)
        futures = [pool.submit(JobRequest(job_dir=job, task_id="reverse")) for _ in range(4)]
        results = [f.result(timeout=30) for f in futures]
    assert [r.status for r in results] == ["ok"] * 4
    assert {r.worker for r in results} == {"local/0", "local/1"}
    # the two workers' jobs overlapped in time (the speed-up itself: benchmarks/pool_scaling.py)
    spans = {w: [(r.metrics[0]["t0"], r.metrics[0]["t1"]) for r in results if r.worker == w]
             for w in ("local/0", "local/1")}
    assert any(a0 < b1 and b0 < a1 for a0, a1 in spans["local/0"] for b0, b1 in spans["local/1"])
    # the warm state outlives a job: each worker's counter reached 2
    assert sorted(r.steps for r in results) == [1, 1, 2, 2]
    assert len({r.metrics[0]["pid"] for r in results}) == 2
    assert all(r.base_model == "tiny-s" for r in results)


def test_kill9_mid_job_retries_on_another_worker(make_job, pool_config):
    slow = make_job("slow", sleep=2.0)
    quick = make_job("quick", sleep=0.3)
    with make_pool(pool_config(workers=2)) as pool:
        victim = pool.submit(JobRequest(job_dir=slow, task_id="t", request_id="victim"))
        others = [pool.submit(JobRequest(job_dir=quick, task_id="t", request_id=f"q{i}"))
                  for i in range(3)]
        pid = int(wait_for(slow / "pid-victim"))
        os.kill(pid, signal.SIGKILL)
        result = victim.result(timeout=60)
        rest = [f.result(timeout=60) for f in others]
    assert result.status == "ok"
    assert result.metrics[0]["pid"] != pid  # it finished in another process
    assert "died" in result.log_tail and "attempt 1" in result.log_tail
    assert [r.status for r in rest] == ["ok"] * 3  # no other job's result was lost


def test_timeout_kills_and_recycles_the_worker(make_job, pool_config):
    hang = make_job("hang", sleep=60)
    quick = make_job("quick")
    with make_pool(pool_config(workers=1, timeout_grace_s=0.0)) as pool:
        t0 = time.monotonic()
        timed_out = pool.submit(JobRequest(job_dir=hang, task_id="t", timeout_s=0.5)).result(30)
        waited = time.monotonic() - t0
        after = pool.submit(JobRequest(job_dir=quick, task_id="t")).result(timeout=30)
    assert timed_out.status == "timeout"
    assert waited < 15, waited
    assert "worker recycled" in timed_out.log_tail
    assert after.status == "ok"
    assert after.worker == "local/1"  # a fresh worker replaced the killed one
    assert after.steps == 1


def test_retries_run_out_lost_and_others_unharmed(make_job, pool_config):
    doomed = make_job("doomed", die_always=True)
    fine = make_job("fine", sleep=0.2)
    with make_pool(pool_config(workers=2, max_retries=1)) as pool:
        lost = pool.submit(JobRequest(job_dir=doomed, task_id="t"))
        ok = [pool.submit(JobRequest(job_dir=fine, task_id="t")) for _ in range(2)]
        lost_result = lost.result(timeout=60)
        ok_results = [f.result(timeout=60) for f in ok]
    assert lost_result.status == "lost"
    assert "retries exhausted (1)" in lost_result.log_tail
    assert lost_result.log_tail.count("died") == 2  # first try + one retry
    assert [r.status for r in ok_results] == ["ok", "ok"]


def test_raising_job_fails_but_worker_survives(pool_config, make_job):
    job = make_job()
    with make_pool(pool_config(workers=1, job_fn="pool_jobs:raising_job")) as pool:
        first = pool.submit(JobRequest(job_dir=job, task_id="t")).result(timeout=30)
        second = pool.submit(JobRequest(job_dir=job, task_id="t")).result(timeout=30)
    assert first.status == second.status == "failed"
    assert "bad things" in first.log_tail
    assert first.worker == second.worker == "local/0"


def test_unloadable_job_function_fails_jobs_clearly(pool_config, make_job):
    with make_pool(pool_config(workers=1, job_fn="pool_jobs:no_such_fn")) as pool:
        result = pool.submit(JobRequest(job_dir=make_job(), task_id="t")).result(timeout=60)
    assert result.status == "failed"
    assert "has no attribute 'no_such_fn'" in result.log_tail


def test_cheapest_type_first_then_fallback_in_cost_order(pool_config, make_job):
    small = make_job("small", base_model="tiny-s", sleep=1.0)
    medium = make_job("medium", base_model="tiny-m", sleep=0.1)
    types = [WorkerType(name="dear", price_per_hour=36.0),
             WorkerType(name="cheap", price_per_hour=3.6, models=["tiny-s"])]
    with make_pool(pool_config(worker_types=types)) as pool:
        assert pool.wait_ready(60)
        a = pool.submit(JobRequest(job_dir=small, task_id="t"))
        b = pool.submit(JobRequest(job_dir=small, task_id="t"))  # cheap is busy: falls back
        c = pool.submit(JobRequest(job_dir=medium, task_id="t"))  # only dear runs tiny-m
        ra, rb, rc = (f.result(timeout=30) for f in (a, b, c))
    assert (ra.worker, rb.worker) == ("cheap/0", "dear/0")
    assert rc.worker == "dear/0" and rc.status == "ok"
    # cost = seconds held x price per hour: each held its worker for its 1 s sleep at least
    # (no upper bound on a loaded machine's hold: a generous 10 s catches a price off by 10x)
    assert 3.6 / 3600 <= ra.cost_usd < 10 * 3.6 / 3600, ra.cost_usd
    assert 36 / 3600 <= rb.cost_usd < 10 * 36 / 3600, rb.cost_usd


def test_workers_warm_up_their_models_before_the_first_job(pool_config, make_job):
    types = [WorkerType(name="small", models=["tiny-s"]), WorkerType(name="any")]
    config = pool_config(worker_types=types, preload_models=["tiny-s", "tiny-m"])
    with make_pool(config) as pool:
        a = pool.submit(JobRequest(job_dir=make_job("a"), task_id="t"), worker_type="small")
        b = pool.submit(JobRequest(job_dir=make_job("b"), task_id="t"), worker_type="any")
        ra, rb = a.result(timeout=60), b.result(timeout=60)
    # each worker preloads only what its type can run, and did so before its first job
    assert ra.metrics[0]["preloaded"] == ["tiny-s"]
    assert rb.metrics[0]["preloaded"] == ["tiny-s", "tiny-m"]


def test_gpu_worker_types_hand_their_device_and_dtype_to_the_warm_state(pool_config, make_job):
    # A type that reserves a GPU must not train on the CPU: its warm state gets device "cuda"
    # (and the dtype asked for); a CPU type gets no options at all (custom warm states need not
    # take them).
    types = [WorkerType(name="gpu", num_gpus=1, dtype="bfloat16"), WorkerType(name="cpu")]
    assert types[0].warm_kwargs() == {"device": "cuda", "dtype": "bfloat16"}
    assert WorkerType(name="x", num_gpus=1, device="cuda:1").torch_device() == "cuda:1"
    with make_pool(pool_config(worker_types=types, preload_models=[])) as pool:
        a = pool.submit(JobRequest(job_dir=make_job("a"), task_id="t"), worker_type="gpu")
        b = pool.submit(JobRequest(job_dir=make_job("b"), task_id="t"), worker_type="cpu")
        ra, rb = a.result(timeout=60), b.result(timeout=60)
    assert ra.metrics[0]["warm_options"] == {"device": "cuda", "dtype": "bfloat16"}
    assert rb.metrics[0]["warm_options"] == {}


def test_shutdown_lets_idle_workers_exit_cleanly(pool_config, make_job, tmp_path):
    marker = tmp_path / "exited"
    with make_pool(pool_config(workers=1)) as pool:
        job = make_job(atexit_marker=str(marker))
        assert pool.submit(JobRequest(job_dir=job, task_id="t")).result(timeout=60).status == "ok"
    # its exit handlers ran (they close the worker's sandboxed reward hosts): no SIGKILL
    assert marker.read_text() == "clean exit"


def test_model_nobody_runs_fails_at_once(pool_config, make_job):
    types = [WorkerType(name="cheap", models=["tiny-s"])]
    with make_pool(pool_config(worker_types=types)) as pool:
        r = pool.submit(JobRequest(job_dir=make_job(base_model="qwen3-1.7b"), task_id="t"))
        result = r.result(timeout=10)
    assert result.status == "failed"
    assert "no worker type runs base model 'qwen3-1.7b'" in result.log_tail


def test_shutdown_resolves_queued_jobs_as_lost(pool_config, make_job):
    job = make_job(sleep=30)
    pool = make_pool(pool_config(workers=1))
    futures = [pool.submit(JobRequest(job_dir=job, task_id="t")) for _ in range(2)]
    pool.shutdown()
    results = [f.result(timeout=10) for f in futures]
    assert [r.status for r in results] == ["lost", "lost"]
    assert pool.submit(JobRequest(job_dir=job, task_id="t")).result(1).status == "lost"


@pytest.mark.slow
def test_real_tiny_job_on_a_warm_worker(tmp_path):
    """The real inner loop (nestor.inner.run) on the example job, with very few steps."""
    import shutil
    from pathlib import Path

    from nestor.pool import PoolConfig

    src = Path(__file__).resolve().parents[2] / "examples" / "jobs" / "good-reverse"
    job = tmp_path / "job"
    shutil.copytree(src, job)
    cfg = job / "config.toml"
    lines = [ln for ln in cfg.read_text().splitlines()
             if ln.split("=")[0].strip() not in ("max_steps", "prompts_per_step", "group_size")]
    cfg.write_text("\n".join(["max_steps = 2", "prompts_per_step = 4", "group_size = 4", *lines]))
    config = PoolConfig(workers=1, cost_matrix=tmp_path / "m.json", threads_per_worker=1)
    with make_pool(config) as pool:
        result = pool.submit(JobRequest(job_dir=job, task_id="reverse", out_dir=tmp_path / "out",
                                        timeout_s=300)).result(timeout=400)
    assert result.status == "ok", result.log_tail
    assert result.steps == 2
    assert result.worker == "local/0"
    assert result.pre_score is not None and result.post_score is not None
