"""Fixtures shared by several test files (plain helper functions and constants: ``helpers.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """torch on one thread for the test (exact, repeatable numerics; no fight over the 2 CPU cores).

    A file opts in with ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``.
    """
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``cache_dir`` of the suite's runs: a warm start is built once per configuration (its directory
    is keyed by a hash of what it depends on, ``jobs.warm_start.warm_start_key``) and shared by every
    test file that trains that configuration."""
    return tmp_path_factory.mktemp("cache")
