"""CPU-seconds per decoded token of the LM policy's sampler: before (transformers' DynamicCache,
which re-concatenates every layer's K/V each token, and the LoRA applied beside each weight)
against after (the in-place KV cache of nestor/models/kv_cache.py and the LoRA merged into the
float32 weights while acting), alternated in one process so both see the same machine.

    .venv/bin/python benchmarks/lm_decode.py [--model smollm2-135m] [--batch 4]
        [--prompt 1400] [--tokens 128] [--reps 3] [--threads 1]

Both variants sample greedily from the same prompt, so they must produce the same tokens (the
merged weights differ from W + BA computed apart only by rounding; a differing token is
reported, not hidden). Last line: one JSON object with the medians and the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--batch", type=int, default=4, help="rows decoded at once (a GRPO group)")
    ap.add_argument("--prompt", type=int, default=1400, help="prompt tokens (the short prompt "
                    "with its tool schemas is ~1,400 SmolLM2 tokens)")
    ap.add_argument("--tokens", type=int, default=128, help="tokens decoded per row")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()

    from transformers import DynamicCache

    import nestor.models.sampler as sampler
    from nestor.models.kv_cache import GrowingCache
    from nestor.policy.lm import LMPolicy

    torch.set_num_threads(args.threads)
    policy = LMPolicy.from_pretrained(args.model, max_new_tokens=args.tokens, lora_rank=8)
    with torch.no_grad():  # a trained-looking adapter: B = 0 would make the LoRA free
        for name, p in policy._model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.01)
    model, tok = policy._model, policy.tokenizer
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(len(tok) // 10, len(tok), (args.prompt,), generator=gen).tolist()
    prompts = [prompt] * args.batch

    class Concatenating:  # the sampler's cache as it was: transformers' DynamicCache
        def __call__(self, reserve: int):
            return DynamicCache()

        def of(self, cache, reserve: int):
            return cache

    def run(variant: str) -> tuple[float, torch.Tensor]:
        policy._set_merged(variant == "after")
        sampler.GrowingCache = GrowingCache if variant == "after" else Concatenating()
        c0 = time.process_time()
        out = sampler.sample(model, prompts, args.tokens, eos_id=-1, pad_id=0, greedy=True,
                             tokenizer=tok)
        return time.process_time() - c0, out.completion_ids

    seconds: dict[str, list[float]] = {"before": [], "after": []}
    ids: dict[str, torch.Tensor] = {}
    for _ in range(args.reps):
        for variant in ("before", "after"):
            s, ids[variant] = run(variant)
            seconds[variant].append(s)
            print(f"{variant}: {s:.1f} CPU-s", flush=True)
    sampler.GrowingCache = GrowingCache
    tokens = args.batch * args.tokens
    per_token = {k: statistics.median(v) / tokens for k, v in seconds.items()}
    print(json.dumps({
        "model": args.model, "batch": args.batch, "prompt_tokens": args.prompt,
        "decoded_tokens": tokens, "threads": args.threads,
        "load_average": round(os.getloadavg()[0], 2),
        "cpu_s_per_token_before": round(per_token["before"], 4),
        "cpu_s_per_token_after": round(per_token["after"], 4),
        "after_over_before": round(per_token["after"] / per_token["before"], 3),
        "same_tokens": bool(torch.equal(ids["before"], ids["after"])),
    }))


if __name__ == "__main__":
    main()
