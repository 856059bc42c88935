"""The validation probe's memory estimate against the trainer's measured peak RSS.

Runs `nestor job train` under `/usr/bin/time -v` on variants of an example job (its config
changed, optionally its prompts lengthened) and prints, per variant, the estimate
(nestor.job.memory) and the measured maximum resident set size. The last line is JSON.

    .venv/bin/python benchmarks/memory_estimate.py [--steps 3]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from nestor.job.config import load_job_config
from nestor.job.memory import MIB, TEMPLATE_TOKENS, estimate, model_shape

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "jobs"
NESTOR = Path(sys.executable).with_name("nestor")

# (name, example job, task, config changes, characters of filler put before each prompt)
VARIANTS = [
    ("good-length as is", "good-length", "length", {}, 0),
    ("reverse 64x16, 24 new", "good-reverse", "reverse", {"prompts_per_step": 64,
                                                          "group_size": 16,
                                                          "max_new_tokens": 24}, 0),
    ("length 32x16, 400-char prompts", "good-length", "length", {"prompts_per_step": 32,
                                                                 "group_size": 16}, 400),
]


def _variant(src: Path, dst: Path, changes: dict, filler: int, steps: int) -> None:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
    text = (dst / "config.toml").read_text()
    for key, value in {**changes, "max_steps": steps}.items():
        text = re.sub(rf"(?m)^{key} = .*$", "", text) + f"{key} = {value}\n"
    (dst / "config.toml").write_text(text)
    if filler:
        pad = ("note: read the whole request. " * (filler // 30 + 1))[:filler]
        data = dst / "data" / "train.jsonl"
        rows = [json.loads(line) for line in data.read_text().splitlines() if line.strip()]
        data.write_text("".join(json.dumps({**r, "prompt": pad + r["prompt"]}) + "\n"
                                for r in rows))


def _longest_prompt(job: Path) -> int:
    rows = (job / "data" / "train.jsonl").read_text().splitlines()
    return max(len(json.loads(r)["prompt"]) for r in rows if r.strip()) + TEMPLATE_TOKENS


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, example, task, changes, filler in VARIANTS:
            job = Path(tmp) / f"job{len(results)}"
            _variant(EXAMPLES / example, job, changes, filler, args.steps)
            config = load_job_config(job / "config.toml")
            est = estimate(config, model_shape(config.base_model), _longest_prompt(job))
            done = subprocess.run(["/usr/bin/time", "-v", str(NESTOR), "job", "train", str(job),
                                   "--task", task, "--memory-cap", "1000000", "--json",
                                   "--skip-validation", "--out", str(job) + "-out"], capture_output=True, text=True)
            rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr)
            measured = int(rss.group(1)) * 1024 if rss else None
            status = json.loads(done.stdout)["status"] if done.stdout.strip() else "crashed"
            row = {"variant": name, "status": status,
                   "estimate_mib": round(est.peak / MIB),
                   "measured_mib": None if measured is None else round(measured / MIB),
                   "ratio": None if not measured else round(est.peak / measured, 2),
                   "parts_mib": {k: round(v / MIB) for k, v in est.parts.items()}}
            results.append(row)
            print(f"{name}: estimate {row['estimate_mib']} MiB, measured peak RSS "
                  f"{row['measured_mib']} MiB (x{row['ratio']}), {status}", flush=True)
    print(json.dumps({"steps": args.steps, "results": results,
                      "estimate_never_low": all(r["ratio"] and r["ratio"] >= 1 for r in results)}))


if __name__ == "__main__":
    main()
