"""Unit tests for the route an update group binds to and the bounds of its
init — no server, no process group; the group's creation is a stand-in."""

import math
import os
import socket
import time
import unittest
from unittest import mock

from sglang.srt.weight_sync import update_group_net
from sglang.srt.weight_sync.update_group_net import (
    Route,
    UpdateGroupInitError,
    bound_to_route,
    collective_timeout_seconds,
    init_group_on_route,
    interface_environment,
    interface_of,
    rendezvous_advice,
    route_to,
)
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase

register_cpu_ci(est_time=3, suite="base-a-test-cpu")

GLOO, NCCL = "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"
WEEK = 7 * 24 * 3600


class TestRoute(CustomTestCase):
    def test_a_loopback_master_is_reached_from_loopback(self):
        route = route_to("127.0.0.1", 29500)
        self.assertEqual(route.address, "127.0.0.1")
        self.assertIn(route.interface, [name for _, name in socket.if_nameindex()])
        self.assertEqual(route.interface, interface_of("127.0.0.1"))

    def test_a_routed_master_is_reached_from_this_host_s_address(self):
        try:  # TEST-NET-1: routed off this host, nothing is sent
            route = route_to("192.0.2.1", 9)
        except OSError as e:
            self.skipTest(f"no route off this host: {e}")
        self.assertFalse(route.address.startswith("127."))
        self.assertIsNotNone(route.interface)
        self.assertNotEqual(route.interface, interface_of("127.0.0.1"))
        self.assertEqual(route_to(route.address, 9), route)

    def test_an_ipv6_loopback_master_is_reached_from_loopback(self):
        try:
            with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as s:
                s.bind(("::1", 0))
        except OSError as e:
            self.skipTest(f"no IPv6 loopback: {e}")
        route = route_to("::1", 29500)
        self.assertEqual(route, Route("::1", interface_of("127.0.0.1")))

    def test_an_address_not_on_this_host_has_no_interface(self):
        self.assertIsNone(interface_of("198.51.100.77"))
        self.assertIsNone(interface_of("2001:db8::77"))
        self.assertEqual(str(Route("10.0.0.2", None)), "10.0.0.2 (interface unknown)")


class TestInterfaceVariables(CustomTestCase):
    def setUp(self):
        patcher = mock.patch.dict(os.environ)
        patcher.start()
        self.addCleanup(patcher.stop)
        for name in (GLOO, NCCL):
            os.environ.pop(name, None)

    def test_a_gloo_group_is_bound_and_an_nccl_group_left_to_its_launch(self):
        # NCCL reads its variable at the group's first collective, after the
        # group is made: a variable set while it is made would bind nothing.
        route = Route("10.0.0.2", "eth7")
        self.assertEqual(interface_environment("gloo", route, {}), {GLOO: "eth7"})
        self.assertEqual(interface_environment("NCCL", route, {}), {})
        self.assertEqual(interface_environment("mpi", route, {}), {})
        self.assertEqual(interface_environment("gloo", Route("10.0.0.2", None)), {})

    def test_a_variable_the_user_set_is_never_replaced(self):
        route = Route("10.0.0.2", "eth7")
        self.assertEqual(interface_environment("gloo", route, {GLOO: "ib0"}), {})
        os.environ[GLOO] = "ib0"
        with bound_to_route("gloo", route) as chosen:
            self.assertEqual((chosen, os.environ[GLOO]), ({}, "ib0"))
        self.assertEqual(os.environ[GLOO], "ib0")

    def test_the_variable_is_set_only_while_the_group_is_created(self):
        with self.assertRaises(RuntimeError):
            with bound_to_route("gloo", Route("10.0.0.2", "eth7")) as chosen:
                self.assertEqual((chosen, os.environ[GLOO]), ({GLOO: "eth7"}, "eth7"))
                self.assertNotIn(NCCL, os.environ)
                raise RuntimeError("the group init failed")
        self.assertNotIn(GLOO, os.environ)


class TestTimeoutsAndAdvice(CustomTestCase):
    def test_collective_timeouts_stay_between_a_second_and_a_week(self):
        self.assertEqual(collective_timeout_seconds(30), 30)
        for asked in (0, 0.2, -5):
            self.assertEqual(collective_timeout_seconds(asked), 1.0)
        for asked in (1e300, math.inf):
            self.assertEqual(collective_timeout_seconds(asked), WEEK)
        self.assertTrue(1.0 <= collective_timeout_seconds(math.nan) <= WEEK)

    def test_the_advice_names_the_master_the_route_and_the_variable(self):
        route = Route("10.9.9.9", "eth3")
        advice = rendezvous_advice("gloo", "10.1.2.3", 29500, route, {})
        self.assertIn("master 10.1.2.3:29500", advice)
        self.assertIn("reaches it from 10.9.9.9 (eth3)", advice)
        self.assertIn(f"{GLOO} unset", advice)
        self.assertIn(f"set {GLOO} on that side", advice)
        advice = rendezvous_advice("nccl", "h", 1, route, {NCCL: "ib0"})
        self.assertIn(f"binds the group to {NCCL}=ib0", advice)


class TestInitGroupOnRoute(CustomTestCase):
    def setUp(self):
        patcher = mock.patch.dict(os.environ)
        patcher.start()
        self.addCleanup(patcher.stop)
        os.environ.pop(GLOO, None)
        # A port where a master listens, and one where nothing does.
        self.master = socket.create_server(("127.0.0.1", 0))
        self.absent = socket.socket()
        self.absent.bind(("127.0.0.1", 0))
        for s in (self.master, self.absent):
            self.addCleanup(s.close)
        self.calls = []

    def create(self, seconds_left):
        self.calls.append((seconds_left, os.environ.get(GLOO)))
        return "group"

    def init(self, sock, timeout, hosts_rendezvous=False, create=None, backend="gloo"):
        return init_group_on_route(
            create or self.create,
            backend=backend,
            master_address="127.0.0.1",
            master_port=sock.getsockname()[1],
            timeout=timeout,
            hosts_rendezvous=hosts_rendezvous,
        )

    def test_the_group_is_created_on_the_route_with_the_time_left(self):
        self.assertEqual(self.init(self.master, 30), "group")
        ((left, bound),) = self.calls
        self.assertTrue(29 < left <= 30, left)
        self.assertEqual(bound, interface_of("127.0.0.1"))
        self.assertNotIn(GLOO, os.environ)

    def test_a_variable_the_user_set_is_kept_through_the_init(self):
        os.environ[GLOO] = "user0"
        self.init(self.master, 30)
        self.assertEqual(self.calls[0][1], "user0")
        self.assertEqual(os.environ[GLOO], "user0")

    def test_the_rendezvous_host_and_no_timeout_do_not_wait_for_the_master(self):
        self.init(self.absent, None)
        self.init(self.absent, 30, hosts_rendezvous=True)
        self.init(self.absent, 0, hosts_rendezvous=True)
        left = [seconds for seconds, _ in self.calls]
        self.assertIsNone(left[0])
        self.assertTrue(29 < left[1] <= 30, left)
        self.assertEqual(left[2], 1.0)  # never less than a second

    def test_an_absent_master_fails_within_the_timeout_naming_it(self):
        port = self.absent.getsockname()[1]
        start = time.monotonic()
        with self.assertRaises(UpdateGroupInitError) as caught:
            self.init(self.absent, 0.5)
        self.assertLess(time.monotonic() - start, 0.5 + 1)
        self.assertEqual(self.calls, [])
        message = str(caught.exception)
        self.assertIn(f"nothing accepted a connection at 127.0.0.1:{port}", message)
        self.assertIn(f"master 127.0.0.1:{port}", message)
        self.assertIn(GLOO, message)
        self.assertIsInstance(caught.exception.__cause__, TimeoutError)

    def test_a_failed_create_keeps_its_error_and_gains_the_advice(self):
        failure = RuntimeError("Connection refused (peer 127.0.0.1:41000)")

        def create(seconds_left):
            raise failure

        with self.assertRaises(UpdateGroupInitError) as caught:
            self.init(self.master, 30, create=create, backend="nccl")
        message = str(caught.exception)
        self.assertTrue(message.startswith(f"{failure}; master 127.0.0.1:"))
        self.assertIn(f"set {NCCL} on that side", message)
        self.assertIs(caught.exception.__cause__, failure)
        self.assertNotIn(NCCL, os.environ)

    def test_an_unroutable_master_is_named(self):
        unknown = socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        with mock.patch.object(
            update_group_net.socket, "getaddrinfo", side_effect=unknown
        ):
            with self.assertRaisesRegex(
                UpdateGroupInitError,
                r"^master_address: cannot route to trainer\.invalid:29500: ",
            ):
                init_group_on_route(
                    self.create,
                    backend="gloo",
                    master_address="trainer.invalid",
                    master_port=29500,
                    timeout=30,
                    hosts_rendezvous=False,
                )
        self.assertEqual(self.calls, [])


if __name__ == "__main__":
    unittest.main()
