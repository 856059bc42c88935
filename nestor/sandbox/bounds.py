"""One memory and CPU bound for a sandbox as a whole (all its processes together).

rlimits are per process: a job that forks N spinners gets N × cpu_s of CPU and N × memory_mb
of address space. cgroup v2 would bound the group in the kernel, but needs a delegated,
writable cgroup2 hierarchy with the memory and cpu controllers, which hybrid-cgroup hosts and
most containers do not give us; this watchdog works everywhere. One thread scans /proc every
POLL_S seconds and, for every sandbox it watches, sums over the sandbox's processes (every
descendant of the launched child: with bubblewrap, orphans are re-parented to the pid
namespace's init, which is one of them):
- CPU: utime + stime + cutime + cstime (the last two hold the CPU of reaped children, so a
  process that exits does not take its CPU with it);
- memory: proportional set size (Pss, /proc/PID/smaps_rollup), so pages shared copy-on-write
  between a zygote and its child count once.
A sandbox that serves one job after another (the job host) calls `rebase` when a job starts:
its CPU bound then counts that job only. Past either bound the sandbox is killed (its process group, and so its pid namespace) and the
reason is recorded for the error message. A bound is checked at most POLL_S late: a memory
spike between two scans is caught by the per-process RLIMIT_AS instead.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

POLL_S = 1.0  # a scan reads every /proc/PID/stat: ~5-25 ms, so not more often
_TICK = os.sysconf("SC_CLK_TCK")


@dataclass
class Watch:
    root: int  # pid of the launched child (prlimit, exec'd into bwrap)
    cpu_s: float
    memory_mb: int
    on_breach: Callable[[str], None]
    cpu_used_s: float = 0.0
    memory_used_mb: float = 0.0
    breached: str | None = None
    _peak_cpu: float = field(default=0.0, repr=False)
    _base_cpu: float = field(default=0.0, repr=False)  # CPU before the current job (rebase)


class Watchdog:
    """A single daemon thread watching every live sandbox of this process."""

    def __init__(self, poll_s: float = POLL_S) -> None:
        self.poll_s = poll_s
        self._watches: dict[int, Watch] = {}
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None

    def watch(self, root: int, cpu_s: float, memory_mb: int,
              on_breach: Callable[[str], None]) -> Watch:
        w = Watch(root, cpu_s, memory_mb, on_breach)
        with self._lock:
            self._watches[root] = w
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="nestor-sandbox-bounds",
                                                daemon=True)
                self._thread.start()
            self._wake.notify()
        return w

    def unwatch(self, w: Watch) -> None:
        with self._lock:
            if self._watches.get(w.root) is w:
                del self._watches[w.root]

    def rebase(self, w: Watch) -> None:
        """Count CPU from now on: a host that serves one job after another is bound per job
        (its reaped jobs' CPU stays in its cutime). Memory stays a whole-sandbox bound."""
        table = _process_table()
        cpu = sum(table[p][1] for p in _descendants(w.root, table) if p in table)
        with self._lock:
            w._peak_cpu = max(w._peak_cpu, cpu)
            w._base_cpu = w._peak_cpu
            w.cpu_used_s = 0.0

    def check_now(self) -> None:
        """One scan (the thread's body; tests call it to avoid waiting)."""
        with self._lock:
            watches = list(self._watches.values())
        if not watches:
            return
        table = _process_table()
        for w in watches:
            pids = _descendants(w.root, table)
            cpu = sum(table[p][1] for p in pids if p in table)
            # cutime of a dead parent is lost with it: keep the peak seen, never go down.
            w._peak_cpu = max(w._peak_cpu, cpu)
            w.cpu_used_s = w._peak_cpu - w._base_cpu
            w.memory_used_mb = sum(_pss_kb(p) for p in pids) / 1024
            why = None
            if w.cpu_used_s > w.cpu_s:
                why = (f"used {w.cpu_used_s:.0f} s of CPU over all its processes (the "
                       f"sandbox's bound is {w.cpu_s:g} s; background processes count)")
            elif w.memory_used_mb > w.memory_mb:
                why = (f"used {w.memory_used_mb:.0f} MiB over all its processes (the "
                       f"sandbox's bound is {w.memory_mb} MiB)")
            if why and w.breached is None:
                w.breached = why
                self.unwatch(w)
                with contextlib.suppress(Exception):
                    w.on_breach(why)

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._watches:
                    self._wake.wait()
            self.check_now()
            with self._lock:
                self._wake.wait(timeout=self.poll_s)


WATCHDOG = Watchdog()


def _process_table() -> dict[int, tuple[int, float]]:
    """{pid: (ppid, cpu seconds incl. reaped children)} of every process we can read."""
    table = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as fh:
                raw = fh.read()
        except OSError:
            continue
        # comm (field 2) may hold spaces and parentheses: split after its last ')'
        fields = raw[raw.rfind(b")") + 2:].split()
        try:
            ppid = int(fields[1])
            ticks = sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
        except (IndexError, ValueError):
            continue
        table[int(entry.name)] = (ppid, ticks / _TICK)
    return table


def _descendants(root: int, table: dict[int, tuple[int, float]]) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    out, stack = [], [root] if root in table else []
    while stack:
        pid = stack.pop()
        out.append(pid)
        stack.extend(children.get(pid, ()))
    return out


def _pss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as fh:
            for line in fh:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0
