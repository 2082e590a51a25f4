"""README "Try it on CPU" and `make serve-cpu`: the patched server on the CPU
in one command, a first sync into it checked by its weights checksum with
the README's own commands, then Ctrl-C and no process left.

`make test-quickstart` runs the same test with the README's trainer install
too (a new venv, a CPU-only torch from its index, the library: minutes and
the network: download.pytorch.org), as a new user's shell would: its own
HOME, not the pinned venv."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import requests
import torch

from harness.cpu_sglang import free_port
from harness.doc_blocks import all_chunks, command_lines, reader_env
from harness.http_stand_in import HttpStandIn
from harness.serve_cpu import parse_args

ROOT = Path(__file__).resolve().parents[1]
README_URL = "http://127.0.0.1:30000"
RUN_INSTALL = os.environ.get("RLSYNC_QUICKSTART_INSTALL") == "1"

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


def readme_commands(mark: str) -> list[str]:
    """The command lines of the README's one chunk marked `mark`."""
    chunks = [c for c in all_chunks() if c.page == "README.md" and mark in c.marks]
    assert len(chunks) == 1, f"README.md: {len(chunks)} chunks marked {mark!r}"
    return command_lines(chunks[0].text)


def readme_output_example() -> list[str]:
    """The output the README shows for the quickstart's sync."""
    chunks = [c for c in all_chunks() if c.page == "README.md" and c.kind == "output"]
    follows = [c for c in chunks if "first-sync-changed" in c.text]
    assert len(follows) == 1, "README.md: no example output of examples/first_sync.py"
    return follows[0].text.splitlines()


def masked(line: str) -> str:
    """A line of output with its checksums, paths and numbers as placeholders."""
    line = re.sub(r"sha256:[0-9a-f]+(\.\.\.)?", "sha256:H", line.strip())
    line = re.sub(r"(?<![:/\w])/\S+", "PATH", line)
    return re.sub(r"\d+(\.\d+)?", "N", line)


def trainer_env(tmp_path: Path) -> dict[str, str]:
    """What the README's trainer commands run with. With the install: a new
    user's shell (its own HOME, the machine's pip settings but no
    constraints file, not this venv). Without: this checkout's library and
    this interpreter as `rlsync` and `python` (tests/test_wheel.py installs
    the library into a fresh venv)."""
    if not RUN_INSTALL:
        return reader_env(tmp_path)
    home = tmp_path / "home"
    home.mkdir()
    venv_bin = str(Path(sys.executable).parent)
    env = {
        k: v
        for k, v in os.environ.items()
        if k != "PIP_CONSTRAINT"
        and not k.startswith(("PYTHON", "MAKE", "MFLAGS", "VIRTUAL_ENV"))
    }
    env["PATH"] = os.pathsep.join(
        d for d in env.get("PATH", "").split(os.pathsep) if d != venv_bin
    )
    env["HOME"] = str(home)
    return env


def run_commands(lines: list[str], env: dict[str, str]) -> dict[str, str]:
    """Run the lines in one bash, as a reader types them; each line's output
    (stdout and stderr). Fails at the first line that fails."""
    script = ["set -e"]
    for i, line in enumerate(lines):
        script += [f"echo '@@@ {i}'", line]
    proc = subprocess.run(
        ["bash", "-c", "\n".join(script)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=1800 if RUN_INSTALL else 300,
    )
    parts = re.split(r"^@@@ (\d+)\n", proc.stdout, flags=re.M)
    outputs = {lines[int(i)]: out for i, out in zip(parts[1::2], parts[2::2])}
    ran = len(outputs)
    assert proc.returncode == 0, (
        f"{lines[ran - 1] if ran else 'bash'}: exit {proc.returncode}\n"
        + proc.stdout[-4000:]
    )
    return outputs


def test_readme_quickstart_serves_syncs_checks_and_stops_on_ctrl_c(tmp_path):
    """README "Try it on CPU", run as written: `make serve-cpu` in one
    terminal; in another the sync and the two checks (after the trainer
    install with `make test-quickstart`). The README's URL is the server's,
    on a free port instead of 30000."""
    (serve,) = readme_commands("quickstart-server")
    assert shlex.split(serve, comments=True) == ["make", "serve-cpu"]
    install = readme_commands("quickstart-install") if RUN_INSTALL else []
    trainer = readme_commands("quickstart")
    assert any("examples/first_sync.py" in line for line in trainer)
    port = free_port()
    # `make serve-cpu` runs `make install` first (47 s when built); the
    # server is what its recipe starts:
    argv = ["make", "serve-cpu", f"PORT={port}"]
    if not RUN_INSTALL:
        argv = [sys.executable, "-m", "harness.serve_cpu", "--port", str(port)]
    proc = subprocess.Popen(
        argv,
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS")},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    children: list[psutil.Process] = []
    try:
        line = _line_with(proc, "serving http://", timeout=600)
        # Every process under it now, so that none outlives a failure below.
        children = psutil.Process(proc.pid).children(recursive=True)
        assert children, "no server process under serve-cpu"
        url = line.split()[1]
        assert url == f"http://127.0.0.1:{port}"
        info = requests.get(url + "/rlsync_info", timeout=10).json()
        assert "two_phase_weight_update" in info["features"]

        lines = [l.replace(README_URL, url) for l in install + trainer]
        outputs = run_commands(lines, trainer_env(tmp_path))
        first_sync, status, checksum = (
            next(out for l, out in outputs.items() if word in l)
            for word in ("first_sync.py", "status", "checksum")
        )
        assert "ok: the engine applied both syncs" in first_sync, first_sync
        shown = {masked(l) for l in first_sync.splitlines()}
        missing = [l for l in readme_output_example() if masked(l) not in shown]
        assert missing == [], f"README shows lines it does not print:\n{first_sync}"
        assert "healthy (HTTP 200)" in status, status
        assert "weight_version=first-sync-restored" in status, status
        loaded = re.search(r"checkpoint it loaded: +(sha256:\w+)", first_sync)
        assert loaded and f"{url}  {loaded.group(1)}  " in checksum, checksum

        # The pid the serving line names (under make, make's child) stops it.
        said = re.search(r"`kill -INT (\d+)` stops it", line)
        assert said, line
        pid = int(said.group(1))
        assert RUN_INSTALL or pid == proc.pid
        os.kill(pid, signal.SIGINT)
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


def test_first_sync_reads_a_checkpoint_as_safetensors_writes_it(tmp_path):
    """The example reads .safetensors by hand (the trainer needs nothing but
    torch): every dtype it names, an empty tensor and -0.0 come back bit for
    bit as the safetensors library wrote them."""
    from safetensors.torch import save_file

    from examples.first_sync import DTYPES, stored_tensors

    written = {
        f"t.{str(dtype).removeprefix('torch.')}": (torch.arange(12) - 6)
        .to(dtype)
        .reshape(3, 4)
        for dtype in DTYPES.values()
    }
    written["empty"] = torch.empty(0, 5, dtype=torch.bfloat16)
    written["negative_zero"] = torch.tensor([-0.0, 0.0, -1.5], dtype=torch.float32)
    save_file(dict(list(written.items())[:5]), tmp_path / "a.safetensors")
    save_file(dict(list(written.items())[5:]), tmp_path / "b.safetensors")
    read = {t.name: t.read() for t in stored_tensors(tmp_path)}
    assert read.keys() == written.keys()
    for name, tensor in written.items():
        got = read[name]
        assert (got.dtype, got.shape) == (tensor.dtype, tensor.shape), name
        assert (
            got.view(-1).view(torch.uint8).tolist()
            == tensor.view(-1).view(torch.uint8).tolist()
        ), name


def test_first_sync_says_it_waits_for_a_starting_server(capsys):
    """Started before its server is up, the example says what it waits for
    (not minutes of silence) and, past its wait, why it gave up."""
    from examples.first_sync import wait_until_healthy

    with HttpStandIn({("GET", "/health"): (503, {})}) as server:
        with pytest.raises(SystemExit, match="/health not 200 after 1 s: not healthy"):
            wait_until_healthy(server.url, 1.0)
    assert f"waiting for {server.url}/health: not healthy yet; 0 of 1 s" in (
        capsys.readouterr().out
    )
