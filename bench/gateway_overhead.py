"""Gateway overhead per call against awaiting the worker's ``TurnBatcher`` directly, at 1, 32 and
128 concurrent sessions; prints one JSON object. Two clients: plain JSON over HTTP on loopback
(``gateway_http``: the gateway's own cost — HTTP, session lookup, validation, rendering,
recording) and the official ``openai`` client (``gateway_openai_sdk``: what an agent program pays,
the SDK's request building and response parsing included — it runs in the worker's event loop).

    PYTHONPATH=src .venv/bin/python bench/gateway_overhead.py [--calls 3] [--sessions 1,32,128]

Engines: ``null`` answers instantly (the gateway's own cost, undiluted) and ``tiny`` is the
built-in engine on the tiny char model (what a test-sized run pays). Both arms run the same
prompts in the same process, side by side; compare the ratios, not absolute times (shared CPU).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

import openai
import torch

from asyncrl.config import GatewayConfig, HFEngineConfig, ModelConfig
from asyncrl.engine import GenerationEngine, Sample, make_engine
from asyncrl.engine.batcher import TurnBatcher
from asyncrl.gateway import Gateway
from asyncrl.policy import Policy
from asyncrl.policy.chat import TextRenderer
from asyncrl.records import SamplingParams, Task

PROMPT = "Ann has 3 bags of 4 pens. She gets 5 more. How many pens?"
SP = SamplingParams(temperature=1.0, max_new_tokens=8)


class NullEngine(GenerationEngine):
    def __init__(self, renderer: TextRenderer) -> None:
        self.version, self.max_context = 0, 512
        self.ids = renderer.encode_content("<answer>17</answer>")

    def generate(self, prompts: list[list[int]], sampling: Any) -> list[Sample]:
        return [Sample(list(self.ids), [-0.1] * len(self.ids), "stop") for _ in prompts]

    def load_weights(
        self, version: int, tensors: dict[str, torch.Tensor], *, path: str | Path | None = None
    ) -> None:  # pragma: no cover
        pass


async def direct(batcher: TurnBatcher, prompt: list[int], sessions: int, calls: int) -> list[float]:
    lat: list[float] = []

    async def one() -> None:
        for _ in range(calls):
            t0 = time.perf_counter()
            await batcher.generate(list(prompt), SP)
            lat.append(time.perf_counter() - t0)

    await asyncio.gather(*(one() for _ in range(sessions)))
    return lat


async def through_gateway(gw: Gateway, sessions: int, calls: int) -> list[float]:
    lat: list[float] = []
    task = Task(id="t", task_type="x")
    http = openai.DefaultAsyncHttpxClient()  # one pool for all sessions, as AgentRunner does

    async def one() -> None:
        s = gw.sessions.open(task)
        c = openai.AsyncOpenAI(base_url=gw.base_url, api_key=s.key, http_client=http)
        for _ in range(calls):
            t0 = time.perf_counter()
            await c.chat.completions.create(
                model="asyncrl-policy", messages=[{"role": "user", "content": PROMPT}], max_tokens=8
            )
            lat.append(time.perf_counter() - t0)
        gw.sessions.close(s)

    await asyncio.gather(*(one() for _ in range(sessions)))
    await http.aclose()
    return lat


async def through_gateway_raw(gw: Gateway, sessions: int, calls: int) -> list[float]:
    """The same calls as plain JSON over HTTP (no SDK): the gateway's own cost."""
    import httpx2

    lat: list[float] = []
    task = Task(id="t", task_type="x")
    body = {"model": "asyncrl-policy", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 8}
    async with httpx2.AsyncClient(limits=httpx2.Limits(max_connections=1000)) as http:

        async def one() -> None:
            s = gw.sessions.open(task)
            for _ in range(calls):
                t0 = time.perf_counter()
                r = await http.post(
                    f"{gw.base_url}/chat/completions", json=body, headers={"Authorization": f"Bearer {s.key}"}
                )
                r.raise_for_status()
                lat.append(time.perf_counter() - t0)
            gw.sessions.close(s)

        await asyncio.gather(*(one() for _ in range(sessions)))
    return lat


def stats(lat: list[float], wall: float) -> dict[str, float]:
    return {
        "mean_ms": round(1000 * statistics.fmean(lat), 2),
        "p50_ms": round(1000 * statistics.median(lat), 2),
        "calls_per_s": round(len(lat) / wall, 1),
    }


async def arm(engine: GenerationEngine, renderer: TextRenderer, sessions: int, calls: int) -> dict[str, Any]:
    batcher = TurnBatcher(engine, max_batch=128, max_wait_s=0.005)
    batcher.live_episodes = sessions
    gw = Gateway(GatewayConfig(), batcher, renderer, 512, SP)
    await gw.start(port=0)
    prompt = [renderer.bos, *renderer.encode_content(PROMPT)]
    try:
        await direct(batcher, prompt, min(sessions, 4), 1)  # warm up both paths
        await through_gateway(gw, min(sessions, 4), 1)
        t0 = time.perf_counter()
        d = stats(await direct(batcher, prompt, sessions, calls), time.perf_counter() - t0)
        t0 = time.perf_counter()
        h = stats(await through_gateway_raw(gw, sessions, calls), time.perf_counter() - t0)
        t0 = time.perf_counter()
        g = stats(await through_gateway(gw, sessions, calls), time.perf_counter() - t0)
    finally:
        await gw.stop()
        batcher.close()
    return {
        "direct": d,
        "gateway_http": h,
        "gateway_openai_sdk": g,
        "http_overhead_ms_per_call": round(h["mean_ms"] - d["mean_ms"], 2),
        "sdk_overhead_ms_per_call": round(g["mean_ms"] - d["mean_ms"], 2),
        "http_throughput_ratio": round(h["calls_per_s"] / d["calls_per_s"], 3),
        "sdk_throughput_ratio": round(g["calls_per_s"] / d["calls_per_s"], 3),
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--sessions", default="1,32,128")
    args = ap.parse_args()
    torch.set_num_threads(1)
    policy = Policy.build(ModelConfig(hidden_size=64, num_layers=2, max_context=512))
    renderer = TextRenderer(policy.tokenizer)
    engines = {
        "null": lambda: NullEngine(renderer),
        "tiny": lambda: make_engine(HFEngineConfig(max_batch=128), policy, renderer.stop_token_ids, seed=0),
    }
    out: dict[str, Any] = {"calls_per_session": args.calls, "results": {}}
    for name, build in engines.items():
        for n in (int(x) for x in args.sessions.split(",")):
            out["results"][f"{name}/{n}"] = asyncio.run(arm(build(), renderer, n, args.calls))
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
