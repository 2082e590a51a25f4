"""The soak's servers: each across its restarts (same port), with its
process tree's RSS and the log lines that may say something went wrong."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import psutil

from harness.cpu_sglang import BUILD, Server, launch
from harness.soak.common import brief
from rlsync import client

LOG_PATTERN = re.compile(r"Traceback|\w+Error\b|Exception|[Ww]atchdog|[Ff]ailed")
# Start-up lines of every CPU server that match LOG_PATTERN and say nothing.
LOG_NOISE = re.compile(
    r"server_args=|Failed to load NCCL|Custom allreduce failed|yes/no token IDs"
)


@dataclass
class Slot:
    """One of the two servers, across restarts (same port)."""

    name: str
    tp: int
    token_ids: bool
    model: Path
    server: Optional[Server] = None
    served: int = 0  # the weight set it must serve
    version: str = ""  # the weight version it must report
    rss_base: Optional[int] = None
    launches: int = 0
    log_seen: int = 0

    @property
    def url(self) -> str:
        assert self.server is not None
        return self.server.url

    def start(self, port: Optional[int] = None) -> None:
        self.launches += 1
        log = BUILD / "logs" / f"soak-{self.name}-{self.launches}.log"
        extra = ["--skip-tokenizer-init"] if self.token_ids else []
        self.server = launch(self.model, log, tp=self.tp, extra_args=extra, port=port)
        self.served, self.rss_base, self.log_seen = 0, None, 0
        self.version = client.get_weight_version(self.url)

    def rss(self) -> int:
        """RSS summed over the server's process tree."""
        assert self.server is not None
        try:
            root = psutil.Process(self.server.proc.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return 0
        total = 0
        for p in procs:
            try:
                total += p.memory_info().rss
            except psutil.NoSuchProcess:
                pass
        return total

    def new_log_lines(self, limit: int = 15) -> list[str]:
        assert self.server is not None
        try:
            text = self.server.log_path.read_text(errors="replace")
        except OSError:
            return []
        fresh, self.log_seen = text[self.log_seen :], len(text)
        hits = [
            line.strip()
            for line in fresh.splitlines()
            if LOG_PATTERN.search(line) and not LOG_NOISE.search(line)
        ]
        return [brief(h, 300) for h in dict.fromkeys(hits)][:limit]
