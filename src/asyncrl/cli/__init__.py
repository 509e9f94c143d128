"""The ``asyncrl`` command line: thin entry points that parse arguments, then import the heavy parts.

Every user mistake (bad config, bad path, bad plugin) ends with one readable message on
stderr and exit code 2 — never a traceback. The parser and the generated reference are in
:mod:`asyncrl.cli.parser`; the commands in :mod:`asyncrl.cli.run` (training and steering a run)
and :mod:`asyncrl.cli.read` (configs, environments, models and finished runs).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from asyncrl.cli import read, run
from asyncrl.cli.parser import EXIT_USER_ERROR, _commands, build_parser, cli_reference, cmd_help
from asyncrl.errors import UserError
from asyncrl.orchestrator.stopping import Stopped

__all__ = ["EXIT_USER_ERROR", "_commands", "build_parser", "cli_reference", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USER_ERROR if argv else 0
    words = args.command if "subcommand" not in args else f"{args.command} {args.subcommand}"
    handler = {**read.HANDLERS, **run.HANDLERS, "help": cmd_help}[words]
    try:
        return handler(args)
    except UserError as exc:
        print(f"asyncrl: error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except Stopped as stop:  # a stop signal: the run is stopped cleanly and says how to resume
        print(stop.message(), file=sys.stderr)
        return stop.exit_code
    except KeyboardInterrupt:  # Ctrl-C in a command that runs no training job
        print("asyncrl: interrupted", file=sys.stderr)
        return 130
