"""The soak (`make soak`) in short: one sync of every fault kind into a TP 1
and a TP 2 server (the TP 2 one token-in/token-out) under streaming and
non-streaming load, every promise checked after each sync."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from harness.soak import FAULTS, MUST_APPLY

ROOT = Path(__file__).resolve().parents[1]
# One round of the kinds; this seed restarts the TP 1 server (the quicker to
# start) and completes the two applying syncs with flush_cache true and false.
SEED = 4


def test_soak_one_round_of_every_fault(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    args = ["--syncs", str(len(FAULTS)), "--seed", str(SEED), "--out", str(out)]
    proc = subprocess.run(
        [sys.executable, "-m", "harness.soak", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert proc.returncode == 0, proc.stdout[-8000:]
    assert report["syncs"] == len(FAULTS)
    assert report["faults"] == {kind: 1 for kind in FAULTS}
    applying = {r["flush_cache"] for r in report["log"] if r["fault"] in MUST_APPLY}
    assert applying == {True, False}
    assert report["lost_requests"] == 0 and report["mixed_weights"] == 0
    assert report["completed_requests"] > 0 and not report["failures"]
