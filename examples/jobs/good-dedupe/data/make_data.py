"""Writes train.jsonl: prompts in the test's exact format (`dedupe <s>`, one user message).

The test draws 4-7 letters from a-f, so repeats are common; lengths 3-9 from the same
six letters keep that density, with a margin either side.
Duplicates are dropped so no prompt dominates a batch.
Run: python data/make_data.py  (deterministic: same seed, same file)
"""

import json
import random
from pathlib import Path

ROWS, SEED = 2000, 13
ALPHABET = "abcdef"
LENGTHS = [3, 4, 4, 5, 5, 5, 6, 6, 6, 7, 7, 8, 9]  # drawn uniformly from this list


def solve(s: str) -> str:
    return "".join(dict.fromkeys(s))


def main() -> None:
    rng = random.Random(SEED)
    seen: set[str] = set()
    out = Path(__file__).with_name("train.jsonl")
    with out.open("w", encoding="utf-8") as fh:
        while len(seen) < ROWS:
            s = "".join(rng.choice(ALPHABET) for _ in range(rng.choice(LENGTHS)))
            if s in seen:
                continue
            seen.add(s)
            fh.write(json.dumps({"prompt": f"dedupe {s}", "answer": solve(s)}) + "\n")


if __name__ == "__main__":
    main()
