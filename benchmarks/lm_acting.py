"""Acting and re-scoring speed of the `lm` policy: G episodes' turns one at a time (batch 1)
against one batched call (what concurrent episodes get from the policy's RequestBatcher), and
the trainer's re-scoring with the LM head on the action positions only against the whole
context.

    .venv/bin/python benchmarks/lm_acting.py [--model tiny-m] [--group 8] [--tokens 64]
                                             [--context N]  (keep the last N context tokens)

Prints one line per measurement; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from nestor.agent.prompt import system_prompt, task_message
from nestor.policy.base import Message, Observation
from nestor.policy.lm import LMPolicy
from nestor.policy.lm_sequence import token_logprobs
from nestor.sandbox.workspace import TOOL_SCHEMAS
from nestor.tasks import TaskRegistry


def full_context_logprobs(model, context_ids, action_ids, temperature):
    """The old way: logits for every position of context + actions, then slice."""
    ids = torch.tensor([context_ids + action_ids[:-1]])
    logits = model(input_ids=ids).logits[0, len(context_ids) - 1:]
    logp = torch.log_softmax(logits.float() / temperature, -1)
    return logp.gather(1, torch.tensor(action_ids)[:, None])[:, 0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-m")
    ap.add_argument("--group", type=int, default=8, help="episodes acting at once")
    ap.add_argument("--tokens", type=int, default=64, help="new tokens per turn")
    ap.add_argument("--context", type=int, default=0,
                    help="keep only the last N tokens of each context (0: all that fit)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    policy = LMPolicy.from_pretrained(args.model, max_new_tokens=args.tokens)
    spec = TaskRegistry().get("reverse").spec(0)
    prompt = system_prompt(spec, models=["tiny-s", "tiny-m"], token_budget=150_000,
                           max_attempts=3)
    # distinct contexts (as G episodes have): no prefill is shared between rows
    contexts = [policy.render(Observation(
        [Message("system", prompt), Message("user", f"{task_message(spec)} (episode {i})")],
        TOOL_SCHEMAS, spec))[-args.context:] for i in range(args.group)]
    assert len({tuple(c) for c in contexts}) == args.group
    context = contexts[0]

    t0 = time.perf_counter()
    singles = [policy.sample_batch([c])[0] for c in contexts]
    one_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    batched = policy.sample_batch(contexts)
    batch_s = time.perf_counter() - t0
    tokens_one = sum(len(ids) for ids, _ in singles)
    tokens_batch = sum(len(ids) for ids, _ in batched)
    print(f"acting: {args.group} turns one at a time {one_s:.2f} s ({tokens_one} tokens), "
          f"batched {batch_s:.2f} s ({tokens_batch} tokens)", flush=True)

    ids, _ = batched[0]
    with torch.no_grad():
        t0 = time.perf_counter()
        for _ in range(3):
            kept = token_logprobs(policy.model, context, ids, policy.temperature)
        kept_s = (time.perf_counter() - t0) / 3
        t0 = time.perf_counter()
        for _ in range(3):
            full = full_context_logprobs(policy.model, context, ids, policy.temperature)
        full_s = (time.perf_counter() - t0) / 3
    assert torch.allclose(kept, full, atol=1e-5)
    vocab = policy.model.get_output_embeddings().weight.shape[0]
    print(f"re-scoring a {len(context)}-token context + {len(ids)} actions: action positions "
          f"only {kept_s * 1000:.0f} ms, whole context {full_s * 1000:.0f} ms; logits "
          f"{len(ids)}x{vocab} instead of {len(context) + len(ids) - 1}x{vocab}", flush=True)
    print(json.dumps({
        "model": args.model, "group": args.group, "context_tokens": len(context),
        "act_one_at_a_time_s": round(one_s, 3), "act_batched_s": round(batch_s, 3),
        "act_tokens_per_s_one": round(tokens_one / one_s, 1),
        "act_tokens_per_s_batched": round(tokens_batch / batch_s, 1),
        "rescore_action_only_ms": round(kept_s * 1000, 1),
        "rescore_full_context_ms": round(full_s * 1000, 1),
        "logit_rows_action_only": len(ids), "logit_rows_full": len(context) + len(ids) - 1}))


if __name__ == "__main__":
    main()
