"""Unit tests for health answers while weights update — no server."""

import types
import unittest
from unittest import mock

from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase, maybe_stub_sgl_kernel

maybe_stub_sgl_kernel()  # must precede io_struct, which pulls in sgl_kernel

from sglang.srt.managers import weight_update_health
from sglang.srt.managers.weight_update_health import (
    WeightUpdateTracker,
    pause_watchdogs_during_weight_update,
    weight_update_health_response,
)

register_cpu_ci(est_time=2, suite="base-a-test-cpu")


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
        with self.tracker.track("update_weights_from_distributed"):
            answer = weight_update_health_response(self.manager)
            self.assertEqual(answer.status_code, 200)
            self.assertIn(b"update_weights_from_distributed", answer.body)
            self.clock.now += 61.0
            answer = weight_update_health_response(self.manager)
            self.assertEqual(answer.status_code, 503)
            self.assertIn(b"past its deadline", answer.body)
        self.assertFalse(self.tracker.in_progress)
        self.assertIsNone(weight_update_health_response(self.manager))

    def test_an_operations_own_timeout_shortens_the_deadline(self):
        op = self.tracker.begin("init_weights_update_group", timeout=5.0)
        self.clock.now += 14.0
        self.assertEqual(self.tracker.stuck(), [])
        self.clock.now += 2.0
        self.assertEqual(
            [o.name for o, _ in self.tracker.stuck()], ["init_weights_update_group"]
        )
        self.tracker.end(op)
        self.assertFalse(self.tracker.in_progress)

    def test_overlapping_operations_end_independently(self):
        first = self.tracker.begin("a")
        second = self.tracker.begin("b")
        self.tracker.end(first)
        self.assertEqual([o.name for o in self.tracker.operations()], ["b"])
        self.tracker.end(second)
        self.tracker.end(second)  # ending twice is harmless
        self.assertFalse(self.tracker.in_progress)


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
