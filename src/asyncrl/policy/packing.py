"""Prefix-shared forward passes (tree training): rows that share a prefix compute it once.

The members of a GRPO group are the same prompt with different continuations, and every row of a
run usually opens with the same system prompt; a padded ``[B, T]`` batch forwards each shared token
once per row. Here the rows of a micro-batch are merged into a **token trie**: one node per distinct
prefix, ``node(b, t)`` the node of row ``b``'s prefix ``x[b, :t+1]``. The trie is forwarded as ONE
packed sequence of its nodes, where node ``i`` sits at position ``depth(i)`` and attends to its
ancestors and itself (a tree attention mask). Node ``i``'s context is then exactly the prefix it
stands for, so its hidden state equals that of every row through it, and the hidden state that
predicts ``x[b, t]`` is the one of node ``node(b, t-1)``. Autograd sees one graph, so a shared
node's gradient is the sum of the contributions of every row that reads it: the gradients equal
those of the padded forward (up to float rounding) for full fine-tuning and LoRA alike, with or
without gradient checkpointing.

Cost: the linear layers run on ``N`` nodes instead of ``B·T`` padded tokens; attention computes each
row's new nodes against its own path (:mod:`asyncrl.policy.trie_attention`), never more pairs than
the padded rows. Micro-batches of sharing rows are formed first (:func:`prefix_microbatches`) and the
layout is used only when its estimated FLOPs are lower (:func:`shared_microbatches`). AReaL's tree training (Fu et al. 2025) packs the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = [
    "TREE_MAX_COST",
    "LayerShape",
    "PrefixTree",
    "build_prefix_tree",
    "prefix_microbatches",
    "shared_microbatches",
    "trie_counts",
]

TREE_MAX_COST = 0.8
"""Rows are forwarded as token tries when that costs at most this share of the padded layout's
decoder FLOPs (:func:`shared_microbatches`); the margin pays for building the trie."""


@dataclass(frozen=True)
class PrefixTree:
    """The token trie of a batch's rows.

    ``ids``/``positions``: ``[N]`` token and depth (position in every row through it) of each node;
    ``node``: ``[B, T]`` the node of row ``b``'s token ``t`` (-1 where ``t`` is padding); ``paths``:
    each row's nodes in order (nodes are numbered in the order the rows create them).
    """

    ids: torch.Tensor
    positions: torch.Tensor
    node: torch.Tensor
    paths: list[list[int]]

    @property
    def size(self) -> int:
        return int(self.ids.shape[0])

    @property
    def allowed(self) -> torch.Tensor:
        """``[N, N]`` bool, node ``i`` may attend to node ``j`` (``j`` is ``i`` or an ancestor): the
        dense tree mask (:mod:`asyncrl.policy.trie_attention` computes the same without it)."""
        allowed = torch.zeros((self.size, self.size), dtype=torch.bool)
        for path in self.paths:
            if path:
                # along one row, node t attends to nodes 0..t (its ancestors and itself); rows through
                # the same node write the same entries, and nodes on different branches stay False
                p = torch.tensor(path)
                allowed[p.unsqueeze(1), p.unsqueeze(0)] = torch.ones(len(p), len(p), dtype=torch.bool).tril()
        return allowed.to(self.ids.device)


def build_prefix_tree(input_ids: torch.Tensor, valid: torch.Tensor) -> PrefixTree:
    """The trie of the valid tokens of each row of ``input_ids`` ``[B, T]`` (``valid``: bool ``[B, T]``).

    A row's tokens are its valid entries in order (any padding layout); two rows share node ``k``
    exactly when their first ``k + 1`` valid tokens are equal.
    """
    rows = [r[m].tolist() for r, m in zip(input_ids.cpu(), valid.cpu().to(torch.bool), strict=True)]
    children: dict[tuple[int, int], int] = {}
    ids: list[int] = []
    depth: list[int] = []
    paths: list[list[int]] = []
    for row in rows:
        parent, path = -1, list[int]()
        for tok in row:
            key = (parent, tok)
            n = children.get(key)
            if n is None:
                n = children[key] = len(ids)
                ids.append(tok)
                depth.append(len(path))
            path.append(n)
            parent = n
        paths.append(path)
    dev = input_ids.device
    node = torch.full(input_ids.shape, -1, dtype=torch.long)
    for b, path in enumerate(paths):
        if path:
            node[b, valid[b].cpu().to(torch.bool)] = torch.tensor(path)
    return PrefixTree(
        torch.tensor(ids, dtype=torch.long, device=dev),
        torch.tensor(depth, dtype=torch.long, device=dev),
        node.to(dev),
        paths,
    )


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _sorted_rows(input_ids: torch.Tensor, lengths: torch.Tensor) -> list[tuple[list[int], int]]:
    """``(tokens, row)`` of every row, in lexicographic order of the tokens (stable)."""
    rows = [
        (r[: int(n)].tolist(), i) for i, (r, n) in enumerate(zip(input_ids.cpu(), lengths.cpu(), strict=True))
    ]
    return sorted(rows, key=lambda x: x[0])


def trie_counts(input_ids: torch.Tensor, lengths: torch.Tensor) -> tuple[int, int]:
    """``(nodes, attended pairs)`` of the trie of the right-padded rows (``lengths``: ``[B]`` real tokens
    per row): in lexicographic order each
    row adds its length ``L`` minus its common prefix with the row before it, ``n`` new nodes, whose
    attention computes ``n·L`` pairs (:mod:`asyncrl.policy.trie_attention`)."""
    rows = _sorted_rows(input_ids, lengths)
    nodes = pairs = 0
    for i, (r, _) in enumerate(rows):
        added = len(r) - (_common_prefix(r, rows[i - 1][0]) if i else 0)
        nodes, pairs = nodes + added, pairs + added * len(r)
    return nodes, pairs


def prefix_microbatches(
    input_ids: torch.Tensor, lengths: torch.Tensor, max_tokens: int
) -> list[torch.Tensor]:
    """Row indices of micro-batches whose tries hold at most ``max_tokens`` nodes each.

    Rows are taken in lexicographic order, so rows that share a prefix (a group, a system prompt)
    land in the same micro-batch; a row longer than the budget is a micro-batch of its own;
    ``max_tokens = 0`` is one micro-batch of every row in order. Right-padded ``input_ids`` ``[B, T]``.
    """
    n = int(lengths.shape[0])
    if max_tokens <= 0 or n == 0:
        return [torch.arange(n)]
    rows = _sorted_rows(input_ids, lengths)
    parts: list[list[int]] = []
    nodes = 0
    prev: list[int] = []
    for tokens, r in rows:
        added = len(tokens) - _common_prefix(tokens, prev)
        if parts and nodes + added <= max_tokens:
            parts[-1].append(r)
            nodes += added
        else:
            parts.append([r])
            nodes = len(tokens)
        prev = tokens
    return [torch.tensor(p, dtype=torch.long) for p in parts]


@dataclass(frozen=True)
class LayerShape:
    """What a decoder layer's forward costs: ``params`` (its linear layers' weights, 2 FLOPs each per
    token) and ``width`` (query heads × head size: 4·width FLOPs per attended query-key pair)."""

    params: int
    width: int

    def cost(self, tokens: int, pairs: int) -> float:
        return 2.0 * self.params * tokens + 4.0 * self.width * pairs


def shared_microbatches(
    input_ids: torch.Tensor, lengths: torch.Tensor, max_tokens: int, layer: LayerShape
) -> list[torch.Tensor] | None:
    """:func:`prefix_microbatches` when forwarding their tries costs at most :data:`TREE_MAX_COST` of
    the padded rows, else ``None`` (keep the padded layout).

    Per layer, a padded row of ``L`` tokens costs ``layer.cost(L, L²)`` and a trie of ``N`` nodes
    ``layer.cost(N, P)``, ``P`` the pairs its attention computes (:func:`trie_counts`); the LM head is
    the same in both.
    """
    padded = sum(layer.cost(int(n), int(n) ** 2) for n in lengths)
    parts = prefix_microbatches(input_ids, lengths, max_tokens)
    shared = sum(layer.cost(*trie_counts(input_ids[p], lengths[p])) for p in parts)
    return parts if shared <= TREE_MAX_COST * padded else None
