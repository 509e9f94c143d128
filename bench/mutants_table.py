"""The mutation score of each area of ``make mutants`` (mutmut's results under ``mutants/``), as the
Markdown table of ``docs/mutants.md``, then the surviving mutants by name.

    .venv/bin/python bench/mutants_table.py

Killed counts a test failure, a timeout and a crash; "no tests" (no selected test reaches the
function) counts as surviving. ``mutmut show NAME`` prints a survivor's diff.
"""

from __future__ import annotations

import fnmatch
import json
import sys
from pathlib import Path

# (area, mutant name globs): the same globs `make mutants` passes to `mutmut run`
AREAS: list[tuple[str, list[str]]] = [
    ("algo/", ["asyncrl.algo.*"]),
    ("staleness.py", ["asyncrl.staleness.*"]),
    ("credit strategies", ["asyncrl.credit.outcome.*", "asyncrl.credit.tree.*", "asyncrl.credit.assign.*"]),
    (
        "queue ack/redelivery (embedded)",
        [
            f"asyncrl.transport.embedded.xǁEmbeddedQueueǁ{m}__mutmut_*"
            for m in ("_try_put", "get_batch", "_lease", "ack", "dead_letters")
        ],
    ),
    (
        "renderer bridge",
        [
            f"asyncrl.policy.chat.{f}__mutmut_*"
            for f in (
                "xǁ_Marksǁ__init__",
                "xǁ_Marksǁ__call__",
                "x__forms",
                "x__between",
                "xǁHFChatRendererǁ_spans",
                "xǁHFChatRendererǁ_encode",
                "xǁHFChatRendererǁbridge",
                "xǁHFChatRendererǁsplice",
            )
        ]
        + [
            f"asyncrl.policy.renderer.{f}__mutmut_*"
            for f in (
                "xǁRendererǁobservation",
                "xǁRendererǁadd_observation",
                "xǁRendererǁrender_diff",
                "xǁTextRendererǁbridge",
                "xǁTextRendererǁsplice",
            )
        ],
    ),
]
KILLED = {1, 3, 36, 37, -24, 24, 152, 255, -11, -9}  # mutmut's exit codes: killed, timeout, type check, crash
SURVIVED, NO_TESTS = 0, {5, 33}


def results(root: Path) -> dict[str, int | None]:
    out: dict[str, int | None] = {}
    for meta in sorted(root.glob("**/*.py.meta")):
        out.update(json.loads(meta.read_text())["exit_code_by_key"])
    return out


def main() -> int:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "mutants")
    codes = results(root)
    lines = [
        "| area | mutants | killed | survived | no test reaches it | not run | score |",
        "|---|---|---|---|---|---|---|",
    ]
    survivors: list[str] = []
    for area, globs in AREAS:
        names = sorted(k for k in codes if any(fnmatch.fnmatch(k, g) for g in globs))
        killed = sum(codes[k] in KILLED for k in names)
        survived = [k for k in names if codes[k] == SURVIVED]
        no_tests = [k for k in names if codes[k] in NO_TESTS]
        not_run = sum(codes[k] is None for k in names)
        run = len(names) - not_run
        score = f"{100 * killed / run:.1f} %" if run else "-"
        lines.append(
            f"| {area} | {len(names)} | {killed} | {len(survived)} | {len(no_tests)} | {not_run} | {score} |"
        )
        survivors += [f"{k} (survived)" for k in survived] + [f"{k} (no test)" for k in no_tests]
    print("\n".join(lines))
    print(f"\n{len(survivors)} not killed:")
    print("\n".join(survivors))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
