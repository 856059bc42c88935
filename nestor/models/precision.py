"""Precision: the dtype a model's weights load in, and the forward pass's bfloat16 autocast
where the device computes it natively.

Both trainers of the LM policy use it — `nestor sft` (`precision`) and the RL learner
(`[policy] train_precision`). Under autocast the matmuls run in bf16 while the weights that
train (the LoRA) and Adam's state stay float32; measured on this laptop's AVX512-BF16 CPU, a
SmolLM2 forward + backward over a 3,000-token episode takes ~0.5× the float32 time.
"""

from __future__ import annotations

from typing import Literal, get_args

import torch

Precision = Literal["auto", "float32", "bfloat16"]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def model_dtype(dtype: str, device: str) -> torch.dtype | None:
    """The weights' dtype (None: the checkpoint's own). "auto": float32 on the CPU (bf16
    matmuls are emulated, and slow, on an AVX2 CPU; on a bf16-native one a decode step is
    memory-bound and gains ~12%), else the checkpoint's own."""
    if dtype == "auto":
        return torch.float32 if torch.device(device).type == "cpu" else None
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r}: choose auto, {', '.join(DTYPES)}")
    return DTYPES[dtype]


def autocast_dtype(precision: str, device: str) -> torch.dtype | None:
    """The forward pass's autocast dtype (None: float32, no autocast). "auto": bfloat16 on
    CUDA with bf16, or a CPU with AVX512-BF16 or AMX; float32 elsewhere (bf16 emulated on an
    AVX2 CPU is slower than float32)."""
    if precision not in get_args(Precision):
        raise ValueError(f"precision {precision!r}: choose auto, float32 or bfloat16")
    if precision == "auto":
        kind = torch.device(device).type
        native = (torch.cuda.is_available() and torch.cuda.is_bf16_supported() if kind == "cuda"
                  else kind == "cpu" and torch.ops.mkldnn._is_mkldnn_bf16_supported())
        precision = "bfloat16" if native else "float32"
    return torch.bfloat16 if precision == "bfloat16" else None


def autocast(dtype: torch.dtype | None, device: str | torch.device):
    """The forward's context: autocast to `dtype`, or nothing for None (float32)."""
    return torch.autocast(torch.device(device).type, dtype=dtype or torch.float32,
                          enabled=dtype is not None)
