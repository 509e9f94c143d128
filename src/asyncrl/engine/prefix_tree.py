"""Shared-prefix prefill planning for the built-in engine: each distinct prefix is computed once.

The prompts of one engine chunk often share prefixes: the members of a GRPO group are the same
prompt, and every task of an environment starts with the same system prompt and tool schema (a
batch of 4 calculator tasks x 4 samples holds 3,408 prompt tokens of which 291 are distinct).
:func:`plan_prefill` builds a token trie over the chunk's prompts, marks the nodes whose KV a
prefix-cache hit already holds, and groups the remaining nodes into **spans** (chains of nodes
without a branch or a prompt end inside) scheduled in **levels**: a span's parent chain is either
cached or computed at an earlier level. The engine then runs one batched forward per level, each
span a row whose past is the KV of its ancestors (gathered once per span), so every trie node not
in the cache is run through the model exactly once, at its own position (its depth), attending
to exactly its ancestors: the same computation as an unshared prefill, up to float rounding.

Rules:

* A prompt's last token is never taken from the cache (its logits are needed) and always ends a
  span, so the last logits of a level's span rows are the prompts' next-token logits.
* ``share=False`` gives every prompt a trie of its own: the unshared prefill (the prefix cache
  still applies), i.e. ``rollout.engine.prefix_sharing: false``.
* Node ids are assigned in insertion order, so a parent's id is smaller than its children's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

CACHED = -1
"""``PrefillPlan.node_span`` of a node whose KV comes from a prefix-cache entry."""


@dataclass
class Span:
    """A chain of trie nodes computed as one row of a level's batched forward."""

    start: int
    """Depth (= position id) of the first token."""
    parent: int
    """Node id of the node before the span (-1: the span starts the prompt)."""
    level: int
    tokens: list[int] = field(default_factory=list)


@dataclass
class Piece:
    """A run of consecutive columns of one KV source on a root-to-node path."""

    source: tuple[str, int]
    """``("entry", hit index)`` (a prefix-cache hit) or ``("span", span index)``."""
    column: int
    """First column in the source."""
    length: int


@dataclass
class PrefillPlan:
    """The token trie of a chunk's prompts and the spans that compute its uncached nodes."""

    parent: list[int] = field(default_factory=list)
    depth: list[int] = field(default_factory=list)
    token: list[int] = field(default_factory=list)
    node_span: list[int] = field(default_factory=list)
    """Span index of a computed node, :data:`CACHED` for a node taken from a cache hit."""
    node_entry: list[int] = field(default_factory=list)
    """Index of the hit whose entry holds a cached node (-1 for computed nodes)."""
    row_leaf: list[int] = field(default_factory=list)
    """Node id of each prompt's last token."""
    spans: list[Span] = field(default_factory=list)
    levels: list[list[int]] = field(default_factory=list)
    """Span indices per level, in execution order."""
    reused_tokens: int = 0
    """Prompt tokens (counted per prompt) whose node is taken from a cache hit."""

    @property
    def computed_tokens(self) -> int:
        """Trie nodes run through the model (each distinct uncached prefix token once)."""
        return sum(len(s.tokens) for s in self.spans)

    def pieces(self, node: int) -> list[Piece]:
        """The KV sources of the path root..``node`` (inclusive), in column order."""
        out: list[Piece] = []
        while node >= 0:
            span = self.node_span[node]
            if span == CACHED:
                source, column = ("entry", self.node_entry[node]), self.depth[node]
            else:
                source, column = ("span", span), self.depth[node] - self.spans[span].start
            if out and out[-1].source == source and out[-1].column == column + 1:
                out[-1].column, out[-1].length = column, out[-1].length + 1
            else:
                out.append(Piece(source, column, 1))
            node = self.parent[node]
        return out[::-1]


def plan_prefill(prompts: list[list[int]], hits: list[int], *, share: bool) -> PrefillPlan:
    """Plan the prefill of ``prompts``; ``hits[i]``: tokens of prompt ``i`` a cache entry holds (0: none).

    The cached tokens of prompt ``i`` are columns ``0 .. hits[i] - 1`` of hit ``i``'s entry.
    """
    plan = PrefillPlan()
    children: list[dict[int, int]] = []
    ends: list[bool] = []
    roots: dict[int, int] = {}
    paths: list[list[int]] = []
    for r, prompt in enumerate(prompts):
        path: list[int] = []
        node = -1
        for d, tok in enumerate(prompt):
            kids = children[node] if node >= 0 else roots
            # share=False: every prompt its own trie (its first node is keyed by the row too)
            tok_key = tok if share or d else tok + (r << 32)
            nxt = kids.get(tok_key)
            if nxt is None:
                nxt = len(plan.parent)
                kids[tok_key] = nxt
                plan.parent.append(node)
                plan.depth.append(d)
                plan.token.append(tok)
                children.append({})
                ends.append(False)
                plan.node_span.append(0)
                plan.node_entry.append(-1)
            path.append(nxt)
            node = nxt
        ends[node] = True
        plan.row_leaf.append(node)
        paths.append(path)
    # Cached nodes: the longest hits claim their path first, so a path runs through few entries.
    for r in sorted(range(len(prompts)), key=lambda i: -hits[i]):
        for d in range(hits[r]):
            node = paths[r][d]
            if plan.node_entry[node] < 0 and not ends[node]:
                plan.node_entry[node] = r
                plan.node_span[node] = CACHED
    _spans(plan, children, ends)
    plan.reused_tokens = sum(plan.node_span[n] == CACHED for path in paths for n in path)
    return plan


def _spans(plan: PrefillPlan, children: list[dict[int, int]], ends: list[bool]) -> None:
    """Group the computed nodes into spans and the spans into levels (parents before children)."""
    above = [-1] * len(plan.parent)  # level of the nearest computed ancestor-or-self (-1: none)
    for n, p in enumerate(plan.parent):
        if plan.node_span[n] == CACHED:
            above[n] = above[p] if p >= 0 else -1
            continue
        if p >= 0 and plan.node_span[p] != CACHED and len(children[p]) == 1 and not ends[p]:
            s = plan.node_span[p]  # a chain: the parent's span goes on
        else:
            s = len(plan.spans)
            level = above[p] + 1 if p >= 0 else 0
            plan.spans.append(Span(start=plan.depth[n], parent=p, level=level))
            if level == len(plan.levels):
                plan.levels.append([])
            plan.levels[level].append(s)
        plan.node_span[n] = s
        plan.spans[s].tokens.append(plan.token[n])
        above[n] = plan.spans[s].level
