"""Memory before loading: parameter counts from a config alone, training estimates, a fit check.

A model larger than the memory this machine has free is an error *before* any weights are read
(a 7B model on a 24 GB laptop should say so in one line, not swap for ten minutes and die).
:func:`parameter_count` instantiates the architecture on PyTorch's ``meta`` device, which
allocates nothing, so the count is exact for any architecture transformers knows.

:func:`training_estimate` is the planning figure ``asyncrl model info`` prints for a training
step, per role, with the assumptions stated:

* weights: ``P x bytes(dtype)`` in every role that holds the model;
* gradients ``P x bytes(dtype)`` and AdamW's two moments ``2 x P x 4`` bytes (float32 moments)
  in the trainer;
* logits: ``tokens x vocab x 4`` bytes, several times over (logits, log-softmax, their
  gradients) — the term that dominates small models with large vocabularies (49,152 for SmolLM2);
* activations: ``tokens x hidden x layers x 34 x bytes`` (the usual per-layer count of saved
  tensors for a transformer block without recomputation).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from asyncrl.errors import UserError

GIB = 1024**3


class ModelTooLargeError(UserError, RuntimeError):
    """The model (or a training step of it) needs more memory than this machine has free."""


class UnsupportedModelError(UserError, ValueError):
    """A directory whose architecture transformers cannot build as a causal LM."""


def available_memory() -> int:
    """Bytes of memory available to new allocations (``MemAvailable``), or a large number if unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:  # pragma: no cover - not Linux
        pass
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:  # pragma: no cover
        return 1 << 62


def _meta_model(path: Path, trust_remote_code: bool) -> Any:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    where = f"model directory {str(path)!r}"
    try:
        config = AutoConfig.from_pretrained(
            str(path), local_files_only=True, trust_remote_code=trust_remote_code
        )
    except ValueError as exc:
        msg = str(exc).splitlines()[0]
        hint = (
            "; it ships its own code: set model.trust_remote_code=true if you trust it"
            if "trust_remote_code" in msg
            else ""
        )
        raise UnsupportedModelError(
            f"{where}: transformers does not know this architecture ({msg[:160]}){hint}"
        ) from None
    except OSError as exc:
        raise UnsupportedModelError(f"{where}: cannot read config.json ({str(exc)[:160]})") from None
    try:
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)  # type: ignore[no-untyped-call]
    except ValueError as exc:
        kind = getattr(config, "model_type", "?")
        raise UnsupportedModelError(
            f"{where}: model_type {kind!r} is not a causal language model transformers can build "
            f"({str(exc).splitlines()[0][:120]}); asyncrl trains decoder-only LMs (Llama, Qwen2, "
            "Mistral, SmolLM, ...)"
        ) from None


def parameter_count(path: str | Path, *, trust_remote_code: bool) -> int:
    """Exact parameter count of the model in ``path`` (tied weights counted once), loading nothing."""
    model = _meta_model(Path(path), trust_remote_code)
    return sum(p.numel() for p in model.parameters())  # parameters() yields a tied weight once


def config_numbers(path: str | Path) -> dict[str, Any]:
    """The architecture numbers ``model info`` reports, read from ``config.json``."""
    cfg = json.loads((Path(path) / "config.json").read_text())
    text = cfg.get("text_config", cfg)
    return {
        "architecture": (cfg.get("architectures") or [cfg.get("model_type", "?")])[0],
        "model_type": cfg.get("model_type", "?"),
        "hidden_size": text.get("hidden_size"),
        "num_layers": text.get("num_hidden_layers"),
        "vocab_size": text.get("vocab_size"),
        "max_context": text.get("max_position_embeddings"),
        "tie_word_embeddings": text.get("tie_word_embeddings", False),
    }


def training_estimate(
    params: int,
    *,
    vocab: int,
    hidden: int,
    layers: int,
    tokens: int,
) -> dict[str, int]:
    """Bytes of one float32 training step's peak, every weight trained (see the module docstring)."""
    parts = {
        "weights": params * 4,
        "gradients": params * 4,
        "optimizer": params * 8,
        "logits": tokens * vocab * 4 * 3,
        "activations": tokens * hidden * layers * 34 * 4,
    }
    return parts | {"total": sum(parts.values())}


def check_fits(need: int, what: str) -> None:
    """Raise :class:`ModelTooLargeError` when ``need`` bytes exceed what this machine has free."""
    have = available_memory()
    if need > have:
        raise ModelTooLargeError(
            f"{what} needs about {need / GIB:.1f} GiB but this machine has {have / GIB:.1f} GiB free; "
            "use a smaller model, model.dtype=bfloat16, or a machine with more memory"
        )


def _libc() -> Any:
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name) if name else None
    except OSError:  # pragma: no cover - no loadable C library
        return None


def set_mmap_threshold(kb: int) -> bool:
    """Allocations of ``kb`` KiB or more get their own pages, returned to the OS on free (glibc
    ``mallopt(M_MMAP_THRESHOLD)``; fixing it also stops glibc raising it). Returns whether it applied."""
    libc = _libc()
    mallopt = getattr(libc, "mallopt", None)
    if kb <= 0 or mallopt is None:
        return False
    m_mmap_threshold = -3  # from <malloc.h>
    return bool(mallopt(m_mmap_threshold, kb * 1024))


def release_memory() -> None:
    """Collect garbage and hand freed heap pages back to the OS (glibc ``malloc_trim``).

    glibc keeps freed blocks in its arenas, so a process whose peak was a warm start or an
    evaluation keeps that RSS for the rest of its life although the tensors are gone. The launcher
    calls this once the warm start and the initial evaluation are done: it then only supervises.
    A no-op where the C library is not glibc."""
    import gc

    gc.collect()
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is not None:
        trim(0)
