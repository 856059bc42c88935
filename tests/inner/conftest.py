"""Shared by the inner-loop tests."""

import pytest


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """One torch thread: these models are too small to gain from two, and the CI box is shared."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
