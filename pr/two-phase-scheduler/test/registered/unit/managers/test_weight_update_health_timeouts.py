"""Unit tests for health answers while a two-phase update runs: its own
timeout shortens the deadline, and the answer names its session — no
server."""

import asyncio
import types
import unittest
from unittest import mock

from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase, maybe_stub_sgl_kernel

maybe_stub_sgl_kernel()  # must precede io_struct, which pulls in sgl_kernel

from sglang.srt.managers import weight_update_health
from sglang.srt.managers.weight_update_health import (
    WeightUpdateTracker,
    track_weight_update,
    weight_update_health_response,
)

register_cpu_ci(est_time=1, suite="base-a-test-cpu")

SESSION = "s" * 16


class TestTimeoutsAndSessions(CustomTestCase):
    def setUp(self):
        self.now = 1000.0
        patcher = mock.patch.object(
            weight_update_health.time, "monotonic", lambda: self.now
        )
        patcher.start()
        self.addCleanup(patcher.stop)
        self.tracker = WeightUpdateTracker(default_deadline=60.0)
        self.manager = types.SimpleNamespace(weight_update_tracker=self.tracker)

    def test_an_operations_own_timeout_shortens_the_deadline_never_lengthens(self):
        short = self.tracker.begin("complete_weight_update", timeout=5.0)
        long = self.tracker.begin("prepare_weight_update", timeout=600.0)
        self.now += 14.0
        self.assertEqual(self.tracker.stuck(), [])
        self.now += 2.0  # past 5 s + 10 s of grace
        self.assertEqual(
            [op.name for op, _ in self.tracker.stuck()], ["complete_weight_update"]
        )
        self.now += 60.0  # past the operator's deadline
        self.assertEqual(len(self.tracker.stuck()), 2)
        self.tracker.end(short)
        self.tracker.end(long)
        self.assertFalse(self.tracker.in_progress)

    def test_an_answer_names_the_session_of_the_operation(self):
        op = self.tracker.begin("complete_weight_update", session_id=SESSION)
        answer = weight_update_health_response(self.manager)
        self.assertEqual(answer.status_code, 200)
        self.assertIn(
            f"complete_weight_update of session {SESSION}", answer.body.decode()
        )
        self.now += 61.0
        answer = weight_update_health_response(self.manager)
        self.assertEqual(answer.status_code, 503)
        self.assertIn(
            f"'complete_weight_update of session {SESSION}'", answer.body.decode()
        )
        self.tracker.end(op)

    def test_a_tracked_call_reads_its_requests_timeout_and_session(self):
        seen = []

        class Manager:
            weight_update_tracker = self.tracker

            @track_weight_update("complete_weight_update")
            async def complete(self, obj, request=None):
                seen.extend(self.weight_update_tracker.operations())

        request = types.SimpleNamespace(timeout=5.0, session_id=SESSION)
        asyncio.run(Manager().complete(request))
        (op,) = seen
        self.assertEqual((op.deadline, op.session_id), (15.0, SESSION))
        self.assertFalse(self.tracker.in_progress)


if __name__ == "__main__":
    unittest.main()
