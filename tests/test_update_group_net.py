"""Choosing the update group's interface and bounding its init
(`update_group_net`, shared by the engines' series and the trainer library):
no server, no network but loopback."""

from __future__ import annotations

import os
import socket
import time
from datetime import timedelta
from pathlib import Path

import pytest

from devtools.series import VENDORED
from rlsync import update_group_net as net

ROOT = Path(__file__).resolve().parents[1]


def test_the_route_to_a_loopback_master_is_loopback():
    assert net.route_to("127.0.0.1", 29500) == net.Route("127.0.0.1", "lo")
    assert net.interface_of("127.0.0.1") == "lo"
    assert net.interface_of("192.0.2.123") is None


@pytest.mark.parametrize(
    "backend,environ,expected",
    [
        ("gloo", {}, {"GLOO_SOCKET_IFNAME": "eth7"}),
        ("GLOO", {}, {"GLOO_SOCKET_IFNAME": "eth7"}),
        ("gloo", {"GLOO_SOCKET_IFNAME": "ib0"}, {}),  # the user's choice stands
        ("gloo", {"NCCL_SOCKET_IFNAME": "ib0"}, {"GLOO_SOCKET_IFNAME": "eth7"}),
        # NCCL reads its variable at the group's first collective, after the
        # group is made: only a variable set at launch binds it.
        ("nccl", {}, {}),
        ("NCCL", {"GLOO_SOCKET_IFNAME": "ib0"}, {}),
        ("mpi", {}, {}),
    ],
)
def test_the_environment_handed_to_each_backend(backend, environ, expected):
    route = net.Route("198.18.0.2", "eth7")
    assert net.interface_environment(backend, route, environ) == expected


def test_an_unknown_interface_sets_nothing():
    assert net.interface_environment("gloo", net.Route("198.18.0.2", None), {}) == {}


def test_the_variable_is_set_only_while_the_group_is_created(monkeypatch):
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "mine")
    route = net.Route("198.18.0.2", "eth7")
    with net.bound_to_route("gloo", route) as chosen:
        assert chosen == {"GLOO_SOCKET_IFNAME": "eth7"}
        assert os.environ["GLOO_SOCKET_IFNAME"] == "eth7"
    assert "GLOO_SOCKET_IFNAME" not in os.environ
    with net.bound_to_route("nccl", route) as chosen:
        assert chosen == {} and os.environ["NCCL_SOCKET_IFNAME"] == "mine"
    assert os.environ["NCCL_SOCKET_IFNAME"] == "mine"


def test_waiting_for_the_master_returns_once_it_listens():
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        net.wait_for_master("127.0.0.1", port, time.monotonic() + 5)


def test_waiting_for_a_master_that_never_listens_ends_at_the_deadline():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: refused
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match=f"at 127.0.0.1:{port} before"):
            net.wait_for_master("127.0.0.1", port, t0 + 1.0)
        waited = time.monotonic() - t0
        # Not before the deadline; after it only by what a loaded host adds
        # (a wait that ignored it would go on until the test's own timeout).
        assert 1.0 <= waited < 1.0 + 10, waited


def test_a_failed_init_says_where_each_side_was(monkeypatch):
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    seen = {}

    def create(left):
        seen["left"], seen["env"] = left, os.environ.get("GLOO_SOCKET_IFNAME")
        raise RuntimeError("Gloo connectFullMesh failed ... remote=[127.0.0.1]:4242")

    with pytest.raises(net.UpdateGroupInitError) as failed:
        net.init_group_on_route(
            create,
            backend="gloo",
            master_address="127.0.0.1",
            master_port=29511,
            timeout=7,
            hosts_rendezvous=True,
        )
    assert seen["env"] == "lo" and 6 < seen["left"] <= 7
    message = str(failed.value)
    assert message.startswith("Gloo connectFullMesh failed")
    assert "master 127.0.0.1:29511; this rank reaches it from 127.0.0.1 (lo)" in message
    assert "GLOO_SOCKET_IFNAME=lo" in message and "set GLOO_SOCKET_IFNAME" in message
    assert "GLOO_SOCKET_IFNAME" not in os.environ


def test_a_master_that_does_not_resolve_is_named():
    with pytest.raises(net.UpdateGroupInitError, match="master_address: cannot route"):
        net.init_group_on_route(
            lambda left: None,
            backend="gloo",
            master_address="no-such-host.invalid",
            master_port=1,
            timeout=1,
            hosts_rendezvous=False,
        )


def test_the_whole_init_is_bounded_by_its_timeout():
    """A rank that does not host the rendezvous waits for the master's port
    within the timeout, and the backend gets only what is left."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        t0 = time.monotonic()
        with pytest.raises(net.UpdateGroupInitError, match="nothing accepted"):
            net.init_group_on_route(
                lambda left: pytest.fail("created without a master"),
                backend="gloo",
                master_address="127.0.0.1",
                master_port=port,
                timeout=1.5,
                hosts_rendezvous=False,
            )
        waited = time.monotonic() - t0
        assert 1.5 <= waited < 1.5 + 10, waited


@pytest.mark.parametrize(
    "asked,waits",
    [(40, 40), (0.5, 1), (1e-4, 1), (1e300, 7 * 24 * 3600), (1e7, 7 * 24 * 3600)],
)
def test_a_groups_collectives_wait_what_was_asked_from_a_second_to_a_week(asked, waits):
    """A finite but huge timeout (1e300) would overflow timedelta, and the
    backends' clocks beyond it; under a millisecond the backends read none
    (every wait fails at once)."""
    assert net.collective_timeout_seconds(asked) == waits
    timedelta(seconds=net.collective_timeout_seconds(asked))


def test_the_trainer_carries_the_servers_module_unchanged():
    for copy, source in VENDORED.items():
        text = (ROOT / copy).read_text()
        assert text.splitlines()[0].startswith("# Generated from common/")
        assert text.split("\n", 1)[1] == (ROOT / "common" / source).read_text()
