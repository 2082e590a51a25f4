"""The release map (pins/releases): every release from the oldest pin on,
and the series that serves it. A release served as it is takes `make apply`
and `make revert` on its own wheel (fetched from the package index, its
sha256 checked), byte for byte; a release no series serves is refused,
saying where the nearest series stops. No server starts here."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from devtools import releases, series

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / "build" / "releases"
AS_IS = [r for r in releases.read_releases(ROOT).values() if r.how == "as-is"]

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


def wheel_of(release: releases.Release) -> Path:
    """The release's wheel, fetched once into build/releases, sha256 checked."""
    CACHE.mkdir(parents=True, exist_ok=True)
    found = list(CACHE.glob(f"sglang-{release.version}-*.whl"))
    if not found:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps"]
            + [f"sglang=={release.version}", "-d", str(CACHE)],
            check=True,
            timeout=600,
        )
        found = list(CACHE.glob(f"sglang-{release.version}-*.whl"))
    wheel = found[0]
    assert hashlib.sha256(wheel.read_bytes()).hexdigest() == release.wheel_sha256
    return wheel


def test_the_map_lists_every_pin_in_order():
    listed = releases.read_releases(ROOT)
    for version in series.pin_versions(ROOT):
        assert listed[version].how == "pin" and listed[version].series == version
    versions = list(listed)
    assert versions == sorted(versions, key=series.version_key)
    assert versions[0] == series.pin_versions(ROOT)[0]
    for release in listed.values():
        if release.how == "as-is":
            assert series.Layout(ROOT, release.series).pin().serves


def test_make_runs_the_tests_of_every_pin_and_nothing_else():
    # pins/ holds the release map beside the pins: make test must not take it
    # for a pin (it did, and CI failed after both pins had passed).
    shown = subprocess.run(
        ["make", "-s", "help"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    line = next(l for l in shown.splitlines() if l.startswith("make test PIN="))
    listed = line[line.rindex("(") + 1 : line.rindex(")")].split()
    assert listed == series.pin_versions(ROOT)


@pytest.mark.parametrize("release", AS_IS, ids=[r.version for r in AS_IS])
def test_a_release_served_as_is_takes_apply_and_revert(release, tmp_path):
    site = tmp_path / "site-packages"
    with zipfile.ZipFile(wheel_of(release)) as wheel:
        wheel.extractall(site)
    before = files_of(site)
    proc = make("apply", site)
    assert proc.returncode == 0, proc.stderr
    assert f"applied {len(series.Layout(ROOT, release.series).patches())}" in (
        proc.stdout
    )
    assert (site / "sglang" / "srt" / "weight_sync" / "session_shares.py").is_file()
    changed = [p for p, data in files_of(site).items() if before.get(p) != data]
    for rel in changed:  # every file the series wrote compiles on the release
        if rel.endswith(".py"):
            compile((site / rel).read_text(), rel, "exec")
    back = make("revert", site)
    assert back.returncode == 0, back.stderr
    assert files_of(site) == before


def test_a_release_no_series_serves_is_refused_saying_where_it_stops(
    upstream_tree, tmp_path
):
    none = [r for r in releases.read_releases(ROOT).values() if r.how == "none"]
    release = none[len(none) // 2]
    site = tmp_path / "site-packages"
    shutil.copytree(upstream_tree / "python" / "sglang", site / "sglang")
    (site / "sglang" / "_version.py").unlink()
    info = site / f"sglang-{release.version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.4\nName: sglang\nVersion: {release.version}\n"
    )
    before = files_of(site)
    proc = make("apply", site)
    assert proc.returncode != 0
    assert f"SGLang {release.version} found, which no series serves yet" in (
        proc.stderr
    )
    assert release.note in proc.stderr
    assert files_of(site) == before


def test_a_malformed_map_is_refused_naming_the_line(tmp_path):
    (tmp_path / "pins").mkdir()
    (tmp_path / releases.RELEASES_FILE).write_text(
        "0.5.10 0.5.10 pin\n0.5.11 0.5.10 as-is not-a-sha\n"
    )
    with pytest.raises(releases.PinError, match="releases:2: 0.5.11: as-is needs"):
        releases.read_releases(tmp_path)
