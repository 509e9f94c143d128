"""The weight-sync canary: proof, after every load, that an engine serves the version the trainer published.

A weight version (often a LoRA adapter) that never reaches the engine leaves every log line saying
it is loaded (verl#7495); a checksum of the *file* cannot see that, so the check runs on the
engine's model itself. Why and how it is wired, its tests and its tolerances:
``docs/reliability.md#weight-sync-canary``.

**At publish time** the trainer writes a :class:`CanaryRecord` into the version's manifest
(``extra.canary``):

* the **fingerprint** of the version's tensors (:func:`fingerprint`): per tensor
  ``[Σx, Σx², Σ_j w_j x_(s·j), Σ_j x_(s·j)²]`` — sum and sum of squares of every element (float32
  partial sums over rows of ``ROW`` elements, added in float64), then a sum over ``SAMPLE`` evenly
  strided elements with fixed weights ``w_j`` in ``[-1, 1]`` and their sum of squares (a permutation
  or transposition keeps ``Σx`` and ``Σx²`` but changes this one);
* the **probe**: the ids of a fixed prompt (``weights.canary.probe_tokens`` tokens of
  :data:`PROBE_TEXT`) and the trainer's ``log p(id_t | id_<t)``, ``t = 1..n-1``, at temperature 1
  (:func:`probe_logprobs`, eval mode).

**After every load** the engine recomputes both (``GenerationEngine.fingerprint`` over the record's
tensor names, ``GenerationEngine.probe`` on its ids) and :func:`check` compares:

* **fingerprint**, per tensor and statistic, ``|Δ| <= rtol · scale`` with ``scale`` ``sqrt(Σx²)`` for
  the sums and ``Σx²`` for the sums of squares (``rtol`` = ``weights.canary.fingerprint_rtol``). The
  engine holds a bitwise copy of the published tensors (a LoRA merged copy reports the adapter it was
  folded from, :attr:`~asyncrl.policy.lora.MergedCopy.adapter`), so only float32 reduction order may
  differ; an engine in another dtype is compared with the published tensors rounded to it
  (:func:`expected_fingerprint`).
* **probe**: ``mean_t |Δ log p| <= tolerance`` (:func:`probe_tolerance`): catches weights in place but
  not *used* (an adapter disabled, a merged copy never refreshed) and, through the built-in engine's
  prefill and decode path (:meth:`~asyncrl.engine.hf.HFEngine.probe`), a stale or misplaced KV entry.

Any mismatch refuses the version (:class:`~asyncrl.rollout.worker.WeightFollower`): the engine goes
back to the previous good version and the run is told.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from asyncrl.config import CanaryConfig
    from asyncrl.policy.model import Policy

RECORD_FORMAT = 1
SAMPLE = 1024
"""Strided elements per tensor in the position-sensitive part of the fingerprint."""
ROW = 1024
"""Elements per float32 partial sum of the fingerprint (the partial sums are added in float64)."""
PROBE_TEXT = (
    "asyncrl weight-sync canary. The quick brown fox jumps over the lazy dog; 17 * 23 = 391. "
    '<tool_call>{"name": "calc", "arguments": {"expr": "(3 + 4) * 5"}}</tool_call> '
    "Pack my box with five dozen liquor jugs. def f(x): return x ** 2 - 1\n"
)
"""The probe prompt's text (repeated up to ``weights.canary.probe_tokens`` tokens): prose, digits,
a tool call and code, so that many of the model's weights take part in its log-probs."""
_STATS = ("sum", "sum of squares", "strided weighted sum", "strided sum of squares")


@dataclass
class Fingerprint:
    """Per-tensor statistics of a set of weights (:func:`fingerprint`) and the dtype they were held in."""

    dtype: str
    tensors: dict[str, list[float]] = field(default_factory=dict)


@dataclass
class CanaryRecord:
    """What the trainer recorded for one version (the manifest's ``extra.canary``)."""

    fingerprint: Fingerprint
    probe_ids: list[int]
    probe_logprobs: list[float]

    def to_doc(self) -> dict[str, object]:
        return {
            "format": RECORD_FORMAT,
            "dtype": self.fingerprint.dtype,
            "fingerprint": self.fingerprint.tensors,
            "probe_ids": self.probe_ids,
            "probe_logprobs": self.probe_logprobs,
        }

    @classmethod
    def from_manifest(cls, manifest: Mapping[str, Any]) -> CanaryRecord | None:
        """The record in a version's manifest; ``None`` when it has none (published without a canary)."""
        doc = (manifest.get("extra") or {}).get("canary")
        if not isinstance(doc, dict) or doc.get("format") != RECORD_FORMAT:
            return None
        return cls(
            Fingerprint(str(doc["dtype"]), {k: [float(x) for x in v] for k, v in doc["fingerprint"].items()}),
            [int(i) for i in doc["probe_ids"]],
            [float(x) for x in doc["probe_logprobs"]],
        )


@functools.cache
def _sample_weights() -> torch.Tensor:
    """Fixed pseudo-random weights in [-1, 1] for the strided sample (the same in every process)."""
    g = torch.Generator().manual_seed(20261202)
    return torch.rand(SAMPLE, generator=g, dtype=torch.float64) * 2 - 1


def tensor_fingerprint(t: torch.Tensor) -> torch.Tensor:
    """``[Σx, Σx², Σ_j w_j x_(s·j), Σ_j x_(s·j)²]`` of one tensor, as float64 on its device.

    The sums run in float32 over rows of :data:`ROW` elements, then in float64 over the rows: one pass
    over memory, and an error that does not grow with the tensor (one float32 dot product over
    SmolLM2's 28M-element embedding is 1.2e-3 off, one float32 sum differs between 1 and 2 threads).
    """
    x = t.detach().reshape(-1)
    if x.numel() == 0:
        return torch.zeros(4, dtype=torch.float64, device=x.device)
    x = x.float()  # no copy for float32; bf16 / fp16 / integers are widened
    m = x.numel() // ROW * ROW
    rows, tail = x[:m].view(-1, ROW), x[m:].double()
    sample = x[:: max(1, x.numel() // SAMPLE)][:SAMPLE].double()
    return torch.stack(
        [
            rows.sum(1).double().sum() + tail.sum(),
            torch.linalg.vecdot(rows, rows).double().sum() + tail.dot(tail),
            sample.dot(_sample_weights()[: sample.numel()].to(x.device)),
            sample.dot(sample),
        ]
    )


def fingerprint(tensors: Mapping[str, torch.Tensor]) -> Fingerprint:
    """The :class:`Fingerprint` of ``tensors`` (one host transfer at the end, whatever the device)."""
    if not tensors:
        return Fingerprint("none")
    names = sorted(tensors)
    stats = torch.stack([tensor_fingerprint(tensors[n]).cpu() for n in names]).tolist()
    dtypes = {str(t.dtype).removeprefix("torch.") for t in tensors.values()}
    return Fingerprint("+".join(sorted(dtypes)), dict(zip(names, stats, strict=True)))


def expected_fingerprint(
    record: CanaryRecord, engine_dtype: str, published: Mapping[str, torch.Tensor]
) -> Fingerprint:
    """What an engine holding ``engine_dtype`` should report: the record's fingerprint when the dtypes
    agree, else that of the published (sha256-verified) tensors rounded to the engine's dtype."""
    if engine_dtype == record.fingerprint.dtype or "+" in engine_dtype:
        return record.fingerprint
    dtype = getattr(torch, engine_dtype, None)
    if not isinstance(dtype, torch.dtype):
        return record.fingerprint
    return fingerprint({k: v.to(dtype) if v.is_floating_point() else v for k, v in published.items()})


def probe_ids(tokenizer: PreTrainedTokenizerBase, n: int, max_context: int) -> list[int]:
    """The probe prompt: :data:`PROBE_TEXT` tokenised, repeated, cut to ``min(n, max_context)`` tokens."""
    one = list(tokenizer.encode(PROBE_TEXT, add_special_tokens=False)) or [0]
    want = max(2, min(n, max_context))
    return (one * (want // len(one) + 1))[:want]


def probe_logprobs(model: Any, ids: Sequence[int]) -> list[float]:
    """``log p(ids[t] | ids[:t])`` for ``t = 1..len(ids)-1`` at temperature 1, in eval mode, no gradient."""
    from asyncrl.policy.scoring import token_logprobs

    device = next(model.parameters()).device
    x = torch.tensor([list(ids)], dtype=torch.long, device=device)
    was_training = model.training
    model.train(False)
    try:
        with torch.no_grad():
            lp = token_logprobs(model, x, torch.ones_like(x))
    finally:
        model.train(was_training)
    out: list[float] = lp[0, 1:].float().cpu().tolist()
    return out


def publish_record(policy: Policy, tensors: Mapping[str, torch.Tensor], cfg: CanaryConfig) -> dict[str, Any]:
    """The manifest entry (``extra["canary"]``) of a version holding ``tensors`` (the policy's weights now)."""
    ids = probe_ids(policy.tokenizer, cfg.probe_tokens, policy.max_context)
    return CanaryRecord(fingerprint(tensors), ids, probe_logprobs(policy.model, ids)).to_doc()


def probe_tolerance(cfg: CanaryConfig, dtypes: Sequence[str]) -> float:
    """The probe's tolerance on ``mean |Δ log p|``: ``weights.canary.probe_tolerance``, else the
    default for the coarsest of ``dtypes`` (the trainer's and the engine's compute dtypes)."""
    if cfg.probe_tolerance is not None:
        return cfg.probe_tolerance
    return cfg.probe_tolerance_float32 if set(dtypes) <= {"float32"} else cfg.probe_tolerance_half


@dataclass
class Verdict:
    """The outcome of one :func:`check`: ``problems`` empty means the engine serves the version."""

    problems: list[str] = field(default_factory=list)
    tensors_checked: int = 0
    tensors_differing: list[str] = field(default_factory=list)
    probe_mean_abs_diff: float | None = None
    probe_tolerance: float | None = None

    @property
    def ok(self) -> bool:
        return not self.problems

    def evidence(self) -> dict[str, object]:
        return {
            "problems": self.problems[:5],
            "tensors_checked": self.tensors_checked,
            "tensors_differing": self.tensors_differing[:10],
            "tensors_differing_count": len(self.tensors_differing),
            "probe_mean_abs_diff": self.probe_mean_abs_diff,
            "probe_tolerance": self.probe_tolerance,
        }


def compare_fingerprints(want: Fingerprint, got: Fingerprint, rtol: float, verdict: Verdict) -> None:
    """Add to ``verdict`` every tensor whose statistics differ beyond ``rtol`` times their scale."""
    for name, w in want.tensors.items():
        g = got.tensors.get(name)
        verdict.tensors_checked += 1
        if g is None:
            verdict.tensors_differing.append(name)
            verdict.problems.append(f"{name}: not in the engine's model")
            continue
        scales = (w[1] ** 0.5, w[1], w[3] ** 0.5, w[3])
        for stat, a, b, scale in zip(_STATS, w, g, scales, strict=True):
            if abs(a - b) > rtol * scale + 1e-30:
                verdict.tensors_differing.append(name)
                verdict.problems.append(f"{name}: {stat} {b:.6g} in the engine, {a:.6g} published")
                break


def check(
    record: CanaryRecord,
    got_fingerprint: Fingerprint | None,
    want_fingerprint: Fingerprint,
    got_probe: Sequence[float] | None,
    *,
    rtol: float,
    tolerance: float,
) -> Verdict:
    """Compare what the engine reports with what the trainer recorded (module docstring); ``None``
    for a part the engine cannot report leaves that part unchecked."""
    v = Verdict()
    if got_fingerprint is not None:
        compare_fingerprints(want_fingerprint, got_fingerprint, rtol, v)
    if got_probe is None:
        return v
    v.probe_tolerance = tolerance
    if len(got_probe) != len(record.probe_logprobs):
        v.problems.append(
            f"probe: {len(got_probe)} log-probs from the engine, {len(record.probe_logprobs)} recorded"
        )
        return v
    diffs = [abs(a - b) for a, b in zip(got_probe, record.probe_logprobs, strict=True)]
    v.probe_mean_abs_diff = sum(diffs) / max(1, len(diffs))
    if not v.probe_mean_abs_diff <= tolerance:  # NaN fails too
        v.problems.append(
            f"probe: mean |Δ log p| {v.probe_mean_abs_diff:.3g} over {len(diffs)} tokens > tolerance {tolerance:.3g}"
        )
    return v
