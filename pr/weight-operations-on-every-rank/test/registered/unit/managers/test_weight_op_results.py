"""Unit tests for every TP rank's result of a scheduler operation — no
server; the TP group's all-gather is replaced by the ranks' answers."""

import types
import unittest
from unittest import mock

from sglang.srt.managers import weight_op_results
from sglang.srt.managers.weight_op_results import (
    RankedResult,
    gather_from_tp_ranks,
    rank_results_of,
)
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase

register_cpu_ci(est_time=1, suite="base-a-test-cpu")


def scheduler(tp_rank=0, tp_size=2, dp_size=1, dp_rank=0):
    return types.SimpleNamespace(
        tp_rank=tp_rank,
        tp_size=tp_size,
        dp_rank=dp_rank,
        tp_cpu_group=None,
        server_args=types.SimpleNamespace(dp_size=dp_size),
    )


def other_ranks_answer(*answers):
    """all_gather_object as the TP group would fill it: this rank's result,
    then the other ranks' `answers`."""

    def gather(out, mine, group=None):
        out[:] = [mine, *answers]

    return mock.patch.object(
        weight_op_results.torch.distributed, "all_gather_object", gather
    )


class TestWeightOpResults(CustomTestCase):
    def test_every_rank_s_result_is_gathered_with_its_rank(self):
        with other_ranks_answer({"rank": 1, "success": False}):
            results = gather_from_tp_ranks(scheduler(), {"success": True})
        self.assertEqual(
            results, [{"rank": 0, "success": True}, {"rank": 1, "success": False}]
        )

    def test_one_rank_needs_no_collective(self):
        results = gather_from_tp_ranks(scheduler(tp_size=1), {"success": True})
        self.assertEqual(results, [{"rank": 0, "success": True}])

    def test_the_results_of_every_output_are_collected(self):
        outputs = [
            types.SimpleNamespace(rank_results=[{"rank": 0}, {"rank": 1}]),
            types.SimpleNamespace(rank_results=None),
            types.SimpleNamespace(),
        ]
        self.assertEqual(rank_results_of(outputs), [{"rank": 0}, {"rank": 1}])

    def test_a_ranked_result_unpacks_as_the_tuple_it_replaces(self):
        success, message = RankedResult((True, "ok"), [{"rank": 0}])
        self.assertEqual((success, message), (True, "ok"))
        self.assertEqual(
            RankedResult((True, "ok"), [{"rank": 0}]).rank_results, [{"rank": 0}]
        )
        self.assertEqual(RankedResult((True, "ok")).rank_results, [])


if __name__ == "__main__":
    unittest.main()
