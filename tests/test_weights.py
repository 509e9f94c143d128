"""Weight store: atomic publish, verification, fallback past corrupt snapshots, retention races.

Every test runs against both backends: ``local`` (pointer file) and ``shared`` (pointer in Redis at
``$ASYNCRL_TEST_REDIS_URL``, default the local server; marked ``redis``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import multiprocessing as mp
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from asyncrl.config import LocalWeightsConfig, SharedWeightsConfig
from asyncrl.weights import (
    MANIFEST_FILE,
    MODEL_FILE,
    POINTER_FILE,
    CorruptSnapshotError,
    LocalWeightStore,
    SnapshotNotFoundError,
    make_weight_store,
    version_dirname,
)

SPAWN = mp.get_context("spawn")
REDIS_URL = os.environ.get("ASYNCRL_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def new_store(kind: str, root: str | Path, keep: int) -> LocalWeightStore:
    """A store of backend ``kind`` (importable from spawned reader processes)."""
    if kind == "shared":
        from asyncrl.weights.shared import SharedWeightStore

        return SharedWeightStore(root, REDIS_URL, keep=keep)
    return LocalWeightStore(root, keep=keep)


def set_raw_pointer(store: LocalWeightStore, raw: str | None) -> None:
    """Overwrite (or with None delete) the store's pointer behind its back, whatever the backend."""
    from asyncrl.weights.shared import SharedWeightStore

    if isinstance(store, SharedWeightStore):
        if raw is None:
            store._r.delete(store.key)
        else:
            store._r.set(store.key, raw)
    elif raw is None:
        (store.root / POINTER_FILE).unlink()
    else:
        (store.root / POINTER_FILE).write_text(raw)


def raw_pointer(store: LocalWeightStore) -> Any:
    from asyncrl.weights.shared import SharedWeightStore

    if isinstance(store, SharedWeightStore):
        return json.loads(store._r.get(store.key))
    return json.loads((store.root / POINTER_FILE).read_text())


@pytest.fixture(params=["local", pytest.param("shared", marks=pytest.mark.redis)])
def kind(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The backend; for ``shared``, every pointer key under ``tmp_path`` is deleted afterwards."""
    if request.param == "shared":
        import redis

        r = redis.Redis.from_url(REDIS_URL)
        try:
            r.ping()
        except redis.ConnectionError:
            if os.environ.get("ASYNCRL_REQUIRE_REDIS") == "1":
                pytest.fail(f"no Redis server at {REDIS_URL} (ASYNCRL_REQUIRE_REDIS=1)")
            pytest.skip(f"no Redis server at {REDIS_URL}")
        yield "shared"
        from asyncrl.weights.shared import pointer_key

        for sub in ("weights", "one", "w", "run/weights"):
            r.delete(pointer_key(tmp_path / sub))
        r.close()
    else:
        yield "local"


def tensors_for(version: int, n: int = 64) -> dict[str, torch.Tensor]:
    """Tensors whose every value identifies the version (a torn read would show)."""
    return {
        "embed.weight": torch.full((n, n), float(version)),
        "layer.0.bias": torch.full((n,), float(version), dtype=torch.bfloat16),
        "step": torch.tensor([version], dtype=torch.int64),
    }


def assert_tensors_for(tensors: dict[str, torch.Tensor], version: int) -> None:
    assert set(tensors) == {"embed.weight", "layer.0.bias", "step"}
    assert int(tensors["step"].item()) == version
    assert bool((tensors["embed.weight"] == float(version)).all())
    assert bool((tensors["layer.0.bias"] == float(version)).all())


def _bits(t: torch.Tensor) -> bytes:
    return bytes(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())


@pytest.fixture
def store(tmp_path: Path, kind: str) -> LocalWeightStore:
    return new_store(kind, tmp_path / "weights", keep=10)


def vdir(store: LocalWeightStore, version: int) -> Path:
    return store.root / version_dirname(version)


# ---- round trip ------------------------------------------------------------------------------
def test_publish_load_round_trip_is_bitwise(store: LocalWeightStore) -> None:
    gen = torch.Generator().manual_seed(0)
    base = torch.randn(8, 6, generator=gen)
    tensors = {
        "f32": torch.randn(17, 5, generator=gen),
        "bf16": torch.randn(9, generator=gen).to(torch.bfloat16),
        "f16": torch.randn(3, 3, generator=gen).to(torch.float16),
        "i64": torch.randint(-(2**40), 2**40, (11,), generator=gen),
        "bool": torch.rand(7, generator=gen) > 0.5,
        "scalar": torch.tensor(3.25),
        "empty": torch.zeros(0, 4),
        "transposed": base.t(),  # non-contiguous view
        "tied.a": base,
        "tied.b": base,  # shares storage with tied.a (tied embeddings)
        "with_grad": torch.randn(4, generator=gen, requires_grad=True),
    }
    assert store.latest_version() is None and store.load_latest() is None and store.versions() == []
    path = store.publish(1, tensors, step=42, extra={"lr": 1e-3, "note": "first"})
    assert path == vdir(store, 1) and path.is_dir()
    assert sorted(p.name for p in path.iterdir()) == [MANIFEST_FILE, MODEL_FILE]
    assert raw_pointer(store) == {"version": 1}
    assert store.latest_version() == 1 and store.versions() == [1]

    loaded = store.load_latest()
    assert loaded is not None
    assert loaded.version == 1 and loaded.path == path
    assert loaded.fell_back_from is None and loaded.problems == []
    assert set(loaded.tensors) == set(tensors)
    for name, t in tensors.items():
        got = loaded.tensors[name]
        assert got.dtype == t.dtype and got.shape == t.shape and got.device.type == "cpu"
        assert _bits(got) == _bits(t), name
    m = loaded.manifest
    assert (m["version"], m["step"], m["extra"]) == (1, 42, {"lr": 1e-3, "note": "first"})
    assert m["bytes"] == (path / MODEL_FILE).stat().st_size and len(m["sha256"]) == 64
    assert m["created_at"] <= time.time()
    assert store.load(1).manifest == m
    with pytest.raises(SnapshotNotFoundError):
        store.load(2)


def test_versions_must_increase_strictly(store: LocalWeightStore) -> None:
    store.publish(3, tensors_for(3), step=3)
    for bad in (3, 2, 0):
        with pytest.raises(ValueError, match="increase strictly"):
            store.publish(bad, tensors_for(bad), step=bad)
    for bad_type in (-1, True, 1.5):
        with pytest.raises(ValueError):
            store.publish(bad_type, tensors_for(4), step=4)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="JSON"):
        store.publish(4, tensors_for(4), step=4, extra={"x": object()})
    with pytest.raises(ValueError):
        store.publish(4, {}, step=4)
    store.publish(7, tensors_for(7), step=7)  # gaps are fine
    assert store.versions() == [3, 7] and store.latest_version() == 7
    assert not [p for p in store.root.iterdir() if p.name.startswith(".")]  # no temp leftovers


# ---- verification and fallback ---------------------------------------------------------------
def test_corrupt_latest_falls_back_to_previous(
    store: LocalWeightStore, caplog: pytest.LogCaptureFixture
) -> None:
    for v in (1, 2, 3):
        store.publish(v, tensors_for(v), step=v)
    model = vdir(store, 3) / MODEL_FILE
    data = bytearray(model.read_bytes())
    data[len(data) // 2] ^= 0xFF  # flip bits inside the tensor data: still parses, wrong values
    model.write_bytes(bytes(data))

    with pytest.raises(CorruptSnapshotError, match="sha256"):
        store.load(3)
    with caplog.at_level(logging.WARNING, logger="asyncrl.weights.local"):
        loaded = store.load_latest()
    assert loaded is not None
    assert loaded.version == 2 and loaded.fell_back_from == 3
    assert loaded.problems and "sha256" in loaded.problems[0]
    assert_tensors_for(loaded.tensors, 2)
    assert any("instead of 3" in r.getMessage() for r in caplog.records)
    assert store.latest_version() == 3  # the pointer is not rewritten by readers
    store.publish(4, tensors_for(4), step=4)  # the writer just moves on
    fresh = store.load_latest()
    assert fresh is not None and fresh.version == 4 and fresh.fell_back_from is None


@pytest.mark.parametrize(
    "damage",
    ["no_manifest", "no_model", "truncated", "bad_json", "manifest_of_other_version", "header_garbage"],
)
def test_partial_or_damaged_snapshot_falls_back(store: LocalWeightStore, damage: str) -> None:
    store.publish(1, tensors_for(1), step=1)
    store.publish(2, tensors_for(2), step=2)
    d = vdir(store, 2)
    if damage == "no_manifest":
        (d / MANIFEST_FILE).unlink()
    elif damage == "no_model":
        (d / MODEL_FILE).unlink()
    elif damage == "truncated":
        data = (d / MODEL_FILE).read_bytes()
        (d / MODEL_FILE).write_bytes(data[: len(data) // 3])
    elif damage == "bad_json":
        (d / MANIFEST_FILE).write_text('{"version": 2, "sha')
    elif damage == "manifest_of_other_version":
        shutil.copy(vdir(store, 1) / MANIFEST_FILE, d / MANIFEST_FILE)
    elif damage == "header_garbage":  # a file that does not decode, with a manifest that matches it
        garbage = b"\xff" * 64
        (d / MODEL_FILE).write_bytes(garbage)
        m = json.loads((d / MANIFEST_FILE).read_text())
        m.update(sha256=hashlib.sha256(garbage).hexdigest(), bytes=len(garbage))
        (d / MANIFEST_FILE).write_text(json.dumps(m))
    with pytest.raises(CorruptSnapshotError):
        store.load(2)
    loaded = store.load_latest()
    assert loaded is not None and loaded.version == 1 and loaded.fell_back_from == 2
    assert len(loaded.problems) == 1
    assert_tensors_for(loaded.tensors, 1)


def test_no_valid_version_returns_none(store: LocalWeightStore) -> None:
    store.publish(1, tensors_for(1), step=1)
    (vdir(store, 1) / MODEL_FILE).write_bytes(b"")
    assert store.load_latest() is None


def test_pointer_rules(store: LocalWeightStore) -> None:
    store.publish(1, tensors_for(1), step=1)
    store.publish(2, tensors_for(2), step=2)
    # A complete directory newer than the pointer is an unfinished publish: readers ignore it.
    shutil.copytree(vdir(store, 2), vdir(store, 3))
    loaded = store.load_latest()
    assert loaded is not None and loaded.version == 2 and loaded.problems == []
    with pytest.raises(ValueError, match="increase strictly"):
        store.publish(3, tensors_for(3), step=3)
    # No pointer at all: the newest valid directory (v3 here names version 2 inside: invalid).
    set_raw_pointer(store, None)
    loaded = store.load_latest()
    assert loaded is not None and loaded.version == 2 and loaded.fell_back_from is None
    assert len(loaded.problems) == 1  # v3's manifest names the wrong version
    # A corrupt pointer is reported, and the newest valid directory is used.
    shutil.rmtree(vdir(store, 3))
    set_raw_pointer(store, "{not json")
    assert store.latest_version() == 2
    loaded = store.load_latest()
    assert loaded is not None and loaded.version == 2 and "pointer" in loaded.problems[0]


def publish_killed_before_the_pointer(
    store: LocalWeightStore, version: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Publish ``version`` as a publisher killed after renaming its snapshot into place, before the pointer."""

    def crash(version: int) -> None:
        raise OSError("simulated crash before the pointer was replaced")

    monkeypatch.setattr(store, "_write_pointer", crash)
    with pytest.raises(OSError, match="simulated"):
        store.publish(version, tensors_for(version), step=version)
    monkeypatch.undo()


def test_crash_before_pointer_update(store: LocalWeightStore, monkeypatch: pytest.MonkeyPatch) -> None:
    store.publish(1, tensors_for(1), step=1)
    publish_killed_before_the_pointer(store, 2, monkeypatch)
    assert store.latest_version() == 1 and store.versions() == [1, 2]
    assert store.newest_version() == 2  # what a resumed publisher must exceed
    loaded = store.load_latest()
    assert loaded is not None and loaded.version == 1
    with pytest.raises(ValueError, match="increase strictly"):
        store.publish(2, tensors_for(2), step=2)
    store.publish(3, tensors_for(3), step=3)
    assert store.latest_version() == 3 == store.newest_version()


def test_resumed_trainer_skips_a_version_renamed_before_the_pointer(
    store: LocalWeightStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trainer checkpointed at step 4 (version 4), killed while publishing version 6 after the rename
    and before the pointer moved: the resumed trainer's next version is 7, not the existing 6."""
    from asyncrl.trainer.process import resume_versions

    for v in (4, 5):
        store.publish(v, tensors_for(v), step=v)
    publish_killed_before_the_pointer(store, 6, monkeypatch)
    offset, published = resume_versions(store, step=4, last_published=4)
    assert (offset, published) == (2, 6)
    store.publish(4 + 1 + offset, tensors_for(7), step=5)  # the first step after the resume
    assert resume_versions(store, step=0, last_published=0) == (7, 7)  # a fresh start behind a store


# ---- retention -------------------------------------------------------------------------------
def test_retention_keeps_last_k_and_pointer_target(tmp_path: Path, kind: str) -> None:
    cfg = LocalWeightsConfig(keep=2) if kind == "local" else SharedWeightsConfig(keep=2, redis_url=REDIS_URL)
    store = make_weight_store(cfg, tmp_path)
    assert isinstance(store, LocalWeightStore) and store.root == tmp_path / "weights"
    assert type(store).__name__ == {"local": "LocalWeightStore", "shared": "SharedWeightStore"}[kind]
    for v in range(1, 6):
        store.publish(v, tensors_for(v), step=v)
        assert store.versions() == list(range(max(1, v - 1), v + 1))
    assert store.latest_version() == 5
    # Leftovers of a crashed publish/delete are cleaned by the next publish and never listed.
    (store.root / ".tmp-v000009-dead").mkdir()
    (store.root / ".trash-v000001-dead").mkdir()
    (store.root / ".latest.tmp-1-dead").write_text("{}")
    assert store.versions() == [4, 5]
    store.publish(6, tensors_for(6), step=6)
    pointer_file = [POINTER_FILE] if kind == "local" else []  # shared: the pointer is in Redis only
    assert sorted(p.name for p in store.root.iterdir()) == [*pointer_file, "v000005", "v000006"]
    # The pointer target survives retention even when newer (unpublished) directories exist.
    one = new_store(kind, tmp_path / "one", keep=1)
    one.publish(1, tensors_for(1), step=1)
    shutil.copytree(vdir(one, 1), vdir(one, 2))
    one._apply_retention(one.latest_version() or 0)
    assert one.versions() == [1, 2]


# ---- concurrent reader process ---------------------------------------------------------------
def _reader(kind: str, root: str, stop: Any, ready_path: str, out_path: str) -> None:
    store = new_store(kind, root, keep=2)
    stats: dict[str, Any] = {"loads": 0, "versions": [], "errors": [], "nones_after_first": 0, "problems": []}
    first = False
    try:
        while not stop.is_set():
            loaded = store.load_latest()
            if loaded is None:
                stats["nones_after_first"] += first
                continue
            first = True
            try:
                assert loaded.manifest["version"] == loaded.version
                assert_tensors_for(loaded.tensors, loaded.version)
            except AssertionError as exc:
                stats["errors"].append(f"torn read of v{loaded.version}: {exc!r}")
            if loaded.problems:
                stats["problems"].append(loaded.problems)
            stats["loads"] += 1
            if not stats["versions"] or stats["versions"][-1] != loaded.version:
                stats["versions"].append(loaded.version)
            if stats["loads"] == 1:
                Path(ready_path).write_text("ready")
    except Exception as exc:
        stats["errors"].append(f"crash: {exc!r}")
    Path(out_path).write_text(json.dumps(stats))


def test_concurrent_reader_never_sees_corrupt_weights(tmp_path: Path, kind: str) -> None:
    root = tmp_path / "weights"
    store = new_store(kind, root, keep=2)
    n = 256  # 256 KiB per snapshot: reads take long enough to overlap deletions
    store.publish(0, tensors_for(0, n), step=0)
    stop = SPAWN.Event()
    ready, out = tmp_path / "ready", tmp_path / "reader.json"
    reader = SPAWN.Process(target=_reader, args=(kind, str(root), stop, str(ready), str(out)))
    reader.start()
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert reader.is_alive() and time.monotonic() < deadline, "reader did not start"
            time.sleep(0.02)
        for v in range(1, 21):
            store.publish(v, tensors_for(v, n), step=v)
            assert len(store.versions()) <= 2
            time.sleep(0.01)
        time.sleep(0.2)
        stop.set()
        reader.join(60)
        assert reader.exitcode == 0
    finally:
        if reader.is_alive():
            reader.kill()
            reader.join(10)
    stats = json.loads(out.read_text())
    assert stats["errors"] == []
    assert stats["problems"] == []  # a version removed by retention is a restart, not a fallback
    assert stats["nones_after_first"] == 0
    assert stats["versions"] == sorted(stats["versions"]) and stats["versions"][-1] == 20
    assert stats["loads"] >= 5
    print(f"reader: {stats['loads']} verified loads, saw versions {stats['versions']}")


def test_version_deleted_under_a_reader_restarts_from_new_pointer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """Deterministic version of the race: retention removes the target between pointer read and load."""
    writer = new_store(kind, tmp_path / "w", keep=1)
    reader = new_store(kind, tmp_path / "w", keep=1)
    writer.publish(1, tensors_for(1), step=1)
    writer.publish(2, tensors_for(2), step=2)  # v1 deleted: only v2 on disk
    real_load = LocalWeightStore.load
    attempted: list[int] = []

    def racing_load(self: LocalWeightStore, version: int) -> Any:
        attempted.append(version)
        if len(attempted) == 1:  # the reader has read pointer=2; now the writer moves on twice
            writer.publish(3, tensors_for(3), step=3)
            writer.publish(4, tensors_for(4), step=4)
        return real_load(self, version)

    monkeypatch.setattr(LocalWeightStore, "load", racing_load)
    loaded = reader.load_latest()
    assert attempted == [2, 4]
    assert loaded is not None and loaded.version == 4
    assert loaded.fell_back_from is None and loaded.problems == []
    assert_tensors_for(loaded.tensors, 4)
    # A vanished version while the pointer still names it is a genuine fault: fall back.
    monkeypatch.setattr(LocalWeightStore, "load", real_load)
    shutil.copytree(vdir(writer, 4), vdir(writer, 3))
    (vdir(writer, 3) / MANIFEST_FILE).write_text(
        json.dumps({**json.loads((vdir(writer, 4) / MANIFEST_FILE).read_text()), "version": 3})
    )
    shutil.rmtree(vdir(writer, 4))
    loaded = reader.load_latest()
    assert loaded is not None and loaded.version == 3 and loaded.fell_back_from == 4
    assert "no snapshot directory" in loaded.problems[0]


# ---- shared store specifics ------------------------------------------------------------------
@pytest.mark.redis
@pytest.mark.parametrize("kind", ["shared"], indirect=True)
def test_shared_pointer_never_moves_backwards_and_survives_loss(tmp_path: Path, kind: str) -> None:
    a = new_store("shared", tmp_path / "weights", keep=5)
    a.publish(1, tensors_for(1), step=1)
    a.publish(2, tensors_for(2), step=2)
    a._write_pointer(1)  # a delayed write of an older pointer must not rewind readers
    assert raw_pointer(a) == {"version": 2}
    # A second machine's view: another handle on the same shared directory sees the same version.
    b = new_store("shared", tmp_path / "weights", keep=5)
    got = b.load_latest()
    assert got is not None and got.version == 2 and got.problems == []
    # Redis lost the pointer (restarted without persistence): newest valid directory, and
    # versions still increase strictly because publish also looks at the directories.
    set_raw_pointer(a, None)
    got = b.load_latest()
    assert got is not None and got.version == 2
    with pytest.raises(ValueError, match="increase strictly"):
        a.publish(2, tensors_for(2), step=2)
    a.publish(3, tensors_for(3), step=3)
    assert b.latest_version() == 3
    a.close()
    b.close()
