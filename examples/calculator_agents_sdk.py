"""The calculator agent written with the OpenAI Agents SDK (train it with ``env.kind: agent``).

The SDK's chat-completions model is given the client asyncrl binds to the episode's session::

    env.kind: agent
    env.path: examples.calculator_agents_sdk:run

No instructions are set, so the tiny char model sees the same layout as the built-in
environment (a pretrained model would take a system prompt here). Tracing is switched off: it
would upload to api.openai.com. The reward is 1.0 for the right final answer, else 0.0.
"""

from __future__ import annotations

from typing import Any

from agents import (
    Agent,
    MaxTurnsExceeded,
    OpenAIChatCompletionsModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)

from asyncrl.envs import CalcError, evaluate

set_tracing_disabled(True)
MODEL = "asyncrl-policy"


@function_tool
def calc(expression: str) -> str:
    """Evaluate integer arithmetic: digits, + - * / and parentheses. Returns the integer.

    Args:
        expression: arithmetic expression
    """
    try:
        return str(evaluate(expression))
    except CalcError as exc:
        return f"error: {exc}"


def final_answer(text: str) -> str:
    import re

    m = re.search(r"<answer>(.*?)</answer>", text, re.S)
    return (m.group(1) if m else text).strip()


async def run(task: Any, client: Any) -> float:
    agent = Agent(name="calculator", tools=[calc], model=OpenAIChatCompletionsModel(MODEL, client))
    try:
        result = await Runner.run(agent, task.payload["prompt"], max_turns=6)
    except MaxTurnsExceeded:
        return 0.0
    return 1.0 if final_answer(str(result.final_output)) == str(task.payload["answer"]) else 0.0
