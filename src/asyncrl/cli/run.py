"""The commands that train or steer a run: ``sft``, ``eval``, ``train``, ``role``, ``status``,
``stop``, ``demo``."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from asyncrl.cli.parser import EXIT_USER_ERROR, print_report
from asyncrl.config import load_config
from asyncrl.jobs.credit_inspect import credit_fragment
from asyncrl.jobs.report import write_report


def _cmd_sft(args: argparse.Namespace) -> int:
    from asyncrl.jobs.warm_start import warm_start

    cfg = load_config(args.config, args.overrides)
    result = warm_start(cfg, force=args.force, progress=True)
    print(f"warm-start policy: {result.path}")
    print(
        f"held-out success {result.heldout_success:.1%} after {result.seconds:.0f}s"
        + (" (cached)" if result.cached else "")
    )
    return 0


def _cmd_eval(args: argparse.Namespace) -> int:
    from asyncrl.rollout.heldout import evaluate_checkpoint, render_eval

    cfg = load_config(args.config, args.overrides)
    return print_report(args.json, evaluate_checkpoint(cfg, args.checkpoint, limit=args.limit), render_eval)


def _cmd_train(args: argparse.Namespace) -> int:
    from asyncrl.orchestrator.runctl import finished_summary

    if args.config is None and args.resume is None:
        print("asyncrl train: give a CONFIG or --resume RUN", file=sys.stderr)
        return EXIT_USER_ERROR
    cfg = load_config(args.config, args.overrides) if args.config else load_config()
    done = finished_summary(Path(args.resume)) if args.resume is not None else None
    if done is not None:  # a finished run: said so at once, before the job (torch) is imported
        print(json.dumps(done, indent=2))
        print(f"run directory: {Path(args.resume)}")
        return 0
    from asyncrl.jobs.train import train

    run_dir, summary = train(cfg, resume=args.resume, display=not args.no_display, eval_limit=args.eval_limit)
    print(json.dumps(summary, indent=2))
    print(f"run directory: {run_dir}")
    return 0


def _cmd_role(args: argparse.Namespace) -> int:
    from asyncrl.service import EXIT_ORPHANED, Orphaned, run_role, summary_line

    cfg = load_config(args.config, args.overrides)
    try:
        summary = run_role(args.role, cfg, Path(args.run_dir), index=args.index, wait_s=args.wait)
    except Orphaned as exc:
        print(exc, file=sys.stderr)
        return EXIT_ORPHANED
    if summary is not None:
        print(summary_line(summary))
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    from asyncrl.orchestrator.runctl import run_status

    st = run_status(args.run)
    print(json.dumps(st.to_dict(), indent=2) if args.json else st.render())
    return 0


def _cmd_stop(args: argparse.Namespace) -> int:
    from asyncrl.orchestrator.runctl import stop_run

    st = stop_run(args.run, now=args.now, wait_s=args.wait)
    print(st.render())
    if st.status == "running":
        print(f"asyncrl stop: {args.run} is still running after {args.wait:.0f}s", file=sys.stderr)
        return 1
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from asyncrl.jobs.train import train

    path = args.config or str(Path("configs") / "demo.yaml")
    cfg = load_config(path, args.overrides)
    run_dir, s = train(cfg, display=not args.no_display)
    table = Table(title=f"asyncrl demo — {cfg.env.kind}, mode {s['mode']}, {s['wall_seconds']:.0f}s")
    for col in ("", "warm start", "after RL", "change"):
        table.add_column(col, justify="right")
    table.add_row(
        "held-out success",
        f"{s['initial_success']:.1%}",
        f"{s['final_success']:.1%}",
        f"{(s['final_success'] - s['initial_success']) * 100:+.1f} pts",
    )
    Console().print(table)
    print(
        f"trained {s['samples_trained']} samples over {s['trainer_steps']} steps; "
        f"staleness mean {s['staleness_mean']:.2f} max {s['staleness_max']}; "
        f"dropped stale {s['samples_dropped_stale']}; lost {s['lost_trajectories']}; "
        f"trainer busy {s['trainer_busy_fraction']:.0%}"
    )
    if s.get("token_exact_rate") is not None:
        print(
            f"token-exact samples {s['token_exact_rate']:.0%} of {s['token_exact_checked']} checked "
            f"({s.get('token_exact_unchecked', 0)} unchecked); a re-tokenising "
            f"framework would have matched {s['retokenization_exact_rate']:.0%}"
        )
    elif s.get("token_exact_unchecked"):
        print(f"token-exactness: none of {s['token_exact_unchecked']} samples could be checked")
    print(f"run directory: {run_dir}")

    print(f"report: {write_report(run_dir, credit_view=credit_fragment)}")
    return 0


HANDLERS: dict[str, Callable[[argparse.Namespace], int]] = {
    "sft": _cmd_sft,
    "eval": _cmd_eval,
    "train": _cmd_train,
    "role": _cmd_role,
    "status": _cmd_status,
    "stop": _cmd_stop,
    "demo": _cmd_demo,
}
