"""`make pr-branch` as an upstream maintainer receives it: the series cut
into commits none of which rewrites another's lines (`pr/series`); each
commit carries its unit tests in upstream's layout (`pr/<commit>/`), and
they pass on CPU, run by pytest from the branch's own tree (upstream's
`sglang.test` helpers included), at the branch's head and at each commit
that adds them. `make test` checks the branch; `make test-pr-branch` (run by
CI after it; RLSYNC_PR_UNIT_TESTS=1) runs the unit tests too: a process per
commit, each importing upstream's test helpers (about 12 s), so about a
minute and a half a pin."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ACTIVE_PIN

from devtools import pr_files, pr_series, rewrites, series
from devtools.line_origins import file_diffs

ROOT = Path(__file__).resolve().parents[1]
LAYOUT = series.Layout(ROOT, ACTIVE_PIN)
COMMITS = [Path(f"{c.name}.patch") for c in pr_series.cut(LAYOUT)]
JANE = "Jane Doe <jane@example.org>"

RUN_UNIT_TESTS = os.environ.get("RLSYNC_PR_UNIT_TESTS") == "1"

pytestmark = pytest.mark.per_pin


def sh(cwd: Path, *args: str) -> str:
    return series.git(cwd, *args, env=series.IDENTITY).stdout


@pytest.fixture(scope="module")
def branch(upstream_tree, tmp_path_factory) -> tuple[Path, str]:
    """A git checkout of the pristine release, with the pr-branch made."""
    repo = tmp_path_factory.mktemp("pr") / "sglang"
    shutil.copytree(upstream_tree / "python", repo / "python", symlinks=True)
    sh(repo, "init", "-q", "--initial-branch=main")
    sh(repo, "add", "-A", "-f")
    sh(repo, "commit", "-qm", f"v{ACTIVE_PIN}")
    proc = subprocess.run(
        [sys.executable, "-m", "devtools", "--pin", ACTIVE_PIN, "pr-branch"]
        + [str(repo), "--author", JANE, "--branch", "pr"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    return repo, "pr"


def commits_of(repo: Path, name: str) -> dict[str, str]:
    """{commit's patch file name: its commit on the branch}, in order."""
    log = sh(repo, "log", "--reverse", "--format=%H", f"main..{name}").split()
    assert len(log) == len(COMMITS), log
    return dict(zip((p.name for p in COMMITS), log))


def test_no_commit_rewrites_lines_another_commit_added(branch):
    """Followed through the branch's own diffs, no commit changes or
    removes a line an earlier commit added (the series' patches do:
    `make rewrites`)."""
    repo, name = branch
    diffs = [
        (patch, sh(repo, "show", "--format=", commit))
        for patch, commit in commits_of(repo, name).items()
    ]
    paths = {path for _, text in diffs for path, _ in file_diffs(text)}
    pristine = {
        path: sh(repo, "show", f"main:{path}") if path_in(repo, path) else None
        for path in paths
    }
    assert rewrites.rewrites_of(diffs, pristine) == {}
    assert rewrites.rewrites(LAYOUT), "the series itself rewrites: a test of the test"


def path_in(repo: Path, path: str) -> bool:
    proc = series.git(repo, "cat-file", "-e", f"main:{path}", check=False)
    return proc.returncode == 0


def test_each_pull_request_is_a_branch_stacked_on_the_one_before(branch):
    """pr/series' `pr` lines: a branch `<branch>-<pr>` at the last commit of
    each, holding exactly the commits before it in the plan's order."""
    repo, name = branch
    plan = pr_series.read_plan(ROOT)
    stack = pr_series.stacked_pulls(plan, pr_series.cut(LAYOUT))
    assert len(stack) >= 3 and all(pull for pull, _ in stack)
    commits = list(commits_of(repo, name).values())
    base, end = "main", 0
    for pull, count in stack:
        end += count
        tip = sh(repo, "rev-parse", f"{name}-{pull}").strip()
        assert tip == commits[end - 1], pull
        assert len(sh(repo, "rev-list", f"{base}..{name}-{pull}").split()) == count
        base = f"{name}-{pull}"
    assert end == len(commits)
    pulls = {pull: names for pull, names in plan.pulls}
    assert "secret-redaction" in pulls[stack[0][0]]
    assert "two-phase-weight-update" not in pulls[stack[0][0]]


def test_no_commit_of_the_branch_imports_what_a_later_one_adds():
    assert pr_series.stage_problems(LAYOUT, pr_series.cut(LAYOUT)) == []


def added_line_ranges(repo: Path, commit: str, path: str) -> list[str]:
    """black's --line-ranges of the lines `commit` adds to `path`."""
    diff = sh(repo, "diff", "-U0", f"{commit}^", commit, "--", path)
    ranges = []
    for start, count in re.findall(r"^@@ -\S+ \+(\d+)(?:,(\d+))? @@", diff, re.M):
        if count != "0":
            end = int(start) + int(count or 1) - 1
            ranges.append(f"--line-ranges={start}-{end}")
    return ranges


def test_each_commit_formats_the_lines_it_adds_as_black_does(branch, tmp_path):
    """A reviewer's checkout of any commit passes black 24.10.0 on the lines
    that commit adds: a line whose final form another commit's wrapping
    shaped (a nested call cut away) would not."""
    repo, name = branch
    bad = []
    for patch, commit in commits_of(repo, name).items():
        changed = sh(repo, "diff", "--name-only", f"{commit}^", commit).split()
        for path in (p for p in changed if p.endswith(".py")):
            ranges = added_line_ranges(repo, commit, path)
            if not ranges:
                continue
            copy = tmp_path / "check.py"
            copy.write_text(sh(repo, "show", f"{commit}:{path}"))
            proc = subprocess.run(
                [sys.executable, "-m", "black", "--check", "-q", *ranges, str(copy)],
                env={**os.environ, "BLACK_CACHE_DIR": str(tmp_path / "cache")},
                capture_output=True,
                text=True,
            )
            if proc.returncode != 0:
                bad.append(f"{patch}: {path}")
    assert not bad, f"lines not formatted as black 24.10.0 formats them: {bad}"


def run_unit_tests(tree: Path, files: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(tree / "python")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *files],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
    )


def test_each_feature_commit_adds_its_unit_tests_and_docs(branch):
    repo, name = branch
    extras = pr_files.pr_files_of(ROOT, COMMITS)
    assert extras, "no patch of the series has upstream-style tests under pr/"
    for patch, commit in commits_of(repo, name).items():
        added = sh(repo, "show", "--name-only", "--diff-filter=A", "--format=", commit)
        for rel, data in extras.get(patch, {}).items():
            assert rel in added.split(), (patch, rel)
            assert sh(repo, "show", f"{commit}:{rel}").encode() == data


@pytest.mark.skipif(not RUN_UNIT_TESTS, reason="make test-pr-branch runs it")
def test_the_unit_tests_pass_at_the_head(branch, tmp_path):
    repo, name = branch
    extras = pr_files.pr_files_of(ROOT, COMMITS)
    every = [
        rel for files in extras.values() for rel in pr_files.unit_test_modules(files)
    ]
    assert every
    head = tmp_path / "head"
    sh(repo, "worktree", "add", "-q", "--detach", str(head), name)
    proc = run_unit_tests(head, every)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"\b\d+ passed\b", proc.stdout), proc.stdout


@pytest.mark.skipif(not RUN_UNIT_TESTS, reason="make test-pr-branch runs it")
def test_the_unit_tests_pass_at_the_commit_that_adds_them(branch, tmp_path):
    """What a reviewer checks out is that commit: its tests may not lean on
    a later patch."""
    repo, name = branch
    extras = pr_files.pr_files_of(ROOT, COMMITS)
    ran = 0
    for patch, commit in commits_of(repo, name).items():
        files = pr_files.unit_test_modules(extras.get(patch, {}))
        if not files:
            continue
        tree = tmp_path / patch
        sh(repo, "worktree", "add", "-q", "--detach", str(tree), commit)
        proc = run_unit_tests(tree, files)
        assert proc.returncode == 0, f"{patch}:\n{proc.stdout}{proc.stderr}"
        ran += 1
    assert ran
