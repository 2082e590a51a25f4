"""The server smoke of a release a pin's series serves (`make smoke
RELEASE=<version>`; the Makefile's SMOKE_TESTS): the release's pristine wheel
with its series applied (build/<release>/smoke/python), run by the serving
pin's test environment in place of the pin's forked wheel; the result is kept
per release in pins/release-smokes, which the README's table of releases is
generated from.

Standard library only, as the rest of devtools.
"""

from __future__ import annotations

import datetime
import shutil
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path

from devtools.series import (
    Layout,
    apply_patches,
    ensure_upstream,
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
    note: str  # the environment it ran in, what failed


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


def read_smokes(root: Path) -> dict[str, Smoke]:
    path = root / SMOKES_FILE
    out: dict[str, Smoke] = {}
    for line in path.read_text().splitlines() if path.is_file() else []:
        if not line.strip() or line.startswith("#"):
            continue
        release, date, result, counts, note = (line.split(None, 4) + [""])[:5]
        out[release] = Smoke(release, date, result, counts, note)
    return out


def record(root: Path, release: str, junit: Path, environment: str) -> Smoke:
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
        note += f"; failed: {', '.join(failed)}"
    if skipped:
        note += f"; {skipped} skipped"
    smoke = Smoke(
        release, datetime.date.today().isoformat(), result, f"{passed}/{run}", note
    )
    smokes = read_smokes(root)
    smokes[release] = smoke
    header = (
        "# `make smoke RELEASE=<release>` keeps one line per release:\n"
        "# release  date  pass|fail  passed/run  where it ran, what failed\n"
    )
    lines = [
        f"{s.release} {s.date} {s.result} {s.counts} {s.note}\n"
        for s in sorted(smokes.values(), key=lambda s: version_key(s.release))
    ]
    (root / SMOKES_FILE).write_text(header + "".join(lines))
    return smoke
