"""A verifiers v0 environment (``vf.SingleTurnEnv``) as verifiers' docs write one; asyncrl runs it in process.

    env:
      kind: verifiers
      verifiers: {path: examples.verifiers_arith:load_environment}

Needs ``verifiers==0.3.1`` installed ``--no-deps`` (docs/environments.md#verifiers).
"""

from __future__ import annotations

from typing import Any

import verifiers as vf
from datasets import Dataset


def correct(completion: Any, answer: str, parser: Any, **kwargs: Any) -> float:
    """1 when the parsed ``<answer>`` equals the reference."""
    return 1.0 if (parser.parse_answer(completion) or "").strip() == answer else 0.0


def load_environment(top: int = 20) -> Any:
    rows = [{"question": f"What is {a}+{b}?", "answer": str(a + b)} for a in range(top) for b in range(top)]
    parser = vf.XMLParser(["answer"], answer_field="answer")
    return vf.SingleTurnEnv(
        dataset=Dataset.from_list(rows),
        system_prompt="Reply with <answer>N</answer>.",
        parser=parser,
        rubric=vf.Rubric(funcs=[correct], parser=parser),
    )
