"""``bench/issue_diff.py`` on a small repository: each issue gets the lines its commits changed,
a merge splits by its branch commits, a mixed commit by path, and a commit no row names is an error
(the figure cannot come out complete when a commit is left out)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

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
    _commit(repo, {"docs/x.md": 1}, "docs only: no row needed")
    return shas


def test_each_issue_gets_its_commits_lines_and_splits_add_up(tmp_path: Path) -> None:
    shas = _history(tmp_path)
    table = {
        "from": shas["base"],
        "to": "HEAD",
        "commits": {shas["grow"]: "1"},
        "split": {
            shas["merge"]: {"default": "2", "branch_commits": {shas["feature"]: "3"}},
            shas["mixed"]: {"default": "1", "paths": {"src/d/": "2"}},
        },
    }
    out = load_bench("issue_diff").attribute(tmp_path, table)
    assert out["unattributed"] == []
    assert out["range_net"] == 7 - 6 + 5 + 2 + 3 == out["attributed_net"]
    assert out["issues"] == {
        "1": {"added": 7 + 2, "deleted": 0, "net": 9},
        "2": {"added": 3, "deleted": 6, "net": -3},
        "3": {"added": 5, "deleted": 0, "net": 5},
    }


def test_a_commit_no_row_names_fails_the_run(tmp_path: Path) -> None:
    shas = _history(tmp_path)
    table = {"from": shas["base"], "to": "HEAD", "commits": {shas["grow"]: "1", shas["merge"]: "2"}}
    (tmp_path / "table.json").write_text(json.dumps(table))
    script = ROOT / "bench" / "issue_diff.py"
    run = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "table.json"), "--repo", str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 1
    report = json.loads(run.stdout)
    assert report["unattributed"] == [f"{shas['mixed'][:9]} issues 1 and 2"]
    assert report["attributed_net"] != report["range_net"]
