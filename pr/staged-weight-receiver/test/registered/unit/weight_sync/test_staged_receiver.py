"""Unit tests for the staged weight receiver of two-phase weight updates — no
server, no model (a trainer process sends over a CPU gloo group)."""

import multiprocessing as mp
import time
import unittest
from datetime import timedelta

import torch
import torch.distributed as dist

from sglang.srt.weight_sync.bucket_header import ABORT, DATA, make_header
from sglang.srt.weight_sync.digest import MAX_DIGEST_BYTES, digest_bytes
from sglang.srt.weight_sync.staged_receiver import (
    StagedWeightReceiver,
    StagingPool,
    WeightsUpdateError,
    check_digest_format,
    group_timeout,
    parse_buckets,
    parse_dtype,
    parse_shape,
    ring_bytes,
)
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase

register_cpu_ci(est_time=25, suite="base-a-test-cpu")

CPU = torch.device("cpu")
GOOD_DIGEST = "psum61:" + "0" * 15 + "1:" + "0" * 15 + "2"


def bucket(**fields):
    return {"names": ["w"], "dtypes": ["float32"], "shapes": [[2, 3]], **fields}


class TestMetadata(CustomTestCase):
    def test_malformed_metadata_raises_an_error_naming_the_field(self):
        cases = [
            ((1, [bucket()], "tensor"), "load_format"),
            (("1", [bucket()]), "num_buckets"),
            ((True, [bucket()]), "num_buckets"),
            ((2, [bucket()]), "num_buckets"),
            ((1, {"0": bucket()}), "buckets: must be a list"),
            ((0, []), "buckets: an update needs"),
            ((1, ["w"]), "buckets[0]: must be an object"),
            ((1, [bucket(offsets=[0])]), "buckets[0]: unknown field(s) ['offsets']"),
            ((1, [{"names": ["w"], "dtypes": ["float32"]}]), "buckets[0].shapes"),
            ((1, [bucket(names="w")]), "buckets[0].names"),
            ((1, [bucket(names=["w", "v"])]), "buckets[0]: names, dtypes and shapes"),
            ((1, [bucket(names=[], dtypes=[], shapes=[])]), "buckets[0].names"),
            ((1, [bucket(names=[""])]), "buckets[0].names[0]"),
            ((1, [bucket(names=[7])]), "buckets[0].names[0]"),
            ((2, [bucket(), bucket()]), "buckets[1].names[0]: duplicate name 'w'"),
            ((1, [bucket(dtypes=["float33"])]), "buckets[0].dtypes[0]: unknown"),
            ((1, [bucket(dtypes=[None])]), "buckets[0].dtypes[0]"),
            ((1, [bucket(dtypes=[["float32"]])]), "buckets[0].dtypes[0]"),
            ((1, [bucket(shapes=[6])]), "buckets[0].shapes[0]"),
            ((1, [bucket(shapes=[None])]), "buckets[0].shapes[0]"),
            ((1, [bucket(shapes=[[2, -3]])]), "buckets[0].shapes[0]"),
            ((1, [bucket(shapes=[[2.0, 3]])]), "buckets[0].shapes[0]"),
            ((1, [bucket(shapes=[[True, 6]])]), "buckets[0].shapes[0]"),
            ((1, [bucket(shapes=[["2", 3]])]), "buckets[0].shapes[0]"),
            ((1, [bucket(digest="psum61:12")]), "buckets[0].digest"),
            ((1, [bucket(digest=12)]), "buckets[0].digest"),
            ((1, [bucket(digest=GOOD_DIGEST.upper())]), "buckets[0].digest"),
            (
                (1, [bucket(digest="psum61:" + "f" * 16 + ":" + "0" * 16)]),
                "buckets[0].digest",
            ),
        ]
        for args, field in cases:
            with self.subTest(args=args):
                with self.assertRaises(WeightsUpdateError) as raised:
                    parse_buckets(*args)
                self.assertIn(field, str(raised.exception))
                self.assertEqual(raised.exception.status_code, 400)

    def test_a_name_the_model_lacks_is_refused(self):
        with self.assertRaises(WeightsUpdateError) as raised:
            parse_buckets(1, [bucket()], is_known_name=lambda name: name != "w")
        self.assertIn(
            "buckets[0].names[0]: the model has no parameter 'w'", str(raised.exception)
        )

    def test_good_metadata_parses_into_packed_offsets(self):
        specs = parse_buckets(
            2,
            [
                {
                    "names": ["a", "b", "c", "d"],
                    "dtypes": ["torch.bfloat16", "int8", "float32", "float16"],
                    "shapes": [[2, 3], (5,), [], [0, 4]],
                    "digest": GOOD_DIGEST,
                },
                bucket(names=["e"]),
            ],
            "flattened_bucket",
        )
        first = specs[0]
        self.assertEqual([t.name for t in first.tensors], ["a", "b", "c", "d"])
        self.assertEqual(first.tensors[0].dtype, torch.bfloat16)
        self.assertEqual([t.shape for t in first.tensors], [(2, 3), (5,), (), (0, 4)])
        self.assertEqual([t.offset for t in first.tensors], [0, 12, 17, 21])
        self.assertEqual([t.nbytes for t in first.tensors], [12, 5, 4, 0])
        self.assertEqual(
            (first.index, first.nbytes, first.digest), (0, 21, GOOD_DIGEST)
        )
        self.assertEqual(
            (specs[1].index, specs[1].nbytes, specs[1].digest), (1, 24, None)
        )
        self.assertEqual(parse_dtype("float16", "x"), torch.float16)
        self.assertEqual(parse_shape((2, 3), "x"), (2, 3))

    def test_a_digest_of_another_algorithm_gets_the_hint(self):
        with self.assertRaises(WeightsUpdateError) as raised:
            check_digest_format("sha256:abcd", "buckets[3].digest")
        message = str(raised.exception)
        self.assertIn("buckets[3].digest", message)
        self.assertIn("'sha256' is not accepted by this server", message)
        with self.assertRaises(WeightsUpdateError) as raised:
            check_digest_format("psum61:abcd", "d")
        self.assertNotIn("is not accepted", str(raised.exception))

    def test_a_digest_covers_buckets_below_its_size_limit(self):
        check_digest_format(GOOD_DIGEST, "d", MAX_DIGEST_BYTES - 1)
        with self.assertRaises(WeightsUpdateError) as raised:
            check_digest_format(GOOD_DIGEST, "d", MAX_DIGEST_BYTES)
        self.assertIn("256 GiB", str(raised.exception))


class TestStagingPool(CustomTestCase):
    def test_buffers_are_reused_for_the_same_size_only(self):
        pool = StagingPool(CPU)
        first, reused = pool.acquire(100)
        self.assertFalse(reused)
        self.assertEqual(
            [(b.numel(), b.dtype) for b in first], [(100, torch.uint8)] * 2
        )
        again, reused = pool.acquire(100)
        self.assertTrue(reused)
        self.assertTrue(all(a is b for a, b in zip(again, first)))
        self.assertEqual(pool.nbytes, 200)
        self.assertFalse(pool.acquire(50)[1])
        self.assertFalse(pool.acquire(50, count=3)[1])
        self.assertEqual(pool.nbytes, 150)
        pool.release()
        self.assertEqual(pool.nbytes, 0)

    def test_ring_bytes_is_the_largest_bucket_times_the_buffers(self):
        specs = parse_buckets(
            2, [bucket(names=["a"]), bucket(names=["b"], shapes=[[10]])]
        )
        self.assertEqual(ring_bytes(specs), 2 * 40)
        self.assertEqual(ring_bytes(specs, count=3), 3 * 40)


# --- a real receive -----------------------------------------------------------


def trainer(port, orders, acks):
    """Rank 0, in its own process: joins a new group or broadcasts a list of
    tensors on the latest one, as each order says."""
    store = dist.TCPStore("127.0.0.1", port, 2, False, timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=0, world_size=2)
    group = None
    while (order := orders.get()) is not None:
        if order == "new group":
            group = dist.new_group(backend="gloo")
        else:
            for tensor in order:
                dist.broadcast(tensor, src=0, group=group)
        acks.put("done")
    dist.destroy_process_group()


def packed(tensors):
    return torch.cat([t.reshape(-1).view(torch.uint8) for t in tensors])


def wait_until(condition, what, deadline_s=30.0):
    deadline = time.monotonic() + deadline_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


class TestStagedWeightReceiver(CustomTestCase):
    """This process is rank 1 of each test's own gloo group, as an engine."""

    @classmethod
    def setUpClass(cls):
        ctx = mp.get_context("spawn")
        cls.orders, cls.acks = ctx.Queue(), ctx.Queue()
        store = dist.TCPStore(
            "127.0.0.1", 0, 2, True, timedelta(seconds=60), wait_for_workers=False
        )
        cls.trainer = ctx.Process(
            target=trainer, args=(store.port, cls.orders, cls.acks), daemon=True
        )
        cls.trainer.start()
        dist.init_process_group(
            "gloo", store=store, rank=1, world_size=2, timeout=timedelta(seconds=60)
        )

    @classmethod
    def tearDownClass(cls):
        if dist.is_initialized():
            cls.orders.put(None)
            dist.destroy_process_group()
        cls.trainer.join(30)
        if cls.trainer.is_alive():
            cls.trainer.kill()

    def setUp(self):
        super().setUp()
        self.new_group(timeout=30)

    def new_group(self, timeout):
        self.orders.put("new group")
        self.group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout))
        self.assertEqual(self.acks.get(timeout=60), "done")

    def send(self, *tensors):
        self.orders.put(list(tensors))
        self.assertEqual(self.acks.get(timeout=60), "done")

    def receiver(self, buckets, load_format="flattened_bucket", **kwargs):
        specs = parse_buckets(len(buckets), buckets, load_format)
        return StagedWeightReceiver(
            specs, self.group, StagingPool(CPU), load_format, **kwargs
        )

    def test_group_timeout_is_the_groups_own_in_seconds(self):
        self.assertEqual(group_timeout(self.group, CPU), 30.0)
        self.assertIsNone(group_timeout(object(), CPU))

    def test_flattened_buckets_land_in_the_sink_with_their_bytes(self):
        weights = {
            "a": torch.randn(2, 3),
            "b": torch.randn(4).to(torch.bfloat16),
            "c": torch.arange(5, dtype=torch.int8),
            "d": torch.randn(7),
        }
        layout = [["a", "b"], ["c"], ["d"]]  # three buckets through two buffers
        buckets = [
            {
                "names": names,
                "dtypes": [str(weights[n].dtype) for n in names],
                "shapes": [list(weights[n].shape) for n in names],
                "digest": digest_bytes(packed([weights[n] for n in names])),
            }
            for names in layout
        ]
        landed = {}
        receiver = self.receiver(
            buckets,
            sink=lambda tensors: landed.update((n, t.clone()) for n, t in tensors),
        )
        receiver.start()
        self.send(*(packed([weights[n] for n in names]) for names in layout))
        self.assertTrue(receiver.wait(30))
        self.assertTrue(receiver.complete, receiver.error)
        self.assertEqual(receiver.verify(), [])
        self.assertEqual(landed.keys(), weights.keys())
        for name, tensor in weights.items():
            self.assertEqual(landed[name].dtype, tensor.dtype)
            self.assertTrue(torch.equal(landed[name], tensor), name)
        self.assertEqual(receiver.stats.bytes_received, 24 + 8 + 5 + 28)

    def test_tensors_broadcast_one_by_one_land_even_when_misaligned(self):
        weights = [
            torch.arange(3, dtype=torch.int8),
            torch.randn(2),  # at byte 3: misaligned for float32
            torch.randn(2, 2).to(torch.float16),
        ]
        names = ["x", "y", "z"]
        landed = {}
        receiver = self.receiver(
            [
                {
                    "names": names,
                    "dtypes": [str(t.dtype) for t in weights],
                    "shapes": [list(t.shape) for t in weights],
                }
            ],
            load_format=None,
            sink=lambda tensors: landed.update((n, t.clone()) for n, t in tensors),
        )
        receiver.start()
        self.send(*weights)
        self.assertTrue(receiver.wait(30))
        self.assertTrue(receiver.complete, receiver.error)
        for name, tensor in zip(names, weights):
            self.assertTrue(torch.equal(landed[name], tensor), name)

    def test_a_digest_mismatch_is_reported_with_prepare_or_complete(self):
        payloads = [
            torch.arange(8, dtype=torch.uint8),
            torch.full((8,), 7, dtype=torch.uint8),
        ]
        wrong = digest_bytes(torch.zeros(8, dtype=torch.uint8))
        buckets = [
            {"names": ["a"], "dtypes": ["uint8"], "shapes": [[8]], "digest": wrong},
            {"names": ["b"], "dtypes": ["uint8"], "shapes": [[8]]},
        ]
        receiver = self.receiver(buckets, defer_digests=True)
        receiver.start()
        self.send(*payloads)
        self.assertTrue(receiver.wait(30))
        self.assertTrue(receiver.complete, receiver.error)
        right = [digest_bytes(p) for p in payloads]
        errors = receiver.verify(right)
        self.assertEqual(len(errors), 1)
        self.assertIn(f"bucket 0 (a, ...): digest {right[0]} does not match", errors[0])
        errors = receiver.verify([right[0], wrong])
        self.assertEqual(len(errors), 2)
        self.assertIn(f"bucket 1 (b, ...): digest {right[1]} does not match", errors[1])

    def test_an_abort_header_ends_the_receive_in_step(self):
        data = torch.arange(8, dtype=torch.uint8)
        buckets = [
            {"names": [name], "dtypes": ["uint8"], "shapes": [[8]]} for name in "ab"
        ]
        receiver = self.receiver(buckets, session_id="s1")
        receiver.start()
        self.send(
            make_header("s1", 0, DATA, CPU), data, make_header("s1", 1, ABORT, CPU)
        )
        self.assertTrue(receiver.wait(30))
        self.assertTrue(receiver.sender_aborted)
        self.assertEqual(receiver.error, "the sender aborted the update")
        self.assertFalse(receiver.complete)
        self.assertTrue(receiver.abort())

    def test_an_abort_before_anything_is_posted_gives_the_group_up(self):
        # The abort comes while the sink is being readied for the first bucket.
        receiver = self.receiver(
            [bucket()], before_first_bucket=lambda: receiver.abort(timeout=0)
        )
        receiver.start()
        self.assertTrue(receiver.wait(30))
        self.assertEqual(receiver.error, "aborted")
        self.assertEqual(receiver.pending_works, [])
        # The trainer was told to broadcast: its bytes may be on the wire.
        self.assertFalse(receiver.abort())

    def test_an_abort_before_anything_arrives_gives_the_group_up(self):
        receiver = self.receiver([bucket()])
        receiver.start()
        wait_until(lambda: receiver.pending_works, "the receive to be posted")
        self.assertFalse(receiver.abort(30))
        self.assertIn("aborted while waiting", receiver.error)
        self.assertFalse(receiver.complete)
        # The posted receive is still there: the trainer's bucket completes it.
        self.send(torch.zeros(24, dtype=torch.uint8))
        wait_until(receiver.pending_works[0].is_completed, "the posted receive")

    def test_a_silent_sender_ends_the_receive_at_the_group_timeout(self):
        self.new_group(timeout=3)
        receiver = self.receiver([bucket()])
        receiver.start()
        self.assertTrue(receiver.wait(60))
        self.assertIn("nothing from the sender after", receiver.error)
        self.assertIn("the update group's timeout", receiver.error)
        self.assertFalse(receiver.complete)
        self.assertFalse(receiver.abort())


if __name__ == "__main__":
    unittest.main()
