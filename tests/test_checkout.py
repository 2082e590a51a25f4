"""`make apply/revert/pr-branch` on a real SGLang tree built from the sdist."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from devtools import checkout, pr_series, releases, series

ROOT = Path(__file__).resolve().parents[1]
LAYOUT = series.Layout(ROOT)


def sh(cwd: Path, *args: str) -> str:
    return series.git(cwd, *args, env=series.IDENTITY).stdout


@pytest.fixture(scope="module")
def upstream_tree(upstream_tree, tmp_path_factory) -> Path:
    """The pristine release cut down to what applying the series reads: its
    metadata (the egg-info too), the package's top modules, every file a
    patch touches, the folder the series adds its modules to, and one folder
    no patch touches (so "nothing else changed" is still checked).
    Copying all 2,000+ files for each tree made these tests slow."""
    slim = tmp_path_factory.mktemp("slim-upstream")
    src, dst = upstream_tree / "python", slim / "python"
    keep = [p.name for p in src.iterdir() if p.is_file()]
    keep += ["sglang/__init__.py", "sglang/version.py", "sglang/_version.py"]
    keep += series.series_files(LAYOUT.patches())
    keep = [rel.removeprefix("python/") for rel in keep]
    for folder in ("sglang/lang", "sglang/srt/weight_sync", "sglang.egg-info"):
        keep += [p.relative_to(src).as_posix() for p in (src / folder).rglob("*")]
    for rel in sorted(set(keep)):
        if (src / rel).is_file():
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src / rel, dst / rel)
    return slim


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


def make(
    target: str, tree: Path, env: dict | None = None, **variables: str
) -> subprocess.CompletedProcess:
    extra = [f"{name}={value}" for name, value in variables.items()]
    return subprocess.run(
        ["make", "-s", target, f"SGLANG_DIR={tree}", *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
    )


def touched() -> list[str]:
    return series.series_files(LAYOUT.patches())


def generated() -> dict[str, str]:
    """The series' generated modules (written by apply, removed by revert)."""
    return checkout._generated_files(LAYOUT)


def written() -> list[str]:
    """What an apply writes: the series' files, its generated modules, and
    the record of what it applied."""
    return sorted({*touched(), *generated(), checkout.APPLIED_RECORD})


def assert_matches_overlay(tree: Path) -> None:
    for rel in touched():
        assert (tree / rel).read_bytes() == series.built_file(
            LAYOUT, rel
        ).read_bytes(), rel


def status(tree: Path) -> str:
    return sh(tree, "status", "--porcelain")


def test_apply_then_again_is_noop_then_revert(tree):
    proc = make("apply", tree)
    assert proc.returncode == 0, proc.stderr
    assert f"applied {len(LAYOUT.patches())} patches" in proc.stdout
    assert_matches_overlay(tree)
    changed = sorted(line[3:] for line in status(tree).splitlines())
    assert changed == written()
    for rel, text in generated().items():
        assert (tree / rel).read_text() == text

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
    # Break an upstream file of the last patch that has one: the earlier
    # patches would apply, so a half-applied tree would show; nothing may change.
    rel = next(
        f
        for patch in reversed(LAYOUT.patches())
        for f in series.touched_files(patch)
        if (LAYOUT.upstream_dir / f).is_file()
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


def test_pr_branch_has_the_cut_s_commits_and_leaves_checkout_alone(tree):
    """The branch's commits are the pull-request series (`pr/series`), not
    one per patch: their subjects in order, every file as the series builds
    it except those of the dropped fork-only patches (left pristine), and
    no generated module."""
    head = sh(tree, "rev-parse", "HEAD").strip()
    proc = make("pr-branch", tree, AUTHOR="Jane Doe <jane@example.org>")
    assert proc.returncode == 0, proc.stderr
    pin = LAYOUT.pin()
    branch = f"rlsync/{pin.version}-series{pin.series}"
    subjects = sh(tree, "log", "--format=%s", f"{head}..{branch}").splitlines()
    cut = pr_series.cut(LAYOUT)
    assert subjects == [c.message.splitlines()[0] for c in reversed(cut)]
    assert sh(tree, "rev-parse", "HEAD").strip() == head
    assert status(tree) == ""
    plan = pr_series.read_plan(ROOT)
    dropped = [p for p in LAYOUT.patches() if p.name[: -len(".patch")] in plan.drops]
    left_out = set(series.series_files(dropped))
    assert left_out, "the plan drops the fork's own patch"
    for rel in touched():
        if rel in left_out:
            continue
        blob = sh(tree, "show", f"{branch}:{rel}").encode()
        assert blob == series.built_file(LAYOUT, rel).read_bytes(), rel
    for rel in generated():
        assert rel not in sh(tree, "ls-tree", "-r", "--name-only", branch)
    again = make("pr-branch", tree, AUTHOR="Jane Doe <jane@example.org>")
    assert again.returncode != 0 and "already exists" in again.stderr


def test_apply_needs_sglang_dir():
    proc = subprocess.run(
        ["make", "-s", "apply"], cwd=ROOT, capture_output=True, text=True
    )
    assert proc.returncode != 0 and "set SGLANG_DIR" in proc.stderr


def test_not_an_sglang_tree_is_refused_naming_the_releases_served(tmp_path):
    proc = make("apply", tmp_path)
    assert proc.returncode != 0 and "no python/sglang/" in proc.stderr
    served = releases.supported(ROOT)
    assert f"the series serve SGLang {served[0]} to {served[-1]}" in proc.stderr


# --- real checkouts (issue 15) ---------------------------------------------

PIN = LAYOUT.pin()
JANE = "Jane Doe <jane@example.org>"


def files_of(root: Path) -> dict[str, bytes | None]:
    """Every file (bytes) and directory (None) under root, .git aside."""
    out: dict[str, bytes | None] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if ".git" in rel.parts:
            continue
        out[rel.as_posix()] = path.read_bytes() if path.is_file() else None
    return out


def as_git_clone(tree: Path) -> None:
    """Drop what a git clone of upstream lacks (setuptools-scm's _version.py,
    the sdist's PKG-INFO and egg-info), as a commit on top of v0.5.10."""
    (tree / "python" / "sglang" / "_version.py").unlink()
    (tree / "python" / "PKG-INFO").unlink()
    sh(tree, "rm", "-rq", "--cached", "python/sglang.egg-info")
    shutil.rmtree(tree / "python" / "sglang.egg-info")
    sh(tree, "commit", "-qam", "as in a git clone: no generated version files")


def assert_overlay_at(package: Path) -> None:
    """The overlay's python/sglang/... files at package/..."""
    for rel in touched():
        mapped = package / Path(rel).relative_to("python/sglang")
        assert mapped.read_bytes() == series.built_file(LAYOUT, rel).read_bytes(), rel


def force_three_way(tree: Path) -> tuple[Path, str]:
    """Commit a change to a context line of the first patch's first hunk:
    a plain apply no longer fits, a 3-way merge does."""
    rel = series.touched_files(LAYOUT.patches()[0])[0]
    patch_text = LAYOUT.patches()[0].read_text().split("\ndiff --git ")[1]
    hunk = patch_text.split("\n@@ ", 1)[1].split("\n", 1)[1]
    ctx = next(l[1:] for l in hunk.splitlines() if l.startswith(" ") and l.strip())
    target = tree / rel
    target.write_text(target.read_text().replace(ctx, ctx + "  # local", 1))
    sh(tree, "commit", "-qam", "local change in a context line")
    return target, ctx + "  # local"


def test_git_checkout_with_a_local_commit_on_the_release_tag(tree):
    as_git_clone(tree)
    (tree / "README.md").write_text("SGLang, our fork\n")
    sh(tree, "commit", "-qam", "a local commit")
    assert checkout.detect_version(tree) == "0.5.10"
    proc = make("apply", tree)
    assert proc.returncode == 0, proc.stderr
    assert_matches_overlay(tree)


def test_git_checkout_of_another_release_is_refused_naming_both(tree):
    as_git_clone(tree)
    (tree / "README.md").write_text("SGLang 0.5.99\n")
    sh(tree, "commit", "-qam", "release 0.5.99")
    sh(tree, "tag", "v0.5.99")  # v0.5.10 is an ancestor; 0.5.99 is nearer
    sh(tree, "commit", "-q", "--allow-empty", "-m", "a local commit")
    proc = make("apply", tree)
    assert proc.returncode != 0
    assert "SGLang 0.5.99 found" in proc.stderr
    assert "1 commits on v0.5.99" in proc.stderr
    assert f"the series is for {', '.join(releases.supported(ROOT))}" in proc.stderr
    assert status(tree) == ""
    # Named to the series of another release, it says what the tree has.
    proc = make("apply", tree, PIN="0.5.10")
    assert proc.returncode != 0
    assert "SGLang 0.5.99 found" in proc.stderr
    assert "1 commits on v0.5.99" in proc.stderr
    assert "the series is for 0.5.10, 0.5.10.post1, 0.5.11" in proc.stderr
    assert status(tree) == ""


def sdist(tmp_path: Path, upstream_tree: Path, version: str = "0.5.10") -> Path:
    """An unpacked sdist: upstream's python/ folder as sglang-<version>/."""
    root = tmp_path / f"sglang-{version}"
    shutil.copytree(upstream_tree / "python", root)
    return root


def test_unpacked_sdist_apply_then_revert_byte_identical(tmp_path, upstream_tree):
    root = sdist(tmp_path, upstream_tree)
    before = files_of(root)
    proc = make("apply", root)
    assert proc.returncode == 0, proc.stderr
    assert "sdist" in proc.stdout
    assert_overlay_at(root / "sglang")
    assert not (root / "python").exists()
    assert "already applied" in make("apply", root).stdout
    back = make("revert", root)
    assert back.returncode == 0, back.stderr
    assert files_of(root) == before


def test_unpacked_sdist_of_another_version_is_refused(tmp_path, upstream_tree):
    root = sdist(tmp_path, upstream_tree, "0.5.9")
    info = root / "PKG-INFO"
    info.write_text(info.read_text().replace("Version: 0.5.10", "Version: 0.5.9"))
    (root / "sglang" / "_version.py").write_text("__version__ = version = '0.5.9'\n")
    before = files_of(root)
    proc = make("apply", root)
    assert proc.returncode != 0
    assert "SGLang 0.5.9 found (PKG-INFO), but the series is for 0.5.10" in proc.stderr
    assert files_of(root) == before


def site_packages(tmp_path: Path, upstream_tree: Path, version="0.5.10") -> Path:
    """An installed SGLang: site-packages/sglang + its dist-info, next to
    another package; no _version.py, so the version is METADATA's."""
    sp = tmp_path / "lib" / "python3.11" / "site-packages"
    shutil.copytree(upstream_tree / "python" / "sglang", sp / "sglang")
    (sp / "sglang" / "_version.py").unlink()
    info = sp / f"sglang-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.4\nName: sglang\nVersion: {version}\n"
    )
    (info / "RECORD").write_text("sglang/__init__.py,,\n")
    (sp / "other").mkdir()
    (sp / "other" / "__init__.py").write_text("")
    return sp


@pytest.mark.parametrize("form", ["site-packages", "package dir"])
def test_installed_sglang_apply_then_revert_byte_identical(
    tmp_path, upstream_tree, form
):
    sp = site_packages(tmp_path, upstream_tree)
    given = sp if form == "site-packages" else sp / "sglang"
    assert checkout.detect_version(given) == "0.5.10"
    before = files_of(sp)
    proc = make("apply", given)
    assert proc.returncode == 0, proc.stderr
    assert f"site-packages {sp}" in proc.stdout
    assert_overlay_at(sp / "sglang")
    assert "already applied" in make("apply", given).stdout
    back = make("revert", given)
    assert back.returncode == 0, back.stderr
    assert files_of(sp) == before  # new files and their new directories gone


def test_installed_sglang_of_another_version_is_refused(tmp_path, upstream_tree):
    sp = site_packages(tmp_path, upstream_tree, "0.5.9")
    before = files_of(sp)
    proc = make("apply", sp / "sglang")
    assert proc.returncode != 0
    assert "SGLang 0.5.9 found (sglang-0.5.9.dist-info/METADATA)" in proc.stderr
    # Every pinned release is named (the tree's version picks the series).
    assert f"the series is for {', '.join(releases.supported(ROOT))}" in proc.stderr
    assert files_of(sp) == before


def test_installed_sglang_whose_files_disagree_on_its_version_is_refused(
    tmp_path, upstream_tree
):
    """The package of one release under the metadata of another (a broken
    or hand-mixed install) would get the other release's series: refused,
    naming both, nothing written."""
    sp = site_packages(tmp_path, upstream_tree, "0.5.10.post1")
    (sp / "sglang" / "_version.py").write_text("__version__ = version = '0.5.10'\n")
    before = files_of(sp)
    proc = make("apply", sp / "sglang")
    assert proc.returncode != 0
    assert "disagree on SGLang's version" in proc.stderr
    assert "METADATA says 0.5.10.post1" in proc.stderr
    assert "_version.py says 0.5.10" in proc.stderr
    assert files_of(sp) == before


def test_package_dir_of_a_checkout_applies_to_the_checkout(tree):
    proc = make("apply", tree / "python" / "sglang")
    assert proc.returncode == 0, proc.stderr
    assert f"checkout {tree}" in proc.stdout
    assert_matches_overlay(tree)
    assert sorted(line[3:] for line in status(tree).splitlines()) == written()


def test_three_way_apply_then_revert_is_byte_identical(tree):
    target, local = force_three_way(tree)
    before = files_of(tree)
    proc = make("apply", tree)
    assert proc.returncode == 0, proc.stderr
    assert "3-way" in proc.stdout
    assert local in target.read_text()
    back = make("revert", tree)
    assert back.returncode == 0, back.stderr
    assert "reverted" in back.stdout
    assert files_of(tree) == before
    assert status(tree) == ""
    assert "not applied" in make("revert", tree).stdout


def test_unstaged_edits_survive_a_three_way_apply_and_its_revert(tree):
    # A plain apply does not fit (committed change), and the same file and
    # another one have unstaged edits: git apply --3way said "does not
    # match index"; nothing here may stage, commit or lose them.
    target, local = force_three_way(tree)
    target.write_text(target.read_text() + "# unstaged edit at the end\n")
    other = tree / next(  # a file whose last lines the series leaves alone
        rel
        for rel in reversed(touched())
        if (LAYOUT.upstream_dir / rel).is_file()
        and tree / rel != target
        and (LAYOUT.upstream_dir / rel).read_text().splitlines()[-5:]
        == series.built_file(LAYOUT, rel).read_text().splitlines()[-5:]
    )
    other.write_text(other.read_text() + "# another unstaged edit\n")
    before, before_status = files_of(tree), status(tree)
    index = sh(tree, "ls-files", "--stage")
    proc = make("apply", tree)
    assert proc.returncode == 0, proc.stderr
    assert "3-way" in proc.stdout
    kept = proc.stdout.split("uncommitted edits kept in ", 1)[1].split(";")[0]
    edited = sorted(str(p.relative_to(tree)) for p in (target, other))
    assert sorted(kept.strip().split(", ")) == edited  # the user's, no other
    text = target.read_text()
    assert local in text and text.endswith("# unstaged edit at the end\n")
    assert other.read_text().endswith("# another unstaged edit\n")
    assert sh(tree, "ls-files", "--stage") == index
    back = make("revert", tree)
    assert back.returncode == 0, back.stderr
    assert files_of(tree) == before
    assert status(tree) == before_status
    assert sh(tree, "ls-files", "--stage") == index


def test_conflicting_uncommitted_edit_is_named_with_advice(tree):
    target, _ = force_three_way(tree)
    target.write_text("# rewritten locally, not committed\n")
    before = files_of(tree)
    proc = make("apply", tree)
    assert proc.returncode != 0
    assert "nothing was changed" in proc.stderr
    rel = target.relative_to(tree).as_posix()
    assert f"uncommitted edits in: {rel}" in proc.stderr
    assert "git stash" in proc.stderr and "does not match index" not in proc.stderr
    assert files_of(tree) == before
    assert sh(tree, "worktree", "list").count("\n") == 1


def test_generated_files_are_written_and_removed(tmp_path, upstream_tree, monkeypatch):
    rel = "python/sglang/srt/weight_sync/generated_by_rlsync/info.py"
    monkeypatch.setattr(series, "generated_files", lambda layout: {rel: "SERIES = 6\n"})
    generated = checkout._generated_files(LAYOUT)
    assert generated == {rel: "SERIES = 6\n"}
    root = sdist(tmp_path, upstream_tree)
    before = files_of(root)
    patches = LAYOUT.patches()
    out = checkout.apply_series(root, PIN, patches, generated=generated)
    assert "1 generated files written" in out
    assert (root / rel.removeprefix("python/")).read_text() == "SERIES = 6\n"
    out = checkout.revert_series(root, PIN, patches, generated=generated)
    assert "1 generated files removed" in out
    assert files_of(root) == before


def pr_log(tree: Path, head: str, branch: str) -> list[tuple[str, str, str, int]]:
    """(author, committer, message, author date) per commit, oldest first."""
    fmt = "--format=%x00%an <%ae>%n%cn <%ce>%n%ad%n%B"
    out = sh(tree, "log", "--reverse", "--date=unix", fmt, f"{head}..{branch}")
    commits = []
    for entry in out.split("\0")[1:]:
        author, committer, date, body = entry.split("\n", 3)
        commits.append((author, committer, body, int(date)))
    return commits


def no_global_git_config(tmp_path: Path) -> dict:
    env = dict(os.environ, HOME=str(tmp_path), GIT_CONFIG_GLOBAL=os.devnull)
    env["GIT_CONFIG_NOSYSTEM"] = "1"
    for key in ("GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "EMAIL"):
        env.pop(key, None)
    return env


def test_pr_branch_commits_by_the_author_signed_off_and_dated_now(tree, tmp_path):
    head = sh(tree, "rev-parse", "HEAD").strip()
    started = int(time.time())
    proc = make("pr-branch", tree, env=no_global_git_config(tmp_path), AUTHOR=JANE)
    assert proc.returncode == 0, proc.stderr
    branch = f"rlsync/{PIN.version}-series{PIN.series}"
    commits = pr_log(tree, head, branch)
    for author, committer, body, date in commits:
        assert author == committer == JANE
        assert body.rstrip().splitlines()[-1] == f"Signed-off-by: {JANE}"
        assert started - 5 <= date <= time.time() + 5  # now, not 2000-01-01
    assert len(commits) == len(pr_series.cut(LAYOUT))


def test_pr_branch_author_defaults_to_the_checkouts_git_config(tree, tmp_path):
    sh(tree, "config", "user.name", "Local Dev")
    sh(tree, "config", "user.email", "dev@example.org")
    head = sh(tree, "rev-parse", "HEAD").strip()
    proc = make("pr-branch", tree, env=no_global_git_config(tmp_path))
    assert proc.returncode == 0, proc.stderr
    branch = f"rlsync/{PIN.version}-series{PIN.series}"
    for author, committer, body, _ in pr_log(tree, head, branch):
        assert author == committer == "Local Dev <dev@example.org>"
        assert "Signed-off-by: Local Dev <dev@example.org>" in body


def test_pr_branch_without_any_author_is_refused(tree, tmp_path):
    sh(tree, "config", "user.name", "Local Dev")  # no user.email
    proc = make("pr-branch", tree, env=no_global_git_config(tmp_path))
    assert proc.returncode != 0
    assert "no author" in proc.stderr and "user.email" in proc.stderr
    assert 'AUTHOR="Name <mail>"' in proc.stderr
    assert "rlsync/" not in sh(tree, "branch", "--list")
    bad = make("pr-branch", tree, AUTHOR="just a name")
    assert bad.returncode != 0 and '"Name <mail>"' in bad.stderr


def test_a_write_that_fails_midway_puts_every_file_back(tmp_path, upstream_tree):
    """A folder where the series writes a new module: the files written
    before it are put back, and the error says so (no traceback)."""
    tree = tmp_path / "plain"
    shutil.copytree(upstream_tree / "python", tree / "python")
    in_the_way = tree / "python/sglang/srt/weight_sync/staged_receiver.py"
    (in_the_way / "a-folder").mkdir(parents=True)
    before = files_of(tree)
    proc = make("apply", tree)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "staged_receiver.py" in proc.stderr
    assert "put back, nothing was changed" in proc.stderr
    assert files_of(tree) == before


# `make apply` (or revert) killed after `files` files were written: no
# exception, no rollback, as a SIGKILL or a machine going away.
KILLED_AFTER = """
import os, sys
from devtools import __main__ as devtools, checkout
put, files = checkout._put, int(sys.argv[1])
def put_then_die(*args):
    global files
    if files == 0:
        os._exit(9)
    files -= 1
    put(*args)
checkout._put = put_then_die
devtools.main(sys.argv[2:])
"""


def killed_after(files: int, command: str, tree: Path) -> int:
    return subprocess.run(
        [sys.executable, "-c", KILLED_AFTER, str(files), command, str(tree)],
        cwd=ROOT,
        capture_output=True,
    ).returncode


@pytest.mark.parametrize("command", ["apply", "revert"])
def test_an_apply_or_revert_killed_midway_is_undone_by_the_next_one(
    tmp_path, upstream_tree, command
):
    """A write killed between two files (no exception to roll back from)
    leaves its undo journal; the next apply or revert puts every file back
    first, so the tree is never left half-patched."""
    tree = tmp_path / "plain"
    shutil.copytree(upstream_tree / "python", tree / "python")
    pristine = files_of(tree)
    if command == "revert":
        assert make("apply", tree).returncode == 0
    before = files_of(tree)
    assert killed_after(3, command, tree) == 9
    assert files_of(tree) != before  # half-written, the journal beside it
    again = make("revert", tree)
    assert again.returncode == 0, again.stderr
    assert "interrupted was undone first" in again.stdout
    assert files_of(tree) == pristine
    assert make("apply", tree).returncode == 0
    assert make("revert", tree).returncode == 0
    assert files_of(tree) == pristine


def test_an_undo_that_cannot_put_a_file_back_keeps_its_journal(
    tmp_path, upstream_tree, monkeypatch
):
    """The undo of a killed write says which file it could not put back and
    keeps the journal for the next try; it never claims the tree is whole."""
    tree = tmp_path / "plain"
    shutil.copytree(upstream_tree / "python", tree / "python")
    assert killed_after(3, "apply", tree) == 9
    target = checkout.find_target(tree)
    journal = target.package / checkout.UNDO_JOURNAL
    assert journal.is_file()

    def refuse(*args):
        raise PermissionError("read-only")

    monkeypatch.setattr(checkout, "_put", refuse)
    with pytest.raises(checkout.CheckoutError, match="could not be put back"):
        checkout.undo_interrupted_write(target)
    assert journal.is_file()
    monkeypatch.undo()
    assert "interrupted was undone first" in checkout.undo_interrupted_write(target)
    assert not journal.is_file()


def test_apply_leaves_a_hard_linked_copy_of_the_tree_as_it_was(tmp_path, upstream_tree):
    """Installers link one copy of a package into many environments (uv
    does, by hard link): patching one environment changes no other."""
    shared = tmp_path / "cache"
    shutil.copytree(upstream_tree / "python", shared / "python")
    linked = tmp_path / "venv"
    subprocess.run(["cp", "-al", str(shared), str(linked)], check=True)
    before = files_of(shared)
    mode = (linked / "python/sglang/srt/server_args.py").stat().st_mode
    assert make("apply", linked).returncode == 0
    assert files_of(shared) == before
    assert (linked / "python/sglang/srt/server_args.py").stat().st_mode == mode
    assert make("revert", linked).returncode == 0
    assert files_of(linked) == before


def an_older_series(tmp_path: Path) -> Path:
    """This repository's pins with the first pin's last patch changed (one
    added line), as another version of rlsync would have them."""
    root = tmp_path / "older-rlsync"
    shutil.copytree(ROOT / "pins", root / "pins")
    last = series.Layout(root, LAYOUT.version).patches()[-1]
    text = last.read_text()
    # An added line of Python with a comment (a line of its own at any
    # indent, or after code), a line no other patch's context holds.
    added = next(
        l
        for l in text.splitlines()
        if l.startswith("+") and (l[1:].lstrip(" ").startswith("# ") or "  # " in l)
    )
    last.write_text(text.replace(added, added + " (an older wording)", 1))
    return root


def test_a_tree_another_rlsync_applied_is_reverted_by_this_one(tmp_path, upstream_tree):
    """After an upgrade of rlsync, a tree patched by the old one: apply
    refuses (saying to revert first, nothing written), and revert takes
    out exactly what was applied, from the tree's record of it."""
    tree = tmp_path / "plain"
    shutil.copytree(upstream_tree / "python", tree / "python")
    pristine = files_of(tree)
    older = an_older_series(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "devtools", "--root", str(older), "apply", str(tree)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    applied = files_of(tree)
    refused = make("apply", tree)
    assert refused.returncode != 0
    assert "another version of rlsync applied it" in refused.stderr
    assert files_of(tree) == applied
    back = make("revert", tree)
    assert back.returncode == 0, back.stderr
    assert files_of(tree) == pristine
    assert make("apply", tree).returncode == 0
    assert_matches_overlay(tree)


def test_a_tree_path_with_shell_and_make_syntax_is_taken_as_given(
    tmp_path, upstream_tree
):
    """`make apply SGLANG_DIR=...` passes the path on as text: a backtick,
    `$(...)` or a quote in it runs nothing, in make or in the shell."""
    ran = tmp_path / "ran"
    odd = tmp_path / f'a `touch {ran}` $(shell touch {ran}) $$(touch {ran}) "q'
    shutil.copytree(upstream_tree / "python", odd / "python")
    pristine = files_of(odd)
    proc = make("apply", odd)
    assert proc.returncode == 0, proc.stderr
    assert not ran.exists()
    assert make("revert", odd).returncode == 0
    assert files_of(odd) == pristine


def test_pr_branch_whose_hook_refuses_leaves_no_branch(tree):
    """`git am` runs the checkout's pre-applypatch hook: one that refuses
    stops the branch, which is removed, saying what refused."""
    hook = tree / ".git" / "hooks" / "pre-applypatch"
    hook.write_text("#!/bin/sh\necho 'hook says no' >&2\nexit 1\n")
    hook.chmod(0o755)
    head = sh(tree, "rev-parse", "HEAD").strip()
    before = files_of(tree)
    proc = make("pr-branch", tree, AUTHOR="Jane Doe <jane@example.org>")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "hook says no" in proc.stderr and "no branch was made" in proc.stderr
    assert sh(tree, "branch", "--list", "rlsync/*").strip() == ""
    assert sh(tree, "rev-parse", "HEAD").strip() == head
    assert files_of(tree) == before
    hook.unlink()
    assert make("pr-branch", tree, AUTHOR="Jane Doe <jane@example.org>").returncode == 0


def test_apply_takes_the_pin_of_the_trees_version(tmp_path):
    """One `make apply` for every pin: an installed SGLang 0.5.23 (its
    site-packages: package + dist-info) gets the 0.5.23 series, byte for byte
    what that pin builds, and revert gives back the pristine files."""
    newest = series.Layout(ROOT, series.pin_versions(ROOT)[-1])
    assert newest.version != LAYOUT.version
    pristine = series.ensure_upstream(newest) / "python"
    site = tmp_path / "site-packages"
    info = f"sglang-{newest.version}.dist-info"
    shutil.copytree(pristine / info, site / info)
    rels = series.series_files(newest.patches())
    assert rels, "the newest pin's series is empty"
    keep = ["sglang/__init__.py", "sglang/version.py", "sglang/_version.py"]
    keep += [rel.removeprefix("python/") for rel in rels]
    for rel in keep:
        if (pristine / rel).is_file():
            (site / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(pristine / rel, site / rel)
    before = {p: p.read_bytes() for p in site.rglob("*") if p.is_file()}

    proc = make("apply", site)
    assert proc.returncode == 0, proc.stderr
    assert f"applied {len(newest.patches())} patches to site-packages" in proc.stdout
    for rel in rels:
        built = series.built_file(newest, rel).read_bytes()
        assert (site / rel.removeprefix("python/")).read_bytes() == built, rel
    info_module = site / series.SERIES_MODULE.removeprefix("python/")
    assert f'"version": "{newest.version}"' in info_module.read_text()

    proc = make("revert", site)
    assert proc.returncode == 0, proc.stderr
    after = {p: p.read_bytes() for p in site.rglob("*") if p.is_file()}
    assert after == before
