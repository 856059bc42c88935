"""Pay for training, not for running: the trusted side's measure of whether a job changed the
model (nestor/inner/change.py), on the real GRPO trainer and the bundled tiny models."""

from __future__ import annotations

import shutil

import pytest
import torch

from nestor.inner.change import GRID_STEP_FLOOR, checkpoint_change, moved, trainer_change
from nestor.inner.grpo import GRPOTrainer
from nestor.job.config import JobConfig
from nestor.models.registry import load_model, resolve_model_dir

PROMPTS = [f"Count the letters: {'ab' * (i % 5 + 1)}" for i in range(8)]


def reward(_tasks: list[int], texts: list[str]) -> list[float]:
    """A reward with variance in every group: the even-length replies win."""
    return [float(len(t) % 2 == 0) for t in texts]


def train(**overrides):
    return train_with(**overrides)[1]


def train_with(**overrides):
    """(trainer, its Change) for a 2-step tiny-s job."""
    torch.manual_seed(0)
    base, tokenizer = load_model("tiny-s")
    base.eval().requires_grad_(False)
    import copy

    model = copy.deepcopy(base)
    cfg = JobConfig(base_model="tiny-s", max_steps=2, prompts_per_step=4, group_size=4,
                    max_new_tokens=6, **overrides)
    trainer = GRPOTrainer(model, tokenizer, PROMPTS, reward, cfg, ref_model=base)
    history = trainer.train()
    assert sum(m["groups_trained"] for m in history) > 0  # every job below ran real updates
    return trainer, trainer_change(trainer, base)


@pytest.mark.parametrize("overrides", [{}, {"learning_rate": 1e-4},
                                       {"lora_rank": 4, "learning_rate": 3e-3}])
def test_an_honest_job_moves_its_weights(overrides):
    change = train(**overrides)
    assert change.moved(), change
    assert 0.1 < change.efficiency < 2.0  # AdamW moves each weight by about lr a step


@pytest.mark.parametrize("overrides", [
    {"learning_rate": 1e-12},
    {"grad_clip": 1e-9},
    {"grad_clip": 1e-9, "learning_rate": 1e-2, "weight_decay": 0.5},  # decay is not learning
    {"lora_rank": 4, "learning_rate": 3e-3, "grad_clip": 1e-9},
    {"learning_rate": 1e-6},  # 1% of tiny-s's lowest grid rate: every step real, and tiny
    {"lora_rank": 4, "learning_rate": 1e-5},
    # A and B move at 3× the bottom of LoRA's grid, but α/r = 1/64 keeps B·A·α/r, the change
    # of the weights the model computes with, a third of a step at the bottom of tiny-s's grid
    {"lora_rank": 64, "lora_alpha": 1, "learning_rate": 3e-3}])
def test_a_job_that_runs_every_step_but_changes_nothing_is_not_moved(overrides):
    change = train(**overrides)
    assert not change.moved(), change


def test_an_unchanged_checkpoint_is_not_training(tmp_path):
    """The prime-rl backend's measure: an `ok` run whose weights are the base's is not moved;
    the same weights after one honest-sized step are."""
    from safetensors.torch import load_file, save_file

    base = resolve_model_dir("tiny-s")
    same = tmp_path / "same"
    same.mkdir()
    shutil.copy(base / "model.safetensors", same)
    change = checkpoint_change(same, base, lr=3e-4, optimizer_steps=5, lr_low=1e-4)
    assert change.change == 0.0 and not change.moved()

    tensors = load_file(base / "model.safetensors")
    gen = torch.Generator().manual_seed(0)
    stepped = {k: v + 3e-4 * torch.sign(torch.randn(v.shape, generator=gen)) if v.ndim == 2
               else v for k, v in tensors.items()}  # one AdamW-like step on the matrices
    moved_dir = tmp_path / "moved"
    moved_dir.mkdir()
    save_file(stepped, moved_dir / "model.safetensors")
    change = checkpoint_change(moved_dir, base, lr=3e-4, optimizer_steps=1, lr_low=1e-4)
    assert change.moved() and change.efficiency == pytest.approx(1.0, rel=1e-3)
    assert change.grid_steps == pytest.approx(3.0, rel=1e-3)  # one step of 3e-4 in 1e-4s
    # the same move counted against a model whose grid starts at 1e-3 is under the floor
    assert not checkpoint_change(moved_dir, base, lr=3e-4, optimizer_steps=1, lr_low=1e-3).moved()


def test_an_adapter_kept_beside_the_base_weights_is_measured_as_applied(tmp_path):
    """prime-rl's checkpoint of a LoRA job on a bf16 base keeps the adapter unmerged
    (prime_rl_checkpoint.py): its change is the adapter's merged delta, as trainer_change
    measures it, not the untouched base weights beside it."""
    from nestor.models.registry import ADAPTER_DIR, UNMERGED

    trainer, measured = train_with(lora_rank=4, learning_rate=3e-3)
    ckpt = tmp_path / "ckpt"
    shutil.copytree(resolve_model_dir("tiny-s"), ckpt)
    trainer.model.save_pretrained(ckpt / ADAPTER_DIR)
    (ckpt / UNMERGED).write_text("apply the adapter\n")
    change = checkpoint_change(ckpt, resolve_model_dir("tiny-s"), lr=3e-3, optimizer_steps=2,
                               lr_low=1e-4)
    assert change.moved()
    assert change.grid_steps == pytest.approx(measured.grid_steps, rel=1e-3)
    assert change.change == pytest.approx(measured.change, rel=1e-3)


def test_no_measure_is_no_change():
    assert not moved(None, None) and not moved(1.0, None) and not moved(None, 1.0)
    assert not moved(1.0, GRID_STEP_FLOOR / 2) and moved(1.0, GRID_STEP_FLOOR * 2)


