"""Writes train.jsonl: `vowels <s>` prompts as tested; s is 1-11 letters a-z (tested: 2-9),
half of its letters drawn from the vowels so that counts 0-6 are all common and the model
cannot win by guessing the commonest count.
Run: python data/make_data.py
"""

import json
import random
import string
from pathlib import Path

ROWS, SEED = 2000, 31
VOWELS = "aeiou"


def main() -> None:
    rng = random.Random(SEED)
    seen: set[str] = set()
    with Path(__file__).with_name("train.jsonl").open("w", encoding="utf-8") as fh:
        while len(seen) < ROWS:
            n = rng.randint(1, 11)
            s = "".join(rng.choice(VOWELS if rng.random() < 0.5 else string.ascii_lowercase)
                        for _ in range(n))
            if s in seen:
                continue
            seen.add(s)
            answer = sum(c in VOWELS for c in s)
            fh.write(json.dumps({"prompt": f"vowels {s}", "answer": str(answer)}) + "\n")


if __name__ == "__main__":
    main()
