"""The episode runner: one agent episode as a coroutine, many of them sharing one batched engine.

An episode is a chat rendered by a :class:`~asyncrl.policy.chat.Renderer` — asyncrl's text layout
for the char models (``<bos> PROMPT | turn | <obs> TEXT </obs> | ...``), or the pretrained model's
own chat template with its tool-call format:

* The token ids kept for a model turn are exactly those the engine sampled — the text is
  decoded only to hand it to the environment (translated from the model's tool-call format to
  the canonical ``<tool>NAME(ARGS)</tool>`` action), never re-encoded.
* Observations are appended as rendered deltas; the history is never re-rendered. At the end the
  chat is rendered again for comparison only: ``Trajectory.render_diff`` (token-exactness against a
  rendering made apart from the one that built the sample, :func:`_bridged` and
  :func:`_per_turn_samples` say which; ``None``: unchecked, never counted exact) and
  ``Trajectory.retokenization_diff`` (tokens a re-tokenising framework would have got wrong).
* The loss mask is 1 only on model-sampled tokens (see :meth:`Trajectory.loss_mask`).
* The context limit (``model.max_context``) is enforced: an episode that would not fit ends
  with outcome ``truncated``; so does one that uses up ``env.max_turns`` model turns.

Concurrency: every episode awaits :meth:`~asyncrl.engine.batcher.TurnBatcher.generate` for its model
turns (batched across episodes there). Environment calls go through the guard
(:class:`asyncrl.envs.GuardedEnv`), so nothing an environment does can crash this runner.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec

from asyncrl.engine.base import Sample
from asyncrl.engine.batcher import TurnBatcher
from asyncrl.envs import EnvResetError, StepResult
from asyncrl.envs.base import Environment
from asyncrl.policy.chat import ChatTemplateError, Conversation, Renderer
from asyncrl.policy.exactness import count_differences, engine_diff, ids_diff
from asyncrl.policy.messages import Message
from asyncrl.records import Lifecycle, Outcome, SamplingParams, Task, Trajectory, Turn, new_id


@dataclass
class EpisodeSettings:
    max_turns: int
    max_context: int
    sampling: SamplingParams
    worker_id: str = ""
    early_stop_invalid: int = field(kw_only=True)
    """``orchestrator.exploration.early_stop_invalid``: end the episode (outcome ``early_stopped``) after this
    many consecutive invalid actions (a malformed action or a step fault); 0: never."""
    on_turn: Callable[[], None] | None = None
    """Called after every model turn (the worker's in-flight load accounting)."""


async def run_episode(
    task: Task,
    env: Environment,
    batcher: TurnBatcher,
    renderer: Renderer,
    settings: EpisodeSettings,
    group_id: str = "",
    prefix: list[list[int]] | None = None,
) -> list[Trajectory]:
    """Play one episode of ``env`` (already guarded) on ``task``; its training samples: one
    trajectory in ``bridge`` mode (and for one-turn episodes), one per model turn in ``per_turn``
    mode (sharing the episode's reward, outcome and ``episode_id``).

    ``prefix``: token ids of model turns to replay instead of sampling, before the policy takes
    over (counterfactual resampling from a segment boundary, ``asyncrl credit ablate``); replayed
    turns carry log-prob 0.0.
    """
    batcher.live_episodes += 1
    try:
        return await _run_episode(task, env, batcher, renderer, settings, group_id, prefix or [])
    finally:
        batcher.live_episodes -= 1


@dataclass
class _Seen:
    """One model turn as the engine served it: the prompt it was given and the ids it sampled."""

    prompt: list[int]
    turn: Turn
    delta: list[int] = field(default_factory=list)
    """Bridge mode: the observation delta appended after the turn."""


def _open_trajectory(task: Task, settings: EpisodeSettings, group_id: str) -> Trajectory:
    """A new episode's trajectory (its own episode: one sample, or the first of its per-turn samples)."""
    traj = Trajectory(
        id=new_id(),
        task=task,
        turns=[],
        lifecycle=Lifecycle(created=time.time(), rollout_start=time.time()),
        worker_id=settings.worker_id,
        group_id=group_id,
        sampling=settings.sampling,
    )
    traj.episode_id = traj.id
    return traj


def _reset_failed(traj: Trajectory, exc: EnvResetError) -> Trajectory:
    """The episode's one record when the environment could not start it (the guard's fault kept)."""
    traj.outcome = "env_error"
    traj.reward_components["env_error"] = 1.0
    traj.turns.append(Turn(role="env", token_ids=[], fault=exc.fault))
    traj.render_diff = traj.retokenization_diff = None  # nothing sampled: nothing to check (unchecked)
    traj.lifecycle.rollout_end = time.time()
    return traj


def _with_observation(renderer: Renderer, conv: Conversation, text: str) -> tuple[list[int], list[int]]:
    """The next prompt once ``text`` is observed, and the bridged delta (``[]`` per turn)."""
    if renderer.multi_turn == "per_turn":
        return renderer.next_prompt(conv, text), []
    delta = renderer.observation(conv, text)
    return [*conv.ids, *delta], delta


async def _run_episode(
    task: Task,
    env: Environment,
    batcher: TurnBatcher,
    renderer: Renderer,
    settings: EpisodeSettings,
    group_id: str,
    prefix: list[list[int]],
) -> list[Trajectory]:
    traj = _open_trajectory(task, settings, group_id)
    life = traj.lifecycle
    # 1. reset: the first observation is the prompt
    try:
        prompt_text = await env.reset(task)
    except EnvResetError as exc:
        return [_reset_failed(traj, exc)]
    conv = renderer.start(prompt_text, list(env.tools))
    prompt = list(conv.ids)  # what the engine is given next
    if len(prompt) >= settings.max_context:
        traj.turns.append(Turn(role="env", token_ids=prompt[: settings.max_context]))
        traj.outcome = "truncated"
        traj.render_diff = traj.retokenization_diff = None  # nothing sampled: nothing to check
        life.rollout_end = time.time()
        return [traj]
    seen: list[_Seen] = []
    outcome: Outcome = "truncated"  # unless the environment ends the episode first
    invalid = 0  # consecutive invalid actions (early termination)
    for turn_no in range(settings.max_turns):
        # 2. model turn: sample within the remaining context
        room = settings.max_context - len(prompt)
        if room <= 0:
            break
        turn = await _model_turn(batcher, renderer, settings, prompt, room, prefix, turn_no)
        seen.append(_Seen(prompt, turn))
        parsed = renderer.parse(turn.token_ids)
        action = renderer.add_model_turn(conv, turn.token_ids)
        if settings.on_turn is not None:
            settings.on_turn()
        # 3. environment step (guarded: faults come back as a default observation)
        result = await _step(env, action, turn, traj)
        if result.done:
            traj.final_reward = float(result.reward)
            outcome = result.outcome or ("success" if result.reward > 0 else "failure")
            break
        bad = turn.fault is not None or result.malformed
        invalid = invalid + 1 if bad else 0
        if settings.early_stop_invalid and invalid >= settings.early_stop_invalid:
            outcome = "early_stopped"  # a failing trajectory: stop spending generation on it
            break
        # 4. observation (in the model's own format when its call could not be read), unless it
        # would overflow the context
        text = (
            renderer.malformed_message(parsed.malformed)
            if parsed.malformed and result.malformed
            else result.observation
        )
        nxt, delta = _with_observation(renderer, conv, text)
        if len(nxt) >= settings.max_context:
            break
        renderer.add_observation(conv, text, delta)
        seen[-1].delta = delta
        prompt = nxt
    traj.outcome = outcome
    life.rollout_end = time.time()
    if renderer.multi_turn == "per_turn":
        return _per_turn_samples(traj, seen, renderer, conv)
    return [_bridged(traj, seen, renderer, conv)]


async def _model_turn(
    batcher: TurnBatcher,
    renderer: Renderer,
    settings: EpisodeSettings,
    prompt: list[int],
    room: int,
    prefix: list[list[int]],
    turn_no: int,
) -> Turn:
    sp = msgspec.structs.replace(
        settings.sampling, max_new_tokens=min(settings.sampling.max_new_tokens, room)
    )
    started = time.time()
    if turn_no < len(prefix):  # a replayed turn
        ids = prefix[turn_no][:room]
        sample, version = Sample(ids, [0.0] * len(ids), "stop"), batcher.engine.version
    else:
        sample, version = await batcher.generate(list(prompt), sp)
    keep = renderer.cut_at_stop(sample.token_ids)  # a stop string ends the turn where it completes
    return Turn(
        role="model",
        token_ids=list(sample.token_ids[:keep]),
        logprobs=list(sample.logprobs[:keep]),
        version=version,
        started_at=started,
        ended_at=time.time(),
    )


async def _step(env: Environment, action: str, turn: Turn, traj: Trajectory) -> StepResult:
    step_start = time.perf_counter()
    result: StepResult = await env.step(action)
    turn.env_seconds = time.perf_counter() - step_start
    if result.retried_faults:
        traj.reward_components["env_retries"] = traj.reward_components.get("env_retries", 0.0) + len(
            result.retried_faults
        )
    turn.process_reward = float(result.process_reward)
    turn.tool_call = result.tool_call
    turn.fault = result.fault
    return result


def _finish(traj: Trajectory) -> Trajectory:
    traj.reward_components["outcome"] = traj.final_reward
    traj.reward_components["process"] = sum(t.process_reward for t in traj.turns)
    return traj


def _bridged(traj: Trajectory, seen: list[_Seen], renderer: Renderer, conv: Conversation) -> Trajectory:
    """Bridge mode: the episode as one sample — the opening prompt, then each sampled turn and
    the observation delta after it. Exactness: the trained ids against every prompt the engine
    was given + its samples (bookkeeping: the sample is built from them), and against the
    template's own rendering of the whole chat with the sampled ids spliced in (the independent
    check). Where the template cannot make that rendering the sample is unchecked (``None``)
    unless the bookkeeping already found a difference."""
    opening = seen[0].prompt if seen else list(conv.ids)
    traj.turns.append(Turn(role="env", token_ids=list(opening)))
    for s in seen:
        traj.turns.append(s.turn)
        if s.delta:
            traj.turns.append(
                Turn(role="tool", token_ids=s.delta, started_at=s.turn.ended_at, ended_at=time.time())
            )
    trained = traj.token_ids()
    offsets = [start for start, _ in traj.segments()]  # where each model turn starts
    diff = engine_diff(trained, [(o, s.prompt, s.turn.token_ids) for o, s in zip(offsets, seen, strict=True)])
    template = renderer.render_diff(conv)  # None: the template cannot check this chat
    traj.render_diff = diff + template if template is not None else (diff or None)
    traj.retokenization_diff = _retok_diff(renderer, conv)
    return _finish(traj)


def _per_turn_samples(
    traj: Trajectory, seen: list[_Seen], renderer: Renderer, conv: Conversation
) -> list[Trajectory]:
    """Per-turn mode: each model turn is its own sample — the prompt the engine was given + the
    sampled ids — all with the episode's reward. Exactness: that prompt against the template's own
    rendering of the history before the turn (with the generation prompt), made afresh from the
    episode's messages once it is over; ``None`` where the template cannot render it."""
    out: list[Trajectory] = []
    for k, s in enumerate(seen):
        t = msgspec.structs.replace(
            traj,
            id=traj.id if k == len(seen) - 1 else new_id(),
            turns=[Turn(role="env", token_ids=list(s.prompt)), s.turn],
            reward_components=dict(traj.reward_components),
        )
        at = _assistant_index(conv.messages, k)
        t.render_diff = _prompt_diff(renderer, s.prompt, conv.messages[:at], conv)
        ref = renderer.reference_ids(conv.messages[: at + 1], conv.schemas or None)
        t.retokenization_diff = count_differences(t.token_ids(), ref)
        out.append(_finish(t))
    if not out:  # no model turn (the context was full at once): nothing sampled, nothing to check
        traj.turns.append(Turn(role="env", token_ids=list(conv.ids)))
        traj.render_diff = traj.retokenization_diff = None
        out.append(_finish(traj))
    return out


def _prompt_diff(
    renderer: Renderer, prompt: list[int], history: list[Message], conv: Conversation
) -> int | None:
    """Tokens where the engine's ``prompt`` differs from the template's rendering of ``history``."""
    try:
        return ids_diff(prompt, renderer.render(history, conv.schemas or None))
    except ChatTemplateError:
        return None


def _assistant_index(messages: list[Message], k: int) -> int:
    return [i for i, m in enumerate(messages) if m["role"] == "assistant"][k]


def _retok_diff(renderer: Renderer, conv: Conversation) -> int:
    try:
        return renderer.retokenization_diff(conv)
    except ChatTemplateError:  # the template cannot render the chat whole: count every token
        return len(conv.ids)


def jittered(sampling: SamplingParams, jitter: float, rng: random.Random) -> SamplingParams:
    """Per-episode temperature drawn uniformly from temperature·(1 ± jitter) (exploration knob)."""
    if jitter <= 0:
        return sampling
    t = sampling.temperature * (1 + rng.uniform(-jitter, jitter))
    return msgspec.structs.replace(sampling, temperature=max(t, 1e-3))
