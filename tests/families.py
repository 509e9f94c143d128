"""The model families users bring, built locally: SmolLM2's BPE vocabulary, each family's special
tokens, its real published chat template and its published ``generation_config`` end ids.

No family's weights or tokenizer files can be fetched here, so a family is emulated the way
``models_util.family_tokenizer`` does it: the template text (the part that decides rendering,
prefix stability, system handling, tool format and turn ends) is the published one, byte for byte
where the source allowed; the vocabulary is SmolLM2's (merges differ from the family's own, which
changes token counts, not the template behaviour under test). ``write_family_model`` puts the
tokenizer, a tiny random Llama and a ``generation_config.json`` listing the end ids in the family's
published order into one directory that ``asyncrl model info`` and ``asyncrl train`` load.

Where each template text comes from (stored public copies; ``tests/fixtures/families/SOURCES.md``
has the details and the checks made):

- ``smollm2``: the imported SmolLM2-135M-Instruct's own ``chat_template.jinja``.
- ``qwen25``: ``tests/fixtures/qwen25_chat_template.jinja`` (Qwen2.5-Instruct, already in the repo).
- ``qwen3``: llama.cpp ``models/templates/Qwen-Qwen3-0.6B.jinja`` (a dump of Qwen/Qwen3-0.6B's
  tokenizer_config.json chat_template).
- ``llama31``: llama.cpp ``models/templates/meta-llama-Llama-3.3-70B-Instruct.jinja``, identical to
  Llama-3.1-8B-Instruct's published template (checked against BFCL's ``llama_3_1.py`` copy).
- ``llama32``: llama.cpp ``models/templates/meta-llama-Llama-3.2-3B-Instruct.jinja``.
- ``mistral_v03``: Mistral-7B-Instruct-v0.3's tokenizer_config.json template as shipped in the
  lmstudio-community GGUF (copied in a public project's model presets); cross-checked against
  llama.cpp's Mistral-Nemo-Instruct-2407 dump (same template, v3-Tekken spacing) and BFCL's
  ``mistral_fc.py`` docstring.
- ``gemma2``: llama.cpp ``models/templates/google-gemma-2-2b-it.jinja``.
- ``gemma3``: google/gemma-3-*-it tokenizer_config.json template as quoted in BFCL's
  ``local_inference/gemma.py``.
- ``phi35_mini``: llama.cpp ``models/templates/microsoft-Phi-3.5-mini-instruct.jinja``.
- ``phi4_mini``: microsoft/Phi-4-mini-instruct tokenizer_config.json template as quoted in BFCL's
  ``local_inference/phi.py`` (same text in several other public copies).
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from models_util import FIXTURES, LLAMA3_SPLIT, load_tokenizer, smollm2_dir, tiny_model_dir

TEMPLATES = FIXTURES / "families"


@dataclass(frozen=True)
class Family:
    """One model family as built locally for tests."""

    name: str
    title: str
    template: str | None  # a file under TEMPLATES (or FIXTURES for qwen25); None: SmolLM2's own
    specials: tuple[str, ...] = ()  # added as special tokens (never split inside content)
    added: tuple[str, ...] = ()  # added as plain (non-special) tokens, as the family does
    bos: str | None = None
    eos: str | None = None  # tokenizer_config's eos_token
    pad: str | None = None
    end_ids: tuple[str, ...] = ()  # generation_config.eos_token_id, in the published order
    llama3_pretokenizer: bool = False


LLAMA3_TOKENS = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|python_tag|>",
    "<|finetune_right_pad_id|>",
)
QWEN_TOOL_TOKENS = ("<tool_call>", "</tool_call>")
GEMMA_TOKENS = ("<bos>", "<eos>", "<pad>", "<start_of_turn>", "<end_of_turn>")
PHI3_TOKENS = ("<s>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>")
PHI4_TOKENS = (
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|end|>",
    "<|tool|>",
    "<|/tool|>",
    "<|tool_call|>",
    "<|/tool_call|>",
    "<|tool_response|>",
)
MISTRAL_TOKENS = (
    "<s>",
    "</s>",
    "[INST]",
    "[/INST]",
    "[TOOL_CALLS]",
    "[AVAILABLE_TOOLS]",
    "[/AVAILABLE_TOOLS]",
    "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]",
)

# Shared by the members of a family line (tokenizer_config / generation_config of each).
QWEN: dict[str, Any] = {
    "eos": "<|im_end|>",
    "pad": "<|endoftext|>",
    "end_ids": ("<|im_end|>", "<|endoftext|>"),
}
LLAMA3: dict[str, Any] = {
    "specials": LLAMA3_TOKENS,
    "bos": "<|begin_of_text|>",
    "eos": "<|eot_id|>",
    "end_ids": ("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"),
    "llama3_pretokenizer": True,
}
GEMMA: dict[str, Any] = {
    "bos": "<bos>",
    "eos": "<eos>",
    "pad": "<pad>",
    "end_ids": ("<eos>", "<end_of_turn>"),
}

FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        # generation_config.json of SmolLM2-135M-Instruct: eos_token_id 2 (<|im_end|>).
        Family("smollm2", "SmolLM2", None, end_ids=("<|im_end|>",)),
        # Qwen2.5-*-Instruct and Qwen3 generation_config: eos_token_id [151645, 151643]; Qwen3's
        # <think> etc. are added tokens with special=false in its tokenizer.json.
        Family("qwen25", "Qwen2.5", "../qwen25_chat_template.jinja", added=QWEN_TOOL_TOKENS, **QWEN),
        Family(
            "qwen3",
            "Qwen3",
            "qwen3.jinja",
            added=(*QWEN_TOOL_TOKENS, "<think>", "</think>", "<tool_response>", "</tool_response>"),
            **QWEN,
        ),
        # Llama-3.1/3.2-*-Instruct generation_config: eos_token_id [128001, 128008, 128009].
        Family("llama31", "Llama-3.1", "llama31.jinja", **LLAMA3),
        Family("llama32", "Llama-3.2", "llama32.jinja", **LLAMA3),
        # Mistral-7B-Instruct-v0.3 generation_config: eos_token_id 2 (</s>).
        Family(
            "mistral_v03",
            "Mistral-7B-v0.3",
            "mistral_v03.jinja",
            specials=MISTRAL_TOKENS,
            bos="<s>",
            eos="</s>",
            end_ids=("</s>",),
        ),
        # gemma-2-*-it generation_config: eos_token_id [1, 107]; gemma-3-*-it: [1, 106]; both
        # are [<eos>, <end_of_turn>].
        Family("gemma2", "Gemma 2", "gemma2.jinja", specials=GEMMA_TOKENS, **GEMMA),
        Family("gemma3", "Gemma 3", "gemma3.jinja", specials=(*GEMMA_TOKENS, "<start_of_image>"), **GEMMA),
        # Phi-3.5-mini-instruct generation_config: eos_token_id [32007, 32001, 32000]
        # = [<|end|>, <|assistant|>, <|endoftext|>]; tokenizer eos_token <|endoftext|>.
        Family(
            "phi35_mini",
            "Phi-3.5-mini",
            "phi35_mini.jinja",
            specials=PHI3_TOKENS,
            bos="<s>",
            eos="<|endoftext|>",
            end_ids=("<|end|>", "<|assistant|>", "<|endoftext|>"),
        ),
        # Phi-4-mini-instruct generation_config: eos_token_id [200020, 199999]
        # = [<|end|>, <|endoftext|>]; tokenizer bos and eos are both <|endoftext|>.
        Family(
            "phi4_mini",
            "Phi-4-mini",
            "phi4_mini.jinja",
            specials=PHI4_TOKENS,
            bos="<|endoftext|>",
            eos="<|endoftext|>",
            end_ids=("<|end|>", "<|endoftext|>"),
        ),
    )
}


def template_text(name: str) -> str:
    """The family's chat-template text (SmolLM2's own for ``smollm2``)."""
    fam = FAMILIES[name]
    if fam.template is None:
        return (smollm2_dir() / "chat_template.jinja").read_text()
    return (TEMPLATES / fam.template).read_text()


def build_tokenizer(name: str, base: Any | None = None) -> Any:
    """SmolLM2's tokenizer carrying the family's special tokens, added tokens and template."""
    from tokenizers import AddedToken

    fam = FAMILIES[name]
    tok = copy.deepcopy(base if base is not None else load_tokenizer(smollm2_dir()))
    if fam.llama3_pretokenizer:
        from tokenizers import Regex, pre_tokenizers

        tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    if fam.specials:
        tok.add_special_tokens({"additional_special_tokens": list(fam.specials)})
    if fam.added:
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in fam.added])
    for attr in ("bos", "eos", "pad"):
        value = getattr(fam, attr)
        if value is not None:
            setattr(tok, f"{attr}_token", value)
    tok.chat_template = template_text(name)
    return tok


def end_ids(tokenizer: Any, name: str) -> list[int]:
    """``generation_config.eos_token_id`` of the family, mapped to this tokenizer's ids."""
    ids = [tokenizer.convert_tokens_to_ids(t) for t in FAMILIES[name].end_ids]
    assert all(isinstance(i, int) and i >= 0 for i in ids), (name, ids)
    return ids


def write_family_model(out: Path, name: str, *, base: Any | None = None, seed: int = 0) -> Path:
    """A complete model directory for ``name``: tiny random Llama (hidden 32, 2 layers) + the
    family tokenizer and template + a ``generation_config.json`` with the family's end ids in the
    published order (a list where the family publishes a list)."""
    tok = build_tokenizer(name, base)
    tiny_model_dir(out, tok, seed=seed)
    ids = end_ids(tok, name)
    gen = json.loads((out / "generation_config.json").read_text())
    gen["eos_token_id"] = ids if len(ids) > 1 else ids[0]
    if tok.bos_token_id is not None:
        gen["bos_token_id"] = tok.bos_token_id
    gen["pad_token_id"] = tok.pad_token_id if tok.pad_token_id is not None else ids[0]
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    return out
