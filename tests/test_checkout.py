"""`make apply/revert/pr-branch` on a real SGLang tree built from the sdist."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from devtools import checkout, series

ROOT = Path(__file__).resolve().parents[1]
LAYOUT = series.Layout(ROOT)


def sh(cwd: Path, *args: str) -> str:
    return series.git(cwd, *args, env=series.IDENTITY).stdout


@pytest.fixture(scope="module")
def template(tmp_path_factory, upstream_tree) -> Path:
    """A git repository like a clone of sgl-project/sglang at v0.5.10."""
    repo = tmp_path_factory.mktemp("template") / "sglang"
    shutil.copytree(upstream_tree / "python", repo / "python")
    (repo / "README.md").write_text("SGLang\n")
    sh(repo, "init", "-q", "--initial-branch=main")
    sh(repo, "add", "-A", "-f")
    sh(repo, "commit", "-qm", "v0.5.10")
    sh(repo, "tag", "v0.5.10")
    return repo


@pytest.fixture
def tree(template, tmp_path) -> Path:
    clone = tmp_path / "sglang"
    subprocess.run(["git", "clone", "-q", str(template), str(clone)], check=True)
    return clone


def make(target: str, tree: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["make", "-s", target, f"SGLANG_DIR={tree}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )


def touched() -> list[str]:
    return series.series_files(LAYOUT.patches())


def assert_matches_overlay(tree: Path) -> None:
    for rel in touched():
        assert (tree / rel).read_bytes() == (LAYOUT.overlay_dir / rel).read_bytes(), rel


def status(tree: Path) -> str:
    return sh(tree, "status", "--porcelain")


def test_apply_then_again_is_noop_then_revert(tree):
    proc = make("apply", tree)
    assert proc.returncode == 0, proc.stderr
    assert f"applied {len(LAYOUT.patches())} patches" in proc.stdout
    assert_matches_overlay(tree)
    changed = sorted(line[3:] for line in status(tree).splitlines())
    assert changed == touched()

    again = make("apply", tree)
    assert again.returncode == 0, again.stderr
    assert "already applied" in again.stdout
    assert_matches_overlay(tree)

    back = make("revert", tree)
    assert back.returncode == 0, back.stderr
    assert "reverted" in back.stdout
    assert status(tree) == ""


def test_revert_when_not_applied_is_noop(tree):
    proc = make("revert", tree)
    assert proc.returncode == 0
    assert "not applied" in proc.stdout
    assert status(tree) == ""


def test_other_version_is_refused_naming_both(tree):
    (tree / "python" / "sglang" / "_version.py").write_text(
        "__version__ = version = '0.5.9'\n"
    )
    sh(tree, "commit", "-qam", "pretend 0.5.9")
    proc = make("apply", tree)
    assert proc.returncode != 0
    assert "SGLang 0.5.9 found, but the series is for 0.5.10" in proc.stderr
    assert status(tree) == ""


def test_version_of_a_bare_clone_comes_from_the_tag(tree):
    (tree / "python" / "sglang" / "_version.py").unlink()
    (tree / "python" / "PKG-INFO").unlink()
    sh(tree, "commit", "-qam", "as in a git clone: no generated version files")
    sh(tree, "tag", "-f", "v0.5.10")
    assert checkout.detect_version(tree) == "0.5.10"
    sh(tree, "tag", "-d", "v0.5.10")
    proc = make("apply", tree)
    assert proc.returncode != 0 and "cannot tell its SGLang version" in proc.stderr


def test_conflicting_hunk_changes_nothing(tree):
    # Break a file of the last patch: the earlier patches would apply, so a
    # half-applied tree would show; nothing may change.
    last = LAYOUT.patches()[-1]
    rel = next(
        f for f in series.touched_files(last) if (LAYOUT.upstream_dir / f).is_file()
    )
    target = tree / rel
    target.write_text("# rewritten locally: every hunk conflicts\n")
    sh(tree, "commit", "-qam", "local rewrite")
    existing = [rel for rel in touched() if (tree / rel).is_file()]
    before = {rel: (tree / rel).read_bytes() for rel in existing}
    proc = make("apply", tree)
    assert proc.returncode != 0
    assert "nothing was changed" in proc.stderr
    assert status(tree) == ""
    assert {rel: (tree / rel).read_bytes() for rel in existing} == before
    assert all((tree / rel).is_file() == (rel in existing) for rel in touched())
    assert sh(tree, "worktree", "list").count("\n") == 1, "scratch worktree left behind"


def test_unrelated_local_edits_survive(tree):
    (tree / "README.md").write_text("SGLang with local notes\n")
    target = tree / series.touched_files(LAYOUT.patches()[0])[0]
    target.write_text(target.read_text() + "# local edit at the end\n")
    proc = make("apply", tree)
    assert proc.returncode == 0, proc.stderr
    assert (tree / "README.md").read_text() == "SGLang with local notes\n"
    assert target.read_text().endswith("# local edit at the end\n")


def test_three_way_apply_merges_a_committed_change_next_to_a_hunk(tree):
    rel = series.touched_files(LAYOUT.patches()[0])[0]
    patch_text = LAYOUT.patches()[0].read_text().split("\ndiff --git ")[1]
    hunk = patch_text.split("\n@@ ", 1)[1].split("\n", 1)[1]
    ctx = next(l[1:] for l in hunk.splitlines() if l.startswith(" ") and l.strip())
    target = tree / rel
    target.write_text(target.read_text().replace(ctx, ctx + "  # local", 1))
    sh(tree, "commit", "-qam", "local change in a context line")
    proc = make("apply", tree)
    assert proc.returncode == 0, proc.stderr
    assert "3-way" in proc.stdout
    text = target.read_text()
    assert ctx + "  # local" in text
    added = [
        l[1:]
        for l in patch_text.splitlines()
        if l.startswith("+") and not l.startswith("+++")
    ]
    assert all(line in text for line in added)


def test_apply_to_a_plain_unpacked_tree(tmp_path, upstream_tree):
    tree = tmp_path / "plain"
    shutil.copytree(upstream_tree / "python", tree / "python")
    proc = make("apply", tree)
    assert proc.returncode == 0, proc.stderr
    assert_matches_overlay(tree)
    assert "already applied" in make("apply", tree).stdout


def test_pr_branch_has_one_commit_per_patch_and_leaves_checkout_alone(tree):
    head = sh(tree, "rev-parse", "HEAD").strip()
    proc = make("pr-branch", tree)
    assert proc.returncode == 0, proc.stderr
    pin = LAYOUT.pin()
    branch = f"rlsync/{pin.version}-series{pin.series}"
    subjects = sh(tree, "log", "--format=%s", f"{head}..{branch}").splitlines()
    expected = [
        p.read_text()
        .split("Subject: [PATCH] ", 1)[1]
        .split("\n\n", 1)[0]
        .replace("\n ", " ")
        for p in LAYOUT.patches()
    ]
    assert subjects == list(reversed(expected))
    assert sh(tree, "rev-parse", "HEAD").strip() == head
    assert status(tree) == ""
    for rel in touched():
        blob = sh(tree, "show", f"{branch}:{rel}").encode()
        assert blob == (LAYOUT.overlay_dir / rel).read_bytes(), rel
    again = make("pr-branch", tree)
    assert again.returncode != 0 and "already exists" in again.stderr


def test_apply_needs_sglang_dir():
    proc = subprocess.run(
        ["make", "-s", "apply"], cwd=ROOT, capture_output=True, text=True
    )
    assert proc.returncode != 0 and "set SGLANG_DIR" in proc.stderr


def test_not_an_sglang_tree_is_refused(tmp_path):
    proc = make("apply", tmp_path)
    assert proc.returncode != 0 and "no python/sglang/" in proc.stderr
