"""Writes train.jsonl: `len <s>` prompts as tested; s is 1-11 letters a-z (tested: 2-9), every
length equally often, so the model cannot win by guessing the commonest count.
Run: python data/make_data.py
"""

import json
import random
import string
from pathlib import Path

ROWS, SEED = 2000, 29


def main() -> None:
    rng = random.Random(SEED)
    seen: set[str] = set()
    with Path(__file__).with_name("train.jsonl").open("w", encoding="utf-8") as fh:
        while len(seen) < ROWS:
            n = rng.randint(1, 11)
            s = "".join(rng.choice(string.ascii_lowercase) for _ in range(n))
            if s in seen:
                continue
            seen.add(s)
            fh.write(json.dumps({"prompt": f"len {s}", "answer": str(n)}) + "\n")


if __name__ == "__main__":
    main()
