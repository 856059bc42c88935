"""The prime-rl backend against tests/fixtures/fake_prime_rl, a stand-in for `rl` and for
`pip install -e` into its environment (prime-rl needs GPUs and is not installed here).

The fake reads rl.toml as prime-rl does, imports the taskset it names from what was installed,
logs step lines in prime-rl's format and writes HF safetensors weights with a STABLE marker.
"""

from __future__ import annotations

import shutil
import sys
import tomllib
from pathlib import Path

import pytest
import tomli_w

from nestor.inner.prime_rl import PrimeRLConfig, render_config, run_prime_rl
from nestor.inner.prime_rl_checkpoint import latest_weights, materialise_checkpoint
from nestor.inner.prime_rl_log import StepLog
from nestor.inner.types import JobRequest

ROOT = Path(__file__).resolve().parents[2]
FAKE = ROOT / "tests" / "fixtures" / "fake_prime_rl"
GOOD = ROOT / "examples" / "jobs" / "good-reverse"


@pytest.fixture
def job(tmp_path) -> Path:
    """good-reverse on the small bundled model, copied so the test may edit it."""
    dst = tmp_path / "job"
    shutil.copytree(GOOD, dst, ignore=shutil.ignore_patterns("__pycache__"))
    cfg = (dst / "config.toml").read_text()
    cfg = "\n".join(line for line in cfg.splitlines()
                    if not line.startswith(("base_model", "max_steps")))
    (dst / "config.toml").write_text(f'base_model = "tiny-s"\nmax_steps = 5\n{cfg}\n')
    return dst


def fake_config(tmp_path, mode: str = "ok", **kw) -> PrimeRLConfig:
    return PrimeRLConfig(
        command=[sys.executable, str(FAKE)],
        install_command=[sys.executable, str(FAKE), "pip", "install", "-e", "{env_dir}"],
        env={"FAKE_PRIME_RL_HOME": str(tmp_path / "prime-env"), "FAKE_PRIME_RL_MODE": mode},
        eval_n=20, **kw)


def request(job: Path, tmp_path, **kw) -> JobRequest:
    return JobRequest(job_dir=job, task_id="reverse", out_dir=tmp_path / "out", **kw)


def test_exported_config_round_trips_with_the_right_keys(job, tmp_path):
    rl = render_config(job, tmp_path / "outputs", model_path="/models/tiny-s")
    back = tomllib.loads(tomli_w.dumps(rl))
    assert back == rl
    assert back["max_steps"] == 5
    assert back["model"]["name"] == "/models/tiny-s"
    assert back["output_dir"] == str(tmp_path / "outputs") and back["run"]["name"] == "nestor"
    assert back["weight_broadcast"] == {"type": "filesystem"}  # weights land on disk
    orch = back["orchestrator"]
    assert orch["group_size"] == 8
    assert orch["train"]["sampling"]["temperature"] == 1.0
    assert orch["train"]["sampling"]["max_completion_tokens"] == 12
    source = orch["train"]["source"][0]
    assert source["env"]["taskset"]["id"].replace("-", "_") == "reverse_job"
    assert back["trainer"]["optim"]["lr"] == pytest.approx(3e-4)


def test_step_log_parses_prime_rl_lines():
    log = StepLog()
    assert not log.feed("\x1b[32m12:00:01    SUCCESS Starting RL run\x1b[0m")
    assert log.feed("12:00:02 SUCCESS Step 1 |   2.10s | Loss 0.0123 | Entropy 1.2000 | "
                    "Throughput 1234 tokens/s | MFU 1.0%")
    assert not log.feed("12:00:02 SUCCESS Step 1 |   2.00s | Reward 0.2500 | Trainable 64/64")
    assert log.feed("Step 2 | 1.9s | Reward 0.5000 | Error 0.0%")
    assert log.step == 2 and log.rewards() == [0.25, 0.5]
    assert log.metrics()[0] == {"step": 1, "loss": 0.0123, "entropy": 1.2, "throughput": 1234.0,
                                "reward": 0.25}


@pytest.mark.slow
def test_launch_follow_merge_and_score(job, tmp_path, monkeypatch):
    """One full run: install, launch, follow the steps, merge the LoRA adapter prime-rl wrote
    onto the base, and score the merged weights with the trusted scorer."""
    from safetensors.torch import load_file

    from nestor.inner.prime_rl import trusted_score
    from nestor.models.registry import resolve_model_dir

    monkeypatch.setenv("NESTOR_CACHE", str(tmp_path / "cache"))  # the pre-score cache
    with (job / "config.toml").open("a") as fh:
        fh.write("lora_rank = 4\nlora_alpha = 8\n")
    scored, steps = [], []

    def score(model, task_id, difficulty, n):
        scored.append(model)
        return trusted_score(model, task_id, difficulty, n)

    res = run_prime_rl(request(job, tmp_path), fake_config(tmp_path), score=score,
                       on_step=lambda s, row: steps.append(s))
    assert res.status == "ok", res.log_tail
    assert res.steps == 5 and steps == [1, 2, 3, 4, 5]
    assert res.reward_curve == pytest.approx([0.2, 0.3, 0.4, 0.5, 0.6])
    assert res.metrics[-1]["loss"] == pytest.approx(0.02)
    installed = (tmp_path / "prime-env" / "installed.txt").read_text().split()
    assert installed == [str(job / "env")]
    assert (tmp_path / "out" / "rl.log").read_text().count("SUCCESS Step") == 10

    # The adapter is merged exactly: W' = W + (alpha / r) * B @ A on the targeted projections.
    ckpt = Path(res.checkpoint)
    adapter_dir = latest_weights(tmp_path / "out" / "outputs")
    assert adapter_dir.name == "step_5" and (adapter_dir / "adapter_config.json").is_file()
    adapter = load_file(adapter_dir / "adapter_model.safetensors")
    merged = load_file(ckpt / "model.safetensors")
    base = load_file(resolve_model_dir("tiny-s") / "model.safetensors")
    assert set(merged) == set(base)  # a plain model again: no lora_A/lora_B keys
    q = "model.layers.0.self_attn.q_proj.weight"
    a = next(v for k, v in adapter.items() if "layers.0.self_attn.q_proj.lora_A" in k)
    b = next(v for k, v in adapter.items() if "layers.0.self_attn.q_proj.lora_B" in k)
    assert merged[q] == pytest.approx(base[q] + 2.0 * b @ a, abs=1e-5)
    up = "model.layers.0.mlp.up_proj.weight"
    assert merged[up].equal(base[up])

    # Scored in this process, on the merged checkpoint (with the base tokenizer added).
    assert scored == [str(ckpt)] and (ckpt / "tokenizer.json").is_file()
    assert 0.0 <= res.pre_score <= 1.0 and 0.0 <= res.post_score <= 1.0
    assert list((tmp_path / "cache").rglob("*.json"))  # the base model's score was cached
    assert res.improvement == pytest.approx(res.post_score - res.pre_score)
    # the change was measured on the merged weights against the base: it trained
    from nestor.agent.reward import trained

    assert res.weight_change > 1e-6 and trained(res)


@pytest.mark.slow
def test_ok_alone_is_not_training(job, tmp_path, monkeypatch):
    """prime-rl exits 0 and writes weights that are the base's own (the fake without LoRA):
    `ok`, but the measured change is 0 and the reward does not count it as trained."""
    from nestor.agent.reward import compute_reward, trained

    monkeypatch.setenv("NESTOR_CACHE", str(tmp_path / "cache"))
    res = run_prime_rl(request(job, tmp_path), fake_config(tmp_path),
                       score=lambda *a: 0.3, pre_score=lambda *a: 0.3)
    assert res.status == "ok", res.log_tail
    assert res.weight_change == 0.0 and not trained(res)
    _, c = compute_reward(res, passed_on=1, max_attempts=3, timeout_s=600.0)
    assert c["weighted_validation"] == 0.0 and c["weighted_speed"] == 0.0


def test_full_weights_become_a_self_contained_checkpoint(tmp_path):
    from nestor.models.registry import resolve_model_dir

    base = resolve_model_dir("tiny-s")
    step = tmp_path / "outputs" / "nestor" / "broadcasts" / "step_7"
    step.mkdir(parents=True)
    shutil.copy(base / "config.json", step)
    shutil.copy(base / "model.safetensors", step)
    (step / "STABLE").touch()
    older = tmp_path / "outputs" / "nestor" / "checkpoints" / "step_3" / "weight"
    older.mkdir(parents=True)
    shutil.copy(base / "model.safetensors", older)
    torn = tmp_path / "outputs" / "nestor" / "broadcasts" / "step_9"  # no STABLE: being written
    torn.mkdir()
    shutil.copy(base / "model.safetensors", torn)
    assert latest_weights(tmp_path / "outputs") == step
    ckpt = materialise_checkpoint(step, base, tmp_path / "ckpt")
    assert sorted(p.name for p in ckpt.iterdir()) == sorted(
        ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
         "chat_template.jinja"])
    assert (ckpt / "model.safetensors").read_bytes() == (base / "model.safetensors").read_bytes()
    assert latest_weights(tmp_path / "nothing") is None


def test_a_lora_adapter_on_a_bf16_base_stays_unmerged_and_loads_as_trained(tmp_path):
    # prime-rl trains Qwen3 (bf16) with LoRA: a bf16 merge would round part of the update away,
    # so the checkpoint keeps base + adapter and load_model applies it.
    import torch
    from peft import LoraConfig, get_peft_model

    from nestor.models.registry import UNMERGED, load_model

    model, tok = load_model("tiny-s", dtype=torch.bfloat16)
    base = tmp_path / "base"
    model.save_pretrained(base)
    tok.save_pretrained(base)
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    with torch.no_grad():  # a trained adapter: B no longer zero
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    step = tmp_path / "outputs" / "nestor" / "broadcasts" / "step_4"
    peft_model.save_pretrained(step)
    (step / "STABLE").touch()
    ids = torch.tensor([tok("reverse abc")["input_ids"]])
    with torch.no_grad():
        trained = peft_model(ids).logits
    ckpt = materialise_checkpoint(latest_weights(tmp_path / "outputs"), base, tmp_path / "ckpt")
    assert (ckpt / UNMERGED).is_file() and (ckpt / "adapter" / "adapter_config.json").is_file()
    loaded, _ = load_model(ckpt)
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, trained)


def test_no_progress_ends_with_timeout(job, tmp_path):
    res = run_prime_rl(request(job, tmp_path), fake_config(tmp_path, "stall",
                                                           stall_timeout_s=1.5))
    assert res.status == "timeout" and res.steps == 2  # ended by the stall rule: its message
    assert "no progress for 1.5s" in res.log_tail and "Step 2" in res.log_tail


def test_silent_start_ends_with_timeout(job, tmp_path):
    cfg = fake_config(tmp_path, startup_timeout_s=1.0)
    cfg.command = [sys.executable, "-c", "import time; print('loading', flush=True); "
                   "time.sleep(60)", "--"]
    res = run_prime_rl(request(job, tmp_path), cfg)
    assert res.status == "timeout" and res.steps == 0 and "loading" in res.log_tail


def test_overall_budget_ends_with_timeout(job, tmp_path):
    res = run_prime_rl(request(job, tmp_path, timeout_s=1.0),
                       fake_config(tmp_path, "stall", stall_timeout_s=60))
    assert res.status == "timeout" and "1s budget" in res.log_tail


def test_crash_is_failed_with_the_log_tail(job, tmp_path):
    res = run_prime_rl(request(job, tmp_path), fake_config(tmp_path, "crash"))
    assert res.status == "failed" and res.steps == 2
    assert "CUDA error" in res.log_tail and "exited with code 1" in res.log_tail


def test_exit_without_weights_is_failed(job, tmp_path):
    res = run_prime_rl(request(job, tmp_path), fake_config(tmp_path, "noweights"))
    assert res.status == "failed" and "wrote no safetensors" in res.log_tail


def test_installer_failure_and_missing_launcher(job, tmp_path):
    cfg = fake_config(tmp_path)
    cfg.install_command = [sys.executable, str(FAKE), "pip", "install", "-e", "{env_dir}/nope"]
    res = run_prime_rl(request(job, tmp_path), cfg)
    assert res.status == "failed" and "installing the taskset package failed" in res.log_tail
    assert "no pyproject.toml" in res.log_tail
    cfg = fake_config(tmp_path)
    cfg.command = ["/nonexistent/rl"]
    res = run_prime_rl(request(job, tmp_path), cfg)
    assert res.status == "failed" and "launcher not found" in res.log_tail


def test_bad_job_config_is_invalid(job, tmp_path):
    (job / "config.toml").write_text("learning_rate = 'fast'\n")
    res = run_prime_rl(request(job, tmp_path), fake_config(tmp_path))
    assert res.status == "invalid" and "learning_rate" in res.log_tail


def test_pool_entry_point_reads_nestor_toml(job, tmp_path, monkeypatch):
    """`job_fn = "nestor.inner.prime_rl:run_job"`: the worker's [prime_rl] table configures it."""
    from nestor.inner.prime_rl import run_job

    monkeypatch.chdir(tmp_path)
    cfg = fake_config(tmp_path, "crash")
    (tmp_path / "nestor.toml").write_text(tomli_w.dumps({"prime_rl": cfg.model_dump()}))
    res = run_job(request(job, tmp_path), warm=None)
    assert res.status == "failed" and "CUDA error" in res.log_tail
    (tmp_path / "elsewhere.toml").write_text("[prime_rl]\nstall_timeout_s = -1\n")
    monkeypatch.setenv("NESTOR_TOML", str(tmp_path / "elsewhere.toml"))  # as on a pod
    res = run_job(request(job, tmp_path))
    assert res.status == "failed" and "stall_timeout_s" in res.log_tail


def test_job_code_sees_no_api_keys(job, tmp_path, monkeypatch):
    monkeypatch.setenv("RUNPOD_API_KEY", "secret")
    monkeypatch.setenv("NESTOR_HIDDEN_SEED", "hidden-seed")  # nor the hidden eval's secret
    cfg = fake_config(tmp_path)
    cfg.command = [sys.executable, "-c", "import os, sys; print('key:', os.environ.get("
                   "'RUNPOD_API_KEY'), 'home:', os.environ.get('FAKE_PRIME_RL_HOME'), "
                   "'seed:', os.environ.get('NESTOR_HIDDEN_SEED'), "
                   "os.environ.get('NESTOR_HOME')); sys.exit(3)", "--"]
    res = run_prime_rl(request(job, tmp_path), cfg)
    assert res.status == "failed" and "exited with code 3" in res.log_tail
    assert f"key: None home: {tmp_path / 'prime-env'} seed: None None" in res.log_tail


@pytest.mark.parametrize("visible,gpus,launcher_sees,train_gpus,shared", [
    ("5", 0, "5,5", 1, True),        # a Ray actor's one GPU: trainer and vLLM share it
    ("2,3", 0, "2,3", 1, False),     # two: vLLM on the first, the trainer on the second
    ("4,6,7", 0, "4,6,7", 2, False),  # three: the trainer gets two
    ("2,3", 1, "2,2", 1, True),      # [prime_rl] gpus = 1 overrides what is visible
])
def test_the_launcher_gets_the_workers_gpus(job, tmp_path, monkeypatch, visible, gpus,
                                            launcher_sees, train_gpus, shared):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    cfg = fake_config(tmp_path, gpus=gpus)
    cfg.command = [sys.executable, "-c", "import os, sys; print('visible:', os.environ.get("
                   "'CUDA_VISIBLE_DEVICES')); sys.exit(3)", "--"]
    res = run_prime_rl(request(job, tmp_path), cfg)
    assert f"visible: {launcher_sees}" in res.log_tail
    rl = tomllib.loads((tmp_path / "out" / "rl.toml").read_text())
    assert rl["deployment"]["num_train_gpus"] == train_gpus
    assert ("gpu_memory_utilization" in rl["inference"]["vllm"]) == shared


# --- a hostile job: prime-rl runs the job's code unsandboxed, as the worker's user -----------

# What the job's code can do while prime-rl runs: log hostile step lines, rewrite every cached
# score it finds (poison.py of the red-team), and write weights with its own chat template,
# config and tokenizer beside them (and into the checkpoint folder nestor is about to fill).
HOSTILE_JOB = r"""
import json, os, shutil, sys
from pathlib import Path
base, out, work = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
for f in Path(os.environ["NESTOR_CACHE"]).rglob("*.json"):
    d = json.loads(f.read_text())
    poison = dict(accuracy=0.123, ci95=[0.0, 0.5])
    if "accuracy" in d:
        d.update(poison)
    elif isinstance(d.get("result"), str):  # an entry nested as text: rewritten the same way
        d["result"] = json.dumps({**json.loads(d["result"]), **poison})
    f.write_text(json.dumps(d))
for step in range(1, 6):
    print(f"Step {step} | 0.1s | Reward 0.5 | Error 0.0%", flush=True)
for step in (5, 999999):
    w = out / "nestor" / "broadcasts" / f"step_{step}"
    w.mkdir(parents=True)
    shutil.copy(base / "model.safetensors", w)
    (w / "STABLE").touch()
    (w / "chat_template.jinja").write_text("JOB TEMPLATE {{ messages }}")
    cfg = json.loads((base / "config.json").read_text())
    (w / "config.json").write_text(json.dumps({**cfg, "torch_dtype": "float16"}))
(work / "checkpoint").mkdir()
(work / "checkpoint" / "special_tokens_map.json").write_text("{}")
"""


@pytest.mark.slow
def test_a_hostile_job_neither_poisons_the_pre_score_nor_supplies_the_template(job, tmp_path,
                                                                              monkeypatch):
    """The pre-score is taken before any job code runs and held in memory; the scored
    checkpoint holds the base's own template/config/tokenizer and the weights of a step the
    job may have reached (step_999999 is planted)."""
    from nestor.inner import evaluate
    from nestor.inner.prime_rl import trusted_pre_score
    from nestor.models.registry import resolve_model_dir

    monkeypatch.setenv("NESTOR_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("NESTOR_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(evaluate, "_KEYED_MEMO", {}, raising=False)
    base = resolve_model_dir("tiny-s")
    honest = trusted_pre_score("tiny-s", "reverse", 0, 20)  # cached, as by an earlier job
    assert honest != 0.123
    work = tmp_path / "out"
    cfg = fake_config(tmp_path)
    cfg.command = [sys.executable, "-c", HOSTILE_JOB, str(base), str(work / "outputs"),
                   str(work), "--"]
    scored = []

    def score(model, task_id, difficulty, n):
        scored.append({p.name: p.read_bytes() for p in Path(model).iterdir()
                       if p.suffix != ".safetensors"})
        return 0.5

    res = run_prime_rl(request(job, tmp_path), cfg, score=score)
    assert res.status == "ok", res.log_tail
    assert any(p.read_text().count("0.123") for p in (tmp_path / "cache").rglob("*.json"))
    assert res.pre_score == honest and res.improvement == pytest.approx(0.5 - honest)
    [files] = scored
    assert set(files) == {"config.json", "tokenizer.json", "tokenizer_config.json",
                          "chat_template.jinja"}
    assert all(data == (base / name).read_bytes() for name, data in files.items())

    # A later job on this worker: the poisoned entry on disk is refused, not read.
    monkeypatch.setattr(evaluate, "_KEYED_MEMO", {}, raising=False)
    assert trusted_pre_score("tiny-s", "reverse", 0, 20) == honest


def test_a_planted_template_config_or_tokenizer_is_not_what_gets_scored(tmp_path):
    from nestor.inner.evaluate import score_dtype
    from nestor.models.registry import checkpoint_dtype, resolve_model_dir

    base = resolve_model_dir("tiny-s")
    step = tmp_path / "outputs" / "nestor" / "broadcasts" / "step_2"
    step.mkdir(parents=True)
    shutil.copy(base / "model.safetensors", step)
    (step / "STABLE").touch()
    planted = {"chat_template.jinja": "{{ 'few-shot answers' }}{{ messages }}",
               "config.json": '{"model_type": "llama", "torch_dtype": "float16"}',
               "tokenizer_config.json": '{"chat_template": "evil"}',
               "tokenizer.json": "{}", "special_tokens_map.json": "{}",
               "generation_config.json": '{"temperature": 0.0}',
               "modeling_evil.py": "import os", "pytorch_model.bin": "pickle"}
    for name, text in planted.items():
        (step / name).write_text(text)
    out = tmp_path / "ckpt"
    out.mkdir()
    (out / "added_tokens.json").write_text("{}")  # planted where the checkpoint goes
    ckpt = materialise_checkpoint(latest_weights(tmp_path / "outputs"), base, out)
    assert sorted(p.name for p in ckpt.iterdir()) == sorted(
        ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
         "chat_template.jinja"])
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert (ckpt / name).read_bytes() == (base / name).read_bytes(), name
    assert score_dtype(ckpt, "cuda") == checkpoint_dtype(base) == "float32"


def test_a_planted_step_beyond_max_steps_is_not_scored(tmp_path):
    from nestor.models.registry import resolve_model_dir

    base = resolve_model_dir("tiny-s")
    for step in (5, 999999):
        w = tmp_path / "outputs" / "nestor" / "broadcasts" / f"step_{step}"
        w.mkdir(parents=True)
        shutil.copy(base / "model.safetensors", w)
        (w / "STABLE").touch()
    assert latest_weights(tmp_path / "outputs", max_steps=5).name == "step_5"
    assert latest_weights(tmp_path / "outputs", max_steps=4) is None


def test_an_adapter_brings_only_its_weights_and_a_checked_config(tmp_path):
    import json

    import torch
    from peft import LoraConfig, get_peft_model

    from nestor.models.registry import load_model

    model, tok = load_model("tiny-s", dtype=torch.bfloat16)
    base = tmp_path / "base"
    model.save_pretrained(base)
    tok.save_pretrained(base)
    step = tmp_path / "outputs" / "nestor" / "broadcasts" / "step_3"
    get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear")
                   ).save_pretrained(step)
    (step / "chat_template.jinja").write_text("JOB TEMPLATE")
    (step / "adapter_model.bin").write_text("a pickle")
    ckpt = materialise_checkpoint(step, base, tmp_path / "ckpt")
    assert sorted(p.name for p in (ckpt / "adapter").iterdir()) == [
        "adapter_config.json", "adapter_model.safetensors"]
    assert (ckpt / "chat_template.jinja").read_bytes() == (base / "chat_template.jinja"
                                                           ).read_bytes()
    cfg = json.loads((step / "adapter_config.json").read_text())
    (step / "adapter_config.json").write_text(json.dumps({**cfg, "layer_replication": [[0, 2]]}))
    with pytest.raises(ValueError, match="layer_replication"):
        materialise_checkpoint(step, base, tmp_path / "ckpt")


def test_step_log_survives_hostile_lines():
    import json

    log = StepLog()
    assert not log.feed("Step " + "9" * 5000 + " | Reward 0.5")  # int() of it would raise
    assert log.feed("Step 1 | 0.1s | Reward 1e999 | Loss nan | Entropy 0.5000")
    assert log.feed("Step 2 | Reward -" + "9" * 400 + " | Loss 0.1")
    assert log.feed("Step 3 | Reward 0.25 | " + "x" * 2_000_000)
    assert log.rewards() == [0.25]
    assert log.metrics()[:2] == [{"step": 1, "entropy": 0.5}, {"step": 2, "loss": 0.1}]
    json.dumps(log.metrics(), allow_nan=False)  # --json stays standard JSON
    capped = StepLog(max_step=10)  # the job's max_steps: prime-rl runs no step past it
    assert not capped.feed("Step 11 | Reward 0.5") and capped.feed("Step 10 | Reward 0.5")


def test_huge_log_lines_and_a_huge_log_are_bounded(job, tmp_path):
    cfg = fake_config(tmp_path, max_log_bytes=200_000)
    cfg.command = [sys.executable, "-c", "import sys\n"
                   "for i in range(40000): print('noise line', i)\n"
                   "sys.stdout.write('Step 1 | Reward 0.5 ' + 'x' * 3_000_000 + '\\n')\n"
                   "print('Step 2 | Reward 0.75 |'); sys.stdout.flush(); sys.exit(3)", "--"]
    res = run_prime_rl(request(job, tmp_path), cfg)
    assert res.status == "failed" and "exited with code 3" in res.log_tail
    assert res.reward_curve == [0.5, 0.75]
    assert max(len(line) for line in res.log_tail.splitlines()) <= 5000
    logs = list((tmp_path / "out").glob("rl.log*"))
    assert sum(p.stat().st_size for p in logs) <= 2 * 200_000 + 10_000
    assert "Step 2" in (tmp_path / "out" / "rl.log").read_text()  # the newest part is kept
