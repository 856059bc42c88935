"""run_job end to end on the bundled tiny-s: statuses for bad configs, timeouts and a reward
server that dies, and one small real training job whose checkpoint loads back."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import pytest

from nestor.inner.run import WarmState, run_job
from nestor.inner.types import JobRequest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "jobs" / "good-reverse"
SMALL = """base_model = "tiny-s"
learning_rate = 3e-4
max_steps = 3
prompts_per_step = 4
group_size = 4
max_new_tokens = 8
seed = 0
"""


@pytest.fixture(scope="module")
def warm() -> WarmState:
    return WarmState()


def make_job(tmp_path: Path, config: str = SMALL) -> Path:
    job = tmp_path / "job"
    shutil.copytree(EXAMPLE, job, ignore=shutil.ignore_patterns("__pycache__"))
    (job / "config.toml").write_text(config)
    return job


def request(job: Path, **kw) -> JobRequest:
    return JobRequest(job_dir=job, task_id="reverse", **kw)


def test_bad_config_is_invalid_with_the_reason(tmp_path):
    job = make_job(tmp_path, SMALL.replace("3e-4", '"fast"'))
    result = run_job(request(job))
    assert result.status == "invalid"
    assert "learning_rate" in result.log_tail and result.post_score is None


def test_over_budget_and_unknown_model_are_invalid(tmp_path):
    job = make_job(tmp_path, SMALL + "\n")
    result = run_job(request(job, token_budget=10))
    assert result.status == "invalid" and "budget" in result.log_tail
    (job / "config.toml").write_text(SMALL.replace("tiny-s", "gpt-9"))
    result = run_job(request(job))
    assert result.status == "invalid" and "gpt-9" in result.log_tail


def test_warm_up_loads_present_models_and_skips_absent_ones(monkeypatch, tmp_path):
    from nestor.job import tasksource

    monkeypatch.setenv("NESTOR_MODEL_QWEN3_0_6B", str(tmp_path / "nowhere"))
    state = WarmState()
    assert state.warm_up(["tiny-s", "qwen3-0.6b"]) == ["tiny-s"]
    model, _ = state.base("tiny-s")
    assert not model.training and not any(p.requires_grad for p in model.parameters())
    assert any(z.alive and z.hello for z in tasksource._idle)  # the reward host is up, warm


def test_timeout_is_reported_not_hung(tmp_path, warm):
    job = make_job(tmp_path, SMALL.replace("max_steps = 3", "max_steps = 500"))
    result = run_job(request(job, timeout_s=0.05), warm=warm)
    assert result.status == "timeout"
    assert result.steps < 500 and "timeout" in result.log_tail
    assert result.pre_score is not None and result.checkpoint is None
    assert (result.post_score is not None) == (result.steps > 0)


def test_timeout_after_training_post_scores_the_weights_it_has(tmp_path, warm, monkeypatch):
    import types

    import nestor.inner.run as run_mod

    real = run_mod.time.monotonic

    def past_deadline(_metrics):  # after the first step, the clock jumps past the timeout
        monkeypatch.setattr(run_mod, "time", types.SimpleNamespace(monotonic=lambda: real() + 1e6))

    job = make_job(tmp_path, SMALL.replace("max_steps = 3", "max_steps = 50"))
    result = run_job(request(job, timeout_s=600), warm=warm, on_step=past_deadline)
    assert result.status == "timeout" and result.steps == 1, result.log_tail
    assert result.post_score is not None and 0.0 <= result.post_score <= 1.0
    assert result.improvement == pytest.approx(result.post_score - result.pre_score)
    assert result.checkpoint is None and "post-score" in result.log_tail


def test_reward_server_crash_is_failed(tmp_path, warm):
    job = make_job(tmp_path)
    env = job / "env" / "reverse_job" / "__init__.py"
    env.write_text(env.read_text().replace(
        "        return float(normalise(trace.last_reply) == self.data.answer)",
        "        import os\n        os._exit(3)"))
    result = run_job(request(job), warm=warm)
    assert result.status == "failed"
    assert result.steps == 0 and "scor" in result.log_tail


def test_warm_state_loads_in_its_device_and_dtype():
    import torch

    model, _ = WarmState(dtype="bfloat16").base("tiny-s")
    assert next(model.parameters()).dtype == torch.bfloat16
    model, _ = WarmState().base("tiny-s")  # CPU default: float32
    assert next(model.parameters()).dtype == torch.float32


@pytest.mark.slow
def test_a_job_that_changes_nothing_improves_by_exactly_zero(tmp_path, monkeypatch):
    # Every reward equal: every group has zero variance, no update is made. Pre and post must
    # then be the same function of the same weights, in the worker's dtype (bf16 here, as on a
    # GPU), so the improvement is exactly 0 - not the gap between a fresh float32 copy and a
    # bf16 one.
    from nestor.inner import evaluate as ev
    from nestor.models.registry import resolve_model_dir

    monkeypatch.setenv("NESTOR_CACHE", str(tmp_path / "cache"))
    job = make_job(tmp_path, SMALL.replace("max_steps = 3", "max_steps = 1"))
    env = job / "env" / "reverse_job" / "__init__.py"
    text = env.read_text()
    for line in ("        return float(normalise(trace.last_reply) == self.data.answer)",
                 "        return same / max(len(reply), len(answer))"):
        assert line in text
        text = text.replace(line, "        return 0.5")
    env.write_text(text)
    # A constant rubric cannot pass the canaries' re-probe (tests/inner/test_canary.py covers
    # that); they are off here so the job trains and only the scorer is under test.
    from nestor.inner.canary import CanaryConfig

    result = run_job(request(job, canary=CanaryConfig(rate=0.0)), warm=WarmState(dtype="bfloat16"))
    assert result.status == "ok", result.log_tail
    assert result.metrics[0]["groups_trained"] == 0
    assert result.improvement == 0.0 and result.post_score == result.pre_score
    assert "(cpu, bfloat16)" in result.log_tail
    # the pre-score cache is keyed by device and dtype: bf16 and float32 never share an entry
    d = resolve_model_dir("tiny-s")
    bf16 = ev.cache_path("tiny-s", d, "reverse", 0, ev.DEFAULT_N, "cpu", "bfloat16")
    assert bf16.is_file()
    assert bf16 != ev.cache_path("tiny-s", d, "reverse", 0, ev.DEFAULT_N, "cpu", "float32")
    assert bf16 != ev.cache_path("tiny-s", d, "reverse", 0, ev.DEFAULT_N, "cuda:0", "bfloat16")


@pytest.mark.slow
def test_small_job_trains_and_checkpoint_loads(tmp_path, warm):
    from nestor.models.registry import load_model

    job = make_job(tmp_path)
    steps = []
    result = run_job(request(job, out_dir=tmp_path / "out"), warm=warm, on_step=steps.append)
    assert result.status == "ok", result.log_tail
    assert result.steps == 3 and len(result.reward_curve) == 3 and len(steps) == 3
    assert all(0.0 <= r <= 1.0 for r in result.reward_curve)
    assert {"reward_mean", "reward_std", "zero_var_frac", "entropy", "tokens_per_s"} <= set(
        result.metrics[0])
    assert result.improvement == pytest.approx(result.post_score - result.pre_score)
    model, tokenizer = load_model(result.checkpoint)
    assert tokenizer.eos_token == "<|im_end|>"
    assert (Path(result.checkpoint) / "model.safetensors").is_file()
    assert (tmp_path / "out" / "metrics.jsonl").read_text().count("\n") == 3


def trained_lora(dtype):
    """tiny-s with a LoRA trained two steps in `dtype`: (trainer, tokenizer, ids, its logits)."""
    import torch

    from nestor.inner.grpo import GRPOTrainer
    from nestor.job.config import JobConfig
    from nestor.models.registry import load_model

    model, tokenizer = load_model("tiny-s", dtype=dtype)
    trainer = GRPOTrainer(model, tokenizer, ["reverse abc", "reverse dog"],
                          lambda t, c: [float(sum(map(ord, x)) % 2) for x in c],
                          JobConfig(base_model="tiny-s", lora_rank=4, learning_rate=1e-2,
                                    max_steps=2, skip_zero_variance=False,
                                    prompts_per_step=2, group_size=4, max_new_tokens=4))
    trainer.train()
    ids = torch.tensor([tokenizer("reverse abc")["input_ids"]])
    with torch.no_grad():
        return trainer, tokenizer, ids, trainer.model(ids).logits


def test_lora_checkpoint_saves_adapter_and_merged_weights(tmp_path):
    import torch

    from nestor.inner.checkpoint import ADAPTER_DIR, save_checkpoint
    from nestor.models.registry import UNMERGED, load_model

    trainer, tokenizer, ids, expected = trained_lora(torch.float32)
    path = save_checkpoint(trainer.model, tokenizer, tmp_path / "ckpt")
    assert (path / ADAPTER_DIR / "adapter_model.safetensors").is_file()
    assert not (path / UNMERGED).exists()  # float32: merged exactly, loads as a plain model
    merged, _ = load_model(path)
    with torch.no_grad():
        assert torch.allclose(merged.float()(ids).logits, expected, atol=1e-4)
    base, _ = load_model("tiny-s")
    with torch.no_grad():
        assert not torch.allclose(base(ids).logits, expected, atol=1e-4)


def test_bf16_lora_checkpoint_loads_as_exactly_the_model_that_was_scored(tmp_path):
    # Merged into bf16, part of a LoRA update rounds away (the issue: 0.665 scored, 0.660
    # reloaded); unmerged, the reloaded model computes what the trained one did, bit for bit.
    import torch

    from nestor.inner.checkpoint import save_checkpoint
    from nestor.models.registry import UNMERGED, load_model

    trainer, tokenizer, ids, expected = trained_lora(torch.bfloat16)
    with torch.no_grad():
        merged_bf16 = copy.deepcopy(trainer.model).merge_and_unload()(ids).logits
    assert not torch.equal(merged_bf16, expected)  # what the old checkpoint would have held
    path = save_checkpoint(trainer.model, tokenizer, tmp_path / "ckpt")
    assert (path / UNMERGED).is_file()
    loaded, _ = load_model(path)
    assert next(loaded.parameters()).dtype == torch.bfloat16
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, expected)


def test_cli_job_train_refuses_a_bad_device_or_dtype_in_one_line(tmp_path):
    from typer.testing import CliRunner

    from nestor.cli import app

    job = make_job(tmp_path)
    for args in (["--device", "gpu0"], ["--dtype", "int8"]):
        res = CliRunner().invoke(app, ["job", "train", str(job), "--task", "reverse", *args])
        assert res.exit_code == 2 and "--device" in res.output and "cuda:N" in res.output
        assert "Traceback" not in res.output


def test_a_job_whose_data_is_the_hidden_eval_is_refused_before_training(tmp_path, warm):
    import json

    from nestor.tasks import TaskRegistry
    from nestor.tasks.hidden import hidden_eval

    job = make_job(tmp_path)
    items = hidden_eval(TaskRegistry().get("reverse")).items
    (job / "data" / "train.jsonl").write_text("".join(
        json.dumps({"prompt": it.prompt, "answer": it.answer}) + "\n" for it in items))
    result = run_job(request(job), warm=warm)
    assert result.status == "invalid" and "hidden eval" in result.log_tail, result.log_tail
    assert result.steps == 0 and result.post_score is None and result.checkpoint is None
    assert not any(it.prompt in result.log_tail for it in items)


def test_rows_the_probe_would_refuse_are_refused_in_training(tmp_path, warm):
    """load() runs again in training and may yield other rows than the probe saw: the probe's
    row checks run on them too."""
    job = make_job(tmp_path)
    data = job / "data" / "train.jsonl"
    data.write_text("".join(data.read_text().splitlines(keepends=True)[:10]))
    result = run_job(request(job), warm=warm)
    assert result.status == "invalid" and "yielded 10 tasks" in result.log_tail, result.log_tail
    assert result.steps == 0 and result.post_score is None
