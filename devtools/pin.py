"""The pinned upstream release: read the pin file, fetch and verify its
archive (the sdist, or for wheel-only releases the wheel).

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
import zipfile
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
    wheel: str = ""
    # Other releases this series applies to as it is (pins/releases)
    serves: tuple[str, ...] = ()

    @property
    def local_version(self) -> str:
        return f"{self.version}+rlsync.{self.series}"

    @property
    def archive(self) -> str:
        """The pinned file: the wheel for wheel-only releases, else the sdist."""
        return self.wheel or self.sdist


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
    missing = [k for k in ("name", "version", "sha256", "series") if k not in fields]
    if "sdist" not in fields and "wheel" not in fields:
        missing.append("sdist or wheel")
    if missing:
        raise PinError(f"{path}: missing {', '.join(missing)}")
    if "sdist" in fields and "wheel" in fields:
        raise PinError(f"{path}: name the sdist or the wheel, not both")
    try:
        series = int(fields["series"])
    except ValueError:
        raise PinError(f"{path}: series must be an integer, got {fields['series']!r}")
    return Pin(
        name=fields["name"],
        version=fields["version"],
        sdist=fields.get("sdist", ""),
        sha256=fields["sha256"].lower(),
        series=series,
        wheel=fields.get("wheel", ""),
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


def verify_archive(pin: Pin, path: Path) -> None:
    actual = sha256_of(path)
    if actual != pin.sha256:
        raise PinError(
            f"sha256 mismatch for {path.name}: pin says {pin.sha256}, "
            f"the file has {actual}; refusing to use it"
        )


def _wheel_download_args(wheel: str) -> list[str]:
    """pip arguments that fetch exactly this wheel on any machine: its
    Python and platform tags, binaries only."""
    parts = wheel.removesuffix(".whl").split("-")
    python_tag, _abi, platform_tag = parts[-3:]
    args = ["--only-binary", ":all:"]
    if python_tag.startswith("py"):  # pure Python: any interpreter, any platform
        return args
    args += ["--implementation", python_tag[:2], "--python-version", python_tag[2:]]
    for platform in platform_tag.split("."):
        args += ["--platform", platform]
    return args


def fetch_archive(pin: Pin) -> Path:
    """Download the pinned sdist or wheel from the package index (cached by
    hash)."""
    dest_dir = cache_dir() / "sdist" / pin.sha256
    dest = dest_dir / pin.archive
    if dest.exists():
        verify_archive(pin, dest)
        return dest
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet"]
        if pin.wheel:
            cmd += _wheel_download_args(pin.wheel)
        else:
            cmd += ["--no-binary", ":all:"]
        cmd += ["-d", tmp, f"{pin.name}=={pin.version}"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        got = Path(tmp) / pin.archive
        if not got.exists():
            raise PinError(
                f"could not download {pin.archive} from the package index:\n"
                f"{proc.stdout}{proc.stderr}"
            )
        verify_archive(pin, got)
        dest_dir.mkdir(parents=True, exist_ok=True)
        shutil.move(str(got), dest)
    return dest


def unpack_archive(pin: Pin, archive: Path, dest: Path) -> None:
    """Unpack the sdist so that `dest` holds its top folder's contents, or
    the wheel so that `dest` holds its package and dist-info (the layout of
    the repository's python/ folder)."""
    verify_archive(pin, archive)
    if dest.exists():
        shutil.rmtree(dest)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        if pin.wheel:
            with zipfile.ZipFile(archive) as whl:
                whl.extractall(Path(tmp) / "python")
            shutil.move(str(Path(tmp) / "python"), dest)
            return
        top = archive.name.removesuffix(".tar.gz")
        with tarfile.open(archive) as tar:
            if hasattr(tarfile, "data_filter"):
                tar.extractall(tmp, filter="data")
            else:
                tar.extractall(tmp)
        shutil.move(str(Path(tmp) / top), dest)
