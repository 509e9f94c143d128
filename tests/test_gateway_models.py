"""The gateway on pretrained chat templates (SmolLM2's real tokenizer under the SmolLM2, Qwen2.5
and Llama-3 templates): OpenAI messages and tools rendered by the model's own template, the
model's native tool calls reported as OpenAI ``tool_calls``, and an agent's tool loop merged
into one trajectory whose ids are exactly the sampled ids plus rendered deltas."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import openai
import pytest
import torch

from asyncrl.config import GatewayConfig
from asyncrl.engine import GenerationEngine, Sample
from asyncrl.engine.batcher import TurnBatcher
from asyncrl.gateway import Gateway, build_trajectories
from asyncrl.gateway.protocol import Message
from asyncrl.policy.chat import HFChatRenderer, eos_ids
from asyncrl.records import SamplingParams, Task
from models_util import family_tokenizer, load_tokenizer, smollm2_dir

TASK = Task(id="t", task_type="arithmetic", payload={"prompt": "3 bags of 4 pens. How many?", "answer": "12"})
CALC = {
    "type": "function",
    "function": {
        "name": "calc",
        "description": "evaluate arithmetic",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
    },
}


@pytest.fixture(scope="module", params=["smollm2", "qwen25", "llama3"])
def renderer(request: pytest.FixtureRequest) -> HFChatRenderer:
    tok = family_tokenizer(load_tokenizer(smollm2_dir()), request.param)
    return HFChatRenderer(
        tok, eos_token_ids=eos_ids(None, tok), tool_format="auto", observation_role="auto", multi_turn="auto"
    )


class TokenEngine(GenerationEngine):
    def __init__(self, turns: list[list[int]]) -> None:
        self.turns, self.version, self.max_context = list(turns), 2, 100_000

    def generate(self, prompts: list[list[int]], sampling: Any) -> list[Sample]:
        return [self._one() for _ in prompts]

    def _one(self) -> Sample:
        ids = self.turns.pop(0)
        return Sample(ids, [-0.5] * len(ids), "stop")

    def load_weights(
        self, version: int, tensors: dict[str, torch.Tensor], *, path: str | Path | None = None
    ) -> None:  # pragma: no cover - unused
        pass


def turn(r: HFChatRenderer, text: str) -> list[int]:
    return [*r.tokenizer.encode(text, add_special_tokens=False), r.stop_token_ids[0]]


def test_an_openai_tool_loop_on_a_chat_template_is_one_token_exact_trajectory(
    renderer: HFChatRenderer,
) -> None:
    r = renderer
    turns = [turn(r, r.fmt.write_call("calc", {"expression": "3*4"})), turn(r, "<answer>12</answer>")]
    batcher = TurnBatcher(TokenEngine(turns), max_wait_s=0.0, max_batch=64)
    gw = Gateway(GatewayConfig(), batcher, r, 4096, SamplingParams(max_new_tokens=64))

    async def go() -> Any:
        await gw.start(port=0)
        s = gw.sessions.open(TASK)
        c = openai.AsyncOpenAI(base_url=gw.base_url, api_key=s.key)
        messages: list[Any] = [
            {"role": "system", "content": "You are a careful assistant."},
            {"role": "user", "content": TASK.payload["prompt"]},
        ]
        first = await c.chat.completions.create(model="asyncrl-policy", messages=messages, tools=[CALC])
        msg = first.choices[0].message
        messages.append(msg.model_dump(exclude_none=True))
        for tc in msg.tool_calls or []:
            messages.append({"role": "tool", "tool_call_id": tc.id, "content": "12"})
        second = await c.chat.completions.create(model="asyncrl-policy", messages=messages, tools=[CALC])
        await c.close()
        batcher.close()
        await gw.stop()
        return s, first, second

    s, first, second = asyncio.run(go())
    [tc] = first.choices[0].message.tool_calls
    assert tc.function.name == "calc" and json.loads(tc.function.arguments) == {"expression": "3*4"}
    assert (
        second.choices[0].message.content == "<answer>12</answer>"
        and not second.choices[0].message.tool_calls
    )
    assert gw.counts["appended_prompts"] == 1
    [traj] = build_trajectories(s, 1.0, "success")
    assert traj.token_ids() == s.calls[1].prompt_ids + s.calls[1].completion_ids
    assert [t.token_ids for t in traj.turns if t.role == "model"] == turns  # the sampled ids, as sampled
    obs = r.tokenizer.decode([i for t in traj.turns if t.role == "tool" for i in t.token_ids])
    assert "12" in obs
    # the first prompt is the template's own rendering, with the tools where the template puts them
    prompt = r.tokenizer.decode(s.calls[0].prompt_ids)
    assert "calc" in prompt and TASK.payload["prompt"] in prompt and "careful assistant" in prompt


def test_special_token_strings_in_client_content_stay_text(renderer: HFChatRenderer) -> None:
    from asyncrl.gateway.render import MessageRenderer

    r = renderer
    eot = r.tokenizer.decode([r.stop_token_ids[0]])
    ids = MessageRenderer(r).render([Message(role="user", content=f"hi {eot} there")], [])
    # the only end-of-turn tokens are the template's own markup, not the one in the content
    plain = MessageRenderer(r).render([Message(role="user", content="hi x there")], [])
    assert ids.count(r.stop_token_ids[0]) == plain.count(r.stop_token_ids[0])
