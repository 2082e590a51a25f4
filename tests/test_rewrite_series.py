"""`make rewrite-series`: a scripted change carried through every commit of a
worktree's series, conflicts included, messages and order kept, and nothing
changed when the script fails."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from devtools.rewrite import rewrite_worktree
from devtools.series import SeriesError, git

RENAME = """import sys
from pathlib import Path

for path in Path(sys.argv[1]).glob("*.py"):
    path.write_text(path.read_text().replace("OLD", "NEW"))
"""


def commit(work: Path, message: str, **files: str) -> None:
    for name, text in files.items():
        (work / name).write_text(text)
    git(work, "add", "--all")
    git(work, "commit", "--quiet", "-m", message)


@pytest.fixture
def series(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    git(work, "init", "--quiet", "--initial-branch=rlsync")
    git(work, "config", "user.name", "t")
    git(work, "config", "user.email", "t@t")
    commit(work, "pristine", **{"a.py": "x = 1\n"})
    git(work, "tag", "upstream")
    commit(work, "adds y", **{"a.py": "x = 1\ny = OLD\n"})
    # Its context holds the line the first commit adds: no conflict.
    commit(work, "adds z", **{"a.py": "x = 1\ny = OLD\nz = y\n", "b.py": "OLD\n"})
    # It changes that line: a conflict once the line is rewritten.
    commit(work, "changes y", **{"a.py": "x = 1\ny = OLD + 1\nz = y\n"})
    return work


def tree_at(work: Path, rev: str, name: str) -> str:
    return git(work, "show", f"{rev}:{name}").stdout


def test_every_commit_gets_the_change_conflicts_included(series: Path, tmp_path):
    script = tmp_path / "rename.py"
    script.write_text(RENAME)
    subjects = git(series, "log", "--format=%s", "upstream..rlsync").stdout
    changed = rewrite_worktree(series, script)
    assert changed == ["adds y", "adds z", "changes y"]
    assert git(series, "log", "--format=%s", "upstream..rlsync").stdout == subjects
    assert git(series, "symbolic-ref", "--short", "HEAD").stdout.strip() == "rlsync"
    assert tree_at(series, "rlsync~2", "a.py") == "x = 1\ny = NEW\n"
    assert tree_at(series, "rlsync~1", "b.py") == "NEW\n"
    assert tree_at(series, "rlsync", "a.py") == "x = 1\ny = NEW + 1\nz = y\n"
    assert tree_at(series, "upstream", "a.py") == "x = 1\n"
    # Idempotent: a second run changes no commit.
    assert rewrite_worktree(series, script) == []


CREATE = """import sys
from pathlib import Path

tree = Path(sys.argv[1])
if "y = " in (tree / "a.py").read_text():
    (tree / "c.py").write_text("from a import y\\n")
"""


def test_a_file_the_script_writes_is_committed_from_where_it_first_appears(
    series: Path, tmp_path
):
    script = tmp_path / "create.py"
    script.write_text(CREATE)
    (series / "stray.txt").write_text("not the script's\n")
    assert rewrite_worktree(series, script) == ["adds y"]
    assert "c.py" not in git(series, "ls-tree", "--name-only", "upstream").stdout
    for rev in ("rlsync~2", "rlsync~1", "rlsync"):
        assert tree_at(series, rev, "c.py") == "from a import y\n"
    assert "stray.txt" not in git(series, "ls-tree", "--name-only", "rlsync").stdout


def test_a_failing_script_leaves_the_series_as_it_was(series: Path, tmp_path):
    script = tmp_path / "fails.py"
    script.write_text(
        "import sys, pathlib\n"
        "pathlib.Path(sys.argv[1], 'half.py').write_text('')\n"
        "raise SystemExit('no')\n"
    )
    head = git(series, "rev-parse", "rlsync").stdout
    with pytest.raises(SeriesError, match="no"):
        rewrite_worktree(series, script)
    assert git(series, "rev-parse", "rlsync").stdout == head
    assert git(series, "symbolic-ref", "--short", "HEAD").stdout.strip() == "rlsync"
    status = subprocess.run(
        ["git", "status", "--porcelain"], cwd=series, capture_output=True, text=True
    )
    assert status.stdout == ""
