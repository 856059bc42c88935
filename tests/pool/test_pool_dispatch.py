"""Cost ranking, the cost matrix file, and pool config validation (pure, no workers)."""

from __future__ import annotations

import pytest

from nestor.pool import CostMatrix, MatrixEntry, PoolConfig, PoolConfigError, WorkerType
from nestor.pool.config import load_pool_config
from nestor.pool.dispatch import choose, rank_types

CPU = WorkerType(name="cpu", price_per_hour=0.1, max_workers=8)
A40 = WorkerType(name="a40", price_per_hour=0.4, models=["qwen3-0.6b", "tiny-m"])
H100 = WorkerType(name="h100", price_per_hour=2.5)


def names(types):
    return [t.name for t in types]


def test_without_a_matrix_price_per_hour_orders_types():
    assert names(rank_types("tiny-m", [H100, A40, CPU], None)) == ["cpu", "a40", "h100"]
    assert names(rank_types("qwen3-1.7b", [H100, A40, CPU], None)) == ["cpu", "h100"]


def test_measured_dollars_per_job_beat_price_per_hour():
    # the CPU is cheap per hour but so slow on qwen3-0.6b that a job costs more there
    matrix = CostMatrix(entries=[
        MatrixEntry(worker_type="cpu", base_model="qwen3-0.6b", seconds=36000, dollars=1.0),
        MatrixEntry(worker_type="a40", base_model="qwen3-0.6b", seconds=360, dollars=0.04),
        MatrixEntry(worker_type="h100", base_model="qwen3-0.6b", seconds=90, dollars=0.0625)])
    assert names(rank_types("qwen3-0.6b", [CPU, A40, H100], matrix)) == ["a40", "h100", "cpu"]


def test_unmeasured_type_is_assumed_as_slow_as_the_slowest_measured():
    matrix = CostMatrix(entries=[
        MatrixEntry(worker_type="a40", base_model="tiny-m", seconds=100, dollars=0.011),
        MatrixEntry(worker_type="h100", base_model="tiny-m", seconds=20, dollars=0.0139)])
    # cpu unmeasured: 0.1 $/h x 100 s = 0.0028 $ -> still first
    assert names(rank_types("tiny-m", [H100, A40, CPU], matrix)) == ["cpu", "a40", "h100"]
    failed = CostMatrix(entries=[MatrixEntry(worker_type="cpu", base_model="tiny-m", seconds=1,
                                             dollars=0.0, status="failed")])
    assert failed.get("cpu", "tiny-m") is None  # a failed measurement never ranks a type


def test_choose_falls_back_in_cost_order_and_honours_pins():
    ranked = [CPU, A40, H100]
    assert choose(ranked, {"cpu": 1, "a40": 1}).name == "cpu"
    assert choose(ranked, {"cpu": 0, "a40": 0, "h100": 2}).name == "h100"
    assert choose(ranked, {}) is None
    assert choose(ranked, {"cpu": 1, "a40": 1}, pinned="a40").name == "a40"


def test_matrix_round_trips_and_bad_files_are_ignored(tmp_path):
    path = tmp_path / "sub" / "cost_matrix.json"
    m = CostMatrix(backend="ray", entries=[
        MatrixEntry(worker_type="cpu", base_model="tiny-s", seconds=12.5, dollars=0.0003)])
    m.save(path)
    loaded = CostMatrix.load(path)
    assert loaded is not None and loaded.get("cpu", "tiny-s").seconds == 12.5
    path.write_text("{not json")
    assert CostMatrix.load(path) is None
    assert CostMatrix.load(tmp_path / "missing.json") is None


def test_pool_config_defaults_and_errors(tmp_path):
    assert PoolConfig().types()[0].name == "local"
    assert PoolConfig(backend="ray").types(cluster_cpus=6)[0].max_workers == 6
    with pytest.raises(ValueError, match="duplicate name"):
        PoolConfig(worker_types=[CPU, CPU])
    toml = tmp_path / "nestor.toml"
    toml.write_text('[pool]\nbackend = "ray"\nmax_retries = 99\n')
    with pytest.raises(PoolConfigError, match="max_retries"):
        load_pool_config(toml)
    toml.write_text('[pool]\nbackend = "ray"\n[[pool.worker_types]]\nname = "a40"\n'
                    'price_per_hour = 0.4\nresources = {"worker:a40" = 1}\n')
    cfg = load_pool_config(toml, workers=3)
    assert cfg.backend == "ray" and cfg.workers == 3
    assert cfg.worker_types[0].resources == {"worker:a40": 1}
