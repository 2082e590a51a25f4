"""Unit tests for the checks a memory release or resume makes before it
changes anything — no server."""

import multiprocessing as mp
import socket
import types
import unittest
from datetime import timedelta

import torch.distributed as dist

from sglang.srt.constants import GPU_MEMORY_ALL_TYPES
from sglang.srt.managers.memory_occupation_checks import (
    agreed_refusal,
    memory_release_refusal,
    memory_resume_refusal,
    raise_refusals,
)
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase

register_cpu_ci(est_time=1, suite="base-a-test-cpu")


class TestMemoryReleaseRefusal(CustomTestCase):
    def test_an_idle_server_releases_what_it_holds(self):
        self.assertIsNone(memory_release_refusal(None, released=[], idle=True))
        self.assertIsNone(
            memory_release_refusal(["kv_cache"], released=["weights"], idle=True)
        )

    def test_a_server_that_is_not_idle_refuses(self):
        refusal = memory_release_refusal(None, released=[], idle=False)
        self.assertIn("not idle", refusal)
        self.assertTrue(refusal.endswith("nothing was released"))

    def test_a_tag_released_already_is_refused_even_when_idle(self):
        refusal = memory_release_refusal(["weights"], ["weights"], idle=True)
        self.assertIn("weights released already", refusal)
        # No tags means every type, and one of them is released.
        self.assertIn(
            "released already", memory_release_refusal([], ["kv_cache"], True)
        )

    def test_unknown_and_repeated_tags_are_refused_before_idleness(self):
        refusal = memory_release_refusal(["kv_cache", "vram"], [], idle=False)
        self.assertIn("unknown 'vram'", refusal)
        self.assertIn(", ".join(GPU_MEMORY_ALL_TYPES), refusal)
        refusal = memory_release_refusal(["weights", "weights"], [], idle=True)
        self.assertIn("weights given more than once", refusal)

    def test_many_unknown_tags_are_named_eight_at_most_and_cut_short(self):
        refusal = memory_release_refusal([f"t{i}" for i in range(50)], [], True)
        self.assertIn("'t7' and 42 more", refusal)
        self.assertNotIn("'t8'", refusal)
        long = memory_release_refusal(["x" * 10_000], [], True)
        self.assertLess(len(long), 300)


class TestMemoryResumeRefusal(CustomTestCase):
    def test_a_resume_of_what_was_released_passes(self):
        self.assertIsNone(memory_resume_refusal(["kv_cache"], ["kv_cache"]))
        self.assertIsNone(memory_resume_refusal(None, GPU_MEMORY_ALL_TYPES))

    def test_a_resume_of_what_was_not_released_is_refused(self):
        refusal = memory_resume_refusal(["weights"], ["kv_cache"])
        self.assertIn("weights not released (released: kv_cache)", refusal)
        refusal = memory_resume_refusal(None, [])
        self.assertIn("(released: none)", refusal)
        self.assertTrue(refusal.endswith("nothing was resumed"))

    def test_a_tag_given_twice_is_refused(self):
        refusal = memory_resume_refusal(["kv_cache", "kv_cache"], ["kv_cache"])
        self.assertIn("kv_cache given more than once", refusal)


def _output(success, message=""):
    return types.SimpleNamespace(success=success, message=message)


class TestRaiseRefusals(CustomTestCase):
    def test_every_replica_done_raises_nothing(self):
        raise_refusals([_output(True), _output(True)], "released")

    def test_a_refusal_raises_it_and_says_what_the_others_did(self):
        with self.assertRaises(ValueError) as caught:
            raise_refusals([_output(False, "busy"), _output(True)], "released")
        self.assertEqual(
            str(caught.exception),
            "busy (1 of 2 DP replicas refused; the others released)",
        )

    def test_the_same_refusal_of_every_replica_is_said_once(self):
        with self.assertRaises(ValueError) as caught:
            raise_refusals([_output(False, "busy"), _output(False, "busy")], "x")
        self.assertEqual(str(caught.exception), "busy")


def agree(rank, port, refusal, answers):
    store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    answers.put((rank, agreed_refusal(refusal, dist.group.WORLD)))
    dist.destroy_process_group()


class TestAgreedRefusal(CustomTestCase):
    def test_alone_a_rank_keeps_its_own_answer(self):
        self.assertIsNone(agreed_refusal(None, None))
        self.assertEqual(agreed_refusal("busy", None), "busy")

    def test_every_rank_refuses_when_one_does(self):
        """With attention data parallelism each rank holds its own requests:
        one busy rank refusing while the other released left it in a
        barrier."""
        ctx = mp.get_context("spawn")
        answers = ctx.Queue()
        with socket.socket() as free:
            free.bind(("127.0.0.1", 0))
            port = free.getsockname()[1]
        ranks = [
            ctx.Process(target=agree, args=(rank, port, refusal, answers))
            for rank, refusal in ((0, None), (1, "rank 1 is not idle"))
        ]
        for process in ranks:
            process.start()
        got = dict(answers.get(timeout=60) for _ in ranks)
        for process in ranks:
            process.join(30)
        self.assertEqual(got, {0: "rank 1 is not idle", 1: "rank 1 is not idle"})


if __name__ == "__main__":
    unittest.main()
