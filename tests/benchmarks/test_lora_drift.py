"""benchmarks/lora_drift.py: a run whose gradients are noise reads as noise, one whose gradients
keep their sign reads as signal, and the last update read from Adam's moments is the step the
weights took."""

import importlib.util
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "lora_drift.py"
spec = importlib.util.spec_from_file_location("lora_drift", SCRIPT)
lora_drift = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lora_drift)

LR, STEPS, N = 5e-5, 10, 40_000


def fake_run(tmp_path: Path, snr: float, seed: int = 1) -> tuple[Path, torch.Tensor]:
    """An RL run directory as `nestor train` leaves it (the parts lora_drift reads): a warm
    start, then AdamW for STEPS steps on gradients snr·μ + ε, checkpointed; returns it and the
    last step's |Δθ|/lr."""
    gen = torch.Generator().manual_seed(seed)
    warm = tmp_path / "sft" / "adapter"
    warm.mkdir(parents=True)
    a0 = torch.randn(N // 2, generator=gen) * 0.01
    b0 = torch.randn(N // 2, generator=gen) * 0.01
    save_file({"lora_A": a0, "lora_B": b0}, str(warm / "adapter_model.safetensors"))
    params = [a0.clone().requires_grad_(), b0.clone().requires_grad_()]
    opt = torch.optim.AdamW(params, lr=LR, weight_decay=0.0)
    mu = [torch.randn(N // 2, generator=gen) * snr for _ in params]
    for _ in range(STEPS):
        before = torch.cat([p.detach().clone() for p in params])
        for p, m in zip(params, mu, strict=True):
            p.grad = m + torch.randn(N // 2, generator=gen)
        opt.step()
    last_step = (torch.cat([p.detach() for p in params]) - before).abs() / LR
    run = tmp_path / "run"
    ckpt = run / "checkpoints" / f"step-{STEPS:06d}"
    (ckpt / "policy" / "adapter").mkdir(parents=True)
    save_file({"lora_A": params[0].detach(), "lora_B": params[1].detach()},
              str(ckpt / "policy" / "adapter" / "adapter_model.safetensors"))
    torch.save({"optimizer": opt.state_dict()}, ckpt / "policy" / "state.pt")
    (ckpt / "state.json").write_text("{}")
    (run / "checkpoints" / "latest").write_text(ckpt.name)
    (run / "config.toml").write_text(f'[policy]\nadapter = "{tmp_path / "sft"}"\n')
    return run, last_step


@pytest.mark.parametrize("snr, low, high", [(0.0, 0.0, 0.3), (3.0, 2.0, 3.0)])
def test_the_snr_estimate_tells_noise_from_signal(tmp_path, snr, low, high):
    run, last_step = fake_run(tmp_path, snr)
    r = lora_drift.drift(run)
    assert (r["steps"], r["lr"], r["coordinates"]) == (STEPS, LR, N)
    # the moments' update is the step the weights took (Adam's own arithmetic, float32)
    assert r["last_update"] == pytest.approx(lora_drift.quantiles(last_step), abs=2e-3)
    sims = {s: lora_drift.simulate(s, STEPS, r["betas"], r["eps"], n=N) for s in lora_drift.SNRS}
    assert r["net_motion"][1] == pytest.approx(sims[snr]["net_motion"][1], rel=0.05)
    assert low <= lora_drift.snr_estimate(r["net_motion"][1], sims) <= high


def test_a_repair_rl_run_is_read_from_its_saved_policy(tmp_path):
    run, _ = fake_run(tmp_path, 0.0)
    expected = lora_drift.drift(run)
    ckpt = run / "checkpoints" / f"step-{STEPS:06d}"
    (ckpt / "policy").rename(run / "policy")  # benchmarks/repair_rl.py's layout
    (run / "checkpoints" / "latest").unlink()
    r = lora_drift.drift(run)
    assert r["checkpoint"] == "policy" and r["net_motion"] == expected["net_motion"]


def test_a_run_without_a_warm_start_or_checkpoint_is_refused(tmp_path):
    run, _ = fake_run(tmp_path, 0.0)
    (run / "config.toml").write_text("[policy]\n")
    with pytest.raises(SystemExit, match="no \\[policy\\] adapter"):
        lora_drift.drift(run)
    with pytest.raises(SystemExit, match="no checkpoint"):
        lora_drift.drift(tmp_path / "sft")
