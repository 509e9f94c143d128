"""Resumable trainer checkpoints: policy, optimiser, LR schedule, RNG and counters.

Layout of one checkpoint, ``root/step_{N:08d}/`` (``N`` = optimiser steps done)::

    policy/                 Policy.save: model.safetensors, config.json, tokenizer files
    optimizer.safetensors   every tensor of optimizer.state_dict(), keys "state.{param}.{name}"
                            (tensors in param_groups, e.g. a tensor lr, as "param_groups.{g}.{name}")
    optimizer.json          optimiser class, param_groups and every non-tensor state entry
    scheduler.json          scheduler.state_dict() minus callables (LambdaLR's lambdas are code,
                            recreated by the caller; only last_epoch, base_lrs, _last_lr ... are kept)
    scheduler.safetensors   only when the scheduler state holds tensors
    rng.safetensors         torch.get_rng_state() (and CUDA generator states, when present)
    rng.json                random.Random.getstate() as JSON lists, when a py_rng was given
    trainer_state.json      TrainerState: step, last_published, consumed, extra
    manifest.json           sha256 and size of every other file; written LAST

A trainer group (``trainer.world_size > 1``) writes ``optimizer_shards/`` instead of
``optimizer.safetensors``: the same tensors, saved by every rank together with
``torch.distributed.checkpoint`` (``HuggingFaceStorageWriter``: safetensors shards, each tensor
written once by one rank, metadata in JSON headers, no Python object serialisation) —
:func:`write_optimizer_shards`. Everything else is written once by rank 0 (the policy is the full state every rank holds), and the manifest covers the shards
too. A sharded checkpoint loads in any world size, one rank included (:func:`read_optimizer_shards`
reads every shard; the state is replicated on every rank), and a one-rank checkpoint loads on N.

No Python object serialisation is used: tensors go to safetensors, the rest to JSON. Non-JSON Python
values (tuples, int dict keys, tensors nested in state) are stored with small tagged JSON
objects (``{"__tuple__": [...]}``, ``{"__items__": [[k, v], ...]}``, ``{"__tensor__": key}``)
so the state dicts round-trip exactly; floats round-trip exactly through JSON.

Atomicity: a checkpoint is written into ``root/.tmp-step_{N:08d}-<random>/``; every file
is fsynced, ``manifest.json`` is written last, the directory is fsynced and then renamed
to ``step_{N:08d}`` (one ``os.rename``, atomic on POSIX), and ``root`` is fsynced
(:func:`asyncrl.durable.staged_dir`, the mechanism the weight store uses too). A crash
at any point leaves either the complete checkpoint or a temp directory that readers
ignore and the next save deletes. A ``step_*`` directory without ``manifest.json`` is
incomplete and never returned by :func:`latest_checkpoint`; a file whose hash disagrees
with the manifest makes :func:`load_checkpoint` raise :class:`CheckpointError` naming it.

Retention: after each save the newest ``keep`` complete checkpoints (by step) are kept,
older ones are deleted, and so are stale temp directories. The checkpoint just written is
always kept, even when newer-numbered ones exist (a run resumed from an older checkpoint).
One writer per ``root`` is assumed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import re
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors import safe_open
from safetensors.torch import save as st_save

from asyncrl.config import TrainerConfig, default_of
from asyncrl.durable import discard, hash_file, hash_tree, remove_stale, staged_dir, to_prune, write_durably
from asyncrl.errors import UserError

if TYPE_CHECKING:
    from asyncrl.policy.model import Policy

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
POLICY_DIR = "policy"
POLICY_WEIGHTS = f"{POLICY_DIR}/model.safetensors"
OPTIMIZER_TENSORS = "optimizer.safetensors"
OPTIMIZER_JSON = "optimizer.json"
OPTIMIZER_SHARDS = "optimizer_shards"
SCHEDULER_JSON = "scheduler.json"
SCHEDULER_TENSORS = "scheduler.safetensors"
RNG_TENSORS = "rng.safetensors"
RNG_JSON = "rng.json"
TRAINER_STATE = "trainer_state.json"

_STEP_RE = re.compile(r"^step_(\d{8,})$")
_TMP_PREFIX = ".tmp-step_"
_OLD_PREFIX = ".old-step_"


class CheckpointError(UserError):
    """A checkpoint is missing, incomplete or corrupt, or cannot be written; names the file."""


@dataclass
class TrainerState:
    """Counters of the training loop that a resumed run must continue from."""

    step: int
    """Optimiser steps done (== weight version of the model in the checkpoint)."""
    last_published: int
    """Newest weight version published to the weight store (may exceed ``step`` after a crash)."""
    consumed: int
    """Trajectories consumed so far (trained + dropped)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """JSON-serialisable extras (metrics accumulators, etc.)."""

    def to_json(self) -> dict[str, Any]:
        return {"format_version": FORMAT_VERSION, **asdict(self)}

    @classmethod
    def from_json(cls, data: Any) -> TrainerState:
        if not isinstance(data, dict):
            raise ValueError("expected a JSON object")
        for name in ("step", "last_published", "consumed"):
            v = data.get(name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"field {name!r} must be a non-negative integer, got {v!r}")
        extra = data.get("extra", {})
        if not isinstance(extra, dict):
            raise ValueError(f"field 'extra' must be an object, got {type(extra).__name__}")
        return cls(
            step=data["step"], last_published=data["last_published"], consumed=data["consumed"], extra=extra
        )


# ---------------------------------------------------------------------------------------------
# Tagged JSON: exact round-trip of state dicts, data only.
_TAGS = ("__tuple__", "__items__", "__tensor__")


def _encode(obj: Any, key: str, tensors: dict[str, torch.Tensor], *, drop_callables: bool, where: str) -> Any:
    """``obj`` as JSON data; tensors are moved to ``tensors`` under ``key`` (a dotted path)."""
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, torch.Tensor):
        tensors[key] = obj.detach().to("cpu", copy=True).contiguous()
        return {"__tensor__": key}
    sub = partial(_encode, tensors=tensors, drop_callables=drop_callables, where=where)

    def dropped(v: object) -> bool:
        return drop_callables and callable(v) and not isinstance(v, torch.Tensor)

    if isinstance(obj, (list, tuple)):
        items = [None if dropped(v) else sub(v, f"{key}.{i}") for i, v in enumerate(obj)]
        return {"__tuple__": items} if isinstance(obj, tuple) else items
    if isinstance(obj, dict):
        enc = {k: sub(v, f"{key}.{k}") for k, v in obj.items() if not dropped(v)}
        if all(isinstance(k, str) and k not in _TAGS for k in enc):
            return enc
        for k in enc:
            if not (k is None or isinstance(k, (bool, int, float, str))):
                raise CheckpointError(f"cannot store {where}: dict key {k!r} at {key!r} is not a scalar")
        return {"__items__": [[k, v] for k, v in enc.items()]}
    raise CheckpointError(
        f"cannot store {where}: value of type {type(obj).__name__} at {key!r} is neither a tensor "
        "nor JSON data (bool/int/float/str/None/list/tuple/dict)"
    )


def _decode(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """Inverse of :func:`_encode`."""
    if isinstance(obj, list):
        return [_decode(v, tensors) for v in obj]
    if isinstance(obj, dict):
        if len(obj) == 1:
            ((tag, val),) = obj.items()
            if tag == "__tuple__":
                return tuple(_decode(v, tensors) for v in val)
            if tag == "__items__":
                return {k: _decode(v, tensors) for k, v in val}
            if tag == "__tensor__":
                if val not in tensors:
                    raise KeyError(f"tensor {val!r} is referenced but not stored")
                return tensors[val]
        return {k: _decode(v, tensors) for k, v in obj.items()}
    return obj


# ---------------------------------------------------------------------------------------------
# File helpers


def _write_json(path: Path, data: Any) -> None:
    write_durably(path, (json.dumps(data, indent=1, sort_keys=False) + "\n").encode())


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def _complete_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """``(step, path)`` of every ``step_*`` directory with a manifest, oldest first."""
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), c) for c in root.iterdir() if (m := _STEP_RE.match(c.name))]
    return sorted((s, c) for s, c in found if c.is_dir() and (c / MANIFEST).is_file())


# ---------------------------------------------------------------------------------------------
# Save
def _optimizer_payload(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    sd = optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    where = f"the {type(optimizer).__name__} optimizer state"
    state = {
        str(idx): _encode(entries, f"state.{idx}", tensors, drop_callables=False, where=where)
        for idx, entries in sd["state"].items()
    }
    non_tensor = {
        str(idx): {name: type(v).__name__ for name, v in entries.items() if not isinstance(v, torch.Tensor)}
        for idx, entries in sd["state"].items()
    }
    groups = _encode(sd["param_groups"], "param_groups", tensors, drop_callables=False, where=where)
    meta = {
        "format_version": FORMAT_VERSION,
        "class": type(optimizer).__name__,
        "param_groups": groups,
        "state": state,
        "non_tensor_state": {k: v for k, v in non_tensor.items() if v},  # informational: names, types
    }
    return tensors, meta


def _rng_tensors() -> dict[str, torch.Tensor]:
    out = {"torch": torch.get_rng_state().clone()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            out[f"cuda.{i}"] = s.cpu().clone()
    return out


def _py_rng_json(rng: random.Random) -> dict[str, object]:
    version, internal, gauss_next = rng.getstate()
    return {"version": version, "state": list(internal), "gauss_next": gauss_next}


def save_checkpoint(
    root: Path,
    policy: Policy,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None,
    state: TrainerState,
    py_rng: random.Random | None = None,
    keep: int = default_of(TrainerConfig, "keep_checkpoints"),
    optimizer_shards: Callable[[Path], None] | None = None,
) -> Path:
    """Write ``root/step_{state.step:08d}`` atomically, apply retention, return its path.

    ``optimizer_shards``: a trainer group's collective writer of the optimiser tensors, called with
    the directory to fill (:data:`OPTIMIZER_SHARDS`) instead of writing ``optimizer.safetensors``.
    An existing checkpoint of the same step is replaced. Raises :class:`CheckpointError`
    when some state is neither tensors nor JSON data (e.g. non-JSON ``state.extra``).
    """
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    if state.step < 0:
        raise ValueError(f"state.step must be >= 0, got {state.step}")
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{state.step:08d}"
    try:
        trainer_json = json.dumps(state.to_json(), indent=1)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"cannot store TrainerState.extra as JSON ({_short(exc)})") from None
    opt_tensors, opt_meta = _optimizer_payload(optimizer)
    sched_meta: dict[str, object] | None = None
    sched_tensors: dict[str, torch.Tensor] = {}
    if scheduler is not None:
        sched_meta = {
            "format_version": FORMAT_VERSION,
            "class": type(scheduler).__name__,
            "state": _encode(
                scheduler.state_dict(),
                "state",
                sched_tensors,
                drop_callables=True,
                where=f"the {type(scheduler).__name__} scheduler state",
            ),
        }
    with staged_dir(
        final, tmp_prefix=f"{_TMP_PREFIX}{state.step:08d}-", replace_prefix=f"{_OLD_PREFIX}{state.step:08d}-"
    ) as tmp:
        policy.save(tmp / POLICY_DIR)
        if optimizer_shards is not None:
            optimizer_shards(tmp / OPTIMIZER_SHARDS)
        else:
            write_durably(tmp / OPTIMIZER_TENSORS, st_save(opt_tensors, metadata={"format": "pt"}))
        _write_json(tmp / OPTIMIZER_JSON, opt_meta)
        if sched_meta is not None:
            _write_json(tmp / SCHEDULER_JSON, sched_meta)
            if sched_tensors:
                write_durably(tmp / SCHEDULER_TENSORS, st_save(sched_tensors, metadata={"format": "pt"}))
        write_durably(tmp / RNG_TENSORS, st_save(_rng_tensors(), metadata={"format": "pt"}))
        if py_rng is not None:
            _write_json(tmp / RNG_JSON, _py_rng_json(py_rng))
        write_durably(tmp / TRAINER_STATE, (trainer_json + "\n").encode())

        files = hash_tree(tmp)  # fsyncs every file and sub-directory: Policy.save's files too
        _write_json(tmp / MANIFEST, {"format_version": FORMAT_VERSION, "step": state.step, "files": files})
    _apply_retention(root, keep, final)
    return final


def write_optimizer_shards(path: Path, optimizer: torch.optim.Optimizer) -> None:
    """Collective over the trainer group: every rank calls it with the same ``path``; each tensor of
    the (replicated) optimiser state is written once, by the rank the planner assigns it to."""
    from torch.distributed.checkpoint.hf_storage import HuggingFaceStorageWriter
    from torch.distributed.checkpoint.state_dict_saver import save

    tensors, _ = _optimizer_payload(optimizer)
    save(tensors, storage_writer=HuggingFaceStorageWriter(str(path), save_distributed=True))


def read_optimizer_shards(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a sharded optimiser state, read by this process alone (any world size)."""
    from torch.distributed.checkpoint.hf_storage import HuggingFaceStorageReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    from torch.distributed.checkpoint.state_dict_loader import load

    meta = HuggingFaceStorageReader(str(path)).read_metadata().state_dict_metadata
    out: dict[str, torch.Tensor] = {}
    for k, m in meta.items():
        if not isinstance(m, TensorStorageMetadata):
            raise ValueError(f"{k} is not a tensor")
        out[k] = torch.empty(m.size, dtype=m.properties.dtype)
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.simplefilter("ignore", UserWarning)
        load(out, storage_reader=HuggingFaceStorageReader(str(path)), no_dist=True)
    return out


def _apply_retention(root: Path, keep: int, current: Path) -> None:
    for path in to_prune([p for _, p in _complete_checkpoints(root)], keep, {current}):
        log.info("checkpoint retention: deleting %s", path)
        discard(path)
    for stale in remove_stale(root, (_TMP_PREFIX, _OLD_PREFIX)):
        log.info("checkpoint retention: deleted stale temp directory %s", stale)


# ---------------------------------------------------------------------------------------------
# Find / verify
def _read_manifest(path: Path) -> dict[str, dict[str, Any]]:
    mpath = path / MANIFEST
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {str(path)!r} does not exist or is not a directory")
    if not mpath.is_file():
        raise CheckpointError(
            f"checkpoint {str(path)!r} has no {MANIFEST}: it is incomplete (a save was interrupted)"
        )
    try:
        data = json.loads(mpath.read_text())
        files = data["files"]
        if not isinstance(files, dict) or not all(
            isinstance(v, dict) and isinstance(v.get("sha256"), str) for v in files.values()
        ):
            raise ValueError("'files' must map names to {sha256, bytes}")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"checkpoint {str(path)!r}: {MANIFEST} is corrupt ({_short(exc)})") from None
    return files


def verify_checkpoint(path: Path) -> None:
    """Raise :class:`CheckpointError` unless every file of the manifest is present and intact."""
    path = Path(path)
    files = _read_manifest(path)
    sharded = any(rel.startswith(f"{OPTIMIZER_SHARDS}/") for rel in files)
    optimizer = () if sharded else (OPTIMIZER_TENSORS,)
    for required in (POLICY_WEIGHTS, *optimizer, OPTIMIZER_JSON, RNG_TENSORS, TRAINER_STATE):
        if required not in files:
            raise CheckpointError(f"checkpoint {str(path)!r}: {MANIFEST} does not list {required}")
    for rel, entry in files.items():
        f = path / rel
        if not f.is_file():
            raise CheckpointError(f"checkpoint {str(path)!r}: {rel} is missing")
        try:
            digest, size = hash_file(f)
        except OSError as exc:
            raise CheckpointError(f"checkpoint {str(path)!r}: cannot read {rel} ({_short(exc)})") from None
        if digest != entry["sha256"] or ("bytes" in entry and size != entry["bytes"]):
            raise CheckpointError(
                f"checkpoint {str(path)!r}: {rel} is corrupt (sha256 does not match {MANIFEST})"
            )


def latest_checkpoint(root: Path, verify: bool = False) -> Path | None:
    """Newest complete checkpoint under ``root`` (has a manifest), or None.

    Temp and partial directories are ignored. With ``verify=True`` every file's hash is
    checked and corrupt checkpoints are skipped (with a warning) in favour of older ones.
    """
    for _, path in reversed(_complete_checkpoints(Path(root))):
        if not verify:
            return path
        try:
            verify_checkpoint(path)
        except CheckpointError as exc:
            log.warning("skipping corrupt checkpoint: %s", exc)
            continue
        return path
    return None


# ---------------------------------------------------------------------------------------------
# Load
def _existing(path: Path, rel: str) -> Path:
    if not (path / rel).is_file():
        raise CheckpointError(f"checkpoint {str(path)!r}: {rel} is missing")
    return path / rel


def _corrupt(path: Path, rel: str, exc: BaseException) -> CheckpointError:
    return CheckpointError(f"checkpoint {str(path)!r}: {rel} is corrupt ({_short(exc)})")


def _load_tensors(path: Path, rel: str) -> dict[str, torch.Tensor]:
    f = _existing(path, rel)
    try:
        with safe_open(str(f), framework="pt", device="cpu") as st:
            return {k: st.get_tensor(k) for k in st.keys()}  # noqa: SIM118 - safe_open is not a Mapping
    except Exception as exc:
        raise _corrupt(path, rel, exc) from None


def _load_json(path: Path, rel: str) -> Any:
    f = _existing(path, rel)
    try:
        return json.loads(f.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _corrupt(path, rel, exc) from None


_STATE_ERRORS = (AttributeError, KeyError, TypeError, ValueError)


@contextlib.contextmanager
def _restoring(path: Path, rel: str, what: str, errors: tuple[type[Exception], ...]) -> Iterator[None]:
    """``errors`` raised in the block become one :class:`CheckpointError`: ``what`` cannot be restored."""
    try:
        yield
    except errors as exc:
        raise CheckpointError(
            f"checkpoint {str(path)!r}: cannot restore {what} from {rel} ({_short(exc)})"
        ) from None


def _check_class(meta: Mapping[str, object], obj: object, what: str) -> None:
    """``meta`` (a saved state's JSON) was written by an ``obj`` of the same class (``what``: its kind)."""
    if meta.get("class") != type(obj).__name__:
        raise ValueError(f"it was written by a {meta.get('class')} {what}, got {type(obj).__name__}")


def load_checkpoint(
    path: Path,
    policy: Policy,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    py_rng: random.Random | None = None,
    *,
    verify: bool = True,
) -> TrainerState:
    """Restore policy weights, optimiser, scheduler and RNG states in place; return the counters.

    Every file is hash-checked against the manifest first (``verify=False`` skips that).
    Weights are copied into the existing parameters, so ``optimizer`` must have been built
    on ``policy.model`` the same way as when saving. Every failure is one
    :class:`CheckpointError` naming the file.
    """
    path = Path(path)
    if verify:
        verify_checkpoint(path)
    else:
        _read_manifest(path)

    with _restoring(path, TRAINER_STATE, "the trainer state", (ValueError,)):
        state = TrainerState.from_json(_load_json(path, TRAINER_STATE))

    # Parse everything before mutating anything, so a bad file leaves the objects untouched.
    weights = _load_tensors(path, POLICY_WEIGHTS)
    opt_sd = _read_optimizer(path, optimizer)
    sched_sd = _read_scheduler(path, scheduler) if scheduler is not None else None
    rng, py_state = _read_rng(path, py_rng)

    with _restoring(path, POLICY_WEIGHTS, "the policy weights", (ValueError,)):
        policy.load_tensors(weights)
    with _restoring(path, OPTIMIZER_JSON, "the optimizer", (KeyError, TypeError, ValueError)):
        optimizer.load_state_dict(opt_sd)
    if scheduler is not None and sched_sd is not None:
        with _restoring(path, SCHEDULER_JSON, "the LR scheduler", _STATE_ERRORS):
            scheduler.load_state_dict(sched_sd)
    _restore_rng(path, rng, py_rng, py_state)
    return state


def _read_optimizer(path: Path, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's state dict as saved (sharded or whole), checked against ``optimizer``'s class."""
    if (path / OPTIMIZER_SHARDS).is_dir():
        try:
            opt_tensors = read_optimizer_shards(path / OPTIMIZER_SHARDS)
        except Exception as exc:
            raise _corrupt(path, OPTIMIZER_SHARDS, exc) from None
    else:
        opt_tensors = _load_tensors(path, OPTIMIZER_TENSORS)
    opt_meta = _load_json(path, OPTIMIZER_JSON)
    with _restoring(path, OPTIMIZER_JSON, "the optimizer", _STATE_ERRORS):
        _check_class(opt_meta, optimizer, "optimizer")
        state = {int(k): _decode(v, opt_tensors) for k, v in opt_meta["state"].items()}
        groups = _decode(opt_meta["param_groups"], opt_tensors)
    return {"state": state, "param_groups": groups}


def _read_scheduler(path: Path, scheduler: torch.optim.lr_scheduler.LRScheduler) -> dict[str, Any]:
    meta = _load_json(path, SCHEDULER_JSON)
    sched_tensors = _load_tensors(path, SCHEDULER_TENSORS) if (path / SCHEDULER_TENSORS).exists() else {}
    with _restoring(path, SCHEDULER_JSON, "the LR scheduler", _STATE_ERRORS):
        _check_class(meta, scheduler, "scheduler")
        sched_sd = _decode(meta["state"], sched_tensors)
        if not isinstance(sched_sd, dict):
            raise TypeError("state is not an object")
    return sched_sd


def _read_rng(
    path: Path, py_rng: random.Random | None
) -> tuple[dict[str, torch.Tensor], tuple[Any, ...] | None]:
    """The torch (and CUDA) RNG tensors, and the Python RNG state when ``py_rng`` is to be restored."""
    rng = _load_tensors(path, RNG_TENSORS)
    if "torch" not in rng or rng["torch"].dtype != torch.uint8:
        raise CheckpointError(f"checkpoint {str(path)!r}: {RNG_TENSORS} has no uint8 'torch' RNG state")
    if py_rng is None:
        return rng, None
    data = _load_json(path, RNG_JSON)
    with _restoring(path, RNG_JSON, "the Python RNG", (KeyError, TypeError, ValueError)):
        py_state = (int(data["version"]), tuple(int(x) for x in data["state"]), data["gauss_next"])
    return rng, py_state


def _restore_rng(
    path: Path, rng: dict[str, torch.Tensor], py_rng: random.Random | None, py_state: tuple[Any, ...] | None
) -> None:
    with _restoring(path, RNG_TENSORS, "the torch RNG", (RuntimeError, ValueError)):
        torch.set_rng_state(rng["torch"])
        cuda = [rng[f"cuda.{i}"] for i in range(len(rng)) if f"cuda.{i}" in rng]
        if cuda and torch.cuda.is_available():
            if len(cuda) == torch.cuda.device_count():
                torch.cuda.set_rng_state_all(cuda)
            else:
                log.warning(
                    "checkpoint has %d CUDA RNG states but %d devices are visible; CUDA RNG not restored",
                    len(cuda),
                    torch.cuda.device_count(),
                )
    if py_rng is not None and py_state is not None:
        with _restoring(path, RNG_JSON, "the Python RNG", (TypeError, ValueError)):
            py_rng.setstate(py_state)


__all__ = [
    "CheckpointError",
    "TrainerState",
    "latest_checkpoint",
    "load_checkpoint",
    "read_optimizer_shards",
    "save_checkpoint",
    "verify_checkpoint",
    "write_optimizer_shards",
]
