"""Behaviour cloning of demonstrations into the LM policy's LoRA adapter.

The loss, in one place: for a batch of packed sequences (nestor/sft/data.py),

    loss = -(1/N) Σ_sequences Σ_{t : mask_t} log p_θ(ids_t | ids_<t)

N = the batch's number of target tokens (every action token weighs the same). Context tokens
(system prompt, task, tool answers) carry no loss: only the positions that predict an action
token go through the LM head (in chunks: `target_logprobs`, nestor/policy/lm_sequence.py), so
neither their logits nor any gradient through them is made. Log-probabilities are at
temperature 1: the warm start fits the distribution the policy then samples from at its own
temperature.

Each sequence is its own forward pass (batch 1, no padding); gradients accumulate over the
batch, gradient checkpointing trades compute for memory, and the forward runs under bfloat16
autocast where the device has it natively (`precision`; the LoRA and Adam stay float32). The
model is the LMPolicy's own, with its own LoRA, so the adapter saved here is what
`LMPolicy.load_adapter` loads (`nestor train`: `[policy] adapter = DIR`; `nestor bench
agents`: `lm:MODEL --adapter DIR`).

Besides the loss each step logs its token accuracy (the share of action tokens that are the
model's argmax, TRL's `mean_token_accuracy`): a demo episode is ~700 action tokens, so a clone
acts only when slips are rare. With `val_fraction` whole demos are held out of training and
scored (loss, token accuracy; no gradient) every `eval_every` steps and at the end.

Resumable: every `checkpoint_every` steps DIR/checkpoint/ holds the adapter, the optimizer and
the step; the order of sequences is a function of (seed, epoch), so a resumed run sees the
batches it would have seen.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Callable
from pathlib import Path

import torch
from pydantic import BaseModel, Field, model_validator

from nestor.models.precision import Precision, autocast, autocast_dtype
from nestor.policy.lm_sequence import target_logprobs
from nestor.sft.data import SFTSequence
from nestor.sft.slips import SLIPS


class SFTConfig(BaseModel):
    """`nestor sft`: what is trained, on what, how long (written resolved to DIR/sft.json)."""

    model: str = Field("smollm2-135m", description="Registry name or local path of the chat LM.")
    demos: str = Field("composer:4", description="composer:N, a run directory, or a .jsonl "
                       "of transcripts (nestor/sft/demos.py).")
    tasks: list[str] = Field(["reverse", "sort", "add", "length"], min_length=1,
                             description="composer:N: the training tasks it writes jobs for.")
    passed_only: bool = Field(True, description="Keep demos whose job passed validation.")
    min_reward: float | None = Field(None, description="Keep demos with reward ≥ this.")
    best_of_group: bool = Field(False, description="Keep the best demo of each group only.")
    slips_per_job: int = Field(0, ge=0, le=len(SLIPS), description="composer:N: replay each job that "
                               "passed first try this many times, each with a different LM "
                               "slip and its repair (nestor/sft/slips.py): demos of fixing what "
                               "the probe reports.")
    train_failed_attempts: bool = Field(False, description="Also clone the turns of attempts "
                                        "whose submit failed (default: they are only the "
                                        "context of the repair that follows).")
    steps: int = Field(60, ge=1, le=100_000, description="Optimizer steps.")
    batch_sequences: int = Field(4, ge=1, le=1024, description="Sequences per step "
                                 "(gradients accumulated, one forward pass each).")
    learning_rate: float = Field(2e-4, gt=0, le=1e-1, description="AdamW lr of the LoRA.")
    warmup_steps: int = Field(5, ge=0, description="Linear warm-up, then cosine to 10%.")
    weight_decay: float = Field(0.0, ge=0, le=0.5, description="AdamW weight decay.")
    grad_clip: float = Field(1.0, ge=0, le=100, description="Gradient-norm clip; 0 = off.")
    lora_rank: int = Field(8, ge=1, le=256, description="LoRA rank (the LM policy's).")
    lora_alpha: int = Field(16, ge=1, le=1024, description="LoRA alpha (the LM policy's).")
    max_new_tokens: int | None = Field(None, ge=1, le=32768, description="The policy's turn "
                                       "cap (longer demo turns are dropped); default as the policy.")
    response_prefix: str = Field("", max_length=200, description="The policy's response prefix "
                                 "(in the context, never trained).")
    prompt_style: str = Field("compact", description="composer:N: the system prompt's style.")
    gradient_checkpointing: bool = Field(True, description="Recompute activations in backward "
                                         "(measured on a 2-core CPU: ~1.4× the step time).")
    precision: Precision = Field(
        "auto", description="The forward pass's autocast: auto = bfloat16 where the device "
        "computes it natively (CUDA with bf16; a CPU with AVX512-BF16 or AMX: measured 2.1× "
        "faster on this laptop's), else float32. The LoRA weights, gradients and optimizer "
        "stay float32.")
    val_fraction: float = Field(0.0, ge=0.0, le=0.5, description="Share of demos held out "
                                "of training (whole demos, chosen by `seed`) and scored every "
                                "`eval_every` steps: loss and token accuracy.")
    eval_every: int = Field(10, ge=1, description="Steps between held-out scorings.")
    checkpoint_every: int = Field(20, ge=1, description="Steps between resumable checkpoints.")
    device: str = Field("cpu", description="Torch device.")
    seed: int = Field(0, ge=0, description="Seed of data order and demos.")

    @model_validator(mode="after")
    def _slips_need_the_composer(self) -> SFTConfig:
        if self.slips_per_job and not self.demos.startswith("composer:"):
            raise ValueError(f"slips_per_job = {self.slips_per_job} replays jobs the composer "
                             f"writes: use demos = composer:N, or drop it for {self.demos!r}")
        return self


def bc_loss(model, seq: SFTSequence) -> tuple[torch.Tensor, int, int]:
    """(Σ_{t: mask_t} -log p(ids_t | ids_<t), number of targets, how many of them are the
    model's argmax) for one sequence."""
    device = next(model.parameters()).device
    ids = torch.tensor([seq.ids], device=device)  # [1, L]
    targets = torch.tensor([i for i, m in enumerate(seq.mask) if m and i > 0],
                           device=device)  # [T]: positions of action tokens
    # position t-1 predicts token t: only those rows go through the LM head, in chunks
    target_logp, hits = target_logprobs(model, ids[:, :-1], targets - 1, ids[0, targets])
    return -target_logp.sum(), int(targets.numel()), int(hits.sum())


def lr_at(step: int, cfg: SFTConfig) -> float:
    if step < cfg.warmup_steps:
        return cfg.learning_rate * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.learning_rate * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def batches(sequences: list[SFTSequence], cfg: SFTConfig, step: int) -> list[SFTSequence]:
    """The step's batch: epochs of a (seed, epoch)-shuffled order, so a resume is exact."""
    n, b = len(sequences), cfg.batch_sequences
    out = []
    for k in range(step * b, step * b + b):
        epoch, i = divmod(k, n)
        order = list(range(n))
        random.Random(f"{cfg.seed}:{epoch}").shuffle(order)
        out.append(sequences[order[i]])
    return out


class Trainer:
    def __init__(self, policy, cfg: SFTConfig, out_dir: Path):
        self.policy, self.cfg, self.out = policy, cfg, Path(out_dir)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.learning_rate,
                                           weight_decay=cfg.weight_decay)
        self.step = 0
        self.history: list[dict] = []
        self.autocast = autocast_dtype(cfg.precision, cfg.device)

    @property
    def model(self):
        """The policy's model with its LoRA apart (acting may have merged it: LMPolicy.model)."""
        return self.policy.model

    # ---- checkpoints ----------------------------------------------------------------------
    @property
    def ckpt(self) -> Path:
        return self.out / "checkpoint"

    def save(self, path: Path | None = None) -> None:
        path = path or self.ckpt
        tmp = path.with_name(path.name + ".tmp")
        self.model.save_pretrained(tmp / "adapter")
        torch.save({"optimizer": self.optimizer.state_dict(), "step": self.step,
                    "history": self.history}, tmp / "state.pt")
        if path.exists():
            import shutil

            shutil.rmtree(path)
        tmp.rename(path)  # a checkpoint is whole or absent

    def resume(self) -> bool:
        if not (self.ckpt / "state.pt").is_file():
            return False
        self.policy.load_adapter(self.ckpt / "adapter")
        state = torch.load(self.ckpt / "state.pt", weights_only=True)  # no pickle
        self.optimizer.load_state_dict(state["optimizer"])
        self.step, self.history = int(state["step"]), list(state["history"])
        return True

    # ---- training -------------------------------------------------------------------------
    def train(self, sequences: list[SFTSequence],
              on_step: Callable[[dict], None] | None = None,
              val: list[SFTSequence] | None = None) -> list[dict]:
        """Step to `cfg.steps`; `val`: held-out sequences, scored every `eval_every` steps."""
        if not sequences:
            raise ValueError("no training sequences: every demo was filtered out or dropped")
        cfg = self.cfg
        # the policy may have checkpointing on already (LMPolicy's default, for RL): switch it on
        # only when it is not, and back off after
        toggle = cfg.gradient_checkpointing and not getattr(self.policy, "gradient_checkpointing",
                                                            False)
        if toggle:
            kwargs = {"use_reentrant": False}  # no need for inputs that require grad
            if hasattr(self.model, "activation_checkpointing_enable"):  # transformers ≥ 5.2x
                self.model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
            else:
                self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        # HF checkpoints only in train mode, so eval mode is how it is off (the policy has no
        # dropout: the two modes compute the same function)
        self.model.train(cfg.gradient_checkpointing)
        try:
            while self.step < cfg.steps:
                self.history.append(self._one_step(batches(sequences, cfg, self.step)))
                self.step += 1
                if val and (self.step % cfg.eval_every == 0 or self.step == cfg.steps):
                    self.history[-1].update(self.evaluate(val))
                if on_step is not None:
                    on_step(self.history[-1])
                if self.step % cfg.checkpoint_every == 0 or self.step == cfg.steps:
                    self.save()
        finally:
            self.model.eval()
            if toggle:
                disable = getattr(self.model, "activation_checkpointing_disable", None) or \
                    self.model.gradient_checkpointing_disable
                disable()
        self.model.save_pretrained(self.out / "adapter")  # the warm start: DIR/adapter
        return self.history

    @torch.no_grad()
    def evaluate(self, sequences: list[SFTSequence]) -> dict[str, float]:
        """Held-out loss (mean over action tokens) and token accuracy; no gradient."""
        loss = n_targets = n_correct = 0
        for seq in sequences:
            with autocast(self.autocast, self.cfg.device):
                loss_sum, n, correct = bc_loss(self.model, seq)
            loss, n_targets, n_correct = loss + float(loss_sum), n_targets + n, n_correct + correct
        return {"val_loss": loss / n_targets, "val_token_accuracy": n_correct / n_targets}

    def _one_step(self, batch: list[SFTSequence]) -> dict:
        t0 = time.perf_counter()
        lr = lr_at(self.step, self.cfg)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.zero_grad(set_to_none=True)
        n_targets = sum(s.n_targets for s in batch)
        total, n_correct = 0.0, 0
        for seq in batch:
            with autocast(self.autocast, self.cfg.device):
                loss_sum, _, correct = bc_loss(self.model, seq)
            (loss_sum / n_targets).backward()
            total, n_correct = total + float(loss_sum.detach()), n_correct + correct
        clip = self.cfg.grad_clip if self.cfg.grad_clip > 0 else math.inf
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, clip))
        self.optimizer.step()
        return {"step": self.step + 1, "loss": total / n_targets,
                "token_accuracy": n_correct / n_targets, "lr": lr,
                "grad_norm": grad_norm, "target_tokens": n_targets,
                "tokens": sum(len(s.ids) for s in batch),
                "seconds": round(time.perf_counter() - t0, 3)}


def write_config(cfg: SFTConfig, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "sft.json").write_text(json.dumps(cfg.model_dump(), indent=1))
