"""Render the fault suite's rows (``ASYNCRL_FAULTS_REPORT`` JSONL from ``make test-faults``) as the
Markdown table of ``docs/reliability.md``.

    .venv/bin/python bench/faults_table.py runs/faults-report.jsonl
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

COLUMNS = [
    ("fault", "fault"),
    ("completed", "run completed"),
    ("produced", "produced"),
    ("trained", "trained"),
    ("dropped_stale", "dropped stale"),
    ("dead_lettered", "dead-lettered"),
    ("left_in_queue", "left in queue"),
    ("lost", "**lost**"),
    ("trained_twice", "trained twice"),
    ("versions_monotone", "versions monotone"),
    ("restarts", "restarts"),
    ("recover_s", "time to recover (s)"),
]


def render(rows: list[dict[str, object]]) -> str:
    lines = ["| " + " | ".join(title for _, title in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in rows:
        cells = []
        for key, _ in COLUMNS:
            v = row.get(key, "")
            cells.append("yes" if v is True else "no" if v is False else str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    path = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/faults-report.jsonl")
    rows = (
        [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    )
    print(render(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
