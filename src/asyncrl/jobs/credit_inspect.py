"""``asyncrl credit show``: sampled trajectories segment by segment, with the credit each got.

For each trajectory: the prompt, then one row per segment (model turn + observation) with its
text, the environment's process reward, the value model's estimate before and after, and the
final credit (the segment's per-token advantage), coloured green (positive) to red (negative).
:func:`credit_fragment` renders the same as a self-contained HTML fragment (inline CSS, no
scripts; the Jinja2 template ``templates/credit_fragment.html.j2``) that the run report embeds.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from asyncrl.credit.samples import SAMPLES_DIR, CreditSample, CreditSampleFile, read_samples
from asyncrl.telemetry.markup import templates

if TYPE_CHECKING:
    from rich.tree import Tree


def _tokenizer(run_dir: Path) -> Any:
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(str(run_dir / "initial_policy"), local_files_only=True)


def _latest(run_dir: Path, n: int) -> tuple[list[CreditSampleFile], list[tuple[int, CreditSample]]]:
    files = read_samples(run_dir)
    return files, [(f.step, s) for f in reversed(files) for s in f.samples][:n]


def _segment_texts(sample: CreditSample, tok: Any) -> tuple[str, list[tuple[str, str]]]:
    """The prompt text and, per segment, (model turn text, observation text)."""
    ids = sample.trajectory.token_ids()
    first = sample.segments[0].start if sample.segments else len(ids)
    prompt = tok.decode(ids[:first], skip_special_tokens=True)
    out = []
    pos_model = [
        (sum(len(u.token_ids) for u in sample.trajectory.turns[:i]), len(t.token_ids))
        for i, t in enumerate(sample.trajectory.turns)
        if t.role == "model"
    ]
    for seg in sample.segments:
        me = next((s + n for s, n in pos_model if s == seg.start), seg.end)
        out.append(
            (
                tok.decode(ids[seg.start : me], skip_special_tokens=False).replace("<pad>", ""),
                tok.decode(ids[me : seg.end], skip_special_tokens=False),
            )
        )
    return prompt, out


def _heading(step: int, s: CreditSample) -> str:
    t = s.trajectory
    return (
        f"step {step} · task {t.task.id} · {t.outcome} · reward {t.final_reward:.2f} · "
        f"outcome advantage {s.outcome_advantage:+.2f}"
    )


def _fmt(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f}"


def group_tree(samples: list[CreditSample], tok: Any) -> Tree:
    """A ``rich`` tree of one group's episodes: a node per distinct state (as tree credit finds
    them: the token prefix at a segment boundary), labelled with the segment's text, the measured
    success probability after it (``V``), the leaves below it and its credit."""
    from rich.markup import escape
    from rich.tree import Tree

    from asyncrl.credit.tree import TreeIndex

    index = TreeIndex()
    labels: dict[int, str] = {}
    leaves: dict[int, int] = {}
    first = samples[0]
    for smp in samples:
        spans = [(g.start, g.start, g.end, g.process_reward) for g in smp.segments]
        path = index.add(0, smp.trajectory, spans)
        texts = _segment_texts(smp, tok)[1]
        trained = [not t.shared for t in smp.trajectory.turns if t.role == "model"]
        for node, seg, (act, obs), own in zip(path, smp.segments, texts, trained, strict=False):
            leaves[node] = leaves.get(node, 0) + 1
            if own or node not in labels:
                colour = "green" if seg.credit > 0 else "red" if seg.credit < 0 else "white"
                end = f" · R {smp.trajectory.final_reward:.2f}" if node == path[-1] else ""
                labels[node] = (
                    f"{escape(act.strip()[:60])}[dim]{' → ' + escape(obs.strip()[:40]) if obs else ''}[/] · "
                    f"V {_fmt(seg.v_after)}{end} · [{colour}]credit {seg.credit:+.3f}[/]"
                )
    v_root = first.segments[0].v_before if first.segments else None
    root = Tree(f"[bold]task {first.trajectory.task.id}[/] · V {_fmt(v_root)} · {len(samples)} episodes")
    nodes: dict[int, Tree] = {0: root}
    for node, parent in enumerate(index.parent):
        if parent >= 0:
            nodes[node] = nodes[parent].add(f"{labels.get(node, '')} · {leaves.get(node, 0)} below")
    return root


def render_terminal(run_dir: str | Path, n: int = 5) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    run = Path(run_dir)
    files, picked = _latest(run, n)
    tok = _tokenizer(run)
    console = Console()
    console.print(
        f"[bold]credit samples[/] of {run} — strategy {files[-1].strategy}, {len(files)} sample file(s)"
    )
    if files[-1].strategy == "tree":
        for group in files[-1].groups:
            console.print(group_tree(group.samples, tok))
    for view in _views(picked, tok):
        table = Table(title=view.heading, caption=escape(view.prompt[:200]), show_lines=True)
        for col in ("#", "model turn → observation", "process", "V before", "V after", "credit"):
            table.add_column(col, justify="left" if col.startswith("model") else "right", overflow="fold")
        for k, g in enumerate(view.segments):
            colour = "green" if g.credit > 0 else "red" if g.credit < 0 else "white"
            bold = " bold" if g.strength >= 0.5 else ""
            act = escape(g.act) + (f" [dim]→ {escape(g.obs)}[/]" if g.obs else "")
            table.add_row(
                str(k + 1), act, g.process, g.v_before, g.v_after, f"[{colour}{bold}]{g.credit_text}[/]"
            )
        console.print(table)


@dataclass
class _SegmentRow:
    """One segment as both views show it: its texts, its figures formatted, and its credit."""

    act: str
    obs: str
    process: str
    v_before: str
    v_after: str
    credit: float
    strength: float
    """``|credit|`` relative to the largest of its trajectory (what the colours scale with)."""

    @property
    def credit_text(self) -> str:
        return f"{self.credit:+.3f}"

    @property
    def style(self) -> str:
        """The HTML cell's background: green (positive) or red (negative), as strong as the credit."""
        rgb = "46,160,67" if self.credit > 0 else "215,58,73"
        return f"background:rgba({rgb},{min(1.0, self.strength) * 0.6:.2f})"


@dataclass
class _SampleView:
    heading: str
    prompt: str
    segments: list[_SegmentRow]


def _views(picked: list[tuple[int, CreditSample]], tok: Any) -> list[_SampleView]:
    views = []
    for step, s in picked:
        prompt, texts = _segment_texts(s, tok)
        scale = max((abs(g.credit) for g in s.segments), default=1.0) or 1.0
        rows = [
            _SegmentRow(
                act,
                obs,
                f"{seg.process_reward:+.2f}",
                _fmt(seg.v_before),
                _fmt(seg.v_after),
                seg.credit,
                abs(seg.credit) / scale,
            )
            for seg, (act, obs) in zip(s.segments, texts, strict=True)
        ]
        views.append(_SampleView(_heading(step, s), prompt, rows))
    return views


def credit_fragment(run_dir: str | Path, n: int = 5) -> str:
    """A self-contained HTML fragment (inline CSS, no scripts) showing ``n`` credit samples of the run.

    The markup is ``templates/credit_fragment.html.j2``. A run without sample files
    (``credit.sample_every: 0``) gets a one-line fragment saying so; unreadable sample files raise
    :class:`asyncrl.errors.UserError`.
    """
    run = Path(run_dir)
    template = templates("asyncrl.jobs").get_template("credit_fragment.html.j2")
    if not any((run / SAMPLES_DIR).glob("samples-*.msgpack")):
        return template.render(samples=None)
    files, picked = _latest(run, n)
    return template.render(strategy=files[-1].strategy, samples=_views(picked, _tokenizer(run)))
