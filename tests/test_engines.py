"""Disk sync on every engine at once: the SGLang adapter against the real server, the
parallel orchestration with a failing engine, the CLI, and the requests the
vLLM adapter sends (no vLLM here: checked against its documented API)."""

from __future__ import annotations

import asyncio
import http.server
import json
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import KEYED_API_KEY
from safetensors.torch import save_file

from harness.cpu_sglang import free_port
from harness.weights import greedy, randomized
from rlsync import client
from rlsync.engines import (
    SGLangEngine,
    VLLMEngine,
    sync_weights_to_engines,
    update_vllm_weights_from_disk,
)

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "From disk"


def write_checkpoint(dest: Path, model_dir: Path, weights) -> Path:
    """A checkpoint as a trainer saves one: the model's files, new tensors."""
    shutil.copytree(model_dir, dest)
    save_file(dict(weights), str(dest / "model.safetensors"))
    return dest


def rlsync_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rlsync.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )


def test_disk_sync_reaches_the_server_and_reports_a_dead_engine(
    server_tp1, tiny_model, model_weights, tmp_path
):
    url = server_tp1.url
    before = greedy(url, PROMPT)
    ckpt = write_checkpoint(
        tmp_path / "step_1", tiny_model, randomized(model_weights, 9)
    )
    dead = f"http://127.0.0.1:{free_port()}"
    engines = [
        SGLangEngine(url, weight_version="disk-1"),
        SGLangEngine(dead, timeout=5),
    ]
    results = asyncio.run(sync_weights_to_engines(engines, str(ckpt)))
    try:
        assert [r.base_url for r in results] == [url, dead], "order kept"
        assert results[0].success and results[0].response["success"]
        assert not results[1].success and dead in results[1].error
        assert "ConnectError" in results[1].error
        assert client.get_weight_version(url) == "disk-1"
        assert greedy(url, PROMPT) != before
    finally:
        restored = asyncio.run(
            sync_weights_to_engines([SGLangEngine(url)], str(tiny_model))
        )
    assert restored[0].success and greedy(url, PROMPT) == before


def test_disk_sync_failure_is_reported_with_the_servers_message(server_tp1, tmp_path):
    (result,) = asyncio.run(
        sync_weights_to_engines([SGLangEngine(server_tp1.url)], str(tmp_path / "nope"))
    )
    assert not result.success
    assert (
        "/update_weights_from_disk" in result.error and server_tp1.url in result.error
    )


def test_cli_status_reads_the_weight_version_with_the_api_key(keyed_server):
    without = rlsync_cli("status", keyed_server.url)
    assert (
        "weight_version=? (Unauthorized: give --api-key" in without.stdout
    ), without.stdout
    keyed = rlsync_cli("status", keyed_server.url, "--api-key", KEYED_API_KEY)
    assert keyed.returncode == 0, keyed.stderr
    assert "healthy (HTTP 200)" in keyed.stdout
    assert "weight_version=?" not in keyed.stdout, keyed.stdout


def test_cli_status_and_sync_disk(server_tp1, tiny_model):
    dead = f"http://127.0.0.1:{free_port()}"
    ok = rlsync_cli("status", server_tp1.url)
    assert ok.returncode == 0, ok.stderr
    assert "healthy (HTTP 200)" in ok.stdout and "weight_version=" in ok.stdout
    bad = rlsync_cli("status", server_tp1.url, dead)
    assert bad.returncode == 1 and f"{dead}  unreachable" in bad.stdout
    sync = rlsync_cli(
        "sync-disk",
        "--path",
        str(tiny_model),
        "--weight-version",
        "cli-1",
        server_tp1.url,
    )
    assert sync.returncode == 0, sync.stdout + sync.stderr
    assert f"{server_tp1.url}  ok" in sync.stdout
    assert client.get_weight_version(server_tp1.url) == "cli-1"
    failed = rlsync_cli("sync-disk", "--path", str(tiny_model), "--timeout", "5", dead)
    assert failed.returncode == 1 and "FAILED" in failed.stdout


class _Recorder(http.server.BaseHTTPRequestHandler):
    seen: list = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _Recorder.seen.append((self.path, dict(self.headers), body))
        reply = json.dumps({"results": [None, None]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args):
        pass


@pytest.fixture
def recorder():
    _Recorder.seen = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", _Recorder.seen
    server.shutdown()


def test_vllm_adapter_sends_what_collective_rpc_takes(recorder):
    """vLLM's /collective_rpc (dev mode) reads `method` (required), `args`
    (list of str), `kwargs` (dict of str to str) and `timeout`, and answers
    {"results": [one per worker]}."""
    url, seen = recorder
    engine = VLLMEngine(url, timeout=42.0, api_key="k")
    out = asyncio.run(engine.update_weights_from_checkpoint("/ckpt/step_7"))
    assert out == {"results": [None, None]}
    ((path, headers, body),) = seen
    assert path == "/collective_rpc"
    assert headers["Authorization"] == "Bearer k"
    assert body["method"] == "reload_weights"
    assert isinstance(body["args"], list) and all(
        isinstance(a, str) for a in body["args"]
    )
    assert isinstance(body["kwargs"], dict)
    assert all(
        isinstance(k, str) and isinstance(v, str) for k, v in body["kwargs"].items()
    )
    assert body["kwargs"] == {"weights_path": "/ckpt/step_7"}
    assert body["timeout"] == 42.0
    assert set(body) == {"method", "args", "kwargs", "timeout"}
    with pytest.raises(ValueError, match="checkpoint_path cannot be empty"):
        asyncio.run(update_vllm_weights_from_disk(url, ""))
