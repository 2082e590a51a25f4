"""The scheduler's request dispatcher as it is built: each blocking weight
operation runs inside one watchdog pause, its TP ranks' gather included —
no server; a stand-in scheduler, and the TP group's all-gather replaced by
the other rank's answer."""

import dataclasses
import inspect
import unittest
from functools import partial
from unittest import mock

import msgspec

from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase, maybe_stub_sgl_kernel

maybe_stub_sgl_kernel()  # must precede io_struct, which pulls in sgl_kernel

from sglang.srt.managers import io_struct
from sglang.srt.managers import scheduler as scheduler_module
from sglang.srt.managers import weight_op_results
from sglang.srt.managers.scheduler import Scheduler

register_cpu_ci(est_time=30, suite="base-a-test-cpu")


def requests(**handlers):
    """{request type: the handler it reaches}, for the types this release has."""
    return {
        getattr(io_struct, name): handler
        for name, handler in handlers.items()
        if hasattr(io_struct, name)
    }


PAUSED_AND_GATHERED = requests(
    UpdateWeightFromDiskReqInput="update_weights_from_disk",
    InitWeightsUpdateGroupReqInput="init_weights_update_group",
    UpdateWeightsFromDistributedReqInput="update_weights_from_distributed",
    UpdateWeightsFromTensorReqInput="update_weights_from_tensor",
    UpdateWeightsFromIPCReqInput="update_weights_from_ipc",
)
PAUSED_ONLY = requests(
    BeginWeightUpdateReqInput="begin_weight_update",
    EndWeightUpdateReqInput="end_weight_update",
)
GATHERED_ONLY = requests(
    DestroyWeightsUpdateGroupReqInput="destroy_weights_update_group",
)
HANDLERS = {**PAUSED_AND_GATHERED, **PAUSED_ONLY, **GATHERED_ONLY}.values()

# Releases whose dispatcher wraps the weight updater's handlers; the others
# decorate the scheduler's own handlers, which call the TP worker.
WRAPS_HANDLERS = hasattr(Scheduler, "_pausing_watchdogs")


def request(cls):
    """A request of type `cls`, every required field None (dispatch goes by
    type; these handlers read no field that matters here)."""
    if dataclasses.is_dataclass(cls):
        required = [
            f.name
            for f in dataclasses.fields(cls)
            if f.init
            and f.default is dataclasses.MISSING
            and f.default_factory is dataclasses.MISSING
        ]
    else:
        required = [f.name for f in msgspec.structs.fields(cls) if f.required]
    return cls(**dict.fromkeys(required))


class TestTheSchedulerHasWhatTheGatherReads(CustomTestCase):
    def test_ranks_group_and_size(self):
        # The stand-ins here answer any attribute: ask the real class (a
        # property) or its module (set on the instance).
        source = inspect.getsource(scheduler_module)
        for name in ("tp_rank", "dp_rank", "tp_size", "tp_cpu_group"):
            with self.subTest(name):
                self.assertTrue(
                    isinstance(inspect.getattr_static(Scheduler, name, None), property)
                    or f"self.{name} = " in source,
                    f"the Scheduler has no {name}",
                )


class TestWeightOperationDispatch(CustomTestCase):
    def setUp(self):
        scheduler = mock.MagicMock()
        scheduler.tp_rank, scheduler.tp_size = 0, 2
        scheduler.server_args.dp_size = 1
        scheduler.server_args.weight_update_health_deadline = 42.0
        # The real wrappers or handlers, on the stand-in.
        if WRAPS_HANDLERS:
            real = ("_weight_operation", "_pausing_watchdogs", "_reporting_every_rank")
        else:
            real = HANDLERS
            # No two-phase session holds the weights or the group.
            for check in (
                "two_phase_session_conflict",
                "two_phase_session_holds_weights",
                "two_phase_destroy_fence",
                "abort_two_phase_session_on_group",
            ):
                getattr(scheduler, check).return_value = None
            scheduler.draft_worker = None
        for name in real:
            setattr(scheduler, name, partial(getattr(Scheduler, name), scheduler))
        Scheduler.init_request_dispatcher(scheduler)
        self.scheduler = scheduler
        self.events = []
        for watchdog in (scheduler.watchdog, scheduler.soft_watchdog):
            watchdog.pause.side_effect = self.recorder("pause")
            watchdog.resume.side_effect = self.recorder("resume")
        barrier = mock.patch("torch.distributed.barrier")
        barrier.start()
        self.addCleanup(barrier.stop)

    def recorder(self, event):
        return lambda *args: self.events.append(event)

    def answer(self, handler_name):
        """This rank's operation succeeds, recording the call."""
        if WRAPS_HANDLERS:
            owner = self.scheduler.weight_updater
            result = mock.Mock(success=True, message="ok")
        else:
            owner = self.scheduler.tp_worker
            result = (True, "ok")

        def operate(recv_req):
            self.events.append("operation")
            return result

        getattr(owner, handler_name).side_effect = operate

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
                self.answer(handler_name)
                output = self.dispatch(cls)
                # Both watchdogs pause once, before the operation; the gather
                # waits for the slowest rank still paused.
                self.assertEqual(
                    self.events,
                    ["pause", "pause", "operation", "gather", "resume", "resume"],
                )
                # The other rank's failure is the answer, naming the rank.
                self.assertFalse(output.success)
                self.assertEqual(output.message, "TP rank 1: oom")

    def test_each_pause_is_ended_by_its_own_resume(self):
        cls = io_struct.UpdateWeightsFromDistributedReqInput
        self.answer(PAUSED_AND_GATHERED[cls])
        watchdogs = (self.scheduler.watchdog, self.scheduler.soft_watchdog)
        for watchdog in watchdogs:
            watchdog.pause.side_effect = None
        self.dispatch(cls)
        for watchdog in watchdogs:
            watchdog.pause.assert_called_once_with(42.0)
            watchdog.resume.assert_called_once_with(watchdog.pause.return_value)

    def test_other_weight_operations(self):
        for cls, handler_name in PAUSED_ONLY.items():
            with self.subTest(cls.__name__):
                self.events.clear()
                self.answer(handler_name)
                self.dispatch(cls)
                self.assertEqual(
                    self.events, ["pause", "pause", "operation", "resume", "resume"]
                )
        # Destroying a group does not block: no pause.
        for cls, handler_name in GATHERED_ONLY.items():
            with self.subTest(cls.__name__):
                self.events.clear()
                self.answer(handler_name)
                self.dispatch(cls)
                self.assertEqual(self.events, ["operation", "gather"])


if __name__ == "__main__":
    unittest.main()
