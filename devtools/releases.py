"""The release map (pins/releases): every SGLang release from the oldest pin
on, and the series that serves it: a pin's own release, a release the pin's
series applies to as it is, one it applies to with recorded adjustments
(pins/<pin>/releases/<release>/: the ports of the patches that need one), or
none yet. Data: no code path per release.

Standard library only, as the rest of devtools.
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from devtools.pin import Pin, PinError

RELEASES_FILE = Path("pins") / "releases"
HOWS = ("pin", "as-is", "adjusted", "none")
SERVED = ("as-is", "adjusted")  # another release a pin's series serves


@dataclass(frozen=True)
class Release:
    version: str
    series: str | None  # the pin whose series serves it
    how: str  # "pin", "as-is" or "none"
    note: str = ""  # served: "<wheel sha256> <wheel file>"; none: where it stops

    @property
    def wheel_sha256(self) -> str:
        return self.note.split()[0] if self.how in SERVED else ""

    @property
    def wheel(self) -> str:
        return self.note.split()[1] if self.how in SERVED else ""

    def pin(self, name: str, series: int) -> Pin:
        """The release as a pin of its own (its wheel, the serving pin's
        series number): what fetching, unpacking and repacking it take."""
        return Pin(name, self.version, "", self.wheel_sha256, series, self.wheel)


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
        wheel = re.fullmatch(
            rf"[0-9a-f]{{64}} sglang-{re.escape(version)}-[^-\s]+-[^-\s]+-[^-\s]+\.whl",
            note,
        )
        if series != "-" and not (root / "pins" / series / "upstream.pin").is_file():
            raise PinError(
                f"{path}:{lineno}: {version}: no pin {series} (pins/{series}/upstream.pin)"
            )
        if how in SERVED and not wheel:
            raise PinError(
                f"{path}:{lineno}: {version}: {how} needs the wheel's sha256 and "
                f"file name (sglang-{version}-<tags>.whl)"
            )
        if how == "pin" and series != version:
            raise PinError(f"{path}:{lineno}: {version}: a pin serves its own release")
        if version in out:
            raise PinError(f"{path}:{lineno}: {version} listed twice")
        out[version] = Release(version, None if series == "-" else series, how, note)
    return out


def check_map(root: Path, pins: list[str]) -> list[str]:
    """Every pin is listed as one, and nothing else is."""
    listed = read_releases(root)
    problems = [
        f"{RELEASES_FILE}: pin {v} is not listed as a pin"
        for v in pins
        if v not in listed or listed[v].how != "pin"
    ]
    return problems


def served_by(root: Path, pin_version: str) -> list[str]:
    """The releases `pin_version`'s series serves (its own first)."""
    return [r.version for r in read_releases(root).values() if r.series == pin_version]


def adjusted(root: Path, pin_version: str) -> list[str]:
    """The releases `pin_version`'s series serves with adjustments."""
    return [
        r.version
        for r in read_releases(root).values()
        if r.series == pin_version and r.how == "adjusted"
    ]


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
