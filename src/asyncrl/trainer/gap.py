"""The train–inference log-prob gap over a trainer process's steps (the maths: :mod:`asyncrl.algo.gap`).

Each trained step adds the gap terms of its comparable tokens (the learner decides which:
:meth:`asyncrl.trainer.learner.Learner._record_gap`); the tally keeps sums, extremes and a fixed-bin
histogram of the per-token gaps, so its figures (:class:`~asyncrl.telemetry.reports.GapFigures`, one
section of every trainer row) cover the whole process in bounded memory: the mean, max, k3 and the
sequence share exactly, the p99 read from the histogram (at most 2.33 % above the exact value).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from asyncrl.algo import GAP_SEQUENCE_NATS, GapTerms, gap_histogram, gap_metrics, histogram_quantile
from asyncrl.telemetry.reports import GapFigures


class GapTally:
    """Cumulative gap figures over the steps added; :meth:`figures` is the report section."""

    def __init__(self) -> None:
        self.tokens = 0
        self.abs_sum = 0.0
        self.k3_sum = 0.0
        self.max = 0.0
        self.sequences = 0
        self.sequences_over = 0
        self.hist = gap_histogram(torch.zeros(0))
        self.step: dict[str, float] = {}

    def add(self, parts: Sequence[GapTerms]) -> dict[str, float]:
        """Add one step's terms (its micro-batches'); returns the step's figures, ``gap/step_*`` (only
        ``gap/step_tokens``, 0, when the step compared no token: every one sampled by older weights)."""
        if not parts:
            terms = GapTerms(torch.zeros(0), torch.zeros(0), torch.zeros(0))
        else:
            terms = GapTerms(*(torch.cat([getattr(p, f).cpu() for p in parts]) for f in GapTerms._fields))
        step = gap_metrics(terms, GAP_SEQUENCE_NATS)
        self.tokens += int(step["tokens"])
        self.abs_sum += float(terms.token_abs.double().sum())
        self.k3_sum += float(terms.token_k3.double().sum())
        self.max = max(self.max, step["max"])
        self.sequences += int(step["sequences"])
        self.sequences_over += int(step["sequences_over"])
        self.hist += gap_histogram(terms.token_abs)
        keys = ("tokens", "mean", "p99", "max") if step["tokens"] else ("tokens",)  # none compared: no figure
        self.step = {k: step[k] for k in keys}
        return {f"gap/step_{k}": v for k, v in self.step.items()}

    def figures(self) -> GapFigures:
        """The process's figures so far (``None`` before any comparable token)."""
        n = self.tokens
        return GapFigures(
            tokens=float(n),
            mean=self.abs_sum / n if n else 0.0,
            p99=histogram_quantile(self.hist, 0.99),
            max=self.max,
            sequences=float(self.sequences),
            sequences_over=float(self.sequences_over),
            k3=self.k3_sum / n if n else 0.0,
            step_tokens=self.step.get("tokens"),
            step_mean=self.step.get("mean"),
            step_p99=self.step.get("p99"),
            step_max=self.step.get("max"),
        )
