"""Shared test setup: keep torch to the 2 cores we have and caches out of $HOME."""

import os

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Each test session gets its own nestor cache (pre-scores, cost matrix)."""
    cache = tmp_path_factory.getbasetemp() / "nestor-cache"
    monkeypatch.setenv("NESTOR_CACHE", str(cache))
