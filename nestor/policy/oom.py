"""Out-of-memory errors of a token policy: recognised, memory given back, retried smaller.

A long context on a GPU (or a big batch on a small machine) can run out of memory in the middle
of a run. That must cost the batch that did not fit, not the run: the caller splits the work
and retries, and drops what does not fit even alone, counted, so the step still completes (no
crash, and no replay of the same batch into the same crash on resume).
"""

from __future__ import annotations

import gc

import torch

OOM_MARKERS = ("out of memory", "can't allocate memory", "cannot allocate memory")


class PolicyOutOfMemory(RuntimeError):
    """A single turn did not fit in memory even alone: its episode ends (`policy_error`) with
    this message; the run goes on."""


def is_oom(exc: BaseException) -> bool:
    """torch.OutOfMemoryError, or the RuntimeError some allocators raise instead."""
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc).lower() for m in OOM_MARKERS)


def free_memory(device: torch.device) -> None:
    """Give cached blocks back after an OOM, so the smaller retry can use them."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
