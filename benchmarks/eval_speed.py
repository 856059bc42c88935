"""Hidden-eval scoring speed of the bundled tiny models (target: 200 items of one task in
<= 5 s for tiny-m). Prints one line per model, then one JSON object on the last line.

    .venv/bin/python benchmarks/eval_speed.py [--task reverse] [--n 200] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from nestor.inner.evaluate import score_model
from nestor.models.registry import load_model
from nestor.tasks import TaskRegistry
from nestor.tasks.hidden import hidden_eval


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="reverse")
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    evaluation = hidden_eval(TaskRegistry().get(args.task), n=args.n)
    figures: dict = {"task": args.task, "n": args.n, "threads": args.threads,
                     "max_new_tokens": evaluation.max_new_tokens, "target_s": 5.0}
    for name in ("tiny-s", "tiny-m"):
        model, tok = load_model(name)
        score_model(model, tok, evaluation)  # warm-up (allocator, kernels)
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            result = score_model(model, tok, evaluation)
            times.append(time.perf_counter() - start)
        best = min(times)
        figures[name] = {"seconds": round(best, 3), "items_per_s": round(args.n / best, 1),
                         "accuracy": result.accuracy}
        print(f"{name}: {args.n} items in {best:.2f} s ({args.n / best:.0f} items/s), "
              f"accuracy {result.accuracy:.3f}")
    figures["ok"] = figures["tiny-m"]["seconds"] <= figures["target_s"]
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
