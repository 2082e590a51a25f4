"""The server smoke of a release a pin's series serves (`make smoke
RELEASE=<version>`; the Makefile's SMOKE_TESTS): the release's pristine wheel
with its series applied (build/<release>/smoke/python), run by the serving
pin's test environment in place of the pin's forked wheel; the result is kept
per release in pins/release-smokes, which the table of releases in
docs/support-matrix.md is generated from.

Standard library only, as the rest of devtools.
"""

from __future__ import annotations

import datetime
import hashlib
import re
import shutil
import xml.etree.ElementTree as ElementTree
import zipfile
from dataclasses import dataclass
from pathlib import Path

from devtools.pin import fetch_archive
from devtools.series import (
    Layout,
    SeriesError,
    apply_patches,
    ensure_upstream,
    placeless_diffs,
    version_key,
    write_generated,
)
from devtools.wheel import version_module

SMOKES_FILE = Path("pins") / "release-smokes"


@dataclass(frozen=True)
class Smoke:
    release: str
    date: str
    result: str  # "pass" or "fail"
    counts: str  # "<passed>/<run>"
    series: str  # series_digest of the series it ran
    note: str  # the environment it ran in, what failed


def series_digest(layout: Layout) -> str:
    """What a smoke ran: the changes of the release's series (ports
    included), in order. Not the patches' file names or messages, nor their
    `index` lines and hunk positions (`placeless_diffs`): renaming a patch,
    rewording its message or changing an earlier patch elsewhere in the same
    file changes no tree a smoke ran on."""
    digest = hashlib.sha256()
    for patch in layout.patches():
        digest.update(placeless_diffs(patch.read_text()).encode())
    return digest.hexdigest()[:12]


def patch_changes(text: str) -> str:
    """A patch file's diffs: from its first line that starts `diff --git` on
    (its header and message dropped), as `series.patch_message` splits it."""
    start = text.find("\ndiff --git ")
    return text[start + 1 :] if start >= 0 else ""


def smoke_tree(layout: Layout) -> Path:
    """build/<release>/smoke/python: the release's pristine tree, its series
    applied to it, the generated modules written."""
    pristine = ensure_upstream(layout)
    dest = layout.build_dir / "smoke"
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(pristine / "python", dest / "python", symlinks=True)
    apply_patches(dest, layout.patches())
    write_generated(layout, dest)
    # As the forked wheel (`make wheel RELEASE=...`) has it.
    version = dest / "python" / "sglang" / "_version.py"
    version.write_text(version_module(layout.pin().local_version))
    return dest / "python"


# Packages a release pins that the serving pin's environment may have at
# another version which that release cannot start with (0.5.19 registers a
# transformers config that transformers 5.19 already has; its transformers
# then wants its own tokenizers): the smoke installs the release's own
# versions into its tree, ahead of the environment's on the server's path.
OWN_PINS = ("tokenizers", "transformers")


def _project(name: str) -> str:
    """A distribution's name as OWN_PINS spells it."""
    return name.lower().replace("_", "-")


def release_pins(layout: Layout) -> list[str]:
    """`name==version` of each OWN_PINS package the release's wheel requires
    at an exact version (its METADATA's Requires-Dist, without markers)."""
    with zipfile.ZipFile(fetch_archive(layout.pin())) as wheel:
        name = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = wheel.read(name).decode("utf-8", "replace")
    pins = []
    for line in metadata.splitlines():
        m = re.match(r"Requires-Dist: ([A-Za-z0-9_.-]+)\s*==\s*([^\s;,]+)$", line)
        if m and _project(m.group(1)) in OWN_PINS:
            pins.append(f"{m.group(1)}=={m.group(2)}")
    return pins


def requirements_of_own_pins(tree: Path) -> list[str]:
    """What the OWN_PINS packages installed in `tree` require of the other
    OWN_PINS packages that the tree does not have (0.5.16 pins transformers
    5.12.1 but not the tokenizers it needs): each a requirement to install
    there too, so that the environment's own version is not used."""
    installed = {}
    for dist_info in tree.glob("*.dist-info"):
        name = _project(dist_info.name.split("-")[0])
        if name in OWN_PINS:
            installed[name] = dist_info / "METADATA"
    needed = []
    for metadata in installed.values():
        for line in metadata.read_text(errors="replace").splitlines():
            m = re.match(r"Requires-Dist: ([A-Za-z0-9_.-]+)\s*([^;]*)$", line)
            if not m:
                continue  # none, or one with a marker (an extra)
            name = _project(m.group(1))
            if name in OWN_PINS and name not in installed:
                needed.append(f"{name}{m.group(2).strip()}")
    return sorted(set(needed))


def read_smokes(root: Path) -> dict[str, Smoke]:
    path = root / SMOKES_FILE
    out: dict[str, Smoke] = {}
    text = path.read_text(errors="replace") if path.is_file() else ""
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        parts = line.split(None, 5)
        if len(parts) < 5 or parts[2] not in ("pass", "fail"):
            raise SeriesError(
                f"{path}:{lineno}: expected 'release date pass|fail passed/run "
                f"series=<digest> note', got {line!r}"
            )
        release, date, result, counts, series = parts[:5]
        note = parts[5] if len(parts) > 5 else ""
        out[release] = Smoke(
            release, date, result, counts, series.removeprefix("series="), note
        )
    return out


def record(layout: Layout, junit: Path, environment: str) -> Smoke:
    """Keep the smoke's outcome (pytest's JUnit XML) as the release's line."""
    suite = ElementTree.parse(junit).getroot()
    cases = suite.iter("testcase")
    failed, skipped, run = [], 0, 0
    for case in cases:
        run += 1
        if case.find("failure") is not None or case.find("error") is not None:
            failed.append(case.get("name", "?"))
        elif case.find("skipped") is not None:
            skipped += 1
    passed = run - len(failed) - skipped
    result = "pass" if run and not failed and not skipped else "fail"
    note = f"in {environment}"
    if failed:
        more = f" and {len(failed) - 3} more" if len(failed) > 3 else ""
        note += f"; failed: {', '.join(failed[:3])}{more}"
    if skipped:
        note += f"; {skipped} skipped"
    root, release = layout.root, layout.release
    today = datetime.date.today().isoformat()
    smoke = Smoke(
        release, today, result, f"{passed}/{run}", series_digest(layout), note
    )
    smokes = read_smokes(root)
    smokes[release] = smoke
    header = (
        "# `make smoke RELEASE=<release>` keeps one line per release:\n"
        "# release  date  pass|fail  passed/run  series=<its content>  where it "
        "ran, what failed\n"
    )
    lines = [
        f"{s.release} {s.date} {s.result} {s.counts} series={s.series} {s.note}\n"
        for s in sorted(smokes.values(), key=lambda s: version_key(s.release))
    ]
    (root / SMOKES_FILE).write_text(header + "".join(lines))
    return smoke
