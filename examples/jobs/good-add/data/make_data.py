"""Writes train.jsonl: `a+b=` prompts exactly as tested, a and b integers 0-99.

One row in five has a one-digit operand, so carries and short sums both appear often.
Run: python data/make_data.py
"""

import json
import random
from pathlib import Path

ROWS, SEED = 3000, 23


def main() -> None:
    rng = random.Random(SEED)
    seen: set[tuple[int, int]] = set()
    with Path(__file__).with_name("train.jsonl").open("w", encoding="utf-8") as fh:
        while len(seen) < ROWS:
            a = rng.randint(0, 9) if rng.random() < 0.2 else rng.randint(0, 99)
            b = rng.randint(0, 99)
            if (a, b) in seen:
                continue
            seen.add((a, b))
            fh.write(json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)}) + "\n")


if __name__ == "__main__":
    main()
