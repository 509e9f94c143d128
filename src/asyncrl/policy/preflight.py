"""The model preflight: one check of a pretrained model directory, run by ``asyncrl train`` before a
run directory exists and printed by ``asyncrl model info`` (docs/models.md, "The preflight").

:func:`preflight_model` checks the directory without reading the weights, so a bad one fails in a
second, and returns the :class:`ModelPlan` a run will use with the
:class:`~asyncrl.policy.template_probe.TemplateProfile` it was decided from — or raises one
:class:`ChatTemplateError` or :class:`PolicyLoadError` line that says what is wrong and what to change.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from asyncrl.policy.chat import ChatTemplateError, HFChatRenderer, chat_renderer
from asyncrl.policy.memory import config_numbers
from asyncrl.policy.template_probe import TemplateProfile, end_ids_of, probe_template

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from asyncrl.config import ModelConfig


@dataclass(frozen=True)
class ModelPlan:
    """How a run will drive a pretrained model (what ``asyncrl model info`` prints)."""

    path: str
    multi_turn: str
    tool_format: str
    observation_role: str
    system: str
    end_ids: list[int]
    turn_end: str
    context: int
    profile: TemplateProfile
    renderer: HFChatRenderer = field(repr=False, compare=False)

    def summary(self) -> dict[str, object]:
        """The plan as plain values (``model info --json``)."""
        pr = self.profile
        return {
            "multi_turn": self.multi_turn,
            "tool_format": self.tool_format,
            "observation_role": self.observation_role,
            "system": self.system,
            "end_of_turn_ids": self.end_ids,
            "turn_end": self.turn_end,
            "context": self.context,
            "template": {
                "prefix_stable": pr.prefix_stable,
                "strips_reasoning": pr.strips_reasoning,
                "trims_content": pr.trims_content,
                "renders_tools": pr.renders_tools,
                "tool_markers": list(pr.tool_markers),
                "tool_call_id_length": pr.tool_call_id_length,
            },
        }


def _load_tokenizer(cfg: ModelConfig, p: Path) -> PreTrainedTokenizerBase:
    """The tokenizer as the template probe reads it, once :func:`~asyncrl.policy.model.check_model_dir`
    (the checks :meth:`Policy.load <asyncrl.policy.model.Policy.load>` makes) passes."""
    import torch
    from transformers import AutoTokenizer

    from asyncrl.policy.model import PolicyLoadError, check_model_dir

    dtype = torch.float32 if cfg.dtype == "float32" else torch.bfloat16  # model.dtype's two choices
    check_model_dir(p, f"model.path {cfg.path!r}", dtype, cfg.trust_remote_code)
    try:
        return AutoTokenizer.from_pretrained(
            str(p), local_files_only=True, trust_remote_code=cfg.trust_remote_code
        )
    except Exception as exc:
        raise PolicyLoadError(
            f"model.path {cfg.path!r}: cannot load the tokenizer ({str(exc)[:160]})"
        ) from None


def _generation_eos(p: Path) -> Any:
    """``eos_token_id`` of ``generation_config.json`` as written (an id, a list, or None)."""
    gen = p / "generation_config.json"
    return json.loads(gen.read_text()).get("eos_token_id") if gen.is_file() else None


def _what_the_template_does(pr: TemplateProfile) -> str:
    """The probe's findings behind a refusal, as one clause."""
    facts = []
    if not pr.system_supported:
        facts.append(f"it has no system role ({pr.system_error})")
    if pr.unstable_at:
        facts.append(pr.unstable_at)
    if pr.strips_reasoning:
        facts.append("it strips <think> reasoning from earlier assistant turns")
    if pr.turn_end_id is None:
        facts.append("it closes an assistant turn with none of the end ids")
    return f" [template probe: {'; '.join(facts)}]" if facts else ""


def _mode(cfg: ModelConfig, renderer: HFChatRenderer) -> str:
    """The multi-turn mode and why (``model.multi_turn: auto`` decides by probing the template)."""
    if cfg.multi_turn != "auto":
        return f"{renderer.multi_turn} (model.multi_turn)"
    if renderer.multi_turn == "bridge":
        return "bridge (the template is prefix-stable: each turn is appended to the ids sampled)"
    return "per_turn (the template is not prefix-stable: each turn is prompted as the template renders it)"


def preflight_model(cfg: ModelConfig) -> ModelPlan | None:
    """The :class:`ModelPlan` for ``cfg`` (``None`` for a model built from config), or the one-line
    error that ``asyncrl train`` would stop with."""
    if cfg.path is None:
        return None
    from asyncrl.policy.model import context_cap

    p = Path(cfg.path)
    tok = _load_tokenizer(cfg, p)
    ids = end_ids_of(_generation_eos(p), tok)
    name = f"model {cfg.path!r}"
    profile = probe_template(tok, ids) if tok.chat_template else None
    try:
        renderer = chat_renderer(cfg, tok, ids)
    except ChatTemplateError as exc:
        why = _what_the_template_does(profile) if profile is not None else ""
        raise ChatTemplateError(f"{name}: {exc}{why}") from None
    assert profile is not None  # the renderer refuses a tokenizer without a template
    own = config_numbers(p).get("max_context")
    return ModelPlan(
        path=str(p),
        multi_turn=_mode(cfg, renderer),
        tool_format=renderer.fmt.name,
        observation_role=renderer.observation_role,
        system="system message" if profile.system_supported else "folded into the first user turn",
        end_ids=list(renderer.stop_token_ids),
        turn_end=renderer.eot_text,
        context=context_cap(cfg.max_context, int(own) if own else 2**31),
        profile=profile,
        renderer=renderer,
    )
