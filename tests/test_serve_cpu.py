"""`make serve-cpu` (README "No GPU?"): the patched server on the CPU in one
command, serving until Ctrl-C, then gone with every process it started."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import requests

from harness.cpu_sglang import free_port
from harness.serve_cpu import parse_args

ROOT = Path(__file__).resolve().parents[1]

# The recipe is the tests' own; the first pin's run covers the command.
pytestmark = pytest.mark.release_independent


def _line_with(proc: subprocess.Popen, needle: str, timeout: float) -> str:
    """The first line of the command's output holding `needle` (read until
    then), or a failure with what it printed."""
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            break
        seen.append(line)
        if needle in line:
            return line
    pytest.fail(f"no {needle!r} from serve-cpu; it printed:\n{''.join(seen)[-3000:]}")


def test_serve_cpu_serves_the_patched_server_until_ctrl_c():
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness.serve_cpu", "--port", str(port)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    children: list[psutil.Process] = []
    try:
        line = _line_with(proc, "serving http://", timeout=300)
        url = line.split()[1]
        assert url == f"http://127.0.0.1:{port}"
        info = requests.get(url + "/rlsync_info", timeout=10).json()
        assert "two_phase_weight_update" in info["features"]
        children = psutil.Process(proc.pid).children(recursive=True)
        assert children, "no server process under serve-cpu"
        os.kill(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=60) == 0
        assert "stopped" in proc.stdout.read()
        gone, alive = psutil.wait_procs(children, timeout=30)
        assert not alive, f"left running: {alive}"
    finally:
        if proc.poll() is None:
            proc.kill()
        for process in children:
            try:
                process.kill()
            except psutil.NoSuchProcess:
                pass
        proc.wait()


def test_serve_cpu_passes_flags_after_the_separator_to_the_server():
    args = parse_args(["--tp-size", "2", "--", "--admin-api-key", "k"])
    assert args.tp_size == 2 and args.server_args == ["--admin-api-key", "k"]


def test_serve_cpu_refuses_a_model_path_that_is_no_directory(tmp_path, capsys):
    with pytest.raises(SystemExit):
        parse_args(["--model-path", str(tmp_path / "missing")])
    assert "--model-path:" in capsys.readouterr().err
