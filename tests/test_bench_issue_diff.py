"""``bench/issue_diff.py`` on a small repository: each issue gets the lines its commits changed,
a merge splits by its branch commits, a mixed commit by path, and a commit no row names is an error
(the figure cannot come out complete when a commit is left out)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench_util import ROOT, load_bench


def _git(repo: Path, *args: str) -> str:
    env = os.environ | {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t"}
    env |= {"GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    return subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True, env=env
    ).stdout.strip()


def _commit(repo: Path, files: dict[str, int], message: str) -> str:
    """Write each file with that many lines, commit, return the sha."""
    for name, lines in files.items():
        path = repo / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(f"{name} line {i}\n" for i in range(lines)))
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", message)
    return _git(repo, "rev-parse", "HEAD")


def _history(repo: Path) -> dict[str, str]:
    """Short shas (as tables write them) of a history with a merged branch, a mixed commit, a commit
    that changes one line (net 0) and a docs-only commit."""
    _git(repo, "init", "-q", "-b", "main")
    shas = {"base": _commit(repo, {"src/a.py": 10, "docs/x.md": 3}, "base")}
    shas["grow"] = _commit(repo, {"src/b.py": 7, "docs/x.md": 9}, "issue 1 grows b")
    _git(repo, "checkout", "-q", "-b", "branch")
    shas["shrink"] = _commit(repo, {"src/a.py": 4}, "issue 2 shrinks a")
    shas["feature"] = _commit(repo, {"src/c.py": 5}, "issue 3 adds c")
    _git(repo, "checkout", "-q", "main")
    _git(repo, "merge", "-q", "--no-ff", "-m", "merge branch", "branch")
    shas["merge"] = _git(repo, "rev-parse", "HEAD")
    shas["mixed"] = _commit(repo, {"src/b.py": 9, "src/d/e.py": 3}, "issues 1 and 2")
    (repo / "src/a.py").write_text((repo / "src/a.py").read_text().replace("line 0", "line zero"))
    shas["reword"] = _commit(repo, {}, "issue 2 rewords a line")
    _commit(repo, {"docs/x.md": 1}, "docs only: no row needed")
    return {k: v[:7] for k, v in shas.items()}


def _table(shas: dict[str, str], **change: object) -> dict[str, object]:
    table: dict[str, object] = {
        "from": shas["base"],
        "to": "HEAD",
        "commits": {shas["grow"]: "1", shas["reword"]: "2"},
        "split": {
            shas["merge"]: {"default": "2", "branch_commits": {shas["feature"]: "3"}},
            shas["mixed"]: {"default": "1", "paths": {"src/d/": "2"}},
        },
    }
    return table | change


def _run(repo: Path, table: dict[str, object]) -> subprocess.CompletedProcess[str]:
    (repo / "table.json").write_text(json.dumps(table))
    script = ROOT / "bench" / "issue_diff.py"
    return subprocess.run(
        [sys.executable, str(script), str(repo / "table.json"), "--repo", str(repo)],
        capture_output=True,
        text=True,
        check=False,
    )


def test_each_issue_gets_its_commits_lines_and_splits_add_up(tmp_path: Path) -> None:
    shas = _history(tmp_path)
    out = load_bench("issue_diff").attribute(tmp_path, _table(shas))
    assert out["unattributed"] == []
    assert out["range_net"] == 7 - 6 + 5 + 2 + 3 + 0 == out["attributed_net"]
    assert out["issues"] == {
        "1": {"added": 7 + 2, "deleted": 0, "net": 9},
        "2": {"added": 3 + 1, "deleted": 6 + 1, "net": -3},
        "3": {"added": 5, "deleted": 0, "net": 5},
    }
    run = _run(tmp_path, _table(shas))
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["issues"] == out["issues"]


def test_a_commit_no_row_names_fails_the_run_even_at_net_zero(tmp_path: Path) -> None:
    shas = _history(tmp_path)
    run = _run(tmp_path, _table(shas, commits={shas["grow"]: "1"}))
    assert run.returncode == 1
    report = json.loads(run.stdout)
    (missing,) = report["unattributed"]
    assert missing.startswith(shas["reword"]) and missing.endswith(" issue 2 rewords a line")
    assert report["attributed_net"] == report["range_net"]  # the net alone would not have shown it
    assert "1 commits touch the paths and are in no row" in run.stderr


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ("branch commit not on the branch", "is not a plain commit of the branch"),
        ("a file two path rules match", "matches more than one path rule"),
        ("a row for a commit outside the range", "rows for no commit of the range"),
        ("a commit in both commits and split", "in both 'commits' and 'split'"),
        ("parts larger than the commit", "the split's parts exceed the commit"),
    ],
)
def test_a_table_that_cannot_give_true_figures_is_refused(tmp_path: Path, change: str, reason: str) -> None:
    shas = _history(tmp_path)
    mixed, merge = shas["mixed"], shas["merge"]
    split = {
        "branch commit not on the branch": {merge: {"default": "2", "branch_commits": {shas["grow"]: "3"}}},
        "a file two path rules match": {mixed: {"default": "1", "paths": {"src/d/": "2", "src/d/e.py": "3"}}},
        "parts larger than the commit": {
            merge: {"default": "2", "paths": {"src/a.py": "1"}, "branch_commits": {shas["shrink"]: "3"}}
        },
    }.get(change)
    table = _table(shas)
    if split is not None:
        table = _table(shas, split=table["split"] | split)  # type: ignore[operator]
    if change == "a row for a commit outside the range":
        table = _table(shas, commits={shas["grow"]: "1", shas["reword"]: "2", shas["base"]: "4"})
    if change == "a commit in both commits and split":
        table = _table(shas, commits={shas["grow"]: "1", shas["reword"]: "2", mixed: "1"})
    run = _run(tmp_path, table)
    assert run.returncode == 1
    assert reason in run.stderr, run.stderr
