"""The patch series is the source of truth: drift between it, the pristine
tree and the overlay is caught and names the file; export is deterministic."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from devtools import patch_names, pr_files, pr_series, releases, rewrites, seams, series
from devtools.pin import Pin, PinError, read_pin, unpack_archive

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def scratch(tmp_path, upstream_tree) -> series.Layout:
    """A copy of this checkout's oldest pin (series and overlay) and common/,
    sharing its pristine tree."""
    layout = series.Layout(ROOT)
    root = tmp_path / "rlsync"
    pin_dir = root / "pins" / layout.version
    pin_dir.mkdir(parents=True)
    shutil.copy(layout.pin_file, pin_dir)
    shutil.copytree(layout.patches_dir, pin_dir / "patches")
    shutil.copy(layout.pin_dir / rewrites.REWRITES_FILE, pin_dir)
    shutil.copytree(layout.overlay_dir, pin_dir / "overlay")
    shutil.copytree(layout.common_dir, root / series.COMMON_DIR)
    for copy in (*series.VENDORED, series.LIBRARY_INIT, series.LIBRARY_SENDER):
        (root / copy).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / copy, root / copy)
    (root / "build" / layout.version).mkdir(parents=True)
    (root / "build" / layout.version / "upstream").symlink_to(upstream_tree)
    return series.Layout(root, layout.version)


def run_check(layout: series.Layout) -> subprocess.CompletedProcess:
    """`python -m devtools check`, the command behind `make check`."""
    return subprocess.run(
        [sys.executable, "-m", "devtools", "--root", str(layout.root), "check"],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )


def overlay_file(layout: series.Layout) -> Path:
    rel = series.overlay_files(layout)[0]
    return layout.overlay_dir / rel


def test_make_check_passes_on_this_checkout():
    proc = subprocess.run(
        ["make", "-s", "check"], cwd=ROOT, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    for version in series.pin_versions(ROOT):
        assert f"ok: {version}: " in proc.stdout


def test_series_is_not_empty_and_every_patch_is_linted_clean():
    layout = series.Layout(ROOT)
    patches = layout.patches()
    assert patches, "patches/series lists no patch"
    for patch in patches:
        assert series.lint_patch(patch) == []


def test_hand_edit_in_overlay_fails_check_naming_the_file(scratch):
    path = overlay_file(scratch)
    lines = path.read_text().splitlines(keepends=True)
    lines[len(lines) // 2] = "# edited by hand\n"
    path.write_text("".join(lines))
    proc = run_check(scratch)
    assert proc.returncode == 1
    rel = path.relative_to(scratch.root).as_posix()
    assert f"{rel}: differs from pristine + series" in proc.stderr
    assert "+# edited by hand" in proc.stderr


def test_one_byte_of_drift_is_caught(scratch):
    path = overlay_file(scratch)
    path.write_bytes(path.read_bytes() + b"\n")
    assert run_check(scratch).returncode == 1


def test_overlay_file_no_patch_touches_fails_check(scratch):
    stray = scratch.overlay_dir / "python" / "sglang" / "srt" / "stray.py"
    stray.write_text("x = 1\n")
    proc = run_check(scratch)
    assert proc.returncode == 1
    assert (
        "overlay/python/sglang/srt/stray.py: no patch touches this file" in proc.stderr
    )


def test_patch_touching_file_missing_from_overlay_fails_check(scratch):
    path = overlay_file(scratch)
    path.unlink()
    proc = run_check(scratch)
    assert proc.returncode == 1
    assert f"{path.relative_to(scratch.root).as_posix()}: missing" in proc.stderr


def test_patch_that_does_not_apply_fails_check_naming_it(scratch):
    patch = scratch.patches()[0]
    text = patch.read_text()
    # Corrupt a context line of the first hunk.
    head, hunk = text.split("\n@@ ", 1)
    body = hunk.split("\n", 1)[1]
    ctx = next(l for l in body.splitlines() if l.startswith(" ") and l.strip())
    patch.write_text(head + "\n@@ " + hunk.replace(ctx, " " + ctx[1:] + "  # moved", 1))
    proc = run_check(scratch)
    assert proc.returncode == 1
    assert f"{patch.name} does not apply cleanly" in proc.stderr


def test_series_file_and_patch_files_must_agree(scratch):
    (scratch.patches_dir / "9999-unlisted.patch").write_text("x\n")
    proc = run_check(scratch)
    assert "9999-unlisted.patch: not listed in" in proc.stderr
    (scratch.patches_dir / "9999-unlisted.patch").unlink()
    with open(scratch.series_file, "a") as f:
        f.write("0042-gone.patch\n")
    proc = run_check(scratch)
    assert proc.returncode == 1
    assert "lists 0042-gone.patch, which does not exist" in proc.stderr


def test_patch_lint_requires_forwarded_line_and_full_index(scratch):
    patch = scratch.patches()[0]
    text = patch.read_text().replace("Forwarded: ", "Sent: ")
    text = text.replace(text.split("index ", 1)[1][:81], "abc1234..def5678 100644", 1)
    patch.write_text(text)
    problems = series.lint_patch(patch)
    assert any("Forwarded:" in p for p in problems)
    assert any("abbreviated index" in p for p in problems)


@pytest.mark.parametrize(
    "trailers, wrong",
    [
        ("Forwarded: maybe", "'Forwarded: maybe': DEP-3 wants no, not-needed"),
        ("Bug: 30166\nForwarded: no", "'Bug: 30166': DEP-3 wants the URL"),
    ],
)
def test_patch_lint_wants_dep3_trailer_values(scratch, trailers, wrong):
    """`Forwarded:` is no, not-needed or the pull request's URL; `Bug:` the
    upstream issue's URL (what a maintainer can follow)."""
    patch = scratch.patches()[0]
    text = patch.read_text()
    patch.write_text(re.sub(r"^Forwarded: .*$", trailers, text, count=1, flags=re.M))
    assert any(wrong in p for p in series.lint_patch(patch)), series.lint_patch(patch)
    right = "Bug: https://github.com/sgl-project/sglang/issues/30166\nForwarded: no"
    patch.write_text(re.sub(r"^Forwarded: .*$", right, text, count=1, flags=re.M))
    assert series.lint_patch(patch) == []


def test_patch_lint_refuses_a_left_over_conflict_note(scratch):
    """A commit amended after a conflicted rebase keeps git's note in its
    message; it must not reach an upstream reviewer."""
    patch = scratch.patches()[-1]
    text = patch.read_text().replace(
        "\nForwarded: ", "\n# Conflicts:\n#\tpython/sglang/x.py\n\nForwarded: ", 1
    )
    patch.write_text(text)
    assert any("# Conflicts:" in p for p in series.lint_patch(patch))


def test_overlay_regenerates_byte_identical(scratch):
    before = {
        p: (scratch.overlay_dir / p).read_bytes() for p in series.overlay_files(scratch)
    }
    shutil.rmtree(scratch.overlay_dir)
    series.regenerate_overlay(scratch)
    after = {
        p: (scratch.overlay_dir / p).read_bytes() for p in series.overlay_files(scratch)
    }
    assert after == before


def test_worktree_and_export_round_trip_byte_identical(scratch):
    before = {p.name: p.read_bytes() for p in scratch.patches()}
    series_before = scratch.series_file.read_bytes()
    work = series.make_worktree(scratch)
    log = series.git(work, "log", "--format=%s", "upstream..HEAD").stdout.split("\n")
    assert len([s for s in log if s]) == len(before)
    series.export_patches(scratch)
    assert {p.name: p.read_bytes() for p in scratch.patches()} == before
    assert scratch.series_file.read_bytes() == series_before


def test_export_picks_up_a_new_commit(scratch):
    work = series.make_worktree(scratch)
    target = work / series.overlay_files(scratch)[0]
    target.write_text(target.read_text() + "# new line\n")
    series.git(work, "commit", "-qam", "demo: a new patch\n\nWhy.\n\nForwarded: no")
    exported = series.export_patches(scratch)
    assert exported[-1].name == "a-new-patch.patch"  # from its subject, no number
    assert series.lint_patch(exported[-1]) == []
    series.regenerate_overlay(scratch)
    assert series.check(scratch) == []


def test_export_keeps_a_carriage_return_a_file_has(scratch):
    """The worktree applies patches with --keep-cr; exporting keeps the CR."""
    work = series.make_worktree(scratch)
    target = work / series.overlay_files(scratch)[0]
    target.write_bytes(target.read_bytes() + b"x = 1\r\n")
    series.git(work, "commit", "-qam", "demo: a CR\n\nWhy.\n\nForwarded: no")
    exported = series.export_patches(scratch)
    assert b"+x = 1\r\n" in exported[-1].read_bytes()


def test_export_refuses_uncommitted_changes(scratch):
    work = series.make_worktree(scratch)
    target = work / series.overlay_files(scratch)[0]
    target.write_text(target.read_text() + "# dirty\n")
    with pytest.raises(series.SeriesError, match="uncommitted changes"):
        series.export_patches(scratch)


def test_series_number_bump_without_the_generated_module_fails_check(scratch):
    """/rlsync_info reports the series the wheel is versioned with: the
    generated module follows the pin, and `make overlay` rewrites it."""
    pin = scratch.pin_file
    pin.write_text(
        pin.read_text().replace(f"series = {scratch.pin().series}", "series = 99")
    )
    proc = run_check(scratch)
    assert proc.returncode == 1
    assert f"overlay/{series.SERIES_MODULE}: differs from what the series" in (
        proc.stderr
    )
    assert "+SERIES = 7" in proc.stderr or "-SERIES = 99" in proc.stderr
    series.regenerate_overlay(scratch)
    assert "SERIES = 99\n" in (scratch.overlay_dir / series.SERIES_MODULE).read_text()


def test_features_come_from_the_patch_headers(scratch):
    """Each patch names the feature it adds; no patch edits a shared list."""
    text = (scratch.overlay_dir / series.SERIES_MODULE).read_text()
    assert f"SERIES = {scratch.pin().series}\n" in text
    features = series.series_features(scratch.patches())
    assert "two_phase_weight_update" in features and "rlsync_info" in features
    for name in features:
        assert f'    "{name}",\n' in text
    assert series.generated_files(scratch) == {series.SERIES_MODULE: text}
    patch = patch_named(scratch, "weights-checksum")
    patch.write_text(patch.read_text().replace("Feature: weights_checksum\n", ""))
    proc = run_check(scratch)
    assert proc.returncode == 1
    assert '+    "weights_checksum",' in proc.stderr
    series.regenerate_overlay(scratch)
    assert run_check(scratch).returncode == 0
    assert (
        "weights_checksum"
        not in (scratch.overlay_dir / series.SERIES_MODULE).read_text()
    )


def test_no_patch_edits_the_feature_list():
    """Patches add features by a header line, never by editing a file that
    lists them."""
    for patch in series.Layout(ROOT).patches():
        assert series.SERIES_MODULE not in series.touched_files(patch), patch.name
        assert "FEATURES = (" not in patch.read_text(), patch.name


def patch_named(layout: series.Layout, part: str) -> Path:
    (found,) = [p for p in layout.patches() if part in p.name]
    return found


def drop_depends(patch: Path, part: str = "") -> None:
    lines = patch.read_text().split("\n")
    kept = [l for l in lines if not (l.startswith("Depends: ") and part in l)]
    assert len(kept) < len(lines), f"{patch.name} has no Depends: line with {part}"
    patch.write_text("\n".join(kept))


def test_a_patch_that_does_not_apply_without_an_undeclared_patch_fails_check(
    scratch,
):
    """Each patch applies alone with what it declares: the checksum patch's
    context comes from the two-phase one."""
    patch = patch_named(scratch, "weights-checksum")
    drop_depends(patch)
    proc = run_check(scratch)
    assert proc.returncode == 1
    assert f"{patch.name}: does not apply on its own" in proc.stderr
    assert "'Depends:'" in proc.stderr


def test_a_patch_importing_a_module_of_an_undeclared_patch_fails_check(scratch):
    """Code use counts: the two-phase patch applies without the per-rank
    helper patch, but imports the module that patch adds."""
    patch = patch_named(scratch, "two-phase-weight-update")
    drop_depends(patch, "gather-every-tp-rank")
    proc = run_check(scratch)
    assert proc.returncode == 1
    assert (
        f"{patch.name}: imports gather_from_tp_ranks from "
        "sglang.srt.managers.weight_op_results" in proc.stderr
    )


def test_an_unknown_or_later_dependency_fails_check_naming_the_patch(scratch):
    first, second = scratch.patches()[:2]
    text = first.read_text().replace(
        "\nForwarded: ",
        f"\nDepends: no-such-patch\nDepends: {second.stem}\nForwarded: ",
        1,
    )
    first.write_text(text)
    proc = run_check(scratch)
    assert proc.returncode == 1
    assert f"{first.name}: Depends: no-such-patch: no such patch" in proc.stderr
    assert f"{first.name}: Depends: {second.stem}: not earlier in the series" in (
        proc.stderr
    )


def test_every_patch_declares_what_it_needs():
    """The dependencies the series declares resolve, and each patch applies
    alone with them (what `make check` runs)."""
    layout = series.Layout(ROOT)
    patches = layout.patches()
    deps = series.declared_dependencies(patches)
    assert series.check_each_patch_alone(layout, patches) == []
    needed = series.with_dependencies(
        patch_named(layout, "data-parallel"), patches, deps
    )
    assert any("two-phase-weight-update" in p.name for p in needed)
    assert any("gather-every-tp-rank" in p.name for p in needed)


def test_a_hand_edited_generated_copy_fails_check(scratch):
    """The trainer library's copies of series modules are generated, never
    edited: check names them, and `make overlay` puts them back."""
    assert "python/rlsync/digest.py" in series.VENDORED
    for copy in series.VENDORED:
        path = scratch.root / copy
        path.write_text(path.read_text() + "# edited by hand\n")
        proc = run_check(scratch)
        assert proc.returncode == 1
        assert f"{copy}: differs from common/" in proc.stderr
        series.regenerate_overlay(scratch)
        assert run_check(scratch).returncode == 0


def test_each_pin_names_its_release_and_archive():
    pins = {
        v: read_pin(ROOT / "pins" / v / "upstream.pin")
        for v in series.pin_versions(ROOT)
    }
    assert list(pins) == ["0.5.10", "0.5.23"]
    for version, pin in pins.items():
        assert (pin.name, pin.version) == ("sglang", version)
        assert len(pin.sha256) == 64
        assert pin.local_version == f"{version}+rlsync.{pin.series}"
    assert pins["0.5.10"].archive == "sglang-0.5.10.tar.gz"
    # Releases after 0.5.10.post1 are wheels only.
    assert pins["0.5.23"].archive.startswith("sglang-0.5.23-cp311-")
    # One series, one number: the trainer library speaks it to every pin.
    assert len({pin.series for pin in pins.values()}) == 1


def test_sdist_hash_mismatch_stops_with_clear_error(tmp_path, upstream_tree):
    from devtools.pin import cache_dir

    good = read_pin(series.Layout(ROOT).pin_file)
    sdist = cache_dir() / "sdist" / good.sha256 / good.sdist
    bad = Pin(good.name, good.version, good.sdist, "0" * 64, good.series)
    with pytest.raises(
        PinError, match=r"sha256 mismatch for sglang-0.5.10.tar.gz: pin says 0{64}"
    ):
        unpack_archive(bad, sdist, tmp_path / "python")
    assert not (tmp_path / "python").exists()


def test_upstream_unpacks_sdist_as_python_folder(upstream_tree):
    assert (
        upstream_tree / "python" / "sglang" / "srt" / "utils" / "watchdog.py"
    ).is_file()
    assert (upstream_tree / "python" / "pyproject.toml").is_file()


def test_check_fails_when_the_library_speaks_another_series(scratch):
    init = scratch.root / series.LIBRARY_INIT
    init.write_text(init.read_text().replace("SERIES = ", "SERIES = 9"))
    proc = run_check(scratch)
    assert proc.returncode == 1
    assert f"{series.LIBRARY_INIT}: SERIES is not" in proc.stderr


def test_check_fails_on_a_feature_the_library_requires_but_no_patch_declares(scratch):
    patch = next(p for p in scratch.patches() if "two-phase-weight-update" == p.stem)
    renamed = "Feature: two_phase_update\n"
    patch.write_text(
        patch.read_text().replace("Feature: two_phase_weight_update\n", renamed)
    )
    series.regenerate_overlay(scratch)  # the overlay agrees: only the name is wrong
    proc = run_check(scratch)
    assert proc.returncode == 1
    assert "requires feature 'two_phase_weight_update', which no patch" in proc.stderr


def test_check_fails_when_the_library_s_required_features_cannot_be_read(scratch):
    """The check reads REQUIRED_FEATURES from the sender's source: moved or
    renamed, it must fail the check, not let every name pass unchecked."""
    sender = scratch.root / series.LIBRARY_SENDER
    text = sender.read_text()
    assert series.required_features(sender) == ("two_phase_weight_update",)
    sender.write_text(text.replace("REQUIRED_FEATURES = (", "NEEDED_FEATURES = (", 1))
    problems = series.check_features(scratch)
    assert any("no REQUIRED_FEATURES = (...)" in p for p in problems), problems


def test_check_fails_on_a_feature_declared_twice_or_not_an_identifier(scratch):
    first, second = scratch.patches()[:2]
    twice = re.search(r"^Feature: (\S+)$", first.read_text(), re.M).group(1)
    second.write_text(
        re.sub(
            r"^Feature: .*$",
            f"Feature: {twice}\nFeature: Rank-Results",
            second.read_text(),
            count=1,
            flags=re.M,
        )
    )
    problems = series.check_features(scratch)
    assert any(f"Feature: {twice} is declared by {first.name}" in p for p in problems)
    assert any("'Rank-Results' is not a lowercase identifier" in p for p in problems)


def test_a_shared_module_edited_in_common_fails_check_naming_the_pin(scratch):
    """A shared module is one file for every pin: a copy that differs from
    what a pin's series builds is drift, whichever side was edited."""
    rel = "python/sglang/srt/weight_sync/staged_receiver.py"
    assert rel in series.common_files(scratch)
    path = scratch.common_dir / rel
    path.write_text(path.read_text() + "# edited by hand\n")
    proc = run_check(scratch)
    assert proc.returncode == 1
    assert f"common/{rel}: differs from what the 0.5.10 series builds" in proc.stderr
    series.regenerate_overlay(scratch)  # the pin's series is the source
    assert run_check(scratch).returncode == 0, run_check(scratch).stderr
    assert "# edited by hand" not in path.read_text()


def test_a_shared_module_kept_in_a_pins_overlay_fails_check(scratch):
    rel = "python/sglang/srt/weight_sync/digest.py"
    copy = scratch.overlay_dir / rel
    copy.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(scratch.common_dir / rel, copy)
    proc = run_check(scratch)
    assert proc.returncode == 1
    assert f"pins/0.5.10/overlay/{rel}: a shared module" in proc.stderr


def test_no_pins_overlay_repeats_a_shared_module():
    for version in series.pin_versions(ROOT):
        layout = series.Layout(ROOT, version)
        assert not set(series.overlay_files(layout)) & set(
            series.common_files(layout)
        ), version


def test_a_name_the_series_moves_away_is_caught_where_it_is_still_imported(
    tmp_path,
):
    """A patch that moves a function out of a module breaks a file it does
    not touch that still imports it from there; `make check` names that file
    and line (the per-patch check sees only the imports a patch adds)."""
    from devtools.imports import unresolved_imports

    pristine, patched = tmp_path / "pristine", tmp_path / "patched"
    pkg = Path("python", "sglang", "srt")
    for tree in (pristine, patched):
        (tree / pkg / "sub").mkdir(parents=True)
        (tree / pkg / "sub" / "__init__.py").write_text("")
    (pristine / pkg / "mixin.py").write_text("def content():\n    pass\n")
    (patched / pkg / "requests.py").write_text("def content():\n    pass\n")
    (patched / pkg / "mixin.py").write_text(
        "from sglang.srt.requests import content as _content\n\nLIMIT = 1\n"
    )
    (patched / pkg / "engine.py").write_text(
        "import os\n"
        "from sglang.srt import sub\n"
        "from sglang.srt.mixin import LIMIT\n"
        "from sglang.srt.mixin import (\n    content,\n)\n"
        "try:\n    from sglang.srt.missing_optional import anything\n"
        "except ImportError:\n    anything = None\n"
        "def later():\n    from sglang.srt.renamed_mixin import _Communicator\n"
    )
    files = [str(pkg / "mixin.py"), str(pkg / "engine.py")]
    assert unresolved_imports(patched, pristine, files) == [
        (str(pkg / "engine.py"), 4, "sglang.srt.mixin", "content"),
        (str(pkg / "engine.py"), 12, "sglang.srt.renamed_mixin", "_Communicator"),
    ]
    (patched / pkg / "mixin.py").write_text("from sglang.srt.requests import *\n")
    assert unresolved_imports(patched, pristine, files) == [
        (str(pkg / "engine.py"), 12, "sglang.srt.renamed_mixin", "_Communicator"),
    ]


def test_a_message_naming_a_file_that_is_nowhere_fails_check(scratch):
    """A reviewer follows a message to the files it names: upstream's (by
    a tail of their path), the series' or this repository's tests."""
    patch = scratch.patches()[0]
    text = patch.read_text()
    named = "See srt/utils/common.py, tests/test_series.py and NOWHERE-NOTES.md.\n\n"
    patch.write_text(text.replace("\nForwarded: ", f"\n{named}Forwarded: ", 1))
    proc = run_check(scratch)
    assert proc.returncode == 1
    assert f"{patch.name}: its message names NOWHERE-NOTES.md" in proc.stderr
    assert "names srt/utils/common.py" not in proc.stderr
    assert "names tests/test_series.py" not in proc.stderr


def patch_file(folder: Path, name: str, subject: str, feature: str = "") -> Path:
    trailer = f"Feature: {feature}\n" if feature else ""
    path = folder / name
    path.write_text(
        f"From {'0' * 40} Mon Sep 17 00:00:00 2001\nSubject: [PATCH] {subject}\n\n"
        f"Why.\n\n{trailer}Forwarded: no\n\ndiff --git a/x b/x\n"
    )
    return path


def test_a_numbered_or_misnamed_patch_fails_check(scratch):
    """Patches are named for what they do, a feature's after its feature:
    a number in the name, or a feature's patch named otherwise, fails."""
    patches = scratch.patches()
    featured = next(p for p in patches if patch_names.features(p.read_text()))
    plain = next(p for p in patches if not patch_names.features(p.read_text()))
    listing = scratch.series_file.read_text()
    for patch, name in (
        (featured, "something-else.patch"),
        (plain, f"0001-{plain.name}"),
    ):
        patch.rename(patch.with_name(name))
        listing = listing.replace(f"{patch.name}\n", f"{name}\n")
    scratch.series_file.write_text(listing)
    for patch in scratch.patches():  # the Depends: lines follow the names
        text = patch.read_text()
        for old, new in ((featured, "something-else"), (plain, f"0001-{plain.stem}")):
            text = text.replace(f"Depends: {old.stem}\n", f"Depends: {new}\n")
        patch.write_text(text)
    proc = run_check(scratch)
    assert proc.returncode == 1
    assert f"0001-{plain.name}: a patch is named for what it does" in proc.stderr
    feature = patch_names.features(
        featured.with_name("something-else.patch").read_text()
    )[0]
    assert (
        f"something-else.patch: adds feature {feature}, so it is named "
        f"{patch_names.feature_file_name(feature)}"
    ) in proc.stderr


def test_export_keeps_each_patch_s_name(tmp_path):
    """`make patches` names what it exports as the series did: a feature's
    patch after its feature, a reworded subject keeps its place's name, an
    unchanged subject keeps its name wherever it moves, a new patch is named
    from its subject."""
    current = [
        patch_file(tmp_path, "two-phase.patch", "weight sync: two-phase", "two_phase"),
        patch_file(tmp_path, "kept-name.patch", "weight sync: an old subject"),
        patch_file(tmp_path, "moved.patch", "health: stays healthy"),
    ]
    texts = [p.read_text() for p in current]
    reworded = texts[1].replace("an old subject", "a new subject")
    assert patch_names.export_names([texts[0], reworded, texts[2]], current) == [
        "two-phase.patch",
        "kept-name.patch",
        "moved.patch",
    ]
    added = patch_file(
        tmp_path, "x.patch", "tokenizer: serve calls in 2 orders"
    ).read_text()
    assert patch_names.export_names([texts[2], added, *texts[:2]], current) == [
        "moved.patch",
        "serve-calls-in-2-orders.patch",
        "two-phase.patch",
        "kept-name.patch",
    ]
    other_files = added.replace("a/x b/x", "a/y b/y")
    assert patch_names.export_names([texts[0], other_files, texts[2]], current) == [
        "two-phase.patch",
        "serve-calls-in-2-orders.patch",  # a dropped patch's place, not its name
        "moved.patch",
    ]
    tabbed = texts[0].replace("Feature: two_phase\n", "Feature:\ttwo_phase\t\n")
    assert patch_names.expected_name(tabbed) == "two-phase.patch"
    two = texts[0].replace("Feature: two_phase\n", "Feature: two_phase, other\n")
    assert patch_names.features(two) == ["two_phase", "other"]
    assert patch_names.expected_name(two) is None
    for subject in ("x: " + "y" * 60, "x: 2 things", "x: " + "9" * 60):
        name = patch_file(tmp_path, "n.patch", subject).read_text()
        assert patch_names.NAME.fullmatch(patch_names.name_from_subject(name))
        assert len(patch_names.name_from_subject(name)) <= patch_names.MAX_LENGTH
    with pytest.raises(ValueError, match="two patches would be named two-phase.patch"):
        patch_names.export_names([texts[0], texts[0]], current)


def test_one_patch_has_one_name_on_every_pin(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = patch_file(tmp_path / "a", "credential-headers.patch", "logs: no keys")
    second = patch_file(tmp_path / "b", "no-keys-in-logs.patch", "logs: no keys")
    other = patch_file(tmp_path / "b", "other.patch", "logs: other")
    assert patch_names.check_names_across_pins({"1": [first], "2": [other]}) == []
    assert patch_names.check_names_across_pins({"1": [first], "2": [second]}) == [
        "2: no-keys-in-logs.patch: the same patch is credential-headers.patch on 1 "
        "(subject 'logs: no keys'); one name on every pin"
    ]


def test_a_patch_rewriting_more_of_an_earlier_one_than_listed_fails_check(scratch):
    """The rewrites a series still has are listed; one more line fails."""
    listed = scratch.pin_dir / rewrites.REWRITES_FILE
    text = listed.read_text()
    patch, earlier, count = re.search(r"^(\S+) (\S+) (\d+)$", text, re.M).groups()
    listed.write_text(text.replace(f"{patch} {earlier} {count}\n", "", 1))
    proc = run_check(scratch)
    assert proc.returncode == 1
    assert (
        f"{patch}.patch rewrites {count} lines that {earlier}.patch adds "
        f"({rewrites.REWRITES_FILE} allows 0)"
    ) in proc.stderr


def test_rewrites_are_what_git_blame_says(scratch):
    """An oracle that shares no code: in the series' worktree, `git blame`
    of each line a commit removes names the commit that added it."""
    work = series.make_worktree(scratch)
    commits = series.git(work, "rev-list", "--reverse", "upstream..HEAD").stdout
    names = dict(zip(commits.split(), (p.stem for p in scratch.patches())))
    blamed: dict[tuple[str, str], int] = {}
    for commit, name in names.items():
        diff = series.git(work, "diff", "-U0", f"{commit}^", commit).stdout
        path = None
        for line in diff.split("\n"):
            if line.startswith("--- "):
                path = None if line == "--- /dev/null" else line[len("--- a/") :]
            hunk = re.match(r"^@@ -(\d+)(?:,(\d+))? ", line)
            if not hunk or path is None or hunk.group(2) == "0":
                continue
            first, count = int(hunk.group(1)), int(hunk.group(2) or 1)
            where = f"{first},{first + count - 1}"
            blame = series.git(
                work, "blame", "--porcelain", "-L", where, f"{commit}^", "--", path
            ).stdout
            for author in re.findall(r"^([0-9a-f]{40}) \d+ \d+", blame, re.M):
                if author in names:
                    key = (name, names[author])
                    blamed[key] = blamed.get(key, 0) + 1
    assert blamed and rewrites.rewrites(scratch) == blamed


def test_pull_request_files_must_be_a_commit_s_unit_tests_or_docs(tmp_path):
    """pr/<commit>/ holds what that commit of the pull-request series adds:
    registered unit tests and docs pages of a commit some pin has, once,
    and the commit's message names its unit tests; pr/messages/ is no
    commit's."""
    pins = {"1": [("secret-redaction", "redaction: hide secrets\n")]}
    root = tmp_path / "repo"
    files = {
        "secret-redaction/test/registered/unit/utils/test_redaction.py": "register_cpu_ci(est_time=1)\n",
        "secret-redaction/docs/advanced_features/redaction.md": "# Redaction\n",
        "secret-redaction/python/sglang/srt/x.py": "x = 1\n",
        "secret-redaction/test/registered/unit/utils/test_unregistered.py": "x = 1\n",
        "no-such-commit/docs/x.md": "# x\n",
        "no-such-commit/test/registered/unit/utils/test_redaction.py": "register_cpu_ci(est_time=1)\n",
        "messages/secret-redaction": "redaction: hide secrets\n",
    }
    for rel, text in files.items():
        (root / "pr" / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / "pr" / rel).write_text(text)
    problems = pr_files.check_pr_files(root, pins)
    assert problems == [
        "pr/no-such-commit: no commit of a pin's pull-request series has that name",
        "pr/secret-redaction/python/sglang/srt/x.py: a pull request adds unit tests "
        "under test/registered/unit/ and pages under docs/ here; the code belongs "
        "in the commit",
        "pr/secret-redaction/test/registered/unit/utils/test_redaction.py: "
        "pr/no-such-commit adds it too; one commit adds a file",
        "pr/secret-redaction/test/registered/unit/utils/test_unregistered.py: a unit "
        "test registers itself for upstream's CPU CI (register_cpu_ci)",
        "1: secret-redaction: its message does not name test/registered/"
        "unit/utils/test_redaction.py, the unit tests its commit adds",
        "1: secret-redaction: its message does not name test/registered/"
        "unit/utils/test_unregistered.py, the unit tests its commit adds",
    ]
    cut = {
        v: [(c.name, c.message) for c in pr_series.cut(series.Layout(ROOT, v))]
        for v in series.pin_versions(ROOT)
    }
    assert pr_files.check_pr_files(ROOT, cut) == []


def test_a_mixin_reading_undeclared_upstream_state_fails_check(scratch):
    """The mixins read upstream's private state only through a hook."""
    patch = scratch.patches_dir / "release-independent-two-phase.patch"
    text = patch.read_text()
    hook_call = "+            self._record_weight_version(result.weight_version)\n"
    assert text.count(hook_call) == 1
    patch.write_text(
        text.replace(
            hook_call,
            "+            self._update_weight_version_if_provided(result.weight_version)\n",
        )
    )
    proc = run_check(scratch)
    assert proc.returncode == 1
    assert (
        "reads self._update_weight_version_if_provided, which neither "
        "TokenizerTwoPhaseUpdateHooksProtocol nor TokenizerMembers declares"
    ) in proc.stderr


def test_hooks_lacking_a_declared_method_or_a_private_member_are_named(
    scratch, tmp_path
):
    seams.seam_files_of(scratch, tmp_path)
    assert seams.check_tree(tmp_path, "here") == []
    hooks = tmp_path / seams.Side("scheduler").hooks_file
    hooks.write_text(hooks.read_text().replace("def _staged_models(", "def _models("))
    protocols = tmp_path / seams.PROTOCOLS
    protocols.write_text(
        protocols.read_text().replace("    tp_worker: Any\n", "    _tp_worker: Any\n")
    )
    problems = seams.check_tree(tmp_path, "here")
    assert (
        "here: python/sglang/srt/managers/scheduler_two_phase_update_hooks.py: "
        "SchedulerTwoPhaseUpdateHooks lacks _staged_models, which "
        "SchedulerTwoPhaseUpdateHooksProtocol declares"
    ) in problems
    assert any("SchedulerMembers._tp_worker is private" in p for p in problems)
    assert any("reads self.tp_worker, which neither" in p for p in problems)


def test_a_shared_module_reading_another_object_s_private_state_is_named(scratch):
    module = scratch.common_dir / "python/sglang/srt/weight_sync/digest.py"
    module.write_text(
        module.read_text() + "\n\ndef peek(server):\n    return server._state\n"
    )
    problems = seams.check_shared_modules(scratch)
    assert len(problems) == 1 and "digest.py" in problems[0]
    assert "reads another object's private _state" in problems[0]


def test_the_seam_is_checked_on_every_release_a_pin_serves(monkeypatch):
    """Each release's hooks are built from its own ports."""
    checked = []

    def check_tree(tree: Path, label: str) -> list[str]:
        hooks = (tree / seams.Side("tokenizer").hooks_file).read_text()
        checked.append((label, "def _record_weight_version(" in hooks))
        return []

    monkeypatch.setattr(seams, "check_tree", check_tree)
    for pin in series.pin_versions(ROOT):
        checked.clear()
        assert seams.check_series(series.Layout(ROOT, pin)) == []
        served = [pin, *releases.adjusted(ROOT, pin)]
        assert checked == [(label, True) for label in served]
