"""Run untrusted Python in a sandboxed subprocess.

Model-written code is hostile by default (endless loops, fork bombs, huge allocations, output
floods, host file writes, network). Each :func:`run_python` call runs it in a fresh, throw-away
process tree: the host starts a tiny *launcher* (``python -I -S -c LAUNCHER``) in a new session,
which sets up isolation while it still has privileges and then ``execve``\\ s the target
interpreter (``python -I -S -c CODE``) as an unprivileged user. On exit, timeout or output flood
the host kills every process that could belong to the run, and removes the temp dir.

The threats, defences and their observations, the limits of the isolation, and the weaker mode
without root are in docs/environments.md ("The Python sandbox"). Contract: as root the run has
``isolation`` ``uid``, ``net`` and ``fs`` (a uid leased from the ``uid_base``/``uid_count`` pool
under ``flock``, a fresh network namespace, a read-only mount namespace with a tmpfs work dir),
and after every run no process of its uid is left before the uid is released; with
``require_isolation=True`` (the default) a run whose ``net`` or ``fs`` isolation could not be
set up is refused with an error result instead of running with weaker guarantees.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import fcntl
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from asyncrl.config import SandboxConfig

__all__ = ["SandboxLimits", "SandboxResult", "run_python", "run_python_sync", "sandbox_support"]


SandboxLimits = SandboxConfig
"""Resource limits of one sandboxed run: the ``env.sandbox`` config section
(:class:`asyncrl.config.SandboxConfig`, where every limit and its default is documented)."""


@dataclass
class SandboxResult:
    """Outcome of one run. ``ok`` means exit status 0 and no limit hit."""

    ok: bool
    stdout: str
    stderr: str
    returncode: int | None
    error: str | None = None
    """None, or one of: timeout, cpu_limit, output_limit, killed, exit, sandbox_error, bad_code."""
    wall_s: float = 0.0
    isolation: tuple[str, ...] = ()
    """Isolation features that were in effect: ``uid``, ``net``, ``fs``."""
    detail: str = ""
    leftover_pids: list[int] = field(default_factory=list)
    """Processes of the run still alive after cleanup (always empty unless cleanup failed)."""

    def summary(self, max_chars: int = 200) -> str:
        """Short plain-ASCII text for an observation: stdout when ok, else ``error: ...``."""
        if self.ok:
            text = self.stdout.strip() or "(no output; use print)"
        else:
            lines = [ln.strip() for ln in self.stderr.strip().splitlines() if ln.strip()]
            text = "error: " + {
                "timeout": f"timeout (wall limit {self.detail})",
                "cpu_limit": "CPU time limit exceeded",
                "output_limit": "output too long",
                "sandbox_error": f"sandbox unavailable: {self.detail}",
                "bad_code": self.detail,
            }.get(self.error or "", lines[-1] if lines else self.detail or f"exit status {self.returncode}")
        text = text.encode("ascii", "replace").decode("ascii")
        return text if len(text) <= max_chars else text[: max_chars - 3] + "..."


# ---------------------------------------------------------------------------------------------
# The launcher: runs as the first process of the run, sets up isolation, execs the interpreter.
# Kept as source text so it can run under `python -I -S` (no asyncrl import needed).
# ---------------------------------------------------------------------------------------------
LAUNCHER = r"""
import ctypes, json, os, resource, sys
cfg = json.loads(sys.argv[1]); code = sys.argv[2]
status_fd = cfg["status_fd"]
state = {"isolation": [], "notes": []}
def done(error=None):
    if error:
        state["error"] = error
    os.write(status_fd, json.dumps(state).encode()); os.close(status_fd)
    if error:
        os._exit(125)
libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
libc.unshare.argtypes = [ctypes.c_int]
NEWNS, NEWNET, NEWUSER = 0x00020000, 0x40000000, 0x10000000
RDONLY, NOSUID, NODEV, NOEXEC, REMOUNT, NOATIME, NODIRATIME, BIND, REC = 1, 2, 4, 8, 32, 1024, 2048, 4096, 16384
PRIVATE, RELATIME = 1 << 18, 1 << 21
def enc(s):
    return None if s is None else s.encode()
def mount(src, tgt, fstype, flags, data=None):
    if libc.mount(enc(src), enc(tgt), enc(fstype), flags, enc(data)) != 0:
        e = ctypes.get_errno(); raise OSError(e, os.strerror(e) + " (mount " + tgt + ")")
def unshare(flags):
    if libc.unshare(flags) != 0:
        e = ctypes.get_errno(); raise OSError(e, os.strerror(e) + " (unshare)")
def write(path, text):
    with open(path, "w") as f:
        f.write(text)
root = cfg["root"]; uid = cfg["uid"]; gid = cfg["gid"]; work = cfg["work"]
ns_net = ns_fs = False
try:
    if root:
        unshare(NEWNS | NEWNET)
    else:
        real_uid, real_gid = os.getuid(), os.getgid()
        unshare(NEWUSER | NEWNS | NEWNET)
        write("/proc/self/setgroups", "deny")
        write("/proc/self/uid_map", "%d %d 1" % (real_uid, real_uid))
        write("/proc/self/gid_map", "%d %d 1" % (real_gid, real_gid))
    ns_net = ns_fs = True
except OSError as e:
    state["notes"].append("namespaces: " + str(e))
    try:
        unshare(NEWNET if root else NEWUSER | NEWNET); ns_net = True
    except OSError as e2:
        state["notes"].append("net namespace: " + str(e2))
if ns_net:
    state["isolation"].append("net")
python = cfg["python"]
if ns_fs:
    try:
        mount(None, "/", None, REC | PRIVATE)
        opts = "size=%d,mode=0700" % cfg["disk_bytes"]
        if root:
            opts += ",uid=%d,gid=%d" % (uid, gid)
        mount("tmpfs", work, "tmpfs", NOSUID | NODEV, opts)
        if cfg["bind_prefix"]:
            mount(cfg["prefix"], cfg["pyroot"], None, BIND | REC)
            mount(None, cfg["pyroot"], None, BIND | REMOUNT | RDONLY | NOSUID | NODEV)
            python = cfg["pyroot"] + "/" + cfg["python_rel"]
        flagmap = {"nosuid": NOSUID, "nodev": NODEV, "noexec": NOEXEC, "noatime": NOATIME,
                   "nodiratime": NODIRATIME, "relatime": RELATIME}
        failed = []
        with open("/proc/self/mountinfo") as f:
            lines = f.read().splitlines()
        for line in lines:
            parts = line.split()
            point = parts[4].encode().decode("unicode_escape")
            if point == work:
                continue
            flags = BIND | REMOUNT | RDONLY
            for o in parts[5].split(","):
                flags |= flagmap.get(o, 0)
            try:
                mount(None, point, None, flags)
            except OSError as e:
                if e.errno != 2:  # vanished or hidden under another mount
                    failed.append(point + ": " + e.strerror)
        if failed:
            raise OSError(1, "could not make read-only: " + "; ".join(failed[:5]))
        state["isolation"].append("fs")
    except OSError as e:
        state["notes"].append("filesystem: " + str(e))
if cfg["require_isolation"] and not ("net" in state["isolation"] and "fs" in state["isolation"]):
    done("network/filesystem isolation unavailable: " + "; ".join(state["notes"]))
try:
    lim = cfg["limits"]
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_CPU, (lim["cpu"], lim["cpu"] + 1))
    resource.setrlimit(resource.RLIMIT_AS, (lim["as"], lim["as"]))
    resource.setrlimit(resource.RLIMIT_FSIZE, (lim["fsize"], lim["fsize"]))
    resource.setrlimit(resource.RLIMIT_NOFILE, (lim["nofile"], lim["nofile"]))
    resource.setrlimit(resource.RLIMIT_NPROC, (lim["nproc"], lim["nproc"]))
    os.chdir(work)
    if root:
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
        state["isolation"].append("uid")
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    libc.prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG=SIGKILL (after the uid change, which clears it)
except OSError as e:
    done("setup: " + str(e))
env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": work, "TMPDIR": work, "LANG": "C.UTF-8"}
if cfg["libdir"]:
    env["LD_LIBRARY_PATH"] = cfg["pyroot"] + "/lib" if cfg["bind_prefix"] and python != cfg["python"] else cfg["libdir"]
if not os.access(python, os.X_OK):
    done("interpreter not executable by the sandbox user: " + python)
done()
os.execve(python, [python, "-I", "-S", "-c", code], env)
"""


# ---------------------------------------------------------------------------------------------
# uid pool (root mode)
# ---------------------------------------------------------------------------------------------
def _lock_dir() -> Path:
    d = Path(tempfile.gettempdir()) / "asyncrl-sandbox-uids"
    d.mkdir(mode=0o700, exist_ok=True)
    return d


def _uid_pids(uid: int) -> list[int]:
    """Live (non-zombie) pids whose real, effective or saved uid is ``uid`` (from /proc).

    Zombies are skipped: they hold no resources but a pid, cannot be killed, and are reaped by
    their new parent (init) on its own schedule.
    """
    pids = []
    needle = str(uid).encode()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/status", "rb") as f:
                zombie = False
                for line in f:
                    if line.startswith(b"State:"):
                        zombie = line.split()[1:2] in ([b"Z"], [b"X"])
                    elif line.startswith(b"Uid:"):
                        if not zombie and needle in line.split()[1:4]:
                            pids.append(int(entry.name))
                        break
        except (OSError, ValueError):
            continue
    return pids


_ACTIVE_UIDS: set[int] = set()
"""uids leased by this process right now; killed at interpreter exit as a last resort."""


@atexit.register
def _kill_active_uids() -> None:
    for uid in list(_ACTIVE_UIDS):
        _kill_uid_sync(uid)


class _UidLease:
    """An exclusively locked uid from the pool; stale processes of it are killed on acquire."""

    def __init__(self, limits: SandboxLimits) -> None:
        self.limits = limits
        self.uid = -1
        self._fd = -1

    def acquire(self) -> int:
        d = _lock_dir()
        start = random.randrange(self.limits.uid_count)
        for i in range(self.limits.uid_count):
            uid = self.limits.uid_base + (start + i) % self.limits.uid_count
            fd = os.open(d / f"{uid}.lock", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            self.uid, self._fd = uid, fd
            _ACTIVE_UIDS.add(uid)
            if _uid_pids(uid):  # leftovers of a crashed host process: the lock says they are ours
                _kill_uid_sync(uid)
            return uid
        raise RuntimeError("sandbox uid pool exhausted; raise env.sandbox.uid_count")

    def release(self) -> None:
        if self._fd >= 0:
            _ACTIVE_UIDS.discard(self.uid)
            os.close(self._fd)  # closing drops the flock
            self._fd = -1


def _kill_uid_sync(uid: int) -> list[int]:
    """SIGKILL every process of ``uid``; returns pids still alive after several rounds."""
    import subprocess

    for _ in range(20):
        pids = _uid_pids(uid)
        if not pids:
            return []
        # kill(-1) as the uid: one kernel pass over all processes, atomic w.r.t. fork.
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(
                [sys.executable, "-I", "-S", "-c", "import os\ntry: os.kill(-1, 9)\nexcept OSError: pass"],
                user=uid,
                group=uid,
                extra_groups=[],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=5,
                cwd="/",
                env={},
            )
        for pid in _uid_pids(uid):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.005)
    return _uid_pids(uid)


# ---------------------------------------------------------------------------------------------
# Interpreter location
# ---------------------------------------------------------------------------------------------
def _others_can_reach(path: str) -> bool:
    """Whether a user that is neither owner nor in the group can traverse to and read ``path``."""
    p = Path(path)
    try:
        for parent in [*reversed(p.parents)]:
            if not os.stat(parent).st_mode & 0o001:
                return False
        return bool(os.stat(p).st_mode & 0o004)
    except OSError:
        return False


def _interpreter(limits: SandboxLimits) -> tuple[str, str, str]:
    """(interpreter path, its prefix, its library dir)."""
    if limits.python:
        exe = os.path.realpath(limits.python)
        prefix = str(Path(exe).parent.parent)
    else:
        exe = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
        prefix = os.path.realpath(sys.base_prefix)
    return exe, prefix, str(Path(prefix) / "lib")


# ---------------------------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------------------------
async def _read_capped(stream: asyncio.StreamReader, cap: int, flood: asyncio.Event) -> bytes:
    """Read a pipe to EOF keeping at most ``cap`` bytes; set ``flood`` once more than that arrived."""
    buf = bytearray()
    total = 0
    while True:
        chunk = await stream.read(65536)
        if not chunk:
            return bytes(buf)
        total += len(chunk)
        if len(buf) < cap:
            buf += chunk[: cap - len(buf)]
        if total > cap:
            flood.set()


async def run_python(code: str, limits: SandboxLimits | None = None) -> SandboxResult:
    """Run ``code`` with ``python -I -S -c`` in the sandbox described in the module docstring.

    Never raises for anything the code does; host-side setup problems become a result with
    ``error="sandbox_error"``. ``limits``: unset, the defaults of the ``env.sandbox`` config section.
    """
    limits = limits or SandboxLimits()
    started = time.monotonic()
    if len(code) > limits.max_code_chars:
        return SandboxResult(
            False, "", "", None, "bad_code", detail=f"code longer than {limits.max_code_chars} chars"
        )
    if "\x00" in code:
        return SandboxResult(False, "", "", None, "bad_code", detail="code contains a NUL character")
    try:
        code.encode("utf-8")
    except UnicodeEncodeError:
        return SandboxResult(False, "", "", None, "bad_code", detail="code is not valid text")
    is_root = os.geteuid() == 0
    lease = _UidLease(limits)
    top = ""
    try:
        uid = lease.acquire() if is_root else os.getuid()
        gid = uid if is_root else os.getgid()
        top = tempfile.mkdtemp(prefix="asyncrl-sbx-")
        work, pyroot = os.path.join(top, "work"), os.path.join(top, "py")
        os.mkdir(work, 0o700)
        os.mkdir(pyroot, 0o755)
        if is_root:
            os.chmod(top, 0o711)
            os.chown(work, uid, gid)
        exe, prefix, libdir = _interpreter(limits)
        bind_prefix = is_root and not _others_can_reach(exe) and exe.startswith(prefix + os.sep)
        nproc = limits.max_processes
        if not is_root:  # RLIMIT_NPROC counts all of the user's processes
            nproc += len(_uid_pids(uid))
        cfg: dict[str, object] = {
            "root": is_root,
            "uid": uid,
            "gid": gid,
            "work": work,
            "pyroot": pyroot,
            "prefix": prefix,
            "python": exe,
            "python_rel": os.path.relpath(exe, prefix),
            "bind_prefix": bind_prefix,
            "libdir": libdir if os.path.isdir(libdir) else "",
            "disk_bytes": limits.disk_bytes,
            "require_isolation": limits.require_isolation,
            "limits": {
                "cpu": max(1, int(limits.cpu_seconds)),
                "as": limits.memory_bytes,
                "fsize": limits.file_size_bytes,
                "nofile": limits.max_open_files,
                "nproc": nproc,
            },
        }
        return await _spawn(code, cfg, limits, uid if is_root else None, started)
    except Exception as exc:  # host-side problem: report, never raise into the environment
        wall, detail = time.monotonic() - started, f"{type(exc).__name__}: {exc}"
        return SandboxResult(False, "", "", None, "sandbox_error", wall_s=wall, detail=detail)
    finally:
        if top:
            shutil.rmtree(top, ignore_errors=True)
        lease.release()


async def _spawn(
    code: str, cfg: dict[str, object], limits: SandboxLimits, uid: int | None, started: float
) -> SandboxResult:
    status_r, status_w = os.pipe()
    cfg["status_fd"] = status_w
    try:
        argv = [sys.executable, "-I", "-S", "-c", LAUNCHER, json.dumps(cfg), code]
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
            pass_fds=(status_w,),
            cwd="/",
            env={"PATH": "/usr/bin:/bin"},
        )
    except BaseException:
        os.close(status_r)
        raise
    finally:
        os.close(status_w)
    assert proc.stdout is not None and proc.stderr is not None
    flood = asyncio.Event()
    cap = limits.max_output_bytes
    readers = [asyncio.ensure_future(_read_capped(out, cap, flood)) for out in (proc.stdout, proc.stderr)]
    waiter = asyncio.ensure_future(_exited(proc))
    flood_wait = asyncio.ensure_future(flood.wait())
    error: str | None = None
    try:
        done, _ = await asyncio.wait(
            {waiter, flood_wait}, timeout=limits.wall_seconds, return_when=asyncio.FIRST_COMPLETED
        )
        if flood_wait in done and waiter not in done:
            error = "output_limit"
        elif waiter not in done:
            error = "timeout"
    finally:
        flood_wait.cancel()
        leftovers = await _cleanup(proc, uid)
    returncode = await waiter
    outs: list[bytes] = []
    for r in readers:
        try:
            outs.append(await asyncio.wait_for(r, timeout=2.0))
        except TimeoutError:
            outs.append(b"")
    if error is None and flood.is_set():
        error = "output_limit"
    status = _read_status(status_r)
    wall = time.monotonic() - started
    stdout, stderr = (o.decode("utf-8", "replace") for o in outs)
    isolation = tuple(status.get("isolation", ()))
    if status.get("error"):
        return SandboxResult(
            False, "", "", returncode, "sandbox_error", wall, isolation, status["error"], leftovers
        )
    if error is None and returncode != 0:  # only RLIMIT_CPU sends SIGXCPU
        error = "cpu_limit" if returncode == -signal.SIGXCPU else "killed" if returncode < 0 else "exit"
    details = {"timeout": f"{limits.wall_seconds:g}s", "killed": f"killed by signal {-returncode}"}
    detail = details.get(error or "", "")
    return SandboxResult(error is None, stdout, stderr, returncode, error, wall, isolation, detail, leftovers)


async def _exited(proc: asyncio.subprocess.Process) -> int:
    """Return when the run's first process exits.

    ``Process.wait()`` also waits until stdout/stderr are closed, which a background child
    (even one that escaped with ``setsid``) could delay until the wall limit; the return code is
    set as soon as the process is reaped, so poll it instead.
    """
    while proc.returncode is None:
        await asyncio.sleep(0.005)
    return proc.returncode


def _read_status(fd: int) -> dict[str, Any]:
    try:
        os.set_blocking(fd, False)
        data = b""
        with contextlib.suppress(BlockingIOError):
            while chunk := os.read(fd, 65536):
                data += chunk
        return json.loads(data) if data else {"error": "launcher failed before reporting"}
    except (OSError, ValueError) as exc:
        return {"error": f"bad launcher status: {exc}"}
    finally:
        os.close(fd)


async def _cleanup(proc: asyncio.subprocess.Process, uid: int | None) -> list[int]:
    """Kill the whole run: the process group, and in root mode every process of the run's uid."""
    if proc.returncode is None or uid is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    if uid is None or not _uid_pids(uid):
        return []
    return await asyncio.to_thread(_kill_uid_sync, uid)


def run_python_sync(code: str, limits: SandboxLimits | None = None) -> SandboxResult:
    """Blocking convenience wrapper of :func:`run_python` (not for use inside an event loop)."""
    return asyncio.run(run_python(code, limits))


def sandbox_support(limits: SandboxLimits | None = None) -> SandboxResult:
    """Run ``print(1)`` without requiring isolation; ``.isolation`` tells what this host supports."""
    base = limits or SandboxLimits()
    return run_python_sync("print(1)", base.model_copy(update={"require_isolation": False}))
