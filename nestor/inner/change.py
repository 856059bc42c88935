"""Did a job change the model? The trusted side's measure, which the reward's `trained` reads.

A job is paid its validation and speed terms only when training measurably moved the weights
(nestor/agent/reward.py). "The trainer ran steps on groups with reward variance" is not
enough: `learning_rate = 1e-12` rounds every update away, and a `grad_clip` of 1e-9 (or
rewards whose spread is a few 1e-6) leaves gradients so far below AdamW's epsilon that each
step moves a weight by ~1e-4 of the learning rate instead of ~lr. Both run every step, and
both leave the model as it was.

Two numbers, over the trained parameters (all weights for a full fine-tune; the adapter's A
and B for LoRA, whose merged delta B·A·α/r is what `change` measures there), with
Δθ = θ_trained − (1 − lr·wd)^n · θ_start, n the optimizer steps taken:

    change     = ||Δθ|| / ||θ_start||          (LoRA: ||ΔW|| / ||W|| of the adapted layers)
    efficiency = ||Δθ|| / (lr · n · sqrt(N))  (N weights trained)

`efficiency` is the mean step of a weight, in units of the learning rate: AdamW moves every
weight with a gradient signal by about lr per step (m̂/√v̂ ≈ ±1), so an honest job sits near
0.1–1 whatever its model, learning rate or step count, and a job whose gradients vanish under
epsilon near 1e-4. `change` catches what efficiency cannot: a learning rate so small that
even a full step is nothing. Removing (1 − lr·wd)^n matters: AdamW's decoupled decay moves
every weight by lr·wd per step whatever the gradient. It is computed on the float32 master
weights (a bf16 model's rounding is not change), in one pass over the parameters.

The floors, measured on tiny-m, good-length, 4 steps (docs/inner.md has the table):

    job                                   change     efficiency
    honest, lr 3e-4 / 1e-4                1.1e-2     0.52 / 0.64
    LoRA r8, lr 3e-3                      5.1e-2     0.47
    lr 1e-12                              1.3e-12    0.019 (what float32 did not round away)
    grad_clip 1e-9                        7.0e-7     3.4e-5
    grad_clip 1e-9, lr 1e-2, wd 0.5       2.3e-5     3.4e-5
    LoRA r8, lr 3e-3, grad_clip 1e-9      2.1e-5     1.7e-4

CHANGE_FLOOR = 1e-6 is five orders above a 1e-12 job and an order below one honest step of
Qwen3-1.7B at the bottom of its learning-rate grid (~1.7e-6 / rms 0.03 × Adam's ~0.3 ≈ 2e-5).
EFFICIENCY_FLOOR = 1e-2 is two orders under an honest job and two over a vanishing-gradient one,
and, being in units of lr, holds for any model and step count.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

CHANGE_FLOOR = 1e-6
EFFICIENCY_FLOOR = 1e-2


@dataclass(frozen=True)
class Change:
    change: float
    efficiency: float

    def moved(self) -> bool:
        return moved(self.change, self.efficiency)


def moved(change: float | None, efficiency: float | None) -> bool:
    """Both above their floors; a measure not taken (None) never counts as moved."""
    return change is not None and efficiency is not None and change >= CHANGE_FLOOR \
        and efficiency >= EFFICIENCY_FLOOR


def decayed(lr: float, weight_decay: float, optimizer_steps: int) -> float:
    """AdamW's decoupled decay alone, over `optimizer_steps` steps: θ ← (1 − lr·wd)·θ each."""
    return (1.0 - lr * weight_decay) ** optimizer_steps


def _norms(pairs: Iterable[tuple], shrink: float) -> tuple[float, float, int]:
    """(||trained − shrink·start||², ||start||², weights) over (trained, start) pairs."""
    import torch

    num = den = 0.0
    n = 0
    with torch.no_grad():
        for trained, start in pairs:
            start = start.detach().float()
            diff = trained.detach().float().to(start.device) - shrink * start
            num += float(diff.pow(2).sum())
            den += float(start.pow(2).sum())
            n += start.numel()
    return num, den, n


def _efficiency(sq_delta: float, n_weights: int, lr: float, optimizer_steps: int) -> float:
    if optimizer_steps < 1 or n_weights < 1 or lr <= 0:
        return 0.0
    return math.sqrt(sq_delta) / (lr * optimizer_steps * math.sqrt(n_weights))


def lora_change(model) -> float:
    """||ΔW|| / ||W|| over every LoRA-adapted layer of a peft model (ΔW = the merged delta)."""
    import torch

    num = den = 0.0
    with torch.no_grad():
        for module in model.modules():
            if not hasattr(module, "get_delta_weight") or not hasattr(module, "base_layer"):
                continue
            for adapter in getattr(module, "active_adapters", []):
                if adapter not in getattr(module, "lora_A", {}):
                    continue
                num += float(module.get_delta_weight(adapter).float().pow(2).sum())
                den += float(module.base_layer.weight.float().pow(2).sum())
    return math.sqrt(num) / math.sqrt(den) if den > 0 else 0.0


def trainer_change(trainer, base) -> Change:
    """What a GRPOTrainer did to its model: against the frozen `base` model for a full
    fine-tune, against the adapter's initial weights (kept by the trainer) for LoRA."""
    cfg = trainer.config
    shrink = decayed(cfg.learning_rate, cfg.weight_decay, trainer.optimizer_steps)
    if cfg.lora_rank > 0:
        starts = trainer.initial_params
    else:
        base_params = dict(base.named_parameters())
        starts = [base_params[name] for name in trainer.param_names]
    sq_delta, sq_start, n = _norms(zip(trainer.master, starts, strict=True), shrink)
    eff = _efficiency(sq_delta, n, cfg.learning_rate, trainer.optimizer_steps)
    if cfg.lora_rank > 0:
        return Change(lora_change(trainer.model), eff)
    return Change(math.sqrt(sq_delta / sq_start) if sq_start > 0 else 0.0, eff)


def checkpoint_change(trained_dir, base_dir, lr: float, optimizer_steps: int) -> Change:
    """The change between two HF safetensors model directories (every tensor both hold and
    that differ in any weight count as trained), for a backend whose trainer we do not run
    (prime-rl). Weight decay is not removed here: that optimizer's schedule is not ours."""
    from pathlib import Path

    from safetensors import safe_open

    def index(d) -> dict[str, Path]:
        out = {}
        for f in sorted(Path(d).glob("*.safetensors")):
            with safe_open(str(f), framework="pt") as fh:
                out.update(dict.fromkeys(fh.keys(), f))
        return out

    def get(f: Path, key: str):
        with safe_open(str(f), framework="pt") as fh:
            return fh.get_tensor(key)

    trained, base = index(trained_dir), index(base_dir)
    common = sorted(set(trained) & set(base))
    if not common:
        raise ValueError(f"{trained_dir} and {base_dir} share no tensor names")
    sq_delta = sq_start = 0.0
    n = 0
    for key in common:
        t, b = get(trained[key], key), get(base[key], key)
        d, s, k = _norms([(t, b)], 1.0)
        sq_start += s
        if d > 0:  # a frozen tensor (LoRA's untouched layers) is not a trained weight
            sq_delta, n = sq_delta + d, n + k
    return Change(math.sqrt(sq_delta / sq_start) if sq_start > 0 else 0.0,
                  _efficiency(sq_delta, n, lr, optimizer_steps))
