"""The warm start's step on this machine: float32 or bfloat16 autocast, checkpointed or not.

One behaviour-cloning forward + backward (nestor.sft.trainer.bc_loss) of a demo sequence, per
mode, alternated over --reps rounds (the first round warms caches and is dropped when there are
more): seconds per sequence, target-token loss and the gradient's cosine against float32
checkpointed (the reference, what `nestor sft` ran before `precision` existed).

Run:  .venv/bin/python benchmarks/sft_speed.py [--model smollm2-135m] [--demos DEMOS.jsonl]
Without --demos the composer writes one short-form `reverse` job (validated in the sandbox) as
the demo. Last line: JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from nestor.models.precision import autocast, autocast_dtype
from nestor.sft.data import EncodeStats, encode_demo, policy_encoders
from nestor.sft.demos import from_composer, read_demos
from nestor.sft.run import make_policy
from nestor.sft.trainer import SFTConfig, bc_loss

MODES = [("float32", True), ("float32", False), ("bfloat16", True), ("bfloat16", False)]


def one_pass(model, seq, precision: str, checkpointing: bool) -> tuple[float, float, torch.Tensor]:
    """(seconds, mean target loss, flat LoRA gradient) of one forward + backward."""
    model.train(checkpointing)  # HF checkpoints in train mode only (the policy has no dropout)
    model.zero_grad(set_to_none=True)
    t0 = time.perf_counter()
    with autocast(autocast_dtype(precision, "cpu"), "cpu"):
        loss, n, _ = bc_loss(model, seq)
    (loss / n).backward()
    seconds = time.perf_counter() - t0
    grad = torch.cat([p.grad.flatten() for p in model.parameters() if p.requires_grad])
    return seconds, float(loss.detach()) / n, grad


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--demos", type=Path, help="a demos.jsonl (nestor sft's); its first demo")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    policy = make_policy(SFTConfig(model=args.model))  # checkpointing on (in train mode)
    if args.demos:
        demo = read_demos(args.demos)[0]
    else:
        with tempfile.TemporaryDirectory() as tmp:
            demo = from_composer(1, ["reverse"], Path(tmp))[0]
    render, encode_action = policy_encoders(policy)
    seq = encode_demo(demo, render, encode_action, EncodeStats())[0]

    runs: dict[tuple[str, bool], list] = {m: [] for m in MODES}
    for _ in range(args.reps):
        for mode in MODES:
            runs[mode].append(one_pass(policy.model, seq, *mode))
    ref_grad = runs[MODES[0]][-1][2]
    ref_s = statistics.median(r[0] for r in runs[MODES[0]][1:] or runs[MODES[0]])
    out = {"model": args.model, "tokens": len(seq.ids), "targets": seq.n_targets,
           "threads": args.threads, "reps": args.reps,
           "bf16_native": autocast_dtype("auto", "cpu") is not None, "modes": {}}
    for (precision, ckpt), rs in runs.items():
        kept = rs[1:] or rs  # the first round warms caches
        s = statistics.median(r[0] for r in kept)
        cos = float(torch.nn.functional.cosine_similarity(rs[-1][2], ref_grad, dim=0))
        name = f"{precision}{'-checkpointed' if ckpt else ''}"
        out["modes"][name] = {"s_per_sequence": round(s, 2), "speedup": round(ref_s / s, 2),
                              "loss": round(rs[-1][1], 4), "grad_cosine": round(cos, 5)}
        print(f"{name:>24}: {s:6.2f} s  ×{ref_s / s:.2f}  loss {rs[-1][1]:.4f}  "
              f"grad cos {cos:.5f}", flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
