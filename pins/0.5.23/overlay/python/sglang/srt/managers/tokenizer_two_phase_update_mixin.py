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
import json
import time
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Union

import fastapi
import msgspec
import pydantic

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
from sglang.srt.utils.aio_rwlock import RWLock
from sglang.srt.weight_sync.staged_receiver import parse_buckets

if TYPE_CHECKING:
    from sglang.srt.managers.tokenizer_manager import TokenizerManager

# How long one complete attempt may hold the scheduler while bytes still arrive.
SCHEDULER_WAIT_S = 0.005


def _timed_out_message(
    timeout: float, results: List[CompleteWeightsUpdateReqOutput]
) -> str:
    """Why a complete that ran out of time is still pending: bytes missing, or
    (every byte verified) a cache flush waiting for in-flight requests."""
    if all(r.ready_to_apply for r in results):
        return (
            f"timed out after {timeout:g}s waiting for the in-flight requests "
            f"to finish before the cache flush (every bucket received and "
            f"verified, nothing applied); complete again or abort"
        )
    received = min(r.num_buckets_received for r in results)
    return (
        f"timed out after {timeout:g}s with {received} buckets received; "
        f"complete again or abort"
    )


async def _acquire_writer_before(lock: RWLock, deadline: float) -> bool:
    """The writer lock (in-flight requests finish, new ones wait), unless
    the deadline passes first."""
    try:
        await asyncio.wait_for(
            lock.acquire_writer(), max(0.0, deadline - time.monotonic())
        )
        return True
    except asyncio.TimeoutError:
        # Readers that queued behind the waiting writer may go on now.
        async with lock._lock:
            lock._cond.notify_all()
        return False


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
        if holds_requests_back and not await _acquire_writer_before(
            self.model_update_lock, deadline
        ):
            return CompleteWeightsUpdateReqOutput(
                success=False,
                num_buckets_received=result.num_buckets_received,
                message=_timed_out_message(timeout, [result]),
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
                    message=_timed_out_message(timeout, [result]),
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


def parse_prepare_body(body: bytes) -> PrepareWeightsUpdateReqInput:
    """The request from its JSON body, with every check that needs no model
    (types, lengths, dtypes, shapes, duplicates, digests); ValueError naming
    the field otherwise. Runs in a thread: parsing a large body on the event
    loop, or checking it on the scheduler, would stall serving."""
    try:
        payload = json.loads(body)
    except ValueError as e:
        raise ValueError(f"body: not JSON ({e})") from None
    except RecursionError:
        raise ValueError("body: nested too deeply") from None
    if not isinstance(payload, dict):
        raise ValueError("body: must be a JSON object")
    try:
        obj = _PREPARE_ADAPTER.validate_python(payload)
    except pydantic.ValidationError as e:
        raise ValueError(_validation_message(e)) from None
    parse_buckets(obj.num_buckets, obj.buckets, obj.load_format)
    return obj


def _validation_message(error: pydantic.ValidationError) -> str:
    # A msgspec request validates as "an instance, or a dict built into one":
    # the error that names the field is the dict branch's, under its own loc.
    errors = error.errors()
    first = next((e for e in errors if e["type"] != "is_instance_of"), errors[0])
    message = str(first.get("msg", "invalid"))
    loc = first.get("loc", ())
    if loc and str(loc[0]).startswith("function-after["):
        loc = loc[1:]
    where = ".".join(str(part) for part in loc)
    if not where:  # raised by the request's own checks, which name the field
        return message.removeprefix("Value error, ")
    return f"{where}: {message}"


def two_phase_response_content(
    output: Union[
        PrepareWeightsUpdateReqOutput,
        CompleteWeightsUpdateReqOutput,
        AbortWeightsUpdateReqOutput,
    ],
) -> Dict[str, Any]:
    """The JSON answer: the output's fields less routing and the HTTP status."""
    content = msgspec.structs.asdict(output)
    for key in ("rid", "http_worker_ipc", "status_code", "session_open", "pending"):
        content.pop(key, None)
    return content


_PREPARE_ADAPTER = pydantic.TypeAdapter(PrepareWeightsUpdateReqInput)
