"""Security: no code-executing deserialisation anywhere, credentials never leak, bad settings fail fast.

* No module under ``src/`` imports pickle-like modules or calls loaders that execute code (AST scan),
  and a pickle "bomb" planted in the queue or the weight store is refused without running.
* A Redis password given in a URL never appears in ``config.yaml``, config errors, or connection
  errors; a masked URL works again with ``$ASYNCRL_REDIS_PASSWORD``.
* Bad connection settings end in one clear :class:`UserError` (CLI: exit 2, no traceback) within
  seconds, before any warm start.
* A weight snapshot whose bytes do not match the manifest's checksum is refused (both stores:
  ``tests/test_weights.py`` runs the checksum and fallback tests on ``local`` and ``shared``).
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import pickle  # only to build the bombs the code under test must refuse
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from asyncrl.config import ConfigError, dump_yaml, load_config
from asyncrl.credentials import PASSWORD_ENV, check_redis, mask_secrets, resolve_url
from asyncrl.errors import UserError
from redis_server import RedisServer

SRC = Path(__file__).resolve().parents[1] / "src" / "asyncrl"
FORBIDDEN_MODULES = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "marshal", "shelve", "jsonpickle"}
FORBIDDEN_CALLS = {  # (object, attribute) pairs that can execute code while loading
    ("torch", "load"),
    ("yaml", "load"),
    ("yaml", "unsafe_load"),
    ("yaml", "full_load"),
    ("numpy", "load"),
    ("np", "load"),
    ("pickle", "loads"),
    ("pickle", "load"),
}


# ---- no code-executing deserialisation -----------------------------------------------------------
def test_scanner_catches_what_it_must(tmp_path: Path) -> None:
    """The scan itself can fail: each forbidden form in a sample file is reported."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import pickle\nfrom dill import loads\nimport torch, yaml\n"
        "torch.load('x')\nyaml.load('x')\neval('1')\nyaml.safe_load('x')\n"
    )
    found = _violations_any(sample)
    assert found == ["pickle", "dill", "torch.load", "yaml.load", "eval"], found


def _violations_any(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] in FORBIDDEN_MODULES]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in FORBIDDEN_MODULES:
            found.append(node.module or "")
        elif isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
                if (f.value.id, f.attr) in FORBIDDEN_CALLS:
                    found.append(f"{f.value.id}.{f.attr}")
            elif isinstance(f, ast.Name) and f.id in ("eval", "exec"):
                found.append(f.id)
    return found


def test_no_pickle_or_code_executing_loader_in_the_package() -> None:
    files = sorted(SRC.rglob("*.py"))
    assert len(files) > 40
    bad = [f"{p.relative_to(SRC)}: {v}" for p in files for v in _violations_any(p)]
    assert bad == [], "code-executing deserialisation in src/: " + "; ".join(bad)


class _Bomb:
    """Unpickling this creates ``path``: proof that a payload was executed."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.mkdir, (str(self.path),))


@pytest.mark.redis
def test_pickle_bomb_in_the_redis_queue_is_dead_lettered_not_run(tmp_path: Path) -> None:
    from asyncrl.transport.redis_backend import RedisQueue

    server = RedisServer(tmp_path / "redis", appendonly=False)
    try:
        q = RedisQueue(server.url, tmp_path / "run", capacity=16, lease_seconds=5, socket_timeout_s=30.0)
        marker = tmp_path / "executed"
        bomb = pickle.dumps(_Bomb(marker))
        server.client().xadd(q.stream_key, {"id": "evil", "data": bomb})
        assert q.get_batch(4, timeout=1.0) == []
        assert not marker.exists()
        dead = q.dead_letters()
        assert len(dead) == 1 and dead[0].group_id == "evil" and dead[0].payload == bomb
        assert q.stats().dead_letters == 1.0
        q.close()
    finally:
        server.stop()


def test_pickle_bomb_as_weight_snapshot_is_refused_not_run(tmp_path: Path) -> None:
    from asyncrl.weights import MANIFEST_FILE, MODEL_FILE, CorruptSnapshotError, LocalWeightStore

    store = LocalWeightStore(tmp_path / "weights", keep=5)
    store.publish(1, {"w": torch.ones(3)}, step=1)
    store.publish(2, {"w": torch.full((3,), 2.0)}, step=2)
    marker = tmp_path / "executed"
    bomb = pickle.dumps(_Bomb(marker))
    d = store.root / "v000002"
    (d / MODEL_FILE).write_bytes(bomb)
    # even with a manifest that matches the bomb's bytes, it is never unpickled
    m = json.loads((d / MANIFEST_FILE).read_text())
    m.update(sha256=hashlib.sha256(bomb).hexdigest(), bytes=len(bomb))
    (d / MANIFEST_FILE).write_text(json.dumps(m))
    with pytest.raises(CorruptSnapshotError, match="does not decode"):
        store.load(2)
    loaded = store.load_latest()
    assert loaded is not None and loaded.version == 1 and loaded.fell_back_from == 2
    assert not marker.exists()


# ---- credentials never leak ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "masked"),
    [
        ("redis://:s3cret@host:6379/0", "redis://:***@host:6379/0"),
        ("redis://alice:s3cret@host/0", "redis://alice:***@host/0"),
        (
            "rediss://alice:p%40ss@h:1/0?ssl_cert_reqs=required",
            "rediss://alice:***@h:1/0?ssl_cert_reqs=required",
        ),
        (
            "url: 'redis://:s3cret@h:1/0' and redis://:x@y:2/0",
            "url: 'redis://:***@h:1/0' and redis://:***@y:2/0",
        ),
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),  # no credentials: unchanged
        ("redis://h:6379/0 user@example.org", "redis://h:6379/0 user@example.org"),
    ],
)
def test_mask_secrets(text: str, masked: str) -> None:
    assert mask_secrets(text) == masked


def test_config_dump_and_errors_never_show_the_password() -> None:
    url = "redis://alice:TopSecret42@10.0.0.5:6380/0"
    cfg = load_config(
        None,
        [
            f"transport.redis_url={url}",
            "transport.kind=redis",
            f"weights.redis_url={url}",
            "weights.kind=shared",
        ],
    )
    assert cfg.transport.redis_url == url  # the process itself keeps it
    dumped = dump_yaml(cfg)
    assert "TopSecret42" not in dumped and dumped.count("redis://alice:***@10.0.0.5:6380/0") == 2
    with pytest.raises(ConfigError) as err:
        load_config(
            None, ["transport.kind=redis", "transport.redis_url=http://alice:TopSecret42@10.0.0.5:1/0"]
        )
    assert "TopSecret42" not in str(err.value) and "transport.redis_url" in str(err.value)
    long = "redis://:" + "TopSecret42" * 8 + "@h:1/0"  # longer than the 60 characters errors show
    with pytest.raises(ConfigError) as err:
        load_config(None, ["transport.kind=redis", f"transport.redis_url={long}", "transport.capacity=0"])
    assert "TopSecret42" not in str(err.value)


def test_masked_url_takes_the_password_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    with pytest.raises(UserError, match=PASSWORD_ENV):
        resolve_url("redis://:***@h:1/0")
    assert resolve_url("redis://h:1/0") == "redis://h:1/0"
    monkeypatch.setenv(PASSWORD_ENV, "p@ss/word")
    assert resolve_url("redis://:***@h:1/0") == "redis://:p%40ss%2Fword@h:1/0"
    assert resolve_url("redis://bob@h:1/0") == "redis://bob:p%40ss%2Fword@h:1/0"
    assert resolve_url("redis://:given@h:1/0") == "redis://:given@h:1/0"  # an explicit one wins


@pytest.mark.redis
def test_bad_connection_settings_fail_fast_with_a_clear_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    server = RedisServer(tmp_path / "redis", password="Hunter2Hunter2", appendonly=False)
    try:
        cases = {
            f"redis://:WrongPassword9@127.0.0.1:{server.port}/0": "refused the credentials",
            f"redis://127.0.0.1:{server.port}/0": "needs a password",
            "redis://:Hunter2Hunter2@127.0.0.1:1/0": "cannot reach Redis",
        }
        for url, expected in cases.items():
            t0 = time.monotonic()
            with pytest.raises(UserError) as err:
                check_redis(url, "transport.redis_url")
            msg = str(err.value)
            assert expected in msg and "transport.redis_url" in msg, msg
            assert "Hunter2Hunter2" not in msg and "WrongPassword9" not in msg, msg
            assert time.monotonic() - t0 < 15
        check_redis(server.url, "transport.redis_url")  # the right settings pass
        monkeypatch.setenv(PASSWORD_ENV, "Hunter2Hunter2")
        check_redis(f"redis://:***@127.0.0.1:{server.port}/0", "weights.redis_url")
    finally:
        server.stop()


def test_cli_fails_fast_on_unreachable_redis_without_leaking(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop(PASSWORD_ENV, None)
    cmd = [
        sys.executable, "-m", "asyncrl.cli", "train", "configs/demo.yaml", "--no-display",
        "--set", "transport.kind=redis", "--set", "transport.redis_url=redis://:Sekr1tSekr1t@127.0.0.1:1/0",
        "--set", f"run_root={tmp_path}", "--set", f"cache_dir={tmp_path / 'cache'}",
    ]  # fmt: skip
    t0 = time.monotonic()
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, cwd=SRC.parents[1])
    assert res.returncode == 2, res.stderr
    assert "transport.redis_url" in res.stderr and "cannot reach Redis" in res.stderr
    assert "Traceback" not in res.stderr
    assert "Sekr1tSekr1t" not in res.stderr + res.stdout
    assert not (tmp_path / "cache").exists()  # failed before the warm start
    assert time.monotonic() - t0 < 60
