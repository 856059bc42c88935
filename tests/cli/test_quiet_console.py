"""The console a person sees during a run: no third-party deprecation noise (in workers too),
each warning once, and a live view that still reports in a CI log."""

import logging
import os
import subprocess
import sys

from nestor.cli.quiet import quiet_console
from nestor.cli.train import LiveView


def test_spawned_workers_inherit_the_silence(monkeypatch):
    monkeypatch.delenv("PYTHONWARNINGS", raising=False)
    quiet_console()
    quiet_console()  # idempotent: no duplicate entries
    assert os.environ["PYTHONWARNINGS"].count("ignore::FutureWarning") == 1
    code = ("import warnings; warnings.warn('old api', FutureWarning); "
            "warnings.warn('older api', DeprecationWarning); print('ran')")
    out = subprocess.run([sys.executable, "-W", "default", "-c", code], capture_output=True,
                         text=True, env={**os.environ, "PYTHONWARNINGS": ""}, timeout=60)
    assert "old api" in out.stderr  # the check below is not vacuous: unfiltered, it shows
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ), timeout=60)
    assert out.stdout.strip() == "ran" and out.stderr == ""


def test_each_warning_once_in_one_line(capsys):
    quiet_console()
    log = logging.getLogger("nestor.test.quiet")
    for _ in range(3):
        log.warning("sandbox falls back to %r:\n  weaker isolation", "unshare")
    log.warning("another one")
    err = capsys.readouterr().err.splitlines()
    assert err.count("warning: sandbox falls back to 'unshare': weaker isolation") == 1
    assert "warning: another one" in err


def test_live_view_prints_lines_when_not_a_terminal(tmp_path, capsys):
    now = [0.0]
    view = LiveView(tmp_path, terminal=False, every_s=30, clock=lambda: now[0])
    with view:
        view({"phase": "pre-scores 1/4: tiny-s on length (cached after the first run)"})
        view({"phase": None, "step": 0, "steps": 8, "episodes": 0})
        view({"step": 0, "episodes": 2})  # nothing new, within the heartbeat: quiet
        now[0] = 31.0
        view({"step": 0, "episodes": 3})  # heartbeat
        view({"step": 1, "reward": 0.25, "validation_pass_rate": 0.5, "cost_usd": 0.01})
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 4, lines
    assert lines[0].startswith("step 0/? · pre-scores 1/4: tiny-s on length")
    assert "episodes 3" in lines[2]
    assert lines[3].startswith("step 1/8 · reward 0.250 · valid 50%") and "$0.0100" in lines[3]
    assert view.history == [0.25]


def test_pre_scores_before_the_run_with_progress(tmp_path, monkeypatch):
    """The real pre-scorer, watched, on 20 hidden items instead of 200 (each test session has a
    cold cache; 200 cost a minute): each (model, task) of the run is scored and left in the
    cache the workers read."""
    from pathlib import Path

    import nestor.inner.evaluate as evaluate
    from nestor.cli.train import _prescore
    from nestor.models.registry import resolve_model_dir
    from nestor.outer.config import load_run_config
    from nestor.tasks import TaskRegistry

    real, calls, N = evaluate.pre_score, [], 20

    def watched(model, task, difficulty=0, registry=None):
        calls.append((model, task))
        result = real(model, task, difficulty, N, registry=registry)
        assert result.task == task and result.n == N
        return result

    def cached(model, task) -> bool:
        return evaluate.cache_path(model, resolve_model_dir(model), task, 0, N).is_file()

    monkeypatch.setattr(evaluate, "pre_score", watched)
    quick = load_run_config(Path("configs/quickstart.toml"))
    assert quick.heldout_episodes == 0  # the quickstart skips the held-out eval...
    _prescore(quick, TaskRegistry(), lambda s: None)
    assert calls == [("tiny-s", "length"), ("tiny-s", "vowels"), ("tiny-m", "length"),
                     ("tiny-m", "vowels")]  # configs/quickstart.toml: models x tasks
    assert all(cached(m, t) for m, t in calls)
    calls.clear()
    # ...a run with one pre-scores the held-out tasks too (one model here: cheap)
    cfg = quick.model_copy(update={"heldout_episodes": 1, "tasks": ["length"],
                                   "episode": {**quick.episode, "models": ["tiny-m"]}})
    phases = []
    _prescore(cfg, TaskRegistry(), lambda s: phases.append(s["phase"]))
    heldout = [r.id for r in TaskRegistry().heldout_tasks()]
    assert calls == [("tiny-m", t) for t in ["length", *heldout]] and len(heldout) >= 1
    assert all(cached(m, t) for m, t in calls)
    assert phases[0].startswith(f"pre-scores 1/{len(calls)}: tiny-m on length")
    assert phases[-1] is None and len(phases) == len(calls) + 1
    ray = cfg.model_copy(update={"pool": {"backend": "ray"}})
    calls.clear()
    _prescore(ray, TaskRegistry(), phases.append)
    assert calls == []  # remote workers keep their own cache


def test_pre_scores_in_each_local_worker_types_device_and_dtype(monkeypatch):
    from pathlib import Path

    import torch

    import nestor.inner.evaluate as evaluate
    from nestor.cli.train import _prescore
    from nestor.outer.config import load_run_config
    from nestor.tasks import TaskRegistry

    calls = []
    monkeypatch.setattr(evaluate, "pre_score", lambda m, t, d, registry=None, **kw:
                        calls.append((m, t, kw)))
    quick = load_run_config(Path("configs/quickstart.toml"))
    types = [{"name": "cpu16", "dtype": "bfloat16"},
             {"name": "gpu", "num_gpus": 1, "dtype": "bfloat16"}]
    cfg = quick.model_copy(update={"pool": {"backend": "local", "worker_types": types}})
    _prescore(cfg, TaskRegistry(), lambda s: None)
    kws = [kw for _, _, kw in calls]
    assert {"dtype": "bfloat16"} in kws  # the CPU bf16 type's own key, not float32's
    assert {} not in kws  # no float32 CPU worker here: nothing scored that none would read
    cuda = {"device": "cuda", "dtype": "bfloat16"}
    assert (cuda in kws) == torch.cuda.is_available()  # a GPU type only where there is one
