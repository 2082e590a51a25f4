"""Unit tests for one weight update streamed by several senders — no server,
no update group; the shares' receivers are stand-ins."""

import threading
import unittest
from unittest import mock

from sglang.srt.weight_sync import session_shares
from sglang.srt.weight_sync.session_shares import (
    MAX_SHARES,
    SerialSink,
    SharedSessionReceiver,
    check_one_owner,
    parse_shares,
)
from sglang.srt.weight_sync.staged_receiver import (
    BucketSpec,
    ReceiveStats,
    WeightsUpdateError,
)
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase

register_cpu_ci(est_time=3, suite="base-a-test-cpu")


def bucket(*names):
    n = len(names)
    return {"names": list(names), "dtypes": ["bfloat16"] * n, "shapes": [[2]] * n}


def share(group_name, *names):
    return {"group_name": group_name, "num_buckets": 1, "buckets": [bucket(*names)]}


def parse(shares, top=("embed.weight",), **kwargs):
    return parse_shares("stage0", 1, [bucket(*top)], shares, None, **kwargs)


class TestParseShares(CustomTestCase):
    def test_each_share_keeps_its_group_and_buckets(self):
        self.assertEqual([s.group_name for s in parse(None)], ["stage0"])
        out = parse([share("stage1", "layers.1.weight", "lm_head.weight")])
        self.assertEqual([s.group_name for s in out], ["stage0", "stage1"])
        names = [t.name for t in out[1].buckets[0].tensors]
        self.assertEqual(names, ["layers.1.weight", "lm_head.weight"])

    def test_every_malformed_field_is_named(self):
        good = share("stage1", "x")
        cases = [
            ("stage1", "shares: must be a list"),
            ([["stage1"]], "shares[0]: must be an object"),
            ([dict(good, extra=1)], "shares[0]: unknown field(s) ['extra']"),
            ([dict(good, group_name="")], "shares[0].group_name: must be a non-empty"),
            ([dict(good, group_name=7)], "shares[0].group_name: must be a non-empty"),
            ([share("stage0", "x")], "shares[0].group_name: group 'stage0' already"),
            ([good, share("stage1", "y")], "shares[1].group_name: group 'stage1'"),
            ([dict(good, num_buckets=2)], "shares[0].num_buckets: 2 disagrees"),
            ([dict(good, buckets=[])], "shares[0].num_buckets: 1 disagrees"),
            (
                [dict(good, buckets=[dict(bucket("x"), dtypes=["float7"])])],
                "shares[0].buckets[0].dtypes[0]: unknown dtype",
            ),
            ([share("stage1", "x", "x")], "shares[0].buckets[0].names[1]: duplicate"),
        ]
        for shares, message in cases:
            with self.subTest(message):
                with self.assertRaises(WeightsUpdateError) as caught:
                    parse(shares)
                self.assertTrue(str(caught.exception).startswith(message))
                self.assertEqual(caught.exception.status_code, 400)

    def test_an_unknown_name_in_a_share_is_named(self):
        with self.assertRaisesRegex(
            WeightsUpdateError, r"^shares\[0\]\.buckets\[0\]\.names\[0\]: .*'typo'"
        ):
            parse([share("stage1", "typo")], is_known_name=lambda n: n != "typo")

    def test_a_tensor_sent_by_two_shares_is_refused_naming_both(self):
        with self.assertRaises(WeightsUpdateError) as caught:
            parse([share("stage1", "a"), share("stage2", "b", "embed.weight")])
        self.assertEqual(
            str(caught.exception),
            "shares[1].buckets[0].names[1]: 'embed.weight' is also sent at "
            "buckets[0].names[0]; each tensor belongs to one share",
        )

    def test_shares_are_limited(self):
        shares = [share(f"stage{k}", f"layers.{k}") for k in range(1, MAX_SHARES)]
        self.assertEqual(len(parse(shares)), MAX_SHARES)
        shares.append(share("one_too_many", "layers.x"))
        with self.assertRaisesRegex(
            WeightsUpdateError, rf"^shares: {MAX_SHARES} shares"
        ):
            parse(shares)


# What each name loads into: its parameter and the shard of it (None: whole).
TARGETS = {
    "attn.q_proj": ("attn.qkv_proj", "q"),
    "attn.k_proj": ("attn.qkv_proj", "k"),
    "attn.v_proj": ("attn.qkv_proj", "v"),
    "attn.query": ("attn.qkv_proj", "q"),  # another checkpoint's name for it
    "attn.qkv_proj": ("attn.qkv_proj", None),
    "embed": ("embed", None),
    "lm_head": ("embed", None),  # tied to embed
    "mlp": ("mlp", None),
}


def check_owners(*shares):
    """check_one_owner over shares sending these names, group_name's first."""
    others = [share(f"stage{k}", *names) for k, names in enumerate(shares[1:], 1)]
    specs = parse_shares("stage0", 1, [bucket(*shares[0])], others, None)
    check_one_owner(specs, TARGETS.__getitem__)


class TestCheckOneOwner(CustomTestCase):
    def test_shards_of_one_fused_parameter_may_come_from_different_shares(self):
        check_owners(["attn.q_proj"], ["attn.k_proj", "mlp"], ["attn.v_proj"])

    def test_one_share_may_load_a_parameter_whole_and_by_shard(self):
        check_owners(["attn.qkv_proj", "attn.q_proj", "attn.query"], ["mlp"])

    def test_two_shares_loading_one_part_are_refused_naming_both(self):
        for shares, where, clash in (
            ((["attn.q_proj"], ["attn.qkv_proj"]), "shares[0]", "buckets[0]"),
            ((["attn.qkv_proj"], ["attn.k_proj"]), "shares[0]", "buckets[0]"),
            ((["embed"], ["mlp", "lm_head"]), "shares[0]", "buckets[0]"),
            (
                (["mlp"], ["attn.q_proj"], ["attn.query"]),
                "shares[1]",
                "shares[0].buckets[0]",
            ),
        ):
            with self.subTest(shares=shares):
                with self.assertRaises(WeightsUpdateError) as caught:
                    check_owners(*shares)
                message = str(caught.exception)
                self.assertTrue(message.startswith(f"{where}.buckets[0].names["))
                self.assertIn(f"same part of {TARGETS[shares[-1][-1]][0]!r}", message)
                self.assertIn(f" as {clash}.names[0], which another share", message)


class TestSerialSink(CustomTestCase):
    def test_begin_runs_once_and_one_bucket_loads_at_a_time(self):
        begins, inside, release = [], threading.Event(), threading.Event()
        second_in = threading.Event()

        def load(tensors):
            if tensors == "first":
                inside.set()
                release.wait(10)
            else:
                second_in.set()

        sink = SerialSink(lambda: begins.append(1), load)
        threads = [threading.Thread(target=sink.begin) for _ in range(8)]
        threads += [threading.Thread(target=sink.load, args=("first",))]
        for t in threads:
            t.start()
        self.assertTrue(inside.wait(10))
        second = threading.Thread(target=sink.load, args=("second",))
        second.start()
        self.assertFalse(second_in.wait(0.2))  # held while "first" loads
        release.set()
        self.assertTrue(second_in.wait(10))
        for t in threads + [second]:
            t.join(10)
        self.assertEqual(begins, [1])


class FakeReceiver:
    """What SharedSessionReceiver reads of a share's receiver."""

    def __init__(self, clock, nbuckets, takes=0.0, finishes=True, error=None):
        self.clock, self.takes, self.finishes = clock, takes, finishes
        self.buckets = [BucketSpec(i, [], 10 * (i + 1)) for i in range(nbuckets)]
        self.error, self.pending_works = error, []
        self.landed_digests = {i: f"d{i}" for i in range(nbuckets)}
        nbytes = sum(b.nbytes for b in self.buckets)
        self.stats = ReceiveStats(
            bytes_received=nbytes,
            buckets_received=nbuckets,
            receive_seconds=takes,
            verify_seconds=1.0,
            load_seconds=2.0,
            staging_reused=True,
        )
        self.waited, self.aborted, self.verified = [], [], []

    def wait(self, timeout):
        self.waited.append(timeout)
        self.clock[0] += self.takes
        return self.finishes

    def abort(self, timeout, sender_grace):
        self.aborted.append((timeout, sender_grace))
        return self.error is None

    def verify(self, digests):
        self.verified.append(digests)
        return [] if self.error is None else [self.error]


class TestSharedSessionReceiver(CustomTestCase):
    def setUp(self):
        self.clock = [100.0]
        patcher = mock.patch.object(
            session_shares.time, "monotonic", lambda: self.clock[0]
        )
        patcher.start()
        self.addCleanup(patcher.stop)

    def session(self, *receivers):
        return SharedSessionReceiver([(f"g{k}", r) for k, r in enumerate(receivers)])

    def test_buckets_and_digests_are_numbered_in_share_order(self):
        a, b = FakeReceiver(self.clock, 2), FakeReceiver(self.clock, 3)
        s = self.session(a, b)
        self.assertEqual([x.index for x in s.buckets], [0, 1, 2, 3, 4])
        self.assertEqual([x.index for x in b.buckets], [0, 1, 2])  # untouched
        self.assertEqual(s.total_bytes, 30 + 60)
        self.assertEqual(s.landed_digests[3], "d1")
        self.assertEqual(s.verify(["A0", "A1", "B0", "B1", "B2"]), [])
        self.assertEqual(
            (a.verified, b.verified), ([["A0", "A1"]], [["B0", "B1", "B2"]])
        )

    def test_errors_name_their_group(self):
        self.assertIsNone(self.session(FakeReceiver(self.clock, 1)).error)
        s = self.session(
            FakeReceiver(self.clock, 1), FakeReceiver(self.clock, 1, error="bad digest")
        )
        self.assertEqual(s.error, "group 'g1': bad digest")
        self.assertEqual(s.verify(None), ["group 'g1': bad digest"])

    def test_the_shares_wait_on_one_deadline(self):
        a, b = FakeReceiver(self.clock, 1, takes=3.0), FakeReceiver(self.clock, 1)
        self.assertTrue(self.session(a, b).wait(10.0))
        self.assertEqual((a.waited, b.waited), ([10.0], [7.0]))
        late = FakeReceiver(self.clock, 1, takes=12.0)
        c = FakeReceiver(self.clock, 1)
        self.assertTrue(self.session(late, c).wait(10.0))
        self.assertEqual(c.waited, [0.0])
        stuck = FakeReceiver(self.clock, 1, finishes=False)
        d = FakeReceiver(self.clock, 1)
        self.assertFalse(self.session(stuck, d).wait(None))
        self.assertEqual((stuck.waited, d.waited), ([None], []))

    def test_abort_reaches_every_share_and_says_which_group_is_usable(self):
        a, b = FakeReceiver(self.clock, 1), FakeReceiver(self.clock, 1, error="x")
        s = self.session(a, b)
        self.assertFalse(s.abort(5.0, sender_grace=2.0, graced_groups=["g1"]))
        self.assertEqual((a.aborted, b.aborted), ([(5.0, 0)], [(5.0, 2.0)]))
        self.assertEqual(s.usable, {"g0": True, "g1": False})

    def test_stats_add_up_the_shares(self):
        s = self.session(
            FakeReceiver(self.clock, 2, takes=4.0),
            FakeReceiver(self.clock, 3, takes=1.0),
        )
        stats = s.stats
        self.assertEqual((stats.bytes_received, stats.buckets_received), (90, 5))
        self.assertEqual(stats.receive_seconds, 4.0)  # the slowest share
        self.assertEqual((stats.verify_seconds, stats.load_seconds), (2.0, 4.0))
        self.assertTrue(stats.staging_reused)


if __name__ == "__main__":
    unittest.main()
