"""The ranks of a multi-GPU bench, each its own process running the bench's
own script: launched together, waited for until a deadline (a hang is
killed, every rank), their output collected. Shared by
gpu_tp_concurrency.py and gpu_tp_staged_receiver.py."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Tuple


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def progress(rank: int, what: str) -> None:
    """A timestamped progress line on stderr (what a hang's report shows)."""
    print(f"rank {rank} {time.monotonic():.3f} {what}", file=sys.stderr, flush=True)


@dataclass
class RankRun:
    stdout: str
    stderr: str
    returncode: int

    def last_json_line(self) -> str:
        """The rank's report: its last stdout line that is a JSON object."""
        lines = [line for line in self.stdout.splitlines() if line.startswith("{")]
        return lines[-1] if lines else ""

    def progress_lines(self) -> List[str]:
        return [line for line in self.stderr.splitlines() if line.startswith("rank ")]


def run_ranks(
    argv_of_rank: Callable[[int], List[str]],
    env: Dict[str, str],
    deadline_s: float,
    world: int = 2,
) -> Tuple[bool, List[RankRun]]:
    """(whether the ranks hung and were killed, each rank's run)."""
    procs = [
        subprocess.Popen(
            argv_of_rank(rank),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(world)
    ]
    deadline = time.monotonic() + deadline_s
    hung, runs = False, []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            hung = True
            for p in procs:
                p.kill()
            out, err = proc.communicate()
        runs.append(RankRun(out, err, proc.returncode))
    return hung, runs
