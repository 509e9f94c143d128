"""Experiment records: ``run_dir/run.json`` (read back by ``asyncrl runs list`` / ``asyncrl runs compare``,
:mod:`asyncrl.jobs.runs`).

``run.json`` is written when a run starts and completed when it ends. It holds what is needed to
compare or reproduce the run months later: the hash of the resolved config (``config.yaml`` beside it
holds the config itself), the asyncrl version, the git commit of the source (with a dirty flag, when
the source is a git checkout), every seed, the environment (kind, class and its ``version`` attribute
if it has one) and the software versions (Python, torch, transformers, ...).
"""

from __future__ import annotations

import hashlib
import json
import platform
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import asyncrl
from asyncrl.config import RunConfig
from asyncrl.durable import replace_file
from asyncrl.envs import make_env

SOFTWARE = ("torch", "transformers", "tokenizers", "msgspec", "numpy", "pydantic", "redis")


def config_hash(cfg: RunConfig) -> str:
    return hashlib.sha256(cfg.model_dump_json().encode()).hexdigest()[:16]


def git_commit(where: Path) -> dict[str, Any] | None:
    """The commit (and whether the tree has local changes) of the git checkout holding ``where``."""

    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", "-C", str(where), *args], capture_output=True, text=True, timeout=10)

    try:
        head = git("rev-parse", "HEAD")
        if head.returncode != 0:
            return None
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": head.stdout.strip(), "dirty": bool(dirty.stdout.strip())}


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def environment_info(cfg: RunConfig) -> dict[str, Any]:
    info: dict[str, Any] = {"kind": cfg.env.kind}
    try:
        env = make_env(cfg.env, 0)
    except Exception as exc:  # recorded, not fatal: the run itself reports a broken environment
        info["error"] = f"{type(exc).__name__}: {exc}"
        return info
    inner: object = env
    # unwrap latency / fault / guard wrappers, and an ecosystem adapter's ``env`` (openenv, verifiers)
    while (nxt := getattr(inner, "env", None)) is not None and nxt is not inner:
        inner = nxt
    cls = type(inner)
    info["class"] = f"{cls.__module__}.{cls.__qualname__}"
    info["version"] = str(getattr(inner, "version", "") or "") or None
    top = cls.__module__.split(".")[0]
    info["package_version"] = _version(top) if top != "asyncrl" else None
    return info


def write_run_record(cfg: RunConfig, run_dir: Path, *, resumed: bool = False) -> None:
    path = run_dir / "run.json"
    if resumed and path.is_file():
        rec: dict[str, Any] = json.loads(path.read_text())
        rec.setdefault("resumed_at", []).append(time.time())
        rec["status"] = "running"
    else:
        rec = {
            "name": cfg.name,
            "run_dir": str(run_dir),
            "created": time.time(),
            "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "status": "running",
            "config_hash": config_hash(cfg),
            "asyncrl_version": asyncrl.__version__,
            "git": git_commit(Path(asyncrl.__file__).resolve().parent) or git_commit(Path.cwd()),
            "seeds": {
                "seed": cfg.seed,
                "model.seed": cfg.model.seed,
                "env.seed": cfg.env.seed,
                "trainer.sft.seed": cfg.trainer.sft.seed,
            },
            "environment": environment_info(cfg),
            "software": {
                "python": sys.version.split()[0],
                "platform": platform.platform(),
                **{k: _version(k) for k in SOFTWARE},
            },
            "command": sys.argv,
        }
    path.write_text(json.dumps(rec, indent=2))


def update_run_record(run_dir: Path, **fields: Any) -> None:
    """Merge ``fields`` into ``run.json`` (replaced whole: a reader never sees half of it)."""
    path = run_dir / "run.json"
    rec: dict[str, Any] = json.loads(path.read_text()) if path.is_file() else {}
    rec.update(fields)
    replace_file(path, json.dumps(rec, indent=2).encode())
