"""Overlay code is formatted as upstream formats it (black 24.10.0; isort with
profile black and sglang first-party) and our package is black-clean too."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from devtools import series

ROOT = Path(__file__).resolve().parents[1]
LAYOUT = series.Layout(ROOT)


def run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=cwd, capture_output=True, text=True
    )


def test_black_version_is_upstreams():
    assert "black, 24.10.0" in run("black", "--version").stdout


def test_overlay_is_black_clean():
    files = [
        str(LAYOUT.overlay_dir / f)
        for f in series.overlay_files(LAYOUT)
        if f.endswith(".py")
    ]
    proc = run("black", "--check", "--quiet", *files)
    assert proc.returncode == 0, proc.stderr


def test_overlay_imports_sorted_where_upstream_was():
    """isort must pass on every overlay file whose pristine version passes."""
    bad = []
    for rel in series.overlay_files(LAYOUT):
        if not rel.endswith(".py"):
            continue
        pristine = LAYOUT.upstream_dir / rel
        args = ("isort", "--check-only", "--profile", "black", "-p", "sglang")
        if pristine.is_file() and run(*args, str(pristine)).returncode != 0:
            continue  # upstream itself is not isort-clean here; keep its style
        if run(*args, str(LAYOUT.overlay_dir / rel)).returncode != 0:
            bad.append(rel)
    assert not bad, f"imports not sorted as upstream sorts them: {bad}"


def test_our_code_is_black_clean():
    proc = run(
        "black",
        "--check",
        "--quiet",
        *("python", "devtools", "harness", "tests", "bench", "setup.py"),
    )
    assert proc.returncode == 0, f"run `make format`:\n{proc.stderr}"
