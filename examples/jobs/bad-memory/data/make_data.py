"""Writes train.jsonl: `reverse <s>` behind a ~1,000-character preamble (the mistake: with
256 prompts × 64 samples, every rollout's KV cache spans the whole preamble).

Lengths 2-8 cover the tested 3-6 with a margin either side; letters are uniform a-z, repeats
allowed, like the test. Duplicates are dropped so no prompt dominates a batch.
Run: python data/make_data.py  (deterministic: same seed, same file)
"""

import json
import random
import string
from pathlib import Path

ROWS, SEED = 300, 7
PREAMBLE = ("Read the whole request carefully before you answer, letter by letter. " * 15)[:1000]


def main() -> None:
    rng = random.Random(SEED)
    seen: set[str] = set()
    out = Path(__file__).with_name("train.jsonl")
    with out.open("w", encoding="utf-8") as fh:
        while len(seen) < ROWS:
            s = "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.choice(
                [2, 3, 3, 4, 4, 4, 5, 5, 5, 6, 6, 7, 8])))
            if s in seen:
                continue
            seen.add(s)
            fh.write(json.dumps({"prompt": f"{PREAMBLE} reverse {s}", "answer": s[::-1]}) + "\n")


if __name__ == "__main__":
    main()
