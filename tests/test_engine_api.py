"""The two-phase operations on the offline sglang.Engine (patch `two-phase-weight-update`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from harness import cpu_sglang

ROOT = Path(__file__).resolve().parents[1]


def test_engine_prepare_complete_abort(tiny_model):
    stub = cpu_sglang.build_stub_libcuda()
    env = cpu_sglang.server_env(stub, ranks=1)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "python")])
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness.engine_two_phase",
            str(tiny_model),
            str(cpu_sglang.free_port()),
        ],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        start_new_session=True,
    )
    lines = [l for l in proc.stdout.splitlines() if l.startswith("FINDINGS ")]
    assert lines, f"rc={proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    findings = json.loads(lines[-1].removeprefix("FINDINGS "))
    assert findings["server_info_shows_the_key"] is False
    assert findings["init"] is True
    assert findings["prepare"] == "ready"
    ok, received, expected = findings["complete"]
    assert ok and received == expected > 1
    assert findings["changed"] is True
    assert findings["abort_without_session"] is False
