"""The soak (`make soak`) in short: one sync of every fault kind but an
engine restart into a TP 1 and a TP 2 server (the TP 2 one token-in/
token-out) under streaming and non-streaming load, every promise checked
after each sync, the trainer being `WeightSender` itself (faults through its
wire, progress callback and tensor generator). The restart (30 s) runs in
`make soak`, whose 30 syncs draw every kind, with the cache flushed and not."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.soak import FAULTS, MUST_APPLY
from harness.soak.faults import keeps_group

ROOT = Path(__file__).resolve().parents[1]
SEED = 2  # draws the applying sync with the cache flushed under load
KINDS = tuple(kind for kind in FAULTS if kind != "engine_restart")

# Each fault is also a case of test_two_phase or test_update_sequences, which
# run on every pin; `make soak PIN=<version>` soaks a later pin.
pytestmark = pytest.mark.release_independent


def test_soak_one_round_of_every_fault(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    args = ["--syncs", str(len(KINDS)), "--seed", str(SEED), "--out", str(out)]
    args += ["--faults", ",".join(KINDS)]
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
    assert report["syncs"] == len(KINDS)
    assert report["faults"] == {kind: 1 for kind in KINDS}
    applying = [r for r in report["log"] if r["fault"] in MUST_APPLY]
    assert [(r["fault"], r["flush_cache"]) for r in applying] == [("none", True)]
    assert report["lost_requests"] == 0 and report["mixed_weights"] == 0
    assert report["completed_requests"] > 0 and not report["failures"]
    kept = {r["fault"]: r["group_kept"] for r in report["log"]}
    assert kept == {
        r["fault"]: keeps_group(r["fault"], r["params"]) for r in report["log"]
    }, "a fault the sender reports in band kept the group, and only those"
