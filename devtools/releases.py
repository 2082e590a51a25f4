"""The release map (pins/releases): every SGLang release from the oldest pin
on, and the series that serves it: a pin's own release, a release the pin's
series applies to as it is, or none yet. Data, one file: no code path per
release.

Standard library only, as the rest of devtools.
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from devtools.pin import PinError

RELEASES_FILE = Path("pins") / "releases"
HOWS = ("pin", "as-is", "none")


@dataclass(frozen=True)
class Release:
    version: str
    series: str | None  # the pin whose series serves it
    how: str  # "pin", "as-is" or "none"
    note: str = ""  # as-is: the wheel's sha256; none: where the series stops

    @property
    def wheel_sha256(self) -> str:
        return self.note if self.how == "as-is" else ""


def read_releases(root: Path) -> dict[str, Release]:
    path = root / RELEASES_FILE
    out: dict[str, Release] = {}
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(None, 3)
        if len(parts) < 3 or parts[2] not in HOWS:
            raise PinError(
                f"{path}:{lineno}: expected 'release series how [note]' with how "
                f"one of {', '.join(HOWS)}, got {line!r}"
            )
        version, series, how = parts[:3]
        note = parts[3] if len(parts) > 3 else ""
        if (series == "-") != (how == "none"):
            raise PinError(f"{path}:{lineno}: {version}: series '-' goes with none")
        if how == "as-is" and not re.fullmatch(r"[0-9a-f]{64}", note):
            raise PinError(
                f"{path}:{lineno}: {version}: as-is needs the wheel's sha256"
            )
        if how == "pin" and series != version:
            raise PinError(f"{path}:{lineno}: {version}: a pin serves its own release")
        if version in out:
            raise PinError(f"{path}:{lineno}: {version} listed twice")
        out[version] = Release(version, None if series == "-" else series, how, note)
    return out


def served_by(root: Path, pin_version: str) -> list[str]:
    """The releases `pin_version`'s series serves (its own first)."""
    return [r.version for r in read_releases(root).values() if r.series == pin_version]


def supported(root: Path) -> list[str]:
    """Every release some series serves."""
    return [r.version for r in read_releases(root).values() if r.series]


def index_versions(package: str = "sglang") -> list[str]:
    """The releases the package index has (`pip index versions`)."""
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "index", "versions", package],
        capture_output=True,
        text=True,
        timeout=300,
    )
    match = re.search(r"Available versions: (.*)", proc.stdout)
    if proc.returncode != 0 or match is None:
        raise PinError(f"pip index versions {package} failed: {proc.stderr.strip()}")
    return [v.strip() for v in match.group(1).split(",")]
