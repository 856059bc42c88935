"""Fixtures for the pool tests: job dirs whose behaviour the test job functions read, a pool
config that runs those functions, and one real local Ray head for the whole session."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from nestor.pool import PoolConfig

HERE = Path(__file__).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def unused_port() -> int:
    return free_port()


@pytest.fixture
def make_job(tmp_path):
    """make_job(name, base_model=..., **behaviour) -> a job dir for pool_jobs.behave_job."""

    def make(name: str = "job", base_model: str = "tiny-s", **behave) -> Path:
        d = tmp_path / name
        d.mkdir()
        (d / "config.toml").write_text(f'base_model = "{base_model}"\n')
        (d / "behave.json").write_text(json.dumps(behave))
        return d

    return make


@pytest.fixture
def pool_config(tmp_path):
    """A PoolConfig running the test job functions, with its own (empty) cost matrix path."""

    def config(**kw) -> PoolConfig:
        base = dict(job_fn="pool_jobs:behave_job", warm_state="pool_jobs:CountingWarm",
                    python_path=[str(HERE)], cost_matrix=tmp_path / "cost_matrix.json",
                    threads_per_worker=1)
        return PoolConfig(**{**base, **kw})

    return config


@pytest.fixture(scope="session")
def ray_head():
    """A real single-node Ray head on loopback (2 CPUs, 2 'worker:cpu'), in its own process
    group so that teardown stops exactly this head and nothing else on the machine."""
    ray_bin = Path(sys.executable).with_name("ray")
    port = free_port()
    tmp = tempfile.mkdtemp(prefix="nr", dir="/tmp")  # short: Ray's unix socket paths are capped
    log = open(Path(tmp) / "head.log", "wb")  # noqa: SIM115 - closed in teardown
    proc = subprocess.Popen(
        [str(ray_bin), "start", "--head", "--block", "--num-cpus", "2", "--port", str(port),
         "--node-ip-address", "127.0.0.1", "--disable-usage-stats", "--include-dashboard=false",
         "--temp-dir", tmp, "--resources", json.dumps({"worker:cpu": 2})],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 120
    head_log = Path(tmp) / "head.log"
    while "Ray runtime started" not in head_log.read_text(errors="replace"):  # GCS *and* raylet
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"ray head did not start: {head_log.read_text()[-2000:]}")
        time.sleep(0.5)
    yield f"127.0.0.1:{port}"
    import ray

    if ray.is_initialized():
        ray.shutdown()
    for sig, wait_s in ((signal.SIGTERM, 1), (signal.SIGKILL, 10)):  # gcs ignores TERM for long
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait_s)
            break
        except subprocess.TimeoutExpired:
            continue
    log.close()
    shutil.rmtree(tmp, ignore_errors=True)
