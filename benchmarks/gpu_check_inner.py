"""The inner trainer's GPU items, for benchmarks/gpu_check.py: each runs on the device asked for
(the CPU half in CI) and returns figures plus the problems found (empty = it holds).

- memory: the worker sizes a job by its own device and dtype (job/memory.worker_target: on a GPU
  the cap is the GPU's memory, bf16 weights count 2 bytes); on a GPU the estimate of a bf16 GRPO
  step bounds the measured peak from above (torch.cuda.max_memory_allocated).
- accumulate: a bf16 full fine-tune's micro-batched gradients (micro_batch_prompts = 1) match one
  whole batch's in the float32 masters (inner/grpo.accumulate_grads).
- lora_checkpoint: a bf16 LoRA job's checkpoint loads as the model that was scored
  (inner/checkpoint: unmerged adapter); a bf16 merge would not.
- prescore_key: the pre-score cache key names the GPU model (inner/evaluate.score_key).
"""

from __future__ import annotations

import copy
import random
import time

import torch

from nestor.inner.checkpoint import save_checkpoint
from nestor.inner.evaluate import score_key
from nestor.inner.grpo import GRPOTrainer
from nestor.job.config import JobConfig
from nestor.job.memory import RUNTIME_BYTES, estimate, longest_prompt, model_shape, worker_target
from nestor.models.registry import load_model
from nestor.tasks.base import normalise

MIB = 1 << 20


def exact_match(task, n: int):
    """(prompts, reward) for `n` of the task's public inputs, rewarded by exact match with
    the reference solution."""
    rng = random.Random(0)
    inputs = [task.sample(rng, 0) for _ in range(n)]
    prompts = [task.prompt(x) for x in inputs]
    answers = [task.solve(x) for x in inputs]

    def reward(indices: list[int], texts: list[str]) -> list[float]:
        return [float(normalise(t) == answers[i]) for i, t in zip(indices, texts, strict=True)]

    return prompts, reward


def _job(task, model: str, steps: int, **kw):
    prompts, reward = exact_match(task, 64)
    cfg = JobConfig(base_model=model, max_steps=steps, prompts_per_step=8, group_size=8,
                    max_new_tokens=task.new_tokens(0), learning_rate=1e-4, seed=0,
                    skip_zero_variance=False, **kw)
    return prompts, reward, cfg


def memory_part(device: str, task, model: str) -> tuple[dict, list[str]]:
    base, tok = load_model(model, device=device, dtype=torch.bfloat16)
    target = worker_target(device, torch.bfloat16, 2048)
    out = {"cap_mb": target.cap_mb, "dtype_bytes": target.dtype_bytes}
    problems = []
    if target.dtype_bytes != 2:
        problems.append(f"memory: bf16 counted as {target.dtype_bytes} bytes")
    if not device.startswith("cuda"):
        return out, problems
    total_mb = torch.cuda.mem_get_info(torch.device(device))[1] // MIB
    if abs(target.cap_mb - total_mb) > 1:
        problems.append(f"memory: worker cap {target.cap_mb} MiB, the GPU has {total_mb} MiB")
    prompts, reward, cfg = _job(task, model, 2)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    trainer = GRPOTrainer(copy.deepcopy(base), tok, prompts, reward, cfg, ref_model=base)
    trainer.train()
    torch.cuda.synchronize()
    measured = torch.cuda.max_memory_allocated() - before + base_bytes(base)
    est = estimate(cfg, model_shape(model), longest_prompt(prompts, tok)[0], 2)
    predicted = est.peak - RUNTIME_BYTES  # the CUDA allocator holds tensors only
    out.update(measured_mb=measured // MIB, estimated_mb=predicted // MIB)
    if predicted < measured:
        problems.append(f"memory: estimate {predicted // MIB} MiB below the measured peak "
                        f"{measured // MIB} MiB of a bf16 GRPO step")
    return out, problems


def base_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def accumulate_part(device: str, task, model: str) -> tuple[dict, list[str]]:
    def master_grads(micro: int) -> list[torch.Tensor]:
        m, tok = load_model(model, device=device, dtype=torch.bfloat16)
        prompts, reward, cfg = _job(task, model, 1, micro_batch_prompts=micro)
        trainer = GRPOTrainer(m, tok, prompts, reward, cfg)
        got: list[torch.Tensor] = []
        step = trainer.opt.step
        trainer.opt.step = lambda: (got.extend(x.grad.detach().clone() for x in trainer.master
                                               if x.grad is not None), step())
        trainer.train()
        return got

    whole, micro = master_grads(0), master_grads(1)
    problems = []
    if not whole or any(g.dtype != torch.float32 for g in micro):
        problems.append("accumulate: master gradients missing or not float32")
        return {}, problems
    err = max(float((a - b).abs().max()) for a, b in zip(whole, micro, strict=True))
    scale = max(float(a.abs().max()) for a in whole)
    rel = err / max(scale, 1e-12)
    if rel > 0.05:
        problems.append(f"accumulate: micro-batched gradients differ by {rel:.3f} of the "
                        "whole batch's")
    return {"max_rel_diff": round(rel, 5)}, problems


def lora_part(device: str, task, model: str, tmp) -> tuple[dict, list[str]]:
    m, tok = load_model(model, device=device, dtype=torch.bfloat16)
    prompts, reward, cfg = _job(task, model, 2, lora_rank=8)
    cfg = cfg.model_copy(update={"learning_rate": 1e-2})
    trainer = GRPOTrainer(m, tok, prompts, reward, cfg)
    trainer.train()
    trainer.model.eval()
    ids = torch.tensor([tok(prompts[0])["input_ids"]], device=device)
    with torch.no_grad():
        scored = trainer.model(ids).logits.float()
        merged = copy.deepcopy(trainer.model).merge_and_unload()(ids).logits.float()
    path = save_checkpoint(trainer.model, tok, tmp / f"lora-{device.replace(':', '')}")
    loaded, _ = load_model(path, device=device)
    with torch.no_grad():
        reloaded = loaded(ids).logits.float()
    diff = float((reloaded - scored).abs().max())
    merged_diff = float((merged - scored).abs().max())
    problems = []
    if diff > 1e-3 or diff > merged_diff:
        problems.append(f"lora_checkpoint: reloaded logits differ by {diff:.2e} from the scored "
                        f"model's (a bf16 merge: {merged_diff:.2e})")
    return {"reloaded_diff": diff, "bf16_merge_diff": merged_diff}, problems


def prescore_key_part(device: str) -> tuple[dict, list[str]]:
    key = score_key(device)
    want = torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else \
        "cpu"
    problems = [] if key[0] == want else [f"prescore_key: {key[0]!r}, not {want!r}"]
    return {"key": key}, problems


def run(device: str, task, model: str, tmp) -> tuple[dict, list[str]]:
    """Every part on `device`: ({part: figures}, problems)."""
    results, problems = {}, []
    for name, part in (("memory", lambda: memory_part(device, task, model)),
                       ("accumulate", lambda: accumulate_part(device, task, model)),
                       ("lora_checkpoint", lambda: lora_part(device, task, model, tmp)),
                       ("prescore_key", lambda: prescore_key_part(device))):
        t0 = time.perf_counter()
        try:
            figures, found = part()
        except Exception as exc:  # a crash is a finding, and the other parts still run
            figures, found = {}, [f"{name}: {type(exc).__name__}: {exc}"]
        results[name] = {**figures, "s": round(time.perf_counter() - t0, 2)}
        problems += found
    return results, problems
