"""Did a job change the model? The trusted side's measure, which the reward's `trained` reads.

A job is paid its validation and speed terms only when training measurably moved the weights
(nestor/agent/reward.py). "The trainer ran steps on groups with reward variance" is not
enough: `learning_rate = 1e-12` rounds every update away, and a `grad_clip` of 1e-9 (or
rewards whose spread is a few 1e-6) leaves gradients so far below AdamW's epsilon that each
step moves a weight by ~1e-4 of the learning rate instead of ~lr. Both run every step, and
both leave the model as it was.

Three numbers, with Δθ = θ_trained − (1 − lr·wd)^n · θ_start, n the optimizer steps taken:

    change     = ||ΔW|| / ||W_start||          (the weights the model computes with)
    efficiency = ||Δθ|| / (lr · n · sqrt(N))  (a trained weight's mean step, in units of lr)
    grid_steps = ||ΔW|| / sqrt(M) / lr_low    (a weight's mean move, in AdamW steps at lr_low)

θ are the trained parameters (N of them: every weight for a full fine-tune, LoRA's A and B);
W the M weights the model computes with (for LoRA, the adapted layers, ΔW = B·A·α/r merged).

`efficiency`: AdamW moves every weight with a gradient signal by about lr per step (m̂/√v̂ ≈
±1), so an honest job sits near 0.1–1 whatever its model, learning rate or step count, and a
job whose gradients vanish under epsilon near 1e-4. `grid_steps` catches what efficiency
cannot, a learning rate so small that the whole run moves nothing, and it is the model's own
scale: lr_low is the bottom of the base model's full fine-tune learning-rate grid
(models/registry.py), so for a full fine-tune grid_steps ≈ efficiency × lr × n / lr_low, about
one for one AdamW step at lr_low. For LoRA it is the merged delta that counts: A and B may move
by the learning rate while α/r makes B·A·α/r nothing (rank 64, α 1: a third of the floor). A
job is `moved` when both clear their floors; `change` is recorded, not gated (an absolute
floor on it, 1e-6 until 2026-12-08, was set for Qwen3-1.7B's smallest honest step and let one
step of tiny-m at lr 3e-7 — its weights moved 5e-6, its scores not at all — through). Removing
(1 − lr·wd)^n matters: AdamW's decoupled decay moves every weight by lr·wd per step whatever
the gradient. All are computed on the float32 master weights (a bf16 model's rounding is not
change), in one pass over the parameters.

The floors, measured on tiny-m (lr_low 1e-4), good-length (docs/inner.md has the tables):

    job (4 steps, but where said)         efficiency  grid_steps  hidden eval, pre 0.365
    honest, lr 3e-4 / 1e-4                0.53 / 0.56 6.4 / 2.3   0.400 / 0.380
    LoRA r8 α32, lr 3e-3 / α16, lr 1e-3   0.48 / 0.52 26 / 4.4    0.420 / 0.390
    LoRA r64 α1, lr 3e-3: 4 / 16 steps    0.50 / 0.37 0.35 / 2.5  0.395 / 0.455
    lr 1e-12                              0.014       6e-10       0.365
    grad_clip 1e-9 (lr 3e-4; LoRA 3e-3)   < 1e-4      3e-4; 0.008 0.365
    noise, one step at lr 3e-7 / 1e-5     1.0         0.003 / 0.1 0.365 / 0.365
    noise, one step at lr 5e-5 / 1e-4     1.0         0.50 / 1.0  0.380 / 0.340

EFFICIENCY_FLOOR = 1e-2 is two orders under an honest job and two over a vanishing-gradient
one. GRID_STEP_FLOOR = 0.5: half of one step at the bottom of the grid, a quarter of what four
honest steps there move. A step of noise at 0.1 (lr 1e-5) left the score as it was; near the
floor a step of noise moved it by ±0.02 either way: the harbour left is a job that trains on
noise at the floor, paid for validation with its quality at risk, a real step of the model. The
floor's price: an honest job that moves less goes unpaid for validation though its score rose
(LoRA at α/r = 1/64, four steps: +0.03; sixteen steps pass).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

EFFICIENCY_FLOOR = 1e-2
GRID_STEP_FLOOR = 0.5


@dataclass(frozen=True)
class Change:
    change: float
    efficiency: float
    grid_steps: float

    def moved(self) -> bool:
        return moved(self.efficiency, self.grid_steps)


def moved(efficiency: float | None, grid_steps: float | None) -> bool:
    """Both above their floors; a measure not taken (None) never counts as moved."""
    return efficiency is not None and grid_steps is not None \
        and efficiency >= EFFICIENCY_FLOOR and grid_steps >= GRID_STEP_FLOOR


def lowest_lr(base_model: str) -> float:
    """The bottom of the base model's (full fine-tune) learning-rate grid: what grid_steps
    counts steps of."""
    from nestor.models.registry import learning_rate_grid

    return learning_rate_grid(base_model)[0]


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


def _grid_steps(sq_delta: float, n_weights: int, lr_low: float) -> float:
    return math.sqrt(sq_delta / n_weights) / lr_low if n_weights > 0 else 0.0


def lora_delta(model) -> tuple[float, float, int]:
    """(||ΔW||², ||W||², weights) over every LoRA-adapted layer of a peft model, ΔW the merged
    delta B·A·α/r: the change of the weights the model computes with."""
    import torch

    num = den = 0.0
    n = 0
    with torch.no_grad():
        for module in model.modules():
            if not hasattr(module, "get_delta_weight") or not hasattr(module, "base_layer"):
                continue
            for adapter in getattr(module, "active_adapters", []):
                if adapter not in getattr(module, "lora_A", {}):
                    continue
                num += float(module.get_delta_weight(adapter).float().pow(2).sum())
                den += float(module.base_layer.weight.float().pow(2).sum())
                n += module.base_layer.weight.numel()
    return num, den, n


def _relative(sq_delta: float, sq_start: float) -> float:
    return math.sqrt(sq_delta / sq_start) if sq_start > 0 else 0.0


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
    if cfg.lora_rank > 0:  # the weights computed with move by the merged delta, not by A, B
        sq_delta, sq_start, n = lora_delta(trainer.model)
    return Change(_relative(sq_delta, sq_start), eff,
                  _grid_steps(sq_delta, n, lowest_lr(cfg.base_model)))


def checkpoint_change(trained_dir, base_dir, lr: float, optimizer_steps: int,
                      lr_low: float) -> Change:
    """The change between two HF safetensors model directories (every tensor both hold and
    that differ in any weight count as trained), for a backend whose trainer we do not run
    (prime-rl). Weight decay is not removed here: that optimizer's schedule is not ours. A
    checkpoint that keeps a LoRA adapter beside the base weights (a bf16 base: prime_rl_checkpoint)
    is measured on the adapter as applied."""
    from pathlib import Path

    from safetensors import safe_open

    from nestor.models.registry import UNMERGED

    if (Path(trained_dir) / UNMERGED).is_file():
        return _adapter_change(Path(trained_dir), lr, optimizer_steps, lr_low)

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
    return Change(_relative(sq_delta, sq_start), _efficiency(sq_delta, n, lr, optimizer_steps),
                  _grid_steps(sq_delta, n, lr_low))


def _adapter_change(ckpt, lr: float, optimizer_steps: int, lr_low: float) -> Change:
    """An unmerged adapter's change: its merged delta as loaded for scoring; efficiency from
    its B matrices alone, which start at zero (A's random start is not in the checkpoint)."""
    from nestor.models.registry import load_model

    model, _ = load_model(ckpt)
    sq_delta, sq_start, n = lora_delta(model)
    b = [p for name, p in model.named_parameters() if ".lora_B." in name]
    sq_b = sum(float(p.detach().float().pow(2).sum()) for p in b)
    return Change(_relative(sq_delta, sq_start),
                  _efficiency(sq_b, sum(p.numel() for p in b), lr, optimizer_steps),
                  _grid_steps(sq_delta, n, lr_low))
