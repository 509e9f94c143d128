"""The command line's help is written once, in the parser: ``asyncrl --help``, ``asyncrl help`` and
docs/cli.md are generated from it, and docs/cli.md cannot drift from it."""

from __future__ import annotations

import argparse
import importlib
import inspect
from pathlib import Path

import pytest

from asyncrl import cli

ROOT = Path(__file__).resolve().parents[1]


def test_the_docs_reference_is_the_generated_one() -> None:
    """On failure: regenerate with ``asyncrl help > docs/cli.md``."""
    assert (ROOT / "docs" / "cli.md").read_text() == cli.cli_reference(cli.build_parser())


def test_a_parser_change_changes_the_reference() -> None:
    parser = cli.build_parser()
    before = cli.cli_reference(parser)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    sub.choices["train"].add_argument("--new-flag", action="store_true", help="a flag the docs do not have")
    after = cli.cli_reference(parser)
    assert after != before and "| `--new-flag` | a flag the docs do not have |" in after


def test_top_level_help_lists_every_command_with_its_parser_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    commands = cli._commands(cli.build_parser())
    assert len(commands) >= 19
    for words, help, _ in commands:
        assert f"  {' '.join(words)} " in out and help in out
    assert "credit ablate" in out and "config explain" in out  # subcommands, not only the first word


def test_help_for_one_command_and_an_unknown_one(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["help", "config", "show"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("## asyncrl config show") and "## asyncrl config explain" not in out
    assert "`--set KEY=VALUE`" in out
    assert cli.main(["help", "nosuch"]) == cli.EXIT_USER_ERROR
    assert "no command 'nosuch'" in capsys.readouterr().err


def test_parser_functions_fit_on_a_screen() -> None:
    """build_parser was one 166-line function; each piece (in every module of the cli package) now
    stays under 80 lines."""
    modules = [cli, *(importlib.import_module(f"asyncrl.cli.{m}") for m in ("parser", "run", "read"))]
    long = {
        name: n
        for module in modules
        for name, fn in inspect.getmembers(module, inspect.isfunction)
        if fn.__module__ == module.__name__ and (n := len(inspect.getsource(fn).splitlines())) > 80
    }
    assert long == {} and len([m for m in modules if inspect.getmembers(m, inspect.isfunction)]) == 4


def test_the_command_line_imports_no_torch_until_a_command_needs_it() -> None:
    """``asyncrl status``, ``stop``, ``cost report``, ``config show`` and the other commands that read
    files start in about a second: importing torch (and transformers) takes several seconds on two
    cores, so only the handlers that train, evaluate or replay import it (``replay`` did at the top of
    cli/read.py: every command paid for it)."""
    import subprocess
    import sys

    probe = "import sys, asyncrl.cli; print(sorted({'torch', 'transformers', 'numpy'} & set(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout
