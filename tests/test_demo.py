"""`make demo` (the README's first command) holds every check it prints."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


# The developer demo of the library's sync; the first pin's run covers it.
pytestmark = pytest.mark.release_independent


def test_demo_runs_three_checked_syncs_under_load():
    proc = subprocess.run(
        [sys.executable, "-m", "harness.demo"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    assert "all checks held" in out
    rows = [line for line in out.splitlines() if line.startswith("step-")]
    assert len(rows) == 3 and all(line.rstrip().endswith("ok") for line in rows)
