"""Test hosts in network namespaces: the trainer and the engines on hosts of
their own, each with its own address, as in a real deployment.

`TestNetwork` makes a bridge in this namespace (its address is the test
process's own: the operator's and the router's host) and one namespace per
host, joined to the bridge by a veth pair, with addresses from the range
reserved for network tests (198.18.0.0/15). Traffic stays between these
namespaces. Everything is removed on `close()`, also after a failure; names
carry this process's id, so concurrent runs do not collide. Needs root
(`ip netns`), as on the developers' machines and CI.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Optional

SUBNET_PREFIX = "198.18"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["ip", *args], capture_output=True, text=True, check=check, timeout=30
    )


def available() -> Optional[str]:
    """None when namespaces can be made here, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    probe = f"rlsprobe{os.getpid()}"
    try:
        made = _ip("netns", "add", probe, check=False)
    except FileNotFoundError:
        return "no `ip` command (iproute2)"
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


@dataclass
class Host:
    """One host: a namespace, its address, and its link to the bridge."""

    name: str  # the namespace
    address: str
    bridge_end: str  # the veth end on the bridge (take it down to cut the host off)

    def command(self, *args: str) -> list[str]:
        """`args` run inside this host's namespace."""
        return ["ip", "netns", "exec", self.name, *args]


class TestNetwork:
    def __init__(self) -> None:
        tag = os.getpid() % 100000
        self.prefix = f"rl{tag}"
        # A /24 of its own per run: two runs' bridges must not share routes.
        self.subnet = f"{SUBNET_PREFIX}.{tag % 250 + 1}"
        self.address = f"{self.subnet}.1"
        self.bridge = f"{self.prefix}br"
        self.hosts: list[Host] = []
        _ip("link", "add", self.bridge, "type", "bridge")
        try:
            _ip("addr", "add", f"{self.address}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
        except BaseException:
            self.close()
            raise

    def add_host(self, label: str) -> Host:
        index = len(self.hosts) + 10
        host = Host(
            name=f"{self.prefix}{label}",
            address=f"{self.subnet}.{index}",
            bridge_end=f"{self.prefix}{label}b",
        )
        inner = f"{self.prefix}{label}h"
        self.hosts.append(host)
        _ip("netns", "add", host.name)
        _ip("link", "add", host.bridge_end, "type", "veth", "peer", "name", inner)
        _ip("link", "set", inner, "netns", host.name)
        _ip("link", "set", host.bridge_end, "master", self.bridge)
        _ip("link", "set", host.bridge_end, "up")
        ns = ("-n", host.name)
        _ip(*ns, "addr", "add", f"{host.address}/24", "dev", inner)
        _ip(*ns, "link", "set", inner, "up")
        _ip(*ns, "link", "set", "lo", "up")
        return host

    def cut(self, host: Host) -> None:
        """Take the host's link down: its packets go nowhere (a partition)."""
        _ip("link", "set", host.bridge_end, "down")

    def restore(self, host: Host) -> None:
        _ip("link", "set", host.bridge_end, "up")

    def remove(self, host: Host) -> None:
        """The host disappears: every process in it is killed, its link and
        namespace deleted."""
        pids = _ip("netns", "pids", host.name, check=False).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        deadline = time.monotonic() + 10
        while _ip("netns", "pids", host.name, check=False).stdout.split():
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        _ip("link", "del", host.bridge_end, check=False)
        _ip("netns", "del", host.name, check=False)
        if host in self.hosts:
            self.hosts.remove(host)

    def close(self) -> None:
        for host in list(self.hosts):
            self.remove(host)
        _ip("link", "del", self.bridge, check=False)
