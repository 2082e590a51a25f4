"""The scheduler's request dispatcher as it is built: each blocking weight
operation runs inside one watchdog pause, its TP ranks' gather included —
no server; a stand-in scheduler, and the TP group's all-gather replaced by
the other rank's answer."""

import types
import unittest
from functools import partial
from unittest import mock

from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase, maybe_stub_sgl_kernel

maybe_stub_sgl_kernel()  # must precede io_struct, which pulls in sgl_kernel

from sglang.srt.managers import io_struct, weight_op_results
from sglang.srt.managers.scheduler import Scheduler

register_cpu_ci(est_time=30, suite="base-a-test-cpu")

# Request type: the weight updater's handler it reaches.
PAUSED_AND_GATHERED = {
    io_struct.UpdateWeightFromDiskReqInput: "update_weights_from_disk",
    io_struct.InitWeightsUpdateGroupReqInput: "init_weights_update_group",
    io_struct.UpdateWeightsFromDistributedReqInput: "update_weights_from_distributed",
    io_struct.UpdateWeightsFromTensorReqInput: "update_weights_from_tensor",
    io_struct.UpdateWeightsFromIPCReqInput: "update_weights_from_ipc",
}
PAUSED_ONLY = {
    io_struct.BeginWeightUpdateReqInput: "begin_weight_update",
    io_struct.EndWeightUpdateReqInput: "end_weight_update",
}
GATHERED_ONLY = {
    io_struct.DestroyWeightsUpdateGroupReqInput: "destroy_weights_update_group",
}


def request(cls):
    # Dispatch goes by type; the handlers here never read a field.
    return cls.__new__(cls)


class TestWeightOperationDispatch(CustomTestCase):
    def setUp(self):
        scheduler = mock.MagicMock()
        scheduler.tp_rank, scheduler.tp_size = 0, 2
        scheduler.server_args.dp_size = 1
        scheduler.server_args.weight_update_health_deadline = 42.0
        # The real wrappers, on the stand-in.
        for name in ("_pausing_watchdogs", "_reporting_every_rank"):
            setattr(scheduler, name, partial(getattr(Scheduler, name), scheduler))
        Scheduler.init_request_dispatcher(scheduler)
        self.scheduler = scheduler
        self.events = []
        for watchdog in (scheduler.watchdog, scheduler.soft_watchdog):
            watchdog.pause.side_effect = self.recorder("pause")
            watchdog.resume.side_effect = self.recorder("resume")

    def recorder(self, event):
        return lambda *args: self.events.append(event)

    def answer(self, handler_name):
        """The weight updater's handler answers ok, recording the call."""
        output = types.SimpleNamespace(success=True, message="ok")

        def handle(recv_req):
            self.events.append("handler")
            return output

        getattr(self.scheduler.weight_updater, handler_name).side_effect = handle
        return output

    def dispatch(self, cls):
        def gather(out, mine, group=None):
            self.events.append("gather")
            out[:] = [mine, {"rank": 1, "success": False, "message": "oom"}]

        with mock.patch.object(
            weight_op_results.torch.distributed, "all_gather_object", gather
        ):
            return self.scheduler._request_dispatcher(request(cls))

    def test_one_pause_covers_the_operation_and_the_gather(self):
        for cls, handler_name in PAUSED_AND_GATHERED.items():
            with self.subTest(cls.__name__):
                self.events.clear()
                output = self.answer(handler_name)
                self.assertIs(self.dispatch(cls), output)
                # Both watchdogs pause once, before the handler; the gather
                # waits for the slowest rank still paused.
                self.assertEqual(
                    self.events,
                    ["pause", "pause", "handler", "gather", "resume", "resume"],
                )
                # The other rank's failure is the answer, naming the rank.
                self.assertFalse(output.success)
                self.assertEqual(output.message, "TP rank 1: oom")

    def test_each_pause_is_ended_by_its_own_resume(self):
        self.answer("update_weights_from_distributed")
        for watchdog in (self.scheduler.watchdog, self.scheduler.soft_watchdog):
            watchdog.pause.side_effect = None
        self.dispatch(io_struct.UpdateWeightsFromDistributedReqInput)
        for watchdog in (self.scheduler.watchdog, self.scheduler.soft_watchdog):
            watchdog.pause.assert_called_once_with(42.0)
            watchdog.resume.assert_called_once_with(watchdog.pause.return_value)

    def test_begin_and_end_pause_and_destroy_gathers(self):
        for cls, handler_name in PAUSED_ONLY.items():
            with self.subTest(cls.__name__):
                self.events.clear()
                self.answer(handler_name)
                self.dispatch(cls)
                self.assertEqual(
                    self.events, ["pause", "pause", "handler", "resume", "resume"]
                )
        for cls, handler_name in GATHERED_ONLY.items():
            with self.subTest(cls.__name__):
                self.events.clear()
                self.answer(handler_name)
                self.dispatch(cls)
                self.assertEqual(self.events, ["handler", "gather"])


if __name__ == "__main__":
    unittest.main()
