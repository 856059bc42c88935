"""Learnability check: a short supervised fine-tune of tiny-m on one task's own test format
(chat template, loss on the reply tokens only, inputs from the public sampler with a seed of
its own) and the hidden-eval accuracy before and after. GRPO needs this headroom to exist.

    .venv/bin/python benchmarks/learnability.py --task reverse [--steps 150] [--model tiny-m]

Prints progress, then one JSON object on the last line.
"""

from __future__ import annotations

import argparse
import json
import random
import time

import torch
import torch.nn.functional as F

from nestor.inner.evaluate import score_model
from nestor.models.registry import load_model
from nestor.tasks import TaskRegistry
from nestor.tasks.hidden import hidden_eval


def batch_of(tokenizer, task, rng: random.Random, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """([B, L] ids right-padded, [B, L] mask of reply tokens incl. <|im_end|>)."""
    rows = []
    for _ in range(size):
        x = task.sample(rng, 0)
        out = tokenizer.apply_chat_template(
            [{"role": "user", "content": task.prompt(x)},
             {"role": "assistant", "content": task.solve(x)}],
            return_assistant_tokens_mask=True, return_dict=True)
        rows.append((out["input_ids"], out["assistant_masks"]))
    width = max(len(ids) for ids, _ in rows)
    ids = torch.full((size, width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((size, width), dtype=torch.bool)
    for i, (row_ids, row_mask) in enumerate(rows):
        ids[i, :len(row_ids)] = torch.tensor(row_ids)
        mask[i, :len(row_mask)] = torch.tensor(row_mask, dtype=torch.bool)
    return ids, mask


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="reverse")
    parser.add_argument("--model", default="tiny-m")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    ref = TaskRegistry().get(args.task)
    evaluation = hidden_eval(ref, n=200)
    model, tok = load_model(args.model)
    before = score_model(model, tok, evaluation)
    print(f"{args.model} on {args.task} before: {before.accuracy:.3f}", flush=True)

    rng = random.Random(f"learnability:{args.seed}")  # not the hidden eval's seed
    optim = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    model.train()
    start = time.perf_counter()
    for step in range(args.steps):
        ids, reply = batch_of(tok, ref.task, rng, args.batch_size)  # [B, L] each
        logits = model(input_ids=ids).logits[:, :-1].float()  # [B, L-1, V] predicts ids[:, 1:]
        targets, weights = ids[:, 1:], reply[:, 1:].float()  # loss on reply tokens only
        nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                              reduction="none").view_as(weights)
        loss = (nll * weights).sum() / weights.sum()
        optim.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optim.step()
        if (step + 1) % 25 == 0:
            print(f"step {step + 1}/{args.steps} loss {loss.item():.3f}", flush=True)
    train_s = time.perf_counter() - start
    after = score_model(model, tok, evaluation)
    print(f"{args.model} on {args.task} after {args.steps} steps: {after.accuracy:.3f}")
    print(json.dumps({"model": args.model, "task": args.task, "steps": args.steps,
                      "batch_size": args.batch_size, "lr": args.lr, "train_s": round(train_s, 1),
                      "before": before.accuracy, "after": after.accuracy,
                      "before_ci95": before.ci95, "after_ci95": after.ci95,
                      "lift": round(after.accuracy - before.accuracy, 3)}))


if __name__ == "__main__":
    main()
