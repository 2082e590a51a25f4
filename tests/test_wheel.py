"""The forked wheel: upstream's requirements, the patched modules, the local
version; and `python/` installable alone as the trainer-side `rlsync`."""

from __future__ import annotations

import email.parser
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from rlsync import series

ROOT = Path(__file__).resolve().parents[1]
LAYOUT = series.Layout(ROOT)
PIN = LAYOUT.pin()
WHEEL = ROOT / "dist" / f"sglang-{PIN.local_version}-py3-none-any.whl"


def requires(metadata_text: str) -> set[str]:
    msg = email.parser.Parser().parsestr(metadata_text)
    return {str(Requirement(r)) for r in msg.get_all("Requires-Dist") or []}


@pytest.fixture(scope="module")
def wheel() -> zipfile.ZipFile:
    assert WHEEL.is_file(), f"{WHEEL} missing; `make test` builds it"
    return zipfile.ZipFile(WHEEL)


def test_wheel_requires_exactly_upstream(wheel, upstream_tree):
    meta = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    ours = requires(wheel.read(meta).decode())
    upstream = requires((upstream_tree / "python" / "PKG-INFO").read_text())
    assert ours == upstream
    assert len(ours) > 50


def test_wheel_ships_every_upstream_file_and_patched_ones(wheel, upstream_tree):
    names = set(wheel.namelist())
    pristine = upstream_tree / "python"
    upstream_files = {
        p.relative_to(pristine).as_posix()
        for p in (pristine / "sglang").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    assert upstream_files <= names
    for rel in series.series_files(LAYOUT.patches()):
        inner = Path(rel).relative_to("python").as_posix()
        assert wheel.read(inner) == (LAYOUT.overlay_dir / rel).read_bytes(), inner
    assert "rlsync/series.py" in names
    entry = next(n for n in wheel.namelist() if n.endswith("entry_points.txt"))
    assert "rlsync = rlsync.cli:main" in wheel.read(entry).decode()


def test_wheel_in_fresh_venv_layered_on_pinned_env(tmp_path):
    """Install into a new venv that borrows the pinned stack through a .pth."""
    venv = tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True
    )
    py = venv / "bin" / "python"
    site = subprocess.check_output(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        text=True,
    ).strip()
    (Path(site) / "pinned-stack.pth").write_text(
        sysconfig.get_paths()["purelib"] + "\n"
    )
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(py), "install", "--quiet",
         "--no-deps", "--no-index", "--ignore-installed", str(WHEEL)],
        check=True,
    )  # fmt: skip
    code = (
        "import sglang, rlsync, sglang.srt.utils.watchdog as w;"
        "print(sglang.__version__); print(w.__file__); print(hasattr(w.Watchdog, 'pause'))"
    )
    out = subprocess.check_output([str(py), "-c", code], text=True).splitlines()
    assert out[0] == PIN.local_version
    assert out[1].startswith(site)
    assert out[2] == "True"


def test_rlsync_alone_needs_only_torch_and_an_http_client(tmp_path):
    # Build from a copy: setuptools leaves build/ and *.egg-info beside its input.
    src = tmp_path / "src"
    shutil.copytree(
        ROOT / "python",
        src,
        ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"),
    )
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "-w", str(tmp_path), str(src)],
        check=True,
    )  # fmt: skip
    (whl,) = tmp_path.glob("rlsync-*.whl")
    with zipfile.ZipFile(whl) as zf:
        meta = next(n for n in zf.namelist() if n.endswith("METADATA"))
        reqs = [Requirement(r) for r in requires(zf.read(meta).decode())]
        assert {r.name for r in reqs if r.marker is None} == {"torch", "httpx"}
        # The router is an extra: `pip install 'rlsync[router]'`.
        extra = {
            r.name for r in reqs if r.marker and r.marker.evaluate({"extra": "router"})
        }
        assert extra == {"fastapi", "uvicorn"}
        assert not [n for n in zf.namelist() if n.startswith("sglang/")]
