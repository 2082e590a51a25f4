"""The network an update group uses, and what to say when its rendezvous fails.

A weight-update group spans the trainer and the engines, usually on different
hosts. Unless GLOO_SOCKET_IFNAME (NCCL_SOCKET_IFNAME) names an interface, gloo
advertises to its peers the address the host name resolves to: on a host whose
name resolves to loopback every peer is told 127.0.0.1, the connect is refused,
and the group init waits out its timeout with nothing said. Here, unless the
user set the variable, each rank binds a gloo group to the interface that
routes to the master address: the network the trainer and the engines share.
NCCL reads its variable when a process first starts networking (for the
update group, at its first collective, once the group is made): set
NCCL_SOCKET_IFNAME at launch.

Standard library only, so a trainer can bind its side of the group by the same
rule without SGLang.
"""

from __future__ import annotations

import fcntl
import os
import socket
import struct
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, Mapping, Optional, TypeVar

# The variable each backend reads for the interface it binds to.
IFNAME_VARIABLES = {"gloo": "GLOO_SOCKET_IFNAME", "nccl": "NCCL_SOCKET_IFNAME"}
_SIOCGIFADDR = 0x8915
# The longest a collective of an update group waits: a finite but huge
# timeout (1e300) overflows the clocks the backends compute deadlines on.
LONGEST_COLLECTIVE_TIMEOUT_S = 7 * 24 * 3600.0
# The shortest: the backends count in milliseconds, and less than one reads
# as none (every wait fails at once).
SHORTEST_COLLECTIVE_TIMEOUT_S = 1.0
# os.environ is process-wide: one group init at a time changes it.
_environ_lock = threading.Lock()
T = TypeVar("T")


class UpdateGroupInitError(RuntimeError):
    """A group init that failed, with the addresses involved and the advice."""


@dataclass(frozen=True)
class Route:
    """This host's side of the route to the master address."""

    address: str
    interface: Optional[str]

    def __str__(self) -> str:
        return f"{self.address} ({self.interface or 'interface unknown'})"


def route_to(master_address: str, master_port: int) -> Route:
    """The local address (and its interface) that packets to the master
    leave from. Connecting a UDP socket sends nothing; it only routes."""
    family, _, _, _, sockaddr = socket.getaddrinfo(
        master_address, master_port, type=socket.SOCK_DGRAM
    )[0]
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect(sockaddr)
        address = probe.getsockname()[0]
    return Route(address, interface_of(address))


def interface_of(address: str) -> Optional[str]:
    """The name of the interface holding `address`, or None."""
    if ":" in address:
        return _ipv6_interface_of(socket.inet_pton(socket.AF_INET6, address).hex())
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            request = struct.pack("256s", name.encode()[:15])
            try:
                answer = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, request)
            except OSError:  # no IPv4 address on it
                continue
            if socket.inet_ntoa(answer[20:24]) == address:
                return name
    return None


def _ipv6_interface_of(packed_hex: str) -> Optional[str]:
    try:
        with open("/proc/net/if_inet6") as table:
            for line in table:
                fields = line.split()
                if fields and fields[0] == packed_hex:
                    return fields[-1]
    except OSError:
        pass
    return None


def interface_environment(
    backend: str, route: Route, environ: Mapping[str, str] = os.environ
) -> Dict[str, str]:
    """The variable to set while a gloo group is made: GLOO_SOCKET_IFNAME
    naming the route's interface, unless the user set it. Nothing for
    another backend: NCCL would read its variable only after the group is
    made."""
    if str(backend).lower() != "gloo":
        return {}
    variable = IFNAME_VARIABLES["gloo"]
    if environ.get(variable) or route.interface is None:
        return {}
    return {variable: route.interface}


@contextmanager
def bound_to_route(backend: str, route: Route) -> Iterator[Dict[str, str]]:
    """While a gloo group is created, it binds to the route's interface
    (gloo reads the variable then)."""
    with _environ_lock:
        chosen = interface_environment(backend, route)
        saved = {name: os.environ.get(name) for name in chosen}
        os.environ.update(chosen)
        try:
            yield chosen
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


def wait_for_master(master_address: str, master_port: int, deadline: float) -> None:
    """Return once the master's rendezvous port accepts a connection (the
    rendezvous store tolerates one that closes at once); TimeoutError naming
    the address and the last error when `deadline` (monotonic) passes first.
    Bounds the store phase: torch's own connect retries can run past it."""
    last: Optional[OSError] = None
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(
                f"nothing accepted a connection at {master_address}:{master_port} "
                f"before the timeout (last error: {last})"
            )
        try:
            with socket.create_connection(
                (master_address, master_port), timeout=min(remaining, 5.0)
            ):
                return
        except OSError as e:
            last = e
            time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))


def rendezvous_advice(
    backend: str,
    master_address: str,
    master_port: int,
    route: Route,
    environ: Mapping[str, str] = os.environ,
) -> str:
    """What a failed group init says beside torch's error: the addresses
    involved and the variable that would fix a wrong one."""
    variable = IFNAME_VARIABLES.get(str(backend).lower(), "GLOO_SOCKET_IFNAME")
    bound = environ.get(variable)
    how = (
        f"{variable}={bound}"
        if bound
        else f"{variable} unset, so the backend chose from the host name"
    )
    return (
        f"master {master_address}:{master_port}; this rank reaches it from "
        f"{route} and binds the group to {how}. Every rank must reach the "
        f"master's port and the address each peer advertises (torch's error "
        f"names the peer's); where one advertises an address the others cannot "
        f"reach (127.0.0.1, a private interface), set {variable} on that side "
        f"to the interface of the network the trainer and the engines share"
    )


def collective_timeout_seconds(timeout: float) -> float:
    """The timeout of an update group's collectives for the `timeout` asked
    for: that, from a second up to a week."""
    return max(
        SHORTEST_COLLECTIVE_TIMEOUT_S, min(timeout, LONGEST_COLLECTIVE_TIMEOUT_S)
    )


def init_group_on_route(
    create: Callable[[Optional[float]], T],
    *,
    backend: str,
    master_address: str,
    master_port: int,
    timeout: Optional[float],
    hosts_rendezvous: bool,
) -> T:
    """`create(seconds_left)` makes the group, bound to the route's
    interface; the whole init (waiting for the master, the rendezvous, the
    backend's connect) takes at most `timeout` seconds plus one second, and a
    failure is an UpdateGroupInitError saying where each side was.
    `seconds_left` bounds the group's creation alone: a rank that joined late
    has little of it left, and its collectives must not wait only that long."""
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        route = route_to(master_address, master_port)
    except OSError as e:
        raise UpdateGroupInitError(
            f"master_address: cannot route to {master_address}:{master_port}: {e}"
        ) from e
    with bound_to_route(backend, route):
        try:
            if not hosts_rendezvous and deadline is not None:
                wait_for_master(master_address, master_port, deadline)
            left = None if deadline is None else deadline - time.monotonic()
            return create(None if left is None else max(1.0, left))
        except Exception as e:
            advice = rendezvous_advice(backend, master_address, master_port, route)
            raise UpdateGroupInitError(f"{e}; {advice}") from e
