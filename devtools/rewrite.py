"""One change to the code of a series, carried through every commit of every
worktree that holds it: the pins' and their ports'.

A change to a line an early patch adds (a common module, a hook) has to be
made in that patch, and then again in every later patch whose context
holds the line, on every pin and in every port. By hand that is dozens of
conflict resolutions. Here the change is a script: `python SCRIPT TREE`
edits the files under TREE, idempotently, keyed on their exact text (it
changes what it finds and leaves a tree that has none of it alone). Each
worktree's series is replayed commit by commit on `upstream`; after each
commit is picked the script runs on the tree and the commit keeps the
result (its message, author and date unchanged). Where a pick conflicts,
which happens where an earlier commit's rewrite stands in a later one's
context, the commit's own version of each conflicted file is taken and the
script rewrites it as well.

    make rewrite-series SCRIPT=<script>
        build/<pin>/work for every pin and build/<release>/work for every
        release a pin's series serves adjusted, made from the series as
        committed (before anything is exported), each replayed with the
        script; then every pin's patches and overlay are exported and then
        every port, so that `ported-from` names the new pin patches.

Messages are not touched: reword them in the pin's worktree, `make
patches`, then `make port-restamp`.

Standard library only, as the rest of devtools.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from devtools.series import IDENTITY, SeriesError, git


def _run_script(script: Path, tree: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(script), str(tree)], capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise SeriesError(
            f"{script} {tree} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}"
        )


def _conflicted(work: Path) -> list[str]:
    out = git(work, "diff", "--name-only", "--diff-filter=U").stdout
    return [line for line in out.splitlines() if line]


def _untracked(work: Path) -> set[str]:
    out = git(work, "ls-files", "--others", "--exclude-standard").stdout
    return {line for line in out.splitlines() if line}


def _own_diff(work: Path, commit: str) -> str:
    """What a commit changes, without the blob ids of its index lines."""
    diff = git(work, "diff", "--no-color", f"{commit}^", commit).stdout
    return "\n".join(l for l in diff.splitlines() if not l.startswith("index "))


def rewrite_worktree(work: Path, script: Path, base: str = "upstream") -> list[str]:
    """Replay the commits base..HEAD of the worktree's branch with `script`
    run after each; the subjects of the commits whose diff changed."""
    branch = git(work, "symbolic-ref", "--short", "HEAD").stdout.strip()
    if git(work, "status", "--porcelain", "--untracked-files=no").stdout.strip():
        raise SeriesError(f"{work}: uncommitted changes; commit them first")
    commits = git(work, "rev-list", "--reverse", f"{base}..HEAD").stdout.split()
    git(work, "checkout", "--quiet", "--detach", base)
    changed = []
    stray = _untracked(work)
    try:
        for commit in commits:
            picked = git(work, "cherry-pick", "--no-commit", commit, check=False)
            conflicted = _conflicted(work)
            if picked.returncode != 0 and not conflicted:
                raise SeriesError(
                    f"{work}: cannot pick {commit}:\n{picked.stdout}{picked.stderr}"
                )
            if conflicted:
                git(work, "checkout", commit, "--", *conflicted)
            _run_script(script, work)
            git(work, "add", "--update")
            # Files the script wrote where the commit has none.
            created = sorted(_untracked(work) - stray)
            if created:
                git(work, "add", "--", *created)
            if conflicted:
                git(work, "add", "--", *conflicted)
            env = dict(IDENTITY)
            env["GIT_COMMITTER_DATE"] = git(
                work, "log", "-1", "--format=%cI", commit
            ).stdout.strip()
            git(work, "commit", "--quiet", "--allow-empty", "-C", commit, env=env)
            if _own_diff(work, commit) != _own_diff(work, "HEAD"):
                subject = git(work, "log", "-1", "--format=%s", commit).stdout
                changed.append(subject.strip())
    except BaseException:
        git(work, "cherry-pick", "--abort", check=False)
        git(work, "reset", "--quiet", "--hard", check=False)
        for path in _untracked(work) - stray:
            (work / path).unlink()
        git(work, "checkout", "--quiet", branch, check=False)
        raise
    git(work, "branch", "--quiet", "--force", branch, "HEAD")
    git(work, "checkout", "--quiet", branch)
    return changed
