"""Two-phase weight update on the tokenizer manager.

Locking: the transfer does not block generation (prepare only starts the
receiver). `complete` applies between two batches without waiting for
in-flight requests: they continue on the new weights with their KV cache, as
after `/pause_generation` in `in_place` mode; the weights never change during
a forward pass. `drain=true` gives upstream's `update_weights_from_distributed`
semantics instead (in-flight requests finish first, new ones wait).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Optional

import fastapi
import msgspec

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
from sglang.srt.managers.weight_update_health import track_weight_update
from sglang.srt.runtime_context import get_parallel
from sglang.srt.weight_sync.two_phase_requests import (
    SCHEDULER_WAIT_S,
    acquire_writer_before,
    timed_out_message,
)

if TYPE_CHECKING:
    from sglang.srt.managers.tokenizer_manager import TokenizerManager


class TokenizerTwoPhaseUpdateMixin:
    """Its communicators come from the declarative specs of
    tokenizer_control_mixin (_COMMUNICATOR_SPECS)."""

    def _two_phase_unsupported(self: TokenizerManager) -> Optional[str]:
        """Why this server cannot take a two-phase update, or None."""
        if get_parallel().dp_size != 1:
            return (
                "dp_size: the two-phase weight update needs --dp-size 1 on this "
                f"release (the server runs {get_parallel().dp_size} replicas)"
            )
        return None

    @track_weight_update("prepare_weights_update")
    async def prepare_weights_update(
        self: TokenizerManager,
        obj: PrepareWeightsUpdateReqInput,
        request: Optional[fastapi.Request] = None,
    ) -> PrepareWeightsUpdateReqOutput:
        self.auto_create_handle_loop()
        unsupported = self._two_phase_unsupported()
        if unsupported:
            return PrepareWeightsUpdateReqOutput(
                status="error", message=unsupported, status_code=400
            )
        # An open session is not a running operation for the health check:
        # serving goes on while the bytes arrive, and a trainer that died
        # after prepare must not make a serving worker unhealthy.
        return (await self.prepare_weights_update_communicator(obj))[0]

    @track_weight_update("complete_weights_update")
    async def complete_weights_update(
        self: TokenizerManager,
        obj: CompleteWeightsUpdateReqInput,
        request: Optional[fastapi.Request] = None,
    ) -> CompleteWeightsUpdateReqOutput:
        self.auto_create_handle_loop()
        unsupported = self._two_phase_unsupported()
        if unsupported:
            return CompleteWeightsUpdateReqOutput(
                success=False, message=unsupported, status_code=400
            )
        drain = obj.flush_cache if obj.drain is None else obj.drain
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
        verify = msgspec.structs.replace(obj, apply=False, flush_cache=False)
        result = await self._complete_before(verify, deadline, timeout)
        if not obj.apply or not result.success:
            return result
        # 2. Drain: new requests wait, in-flight ones finish first.
        holds_requests_back = False
        if drain:
            async with self.is_pause_cond:
                holds_requests_back = not self.is_pause
        if holds_requests_back and not await acquire_writer_before(
            self.model_update_lock, deadline
        ):
            return CompleteWeightsUpdateReqOutput(
                success=False,
                num_buckets_received=result.num_buckets_received,
                message=timed_out_message(timeout, [result]),
                status_code=400,
                ready_to_apply=True,
                session_open=True,
            )
        # 3. Apply. The scheduler waits for requests to finish only if they can.
        attempt = msgspec.structs.replace(obj, drain=holds_requests_back)
        try:
            result = await self._complete_before(attempt, deadline, timeout)
        finally:
            if holds_requests_back:
                await self.model_update_lock.release_writer()
        if result.applied and result.weight_version is not None:
            self._update_weight_version_if_provided(result.weight_version)
            result.message += f" Weight version updated to {result.weight_version}."
        return result

    async def _complete_before(
        self: TokenizerManager,
        obj: CompleteWeightsUpdateReqInput,
        deadline: float,
        timeout: float,
    ) -> CompleteWeightsUpdateReqOutput:
        """Until the last bucket is in (and, for a cache flush, the scheduler
        is idle), each attempt blocks the scheduler for at most
        SCHEDULER_WAIT_S, so generation goes on between attempts."""
        attempt = msgspec.structs.replace(obj, scheduler_wait_s=SCHEDULER_WAIT_S)
        while True:
            result = (await self.complete_weights_update_communicator(attempt))[0]
            if not result.pending:
                return result
            if time.monotonic() >= deadline:
                # The session stays open: complete again, or abort.
                return CompleteWeightsUpdateReqOutput(
                    success=False,
                    num_buckets_received=result.num_buckets_received,
                    message=timed_out_message(timeout, [result]),
                    status_code=400,
                    ready_to_apply=result.ready_to_apply,
                    session_open=True,
                )
            await asyncio.sleep(SCHEDULER_WAIT_S)

    @track_weight_update("abort_weights_update")
    async def abort_weights_update(
        self: TokenizerManager,
        obj: AbortWeightsUpdateReqInput,
        request: Optional[fastapi.Request] = None,
    ) -> AbortWeightsUpdateReqOutput:
        self.auto_create_handle_loop()
        unsupported = self._two_phase_unsupported()
        if unsupported:
            return AbortWeightsUpdateReqOutput(
                success=False, message=unsupported, status_code=400
            )
        return (await self.abort_weights_update_communicator(obj))[0]
