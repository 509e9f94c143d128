"""Which issue changed how many lines of src/: main's first-parent history attributed, as JSON.

Several issues are worked at once, so the src/ change over a range mixes them. Main's first-parent
history separates them: each first-parent commit is one session's commit or one merged branch.
A table names the issue of each first-parent commit that touches the paths; a commit that mixes two
issues is split, by file path or, for a merge, by the branch commits that belong to another issue::

    {"from": "94da1fa", "to": "2392414", "paths": ["src"],
     "commits": {"<sha>": "36", ...},
     "split": {"<merge sha>": {"default": "36", "branch_commits": {"<sha>": "37"}},
               "<sha>": {"default": "38", "paths": {"src/asyncrl/jobs/": "36"}}}}

Each row is the commit's numstat against its first parent; a branch commit's against its own
first parent, and the merge's remainder is the merge's numstat less those. Nets are exact (they sum
to the range's change, which the output checks); added/deleted of a remainder are approximate when
a branch touched a line twice. A commit touching the paths that the table does not name is an error
(exit 1), so nothing is left out quietly.

Usage: ``python bench/issue_diff.py TABLE.json [--repo .] [--list]``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


def numstat(repo: Path, old: str, new: str, paths: list[str]) -> dict[str, tuple[int, int]]:
    """Lines added and deleted per file between two commits (binary files count 0)."""
    out: dict[str, tuple[int, int]] = {}
    for line in _git(repo, "diff", "--numstat", old, new, "--", *paths).splitlines():
        added, deleted, path = line.split("\t", 2)
        out[path] = (int(added) if added != "-" else 0, int(deleted) if deleted != "-" else 0)
    return out


def _sum(stat: dict[str, tuple[int, int]]) -> tuple[int, int]:
    return sum(a for a, _ in stat.values()), sum(d for _, d in stat.values())


def _resolve(repo: Path, sha: str) -> str:
    return _git(repo, "rev-parse", "--verify", f"{sha}^{{commit}}").strip()


def attribute(repo: Path, table: dict[str, Any]) -> dict[str, Any]:
    """Per-issue added/deleted/net over the table's range, with every row that made them."""
    paths = list(table.get("paths", ["src"]))
    names = {_resolve(repo, k): v for k, v in table.get("commits", {}).items()}
    splits = {_resolve(repo, k): v for k, v in table.get("split", {}).items()}
    rows: list[dict[str, Any]] = []
    missing: list[str] = []
    first_parent = _git(
        repo, "rev-list", "--first-parent", "--reverse", f"{table['from']}..{table['to']}"
    ).split()
    for sha in first_parent:
        stat = numstat(repo, f"{sha}^1", sha, paths)
        if not stat:
            continue
        subject = _git(repo, "log", "-1", "--format=%s", sha).strip()[:100]
        if sha in splits:
            rows.extend(_split_rows(repo, sha, subject, stat, splits[sha], paths))
        elif sha in names:
            added, deleted = _sum(stat)
            rows.append(_row(sha, names[sha], added, deleted, subject))
        else:
            missing.append(f"{sha[:9]} {subject}")
    totals: dict[str, dict[str, int]] = defaultdict(lambda: {"added": 0, "deleted": 0, "net": 0})
    for row in rows:
        t = totals[row["issue"]]
        t["added"] += row["added"]
        t["deleted"] += row["deleted"]
        t["net"] += row["net"]
    range_added, range_deleted = _sum(numstat(repo, table["from"], table["to"], paths))
    return {
        "range": f"{table['from']}..{table['to']}",
        "paths": paths,
        "range_net": range_added - range_deleted,
        "attributed_net": sum(t["net"] for t in totals.values()),
        "issues": dict(sorted(totals.items())),
        "unattributed": missing,
        "rows": rows,
    }


def _row(sha: str, issue: str, added: int, deleted: int, subject: str) -> dict[str, Any]:
    return {
        "commit": sha[:9],
        "issue": str(issue),
        "added": added,
        "deleted": deleted,
        "net": added - deleted,
        "subject": subject,
    }


def _split_rows(
    repo: Path,
    sha: str,
    subject: str,
    stat: dict[str, tuple[int, int]],
    rule: dict[str, Any],
    paths: list[str],
) -> list[dict[str, Any]]:
    """One row per issue of a mixed commit; what no rule names goes to ``rule['default']``."""
    rows = []
    rest_added, rest_deleted = _sum(stat)
    for prefix, issue in rule.get("paths", {}).items():
        part = {p: s for p, s in stat.items() if p.startswith(prefix)}
        added, deleted = _sum(part)
        rows.append(_row(sha, issue, added, deleted, f"{subject} [{prefix}]"))
        rest_added, rest_deleted = rest_added - added, rest_deleted - deleted
    for branch_sha, issue in rule.get("branch_commits", {}).items():
        full = _resolve(repo, branch_sha)
        added, deleted = _sum(numstat(repo, f"{full}^1", full, paths))
        rows.append(_row(sha, issue, added, deleted, f"{subject} [branch commit {full[:9]}]"))
        rest_added, rest_deleted = rest_added - added, rest_deleted - deleted
    rows.append(_row(sha, rule["default"], rest_added, rest_deleted, f"{subject} [the rest]"))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("table", type=Path, help="the attribution table (JSON)")
    parser.add_argument("--repo", type=Path, default=Path(__file__).parents[1])
    parser.add_argument("--list", action="store_true", help="print every row, not only totals")
    args = parser.parse_args()
    out = attribute(args.repo, json.loads(args.table.read_text()))
    if not args.list:
        out.pop("rows")
    print(json.dumps(out, indent=2))
    if out["unattributed"]:
        print(f"{len(out['unattributed'])} commits touch the paths and are in no row", file=sys.stderr)
        return 1
    if out["attributed_net"] != out["range_net"]:
        print("the rows' nets do not sum to the range's change", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
