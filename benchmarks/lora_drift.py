"""Did an LM agent's RL steps move its LoRA by signal or by noise?

With one group of four episodes a step, each IS-GRPO gradient is a noisy estimate; Adam divides
every coordinate's step by its own running scale, so noise alone moves every coordinate by about
the learning rate each step, in a random direction. This reads an RL run's checkpoint (`nestor
train`'s latest, or benchmarks/repair_rl.py's policy/) — the adapter it started from (its
config.toml's `[policy] adapter`), the latest adapter and Adam's moments — and puts its
per-coordinate motion beside Adam run for as many steps on simulated gradients g = s·μ + ε
(μ, ε standard normal per coordinate; s the signal-to-noise ratio; s = 0: pure noise) with the
run's betas:

- last update |Δθ|/lr = |m̂/(√v̂ + eps)|, from the saved moments;
- net motion |θ_T - θ_0|/lr since the warm start: ~√T per coordinate for noise, T for a
  gradient that keeps its sign.

The SNR estimate is the s whose simulated median net motion matches the run's. Marginals only:
a signal confined to a few coordinates, or one that turns with each step's task, reads as noise.

    python benchmarks/lora_drift.py runs/lm-arc6/rl-s0 runs/lm-arc6/rl-s1     # seconds
    python benchmarks/lora_drift.py runs/repair-rl                            # repair_rl.py's

Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import tomllib
from pathlib import Path

import torch
from safetensors.torch import load_file

QUANTILES = (0.1, 0.5, 0.9, 0.99)
SNRS = (0.0, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0)
SAMPLE = 1_000_000  # coordinates a quantile is taken over (torch.quantile's input cap is 16M)


def quantiles(x: torch.Tensor, seed: int = 0) -> list[float]:
    if x.numel() > SAMPLE:  # a fixed random subset: the same coordinates every call
        x = x[torch.randperm(x.numel(), generator=torch.Generator().manual_seed(seed))[:SAMPLE]]
    return [round(float(v), 3) for v in torch.quantile(x.float(), torch.tensor(QUANTILES))]


def simulate(snr: float, steps: int, betas: tuple[float, float], eps: float,
             n: int = 200_000, seed: int = 0) -> dict[str, list[float]]:
    """Adam (lr 1) for `steps` steps on g_t = snr·μ + ε_t: the last update and the net motion."""
    gen = torch.Generator().manual_seed(seed)
    mu = torch.randn(n, generator=gen) * snr
    b1, b2 = betas
    m, v, x = torch.zeros(n), torch.zeros(n), torch.zeros(n)
    for t in range(1, steps + 1):
        g = mu + torch.randn(n, generator=gen)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        u = (m / (1 - b1**t)) / ((v / (1 - b2**t)).sqrt() + eps)
        x -= u
    return {"last_update": quantiles(u.abs()), "net_motion": quantiles(x.abs())}


def drift(run_dir: Path) -> dict:
    """A run's motion from its latest checkpoint and the adapter it started from."""
    from nestor.outer.checkpoint import latest_checkpoint

    ckpt = latest_checkpoint(run_dir)  # nestor train's; benchmarks/repair_rl.py saves policy/
    policy = ckpt / "policy" if ckpt is not None else run_dir / "policy"
    if not (policy / "state.pt").is_file():
        raise SystemExit(f"{run_dir}: no checkpoint (checkpoints/latest) nor policy/state.pt; "
                         "give an RL run directory (nestor train or benchmarks/repair_rl.py)")
    start = tomllib.loads((run_dir / "config.toml").read_text())["policy"].get("adapter")
    if not start:
        raise SystemExit(f"{run_dir}: its config has no [policy] adapter: it started from an "
                         "untrained LoRA (B = 0), so the net motion is the adapter itself")
    start_dir = Path(start) / "adapter" if (Path(start) / "adapter").is_dir() else Path(start)
    theta_0 = load_file(str(start_dir / "adapter_model.safetensors"))
    theta_t = load_file(str(policy / "adapter" / "adapter_model.safetensors"))
    opt = torch.load(policy / "state.pt", map_location="cpu", weights_only=False)["optimizer"]
    group = opt["param_groups"][0]
    lr, betas, eps = group["lr"], tuple(group["betas"]), group["eps"]
    moments = list(opt["state"].values())
    steps = int(float(moments[0]["step"]))
    b1, b2 = betas
    last = torch.cat([((s["exp_avg"] / (1 - b1**steps)) /
                       ((s["exp_avg_sq"] / (1 - b2**steps)).sqrt() + eps)).abs().flatten()
                      for s in moments])
    net = torch.cat([(theta_t[k].float() - theta_0[k].float()).abs().flatten() / lr
                     for k in theta_t])
    return {"run": str(run_dir), "checkpoint": ckpt.name if ckpt else "policy", "steps": steps,
            "lr": lr, "coordinates": net.numel(), "last_update": quantiles(last),
            "net_motion": quantiles(net), "betas": betas, "eps": eps}


def snr_estimate(net_median: float, sims: dict[float, dict]) -> float:
    """The SNR whose simulated median net motion is the run's (linear between grid points)."""
    grid = [(s, sims[s]["net_motion"][1]) for s in SNRS]
    if net_median <= grid[0][1]:
        return 0.0
    for (s0, m0), (s1, m1) in zip(grid, grid[1:], strict=False):
        if net_median <= m1:
            return round(s0 + (s1 - s0) * (net_median - m0) / (m1 - m0), 3)
    return SNRS[-1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", type=Path, nargs="+", help="RL run directories (nestor "
                    "train, benchmarks/repair_rl.py)")
    args = ap.parse_args()
    out = []
    q = "/".join(f"q{int(p * 100)}" for p in QUANTILES)
    for run_dir in args.runs:
        r = drift(run_dir)
        sims = {s: simulate(s, r["steps"], r["betas"], r["eps"]) for s in SNRS}
        r["snr_estimate"] = snr_estimate(r["net_motion"][1], sims)
        r["simulated"] = {str(s): sims[s] for s in SNRS}
        print(f"{run_dir} ({r['steps']} steps, lr {r['lr']:g}, {r['coordinates']:,} coordinates)"
              f"\n  {'':18} last update |Δ|/lr {q}   net motion |θ-θ0|/lr {q}", file=sys.stderr)
        rows = [("this run", r)] + [(f"Adam, SNR {s:g}", sims[s]) for s in (0.0, 0.3, 1.0, 3.0)]
        for name, x in rows:
            print(f"  {name:18} {x['last_update']}   {x['net_motion']}", file=sys.stderr)
        print(f"  SNR estimate (median net motion matched): {r['snr_estimate']}", file=sys.stderr)
        out.append(r)
    print(json.dumps({"runs": out}))


if __name__ == "__main__":
    main()
