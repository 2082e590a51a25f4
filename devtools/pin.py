"""The pinned upstream release: read the pin file, fetch and verify its sdist.

Standard library only, so `make check` works without the 12 GB stack.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path


class PinError(RuntimeError):
    pass


@dataclass(frozen=True)
class Pin:
    name: str
    version: str
    sdist: str
    sha256: str
    series: int

    @property
    def local_version(self) -> str:
        return f"{self.version}+rlsync.{self.series}"


def read_pin(path: Path) -> Pin:
    fields: dict[str, str] = {}
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise PinError(f"{path}:{lineno}: expected 'key = value', got {line!r}")
        fields[key.strip()] = value.strip()
    missing = [
        k for k in ("name", "version", "sdist", "sha256", "series") if k not in fields
    ]
    if missing:
        raise PinError(f"{path}: missing {', '.join(missing)}")
    try:
        series = int(fields["series"])
    except ValueError:
        raise PinError(f"{path}: series must be an integer, got {fields['series']!r}")
    return Pin(
        name=fields["name"],
        version=fields["version"],
        sdist=fields["sdist"],
        sha256=fields["sha256"].lower(),
        series=series,
    )


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "rlsync"


def verify_sdist(pin: Pin, path: Path) -> None:
    actual = sha256_of(path)
    if actual != pin.sha256:
        raise PinError(
            f"sha256 mismatch for {path.name}: pin says {pin.sha256}, "
            f"the file has {actual}; refusing to use it"
        )


def fetch_sdist(pin: Pin) -> Path:
    """Download the pinned sdist from the package index (cached by hash)."""
    dest_dir = cache_dir() / "sdist" / pin.sha256
    dest = dest_dir / pin.sdist
    if dest.exists():
        verify_sdist(pin, dest)
        return dest
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet"]
        cmd += ["--no-binary", ":all:", "-d", tmp, f"{pin.name}=={pin.version}"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        got = Path(tmp) / pin.sdist
        if not got.exists():
            raise PinError(
                f"could not download {pin.sdist} from the package index:\n"
                f"{proc.stdout}{proc.stderr}"
            )
        verify_sdist(pin, got)
        dest_dir.mkdir(parents=True, exist_ok=True)
        shutil.move(str(got), dest)
    return dest


def unpack_sdist(pin: Pin, sdist: Path, dest: Path) -> None:
    """Unpack the sdist so that `dest` holds its top folder's contents."""
    verify_sdist(pin, sdist)
    if dest.exists():
        shutil.rmtree(dest)
    top = sdist.name.removesuffix(".tar.gz")
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        with tarfile.open(sdist) as tar:
            if hasattr(tarfile, "data_filter"):
                tar.extractall(tmp, filter="data")
            else:
                tar.extractall(tmp)
        shutil.move(str(Path(tmp) / top), dest)
