"""Recipe: a verifiers v1 environment trained through asyncrl's gateway (``env.kind: agent``).

verifiers v1 (0.4.0 and later, and ``verifiers.v1`` in 0.3.1) runs its own harness, which it
installs with ``uv`` from the package index for every episode, and it needs ``openai<3`` while
asyncrl's ``agents`` extra pins ``openai==3.51.0``. So it cannot run inside asyncrl's process: it
runs in its OWN virtual environment, as an agent program whose model calls go to the worker's
OpenAI-compatible gateway (docs/agents.md), which records them token-exact for training::

    python -m venv .venv-vf && .venv-vf/bin/pip install 'verifiers>=0.4'   # needs the network

    env:
      kind: agent
      path: examples.verifiers_agent:run
      agent_tasks: calculator          # a task source: its prompt picks nothing here, its seed/ids do
    # VF_PYTHON=.venv-vf/bin/python VF_ENV=<taskset-id> asyncrl train -c that.yaml

Per episode this runs verifiers' ``eval`` CLI for one rollout, its client pointed at the gateway
(``--client.base_url``, and the session key as ``OPENAI_API_KEY``, from the ``client`` asyncrl
hands the agent), and returns the rollout's reward
from the run's ``traces.jsonl``. What runs offline: nothing of this recipe (``uv`` fetches the
harness). UNTESTED here (no network on the build machines); check ``eval --help`` of your verifiers
version for the exact options. verifiers v0 environments need none of this: ``env.kind: verifiers``
runs them in process (docs/environments.md#verifiers).
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
from pathlib import Path
from typing import Any


def command(python: str, env_id: str, base_url: str, out: str, seed: int) -> list[str]:
    """The ``eval`` command line of one rollout against ``base_url`` (the episode's gateway session)."""
    return [
        python, "-m", "verifiers.v1.cli.eval.main", env_id,
        "--client.base_url", base_url, "--model", "asyncrl-policy",
        "--num_tasks", "1", "--num_rollouts", "1", "--output_dir", out, "--push", "false",
        "--run.name", f"asyncrl-{seed}",
    ]  # fmt: skip


def reward_of(out: Path) -> float | None:
    """The reward of the first episode in ``out``'s ``traces.jsonl`` (None when there is none)."""
    for traces in sorted(out.rglob("traces.jsonl")):
        for line in traces.read_text().splitlines():
            episode = json.loads(line)
            value = episode.get("reward")
            return None if value is None else float(value)
    return None


async def run(task: Any, client: Any) -> float | None:
    python, env_id = os.environ["VF_PYTHON"], os.environ["VF_ENV"]
    with tempfile.TemporaryDirectory() as out:
        seed = abs(hash(task.id)) % 2**31
        key = {"OPENAI_API_KEY": str(client.api_key)}  # the episode's session key (docs/agents.md)
        argv = command(python, env_id, str(client.base_url), out, seed)
        proc = await asyncio.create_subprocess_exec(*argv, env={**os.environ, **key})
        await proc.wait()
        return reward_of(Path(out)) if proc.returncode == 0 else None
