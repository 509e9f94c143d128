"""Hostile code in the python sandbox: each attack returns a clean error and leaves the host intact.

The full guarantees need root (privilege drop, namespaces); the project's CI runs as root.
Each test bounds its own wall time, and every test checks that no process of the run survives.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from asyncrl.envs.sandbox import SandboxLimits, SandboxResult, run_python_sync, sandbox_support

LIMITS = SandboxLimits(cpu_seconds=1, wall_seconds=4.0, memory_bytes=256 * 2**20, max_processes=12)
IS_ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not IS_ROOT, reason="full sandbox guarantees need root")


@pytest.fixture(scope="module", autouse=True)
def _isolation_available() -> None:
    if IS_ROOT:
        probe = sandbox_support(LIMITS)
        assert probe.ok, probe
        assert set(probe.isolation) == {"uid", "net", "fs"}, probe


def our_processes() -> list[int]:
    """Live processes of any uid in the sandbox pool (one /proc pass)."""
    pids: list[int] = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                status = Path(f"/proc/{entry.name}/status").read_text()
            except OSError:
                continue
            fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            uid = int(fields.get("Uid", "0").split()[0])
            state = fields.get("State", "").split()
            if LIMITS.uid_base <= uid < LIMITS.uid_base + LIMITS.uid_count and state[:1] != ["Z"]:
                pids.append(int(entry.name))
    return pids


def run(code: str, limit_s: float, limits: SandboxLimits = LIMITS) -> SandboxResult:
    started = time.monotonic()
    result = run_python_sync(code, limits)
    elapsed = time.monotonic() - started
    assert elapsed < limit_s, f"took {elapsed:.1f}s"
    assert result.leftover_pids == []
    if IS_ROOT:
        assert our_processes() == []
    assert result.summary().isascii() and len(result.summary()) <= 200
    return result


@pytest.fixture
def secret_file(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    d = tmp_path_factory.mktemp("secret")
    os.chmod(d, 0o700)
    f = d / "secret.txt"
    f.write_text("top secret")
    os.chmod(f, 0o600)
    yield f


def test_normal_code_runs() -> None:
    r = run("print(sum(i*i for i in range(1, 8)))", 5)
    assert r.ok and r.stdout.strip() == "140" and r.summary() == "140"


def test_infinite_loop_is_stopped() -> None:
    r = run("while True: pass", 8)
    assert not r.ok and r.error in ("cpu_limit", "timeout")
    assert r.summary().startswith("error:")


def test_sleeping_code_hits_the_wall_limit() -> None:
    limits = LIMITS.model_copy(update={"wall_seconds": 1.0})
    r = run("import time\ntime.sleep(60)", 5, limits)
    assert r.error == "timeout" and r.summary() == "error: timeout (wall limit 1s)"


@needs_root
def test_fork_bomb_is_contained() -> None:
    r = run("import os\nwhile True: os.fork()", 10)
    assert not r.ok
    assert "Resource temporarily unavailable" in r.summary() or r.error in ("timeout", "cpu_limit")


@needs_root
def test_fork_and_setsid_escape_is_still_killed() -> None:
    code = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\nprint('parent exits')"
    r = run(code, 6)
    assert r.ok and r.stdout.strip() == "parent exits"


def test_huge_allocation_fails_cleanly() -> None:
    r = run("x = bytearray(10**11)", 5)
    assert r.summary() == "error: MemoryError"
    r = run("chunks = []\nwhile True: chunks.append(bytearray(10**7))", 8)
    assert not r.ok and ("MemoryError" in r.summary() or r.error in ("timeout", "cpu_limit", "killed"))


@needs_root
def test_writes_outside_the_temp_dir_fail(tmp_path: Path) -> None:
    repo = Path(__file__).resolve().parent.parent
    targets = ["/tmp/pwned", str(repo / "pwned.txt"), "/dev/shm/pwned", "/var/tmp/pwned", str(tmp_path / "x")]
    os.chmod(tmp_path, 0o777)  # even a world-writable host dir is read-only inside
    code = "import sys\nok = []\n"
    for t in targets:
        code += f"try:\n    open({t!r}, 'w').write('x'); ok.append({t!r})\nexcept OSError: pass\n"
    code += "open('inside.txt', 'w').write('fine')\nprint(ok, open('inside.txt').read())"
    r = run(code, 5)
    assert r.ok and r.stdout.strip() == "[] fine"
    for t in targets:
        assert not os.path.exists(t), t


@needs_root
def test_reading_root_private_files_fails(secret_file: Path) -> None:
    r = run(f"print(open({str(secret_file)!r}).read())", 5)
    assert not r.ok and "PermissionError" in r.summary()
    r = run(f"import os\nprint(os.listdir({str(secret_file.parent)!r}))", 5)
    assert not r.ok and "PermissionError" in r.summary()


@needs_root
def test_network_is_unreachable() -> None:
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        for target in (6379, port):
            code = f"import socket\ns = socket.socket()\ns.settimeout(2)\ns.connect(('127.0.0.1', {target}))\nprint('connected')"
            r = run(code, 6)
            assert not r.ok and "connected" not in r.stdout
            assert "unreachable" in r.summary().lower() or "refused" in r.summary().lower()
    finally:
        server.close()


def test_output_flood_is_cut() -> None:
    r = run("while True: print('x' * 1000)", 6)
    assert r.error == "output_limit" and r.summary() == "error: output too long"
    assert len(r.stdout) <= LIMITS.max_output_bytes


def test_stdin_is_closed_and_environment_is_clean() -> None:
    code = "import os, sys\nprint(repr(sys.stdin.read()), sorted(k for k in os.environ if 'proxy' in k.lower()), sys.flags.isolated)"
    r = run(code, 5)
    assert r.ok and r.stdout.strip() == "'' [] 1"


def test_bad_code_inputs_are_rejected_before_running() -> None:
    assert run("print(1)\x00", 2).error == "bad_code"
    assert run("x" * (LIMITS.max_code_chars + 1), 2).error == "bad_code"
    syntax = run("def (", 5)
    assert syntax.summary().startswith("error: SyntaxError")


def test_output_up_to_the_cap_is_fine() -> None:
    limits = LIMITS.model_copy(update={"max_output_bytes": 1000})
    r = run("import sys\nsys.stdout.write('y' * 1000)", 5, limits)
    assert r.ok and len(r.stdout) == 1000


def test_concurrent_runs_do_not_interfere() -> None:
    import asyncio

    from asyncrl.envs.sandbox import run_python

    async def go() -> list[SandboxResult]:
        codes = [f"import os\nprint({i} * 2, os.getuid())" for i in range(6)]
        codes.append("while True: pass")  # a neighbour hogging CPU
        return await asyncio.gather(*(run_python(c, LIMITS) for c in codes))

    results = asyncio.run(go())
    assert [r.stdout.split()[0] for r in results[:6]] == [str(i * 2) for i in range(6)]
    if IS_ROOT:
        assert len({r.stdout.split()[1] for r in results[:6]}) == 6  # one uid per run
        assert our_processes() == []


def test_guard_timeout_during_a_sandbox_run_leaves_no_process() -> None:
    import asyncio

    from asyncrl.config import GuardConfig
    from asyncrl.envs import GuardedEnv, PythonEnv
    from asyncrl.records import Task

    env = GuardedEnv(PythonEnv(SandboxLimits(wall_seconds=20.0)), GuardConfig(step_timeout_s=0.5, retries=0))
    task = Task(id="t", task_type="sum_squares", difficulty=1, payload={"prompt": "p", "answer": "1"})

    async def go() -> str:
        await env.reset(task)
        res = await env.step("<tool>python(import time; time.sleep(30))</tool>")
        await asyncio.sleep(0.5)  # the abandoned run cleans up while the loop lives on
        return res.fault.kind  # type: ignore[union-attr]

    started = time.monotonic()
    assert asyncio.run(go()) == "timeout"
    assert time.monotonic() - started < 5
    if IS_ROOT:
        assert our_processes() == []
