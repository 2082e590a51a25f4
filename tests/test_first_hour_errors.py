"""Errors a new user meets in the first hour say what to do: NCCL on a
trainer without a GPU, a trainer started before its servers
(`connect(wait=...)`), a 401 (which key), a flag a command lacks. Against
small local HTTP stand-ins where the answer is all that matters; no SGLang
server starts here."""

from __future__ import annotations

import http.server
import json
import threading
from typing import Any, Iterator

import pytest
import torch

from harness.cpu_sglang import free_port
from rlsync import cli, client
from rlsync.sender import Engine, SyncError, WeightSender

NOBODY = "http://127.0.0.1:9"  # nothing listens


class StandIn:
    """Answers GET /health with `health` (a status), 401 on every POST, 404
    elsewhere; counts the health probes."""

    def __init__(self) -> None:
        self.health = 503
        self.probes = 0
        self.probed = threading.Condition()
        stand_in = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def answer(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path == "/health":
                    with stand_in.probed:
                        stand_in.probes += 1
                        stand_in.probed.notify_all()
                    return self.answer(stand_in.health, {})
                self.answer(404, {"detail": "Not Found"})

            def do_POST(self) -> None:
                self.answer(401, {"error": "Unauthorized"})

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stand_in() -> Iterator[StandIn]:
    server = StandIn()
    yield server
    server.close()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a host without CUDA")
def test_nccl_on_a_trainer_without_a_gpu_says_use_gloo():
    sender = WeightSender([Engine(NOBODY, 1)], master_port=free_port())
    with pytest.raises(SyncError, match="use backend='gloo'") as err:
        sender.connect()
    assert err.value.step == "connect"


def test_connect_waits_for_a_starting_server(stand_in):
    """The trainer started first: connect(wait=) polls /health until the
    server answers 200, then goes on (here to the next check, which the
    stand-in fails: it is not an rlsync server)."""
    sender = WeightSender(
        [Engine(stand_in.url, 1)], master_port=free_port(), backend="gloo"
    )

    def start_once_probed() -> None:
        with stand_in.probed:
            stand_in.probed.wait_for(lambda: stand_in.probes >= 2, 60)
        stand_in.health = 200

    threading.Thread(target=start_once_probed, daemon=True).start()
    with pytest.raises(SyncError, match="not patched with rlsync"):
        sender.connect(wait=60)
    assert stand_in.probes >= 3


def test_connect_names_the_server_that_never_came(stand_in):
    sender = WeightSender(
        [Engine(stand_in.url, 1), Engine(NOBODY, 1)],
        master_port=free_port(),
        backend="gloo",
    )
    with pytest.raises(SyncError, match="not healthy after 1 s") as err:
        sender.connect(wait=1)
    assert f"{stand_in.url} (HTTP 503" in str(err.value)
    assert f"{NOBODY} (no answer" in str(err.value)


@pytest.mark.parametrize(
    "keys, sent",
    [
        ({"admin_key": "k"}, "the admin key given (admin_key) was refused"),
        ({"api_key": "a"}, "the API key given (api_key) was refused"),
        ({}, "no key was sent"),
    ],
)
def test_a_401_says_which_key_and_where_the_server_reads_it(stand_in, keys, sent):
    with pytest.raises(client.EngineError) as err:
        client.call(stand_in.url, "/flush_cache", {}, **keys)
    assert err.value.status == 401
    assert sent in err.value.message
    assert "--admin-api-key or $SGLANG_ADMIN_API_KEY" in err.value.message


@pytest.mark.parametrize(
    "argv, said",
    [
        (["status", "--admin-key", "x", NOBODY], "unrecognized arguments: --admin-key"),
        (["status", "127.0.0.1:9"], "argument URL: '127.0.0.1:9' needs a scheme"),
        (["sync-disk", "--path", "/m", "--vllm", "h:1"], "'h:1' needs a scheme"),
        (["router", "--bogus", "x", NOBODY], "unrecognized arguments: --bogus"),
    ],
)
def test_a_flag_a_command_lacks_gets_argparse_s_message(argv, said, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 2
    assert said in capsys.readouterr().err
