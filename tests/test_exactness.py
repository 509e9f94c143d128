"""Token-exactness is a check that can fail: on every path a prompt the template would not render
(ids ``[999, 998, 997]`` substituted for what the engine is given) is flagged, and a sample that
cannot be compared with an independent rendering is *unchecked* (``None``), never counted exact —
in the sample, in the worker's figures, in ``summary.json`` and in evaluation reports."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from asyncrl.gateway import Gateway, build_trajectories
from asyncrl.policy.chat import ChatTemplateError, Conversation, HFChatRenderer, Renderer
from asyncrl.records import Task, Trajectory, Turn
from asyncrl.rollout.heldout import retokenization_stats
from asyncrl.telemetry.reports import RolloutFigures
from families import build_tokenizer, end_ids
from models_util import load_tokenizer, smollm2_dir
from test_families_render import ScriptedEnv, call_text, play, sampled
from test_gateway import CALC, MODEL, RENDER, TASK, calc_loop, client, make_gateway, serve
from test_gateway import ScriptedEngine as TextEngine

GARBAGE = [999, 998, 997]


@pytest.fixture(scope="module")
def base() -> Any:
    return load_tokenizer(smollm2_dir())


def family_renderer(name: str, base: Any) -> HFChatRenderer:
    tok = build_tokenizer(name, base)
    return HFChatRenderer(
        tok, eos_token_ids=end_ids(tok, name), tool_format="auto", observation_role="auto", multi_turn="auto"
    )


def tool_episode(name: str, r: Renderer) -> list[list[int]]:
    """Two scripted turns: a call in the family's format, then an answer."""
    return [sampled(r, call_text(name, r, "x")), sampled(r, "<answer>42</answer>")]


def garbage_opening(monkeypatch: pytest.MonkeyPatch, r: Renderer) -> None:
    """The engine is given ``GARBAGE`` as the episode's opening prompt (the chat's messages stay)."""
    start = r.start

    def bad_start(prompt: str, tools: Any) -> Conversation:
        conv = start(prompt, tools)
        conv.ids = list(GARBAGE)
        return conv

    monkeypatch.setattr(r, "start", bad_start)


# -- per turn and bridge ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["qwen3", "mistral_v03", "smollm2", "llama31"])
def test_a_garbage_prompt_is_flagged_on_the_per_turn_and_bridge_paths(
    name: str, base: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    r = family_renderer(name, base)
    per_turn = r.multi_turn == "per_turn"  # Qwen3 and Mistral v0.3; the others bridge
    assert per_turn == (name in ("qwen3", "mistral_v03"))
    trajs, _, engine = play(r, tool_episode(name, r), ["41"])
    assert [t.render_diff for t in trajs] == ([0, 0] if per_turn else [0])  # honest: checked, exact
    if per_turn:  # the second turn's prompt alone
        monkeypatch.setattr(r, "next_prompt", lambda conv, text: list(GARBAGE))
        trajs, _, engine = play(r, tool_episode(name, r), ["41"])
        assert engine.prompts[1] == GARBAGE and trajs[1].token_ids()[:3] == GARBAGE
        assert trajs[0].render_diff == 0 and trajs[1].render_diff and trajs[1].render_diff > 0
    garbage_opening(monkeypatch, r)  # the first turn's
    trajs, _, engine = play(r, tool_episode(name, r), ["41"])
    assert engine.prompts[0] == GARBAGE and all(t.render_diff and t.render_diff > 0 for t in trajs)


def test_a_per_turn_history_the_template_cannot_render_is_unchecked(
    base: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    r = family_renderer("qwen3", base)
    render, calls = r.render, [0]

    def refuse_the_checks(messages: Any, tools: Any) -> list[int]:
        calls[0] += 1
        if calls[0] > 2:  # the episode's own two prompts render; the checks' re-renders are refused
            raise ChatTemplateError("the chat template cannot render this chat (test)")
        return render(messages, tools)

    monkeypatch.setattr(r, "render", refuse_the_checks)
    trajs, _, _ = play(r, tool_episode("qwen3", r), ["41"])
    assert calls[0] == 4 and [t.render_diff for t in trajs] == [None, None]


# -- unchecked, not exact ---------------------------------------------------------------------------
def test_a_bridged_chat_the_template_cannot_check_is_unchecked_not_exact(
    base: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    r = family_renderer("smollm2", base)
    monkeypatch.setattr(r, "prefix_stable", False)  # bridged on purpose on a template that re-renders
    [traj], _, _ = play(r, tool_episode("smollm2", r), ["41"])
    assert traj.render_diff is None
    monkeypatch.setattr(r, "prefix_stable", True)

    def refuse(*args: Any) -> list[int]:
        raise ChatTemplateError("the chat template cannot render this chat (test)")

    monkeypatch.setattr(r, "splice", refuse)  # a chat the template cannot render whole
    [traj], _, _ = play(r, tool_episode("smollm2", r), ["41"])
    assert traj.render_diff is None


def test_an_episode_with_nothing_sampled_is_unchecked(base: Any) -> None:
    r = family_renderer("smollm2", base)
    opening = len(r.start("Look up x, then answer.", ScriptedEnv.tools).ids)
    [traj], _, _ = play(r, [], [], max_context=opening)  # the context is full before the first turn
    assert traj.outcome == "truncated" and traj.num_model_tokens() == 0 and traj.render_diff is None


# -- gateway ----------------------------------------------------------------------------------------
def _calc_session(gw: Gateway) -> Any:
    async def body(gw: Gateway) -> Any:
        s = gw.sessions.open(TASK, group_id="g")
        await calc_loop(client(gw, s.key), TASK)
        gw.sessions.close(s)
        return s

    return serve(gw, body)


LOOP = ["<tool>calc(3*4)</tool>", "<tool>calc(12+0)</tool>", "<answer>12</answer>"]


def test_a_merged_gateway_sample_is_checked_against_the_template(monkeypatch: pytest.MonkeyPatch) -> None:
    # the first call's engine is given garbage; the later calls extend it, so the calls still merge
    gw = make_gateway(TextEngine(list(LOOP)))
    render = gw.messages.render
    monkeypatch.setattr(gw.messages, "render", lambda messages, tools: list(GARBAGE))
    s = _calc_session(gw)
    assert s.calls[0].prompt_ids == GARBAGE and gw.counts["appended_prompts"] == 2
    [traj] = build_trajectories(s, 1.0, "success", renderer=RENDER)
    assert traj.reward_components["gateway/per_call"] == 0.0 and traj.token_ids()[:3] == GARBAGE
    assert traj.render_diff and traj.render_diff > 0
    monkeypatch.setattr(gw.messages, "render", render)
    s = _calc_session(make_gateway(TextEngine(list(LOOP))))  # the honest session is checked and exact
    [traj] = build_trajectories(s, 1.0, "success", renderer=RENDER)
    assert len(s.calls) == 3 and traj.reward_components["gateway/per_call"] == 0.0 and traj.render_diff == 0
    [unchecked] = build_trajectories(s, 1.0, "success")  # no renderer to compare with
    assert unchecked.render_diff is None


def test_per_call_gateway_samples_are_exact_by_construction_and_unchecked() -> None:
    gw = make_gateway(TextEngine(["<tool>calc(3*4)</tool>", "<answer>12</answer>"]))

    async def body(gw: Gateway) -> Any:
        s = gw.sessions.open(TASK)
        c = client(gw, s.key)
        await c.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "a"}], tools=[CALC]
        )
        await c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "b"}])
        return s

    trajs = build_trajectories(serve(gw, body), 1.0, "success", renderer=RENDER)
    assert len(trajs) == 2 and all(t.reward_components["gateway/per_call"] == 1.0 for t in trajs)
    assert [t.render_diff for t in trajs] == [None, None]


def test_a_session_whose_chat_holds_turns_not_sampled_here_is_unchecked() -> None:
    gw = make_gateway(TextEngine(["<answer>12</answer>"]))
    few_shot: Any = [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "<answer>4</answer>"},  # written by the client, not sampled
        {"role": "user", "content": "3*4?"},
    ]

    async def body(gw: Gateway) -> Any:
        s = gw.sessions.open(TASK)
        await client(gw, s.key).chat.completions.create(model=MODEL, messages=few_shot)
        return s

    [traj] = build_trajectories(serve(gw, body), 1.0, "success", renderer=RENDER)
    assert traj.reward_components["gateway/per_call"] == 0.0 and traj.render_diff is None


# -- counted: the rate over checked samples, the unchecked beside it ---------------------------------
def _sample(render_diff: int | None) -> Trajectory:
    turns = [
        Turn(role="env", token_ids=[1, 2]),
        Turn(role="model", token_ids=[3], logprobs=[-0.1], version=0),
    ]
    return Trajectory(
        id=str(render_diff), task=Task(id="t", task_type="x"), turns=turns, render_diff=render_diff
    )


def test_unchecked_samples_are_counted_beside_the_rate_not_in_it() -> None:
    from asyncrl.jobs.summary import _token_exactness
    from asyncrl.rollout.worker import RolloutWorker

    stats = retokenization_stats([_sample(0), _sample(None), _sample(None)])
    assert stats["token_exact_checked"] == 1 and stats["token_exact_unchecked"] == 2
    assert stats["token_exact_rate"] == 1.0
    assert retokenization_stats([_sample(None)])["token_exact_rate"] is None  # nothing checked: no rate
    worker = SimpleNamespace(counts=RolloutFigures())
    for t in (_sample(0), _sample(2), _sample(None)):
        RolloutWorker._count(worker, t)  # type: ignore[arg-type]
    c = worker.counts
    assert (c.token_exact_checked, c.token_inexact, c.token_exact_unchecked) == (2, 1, 1)
    summary = _token_exactness(SimpleNamespace(live=SimpleNamespace(rollout=lambda: c)))  # type: ignore[arg-type]
    assert summary["token_exact_rate"] == 0.5 and summary["token_exact_unchecked"] == 1
