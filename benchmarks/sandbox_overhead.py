"""Cost of the sandbox: start-up of a sandboxed interpreter vs a plain one, the round trip
of one JSON-lines request to a SandboxedProcess, and one scan of the whole-sandbox bounds'
watchdog (every second while sandboxes live). Last line: one JSON object of figures.

    .venv/bin/python benchmarks/sandbox_overhead.py [--n 20]
"""

import argparse
import json
import subprocess
import sys
import time

from nestor.sandbox import SandboxedProcess, run_sandboxed, sandbox_backend
from nestor.sandbox.bounds import WATCHDOG

ECHO = "import sys\nfor line in sys.stdin:\n    sys.stdout.write(line); sys.stdout.flush()\n"


def percentiles(xs: list[float]) -> tuple[float, float]:
    xs = sorted(xs)
    return xs[len(xs) // 2], xs[min(len(xs) - 1, round(0.95 * (len(xs) - 1)))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20)
    n = ap.parse_args().n
    sandbox_backend()  # probe once, outside the timings
    plain, boxed = [], []
    for _ in range(n):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        plain.append(time.perf_counter() - t)
        t = time.perf_counter()
        assert run_sandboxed([sys.executable, "-c", "pass"]).ok
        boxed.append(time.perf_counter() - t)
    rtt, scan = [], []
    with SandboxedProcess([sys.executable, "-c", ECHO]) as proc:
        for i in range(n * 10):
            t = time.perf_counter()
            proc.request({"i": i, "completion": "x" * 2000})
            rtt.append(time.perf_counter() - t)
        for _ in range(n):
            t = time.perf_counter()
            WATCHDOG.check_now()
            scan.append(time.perf_counter() - t)
    figures = {"backend": sandbox_backend(), "n": n}
    for name, xs in [("plain_start_s", plain), ("sandboxed_start_s", boxed),
                     ("request_rtt_s", rtt), ("bounds_scan_s", scan)]:
        p50, p95 = percentiles(xs)
        figures[name] = {"p50": round(p50, 4), "p95": round(p95, 4)}
        print(f"{name:20s} p50 {p50 * 1000:7.1f} ms   p95 {p95 * 1000:7.1f} ms")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
