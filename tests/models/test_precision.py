import pytest
import torch

from nestor.models.precision import autocast, autocast_dtype, model_dtype


def test_auto_is_bf16_only_where_the_cpu_computes_it_natively():
    assert autocast_dtype("float32", "cpu") is None
    assert autocast_dtype("bfloat16", "cpu") is torch.bfloat16
    native = torch.ops.mkldnn._is_mkldnn_bf16_supported()
    assert autocast_dtype("auto", "cpu") is (torch.bfloat16 if native else None)
    with pytest.raises(ValueError, match="choose auto, float32 or bfloat16"):
        autocast_dtype("half", "cpu")


def test_the_context_casts_matmuls_only_for_a_dtype():
    a = torch.randn(4, 4)
    with autocast(None, "cpu"):
        assert (a @ a).dtype == torch.float32
    with autocast(torch.bfloat16, "cpu"):
        assert (a @ a).dtype == torch.bfloat16


def test_weights_load_in_float32_on_a_cpu_and_their_own_dtype_elsewhere():
    assert model_dtype("auto", "cpu") == torch.float32
    assert model_dtype("auto", "cuda") is None  # the checkpoint's own (bf16 for Qwen3)
    assert model_dtype("bfloat16", "cpu") == torch.bfloat16
    with pytest.raises(ValueError, match="choose auto"):
        model_dtype("fp8", "cpu")
