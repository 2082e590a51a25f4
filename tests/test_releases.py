"""The release map (pins/releases): every release from the oldest pin on,
and the series that serves it. A release served as it is takes `make apply`
and `make revert` on its own wheel (fetched from the package index, its
sha256 checked), byte for byte; a release no series serves is refused,
saying where the nearest series stops. No server starts here."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from devtools import matrix, ports, releases, restamp, series, smoke
from devtools.pin import fetch_archive

ROOT = Path(__file__).resolve().parents[1]
SERVED = [r for r in releases.read_releases(ROOT).values() if r.how in releases.SERVED]

pytestmark = pytest.mark.release_independent


def make(target: str, tree: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["make", "-s", target, f"SGLANG_DIR={tree}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )


def files_of(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def layout_of(release: releases.Release) -> series.Layout:
    return series.Layout(ROOT, release.series, release.version)


def test_the_map_lists_every_pin_in_order():
    listed = releases.read_releases(ROOT)
    for version in series.pin_versions(ROOT):
        assert listed[version].how == "pin" and listed[version].series == version
    versions = list(listed)
    assert versions == sorted(versions, key=series.version_key)
    assert versions[0] == series.pin_versions(ROOT)[0]
    for release in listed.values():
        if release.how in releases.SERVED:
            assert release.version in series.Layout(ROOT, release.series).pin().serves


def test_make_runs_the_tests_of_every_pin_and_nothing_else():
    # pins/ holds the release map beside the pins: make test must not take it
    # for a pin (it did, and CI failed after both pins had passed).
    shown = subprocess.run(
        ["make", "-s", "help"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    line = next(l for l in shown.splitlines() if l.startswith("make test PIN="))
    listed = line[line.rindex("(") + 1 : line.rindex(")")].split()
    assert listed == series.pin_versions(ROOT)


@pytest.mark.skipif(not SERVED, reason="no release is served")
def smoke_plan(release: str) -> str:
    """What `make smoke RELEASE=<release>` would run (make -n)."""
    return subprocess.run(
        ["make", "-n", "smoke", f"RELEASE={release}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    ).stdout


def test_a_release_s_smoke_installs_its_pin_s_wheels():
    """`make smoke RELEASE=<release>` runs in the serving pin's environment
    with that pin's wheels installed (a clean checkout has no other)."""
    release = next((r for r in SERVED if r.series != r.version), SERVED[0])
    plan = smoke_plan(release.version)
    assert f"install RELEASE= PIN={release.series}" in plan, plan
    assert "smoke-pins) &&" in plan and "--no-deps --target $tree $own" in plan


def test_a_release_s_smoke_takes_its_own_transformers():
    """0.5.19 registers a transformers config that 0.5.23's transformers
    already has: its smoke installs the version 0.5.19 pins into its tree."""
    found = {r.version: r for r in SERVED}
    if "0.5.19" not in found:
        pytest.skip("0.5.19 is not served")
    assert sorted(smoke.release_pins(layout_of(found["0.5.19"]))) == [
        "tokenizers==0.22.2",
        "transformers==5.12.1",
    ]


def test_a_smoke_tree_gets_what_its_own_transformers_needs(tmp_path):
    """0.5.16 pins transformers 5.12.1 but not tokenizers, and the serving
    environment's tokenizers is too new for it: the smoke installs into the
    tree what the pinned packages there require of the others (not a
    requirement behind an extra, and nothing the tree already has)."""
    meta = tmp_path / "transformers-5.12.1.dist-info" / "METADATA"
    meta.parent.mkdir()
    meta.write_text(
        "Name: transformers\nVersion: 5.12.1\n"
        "Requires-Dist: huggingface-hub<2.0,>=1.3.0\n"
        "Requires-Dist: tokenizers<=0.23.0,>=0.22.0\n"
        'Requires-Dist: tokenizers>=0.21; extra == "dev"\n'
    )
    assert smoke.requirements_of_own_pins(tmp_path) == ["tokenizers<=0.23.0,>=0.22.0"]
    (tmp_path / "tokenizers-0.22.2.dist-info").mkdir()
    (tmp_path / "tokenizers-0.22.2.dist-info" / "METADATA").write_text("")
    assert smoke.requirements_of_own_pins(tmp_path) == []
    plan = smoke_plan(SERVED[-1].version)
    assert "smoke-pins --needed-in $tree" in plan, plan


@pytest.mark.parametrize("release", SERVED, ids=[r.version for r in SERVED])
def test_a_served_release_takes_apply_and_revert_and_its_imports_resolve(
    release, tmp_path
):
    """The drift check of every release a series serves, without servers: its
    own wheel (sha256 checked) takes `make apply` and `make revert`, every
    file its series writes compiles and every sglang import in them resolves
    on that release."""
    layout = layout_of(release)
    site = tmp_path / "site-packages"
    with zipfile.ZipFile(fetch_archive(layout.pin())) as wheel:
        wheel.extractall(site)
    before = files_of(site)
    proc = make("apply", site)
    assert proc.returncode == 0, proc.stderr
    assert f"applied {len(layout.patches())} patches" in proc.stdout
    assert (site / "sglang" / "srt" / "weight_sync" / "session_shares.py").is_file()
    generated = site / "sglang" / "srt" / "weight_sync" / "_series.py"
    assert f'"version": "{release.version}"' in generated.read_text()
    back = make("revert", site)
    assert back.returncode == 0, back.stderr
    assert files_of(site) == before
    assert ports.check_release(layout) == []


def test_a_release_no_series_serves_is_refused_saying_where_it_stops(
    upstream_tree, tmp_path
):
    """A release the map lists with no series (a new one, before its port)
    is refused with the map's note, and nothing is written. Every release
    on the index is served today, so the map here is this one plus such a
    release."""
    root = tmp_path / "rlsync"
    (root / "pins").mkdir(parents=True)
    for pin in series.pin_versions(ROOT):
        (root / "pins" / pin).symlink_to(ROOT / "pins" / pin)
    note = "0.5.23's stops at 0002 (two-phase)"
    (root / releases.RELEASES_FILE).write_text(
        (ROOT / releases.RELEASES_FILE).read_text()
        + f"0.5.99         -       none   {note}\n"
    )
    site = tmp_path / "site-packages"
    shutil.copytree(upstream_tree / "python" / "sglang", site / "sglang")
    (site / "sglang" / "_version.py").unlink()
    info = site / "sglang-0.5.99.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.4\nName: sglang\nVersion: 0.5.99\n"
    )
    before = files_of(site)
    proc = subprocess.run(
        [sys.executable, "-m", "devtools", "--root", str(root), "apply", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode != 0
    assert "SGLang 0.5.99 found, which no series serves yet" in proc.stderr
    assert note in proc.stderr
    assert files_of(site) == before


SHA = "0" * 64


@pytest.mark.parametrize(
    "line,error",
    [
        (f"0.5.11 0.5.10 as-is not-a-sha", "0.5.11: as-is needs the wheel's sha256"),
        (f"0.5.11 0.5.10 as-is {SHA}", "0.5.11: as-is needs the wheel's sha256"),
        (
            f"0.5.11 0.5.10 adjusted {SHA} sglang-0.5.12-py3-none-any.whl",
            "0.5.11: adjusted needs the wheel's sha256 and file name",
        ),
        (
            f"0.5.11 0.5.10 as-is {SHA} sglang-0.5.11-x.whl",
            "0.5.11: as-is needs the wheel's sha256 and file name",
        ),
        (
            f"0.5.11 0.5.99 as-is {SHA} sglang-0.5.11-py3-none-any.whl",
            "0.5.11: no pin 0.5.99",
        ),
        ("0.5.17 0.5.17 pin", "0.5.17: no pin 0.5.17"),
        ("0.5.11 - adjusted x", "0.5.11: series '-' goes with none"),
        ("0.5.10 0.5.10 pin", "0.5.10 listed twice"),
    ],
)
def test_a_malformed_map_is_refused_naming_the_line(tmp_path, line, error):
    (tmp_path / "pins" / "0.5.10").mkdir(parents=True)
    (tmp_path / "pins" / "0.5.10" / "upstream.pin").write_text("")
    (tmp_path / releases.RELEASES_FILE).write_text(f"0.5.10 0.5.10 pin\n{line}\n")
    with pytest.raises(releases.PinError, match=re.escape(f"releases:2: {error}")):
        releases.read_releases(tmp_path)


def test_every_pin_is_in_the_map_as_one(tmp_path):
    root = copy_of_pins(tmp_path)
    text = (root / releases.RELEASES_FILE).read_text()
    (root / releases.RELEASES_FILE).write_text(
        "\n".join(l for l in text.splitlines() if not l.startswith("0.5.23 "))
    )
    assert releases.check_map(root, series.pin_versions(root)) == [
        f"{releases.RELEASES_FILE}: pin 0.5.23 is not listed as a pin"
    ]


def test_apply_with_a_pin_named_takes_the_ports_of_the_release(tmp_path):
    """`make apply PIN=<pin>` on a tree of another release that pin serves
    takes that release's series (its ports), as without PIN."""
    from devtools.__main__ import _layout_for_tree, build_parser

    for release in SERVED:
        tree = tmp_path / release.version
        info = tree / f"sglang-{release.version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Name: sglang\nVersion: {release.version}\n")
        (tree / "sglang" / "srt").mkdir(parents=True)
        (tree / "sglang" / "__init__.py").write_text("")
        for pin in (None, release.series):
            args = build_parser().parse_args(
                [*(["--pin", pin] if pin else []), "apply", str(tree)]
            )
            layout = _layout_for_tree(args, tree)
            assert (layout.version, layout.release) == (release.series, release.version)
            assert layout.patches() == layout_of(release).patches()


ADJUSTED = [r for r in SERVED if r.how == "adjusted"]


def port_files(release: releases.Release) -> list[Path]:
    return sorted(layout_of(release).adjustments_dir.glob("*.patch"))


def copy_of_pins(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    shutil.copytree(ROOT / "pins", root / "pins")
    return root


@pytest.mark.skipif(not ADJUSTED, reason="no release is served with ports")
def test_a_port_made_from_another_version_of_its_patch_is_named(tmp_path):
    """A fix to a pin's patch must reach every port of it: `make check` names
    each port made from the old version, and how to make it again."""
    release = ADJUSTED[0]
    root = copy_of_pins(tmp_path)
    pin = series.Layout(root, release.series)
    assert ports.check_ports(pin) == []
    port = sorted(
        series.Layout(root, release.series, release.version).adjustments_dir.glob(
            "*.patch"
        )
    )[0]
    fixed = pin.patches_dir / port.name
    fixed.write_text(
        fixed.read_text().replace("\nForwarded:", "\nA fix.\n\nForwarded:", 1)
    )
    problems = ports.check_ports(pin)
    assert all("ported from another version of" in p for p in problems), problems
    [problem] = [p for p in problems if f"/releases/{release.version}/" in p]
    assert problem.startswith(
        f"pins/{release.series}/releases/{release.version}/{port.name}: ported from "
        f"another version of pins/{release.series}/patches/{port.name}"
    )
    assert f"make port RELEASE={release.version}" in problem


def committed_pins_of_most_ported_release(
    tmp_path: Path,
) -> tuple[releases.Release, series.Layout, Path]:
    """pins/ copied into a git repository and committed (restamp starts from
    the committed ports); the release with the most ports, its pin and its
    ports' folder."""
    release = max(ADJUSTED, key=lambda r: len(port_files(r)))
    root = copy_of_pins(tmp_path)
    series.git(root, "init", "-q")
    series.git(root, "add", "-A")
    series.git(root, "commit", "-qm", "pins", env=series.IDENTITY)
    pin = series.Layout(root, release.series)
    folder = series.Layout(root, release.series, release.version).adjustments_dir
    return release, pin, folder


@pytest.mark.skipif(not ADJUSTED, reason="no release is served with ports")
def test_a_pin_patch_renamed_or_reworded_reaches_its_ports_by_restamp(tmp_path):
    """Renaming a pin patch (its `Depends:` lines with it) or rewording it
    changes no code: `make port-restamp` gives each port the new name and
    message and stamps it, its diffs kept byte for byte. A port whose pin
    patch changed its diffs stays stale and is named."""
    release, pin, folder = committed_pins_of_most_ported_release(tmp_path)
    same_message = [
        p
        for p in sorted(folder.glob("*.patch"))
        if series.patch_message(p) == series.patch_message(pin.patches_dir / p.name)
    ]
    renamed = same_message[0]
    changed = next(p for p in sorted(folder.glob("*.patch")) if p != renamed)
    kept = renamed.read_text()
    old_stem, new_stem = renamed.stem, "renamed-for-this-test"
    for patch in pin.patches_dir.glob("*.patch"):
        patch.write_text(
            patch.read_text().replace(
                f"Depends: {old_stem}\n", f"Depends: {new_stem}\n"
            )
        )
    text = (pin.patches_dir / renamed.name).read_text()
    (pin.patches_dir / renamed.name).unlink()
    (pin.patches_dir / f"{new_stem}.patch").write_text(
        text.replace("\nForwarded:", "\nReworded.\n\nForwarded:", 1)
    )
    pin.series_file.write_text(
        pin.series_file.read_text().replace(renamed.name, f"{new_stem}.patch")
    )
    edited = pin.patches_dir / changed.name
    edited.write_text(edited.read_text().replace("\n+", "\n+ ", 1))
    assert ports.check_ports(pin) != []

    done = restamp.restamp(pin)

    assert f"{release.version}/{changed.name}: its pin patch's changes differ" in (
        "\n".join(done.left_stale)
    )
    assert all(changed.name in line for line in done.left_stale), done.left_stale
    problems = ports.check_ports(pin)
    assert problems and all(changed.name in p for p in problems), problems
    assert not renamed.exists()
    port = folder / f"{new_stem}.patch"
    assert smoke.patch_changes(port.read_text()) == smoke.patch_changes(kept)
    assert "\nReworded.\n" in series.patch_message(port)
    every_port = "".join(p.read_text() for p in pin.pin_dir.glob("releases/*/*.patch"))
    assert f"Depends: {old_stem}\n" not in every_port
    assert restamp.restamp(pin).written == []  # done once is done


def test_a_pin_patch_whose_index_lines_and_hunks_moved_keeps_its_ports(tmp_path):
    """An earlier patch that changes the same file moves a later patch's
    `index` lines and hunk positions although none of its lines changed:
    restamp carries its ports (made against their release's own files),
    diffs kept; a changed line still leaves them stale (test above)."""
    release, pin, folder = committed_pins_of_most_ported_release(tmp_path)
    port = sorted(folder.glob("*.patch"))[0]
    kept = port.read_text()
    moved = pin.patches_dir / port.name
    text = re.sub(
        r"^index [0-9a-f]+\.\.([0-9a-f]+)",
        lambda m: f"index {'0' * 40}..{m.group(1)}",
        moved.read_text(),
        flags=re.M,
    )
    text = re.sub(
        r"^@@ -(\d+)(,\d+)? \+(\d+)",
        lambda m: f"@@ -{int(m.group(1)) + 3}{m.group(2) or ''} +{int(m.group(3)) + 3}",
        text,
        flags=re.M,
    )
    assert text != moved.read_text()
    moved.write_text(text)
    assert ports.check_ports(pin) != []

    done = restamp.restamp(pin)

    assert done.left_stale == [] and ports.check_ports(pin) == []
    assert port.read_text() == kept.replace(
        series.patch_message(port), series.patch_message(moved)
    )


def rename_pin_patches(pin: series.Layout, renames: dict[str, str]) -> None:
    """Rename pin patches at once (stems): files, series, `Depends:` lines."""
    texts = {p.name: p.read_text() for p in pin.patches_dir.glob("*.patch")}
    for path in pin.patches_dir.glob("*.patch"):
        path.unlink()
    for name, text in texts.items():
        text = re.sub(
            r"^Depends: (\S+)$",
            lambda m: f"Depends: {renames.get(m.group(1), m.group(1))}",
            text,
            flags=re.M,
        )
        stem = name.removesuffix(".patch")
        (pin.patches_dir / f"{renames.get(stem, stem)}.patch").write_text(text)
    pin.series_file.write_text(
        "".join(
            f"{renames.get(line[:-6], line[:-6])}.patch\n"
            for line in pin.series_file.read_text().split()
        )
    )


@pytest.mark.skipif(not ADJUSTED, reason="no release is served with ports")
def test_restamp_takes_a_swap_of_two_names_and_a_second_rewording(tmp_path):
    """Two pin patches swap names: each port follows its own diffs, none is
    lost or stamped with the other's pin patch. A second rewording before
    any commit is carried too (restamp starts from the committed ports)."""
    release, pin, folder = committed_pins_of_most_ported_release(tmp_path)
    first, second = [
        p.stem
        for p in sorted(folder.glob("*.patch"))
        if series.patch_message(p) == series.patch_message(pin.patches_dir / p.name)
    ][:2]
    diffs = {
        n: smoke.patch_changes((folder / f"{n}.patch").read_text())
        for n in (first, second)
    }
    rename_pin_patches(pin, {first: second, second: first})

    done = restamp.restamp(pin)

    assert done.left_stale == []
    assert smoke.patch_changes((folder / f"{second}.patch").read_text()) == diffs[first]
    assert smoke.patch_changes((folder / f"{first}.patch").read_text()) == diffs[second]
    assert ports.check_ports(pin) == []
    for time in ("once", "twice"):
        reworded = pin.patches_dir / f"{second}.patch"
        text = re.sub(
            r"\n(Reworded \w+\.\n\n)?Forwarded:",
            "\nForwarded:",
            reworded.read_text(),
            count=1,
        )
        reworded.write_text(
            text.replace("\nForwarded:", f"\nReworded {time}.\n\nForwarded:", 1)
        )
        restamp.restamp(pin)
    assert ports.check_ports(pin) == []
    assert "Reworded twice." in (folder / f"{second}.patch").read_text()


@pytest.mark.skipif(not ADJUSTED, reason="no release is served with ports")
def test_ports_must_be_where_the_map_says_and_nowhere_else(tmp_path):
    release = ADJUSTED[0]
    root = copy_of_pins(tmp_path)
    pin = series.Layout(root, release.series)
    shutil.rmtree(series.Layout(root, release.series, release.version).adjustments_dir)
    stray = pin.pin_dir / "releases" / "9.9.9"
    stray.mkdir()
    problems = ports.check_ports(pin)
    assert problems == [
        f"{stray}: pins/releases does not map 9.9.9 to {release.series} adjusted",
        f"pins/{release.series}/releases/{release.version}: missing (pins/releases "
        f"maps {release.version} adjusted: run `make port RELEASE={release.version}` "
        "and `make port-export`)",
    ]


def test_a_smoke_result_is_kept_per_release_and_shown_in_the_table(tmp_path):
    root = copy_of_pins(tmp_path)
    begin, end = matrix.BEGIN, matrix.END
    page = root / matrix.TABLE_FILE
    page.parent.mkdir(parents=True)
    page.write_text(f"# x\n\n{begin}{end}\nafter\n")
    release = SERVED[0].version
    junit = tmp_path / "smoke.xml"
    junit.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="t" name="test_sync[a]"/>'
        '<testcase classname="t" name="test_sync[b]"><failure message="x"/></testcase>'
        '<testcase classname="t" name="test_health"/>'
        "</testsuite></testsuites>"
    )
    ran = series.Layout(root, SERVED[0].series, release)
    done = smoke.record(ran, junit, "0.5.x's test environment")
    assert (done.result, done.counts) == ("fail", "2/3")
    assert done.note == "in 0.5.x's test environment; failed: test_sync[b]"
    assert matrix.check_table(root) == [
        "docs/support-matrix.md: the table of releases is stale: `make support-matrix`"
    ]
    assert matrix.write_table(root)
    assert matrix.check_table(root) == []
    table = page.read_text()
    assert f"| {release} | " in table
    assert (
        f"fail 2/3, {done.date}, in 0.5.x's test environment; failed: test_sync[b] |"
        in table
    )
    assert table.endswith(f"{end}\nafter\n")
    assert smoke.read_smokes(root)[release] == done
    # A smoke says what it ran: a reworded message changes no tree, so the
    # smoke stands; once a change does, the table says so.
    patch = ran.patches()[0]
    text = patch.read_text()
    header, diffs = text.split("diff --git ", 1)
    patch.write_text(
        header.replace("Subject: ", "Subject: reworded: ", 1)
        + "\nMore words for a reviewer.\n\ndiff --git "
        + diffs
    )
    matrix.write_table(root)
    (row,) = [
        l for l in page.read_text().splitlines() if l.startswith(f"| {release} |")
    ]
    assert "stale" not in row and "fail 2/3" in row
    patch.write_text(patch.read_text() + "\n")
    matrix.write_table(root)
    assert f"| stale: the series changed since (fail 2/3, {done.date}" in (
        page.read_text()
    )
    # A smoke of a release no series serves, a second table: named.
    with open(root / releases.RELEASES_FILE, "a") as f:
        f.write("0.5.99  -  none  no series yet\n")
    matrix.write_table(root)
    with open(root / smoke.SMOKES_FILE, "a") as f:
        f.write("0.5.99 2026-01-01 pass 8/8 series=abc in x\n")
    page.write_text(page.read_text() + begin + end)
    assert matrix.check_table(root) == [
        f"{smoke.SMOKES_FILE}: 0.5.99 is no release a series serves",
        "docs/support-matrix.md: one generated table of releases, not several",
    ]


def test_the_table_of_releases_lives_in_the_support_matrix_page_alone(tmp_path):
    """The generated table is in docs/support-matrix.md and nowhere else: a
    copy left in the README (where it used to be) or in another page is
    named, and a page without the table says which markers it lacks."""
    root = copy_of_pins(tmp_path)
    (root / "docs").mkdir()
    (root / matrix.TABLE_FILE).write_text(
        f"# Support matrix\n\n{matrix.BEGIN}{matrix.END}"
    )
    matrix.write_table(root)
    assert matrix.check_table(root) == []
    (root / "README.md").write_text(f"# rlsync\n\n{matrix.BEGIN}{matrix.END}")
    (root / "docs" / "other.md").write_text(f"{matrix.BEGIN}| old |\n{matrix.END}")
    assert matrix.check_table(root) == [
        "README.md: holds a generated table of releases; the one table is in "
        "docs/support-matrix.md",
        "docs/other.md: holds a generated table of releases; the one table is in "
        "docs/support-matrix.md",
    ]
    (root / matrix.TABLE_FILE).write_text("# Support matrix\n")
    assert matrix.check_table(root)[0] == (
        f"docs/support-matrix.md: no generated table of releases ({matrix.BEGIN.strip()})"
    )
    with pytest.raises(series.SeriesError, match="docs/support-matrix.md: no "):
        matrix.write_table(root)


def test_the_repository_has_its_table_of_releases_current_and_in_one_place():
    """What `make check` runs on this checkout: the table in
    docs/support-matrix.md matches pins/releases and pins/release-smokes."""
    assert matrix.check_table(ROOT) == []


def test_a_port_is_made_again_from_a_pin_patch_that_changed(tmp_path):
    """`make port` merges a changed pin patch into the release again (its
    port was made from the old one), and keeps the ports still current."""
    release = ADJUSTED[0]
    root = copy_of_pins(tmp_path)
    layout = series.Layout(root, release.series, release.version)
    ported = sorted(layout.adjustments_dir.glob("*.patch"))
    assert ports.current_ports(layout) == layout.patches()
    fixed = layout.patches_dir / ported[0].name
    fixed.write_text(
        fixed.read_text().replace("\nForwarded:", "\nA fix.\n\nForwarded:", 1)
    )
    current = ports.current_ports(layout)
    assert fixed in current and ported[0] not in current
    assert [p for p in ported[1:] if p not in current] == []


@pytest.mark.skipif(not ADJUSTED, reason="no release is served with ports")
def test_make_wheel_takes_a_release_a_series_serves(tmp_path):
    """`make wheel RELEASE=<release>`: the release's own wheel with its series
    (ports included), repacked as `<release>+rlsync.<series>`."""
    release = ADJUSTED[-1]
    layout = layout_of(release)
    proc = subprocess.run(
        ["make", "-s", "wheel", f"RELEASE={release.version}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    pin = layout.pin()
    tags = pin.wheel.removesuffix(".whl").split("-", 2)[2]
    path = ROOT / "dist" / f"sglang-{pin.local_version}-{tags}.whl"
    assert str(path.relative_to(ROOT)) in proc.stdout
    built = tmp_path / "built"
    files = series.patched_tree(layout, built)
    with zipfile.ZipFile(path) as wheel:
        meta = wheel.read(f"sglang-{pin.local_version}.dist-info/METADATA").decode()
        assert f"Version: {pin.local_version}\n" in meta
        for rel in files:
            inner = Path(rel).relative_to("python").as_posix()
            assert wheel.read(inner) == (built / rel).read_bytes(), inner
        assert wheel.testzip() is None


def test_a_port_started_from_a_nearer_release_takes_its_ports_where_it_has_none(
    tmp_path,
):
    """`make port RELEASE=<r> FROM=<nearer>`: the release's own current
    ports first, then the nearer release's, then the pin's patches; FROM must
    be another release of the same pin with a finished port worktree."""
    same_pin = [r for r in ADJUSTED if r.series == ADJUSTED[0].series]
    if len(same_pin) < 2:
        pytest.skip("fewer than two releases of one pin are served with ports")
    root = copy_of_pins(tmp_path)
    near, far = (series.Layout(root, r.series, r.version) for r in same_pin[:2])
    own = sorted(far.adjustments_dir.glob("*.patch"))
    kept = own[0].read_text()
    shutil.rmtree(far.adjustments_dir)
    assert ports.current_ports(far, near) == near.patches()
    far.adjustments_dir.mkdir(parents=True)
    (far.adjustments_dir / own[0].name).write_text(kept)
    pin_patch = far.patches_dir / own[0].name
    (far.adjustments_dir / ports.PORTED_FROM).write_text(
        f"{own[0].name} {ports.sha256_of(pin_patch)}\n"
    )
    expected = [
        far.adjustments_dir / p.name if p.name == own[0].name else p
        for p in near.patches()
    ]
    assert ports.current_ports(far, near) == expected
    with pytest.raises(series.SeriesError, match="the release being ported"):
        ports.make_port_worktree(far, far)
    with pytest.raises(series.SeriesError, match="not a release that"):
        ports.make_port_worktree(far, series.Layout(root, far.version))
    with pytest.raises(
        series.SeriesError, match=f"run `make port RELEASE={near.release}` first"
    ):
        ports._check_start(far, near)


def test_a_port_that_merges_a_call_without_its_import_is_named(tmp_path):
    """A 3-way merge can bring a call into a module whose import line the
    patch does not touch (0.5.20 and 0.5.21 took 0.5.23's data-parallel
    patch so: a NameError at every group join). The drift check names it."""
    from devtools.names import unbound_globals

    source = "from os import path\n\ndef f():\n    return path, get_parallel()\n"
    assert unbound_globals(source) == {"get_parallel"}
    assert unbound_globals("from os import *\n\ndef f():\n    return nope\n") == set()
    bound_late = "def f():\n    global x\n    x = 1\n\nclass C:\n    y = len(x)\n"
    assert unbound_globals(bound_late) == set()
    release, layout = with_the_import_line_of_its_ports(
        tmp_path, "from sglang.srt.runtime_context import get_model"
    )
    assert ports.check_release(layout) == [
        f"{release.version}: python/sglang/srt/managers/scheduler_components/"
        "weight_updater.py: uses get_parallel, which the module neither defines "
        "nor imports"
    ]


def test_a_port_that_does_not_parse_is_named_not_a_traceback(tmp_path):
    """A 3-way merge resolved by keeping both sides can leave a module that
    does not parse: the check names its file and line (the import check of
    the modules importing it goes on), it does not crash."""
    release, layout = with_the_import_line_of_its_ports(
        tmp_path, "from sglang.srt.runtime_context import (get_model, get_parallel"
    )
    problems = ports.check_release(layout)
    assert len(problems) == 1, problems
    assert problems[0].startswith(
        f"{release.version}: python/sglang/srt/managers/scheduler_components/"
        "weight_updater.py:"
    ), problems


IMPORT_LINE = "from sglang.srt.runtime_context import get_model, get_parallel"


def with_the_import_line_of_its_ports(
    tmp_path: Path, replacement: str
) -> tuple[releases.Release, series.Layout]:
    """A copy of the pins where the ports of a release that add IMPORT_LINE
    add `replacement` instead (its pristine wheel fetched once, shared)."""
    release = next((r for r in ADJUSTED if IMPORT_LINE in port_texts(r)), None)
    if release is None:
        pytest.skip("no port adds that import")
    root = copy_of_pins(tmp_path)
    layout = series.Layout(root, release.series, release.version)
    layout.upstream_dir.parent.mkdir(parents=True)
    layout.upstream_dir.symlink_to(series.ensure_upstream(layout_of(release)))
    for port in layout.adjustments_dir.glob("*.patch"):
        text = port.read_text()
        port.write_text(text.replace("+" + IMPORT_LINE, "+" + replacement))
    return release, layout


def port_texts(release: releases.Release) -> str:
    return "".join(
        p.read_text() for p in layout_of(release).adjustments_dir.glob("*.patch")
    )
