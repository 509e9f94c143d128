"""Tokenizer, model build/save/load, raw weight transfer and the token log-prob definition."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file
from transformers import PreTrainedTokenizerFast

from asyncrl.config import ModelConfig
from asyncrl.policy import (
    SPECIAL_TOKENS,
    Policy,
    PolicyLoadError,
    build_model,
    build_tokenizer,
    special_id,
    token_logprobs,
    token_logprobs_and_entropy,
)
from asyncrl.policy.tokenizer import CHAR_ALPHABET

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TINY = {"hidden_size": 32, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 64}
PRINTABLE = "".join(CHAR_ALPHABET)


@pytest.fixture(scope="module")
def char_tok() -> PreTrainedTokenizerFast:
    return build_tokenizer("char")


@pytest.fixture(scope="module")
def byte_tok() -> PreTrainedTokenizerFast:
    return build_tokenizer("byte")


@pytest.fixture(scope="module")
def qwen() -> Policy:
    return Policy.build(ModelConfig(family="qwen2", **TINY))


# ---- tokenizer -------------------------------------------------------------------------------
def reference_char_ids(text: str) -> list[int]:
    """Leftmost match of special-token strings, else one id per character (or <unk>)."""
    ids: list[int] = []
    i = 0
    while i < len(text):
        special = next((s for s in SPECIAL_TOKENS if text.startswith(s, i)), None)
        if special is not None:
            ids.append(SPECIAL_TOKENS.index(special))
            i += len(special)
            continue
        ch = text[i]
        ids.append(len(SPECIAL_TOKENS) + CHAR_ALPHABET.index(ch) if ch in CHAR_ALPHABET else 3)
        i += 1
    return ids


texts_with_specials = st.lists(
    st.one_of(st.sampled_from(SPECIAL_TOKENS), st.text(alphabet=PRINTABLE + "<>/", max_size=12)), max_size=12
).map("".join)


@pytest.mark.parametrize("kind", ["char", "byte"])
def test_special_ids_fixed(kind: str) -> None:
    tok = build_tokenizer(kind)  # type: ignore[arg-type]
    for i, s in enumerate(SPECIAL_TOKENS):
        assert tok.convert_tokens_to_ids(s) == i
        assert special_id(tok, s) == i
        assert tok.encode(s) == [i]
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    assert len(tok) == (10 + 96 if kind == "char" else 10 + 256)
    with pytest.raises(KeyError, match="not an asyncrl special token"):
        special_id(tok, "a")


def test_tool_call_encoding(char_tok: PreTrainedTokenizerFast) -> None:
    ids = char_tok.encode("<tool>calc(3*4)</tool>")
    assert ids[0] == special_id(char_tok, "<tool>") and ids[-1] == special_id(char_tok, "</tool>")
    assert char_tok.convert_ids_to_tokens(ids[1:-1]) == list("calc(3*4)")
    # no automatic BOS/EOS, with or without add_special_tokens
    assert char_tok.encode("ab") == char_tok.encode("ab", add_special_tokens=True) == ids_of(char_tok, "ab")
    assert char_tok.encode("é\t") == [3, 3]  # outside the char vocabulary -> one <unk> each


def ids_of(tok: PreTrainedTokenizerFast, text: str) -> list[int]:
    return [int(tok.convert_tokens_to_ids(c)) for c in text]  # type: ignore[arg-type]


@settings(max_examples=150, deadline=None)
@given(text=texts_with_specials)
def test_char_round_trip(char_tok: PreTrainedTokenizerFast, text: str) -> None:
    ids = char_tok.encode(text)
    assert ids == reference_char_ids(text)
    assert char_tok.decode(ids) == text


@settings(max_examples=150, deadline=None)
@given(text=st.one_of(texts_with_specials, st.text(max_size=30)))
def test_byte_round_trip(byte_tok: PreTrainedTokenizerFast, text: str) -> None:
    ids = byte_tok.encode(text)
    assert byte_tok.decode(ids) == text
    plain = text
    for s in SPECIAL_TOKENS:
        plain = plain.replace(s, "")
    assert len(ids) >= len(plain.encode("utf-8")) // 8  # sanity: never merges bytes
    if not any(s in text for s in SPECIAL_TOKENS):
        assert len(ids) == len(text.encode("utf-8"))


@pytest.mark.parametrize("kind", ["char", "byte"])
def test_tokenizer_save_load_offline(kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tok = build_tokenizer(kind)  # type: ignore[arg-type]
    tok.save_pretrained(tmp_path)
    loaded = PreTrainedTokenizerFast.from_pretrained(tmp_path, local_files_only=True)
    text = "<bos>x = 3 * (4 + 5)\n<tool>calc(3*4)</tool><obs>12</obs><answer>12</answer><eos>"
    assert loaded.encode(text) == tok.encode(text)
    assert loaded.decode(tok.encode(text)) == text
    assert [loaded.convert_tokens_to_ids(s) for s in SPECIAL_TOKENS] == list(range(10))


# ---- model -------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_build_save_load_identical(family: str, tmp_path: Path) -> None:
    cfg = ModelConfig(family=family, **TINY)  # type: ignore[arg-type,unused-ignore]
    state = torch.get_rng_state()
    policy = Policy.build(cfg)
    assert torch.equal(state, torch.get_rng_state()), "building must not disturb the global RNG"
    assert type(policy.model).__name__ == ("Qwen2ForCausalLM" if family == "qwen2" else "LlamaForCausalLM")
    assert policy.model.config.tie_word_embeddings
    assert policy.model.config.max_position_embeddings == cfg.built_context
    assert policy.model.training  # train mode, dropout 0
    assert all(p.dtype == torch.float32 for p in policy.model.parameters())
    again = Policy.build(cfg)
    assert all(
        torch.equal(a, b) for a, b in zip(policy.model.parameters(), again.model.parameters(), strict=True)
    )

    out = tmp_path / "ckpt"
    policy.save(out)
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= {p.name for p in out.iterdir()}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "temp dirs must be cleaned up"
    policy.save(out)  # overwrite in place
    loaded = Policy.load(out)
    ids = torch.randint(10, 100, (3, 17), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(policy.model(ids).logits, loaded.model(ids).logits)
    assert loaded.num_parameters() == policy.num_parameters()
    assert loaded.tokenizer.decode(loaded.tokenizer.encode("<tool>a</tool>")) == "<tool>a</tool>"


def test_num_parameters_counts_tied_once(qwen: Policy) -> None:
    total = sum(p.numel() for p in qwen.model.parameters())  # parameters() already dedups shared params
    assert qwen.num_parameters() == total
    assert "lm_head.weight" not in qwen.state_dict_tensors()


def test_state_dict_tensors_round_trip(qwen: Policy) -> None:
    other = Policy.build(ModelConfig(family="qwen2", seed=7, **TINY))
    tensors = other.state_dict_tensors()
    first = next(iter(qwen.model.parameters()))
    qwen_copy = Policy.build(ModelConfig(family="qwen2", **TINY))
    param_ids = [id(p) for p in qwen_copy.model.parameters()]
    qwen_copy.load_tensors(tensors)
    assert [id(p) for p in qwen_copy.model.parameters()] == param_ids, "loading must be in place"
    ids = torch.randint(10, 100, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(qwen_copy.model(ids).logits, other.model(ids).logits)
    # snapshots are copies: mutating the live model later does not change them
    with torch.no_grad():
        next(iter(other.model.parameters())).add_(1.0)
    assert not torch.equal(tensors["model.embed_tokens.weight"], other.model.model.embed_tokens.weight)
    with pytest.raises(ValueError, match="missing"):
        qwen_copy.load_tensors({k: v for k, v in tensors.items() if "layers.0" not in k})
    with pytest.raises(ValueError, match="unknown"):
        qwen_copy.load_tensors({**tensors, "bogus.weight": torch.zeros(1)})
    bad = dict(tensors)
    bad["model.norm.weight"] = torch.zeros(3)
    with pytest.raises(ValueError, match="shape"):
        qwen_copy.load_tensors(bad)
    assert first is next(iter(qwen.model.parameters()))


def _assert_clean(exc: PolicyLoadError, path: Path, *words: str) -> None:
    msg = str(exc)
    assert str(path) in msg
    assert "Traceback" not in msg and "\n" not in msg
    for w in words:
        assert w in msg, msg


def test_load_errors(qwen: Policy, tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(PolicyLoadError) as e:
        Policy.load(missing)
    _assert_clean(e.value, missing, "does not exist")

    good = tmp_path / "good"
    qwen.save(good)

    def variant(name: str) -> Path:
        d = tmp_path / name
        qwen.save(d)
        return d

    d = variant("noconfig")
    (d / "config.json").unlink()
    with pytest.raises(PolicyLoadError) as e:
        Policy.load(d)
    _assert_clean(e.value, d, "config.json")

    d = variant("badconfig")
    (d / "config.json").write_text("{not json")
    with pytest.raises(PolicyLoadError) as e:
        Policy.load(d)
    _assert_clean(e.value, d, "config.json", "not valid JSON")

    d = variant("noweights")
    (d / "model.safetensors").unlink()
    with pytest.raises(PolicyLoadError) as e:
        Policy.load(d)
    _assert_clean(e.value, d, "no weights", "model.safetensors")

    d = variant("badweights")
    (d / "model.safetensors").write_bytes(b"\x00garbage" * 10)
    with pytest.raises(PolicyLoadError) as e:
        Policy.load(d)
    _assert_clean(e.value, d, "model weights")

    d = variant("partial")  # HF would silently re-initialise a missing tensor
    tensors = load_file(str(d / "model.safetensors"))
    del tensors["model.norm.weight"]
    save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(PolicyLoadError) as e:
        Policy.load(d)
    _assert_clean(e.value, d, "missing", "model.norm.weight")

    d = variant("notok")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (d / f).unlink()
    with pytest.raises(PolicyLoadError) as e:
        Policy.load(d)
    _assert_clean(e.value, d, "tokenizer")

    d = variant("badtok")
    (d / "tokenizer.json").write_text("[]")
    with pytest.raises(PolicyLoadError) as e:
        Policy.load(d)
    _assert_clean(e.value, d, "tokenizer")

    d = variant("wrongarch")
    cfg = json.loads((d / "config.json").read_text())
    cfg["hidden_size"] = 48
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(PolicyLoadError) as e:
        Policy.load(d)
    _assert_clean(e.value, d, "model weights", "shapes disagree")

    assert Policy.load(good).num_parameters() == qwen.num_parameters()


# ---- token log-probs ---------------------------------------------------------------------------
def _manual_logprobs(policy: Policy, seq: list[int], temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Unpadded reference: one sequence, plain forward, log_softmax."""
    with torch.no_grad():
        logits = policy.model(torch.tensor([seq])).logits[0, :-1] / temperature
    logp = torch.log_softmax(logits, -1)
    lp = torch.cat([torch.zeros(1), logp.gather(-1, torch.tensor(seq[1:])[:, None]).squeeze(-1)])
    ent = torch.cat([torch.zeros(1), -(logp.exp() * logp).sum(-1)])
    return lp, ent


@pytest.mark.parametrize("padding", ["right", "left"])
def test_token_logprobs_matches_unpadded(qwen: Policy, padding: str) -> None:
    g = torch.Generator().manual_seed(3)
    seqs = [torch.randint(10, 100, (int(n),), generator=g).tolist() for n in (5, 12, 1, 9)]
    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), -100, dtype=torch.long)  # odd pad id on purpose
    mask = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        sl = slice(0, len(s)) if padding == "right" else slice(width - len(s), width)
        ids[i, sl] = torch.tensor(s)
        mask[i, sl] = 1
    temps = torch.tensor([1.0, 0.7, 1.3, 0.5])
    with torch.no_grad():
        lp, ent = token_logprobs_and_entropy(qwen.model, ids, mask, temps)
    assert ent is not None
    for i, s in enumerate(seqs):
        ref_lp, ref_ent = _manual_logprobs(qwen, s, float(temps[i]))
        sl = slice(0, len(s)) if padding == "right" else slice(width - len(s), width)
        torch.testing.assert_close(lp[i, sl], ref_lp, atol=1e-5, rtol=0)
        torch.testing.assert_close(ent[i, sl], ref_ent, atol=1e-5, rtol=0)
        assert (lp[i][mask[i] == 0] == 0).all() and (ent[i][mask[i] == 0] == 0).all()
    assert (lp[:, 0] == 0).all()


def test_token_logprobs_differentiable_and_float_temperature(qwen: Policy) -> None:
    ids = torch.randint(10, 100, (3, 8), generator=torch.Generator().manual_seed(4))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    lp = token_logprobs(qwen.model, ids, mask, 0.7)
    assert lp.shape == (3, 8) and lp.requires_grad
    lp.sum().backward()  # type: ignore[no-untyped-call,unused-ignore]
    grads = [p.grad for p in qwen.model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert any(g is not None and g.abs().sum() > 0 for g in grads)
    qwen.model.zero_grad(set_to_none=True)
    with torch.no_grad():
        same = token_logprobs(qwen.model, ids, mask, torch.full((3,), 0.7))
    torch.testing.assert_close(lp.detach(), same, atol=1e-6, rtol=0)
    assert (lp <= 0).all()


def test_build_model_vocab_and_family() -> None:
    model = build_model(ModelConfig(family="llama", **TINY), vocab_size=266)
    assert model.get_input_embeddings().weight.shape == (266, 32)
    assert model.config.num_key_value_heads == 2
