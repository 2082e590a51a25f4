"""Unit tests for the tokenizer manager's side of a two-phase weight update:
one answer for every DP replica, none of which applies unless all verified;
a replica's failure ends the others' sessions; drain holds new requests back
only while it applies — no server; each replica is a scripted scheduler."""

import asyncio
import unittest
from types import SimpleNamespace

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
from sglang.srt.managers.tokenizer_two_phase_update_mixin import (
    TokenizerTwoPhaseUpdateMixin,
)
from sglang.srt.utils.aio_rwlock import RWLock
from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=10, suite="base-a-test-cpu")

SESSION = "session-0000000001"
NEWER = "session-0000000002"


class Replica:
    """One DP replica's schedulers, answering as they do: `pending` polls
    before every byte is in, then a verification that passes or not."""

    def __init__(
        self, pending: int = 0, verifies: bool = True, busy_applies: int = 0, lock=None
    ):
        self.pending = pending
        self.busy_applies = busy_applies
        self.verifies = verifies
        self.lock = lock
        self.session_open, self.session_id = False, None
        self.applied = False
        self.calls = []
        self.writer_held_at_apply = None

    def prepare(self, req):
        self.calls.append(("prepare", req.session_id))
        self.session_open, self.session_id = True, req.session_id
        return PrepareWeightsUpdateReqOutput(
            status="ready", message="", session_id=req.session_id, staging_bytes=10
        )

    def complete(self, req):
        self.calls.append(("apply" if req.apply else "verify", req.session_id))
        if not self.session_open:
            return CompleteWeightsUpdateReqOutput(
                success=False,
                message="no weight update session is open",
                status_code=409,
            )
        if req.session_id not in (None, self.session_id):
            return CompleteWeightsUpdateReqOutput(
                success=False,
                message="the call names another session",
                status_code=409,
                session_open=True,
            )
        if self.pending > 0:
            self.pending -= 1
            return CompleteWeightsUpdateReqOutput(
                success=False, pending=True, session_open=True
            )
        if not self.verifies:
            self.session_open = False
            return CompleteWeightsUpdateReqOutput(
                success=False,
                message="verification failed, nothing applied",
                status_code=400,
            )
        if not req.apply:
            return CompleteWeightsUpdateReqOutput(
                success=True,
                ready_to_apply=True,
                session_open=True,
                session_id=self.session_id,
            )
        busy = self.busy_applies > 0  # a request came in since the last poll
        if busy:
            self.busy_applies -= 1
            if req.flush_cache:  # a flush waits for an idle scheduler
                return CompleteWeightsUpdateReqOutput(
                    success=False, pending=True, ready_to_apply=True, session_open=True
                )
        self.writer_held_at_apply = self.lock._writer_active
        self.applied, self.session_open = True, False
        # By default (None) the scheduler flushes only if idle.
        flushed = req.flush_cache is not False and not busy
        return CompleteWeightsUpdateReqOutput(
            success=True,
            applied=True,
            message="applied 1 buckets" + (" and flushed the cache" if flushed else ""),
            weight_version=req.weight_version,
            cache_flushed=flushed,
        )

    def abort(self, req):
        self.calls.append(("abort", req.session_id))
        was_open, self.session_open = self.session_open, False
        return AbortWeightsUpdateReqOutput(
            success=was_open,
            message="aborted" if was_open else "no weight update session is open",
            status_code=200 if was_open else 409,
            group_usable=True,
        )


def communicator(replicas, kind):
    async def ask_every_replica(req):
        return [getattr(replica, kind)(req) for replica in replicas]

    return ask_every_replica


class DataParallelTokenizerManager(TokenizerTwoPhaseUpdateMixin):
    """What the mixin reads of a tokenizer manager
    (two_phase_update_protocols.py), in front of `replicas`."""

    def __init__(self, replicas, deadline_s: float = 30.0):
        self.server_args = SimpleNamespace(
            enable_eplb=False, weight_update_health_deadline=deadline_s
        )
        self.model_update_lock = RWLock()
        self.is_pause = False
        self.is_pause_cond = asyncio.Condition()
        for replica in replicas:
            replica.lock = self.model_update_lock
        self.prepare_weights_update_communicator = communicator(replicas, "prepare")
        self.complete_weights_update_communicator = communicator(replicas, "complete")
        self.abort_weights_update_communicator = communicator(replicas, "abort")
        self.versions = []

    def auto_create_handle_loop(self):
        pass

    def _two_phase_unsupported(self):
        return None

    def _record_weight_version(self, version):
        self.versions.append(version)


def prepare_request(**fields):
    bucket = {"names": ["w"], "dtypes": ["float32"], "shapes": [[2]]}
    return PrepareWeightsUpdateReqInput(num_buckets=1, buckets=[bucket], **fields)


def run(coroutine):
    return asyncio.run(coroutine)


class TestTokenizerTwoPhaseUpdate(CustomTestCase):
    def prepared(self, *replicas, **kwargs):
        manager = DataParallelTokenizerManager(list(replicas), **kwargs)
        out = run(manager.prepare_weights_update(prepare_request(session_id=SESSION)))
        self.assertEqual(out.status, "ready", out.message)
        return manager

    def test_every_replica_gets_one_unguessable_session_id(self):
        replicas = [Replica(), Replica()]
        manager = DataParallelTokenizerManager(replicas)
        out = run(manager.prepare_weights_update(prepare_request()))
        self.assertEqual(out.status, "ready")
        ids = {replica.calls[0][1] for replica in replicas}
        self.assertEqual(len(ids), 1)
        (session_id,) = ids
        self.assertEqual(out.session_id, session_id)
        self.assertGreaterEqual(len(session_id), 24)

    def test_a_prepare_one_replica_refuses_ends_the_others_sessions(self):
        class Refuses(Replica):
            def prepare(self, req):
                self.calls.append(("prepare", req.session_id))
                return PrepareWeightsUpdateReqOutput(
                    status="error", message="buckets[0]: refused", status_code=400
                )

        replicas = [Replica(), Refuses()]
        manager = DataParallelTokenizerManager(replicas)
        out = run(manager.prepare_weights_update(prepare_request(session_id=SESSION)))
        self.assertEqual((out.status, out.status_code), ("error", 400))
        self.assertEqual(out.message, "buckets[0]: refused")
        self.assertFalse(out.awaits_abort_header)
        self.assertEqual(replicas[0].calls[-1], ("abort", SESSION))
        self.assertFalse(replicas[0].session_open)

    def test_no_replica_applies_until_every_replica_verified(self):
        replicas = [Replica(), Replica(pending=3)]
        manager = self.prepared(*replicas)
        out = run(
            manager.complete_weights_update(
                CompleteWeightsUpdateReqInput(session_id=SESSION, weight_version="v2")
            )
        )
        self.assertTrue(out.success, out.message)
        self.assertTrue(out.applied)
        self.assertEqual(manager.versions, ["v2"])
        self.assertIn("Weight version updated to v2", out.message)
        for replica in replicas:
            kinds = [kind for kind, _ in replica.calls[1:]]
            self.assertEqual(kinds[-1], "apply")
            self.assertNotIn("apply", kinds[:-1])
            self.assertTrue(replica.applied)
        # The first replica verified again while the second still received.
        self.assertGreaterEqual(replicas[0].calls.count(("verify", SESSION)), 4)

    def test_a_replica_busy_since_the_check_applies_with_the_others(self):
        # A request reached the second replica between the last poll and the
        # apply (another tokenizer worker's): the replicas never disagree.
        replicas = [Replica(), Replica(busy_applies=1)]
        manager = self.prepared(*replicas)
        out = run(
            manager.complete_weights_update(
                CompleteWeightsUpdateReqInput(session_id=SESSION, flush_cache=True)
            )
        )
        self.assertTrue(out.success, out.message)
        self.assertTrue(out.applied)
        self.assertEqual([r.applied for r in replicas], [True, True])
        self.assertFalse(out.cache_flushed)
        self.assertIn("the cache was flushed on 1 of 2 DP replicas", out.message)
        # One replica's "and flushed the cache" is not the server's.
        self.assertNotIn("and flushed the cache", out.message)
        self.assertIn("call /flush_cache", out.message)

    def test_a_complete_applies_the_session_it_verified_not_a_newer_one(self):
        """A complete without a session id whose session another caller
        aborted and replaced between the check and the apply (a trainer that
        timed out and started over): no replica applies the new session."""
        replicas = [Replica(), Replica()]
        manager = self.prepared(*replicas)
        ask = manager.complete_weights_update_communicator

        async def replaced_after_the_check(req):
            answers = await ask(req)
            if not req.apply and replicas[0].session_id == SESSION:
                for replica in replicas:
                    replica.abort(AbortWeightsUpdateReqInput(session_id=SESSION))
                    replica.prepare(prepare_request(session_id=NEWER))
            return answers

        manager.complete_weights_update_communicator = replaced_after_the_check
        out = run(manager.complete_weights_update(CompleteWeightsUpdateReqInput()))
        self.assertFalse(out.success)
        self.assertFalse(out.applied)
        self.assertEqual([r.applied for r in replicas], [False, False])
        self.assertEqual([r.session_id for r in replicas], [NEWER, NEWER])
        self.assertTrue(all(r.session_open for r in replicas))

    def test_an_apply_that_finds_the_scheduler_busy_again_waits_for_it(self):
        replicas = [Replica(busy_applies=2)]
        manager = self.prepared(*replicas)
        out = run(
            manager.complete_weights_update(
                CompleteWeightsUpdateReqInput(session_id=SESSION, flush_cache=True)
            )
        )
        self.assertTrue(out.success, out.message)
        self.assertTrue(out.applied)
        self.assertTrue(out.cache_flushed)

        replicas = [Replica(busy_applies=10**9)]
        manager = self.prepared(*replicas, deadline_s=0.05)
        out = run(
            manager.complete_weights_update(
                CompleteWeightsUpdateReqInput(session_id=SESSION, flush_cache=True)
            )
        )
        self.assertFalse(out.success)
        self.assertEqual(out.status_code, 400)
        self.assertIn("waiting for the in-flight requests to finish", out.message)
        self.assertTrue(out.session_open)
        self.assertFalse(replicas[0].applied)

    def test_a_replica_that_fails_verification_ends_every_session_unapplied(self):
        replicas = [Replica(), Replica(verifies=False), Replica()]
        manager = self.prepared(*replicas)
        out = run(
            manager.complete_weights_update(
                CompleteWeightsUpdateReqInput(session_id=SESSION)
            )
        )
        self.assertFalse(out.success)
        self.assertFalse(out.applied)
        self.assertEqual(out.status_code, 400)
        self.assertIn("verification failed", out.message)
        self.assertFalse(out.session_open)
        for replica in replicas:
            self.assertFalse(replica.applied)
            self.assertFalse(replica.session_open)
            self.assertNotIn("apply", [kind for kind, _ in replica.calls])
        self.assertEqual(manager.versions, [])

    def test_the_deadline_bounds_a_complete_and_the_sessions_stay_open(self):
        replicas = [Replica(), Replica(pending=10**9)]
        manager = self.prepared(*replicas, deadline_s=0.05)
        out = run(
            manager.complete_weights_update(
                CompleteWeightsUpdateReqInput(session_id=SESSION, timeout=600.0)
            )
        )
        self.assertFalse(out.success)
        self.assertEqual(out.status_code, 400)
        self.assertIn("timed out", out.message)
        self.assertTrue(out.session_open)
        self.assertTrue(all(replica.session_open for replica in replicas))
        self.assertFalse(any(replica.applied for replica in replicas))

    def test_flush_without_drain_is_refused_before_anything_is_asked(self):
        replicas = [Replica()]
        manager = self.prepared(*replicas)
        out = run(
            manager.complete_weights_update(
                CompleteWeightsUpdateReqInput(flush_cache=True, drain=False)
            )
        )
        self.assertEqual(out.status_code, 400)
        self.assertTrue(out.message.startswith("flush_cache:"), out.message)
        self.assertEqual(len(replicas[0].calls), 1)  # the prepare only

    def test_drain_holds_new_requests_back_only_while_it_applies(self):
        replicas = [Replica()]
        manager = self.prepared(*replicas)
        lock = manager.model_update_lock

        async def complete_beside_a_request(release_request_first: bool):
            await lock.acquire_reader()  # a request in flight
            manager.server_args.weight_update_health_deadline = (
                30.0 if release_request_first else 0.05
            )
            complete = asyncio.ensure_future(
                manager.complete_weights_update(
                    CompleteWeightsUpdateReqInput(session_id=SESSION, drain=True)
                )
            )
            if release_request_first:
                while not lock._waiting_writers:  # the complete waits for it
                    await asyncio.sleep(0.001)
                await lock.release_reader()
            out = await complete
            if not release_request_first:
                await lock.release_reader()
            # New requests go on afterwards, whatever the complete answered.
            await asyncio.wait_for(lock.acquire_reader(), 5)
            await lock.release_reader()
            return out

        async def both():
            return (
                await complete_beside_a_request(release_request_first=False),
                await complete_beside_a_request(release_request_first=True),
            )

        timed_out, out = run(both())
        self.assertFalse(timed_out.success)
        self.assertIn("timed out", timed_out.message)
        self.assertTrue(timed_out.ready_to_apply)
        self.assertTrue(timed_out.session_open)
        self.assertTrue(out.applied, out.message)
        self.assertTrue(replicas[0].writer_held_at_apply)

    def test_a_drain_that_times_out_after_another_caller_applied_says_so(self):
        replicas = [Replica()]
        manager = self.prepared(*replicas, deadline_s=0.2)
        lock = manager.model_update_lock

        async def scenario():
            await lock.acquire_reader()  # a request in flight
            drained = asyncio.ensure_future(
                manager.complete_weights_update(
                    CompleteWeightsUpdateReqInput(session_id=SESSION, drain=True)
                )
            )
            while not lock._waiting_writers:  # the drain waits for it
                await asyncio.sleep(0.001)
            # Meanwhile another caller completes in place.
            other = await manager.complete_weights_update(
                CompleteWeightsUpdateReqInput(session_id=SESSION)
            )
            out = await drained
            await lock.release_reader()
            return other, out

        other, out = run(scenario())
        self.assertTrue(other.applied, other.message)
        self.assertFalse(out.success)
        self.assertEqual(out.status_code, 409)
        self.assertIn("no weight update session is open", out.message)
        self.assertNotIn("complete again", out.message)
        self.assertFalse(out.ready_to_apply)

    def test_by_default_complete_applies_in_place_without_the_writer_lock(self):
        replicas = [Replica()]
        manager = self.prepared(*replicas)
        out = run(
            manager.complete_weights_update(
                CompleteWeightsUpdateReqInput(session_id=SESSION)
            )
        )
        self.assertTrue(out.applied, out.message)
        self.assertFalse(replicas[0].writer_held_at_apply)

    def test_abort_answers_for_every_replica(self):
        replicas = [Replica(), Replica()]
        manager = self.prepared(*replicas)
        out = run(
            manager.abort_weights_update(AbortWeightsUpdateReqInput(session_id=SESSION))
        )
        self.assertTrue(out.success, out.message)
        self.assertTrue(out.group_usable)
        self.assertFalse(any(replica.session_open for replica in replicas))
        again = run(
            manager.abort_weights_update(AbortWeightsUpdateReqInput(session_id=SESSION))
        )
        self.assertFalse(again.success)
        self.assertEqual(again.status_code, 409)


if __name__ == "__main__":
    unittest.main()
