"""Shared helpers of the sandbox tests."""

import os
import socket
import sys
from contextlib import contextmanager

import pytest

from nestor.sandbox import sandbox_backend

PY = sys.executable


def processes_with(marker: str) -> list[int]:
    """pids whose command line contains marker (leftovers of a sandboxed child)."""
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry.name}/cmdline", "rb") as fh:
                if marker.encode() in fh.read():
                    pids.append(int(entry.name))
        except OSError:
            continue
    return pids


requires_bwrap = pytest.mark.skipif(
    sandbox_backend() != "bubblewrap",
    reason="filesystem isolation needs bubblewrap (apt-get install bubblewrap)")


@contextmanager
def host_listener():
    """A TCP listener on the host's loopback, proved reachable from here (outside any sandbox):
    a sandbox that cannot connect to its port lacks the network, not a route out."""
    server = socket.create_server(("127.0.0.1", 0))
    try:
        port = server.getsockname()[1]
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        yield port
    finally:
        server.close()
