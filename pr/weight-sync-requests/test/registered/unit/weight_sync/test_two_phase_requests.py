"""Unit tests for the two-phase weight update's requests and answers — no
server, no scheduler."""

import asyncio
import copy
import json
import re
import time
import unittest

from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase, maybe_stub_sgl_kernel

maybe_stub_sgl_kernel()  # must precede io_struct, which pulls in sgl_kernel

from sglang.srt.managers.io_struct import (
    AbortWeightsUpdateReqInput,
    AbortWeightsUpdateReqOutput,
    CompleteWeightsUpdateReqInput,
    CompleteWeightsUpdateReqOutput,
    PrepareWeightsUpdateReqInput,
    PrepareWeightsUpdateReqOutput,
)
from sglang.srt.utils.aio_rwlock import RWLock
from sglang.srt.weight_sync.two_phase_requests import (
    acquire_writer_before,
    check_as_its_route,
    parse_prepare_body,
    timed_out_message,
    two_phase_response_content,
)

register_cpu_ci(est_time=3, suite="base-a-test-cpu")

DIGEST = "psum61:0000000000000001:0000000000000002"
SESSION = "s" * 16


def bucket(*names, dtype="bfloat16", shape=(2, 3)):
    return {
        "names": list(names),
        "dtypes": [dtype] * len(names),
        "shapes": [list(shape)] * len(names),
    }


GOOD = {
    "num_buckets": 1,
    "buckets": [{**bucket("a", "b"), "digest": DIGEST}],
    "group_name": "g1",
    "load_format": "flattened_bucket",
    "weight_version": "v1",
    "defer_digests": False,
    "session_id": SESSION,
    "framed": True,
    "shares": [{"group_name": "g2", "num_buckets": 1, "buckets": [bucket("c")]}],
}


def parse(payload):
    return parse_prepare_body(json.dumps(payload).encode())


def with_(**changes):
    return {**GOOD, **changes}


class TestParsePrepareBody(CustomTestCase):
    def assertRefused(self, payload, field):
        """A ValueError whose message starts with `field`, in the server's
        words, not pydantic's."""
        raw = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        with self.assertRaises(ValueError) as ctx:
            parse_prepare_body(raw)
        message = str(ctx.exception)
        self.assertTrue(message.startswith(f"{field}: "), message)
        self.assertNotIn("Value error", message)
        self.assertNotIn("errors.pydantic.dev", message)

    def test_a_well_formed_body_parses_into_the_request(self):
        req = parse(GOOD)
        self.assertEqual(
            (req.num_buckets, req.group_name, req.session_id, req.framed),
            (1, "g1", SESSION, True),
        )
        self.assertEqual(req.buckets, GOOD["buckets"])
        self.assertEqual(req.shares, GOOD["shares"])
        self.assertEqual(
            parse({"num_buckets": 1, "buckets": [bucket("a")]}).group_name,
            "weight_update_group",
        )

    def test_a_body_that_is_not_a_json_object_is_named_body(self):
        for raw in (b"", b"{", b"\xff\xfe\x00", b"[1]", b"null", b'"x"', b"1"):
            with self.subTest(raw=raw):
                self.assertRefused(raw, "body")
        self.assertRefused(b"[" * 100_000 + b"]" * 100_000, "body")

    def test_each_malformed_field_is_refused_naming_it(self):
        cases = [
            ({"buckets": [bucket("a")]}, "num_buckets"),
            (with_(num_buckets="1"), "num_buckets"),
            (with_(num_buckets=True), "num_buckets"),
            (with_(num_buckets=2), "num_buckets"),
            (with_(buckets="a"), "buckets"),
            (with_(num_buckets=0, buckets=[]), "buckets"),
            (with_(buckets=[{**bucket("a"), "extra": 1}]), "buckets[0]"),
            (with_(buckets=[{"names": ["a"], "dtypes": []}]), "buckets[0].shapes"),
            (with_(buckets=[bucket("a", "a")]), "buckets[0].names[1]"),
            (with_(buckets=[bucket("")]), "buckets[0].names[0]"),
            (with_(buckets=[bucket("a", dtype="float13")]), "buckets[0].dtypes[0]"),
            (with_(buckets=[bucket("a", shape=(2, -1))]), "buckets[0].shapes[0]"),
            (with_(buckets=[bucket("a", shape=(True,))]), "buckets[0].shapes[0]"),
            (with_(buckets=[{**bucket("a"), "digest": "md5:00"}]), "buckets[0].digest"),
            (with_(group_name=""), "group_name"),
            (with_(group_name=5), "group_name"),
            (with_(load_format="safetensors"), "load_format"),
            (with_(weight_version=3), "weight_version"),
            (with_(defer_digests="yes"), "defer_digests"),
            (with_(framed=1), "framed"),
            (with_(session_id="short"), "session_id"),
            (with_(shares={}), "shares"),
            (
                with_(shares=[{**GOOD["shares"][0], "group_name": "g1"}]),
                "shares[0].group_name",
            ),
            (with_(shares=[{"group_name": "g9"}]), "shares[0].num_buckets"),
            (
                with_(shares=[{**GOOD["shares"][0], "group_name": 5}]),
                "shares[0].group_name",
            ),
            (
                with_(shares=[{**GOOD["shares"][0], "buckets": [bucket("a")]}]),
                "shares[0].buckets[0].names[0]",
            ),
        ]
        for payload, field in cases:
            with self.subTest(field=field, payload=payload):
                self.assertRefused(payload, field)

    def test_no_malformed_value_anywhere_escapes_as_another_error(self):
        junk = [None, -1, 2**70, 1.5, True, "", "x", [], [None], {}, {"x": 1}]
        paths, stack = [], [((), GOOD)]
        while stack:
            path, value = stack.pop()
            paths.append(path)
            if isinstance(value, dict):
                stack.extend((path + (k,), v) for k, v in value.items())
            elif isinstance(value, list):
                stack.extend((path + (k,), v) for k, v in enumerate(value))
        for path in paths[1:]:
            for value in junk:
                payload = copy.deepcopy(GOOD)
                parent = payload
                for key in path[:-1]:
                    parent = parent[key]
                parent[path[-1]] = value
                try:
                    parse(payload)
                except ValueError as e:
                    field = re.match(r"[a-z_]+", str(e))
                    self.assertIn(field and field.group(), GOOD, (path, value, e))
                except Exception as e:
                    self.fail(f"{path} = {value!r}: {type(e).__name__}: {e}")

    def test_limits_are_enforced_at_the_boundary(self):
        parse(with_(session_id="s" * 16))
        parse(with_(session_id="s" * 128))
        self.assertRefused(with_(session_id="s" * 15), "session_id")
        self.assertRefused(with_(session_id="s" * 129), "session_id")
        parse(with_(group_name="g" * 256))
        self.assertRefused(with_(group_name="g" * 257), "group_name")
        shares = [
            {"group_name": f"g{k + 2}", "num_buckets": 1, "buckets": [bucket(f"t{k}")]}
            for k in range(64)
        ]
        parse(with_(shares=shares[:63]))
        self.assertRefused(with_(shares=shares), "shares")
        top = (1 << 61) - 1
        for s2, ok in ((top - 1, True), (top, False)):
            digest = f"psum61:{0:016x}:{s2:016x}"
            payload = with_(buckets=[{**bucket("a", "b"), "digest": digest}])
            if ok:
                parse(payload)
            else:
                self.assertRefused(payload, "buckets[0].digest")


def complete_result(received, ready):
    return CompleteWeightsUpdateReqOutput(
        success=False, num_buckets_received=received, ready_to_apply=ready
    )


class TestAnswers(CustomTestCase):
    def test_a_complete_with_every_bucket_verified_waits_on_the_cache_flush(self):
        message = timed_out_message(2.5, [complete_result(4, True)] * 2)
        self.assertIn("timed out after 2.5s", message)
        self.assertIn("in-flight requests", message)
        self.assertIn("nothing applied", message)

    def test_a_complete_missing_bytes_counts_the_slowest_rank_s_buckets(self):
        results = [complete_result(4, True), complete_result(1, False)]
        message = timed_out_message(300.0, results)
        self.assertIn("timed out after 300s with 1 buckets received", message)
        self.assertIn("complete again or abort", message)

    def test_the_answer_drops_routing_and_status_and_is_json(self):
        routing = dict(rid="r1", http_worker_ipc="ipc://x", status_code=409)
        outputs = [
            PrepareWeightsUpdateReqOutput(
                status="error", message="m", session_id=SESSION, **routing
            ),
            CompleteWeightsUpdateReqOutput(
                success=True, applied=True, session_open=True, pending=True, **routing
            ),
            AbortWeightsUpdateReqOutput(success=True, message="m", **routing),
        ]
        dropped = {"rid", "http_worker_ipc", "status_code", "session_open", "pending"}
        for output in outputs:
            with self.subTest(type(output).__name__):
                content = two_phase_response_content(output)
                self.assertFalse(dropped & content.keys())
                self.assertEqual(json.loads(json.dumps(content)), content)
                for key, value in content.items():
                    self.assertEqual(getattr(output, key), value)
                self.assertEqual(output.status_code, 409)
        self.assertEqual(two_phase_response_content(outputs[0])["session_id"], SESSION)
        self.assertTrue(two_phase_response_content(outputs[1])["applied"])


async def yield_to_the_loop():
    """Let the tasks already started run as far as they can (no time passes)."""
    for _ in range(5):
        await asyncio.sleep(0)


class TestAcquireWriterBefore(CustomTestCase):
    def test_a_free_lock_is_taken_before_the_deadline(self):
        async def main():
            lock = RWLock()
            self.assertIs(
                await acquire_writer_before(lock, time.monotonic() + 30), True
            )
            self.assertTrue(await lock.is_locked())
            reader = asyncio.create_task(lock.acquire_reader())
            await yield_to_the_loop()
            self.assertFalse(reader.done())
            await lock.release_writer()
            await asyncio.wait_for(reader, 5)

        asyncio.run(main())

    def test_past_the_deadline_it_gives_up_and_queued_readers_go_on(self):
        async def main():
            lock = RWLock()
            await lock.acquire_reader()  # a request in flight
            writer = asyncio.create_task(
                acquire_writer_before(lock, time.monotonic() + 0.05)
            )
            await yield_to_the_loop()
            queued = asyncio.create_task(lock.acquire_reader())
            await yield_to_the_loop()
            self.assertFalse(queued.done())  # behind the waiting writer
            self.assertIs(await writer, False)
            await asyncio.wait_for(queued, 5)
            await asyncio.wait_for(lock.acquire_reader(), 5)

        asyncio.run(main())


class TestCheckAsItsRoute(CustomTestCase):
    """A request built in Python (the offline Engine's) is held to its
    route's strict types, which its constructor does not check."""

    def test_a_well_typed_request_passes(self):
        check_as_its_route(CompleteWeightsUpdateReqInput(apply=False, digests=[DIGEST]))
        check_as_its_route(AbortWeightsUpdateReqInput(session_id=SESSION))
        check_as_its_route(PrepareWeightsUpdateReqInput(num_buckets=0, buckets=[]))

    def test_a_value_its_route_refuses_is_a_value_error_naming_the_field(self):
        for request, field in (
            (CompleteWeightsUpdateReqInput(apply="false"), "apply"),
            (CompleteWeightsUpdateReqInput(digests=DIGEST), "digests"),
            (AbortWeightsUpdateReqInput(abort_header_sent="no"), "abort_header_sent"),
            (
                PrepareWeightsUpdateReqInput(num_buckets=1, buckets=[], framed="false"),
                "framed",
            ),
            (PrepareWeightsUpdateReqInput(num_buckets="1", buckets=[]), "num_buckets"),
        ):
            with self.subTest(field=field):
                with self.assertRaisesRegex(ValueError, f"^{field}: "):
                    check_as_its_route(request)


if __name__ == "__main__":
    unittest.main()
