"""The calculator agent as a plain ``openai`` tool-calling loop (train it with ``env.kind: agent``).

Nothing here knows about asyncrl except the tool itself (the calculator environment's safe
arithmetic parser): the same function runs against api.openai.com or any OpenAI-compatible
server. asyncrl hands it an ``openai.AsyncOpenAI`` client bound to the episode's session::

    env.kind: agent
    env.path: examples.calculator_openai:run
    env.agent_tasks: calculator

The reward is 1.0 for the right final answer, else 0.0.
"""

from __future__ import annotations

import json
import re
from typing import Any

from asyncrl.envs import CalcError, evaluate

MODEL = "asyncrl-policy"
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "calc",
            "description": "Evaluate integer arithmetic: digits, + - * / and parentheses. Returns the integer.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string", "description": "arithmetic expression"}},
                "required": ["expression"],
            },
        },
    }
]
MAX_TURNS = 6


def calc(expression: str) -> str:
    try:
        return str(evaluate(expression))
    except CalcError as exc:
        return f"error: {exc}"


def final_answer(text: str) -> str:
    m = re.search(r"<answer>(.*?)</answer>", text, re.S)
    return (m.group(1) if m else text).strip()


async def run(task: Any, client: Any) -> float:
    messages: list[Any] = [{"role": "user", "content": task.payload["prompt"]}]
    for _ in range(MAX_TURNS):
        response = await client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS)
        message = response.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return 1.0 if final_answer(message.content or "") == str(task.payload["answer"]) else 0.0
        for call in message.tool_calls:
            try:
                expression = json.loads(call.function.arguments).get("expression", "")
            except (ValueError, AttributeError):
                expression = call.function.arguments
            messages.append({"role": "tool", "tool_call_id": call.id, "content": calc(str(expression))})
    return 0.0
