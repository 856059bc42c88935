"""The latency targets the unit tests used to assert (issue 27): there they flaked on a loaded
machine or were loosened until they meant nothing; here they are measured and compared with
their targets. Last line: one JSON object of figures, each with its target and whether it met it.

- sandbox spawn: a sandboxed `python -c pass`, elapsed as the runner reports it (< 2 s: the
  probe runs several children per job);
- endless loop: a sandboxed `while True: pass` under a 1 s wall limit, killed with its
  group (< 3 s);
- printing 4 GiB under a 100 kB output cap: cut and killed (< 5 s);
- a lone caller of the act batcher: served after its 50 ms window (< 1 s).

    .venv/bin/python benchmarks/unit_latency.py [--n 5]

The pool's dispatch overhead and parallel speed-up are benchmarks/pool_scaling.py's, the
straggler's wall clock benchmarks/outer_straggler.py's, the report's benchmarks/report_speed.py's.
"""

import argparse
import json
import sys
import time

from nestor.policy.batching import RequestBatcher
from nestor.sandbox import Limits, run_sandboxed, sandbox_backend

PRINT_4GIB = ("import sys\nblock = b'x' * 2**20\nfor _ in range(4096):\n"
              "    sys.stdout.buffer.write(block)\n")


def spawn() -> float:
    r = run_sandboxed([sys.executable, "-c", "pass"])
    assert r.ok, r
    return r.elapsed_s


def endless_loop() -> float:
    r = run_sandboxed([sys.executable, "-c", "while True: pass"], limits=Limits(wall_s=1.0))
    assert r.timed_out, r
    return r.elapsed_s


def print_gigabytes() -> float:
    r = run_sandboxed([sys.executable, "-c", PRINT_4GIB],
                      limits=Limits(output_bytes=100_000, wall_s=20))
    assert r.truncated and not r.timed_out, r
    return r.elapsed_s


def lone_caller() -> float:
    batcher = RequestBatcher(lambda items: items, window_s=0.05)
    t0 = time.monotonic()
    batcher("a")
    return time.monotonic() - t0


TARGETS = {"sandbox_spawn_s": (spawn, 2.0), "endless_loop_killed_s": (endless_loop, 3.0),
           "print_4gib_cut_s": (print_gigabytes, 5.0), "lone_batch_caller_s": (lone_caller, 1.0)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=5)
    n = ap.parse_args().n
    figures: dict = {"backend": sandbox_backend(), "n": n}
    for name, (fn, target) in TARGETS.items():
        xs = sorted(fn() for _ in range(n))
        worst = xs[-1]
        figures[name] = {"median": round(xs[len(xs) // 2], 3), "max": round(worst, 3),
                         "target": target, "met": worst < target}
        print(f"{name:24s} median {xs[len(xs) // 2]:6.3f} s   max {worst:6.3f} s   "
              f"target < {target} s   {'ok' if worst < target else 'MISSED'}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
