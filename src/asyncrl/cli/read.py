"""The commands that read configs, environments, models and finished runs: ``config``, ``env``,
``model``, ``report``, ``replay``, ``runs``, ``cost``, ``credit``."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from asyncrl import config as C
from asyncrl.cli.parser import EXIT_USER_ERROR, print_report
from asyncrl.config import CostAssumptionsConfig, load_config
from asyncrl.cost.estimate import estimate, measured_assumptions, to_dict
from asyncrl.errors import UserError
from asyncrl.jobs.cost_report import cost_report, render_estimate, render_report
from asyncrl.jobs.credit_inspect import credit_fragment, render_terminal
from asyncrl.jobs.report import write_report
from asyncrl.jobs.runs import compare_runs, list_runs, render_compare, render_list


def _config_show(args: argparse.Namespace) -> int:
    sys.stdout.write(C.dump_yaml(C.load_config(args.config, args.overrides)))
    return 0


def _config_explain(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    section, rows = args.section, C.explain(C.RunConfig)
    if section:
        rows = [r for r in rows if r[0] == section or r[0].startswith(section + ".")]
        if not rows:
            raise UserError(f"no config section or field {section!r}; sections: {', '.join(C.SECTIONS)}")
    table = Table(title=f"asyncrl config fields{' — ' + section if section else ''}", show_lines=False)
    for col in ("field", "type", "default", "meaning"):
        table.add_column(col, overflow="fold")
    for path, type_name, default, doc in rows:
        style = "bold cyan" if type_name == "section" else None
        table.add_row(escape(path), escape(type_name), escape(default), escape(doc), style=style)
    Console(width=max(120, Console().width)).print(table)
    return 0


def _env_check(args: argparse.Namespace) -> int:
    from asyncrl.envs.check import check_environment

    cfg, run_config = _env_target(args)
    steps = cfg.trainer.sft.resolved(cfg.model.is_pretrained, cfg.model.lora is not None).steps
    warm = cfg.trainer.sft if run_config and steps else None  # a warm start needs demonstrate
    report = check_environment(cfg.env, episodes=args.episodes, warm_start=warm)
    print(report.render())
    return 0 if report.ok else 1


def _env_target(args: argparse.Namespace) -> tuple[C.RunConfig, bool]:
    """The run config ``env check`` / ``env signal`` use: (config, whether TARGET was a run config file);
    an import path of an environment class runs under the default config with ``env.kind: plugin``."""
    from asyncrl.envs.check import ENV_OWN_DIFFICULTIES

    if args.target.endswith((".yaml", ".yml")) or Path(args.target).is_file():
        return load_config(args.target, args.overrides), True
    own = [f"env.{k}={v}" for k, v in ENV_OWN_DIFFICULTIES.items()]  # the plugin's levels, unless --set
    return load_config(None, ["env.kind=plugin", f"env.path={args.target}", *own, *args.overrides]), False


def _env_signal(args: argparse.Namespace) -> int:
    """``asyncrl env signal``: exit 0 when the starting policy has groups with a reward difference, else 1
    (2 for a config error, raised as a :class:`UserError`)."""
    from asyncrl.jobs.env_signal import Levels, check_signal

    cfg, _ = _env_target(args)
    levels = Levels(args.levels, args.max_difficulty)
    quiet = args.no_progress or args.json
    report = check_signal(cfg, tasks=args.tasks, levels=levels, progress=not quiet, name=args.target)
    print(json.dumps(report.to_dict(), sort_keys=True) if args.json else report.render())
    return 0 if report.ok else 1


def _model_import(args: argparse.Namespace) -> int:
    from asyncrl.policy.hub import import_model

    result = import_model(args.source, name=args.name, force=args.force)
    state = "already imported (manifest verified)" if result.cached else f"imported in {result.seconds:.0f}s"
    print(f"{result.path}  {state}; source {result.source}")
    print(f"use it with: --set model.path={result.path}")
    return 0


def _model_info(args: argparse.Namespace) -> int:
    """The directory's numbers, then the preflight ``train`` runs: its plan, or its one-line error."""
    from asyncrl.policy.hub import model_info
    from asyncrl.policy.preflight import preflight_model

    report = model_info(args.path, tokens=args.tokens)
    cfg = load_config(None, [*args.overrides, f"model.path={args.path}"])
    try:
        plan = preflight_model(cfg.model)
        report["preflight"] = "ok: asyncrl train can run this model"
        report.update(plan.summary() if plan is not None else {})
        ok = True
    except UserError as exc:
        report["preflight"] = f"error: {exc}"
        print(f"asyncrl: error: {exc}", file=sys.stderr)  # what train would stop with
        ok = False
    if args.json:
        print(json.dumps(report, sort_keys=True))
    else:
        _print_model_info(report, args.tokens)
    return 0 if ok else EXIT_USER_ERROR


def _print_model_info(report: dict[str, Any], tokens: int) -> None:
    mem = report.pop("memory_gib")
    preflight = report.pop("preflight")
    for key, value in report.items():
        shown = ", ".join(f"{k} {v}" for k, v in value.items()) if isinstance(value, dict) else value
        print(f"{key:>24}: {shown}")
    print(
        f"{'memory (GiB)':>24}: weights {mem['weights_float32']} float32, {mem['weights_bfloat16']} bfloat16"
    )
    step = next(v for k, v in mem.items() if k.startswith("train_step"))
    parts = ", ".join(f"{k} {v}" for k, v in step.items() if k != "total")
    print(f"{'train step (GiB)':>24}: {step['total']} for {tokens} tokens in float32 ({parts})")
    print(f"{'preflight':>24}: {preflight}")


def _cmd_report(args: argparse.Namespace) -> int:
    path = write_report(Path(args.run), Path(args.out) if args.out else None, credit_view=credit_fragment)
    print(f"report: {path} ({path.stat().st_size / 1024:.0f} KiB)")
    return 0


def _cmd_replay(args: argparse.Namespace) -> int:
    from asyncrl.jobs.replay import replay  # torch: imported by the command that trains

    result = replay(Path(args.run), steps=args.steps, save=args.save)
    if args.json:
        print(json.dumps(result, sort_keys=True))
        return 0
    print(
        f"replayed {result['replayed_steps']} of {result['archived_steps']} archived steps in "
        f"{result['seconds']:.1f}s; metrics: {result['metrics']}"
    )
    if result["steps_compared"]:
        diffs = ", ".join(f"{k} {v:.2e}" for k, v in result["max_abs_diff"].items())
        print(f"against the {result['steps_compared']} recorded steps, max |difference|: {diffs}")
    return 0


def _runs_list(args: argparse.Namespace) -> int:
    render_list(list_runs(Path(args.root)))
    return 0


def _runs_compare(args: argparse.Namespace) -> int:
    return print_report(args.json, compare_runs(Path(args.run_a), Path(args.run_b)), render_compare)


def _cost_report(args: argparse.Namespace) -> int:
    return print_report(args.json, cost_report(Path(args.run)), lambda r: render_report(r, Path(args.run)))


def _cost_estimate(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, args.overrides)
    if args.from_run:
        run = Path(args.from_run)
        if not (run / "metrics").is_dir():
            raise UserError(f"--from-run {str(run)!r}: not a run directory with metrics/")
        a = measured_assumptions(run)  # every figure measured (the config's cost.assumptions unused)
    else:
        a = cfg.cost.assumptions
    names = CostAssumptionsConfig.model_fields
    given = {k: v for k, v in vars(args).items() if k in names and v is not None}
    bad = [k for k, v in given.items() if v < 0]
    if bad:
        raise UserError(f"--{bad[0].replace('_', '-')} must be >= 0")
    a = a.model_copy(update=given)
    components, figures, device = estimate(a, cfg.cost), to_dict(a), cfg.cost.device
    if not args.json:
        render_estimate(components, figures, device)
        return 0
    total = sum(components.values())
    out = {"assumptions": figures, "components_usd": components, "total_usd": total, "device": device}
    print(json.dumps(out, sort_keys=True))
    return 0


def _credit_show(args: argparse.Namespace) -> int:
    render_terminal(Path(args.run), n=args.n)
    if args.html:
        Path(args.html).write_text(credit_fragment(Path(args.run), n=args.n))
        print(f"HTML fragment written to {args.html}")
    return 0


def _credit_ablate(args: argparse.Namespace) -> int:
    from asyncrl.jobs.credit_ablate import ablate, render_ablation

    report = ablate(
        Path(args.run),
        checkpoint=args.checkpoint,
        trajectories=args.trajectories,
        k=args.k,
        siblings=args.siblings,
    )
    return print_report(args.json, report, render_ablation)


HANDLERS: dict[str, Callable[[argparse.Namespace], int]] = {
    "config show": _config_show,
    "config explain": _config_explain,
    "env check": _env_check,
    "env signal": _env_signal,
    "model import": _model_import,
    "model info": _model_info,
    "cost estimate": _cost_estimate,
    "cost report": _cost_report,
    "report": _cmd_report,
    "replay": _cmd_replay,
    "runs list": _runs_list,
    "runs compare": _runs_compare,
    "credit show": _credit_show,
    "credit ablate": _credit_ablate,
}
"""Command words (``asyncrl config show``: ``"config show"``) -> handler."""
