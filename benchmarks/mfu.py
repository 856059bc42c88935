"""Model FLOPs utilisation of a trainer step against a matmul peak measured in the same run.

FLOPs counted the usual way (PaLM appendix B style, attention scores left out: under 2% at the
sequence lengths here): a forward costs 2 FLOPs per matmul parameter per token; a backward
costs 2 more for activation gradients and, for trained matrices, 2 more for weight gradients
(full fine-tune 6 per token; LoRA ~4, the adapters' own FLOPs being negligible). Prompt tokens
skip the output projection (the sampler keeps only the last position's logits, the trainer
only the completion's).
"""

from __future__ import annotations

import time

import torch


def matmul_peak(threads: int, n: int = 1024, repeats: int = 8) -> dict:
    """Best float32 GEMM throughput of this process on `threads` torch threads, in GFLOP/s of
    wall time and per CPU-second (steadier on a shared machine)."""
    torch.set_num_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b  # warm-up (allocations, thread pool)
    best_wall = best_cpu = 0.0
    for _ in range(repeats):
        t, c = time.perf_counter(), time.process_time()
        a @ b
        wall, cpu = time.perf_counter() - t, time.process_time() - c
        flops = 2 * n**3
        best_wall = max(best_wall, flops / wall / 1e9)
        best_cpu = max(best_cpu, flops / max(cpu, 1e-9) / 1e9)
    return {"gflops_wall": round(best_wall, 2), "gflops_per_cpu_s": round(best_cpu, 2),
            "threads": threads, "n": n}


def matmul_params(model) -> tuple[int, int]:
    """(parameters in matmuls of every token, parameters of the output projection)."""
    base = getattr(model, "get_base_model", lambda: model)()
    head = base.get_output_embeddings().weight.numel()
    embed = base.get_input_embeddings().weight.numel()
    total = sum(p.numel() for n, p in base.named_parameters() if "lora_" not in n)
    tied = base.get_output_embeddings().weight is base.get_input_embeddings().weight
    body = total - embed - (0 if tied else head)  # the embedding lookup is no matmul
    return body, head


def step_flops(body: int, head: int, prompt_tokens: int, completion_tokens: int,
               trained_prompt_tokens: int, trained_completion_tokens: int, lora: bool) -> dict:
    """FLOPs of one GRPO step: sampling (forward) + one update pass (forward + backward)."""
    per_token_train = 4 if lora else 6
    sample = 2 * body * prompt_tokens + 2 * (body + head) * completion_tokens
    train = per_token_train * (body * trained_prompt_tokens
                               + (body + head) * trained_completion_tokens)
    return {"sample_flops": sample, "train_flops": train, "flops": sample + train}
