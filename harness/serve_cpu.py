"""`make serve-cpu`: the patched SGLang server on this machine's CPU, to try
the weight sync without a GPU. The recipe is the one the tests and the demo
use (harness.cpu_sglang: the stub libcuda, the environment, the flags); it is
a test aid, not a way to serve: CPU inference is slow.

    make serve-cpu                                  # a tiny random model, TP 1
    make serve-cpu MODEL=/models/qwen TP=2 PORT=30000 ARGS="--admin-api-key k"

It prints the URL and its pid once the server is healthy and runs until
Ctrl-C (or SIGINT / SIGTERM to that pid), then stops every process it
started.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Optional

from harness.cpu_sglang import BUILD, launch
from harness.tiny_model import make_tiny_model

DEFAULT_PORT = 30000


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="make serve-cpu",
        description="Start the patched SGLang server on the CPU (a test aid).",
    )
    parser.add_argument(
        "--model-path",
        type=Path,
        help="a Hugging Face model directory (default: a tiny random Llama "
        "written under build/models)",
    )
    parser.add_argument("--tp-size", type=int, default=1)
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument(
        "--ready-timeout",
        type=float,
        default=600.0,
        help="seconds to wait for /health (a real model loads slowly on CPU)",
    )
    parser.add_argument(
        "server_args",
        nargs=argparse.REMAINDER,
        help="after `--`: more sglang.launch_server flags (they win over the recipe's)",
    )
    args = parser.parse_args(argv)
    if args.server_args[:1] == ["--"]:
        args.server_args = args.server_args[1:]
    if args.tp_size < 1:
        parser.error("--tp-size: must be 1 or more")
    if args.model_path is not None and not args.model_path.is_dir():
        parser.error(f"--model-path: {args.model_path} is no directory")
    return args


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    model = args.model_path or make_tiny_model(BUILD / "models")
    log_path = BUILD / "serve-cpu" / f"server-{args.port}.log"
    print(f"starting SGLang on the CPU: {model}, TP {args.tp_size}; log {log_path}")
    server = launch(
        model,
        log_path,
        tp=args.tp_size,
        port=args.port,
        extra_args=args.server_args,
        ready_timeout=args.ready_timeout,
    )
    stopping = threading.Event()

    def stop(signum: int, frame: Optional[FrameType]) -> None:
        stopping.set()

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    pid = os.getpid()
    print(f"serving {server.url} (Ctrl-C or `kill -INT {pid}` stops it)", flush=True)
    try:
        while not stopping.wait(1.0):
            if not server.alive():
                print(f"the server exited ({server.proc.returncode}); see {log_path}")
                return 1
    finally:
        server.stop()
    print("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
