"""Unit tests for health answers while weights update — no server."""

import dataclasses
import inspect
import math
import types
import unittest
from unittest import mock

import msgspec

from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase, maybe_stub_sgl_kernel

maybe_stub_sgl_kernel()  # must precede io_struct, which pulls in sgl_kernel

from sglang.srt.managers import weight_update_health
from sglang.srt.managers.tokenizer_manager import TokenizerManager
from sglang.srt.managers.weight_update_health import (
    WeightUpdateTracker,
    pause_watchdogs_during_weight_update,
    weight_update_health_response,
)
from sglang.srt.server_args import ServerArgs
from sglang.srt.weight_sync.server_arg_checks import check_weight_update_args

register_cpu_ci(est_time=2, suite="base-a-test-cpu")

DEADLINE = "weight_update_health_deadline"


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


class TestWeightUpdateHealth(CustomTestCase):
    def setUp(self):
        self.clock = Clock()
        patcher = mock.patch.object(weight_update_health.time, "monotonic", self.clock)
        patcher.start()
        self.addCleanup(patcher.stop)
        self.tracker = WeightUpdateTracker(default_deadline=60.0)
        self.manager = types.SimpleNamespace(weight_update_tracker=self.tracker)

    def test_no_answer_of_its_own_while_nothing_runs(self):
        self.assertIsNone(weight_update_health_response(self.manager))

    def test_healthy_while_an_update_runs_then_unhealthy_past_its_deadline(self):
        op = self.tracker.begin("update_weights_from_distributed")
        answer = weight_update_health_response(self.manager)
        self.assertEqual(answer.status_code, 200)
        self.assertIn(b"update_weights_from_distributed", answer.body)
        self.clock.now += 61.0
        answer = weight_update_health_response(self.manager)
        self.assertEqual(answer.status_code, 503)
        self.assertIn(b"past its deadline", answer.body)
        self.tracker.end(op)
        self.assertFalse(self.tracker.in_progress)
        self.assertIsNone(weight_update_health_response(self.manager))

    def test_overlapping_operations_end_independently(self):
        first = self.tracker.begin("a")
        second = self.tracker.begin("b")
        self.tracker.end(first)
        self.assertEqual([o.name for o in self.tracker.operations()], ["b"])
        self.tracker.end(second)
        self.tracker.end(second)  # ending twice is harmless
        self.assertFalse(self.tracker.in_progress)


def tracked_as(method):
    """The operation name `track_weight_update` tracks a method under, or
    None where it is not tracked."""
    names = inspect.getclosurevars(method).nonlocals
    return names.get("name") if "tracker" in method.__code__.co_varnames else None


class TestTrackedOperations(CustomTestCase):
    def test_the_blocking_weight_operations_are_tracked_each_under_its_name(self):
        for name in (
            "init_weights_update_group",
            "update_weights_from_disk",
            "update_weights_from_distributed",
            "update_weights_from_tensor",
        ):
            with self.subTest(name=name):
                self.assertEqual(tracked_as(getattr(TokenizerManager, name)), name)

    def test_a_read_of_the_weights_is_not_a_weight_update(self):
        # It blocks nothing: tracking it would answer health checks for it,
        # and a slow read past the deadline would turn them 503.
        self.assertIsNone(tracked_as(TokenizerManager.get_weights_by_name))


class TestDeadlineFlag(CustomTestCase):
    def server_args(self, deadline):
        """The weight-update flags this release has, at their defaults, but
        the deadline."""
        if dataclasses.is_dataclass(ServerArgs):
            fields = dataclasses.fields(ServerArgs)
        else:
            fields = msgspec.structs.fields(ServerArgs)
        defaults = {f.name: f.default for f in fields if f.name.startswith("weight_")}
        return types.SimpleNamespace(**defaults | {DEADLINE: deadline})

    def test_the_default_and_a_short_deadline_pass(self):
        check_weight_update_args(self.server_args(600))
        check_weight_update_args(self.server_args(1.5))

    def test_a_deadline_it_cannot_use_is_refused_at_start_naming_the_flag(self):
        # inf or NaN would fail every blocking operation (a watchdog pause
        # needs a finite limit); 0 or less would make every health check
        # during an update a 503 at once.
        for deadline in (math.inf, math.nan, 0, -1, 0.5, 10**7, "600", True, None):
            with self.subTest(deadline=deadline):
                with self.assertRaisesRegex(
                    ValueError,
                    "^--weight-update-health-deadline: expected seconds from 1 "
                    "to 1000000",
                ):
                    check_weight_update_args(self.server_args(deadline))


class TestWatchdogsPausedUpToTheDeadline(CustomTestCase):
    def scheduler(self):
        return types.SimpleNamespace(
            watchdog=mock.Mock(),
            soft_watchdog=mock.Mock(),
            send_to_detokenizer=mock.Mock(),
            server_args=types.SimpleNamespace(weight_update_health_deadline=42.0),
        )

    def test_each_watchdog_pauses_up_to_the_deadline_and_ends_its_own_pause(self):
        scheduler = self.scheduler()

        @pause_watchdogs_during_weight_update
        def handler(scheduler, recv_req):
            for watchdog in (scheduler.watchdog, scheduler.soft_watchdog):
                watchdog.pause.assert_called_once_with(42.0)
                watchdog.resume.assert_not_called()
            raise RuntimeError("the load failed")

        with self.assertRaises(RuntimeError):
            handler(scheduler, object())
        for watchdog in (scheduler.watchdog, scheduler.soft_watchdog):
            watchdog.resume.assert_called_once_with(watchdog.pause.return_value)

    def test_the_detokenizer_is_not_told(self):
        # Its watchdog does not count while it waits for the scheduler: a
        # message per operation would only cost IPC (and, under DP, pause it
        # while other replicas still send it output).
        scheduler = self.scheduler()
        pause_watchdogs_during_weight_update(lambda s, r: None)(scheduler, object())
        self.assertEqual(scheduler.send_to_detokenizer.mock_calls, [])


if __name__ == "__main__":
    unittest.main()
