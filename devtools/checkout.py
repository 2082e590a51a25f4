"""Apply the series to, or remove it from, a user's SGLang checkout.

All-or-nothing: every hunk is checked before a file is written. In a git
checkout a 3-way apply keeps unrelated local edits; the 3-way merge is first
tried in a scratch worktree so a conflict never leaves markers behind.
"""

from __future__ import annotations

import ast
import re
import shutil
import tempfile
from pathlib import Path

from devtools.pin import Pin
from devtools.series import IDENTITY, SeriesError, apply_patches, git, series_files


class CheckoutError(SeriesError):
    pass


def _version_from_file(path: Path) -> str | None:
    """`__version__ = "x"` in a version file, read without importing it."""
    if not path.is_file():
        return None
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            # `__version__ = version = "0.5.10"` is one Assign with two targets.
            if "__version__" in names and isinstance(node.value.value, str):
                return node.value.value
    return None


def detect_version(tree: Path) -> str | None:
    """SGLang's version of a checkout or unpacked sdist.

    0.5.10's `python/sglang/version.py` only imports `_version.py`, which
    setuptools-scm writes (present in sdists and built trees); a bare git
    clone has neither, so fall back to the release tag at HEAD.
    """
    pkg = tree / "python" / "sglang"
    for name in ("version.py", "_version.py"):
        found = _version_from_file(pkg / name)
        if found:
            return found
    pkg_info = tree / "python" / "PKG-INFO"
    if pkg_info.is_file():
        m = re.search(r"^Version: (\S+)$", pkg_info.read_text(), re.M)
        if m:
            return m.group(1)
    if is_git_toplevel(tree):
        proc = git(tree, "describe", "--tags", "--exact-match", "HEAD", check=False)
        if proc.returncode == 0:
            return proc.stdout.strip().removeprefix("v")
    return None


def is_git_toplevel(tree: Path) -> bool:
    if not (tree / ".git").exists():
        return False
    proc = git(tree, "rev-parse", "--show-toplevel", check=False)
    return (
        proc.returncode == 0 and Path(proc.stdout.strip()).resolve() == tree.resolve()
    )


def check_tree(tree: Path, pin: Pin) -> Path:
    tree = tree.resolve()
    if not (tree / "python" / "sglang").is_dir():
        raise CheckoutError(
            f"{tree}: no python/sglang/ here; pass the root of an SGLang checkout"
        )
    found = detect_version(tree)
    if found is None:
        raise CheckoutError(
            f"{tree}: cannot tell its SGLang version (no python/sglang/_version.py, "
            f"no PKG-INFO, no release tag at HEAD); the series needs {pin.version}"
        )
    if found.split("+")[0] != pin.version:
        raise CheckoutError(
            f"{tree}: SGLang {found} found, but the series is for {pin.version}; "
            f"check out v{pin.version} first"
        )
    return tree


def _apply(tree: Path, patches: list[Path], *flags: str) -> tuple[bool, str]:
    """`apply_patches` (one patch after another), as (ok, why)."""
    try:
        apply_patches(tree, patches, *flags)
    except SeriesError as e:
        return False, str(e)
    return True, ""


def _dry_run(tree: Path, patches: list[Path], *flags: str) -> tuple[bool, str]:
    """The same apply on a scratch copy of the files the series touches."""
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp) / "tree"
        scratch.mkdir()
        for rel in series_files(patches):
            if (tree / rel).is_file():
                (scratch / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(tree / rel, scratch / rel)
        return _apply(scratch, patches, *flags)


def is_applied(tree: Path, patches: list[Path]) -> bool:
    ok, _ = _dry_run(tree, list(reversed(patches)), "--reverse")
    return ok


def _three_way_dry_run(tree: Path, patches: list[Path]) -> tuple[bool, str]:
    """Try a 3-way apply on a scratch worktree holding the current files."""
    snapshot = git(tree, "stash", "create", env=IDENTITY).stdout.strip() or "HEAD"
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp) / "scratch"
        git(tree, "worktree", "add", "--detach", "--quiet", str(scratch), snapshot)
        try:
            ok, out = _apply(scratch, patches, "--3way")
            unmerged = git(scratch, "ls-files", "--unmerged").stdout.strip()
            return ok and not unmerged, out
        finally:
            git(tree, "worktree", "remove", "--force", str(scratch), check=False)
            git(tree, "worktree", "prune", check=False)


def apply_series(tree: Path, pin: Pin, patches: list[Path]) -> str:
    tree = check_tree(tree, pin)
    if not patches:
        return "the series is empty; nothing to apply"
    if is_applied(tree, patches):
        return f"the series ({len(patches)} patches) is already applied to {tree}"
    ok, why = _dry_run(tree, patches)
    if ok:
        ok, out = _apply(tree, patches)
        if not ok:
            raise CheckoutError(f"apply failed after a clean check:\n{out}")
        return f"applied {len(patches)} patches to {tree}"
    if is_git_toplevel(tree):
        ok3, why3 = _three_way_dry_run(tree, patches)
        if ok3:
            ok, out = _apply(tree, patches, "--3way")
            if ok:
                return f"applied {len(patches)} patches to {tree} (3-way merge)"
            why = out
        else:
            why = why3
    raise CheckoutError(
        f"the series does not apply to {tree}; nothing was changed:\n{why}"
    )


def revert_series(tree: Path, pin: Pin, patches: list[Path]) -> str:
    tree = check_tree(tree, pin)
    if not patches:
        return "the series is empty; nothing to revert"
    if not is_applied(tree, patches):
        ok, _ = _dry_run(tree, patches)
        if ok:
            return f"the series is not applied to {tree}; nothing to revert"
        raise CheckoutError(
            f"the series cannot be reverted cleanly from {tree} (files changed "
            f"since it was applied); nothing was changed"
        )
    ok, out = _apply(tree, list(reversed(patches)), "--reverse")
    if not ok:
        raise CheckoutError(f"revert failed:\n{out}")
    return f"reverted {len(patches)} patches from {tree}"


def pr_branch(
    tree: Path, pin: Pin, patches: list[Path], branch: str | None = None
) -> str:
    """A branch off HEAD with one commit per patch; the checkout is untouched."""
    tree = check_tree(tree, pin)
    if not is_git_toplevel(tree):
        raise CheckoutError(f"{tree}: not a git checkout; pr-branch needs one")
    branch = branch or f"rlsync/{pin.version}-series{pin.series}"
    exists = git(
        tree, "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}", check=False
    )
    if exists.returncode == 0:
        raise CheckoutError(
            f"branch {branch} already exists in {tree}; delete it first"
        )
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp) / "scratch"
        git(tree, "worktree", "add", "--quiet", "-b", branch, str(scratch), "HEAD")
        try:
            proc = git(
                scratch, "am", "--quiet", "--keep-cr", *map(str, patches),
                check=False, env=IDENTITY,
            )  # fmt: skip
            if proc.returncode != 0:
                git(scratch, "am", "--abort", check=False)
                git(tree, "worktree", "remove", "--force", str(scratch), check=False)
                git(tree, "branch", "-D", branch, check=False)
                raise CheckoutError(
                    f"the series does not apply on HEAD of {tree}:\n{proc.stdout}{proc.stderr}"
                )
        finally:
            git(tree, "worktree", "remove", "--force", str(scratch), check=False)
            git(tree, "worktree", "prune", check=False)
    return f"created branch {branch} in {tree} with {len(patches)} commits"
