"""A multi-node run, simulated on this machine: a Ray cluster of three nodes (``ray.cluster_utils.Cluster``),
custom resources forcing the placement — the two trainer ranks on two nodes, the rollout worker and the
evaluator on the third — the Redis queue and the shared weight store between them. The run trains to
completion; midway a trainer node is removed (its rank dies with it) and a fresh node joins, and the
group restarts from the newest checkpoint with nothing lost and nothing trained twice.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray", reason="needs ray (pip install 'asyncrl[ray]')")

from asyncrl.config import load_config
from asyncrl.control import RunState
from helpers import TINY_RUN, wait_for
from redis_server import RedisServer

pytestmark = [pytest.mark.ray, pytest.mark.redis, pytest.mark.slow]

STEPS, BATCH = 8, 16


def test_three_node_cluster_trains_and_survives_losing_a_trainer_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ray
    from ray.cluster_utils import Cluster

    from asyncrl.jobs.train import train
    from asyncrl.launch import ray_launcher

    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    ray_launcher._prepare_local_auth()
    ray_launcher._refresh_ray_auth()
    server = RedisServer(tmp_path / "redis")
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        trainer_nodes = [cluster.add_node(num_cpus=2, resources={"trainer_node": 1}) for _ in range(2)]
        cluster.add_node(num_cpus=4, resources={"rollout_node": 4})
        ray.init(address=cluster.address)
        cfg = load_config(
            None,
            [
                *TINY_RUN,
                "env.heldout_size=8",
                f"trainer.batch_size={BATCH}",
                f"trainer.total_steps={STEPS}",
                "trainer.world_size=2",
                "trainer.dist_timeout_s=20",
                "launcher.kind=ray",
                "launcher.trainer_resources={trainer_node: 1}",
                "launcher.rollout_resources={rollout_node: 1}",
                "launcher.rollout_cpus=0.5",
                "transport.kind=redis",
                f"transport.redis_url={server.url}",
                "weights.kind=shared",
                f"weights.redis_url={server.url}",
                f"weights.path={tmp_path / 'shared-weights'}",
                f"run_root={tmp_path / 'runs'}",
                f"cache_dir={tmp_path / 'cache'}",
            ],
        )
        out: dict[str, Any] = {}

        def run() -> None:
            try:
                out["run_dir"], out["summary"] = train(cfg, display=False, eval_limit=4)
            except BaseException as exc:
                out["error"] = exc

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        root = tmp_path / "runs"
        wait_for(lambda: any(root.glob("*/pids.json")) or "error" in out, 600, "the run to start")
        assert "error" not in out, out["error"]
        run_dir = next(root.glob("*/pids.json")).parent
        state = RunState.open(cfg, run_dir)
        wait_for(lambda: state.version() >= 3 or "error" in out, 600, "version 3")
        nodes = _actor_nodes(cluster, run_dir)
        trainer_at = {nodes[n] for n in ("trainer", "trainer.1")}
        assert len(trainer_at) == 2  # one rank per trainer node
        assert nodes["rollout-0"] not in trainer_at
        # a trainer node is lost (its rank dies with it); a replacement joins, as an autoscaler would add
        lost = next(n for n in trainer_nodes if n.node_id in trainer_at)
        cluster.remove_node(lost)
        cluster.add_node(num_cpus=2, resources={"trainer_node": 1})
        thread.join(900)
        assert not thread.is_alive() and "error" not in out, out.get("error")
        s = out["summary"]
        assert s["trainer_steps"] == STEPS and s["samples_trained"] == STEPS * BATCH
        assert state.fate_counts().get("trained", 0) == STEPS * BATCH
        assert s["lost_trajectories"] == 0 and s["duplicates_recorded"] == 0
        assert s["restarts"].get("trainer", 0) >= 1 and state.tallies().resumes >= 1
        pids = json.loads((run_dir / "pids.json").read_text())
        assert {"trainer", "trainer.1", "rollout-0"} <= set(pids)
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()
        server.stop()


def _actor_nodes(cluster: Any, run_dir: Path) -> dict[str, str]:
    """Role name -> node id: each role's pid (``pids.json``) is a worker process under one node's raylet."""
    raylets = {n.all_processes["raylet"][0].process.pid: n.node_id for n in cluster.list_all_nodes()}
    out = {}
    for name, pid in json.loads((run_dir / "pids.json").read_text()).items():
        p = pid
        while p > 1 and p not in raylets:
            p = int(Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[1])  # the parent
        if p in raylets:
            out[name] = raylets[p]
    return out
