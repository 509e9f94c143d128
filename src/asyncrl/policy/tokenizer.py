"""Locally built tokenizers: no hub, no downloads, fixed special-token ids.

``char`` (printable ASCII and ``"\\n"``, else ``<unk>``) and ``byte`` (one token per byte), with the
same ten special tokens at ids 0..9 (:data:`SPECIAL_TOKENS`): those ids are part of the wire contract.
Nothing is inserted on encode (no BOS/EOS) and decoding adds no spaces, so multi-turn token spans
concatenate without misalignment. The vocabularies and guarantees: docs/policy.md#tokenizer.
"""

from __future__ import annotations

from typing import Literal

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import bytes_to_unicode

TokenizerKind = Literal["char", "byte"]

SPECIAL_TOKENS: tuple[str, ...] = (
    "<pad>",
    "<bos>",
    "<eos>",
    "<unk>",
    "<tool>",
    "</tool>",
    "<answer>",
    "</answer>",
    "<obs>",
    "</obs>",
)
"""Special tokens; the token at index ``i`` has id ``i`` in every asyncrl tokenizer."""

PAD, BOS, EOS, UNK = SPECIAL_TOKENS[:4]

CHAR_ALPHABET: tuple[str, ...] = (*(chr(c) for c in range(32, 127)), "\n")
"""The ``char`` vocabulary after the special tokens: printable ASCII, then newline."""


def _char_tokenizer() -> Tokenizer:
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in CHAR_ALPHABET:
        vocab[ch] = len(vocab)
    # WordLevel on single characters: the pre-tokenizer isolates every character
    # (``[\s\S]`` so that "\n" is a character too), unknown ones map to <unk>.
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tk.decoder = decoders.Fuse()
    return tk


def _byte_tokenizer() -> Tokenizer:
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    byte_chars = bytes_to_unicode()  # type: ignore[no-untyped-call]  # GPT-2's map, as ByteLevel uses it
    for b in range(256):
        vocab[byte_chars[b]] = len(vocab)
    # BPE without merges over the byte alphabet = exactly one token per byte.
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK, fuse_unk=False))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tk.decoder = decoders.ByteLevel()
    return tk


def build_tokenizer(kind: TokenizerKind = "char") -> PreTrainedTokenizerFast:
    """Build an asyncrl tokenizer fully offline.

    The result is a regular :class:`~transformers.PreTrainedTokenizerFast`, so
    ``save_pretrained(dir)`` and ``PreTrainedTokenizerFast.from_pretrained(dir)`` work
    without network access and other tools can load the saved directory.
    """
    if kind == "char":
        tk = _char_tokenizer()
    elif kind == "byte":
        tk = _byte_tokenizer()
    else:
        raise ValueError(f"unknown tokenizer kind {kind!r}; allowed: 'char', 'byte'")
    tk.add_special_tokens(
        [AddedToken(t, special=True, normalized=False, lstrip=False, rstrip=False) for t in SPECIAL_TOKENS]
    )
    tok = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tk,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        additional_special_tokens=list(SPECIAL_TOKENS[4:]),
        clean_up_tokenization_spaces=False,
        model_max_length=1 << 30,
    )
    for i, t in enumerate(SPECIAL_TOKENS):
        got = tok.convert_tokens_to_ids(t)
        if got != i:  # pragma: no cover - guards against library behaviour changes
            raise RuntimeError(f"special token {t!r} got id {got}, expected {i}")
    return tok


def special_id(tok: PreTrainedTokenizerFast, token: str) -> int:
    """The id of a special token such as ``"<tool>"``; raises ``KeyError`` for non-special strings."""
    if token not in SPECIAL_TOKENS:
        raise KeyError(
            f"{token!r} is not an asyncrl special token; expected one of {', '.join(SPECIAL_TOKENS)}"
        )
    tid = tok.convert_tokens_to_ids(token)
    if not isinstance(tid, int) or tid != SPECIAL_TOKENS.index(token):
        raise KeyError(f"tokenizer has {token!r} at id {tid}, expected {SPECIAL_TOKENS.index(token)}")
    return tid
