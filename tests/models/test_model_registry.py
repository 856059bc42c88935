import shutil
import time

import pytest

from nestor.models.registry import (
    BUNDLED_DIR,
    MODEL_NAMES,
    ModelNotFoundError,
    context_length,
    env_var,
    load_model,
    resolve_model_dir,
)


def test_names_and_bundled_sizes():
    assert {"tiny-s", "tiny-m", "qwen3-0.6b", "qwen3-1.7b"} <= set(MODEL_NAMES)
    total = sum(p.stat().st_size for p in BUNDLED_DIR.glob("*/model.safetensors"))
    assert total <= 40 * 2**20


def test_load_tiny_models_offline():
    small, tok = load_model("tiny-s")
    medium, _ = load_model("tiny-m")
    n_small = sum(p.numel() for p in small.parameters())
    n_medium = sum(p.numel() for p in medium.parameters())
    assert 0.7e6 < n_small < 1.5e6 and 4e6 < n_medium < 6e6
    assert type(small).__name__ == "Qwen3ForCausalLM" and not small.training
    assert small.config.vocab_size == len(tok)
    assert context_length("tiny-m") >= 2048


def test_unknown_model_names_the_choices():
    with pytest.raises(ModelNotFoundError, match="unknown model 'tiny-xl'.*tiny-m"):
        resolve_model_dir("tiny-xl")


def test_absent_qwen_fails_fast_without_download(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.delenv(env_var("qwen3-0.6b"), raising=False)
    monkeypatch.chdir(tmp_path)  # no nestor.toml here
    start = time.perf_counter()
    with pytest.raises(ModelNotFoundError, match="NESTOR_MODEL_QWEN3_0_6B") as info:
        resolve_model_dir("qwen3-0.6b")
    assert time.perf_counter() - start < 10
    assert "Qwen/Qwen3-0.6B" in str(info.value)
    assert not (tmp_path / "hf").exists() or not any((tmp_path / "hf").rglob("*.safetensors"))


def test_env_var_and_settings_paths(tmp_path, monkeypatch):
    copy = tmp_path / "weights"
    shutil.copytree(BUNDLED_DIR / "tiny-s", copy)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(env_var("qwen3-1.7b"), str(copy))
    assert resolve_model_dir("qwen3-1.7b") == copy
    monkeypatch.delenv(env_var("qwen3-1.7b"))
    (tmp_path / "nestor.toml").write_text(f'[nestor.model_paths]\n"qwen3-1.7b" = "{copy}"\n')
    assert resolve_model_dir("qwen3-1.7b") == copy


def test_missing_and_corrupt_weights_name_the_file(tmp_path):
    copy = tmp_path / "m"
    shutil.copytree(BUNDLED_DIR / "tiny-s", copy)
    weights = copy / "model.safetensors"
    weights.write_bytes(b"\x00garbage" * 10)
    with pytest.raises(ModelNotFoundError, match="model.safetensors"):
        load_model(copy)
    weights.unlink()
    with pytest.raises(ModelNotFoundError, match="no weights file"):
        load_model(copy)
    with pytest.raises(ModelNotFoundError, match="no config.json"):
        resolve_model_dir(tmp_path)


def test_a_model_loaded_for_cuda_turns_cudnn_attention_off(monkeypatch):
    """cuDNN's SDPA rebuilds a graph for each new key length, i.e. every decode step
    (measured 54 → 14 ms a step on an H200): a CUDA load switches it off, a CPU load does not.
    No GPU here: `Module.to` is made a no-op, the backend flag is what is checked."""
    import torch

    from nestor.models.registry import load_model

    torch.backends.cuda.enable_cudnn_sdp(True)
    try:
        load_model("tiny-s", device="cpu")
        assert torch.backends.cuda.cudnn_sdp_enabled()
        monkeypatch.setattr(torch.nn.Module, "to", lambda self, *a, **k: self)
        load_model("tiny-s", device="cuda:0")
        assert not torch.backends.cuda.cudnn_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(True)
