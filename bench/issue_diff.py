"""Which issue changed how many lines of src/: main's first-parent history attributed, as JSON.

Several issues are worked at once, so the src/ change over a range mixes them. Main's first-parent
history separates them: each first-parent commit is one session's commit or one merged branch.
A table names the issue of each first-parent commit that touches the paths; a commit that mixes two
issues is split, by file path or, for a merge, by the branch commits that belong to another issue::

    {"from": "94da1fa", "to": "2392414", "paths": ["src"],
     "commits": {"<sha>": "36", ...},
     "split": {"<merge sha>": {"default": "36", "branch_commits": {"<sha>": "37"}},
               "<sha>": {"default": "38", "paths": {"src/asyncrl/jobs/": "36"}}}}

Each row is the commit's numstat against its first parent (renames off: a moved file is its lines
deleted and added, whatever git's configuration); a branch commit's against its own parent, and a
split's remainder is the commit's numstat less its parts. A path ending in ``/`` names a folder,
any other one file.

The run fails (exit 1, the reason on stderr) when the figures could be wrong: a commit touching the
paths that no row names; a table row that names no such commit of the range, or a commit twice; a
file two path rules match; a branch commit that is not a plain (non-merge) commit of that merge's
branch; a split whose parts exceed the commit. The rows' nets then sum to the range's change (the
first-parent diffs add up); that is checked too, which catches a ``from`` off ``to``'s first-parent
line.

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


class TableError(ValueError):
    """The table cannot give trustworthy figures (the message says why)."""


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


def numstat(repo: Path, old: str, new: str, paths: list[str]) -> dict[str, tuple[int, int]]:
    """Lines added and deleted per file between two commits (renames off; binary files count 0)."""
    out: dict[str, tuple[int, int]] = {}
    for record in _git(repo, "diff", "--no-renames", "--numstat", "-z", old, new, "--", *paths).split("\0"):
        if record:
            added, deleted, path = record.split("\t", 2)
            out[path] = (int(added) if added != "-" else 0, int(deleted) if deleted != "-" else 0)
    return out


def _matches(path: str, rule: str) -> bool:
    return path.startswith(rule) if rule.endswith("/") else path == rule


def _sum(stat: dict[str, tuple[int, int]]) -> tuple[int, int]:
    return sum(a for a, _ in stat.values()), sum(d for _, d in stat.values())


def _resolve(repo: Path, sha: str) -> str:
    return _git(repo, "rev-parse", "--verify", f"{sha}^{{commit}}").strip()


def attribute(repo: Path, table: dict[str, Any]) -> dict[str, Any]:
    """Per-issue added/deleted/net over the table's range, with every row that made them."""
    paths = list(table.get("paths", ["src"]))
    names = {_resolve(repo, k): v for k, v in table.get("commits", {}).items()}
    splits = {_resolve(repo, k): v for k, v in table.get("split", {}).items()}
    if twice := names.keys() & splits.keys():
        raise TableError(f"in both 'commits' and 'split': {sorted(s[:9] for s in twice)}")
    rows: list[dict[str, Any]] = []
    missing: list[str] = []
    used: set[str] = set()
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
        used.add(sha)
    if unused := (names.keys() | splits.keys()) - used:
        raise TableError(f"rows for no commit of the range touching {paths}: {sorted(s[:9] for s in unused)}")
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
    rules = rule.get("paths", {})
    for path in stat:
        if sum(_matches(path, r) for r in rules) > 1:
            raise TableError(f"{sha[:9]}: {path} matches more than one path rule")
    rest_added, rest_deleted = _sum(stat)
    for prefix, issue in rules.items():
        added, deleted = _sum({p: s for p, s in stat.items() if _matches(p, prefix)})
        rows.append(_row(sha, issue, added, deleted, f"{subject} [{prefix}]"))
        rest_added, rest_deleted = rest_added - added, rest_deleted - deleted
    branch = (
        set(_git(repo, "rev-list", "--no-merges", f"{sha}^1..{sha}^2").split())
        if "branch_commits" in rule
        else set()
    )
    for branch_sha, issue in rule.get("branch_commits", {}).items():
        full = _resolve(repo, branch_sha)
        if full not in branch:
            raise TableError(
                f"{sha[:9]}: {branch_sha} is not a plain commit of the branch this merge brought in"
            )
        added, deleted = _sum(numstat(repo, f"{full}^1", full, paths))
        rows.append(_row(sha, issue, added, deleted, f"{subject} [branch commit {full[:9]}]"))
        rest_added, rest_deleted = rest_added - added, rest_deleted - deleted
    if rest_added < 0 or rest_deleted < 0:
        raise TableError(
            f"{sha[:9]}: the split's parts exceed the commit ({rest_added} added, {rest_deleted} deleted left)"
        )
    rows.append(_row(sha, rule["default"], rest_added, rest_deleted, f"{subject} [the rest]"))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("table", type=Path, help="the attribution table (JSON)")
    parser.add_argument("--repo", type=Path, default=Path(__file__).parents[1])
    parser.add_argument("--list", action="store_true", help="print every row, not only totals")
    args = parser.parse_args()
    try:
        out = attribute(args.repo, json.loads(args.table.read_text()))
    except TableError as exc:
        print(f"the table cannot be used: {exc}", file=sys.stderr)
        return 1
    except subprocess.CalledProcessError as exc:
        print(f"git {' '.join(exc.cmd[3:])}: {exc.stderr.strip()}", file=sys.stderr)
        return 1
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
