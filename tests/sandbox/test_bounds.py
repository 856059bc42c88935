"""The whole-sandbox bound's watchdog (bounds.py): `rebase` makes the CPU bound count from now."""

import subprocess

from sandbox_helpers import PY

from nestor.sandbox.bounds import Watchdog

BURN = ("import time\nt = time.process_time()\nwhile time.process_time() - t < 1.2: pass\n"
        "print('burnt', flush=True)\ntime.sleep(60)")


def test_rebase_counts_cpu_from_now_on():
    proc = subprocess.Popen([PY, "-c", BURN], stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == b"burnt\n"
        breaches: list[str] = []
        plain, rebased = Watchdog(poll_s=3600), Watchdog(poll_s=3600)
        # a high bound while their threads make their first scan; the real one set below
        a = plain.watch(proc.pid, 1000.0, 1 << 20, breaches.append)
        b = rebased.watch(proc.pid, 1000.0, 1 << 20, breaches.append)
        rebased.rebase(b)  # e.g. the job host opening its next job
        a.cpu_s = b.cpu_s = 1.0
        plain.check_now()
        rebased.check_now()
        assert a.breached and "1 s of CPU" in a.breached and len(breaches) == 1
        assert b.breached is None and b.cpu_used_s < 0.5
    finally:
        proc.kill()
        proc.wait()
