"""Experiment tracking: metric names, TensorBoard events and W&B offline files from real rows."""

import time

import pytest

from nestor.outer.tracking import LoggingConfig, Tracker, TrackingError, flatten, flatten_heldout

ROW = {"step": 3, "policy_version": 3, "elapsed_s": 42.0, "episodes": 8, "reward_mean": 0.25,
       "reward_std": 0.1, "reward_components": {"improvement": 0.05, "weighted_validation": 0.1},
       "validation_pass_rate": 0.75, "job_failure_rate": None, "base_model_share": {"tiny-m": 1.0},
       "end_reasons": {"ok": 6, "invalid": 2}, "staleness_mean": 0.5, "cost_usd": 0.0,
       "train": {"loss": 0.3, "entropy": 1.2, "clip_frac": 0.1}, "group_ids": [4, 5],
       "task_ids": ["add"], "brand_new_metric": 7, "counters": {"episodes": 20}}
HELDOUT = [{"arm": "trained", "task": "dashes", "mean": 0.4, "n": 2, "ci95": [0.2, 0.6]},
           {"arm": "trained", "task": "snake", "mean": 0.2, "n": 2, "ci95": [0.1, 0.3]},
           {"arm": "untrained", "task": "dashes", "mean": 0.1, "n": 2, "ci95": [0.0, 0.2]},
           {"arm": "untrained", "task": "snake", "mean": 0.1, "n": 2, "ci95": [0.0, 0.2]}]


def test_names_a_prime_rl_or_tinker_user_knows():
    flat = flatten(ROW, steps=6)
    assert flat["reward/mean"] == 0.25 and flat["reward/std"] == 0.1
    assert flat["reward/improvement"] == 0.05 and flat["reward/weighted_validation"] == 0.1
    assert flat["env/validation_pass_rate"] == 0.75 and flat["env/end_reason/invalid"] == 2
    assert flat["env/base_model_share/tiny-m"] == 1.0
    assert flat["loss/mean"] == 0.3 and flat["entropy/mean"] == 1.2
    assert flat["optim/clip_frac"] == 0.1 and flat["async/staleness_mean"] == 0.5
    assert flat["time/total"] == 42.0 and flat["progress/done_frac"] == 0.5
    assert flat["misc/brand_new_metric"] == 7 and flat["counters/episodes"] == 20
    assert "env/job_failure_rate" not in flat  # None is not a number
    assert not any("group_ids" in k or "task_ids" in k for k in flat)
    held = flatten_heldout(HELDOUT)
    assert held["heldout/trained/mean"] == pytest.approx(0.3)
    assert held["heldout/transfer_gap"] == pytest.approx(0.2) and held["heldout/trained/n"] == 4


def test_no_backend_is_a_no_op(tmp_path):
    tracker = Tracker(LoggingConfig(), tmp_path, name="x", steps=3)
    assert not tracker.active
    tracker.log_step(ROW)
    tracker.close()
    assert list(tmp_path.iterdir()) == []


def test_tensorboard_events_hold_every_row(tmp_path):
    pytest.importorskip("tensorboard", reason="pip install 'nestor[tracking]'")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tracker = Tracker(LoggingConfig(tensorboard=True), tmp_path, name="x", steps=6)
    for step in (1, 2, 3):
        tracker.log_step({**ROW, "step": step, "reward_mean": 0.1 * step})
    tracker.log_heldout(HELDOUT, 3)
    tracker.close()
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    rewards = [(e.step, round(e.value, 3)) for e in acc.Scalars("reward/mean")]
    assert rewards == [(1, 0.1), (2, 0.2), (3, 0.3)]
    assert [e.step for e in acc.Scalars("heldout/trained/mean")] == [3]
    assert "env/validation_pass_rate" in acc.Tags()["scalars"]


def test_wandb_offline_without_network(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="pip install 'nestor[tracking]'")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DISABLE_GIT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    cfg = LoggingConfig(wandb=True, wandb_project="nestor-test", wandb_tags=["ci"])
    tracker = Tracker(cfg, tmp_path, name="fixture", steps=6, run_config={"seed": 1})
    tracker.log_step(ROW)
    tracker.log_heldout(HELDOUT, 3)
    summary = tracker._writers[0].run.summary
    assert summary["reward/mean"] == 0.25 and summary["heldout/transfer_gap"] == pytest.approx(0.2)
    tracker.close()
    run_id = (tmp_path / "wandb_id").read_text()
    (offline,) = (tmp_path / "wandb").glob(f"offline-run-*-{run_id}")
    (log,) = offline.glob("*.wandb")  # the run's records, ready for `wandb sync`
    deadline = time.monotonic() + 60  # wandb's service may still be writing after finish()
    while b"heldout/transfer_gap" not in log.read_bytes() and time.monotonic() < deadline:
        time.sleep(0.2)
    records = log.read_bytes()
    assert b"reward/mean" in records and b"heldout/transfer_gap" in records
    again = Tracker(cfg, tmp_path, name="fixture", steps=6)  # a resume keeps the W&B run id
    again.close()
    assert (tmp_path / "wandb_id").read_text() == run_id


def test_missing_backend_is_one_clear_error(tmp_path, monkeypatch):
    import builtins

    real = builtins.__import__

    def no_wandb(name, *args, **kwargs):
        if name == "wandb":
            raise ImportError(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_wandb)
    with pytest.raises(TrackingError, match=r"pip install 'nestor\[tracking\]'"):
        Tracker(LoggingConfig(wandb=True), tmp_path, name="x", steps=1)


def test_logging_table_in_the_run_config(tmp_path):
    from nestor.outer.config import RunConfigError, load_run_config

    path = tmp_path / "run.toml"
    path.write_text('tasks = ["add"]\n[logging]\ntensorboard = true\nwandb_mode = "offline"\n')
    cfg = load_run_config(path)
    assert cfg.logging.tensorboard and not cfg.logging.wandb
    path.write_text('tasks = ["add"]\n[logging]\ntensorbord = true\n')
    with pytest.raises(RunConfigError, match="tensorbord"):
        load_run_config(path)
