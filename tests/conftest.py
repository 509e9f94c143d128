"""Fixtures shared by several test files (plain helper functions and constants: ``helpers.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

SERIAL = {
    # runs of roles (trainers, rollout workers, evaluators, launchers, Ray, torch.distributed ranks),
    # processes killed or timed, and figures of wall time or memory: run alone, after the rest
    "test_control_e2e.py",
    "test_credit_e2e.py",
    "test_distributed.py",
    "test_envs_answers_e2e.py",
    "test_envs_class_e2e.py",
    "test_envs_ecosystem_e2e.py",
    "test_envs_mix_e2e.py",
    "test_faults.py",
    "test_gateway_e2e.py",
    "test_gpu_suite.py",
    "test_lending.py",
    "test_models_e2e.py",
    "test_observe_e2e.py",
    "test_ray_cluster.py",
    "test_ray_launcher.py",
    "test_recover.py",
    "test_roles_as_services.py",
    "test_runtime_e2e.py",
    "test_sandbox.py",
    "test_security.py",
    "test_signal.py",
    "test_state_store.py",
    "test_stop.py",
    "test_transport.py",
    "test_weights.py",
}
"""Test files marked ``serial``: ``make unit`` runs the others on two xdist workers first, then these
alone (``tests/test_architecture.py`` checks every ``*_e2e.py`` file is here). A file whose tests mostly
compute in-process stays out, and its few tests that must run alone carry ``@pytest.mark.serial``."""


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """The serial pass of ``make unit`` (a mark expression ending in ``and serial``) imports only the
    test files that can hold a serial test — those in :data:`SERIAL` and those whose text marks one
    (``mark.serial``) — instead of all ~85 (torch, hypothesis, openai, the gateway's stack: a quarter
    of the pass's collection time). The tests selected are the same: the others would be deselected."""
    expr = (config.option.markexpr or "").strip()
    name = collection_path.name
    if not (expr == "serial" or expr.endswith(" and serial")):
        return None
    if collection_path.suffix != ".py" or not name.startswith("test_") or name in SERIAL:
        return None
    return True if "mark.serial" not in collection_path.read_text(encoding="utf-8") else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name in SERIAL:
            item.add_marker(pytest.mark.serial)


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


@pytest.fixture
def role_server_started() -> None:
    """The suite's role server up before the test (its one-off preload, ~2–4 s of imports, is then not
    inside the test's run): what every test after the suite's first run sees, for a test run alone. A
    test that reconciles a run's wall time with its roles' lifetimes asks for it."""
    from multiprocessing import forkserver

    from asyncrl.config import LocalLauncherConfig
    from asyncrl.launch.local import role_context

    if (
        role_context(LocalLauncherConfig().start).get_start_method() == "forkserver"
    ):  # sets the preload list the server reads
        forkserver.ensure_running()


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``cache_dir`` of the suite's runs: a warm start is built once per configuration (its directory
    is keyed by a hash of what it depends on, ``jobs.warm_start.warm_start_key``) and shared by every
    test file that trains that configuration."""
    return tmp_path_factory.mktemp("cache")
