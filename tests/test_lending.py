"""Core lending (:mod:`asyncrl.lending`): the rule, the board between roles, the plan the
orchestrator publishes, and a real run in which the waiting role's cores went to the computing one."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from asyncrl.config import load_config
from asyncrl.lending import (
    Plan,
    Slot,
    ThreadLender,
    granted_threads,
    lending_plan,
    open_board,
    read_board,
)
from helpers import TINY_RUN

TWO = Plan(cores=2, lend_after_s=0.25, poll_s=0.05)
POLL_S = TWO.poll_s


@pytest.fixture
def restore_threads() -> Iterator[None]:
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def test_a_role_computing_alone_gets_every_core() -> None:
    now = 100.0
    assert granted_threads("trainer", {}, now, TWO, own=1) == 2
    waited = {"rollout-0": Slot(computing=False, since=now - 1.0)}
    assert granted_threads("trainer", waited, now, TWO, own=1) == 2


def test_a_role_shares_with_computing_roles_and_recent_waiters() -> None:
    now = 100.0
    assert granted_threads("trainer", {"rollout-0": Slot(True, now - 9)}, now, TWO, own=1) == 1
    # a gap shorter than lend_after_s (between two model turns) is not lent
    assert granted_threads("trainer", {"rollout-0": Slot(False, now - 0.1)}, now, TWO, own=1) == 1
    # its own slot does not count twice; its pinned threads are a floor (sync mode's solo trainer)
    board = {"trainer": Slot(True, now), "rollout-0": Slot(True, now)}
    assert granted_threads("trainer", board, now, TWO, own=2) == 2
    four = Plan(cores=4, lend_after_s=0.25, poll_s=POLL_S)
    board = {"rollout-0": Slot(True, now), "rollout-1": Slot(False, now - 5), "evaluator": Slot(True, now)}
    assert granted_threads("trainer", board, now, four, own=1) == 1  # 3 holders of 4 cores
    del board["evaluator"]
    assert granted_threads("trainer", board, now, four, own=1) == 2


def test_lenders_hand_cores_back_and_forth_through_the_board(tmp_path: Path, restore_threads: None) -> None:
    """Two roles in one process (two lenders): the trainer borrows while the worker waits, gives the
    core back once the worker computes, and counts the thread-seconds it borrowed."""
    open_board(tmp_path, Plan(cores=2, lend_after_s=0.0, poll_s=POLL_S))
    trainer = ThreadLender.join(tmp_path, "trainer", own=1)
    worker = ThreadLender.join(tmp_path, "rollout-0", own=1)
    assert trainer is not None and worker is not None
    worker.poll()
    trainer.poll()
    assert torch.get_num_threads() == 1 and read_board(tmp_path)["rollout-0"].computing
    worker.waiting()
    time.sleep(POLL_S + 0.01)
    trainer.poll()
    assert torch.get_num_threads() == 2 and trainer.threads == 2
    time.sleep(0.2)
    worker.poll()  # the worker computes again: its next poll already had its share
    time.sleep(POLL_S + 0.01)
    trainer.poll()
    assert torch.get_num_threads() == 1
    borrowed = trainer.figures().borrowed_thread_seconds
    assert 0.2 <= borrowed < 1.0, borrowed
    time.sleep(0.1)  # not borrowing: the count stands still
    assert trainer.figures().borrowed_thread_seconds == borrowed


def test_the_thread_count_is_set_in_the_thread_that_computes(tmp_path: Path, restore_threads: None) -> None:
    """torch's thread count is per OS thread: the worker generates in a pool thread, so its lender sets
    the count there, whatever the main thread has."""
    open_board(tmp_path, Plan(cores=2, lend_after_s=0.0, poll_s=POLL_S))
    worker = ThreadLender.join(tmp_path, "rollout-0", own=1)
    assert worker is not None
    torch.set_num_threads(1)
    seen: list[int] = []

    def generate() -> None:
        worker.poll()
        seen.append(torch.get_num_threads())

    th = threading.Thread(target=generate)
    th.start()
    th.join()
    assert seen == [2]


def test_a_lender_that_does_not_borrow_only_holds_its_core(tmp_path: Path, restore_threads: None) -> None:
    open_board(tmp_path, TWO)
    evaluator = ThreadLender.join(tmp_path, "evaluator", own=1, borrow=False)
    assert evaluator is not None
    evaluator.computing()
    evaluator.poll()
    assert torch.get_num_threads() == 1 and read_board(tmp_path)["evaluator"].computing
    trainer = ThreadLender.join(tmp_path, "trainer", own=1)
    assert trainer is not None
    trainer.poll()
    assert torch.get_num_threads() == 1  # the evaluator holds its core while it evaluates


def test_the_hooks_poll_before_each_decoder_layer(tmp_path: Path, restore_threads: None) -> None:
    from asyncrl.config import ModelConfig
    from asyncrl.policy import Policy

    policy = Policy.build(ModelConfig(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1))
    open_board(tmp_path, TWO)
    lender = ThreadLender.join(tmp_path, "trainer", own=1)
    assert lender is not None
    polls: list[float] = []
    lender.poll = lambda: polls.append(1.0)  # type: ignore[method-assign]
    lender.attach(policy.model)
    policy.model(torch.tensor([[1, 2, 3]]))
    assert len(polls) == 2


def test_joining_with_a_model_attaches_the_hooks(tmp_path: Path, restore_threads: None) -> None:
    """How the trainer and the rollout workers join: ``models=`` attaches (none without a plan)."""
    from asyncrl.config import ModelConfig
    from asyncrl.policy import Policy

    policy = Policy.build(ModelConfig(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1))
    assert ThreadLender.join(tmp_path, "trainer", own=1, models=[policy.model]) is None  # lending off
    open_board(tmp_path, TWO)
    lender = ThreadLender.join(tmp_path, "trainer", own=1, models=[policy.model])
    assert lender is not None
    polls: list[float] = []
    lender.poll = lambda: polls.append(1.0)  # type: ignore[method-assign]
    policy.model(torch.tensor([[1, 2, 3]]))
    assert len(polls) == 2


def test_a_worker_polls_at_every_decode_step_of_a_merged_fused_engine(
    tmp_path: Path, restore_threads: None
) -> None:
    """A LoRA policy is sampled from a merged copy through the fused decode step, neither of which is
    the policy's model: the worker joins with what the engine runs, so it polls (announces computing,
    takes its grant) in the prefill and at every decode step. Joined with the policy's model, as before,
    it polled never, and a waiting trainer borrowed the busy worker's core."""
    from asyncrl.engine.cpu.fused import FusedForward
    from asyncrl.records import SamplingParams
    from test_engine import hf_engine, tiny_lora

    engine = hf_engine(tiny_lora(), [], merge_lora=True, packed_linear=True, fused_decode=True)
    modules = engine.compute_modules()
    assert isinstance(engine.forward, FusedForward)
    assert engine.forward.fused in modules and engine.policy.model not in modules
    open_board(tmp_path, TWO)
    lender = ThreadLender.join(tmp_path, "rollout-0", own=1, models=modules)
    assert lender is not None
    polls: list[float] = []
    lender.poll = lambda: polls.append(1.0)  # type: ignore[method-assign]
    new_tokens = 6
    engine.generate([[1, 2, 3], [4, 5]], SamplingParams(max_new_tokens=new_tokens, temperature=1.0))
    layers = engine.policy.model.config.num_hidden_layers
    # the prefill through the merged copy, then new_tokens - 1 fused decode steps: a poll per layer each
    # (the fused step's hooks missing: the prefill's alone; the policy's model: none)
    assert len(polls) >= layers * new_tokens, len(polls)


def test_the_plan_applies_to_local_cpu_runs_with_cores_to_share(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    plan = lending_plan(load_config(None, ["model.device=cpu", "launcher.lend_threads=true"]))
    assert plan == TWO
    assert lending_plan(load_config(None, ["model.device=cpu"])) is None  # off by default
    assert (
        lending_plan(
            load_config(None, ["model.device=cpu", "launcher.lend_threads=true", "trainer.world_size=2"])
        )
        is None
    )
    assert lending_plan(load_config(None, ["model.device=cpu", "launcher.kind=ray"])) is None
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # a shared machine says one core: said, not silent
    assert lending_plan(load_config(None, ["model.device=cpu", "launcher.lend_threads=true"])) is None
    assert "one usable core" in caplog.text


def test_without_a_plan_no_role_lends(tmp_path: Path) -> None:
    open_board(tmp_path, TWO)
    open_board(tmp_path, None)  # a resumed run with lending now off
    assert ThreadLender.join(tmp_path, "trainer", own=1) is None


@pytest.mark.slow
def test_in_sync_mode_the_rollout_worker_borrows_the_waiting_trainers_core(
    tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real run (tiny model, ``sync``): the trainer waits while the batch is generated, so the rollout
    worker generates on both cores; the trainer (alone by the barrier) never needs to borrow."""
    from asyncrl.jobs.train import train

    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # the machine's 2 cores, whatever the test runner says
    cfg = load_config(
        None,
        [
            *TINY_RUN,
            "env.kind=calculator",
            "env.heldout_size=16",
            "trainer.batch_size=32",
            "trainer.total_steps=3",
            "control.mode=sync",
            "telemetry.eval_every=0",
            "launcher.lend_threads=true",
            "launcher.lend_after_ms=0",  # lend from the first wait: a tiny model's batch takes ~1 s
            f"run_root={tmp_path}",
            f"cache_dir={cache_dir}",
        ],
    )
    _, s = train(cfg, display=False, eval_limit=8)
    assert s["trainer_steps"] == 3 and s["lost_trajectories"] == 0
    assert s["threads_borrowed_by"]["rollout-0"] >= 0.2, s["threads_borrowed_by"]
    assert s["threads_borrowed_by"]["trainer"] == 0.0
    assert s["threads_lent_seconds"] == pytest.approx(sum(s["threads_borrowed_by"].values()), abs=0.11)


def _spin_share(idle: bool) -> tuple[float, float, int]:
    """Two forked children pinned to one core spin for the same second, released together by one
    pipe; the first lowers its priority as the evaluator does (:func:`yield_cpu`). Returns both
    children's CPU seconds and the first one's scheduling policy."""
    import os

    from asyncrl.rollout.evaluator import yield_cpu

    core = min(os.sched_getaffinity(0))
    go_r, go_w = os.pipe()
    reads: list[int] = []
    pids = []
    for lowered in (True, False):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: pin, lower or not, wait for the start, spin a second, report
            code = 1
            try:
                os.close(r)
                os.sched_setaffinity(0, {core})
                if lowered:
                    yield_cpu(5, idle=idle)
                os.read(go_r, 1)
                cpu0, end = time.process_time(), time.time() + 1.0
                while time.time() < end:
                    pass
                os.write(w, f"{time.process_time() - cpu0} {os.sched_getscheduler(0)}".encode())
                code = 0
            finally:
                os._exit(code)  # never back into pytest
        os.close(w)
        reads.append(r)
        pids.append(pid)
    time.sleep(0.3)  # both pinned and lowered
    os.write(go_w, b"gg")  # one byte each: both start at once
    out = []
    for r, pid in zip(reads, pids, strict=True):
        _, status = os.waitpid(pid, 0)
        assert status == 0, "a spinning child failed"
        out.append(os.read(r, 100).decode().split())
        os.close(r)
    os.close(go_r)
    os.close(go_w)
    return float(out[0][0]), float(out[1][0]), int(out[0][1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SCHED_IDLE is Linux's")
def test_the_idle_evaluator_computes_only_on_a_core_nobody_else_wants() -> None:
    import os

    assert os.sched_getscheduler(0) == os.SCHED_OTHER  # the test's own processes: the default policy
    lowered, normal, policy = _spin_share(idle=True)
    assert policy == os.SCHED_IDLE
    assert lowered < 0.05 * normal, (lowered, normal)  # measured: 0.4-0.5 % of the core
    lowered, normal, policy = _spin_share(idle=False)  # nice 5 alone still takes about a quarter of it
    assert policy == os.SCHED_OTHER and 0.15 * normal < lowered < 0.6 * normal, (lowered, normal)
