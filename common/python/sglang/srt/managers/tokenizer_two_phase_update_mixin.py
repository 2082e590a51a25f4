"""Two-phase weight update on the tokenizer manager.

Locking: the transfer does not block generation (prepare only starts the
receiver). `complete` applies between two batches without waiting for
in-flight requests: they continue on the new weights with their KV cache, as
after `/pause_generation` in `in_place` mode; the weights never change during
a forward pass. `drain=true` gives `update_weights_from_distributed`'s
semantics instead (in-flight requests finish first, new ones wait).

With data parallelism every replica verifies before any applies. What
reads the tokenizer manager's internals (the communicators to the schedulers,
which servers cannot take the update) is asked of
`TokenizerTwoPhaseUpdateHooks` (tokenizer_two_phase_update_hooks.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
import time
from typing import TYPE_CHECKING, Any, List, Optional

import fastapi

from sglang.srt.managers.io_struct import (
    AbortWeightsUpdateReqInput,
    AbortWeightsUpdateReqOutput,
    CompleteWeightsUpdateReqInput,
    CompleteWeightsUpdateReqOutput,
    PrepareWeightsUpdateReqInput,
    PrepareWeightsUpdateReqOutput,
)
from sglang.srt.managers.scheduler_two_phase_update_mixin import (
    DEFAULT_COMPLETE_TIMEOUT,
)
from sglang.srt.managers.tokenizer_two_phase_update_hooks import (
    TokenizerTwoPhaseUpdateHooks,
)
from sglang.srt.managers.weight_op_results import rank_results_of
from sglang.srt.managers.weight_update_health import track_weight_update
from sglang.srt.weight_sync.two_phase_requests import (
    SCHEDULER_WAIT_S,
    acquire_writer_before,
    check_as_its_route,
    timed_out_message,
)

if TYPE_CHECKING:
    from sglang.srt.managers.tokenizer_manager import TokenizerManager


class TokenizerTwoPhaseUpdateMixin(TokenizerTwoPhaseUpdateHooks):
    @track_weight_update("prepare_weights_update")
    async def prepare_weights_update(
        self: TokenizerManager,
        obj: PrepareWeightsUpdateReqInput,
        request: Optional[fastapi.Request] = None,
    ) -> PrepareWeightsUpdateReqOutput:
        self.auto_create_handle_loop()
        if request is None:  # built in Python (sglang.Engine): check it as a route
            check_as_its_route(obj)
        unsupported = self._two_phase_unsupported()
        if unsupported:
            return PrepareWeightsUpdateReqOutput(
                status="error", message=unsupported, status_code=400
            )
        if self.server_args.enable_eplb:
            # The rebalancer moves experts between slots of the served
            # weights, which an apply staged against the old placement
            # would undo.
            return PrepareWeightsUpdateReqOutput(
                status="error",
                message="--enable-eplb: the two-phase weight update does not "
                "support expert rebalancing; nothing was done",
                status_code=400,
            )
        if obj.session_id is None:
            # One id for every DP replica's session: unguessable, so a late
            # call from another trainer cannot name this session by chance.
            obj = _replaced(obj, session_id=secrets.token_urlsafe(18))
        # An open session is not a running operation for the health check:
        # serving goes on while the bytes arrive, and a trainer that died
        # after prepare must not make a serving worker unhealthy.
        results = await self.prepare_weights_update_communicator(obj)
        failed = [r for r in results if r.status != "ready"]
        if not failed:
            return _replaced(
                results[0],
                staging_reused=all(r.staging_reused for r in results),
                staging_bytes=max(r.staging_bytes for r in results),
                rank_staging_bytes=[
                    entry for r in results for entry in r.rank_staging_bytes
                ],
            )
        # Every replica waits for the sender's abort header (ready ones in
        # place of bucket 0): it aborts in band, and the group stays usable.
        awaits = all(r.status == "ready" or r.awaits_abort_header for r in results)
        if len(failed) < len(results) and not awaits:
            # Validation is the same on every DP replica, so this is rare:
            # leave no replica with a session the others lack.
            await self.abort_weights_update_communicator(
                AbortWeightsUpdateReqInput(
                    group_name=obj.group_name, session_id=obj.session_id
                )
            )
        return _replaced(failed[0], awaits_abort_header=awaits)

    @track_weight_update("complete_weights_update")
    async def complete_weights_update(
        self: TokenizerManager,
        obj: CompleteWeightsUpdateReqInput,
        request: Optional[fastapi.Request] = None,
    ) -> CompleteWeightsUpdateReqOutput:
        self.auto_create_handle_loop()
        if request is None:  # built in Python (sglang.Engine): check it as a route
            check_as_its_route(obj)
        unsupported = self._two_phase_unsupported()
        if unsupported:
            return CompleteWeightsUpdateReqOutput(
                success=False, message=unsupported, status_code=400
            )
        drain = bool(obj.flush_cache) if obj.drain is None else obj.drain
        if obj.apply and obj.flush_cache and not drain:
            return CompleteWeightsUpdateReqOutput(
                success=False,
                message="flush_cache: a cache flush needs the in-flight requests "
                "finished first, which drain=false forbids; nothing was done "
                "(omit drain, or flush_cache=false to apply in place)",
                status_code=400,
                session_open=True,
            )
        timeout = DEFAULT_COMPLETE_TIMEOUT if obj.timeout is None else obj.timeout
        # The operator's deadline bounds every wait.
        timeout = min(timeout, self.server_args.weight_update_health_deadline)
        deadline = time.monotonic() + timeout
        # 1. Every byte received and verified; generation goes on meanwhile.
        verify = _replaced(obj, apply=False, flush_cache=False, drain=False)
        result = await self._complete_before(verify, deadline, timeout)
        if not obj.apply or not result.success:
            return result
        if obj.session_id is None:
            # What follows acts on the session verified above, not on one
            # another caller opens meanwhile.
            obj = _replaced(obj, session_id=result.session_id)
            verify = _replaced(verify, session_id=result.session_id)
        # 2. Drain: new requests wait, in-flight ones finish first.
        holds_requests_back = False
        if drain:
            async with self.is_pause_cond:
                holds_requests_back = not self.is_pause
        if holds_requests_back and not await acquire_writer_before(
            self.model_update_lock, deadline
        ):
            # Another caller may have completed or aborted the session
            # meanwhile: answer how it stands, not a stale "complete again".
            current = await self._complete_before(verify, time.monotonic(), timeout)
            if not current.success:
                return current
            return CompleteWeightsUpdateReqOutput(
                success=False,
                num_buckets_received=result.num_buckets_received,
                message=timed_out_message(timeout, [result]),
                status_code=400,
                ready_to_apply=True,
                session_open=True,
            )
        # 3. Apply. The scheduler waits for requests to finish only if they can.
        attempt = _replaced(obj, drain=holds_requests_back)
        try:
            result = await self._complete_before(attempt, deadline, timeout)
        finally:
            if holds_requests_back:
                await self.model_update_lock.release_writer()
        if result.applied and result.weight_version is not None:
            self._record_weight_version(result.weight_version)
            result.message += f" Weight version updated to {result.weight_version}."
        return result

    async def _complete_before(
        self: TokenizerManager,
        obj: CompleteWeightsUpdateReqInput,
        deadline: float,
        timeout: float,
    ) -> CompleteWeightsUpdateReqOutput:
        """Verify on every DP replica, then (if obj.apply) apply on every
        replica: none applies unless all hold every byte (and, for a cache
        flush, are idle). Until then each attempt blocks a scheduler for at
        most SCHEDULER_WAIT_S, so generation goes on between attempts."""
        verify = _replaced(obj, apply=False, scheduler_wait_s=SCHEDULER_WAIT_S)
        apply = _replaced(obj, scheduler_wait_s=SCHEDULER_WAIT_S)
        while True:
            results = await self.complete_weights_update_communicator(verify)
            if verify.session_id is None:
                # Every later call names the session this one found open, not
                # one another caller opens meanwhile.
                verify.session_id = apply.session_id = next(
                    (r.session_id for r in results if r.session_id), None
                )
            failed = [r for r in results if not r.success and not r.pending]
            if failed:
                if not all(r.session_open for r in failed):
                    # A replica discarded its transfer: discard it everywhere.
                    await self._abort_sessions_left_open(results, obj)
                    # Their answers were given before the abort.
                    results = [_replaced(r, session_open=False) for r in results]
                return _merge_complete(results)
            if not any(r.pending for r in results):
                if not obj.apply:
                    return _merge_complete(results)
                if len(results) > 1:
                    # The commit under data parallelism: every replica
                    # verified and was idle. A request can reach one since
                    # (another tokenizer worker's); that replica must not
                    # refuse the apply, or the replicas would serve different
                    # weights: it applies in place, and flushes its cache
                    # only if idle.
                    apply.drain = False
                    if obj.flush_cache:
                        apply.flush_cache = None
                results = await self.complete_weights_update_communicator(apply)
                if len(results) > 1 or not results[0].pending:
                    return _merge_complete(results, flush_asked=bool(obj.flush_cache))
                # The scheduler turned busy between the poll and the apply
                # (nothing applied): poll again.
            if time.monotonic() >= deadline:
                # The sessions stay open: complete again, or abort.
                received = min(r.num_buckets_received for r in results)
                return CompleteWeightsUpdateReqOutput(
                    success=False,
                    num_buckets_received=received,
                    message=timed_out_message(timeout, results),
                    status_code=400,
                    ready_to_apply=all(r.ready_to_apply for r in results),
                    session_open=True,
                )
            await asyncio.sleep(SCHEDULER_WAIT_S)

    async def _abort_sessions_left_open(
        self: TokenizerManager,
        results: List[CompleteWeightsUpdateReqOutput],
        obj: CompleteWeightsUpdateReqInput,
    ) -> None:
        if any(r.session_open for r in results):
            session_id = obj.session_id or next(
                (r.session_id for r in results if r.session_id), None
            )
            await self.abort_weights_update_communicator(
                AbortWeightsUpdateReqInput(
                    group_name=obj.group_name, session_id=session_id
                )
            )

    @track_weight_update("abort_weights_update")
    async def abort_weights_update(
        self: TokenizerManager,
        obj: AbortWeightsUpdateReqInput,
        request: Optional[fastapi.Request] = None,
    ) -> AbortWeightsUpdateReqOutput:
        self.auto_create_handle_loop()
        if request is None:  # built in Python (sglang.Engine): check it as a route
            check_as_its_route(obj)
        unsupported = self._two_phase_unsupported()
        if unsupported:
            return AbortWeightsUpdateReqOutput(
                success=False, message=unsupported, status_code=400
            )
        results = await self.abort_weights_update_communicator(obj)
        aborted = [r for r in results if r.success]
        if not aborted:
            return results[0]
        return _replaced(aborted[0], group_usable=all(r.group_usable for r in aborted))


def _replaced(obj: Any, **changes: Any) -> Any:
    """A copy of a request or an answer with `changes` (a dataclass or a
    msgspec struct)."""
    if dataclasses.is_dataclass(obj):
        return dataclasses.replace(obj, **changes)
    import msgspec

    return msgspec.structs.replace(obj, **changes)


def _merge_complete(
    results: List[CompleteWeightsUpdateReqOutput], flush_asked: bool = False
) -> CompleteWeightsUpdateReqOutput:
    """One answer for every DP replica (the only one without data parallelism)."""
    if len(results) == 1:
        return results[0]
    failed = [r for r in results if not r.success]
    first = failed[0] if failed else results[0]
    applied = all(r.applied for r in results)
    if failed and any(r.applied for r in results) and not applied:
        message = "some DP replicas applied and others did not: " + first.message
    else:
        message = first.message
    flushed = sum(r.cache_flushed for r in results)
    if applied and not failed and (flush_asked or flushed) and flushed < len(results):
        # Told by a replica that did not flush (another's "and flushed the
        # cache" is not the server's).
        message = next(r.message for r in results if not r.cache_flushed)
        message += (
            f"; the cache was flushed on {flushed} of {len(results)} DP replicas "
            "(requests reached the others after the check; they go on, in place, "
            "on the new weights): call /flush_cache once they are idle"
        )
    return _replaced(
        first,
        success=not failed,
        message=message,
        num_buckets_received=min(r.num_buckets_received for r in results),
        ready_to_apply=all(r.ready_to_apply for r in results),
        applied=applied,
        cache_flushed=all(r.cache_flushed for r in results),
        weight_version=first.weight_version if applied else None,
        session_open=any(r.session_open for r in results),
        session_id=next((r.session_id for r in results if r.session_id), None),
        rank_results=rank_results_of(results),
    )
