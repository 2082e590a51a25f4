"""`rlsync router` as a process, for tests: its output goes to a log file
(never an unread pipe), and its port is picked free and picked again when
another process binds it first (as harness.cpu_sglang does for servers)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import requests

from harness.cpu_sglang import ROOT, PortTaken, free_port

LOGS = ROOT / "build" / "logs"


class RouterProc:
    """A running `rlsync router WORKER... ARGS...` on `host`."""

    def __init__(
        self,
        workers: list[str],
        *args: str,
        host: str = "127.0.0.1",
        env: Optional[dict[str, str]] = None,
        log_name: str = "router",
        ready_timeout: float = 30.0,
    ):
        # The source tree's router, not a copy installed with the wheel.
        path = f"{ROOT / 'python'}{os.pathsep}{ROOT}"
        self.env = env if env is not None else {**os.environ, "PYTHONPATH": path}
        for attempt in range(3):
            try:
                self._start(workers, args, host, log_name, ready_timeout)
                return
            except PortTaken:
                if attempt == 2:
                    raise

    def _start(self, workers, args, host, log_name, ready_timeout) -> None:
        self.port = free_port()
        self.url = f"http://{host}:{self.port}"
        LOGS.mkdir(parents=True, exist_ok=True)
        self.log_path = LOGS / f"{log_name}-{self.port}.log"
        command = [sys.executable, "-m", "rlsync.cli", "router", *workers]
        command += ["--host", host, "--port", str(self.port)]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [*command, *args],
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:
            self._wait_ready(ready_timeout)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                message = f"the router exited with {self.proc.returncode}:\n"
                message += self.log()[-4000:]
                taken = "address already in use" in self.log()
                raise PortTaken(message) if taken else RuntimeError(message)
            if self._answers():
                return
            time.sleep(0.1)
        raise TimeoutError(f"the router did not start; log {self.log_path}")

    def _answers(self) -> bool:
        """This router answers on its port (not another process that took it)."""
        try:
            resp = requests.get(self.url + "/workers", timeout=2)
        except requests.RequestException:
            return False
        if resp.status_code == 401:  # a router with an admin key
            return self.proc.poll() is None
        try:
            return "workers" in resp.json() and self.proc.poll() is None
        except ValueError:
            return False

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def workers(self) -> dict:
        workers = requests.get(self.url + "/workers", timeout=10).json()["workers"]
        return {w["url"]: w for w in workers}

    def events(self) -> list[dict]:
        return requests.get(self.url + "/events", timeout=10).json()

    def stop(self) -> None:
        if self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
