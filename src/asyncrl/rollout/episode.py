"""The episode runner: one agent episode as a coroutine, many of them sharing one batched engine.

An episode is a chat rendered by a :class:`~asyncrl.policy.chat.Renderer` — asyncrl's text layout
for the char models (``<bos> PROMPT | turn | <obs> TEXT </obs> | ...``), or the pretrained model's
own chat template with its tool-call format:

* The token ids kept for a model turn are exactly those the engine sampled — the text is
  decoded only to hand it to the environment (translated from the model's tool-call format to
  the canonical ``<tool>NAME(ARGS)</tool>`` action), never re-encoded.
* Observations are appended as rendered deltas; the history is never re-rendered. At the end the
  whole chat is rendered once for comparison only: ``Trajectory.retokenization_diff`` counts
  the tokens a re-tokenising framework would have got wrong (0 = exact).
* The loss mask is 1 only on model-sampled tokens (see :meth:`Trajectory.loss_mask`).
* The context limit (``model.max_context``) is enforced: an episode that would not fit ends
  with outcome ``truncated``; so does one that uses up ``env.max_turns`` model turns.

Concurrency: every episode awaits :meth:`~asyncrl.engine.batcher.TurnBatcher.generate` for its model turns; the
batcher serves all episodes that are waiting at that moment with one ``engine.generate``
call (in a worker thread, so environment steps of other episodes progress meanwhile).
Environment calls go through the guard (:class:`asyncrl.envs.GuardedEnv`), so nothing an
environment does can crash this runner.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from asyncrl.engine.base import Sample
from asyncrl.engine.batcher import TurnBatcher
from asyncrl.envs import EnvResetError, StepResult
from asyncrl.policy.chat import ChatTemplateError, Renderer
from asyncrl.records import Fault, Lifecycle, SamplingParams, Task, Trajectory, Turn, new_id


@dataclass
class EpisodeSettings:
    max_turns: int
    max_context: int
    sampling: SamplingParams
    worker_id: str = ""
    early_stop_invalid: int = field(kw_only=True)
    """``control.exploration.early_stop_invalid``: end the episode (outcome ``early_stopped``) after this
    many consecutive invalid actions (a malformed action or a step fault); 0: never."""
    on_turn: Callable[[], None] | None = None
    """Called after every model turn (the worker's in-flight load accounting)."""


async def run_episode(
    task: Task,
    env: Any,
    batcher: TurnBatcher,
    renderer: Renderer,
    settings: EpisodeSettings,
    group_id: str = "",
    prefix: list[list[int]] | None = None,
) -> Trajectory:
    """Play one episode of ``env`` (already guarded) on ``task`` and return its trajectory.

    ``prefix``: token ids of model turns to replay instead of sampling, before the policy takes
    over (counterfactual resampling from a segment boundary, ``asyncrl credit ablate``); replayed
    turns carry log-prob 0.0.
    """
    batcher.live_episodes += 1
    try:
        return await _run_episode(task, env, batcher, renderer, settings, group_id, prefix or [])
    finally:
        batcher.live_episodes -= 1


async def _run_episode(
    task: Task,
    env: Any,
    batcher: TurnBatcher,
    renderer: Renderer,
    settings: EpisodeSettings,
    group_id: str,
    prefix: list[list[int]],
) -> Trajectory:
    life = Lifecycle(created=time.time(), rollout_start=time.time())
    traj = Trajectory(
        id=new_id(),
        task=task,
        turns=[],
        lifecycle=life,
        worker_id=settings.worker_id,
        group_id=group_id,
        sampling=settings.sampling,
    )
    # 1. reset: the first observation is the prompt
    try:
        prompt_text = await env.reset(task)
    except EnvResetError as exc:
        traj.outcome = "env_error"
        traj.reward_components["env_error"] = 1.0
        fault = exc.fault if isinstance(getattr(exc, "fault", None), Fault) else None
        traj.turns.append(
            Turn(role="env", token_ids=[], fault=fault or Fault(kind="exception", message=str(exc)))
        )
        life.rollout_end = time.time()
        return traj
    conv = renderer.start(prompt_text, list(getattr(env, "tools", None) or []))
    context = conv.ids  # grows by appending only: sampled turns as sampled, rendered deltas
    if len(context) >= settings.max_context:
        traj.turns.append(Turn(role="env", token_ids=context[: settings.max_context]))
        traj.outcome = "truncated"
        life.rollout_end = time.time()
        return traj
    traj.turns.append(Turn(role="env", token_ids=list(context)))
    outcome: str = "truncated"  # unless the environment ends the episode first
    invalid = 0  # consecutive invalid actions (early termination)
    for turn_no in range(settings.max_turns):
        # 2. model turn: sample within the remaining context
        room = settings.max_context - len(context)
        if room <= 0:
            break
        sp = SamplingParams(
            temperature=settings.sampling.temperature,
            top_p=settings.sampling.top_p,
            max_new_tokens=min(settings.sampling.max_new_tokens, room),
        )
        started = time.time()
        if turn_no < len(prefix):  # a replayed turn
            ids = prefix[turn_no][:room]
            sample, version = Sample(ids, [0.0] * len(ids), "stop"), batcher.engine.version
        else:
            sample, version = await batcher.generate(list(context), sp)
        keep = renderer.cut_at_stop(sample.token_ids)  # a stop string ends the turn where it completes
        turn = Turn(
            role="model",
            token_ids=list(sample.token_ids[:keep]),
            logprobs=list(sample.logprobs[:keep]),
            version=version,
            started_at=started,
            ended_at=time.time(),
        )
        traj.turns.append(turn)
        action = renderer.add_model_turn(conv, turn.token_ids)
        if settings.on_turn is not None:
            settings.on_turn()
        # 3. environment step (guarded: faults come back as a default observation)
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
        if result.done:
            traj.final_reward = float(result.reward)
            outcome = result.outcome or ("success" if result.reward > 0 else "failure")
            break
        bad = turn.fault is not None or result.malformed
        invalid = invalid + 1 if bad else 0
        if settings.early_stop_invalid and invalid >= settings.early_stop_invalid:
            outcome = "early_stopped"  # a failing trajectory: stop spending generation on it
            break
        # 4. observation, unless it would overflow the context
        obs = renderer.observation(conv, result.observation)
        if len(context) + len(obs) >= settings.max_context:
            break
        renderer.add_observation(conv, result.observation, obs)
        traj.turns.append(Turn(role="tool", token_ids=obs, started_at=turn.ended_at, ended_at=time.time()))
    traj.render_diff, traj.retokenization_diff = _exactness(renderer, conv)
    traj.outcome = outcome  # type: ignore[assignment]
    traj.reward_components["outcome"] = traj.final_reward
    traj.reward_components["process"] = sum(t.process_reward for t in traj.turns)
    life.rollout_end = time.time()
    return traj


def _exactness(renderer: Renderer, conv: Any) -> tuple[int | None, int | None]:
    """(render diff, retokenisation diff) of the finished chat; ``None`` where the template
    cannot render it whole."""
    try:
        return renderer.render_diff(conv), renderer.retokenization_diff(conv)
    except ChatTemplateError:
        return None, None


def jittered(sampling: SamplingParams, jitter: float, rng: random.Random) -> SamplingParams:
    """Per-episode temperature drawn uniformly from temperature·(1 ± jitter) (exploration knob)."""
    if jitter <= 0:
        return sampling
    t = sampling.temperature * (1 + rng.uniform(-jitter, jitter))
    return SamplingParams(
        temperature=max(t, 1e-3), top_p=sampling.top_p, max_new_tokens=sampling.max_new_tokens
    )
