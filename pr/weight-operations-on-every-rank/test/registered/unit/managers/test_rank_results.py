"""Unit tests for admin weight operations failing on any TP rank — no
server; the TP group's all-gather is replaced by the ranks' answers."""

import asyncio
import types
import unittest
from unittest import mock

from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase, maybe_stub_sgl_kernel

maybe_stub_sgl_kernel()  # must precede io_struct, which pulls in sgl_kernel

from sglang.srt.managers import weight_op_results
from sglang.srt.managers.tokenizer_manager import TokenizerManager
from sglang.srt.managers.weight_op_results import gather_rank_results
from sglang.srt.managers.weight_update_health import (
    pause_watchdogs_during_weight_update,
)

register_cpu_ci(est_time=1, suite="base-a-test-cpu")


def scheduler(tp_rank=0, tp_size=2, dp_size=1, dp_rank=0):
    return types.SimpleNamespace(
        tp_rank=tp_rank,
        tp_size=tp_size,
        dp_rank=dp_rank,
        tp_cpu_group=None,
        watchdog=mock.Mock(),
        server_args=types.SimpleNamespace(
            dp_size=dp_size,
            skip_tokenizer_init=True,
            weight_update_health_deadline=600.0,
        ),
    )


def other_ranks_answer(*answers):
    """all_gather_object as the TP group would fill it: this rank's result,
    then the other ranks' `answers`."""

    def gather(out, mine, group=None):
        out[:] = [mine, *answers]

    return mock.patch.object(
        weight_op_results.torch.distributed, "all_gather_object", gather
    )


def handler_answering(output):
    """A scheduler handler whose own rank answers `output`."""

    @gather_rank_results
    def handler(scheduler, request):
        return output

    return handler


class TestRankResults(CustomTestCase):
    def test_one_pause_covers_the_operation_and_the_gather(self):
        # A rank done early waits for one still in its operation (a group
        # init may block up to the deadline): its watchdog must not count
        # then either, and the operation's one pause (one limit) covers both.
        rank = scheduler()
        output = types.SimpleNamespace(success=True, message="ok")

        def paused_once():
            rank.watchdog.pause.assert_called_once_with(600.0)
            rank.watchdog.resume.assert_not_called()

        @pause_watchdogs_during_weight_update
        @gather_rank_results
        def handler(scheduler, request):
            paused_once()
            return output

        def gather(out, mine, group=None):
            paused_once()
            out[:] = [mine, {"rank": 1, "success": True, "message": "ok"}]

        with mock.patch.object(
            weight_op_results.torch.distributed, "all_gather_object", gather
        ):
            handler(rank, None)
        rank.watchdog.resume.assert_called_once_with(rank.watchdog.pause.return_value)
        self.assertTrue(output.success)

    def test_a_failure_on_another_rank_fails_the_operation_naming_it(self):
        output = types.SimpleNamespace(success=True, message="ok")
        failed = {"rank": 1, "success": False, "message": "out of memory"}
        with other_ranks_answer(failed):
            handler_answering(output)(scheduler(), None)
        self.assertFalse(output.success)
        self.assertEqual(output.message, "TP rank 1: out of memory")
        self.assertEqual([r["rank"] for r in output.rank_results], [0, 1])

    def test_every_rank_succeeding_keeps_the_answer(self):
        output = types.SimpleNamespace(success=True, message="ok")
        with other_ranks_answer({"rank": 1, "success": True, "message": "ok"}):
            handler_answering(output)(scheduler(), None)
        self.assertTrue(output.success)
        self.assertEqual(output.message, "ok")
        self.assertEqual(len(output.rank_results), 2)

    def test_this_rank_s_own_failure_keeps_its_message(self):
        output = types.SimpleNamespace(success=False, message="bad path")
        with other_ranks_answer({"rank": 1, "success": False, "message": "x"}):
            handler_answering(output)(scheduler(), None)
        self.assertFalse(output.success)
        self.assertEqual(output.message, "bad path")


def replica_output(dp_rank, success=True):
    """What one DP replica's scheduler answers a load from disk."""
    return types.SimpleNamespace(
        success=success,
        message=f"replica {dp_rank}",
        num_paused_requests=0,
        rank_results=[
            {"rank": rank, "dp_rank": dp_rank, "success": success, "message": ""}
            for rank in (0, 1)
        ],
    )


async def load_from_disk_on_two_replicas(outputs):
    """The tokenizer manager's wait for a load from disk, on a stand-in with
    two DP replicas whose answers are `outputs`."""
    manager = types.SimpleNamespace(
        elastic_worker_count=2,
        server_args=types.SimpleNamespace(dp_size=2),
        send_to_scheduler=mock.Mock(),
        _dispatch_to_scheduler=mock.Mock(),
        _update_model_path_info=mock.Mock(),
    )

    async def answer():
        while not isinstance(
            getattr(manager, "model_update_result", None), asyncio.Future
        ):
            await asyncio.sleep(0)
        manager.model_update_result.set_result(outputs)

    replicas = asyncio.create_task(answer())
    request = types.SimpleNamespace(model_path="m", load_format=None)
    result = await asyncio.wait_for(
        TokenizerManager._wait_for_model_update_from_disk(manager, request), 30
    )
    await replicas
    return result


class TestDiskLoadOnEveryReplica(CustomTestCase):
    def test_a_load_from_disk_answers_every_rank_of_every_replica(self):
        # Replicas answer in any order; the ranks come back by DP then TP rank.
        result = asyncio.run(
            load_from_disk_on_two_replicas([replica_output(1), replica_output(0)])
        )
        success, message, paused = result
        self.assertTrue(success)
        self.assertEqual(
            [(r["dp_rank"], r["rank"]) for r in result.rank_results],
            [(0, 0), (0, 1), (1, 0), (1, 1)],
        )


if __name__ == "__main__":
    unittest.main()
