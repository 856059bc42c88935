"""Pool scaling and dispatch overhead.

0. The pool's own scaling: 8 one-second sleep jobs (no CPU), then 8 one-core matmul jobs
   (~1 s of CPU each), 1 vs 2 workers.
1. Scaling: 8 example jobs (examples/jobs/good-*, cycled, each with its own seed and `--max-steps`)
   through the real inner loop on a warm local pool of 1 worker, then of 2 workers, one torch
   thread per worker in both runs (so the comparison is the pool's, not torch's threading).
   Target: t(1 worker) / t(2 workers) >= 1.7.
2. Dispatch overhead: round-trip time of a no-op job on a warm worker (submit -> result), the
   pool's own cost per job. Targets: <= 0.5 s local, <= 2 s on a local Ray head (started here in
   its own process group and stopped afterwards; skipped with --no-ray).

    .venv/bin/python benchmarks/pool_scaling.py [--max-steps 4] [--jobs 8] [--no-ray]

The last line printed is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent


def noop_job(request, *, warm=None):
    """The no-op job function whose round trip is the dispatch overhead."""
    from nestor.inner.types import JobResult

    return JobResult(status="ok")


def sleep_job(request, *, warm=None):
    """A job that holds its worker for 1 s without using a core: scaling with no CPU contention."""
    from nestor.inner.types import JobResult

    time.sleep(1.0)
    return JobResult(status="ok")


def cpu_job(request, *, warm=None):
    """A job that keeps one core busy (~1 s of single-thread matmuls): CPU scaling alone."""
    import torch

    from nestor.inner.types import JobResult

    a = torch.randn(256, 256)
    for _ in range(1500):
        a = torch.tanh(a @ a.T / 256)
    return JobResult(status="ok")


def synthetic_scaling(out: Path, n: int, fn: str) -> dict:
    """The pool's own scaling: n synthetic jobs on 1 and on 2 warm workers."""
    from nestor.inner.types import JobRequest
    from nestor.pool import PoolConfig, make_pool

    job = out / f"{fn}-job"
    job.mkdir()
    (job / "config.toml").write_text('base_model = "tiny-s"\n')
    times = {}
    for workers in (1, 2):
        config = PoolConfig(workers=workers, job_fn=f"pool_scaling:{fn}", warm_state=None,
                            python_path=[str(HERE)], cost_matrix=out / "m.json",
                            threads_per_worker=1)
        with make_pool(config) as pool:
            assert pool.wait_ready(120), "workers did not start"
            # one untimed job per worker: imports (torch) are start-up, not scaling
            warmup = [pool.submit(JobRequest(job_dir=job, task_id="reverse"))
                      for _ in range(workers)]
            assert all(f.result().status == "ok" for f in warmup)
            t0 = time.monotonic()
            futures = [pool.submit(JobRequest(job_dir=job, task_id="reverse")) for _ in range(n)]
            assert all(f.result().status == "ok" for f in futures)
            times[workers] = time.monotonic() - t0
    return {"t_1_worker_s": round(times[1], 3), "t_2_workers_s": round(times[2], 3),
            "speedup": round(times[1] / times[2], 3)}


def example_jobs(n: int, max_steps: int, dest: Path) -> list[tuple[Path, str]]:
    """n copies of the good example jobs (examples/jobs/good-<task>), cycled, each with its own
    seed and at most `max_steps` steps; returns (job dir, task id) pairs."""
    from nestor.job.config import load_job_config
    from nestor.job.scaffold import config_toml

    sources = sorted(p for p in (ROOT / "examples" / "jobs").glob("good-*")
                     if (p / "config.toml").is_file())
    jobs = []
    for i in range(n):
        src = sources[i % len(sources)]
        job = dest / f"{i}-{src.name}"
        shutil.copytree(src, job)
        cfg = load_job_config(src / "config.toml")
        cfg = cfg.model_copy(update={"max_steps": min(cfg.max_steps, max_steps), "seed": i})
        (job / "config.toml").write_text(config_toml(cfg))
        jobs.append((job, src.name.removeprefix("good-")))
    return jobs


def run_batch(workers: int, jobs: list[tuple[Path, str]], out: Path) -> tuple[float, list]:
    from nestor.inner.types import JobRequest
    from nestor.pool import PoolConfig, make_pool

    config = PoolConfig(workers=workers, threads_per_worker=1, cost_matrix=out / "m.json")
    with make_pool(config) as pool:
        assert pool.wait_ready(300), "workers did not start"
        t0 = time.monotonic()
        futures = [pool.submit(JobRequest(job_dir=j, task_id=task, timeout_s=1800,
                                          out_dir=out / f"w{workers}-{j.name}"))
                   for j, task in jobs]
        results = [f.result() for f in futures]
        elapsed = time.monotonic() - t0
    print(f"{workers} worker(s): {elapsed:.1f} s for {len(jobs)} jobs; statuses "
          f"{[r.status for r in results]}; job walls {[round(r.wall_s, 1) for r in results]}; "
          f"load average {os.getloadavg()[0]:.1f}", flush=True)
    for (job, _), r in zip(jobs, results, strict=True):
        if r.status != "ok":
            print(f"  {job.name}: {r.status}: {r.log_tail[-400:]}", flush=True)
    return elapsed, results


def warm_pre_scores(jobs: list[tuple[Path, str]]) -> None:
    """Fill the on-disk pre-score cache first, so neither timed run computes one the other
    then reads (that would flatter whichever runs second)."""
    from nestor.inner.evaluate import pre_score
    from nestor.job.config import load_job_config

    for model, task in sorted({(load_job_config(j / "config.toml").base_model, t)
                               for j, t in jobs}):
        pre_score(model, task)


def overhead(config, n: int) -> dict:
    from nestor.inner.types import JobRequest
    from nestor.pool import make_pool

    job = Path(tempfile.mkdtemp(prefix="nestor-noop-"))
    (job / "config.toml").write_text('base_model = "tiny-s"\n')
    with make_pool(config) as pool:
        assert pool.wait_ready(120), "workers did not start"
        pool.submit(JobRequest(job_dir=job, task_id="reverse")).result()  # warm the path
        times = []
        for _ in range(n):
            t0 = time.monotonic()
            r = pool.submit(JobRequest(job_dir=job, task_id="reverse")).result()
            times.append(time.monotonic() - t0)
            assert r.status == "ok", r.log_tail
    shutil.rmtree(job, ignore_errors=True)
    return {"mean_s": statistics.mean(times), "p95_s": sorted(times)[int(0.95 * (n - 1))],
            "max_s": max(times), "n": n}


def start_ray_head() -> tuple[subprocess.Popen, str, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tmp = tempfile.mkdtemp(prefix="nr", dir="/tmp")
    log = Path(tmp) / "head.log"
    proc = subprocess.Popen(
        [str(Path(sys.executable).with_name("ray")), "start", "--head", "--block",
         "--num-cpus", "2", "--port", str(port), "--node-ip-address", "127.0.0.1",
         "--disable-usage-stats", "--include-dashboard=false", "--temp-dir", tmp],
        stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
    end = time.monotonic() + 120
    while "Ray runtime started" not in log.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > end:
            raise RuntimeError(log.read_text()[-2000:])
        time.sleep(0.5)
    return proc, f"127.0.0.1:{port}", tmp


def stop_ray_head(proc: subprocess.Popen, tmp: str) -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()
    for sig, wait_s in ((signal.SIGTERM, 3), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=wait_s)
            break
        except ProcessLookupError:
            break
        except subprocess.TimeoutExpired:
            continue
    shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--max-steps", type=int, default=4)
    ap.add_argument("--overhead-n", type=int, default=30)
    ap.add_argument("--no-scaling", action="store_true", help="Only measure dispatch overhead.")
    ap.add_argument("--no-ray", action="store_true", help="Skip the Ray head measurement.")
    ap.add_argument("--rounds", type=int, default=1,
                    help="Pairs of (1 worker, 2 workers) runs; the median speedup is reported.")
    args = ap.parse_args()

    from nestor.pool import PoolConfig

    figures: dict = {"cpus": os.cpu_count(), "jobs": args.jobs, "max_steps": args.max_steps}
    noop = dict(job_fn="pool_scaling:noop_job", warm_state=None, python_path=[str(HERE)],
                threads_per_worker=1)
    with tempfile.TemporaryDirectory(prefix="nestor-bench-") as tmp:
        out = Path(tmp)
        local = overhead(PoolConfig(workers=1, cost_matrix=out / "m.json", **noop),
                         args.overhead_n)
        figures["dispatch_overhead_local_s"] = round(local["mean_s"], 4)
        figures["dispatch_overhead_local_p95_s"] = round(local["p95_s"], 4)
        print(f"local dispatch overhead: {local}", flush=True)
        figures["sleep_jobs"] = synthetic_scaling(out, args.jobs, "sleep_job")
        print(f"{args.jobs} one-second sleep jobs: {figures['sleep_jobs']}", flush=True)
        figures["cpu_jobs"] = synthetic_scaling(out, args.jobs, "cpu_job")
        print(f"{args.jobs} one-core matmul jobs: {figures['cpu_jobs']}", flush=True)
        if not args.no_ray:
            proc, address, ray_tmp = start_ray_head()
            try:
                ray = overhead(PoolConfig(backend="ray", address=address, workers=1,
                                          cost_matrix=out / "m.json", **noop), args.overhead_n)
            finally:
                stop_ray_head(proc, ray_tmp)
            figures["dispatch_overhead_ray_s"] = round(ray["mean_s"], 4)
            figures["dispatch_overhead_ray_p95_s"] = round(ray["p95_s"], 4)
            print(f"ray dispatch overhead: {ray}", flush=True)
        if not args.no_scaling:
            jobs = example_jobs(args.jobs, args.max_steps, out / "jobs")
            warm_pre_scores(jobs)
            pairs, results = [], []
            for _ in range(args.rounds):
                t1, r1 = run_batch(1, jobs, out)
                t2, r2 = run_batch(2, jobs, out)
                pairs.append((round(t1, 2), round(t2, 2), round(t1 / t2, 3)))
                results += r1 + r2
            figures.update(
                rounds=[{"t_1_worker_s": a, "t_2_workers_s": b, "speedup": c}
                        for a, b, c in pairs],
                speedup=statistics.median(c for _, _, c in pairs),
                statuses_ok=sum(r.status == "ok" for r in results), statuses_total=len(results),
                mean_job_wall_s=round(statistics.mean(r.wall_s for r in results), 2),
                load_average_1min=round(os.getloadavg()[0], 1))
    figures["targets"] = {"speedup": 1.7, "dispatch_overhead_local_s": 0.5,
                          "dispatch_overhead_ray_s": 2.0}
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
