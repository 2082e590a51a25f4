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
import dataclasses
import time
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any, Dict, Optional, Union

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
from sglang.srt.managers.weight_update_health import track_weight_update
from sglang.srt.server_args import ServerArgs
from sglang.utils import TypeBasedDispatcher

if TYPE_CHECKING:
    from sglang.srt.managers.tokenizer_manager import TokenizerManager

# How long one complete attempt may hold the scheduler while bytes still arrive.
SCHEDULER_WAIT_S = 0.005


class TokenizerTwoPhaseUpdateMixin:
    def init_two_phase_update_communicators(
        self: TokenizerManager, server_args: ServerArgs
    ):
        from sglang.srt.managers.tokenizer_communicator_mixin import _Communicator

        self.prepare_weights_update_communicator = _Communicator(
            self.send_to_scheduler, server_args.dp_size
        )
        self.complete_weights_update_communicator = _Communicator(
            self.send_to_scheduler, server_args.dp_size
        )
        self.abort_weights_update_communicator = _Communicator(
            self.send_to_scheduler, server_args.dp_size
        )
        self._result_dispatcher += TypeBasedDispatcher(
            [
                (
                    PrepareWeightsUpdateReqOutput,
                    self.prepare_weights_update_communicator.handle_recv,
                ),
                (
                    CompleteWeightsUpdateReqOutput,
                    self.complete_weights_update_communicator.handle_recv,
                ),
                (
                    AbortWeightsUpdateReqOutput,
                    self.abort_weights_update_communicator.handle_recv,
                ),
            ]
        )

    def _check_two_phase_supported(self: TokenizerManager):
        assert (
            self.server_args.dp_size == 1
        ), "dp_size must be 1 for the two-phase weight update"

    @track_weight_update("prepare_weights_update")
    async def prepare_weights_update(
        self: TokenizerManager,
        obj: PrepareWeightsUpdateReqInput,
        request: Optional[fastapi.Request] = None,
    ) -> PrepareWeightsUpdateReqOutput:
        self.auto_create_handle_loop()
        self._check_two_phase_supported()
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
        self._check_two_phase_supported()
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
        holds_requests_back = False
        if obj.apply and drain:
            async with self.is_pause_cond:
                holds_requests_back = not self.is_pause
        lock_context = (
            self.model_update_lock.writer_lock if holds_requests_back else nullcontext()
        )
        # The scheduler waits for requests to finish only if they can.
        attempt = dataclasses.replace(obj, drain=holds_requests_back)
        async with lock_context:
            result = await self._complete_without_blocking_scheduler(attempt)
        if result.applied and result.weight_version is not None:
            self._update_weight_version_if_provided(result.weight_version)
            result.message += f" Weight version updated to {result.weight_version}."
        return result

    async def _complete_without_blocking_scheduler(
        self: TokenizerManager, obj: CompleteWeightsUpdateReqInput
    ) -> CompleteWeightsUpdateReqOutput:
        """Until the last bucket is in, each attempt blocks the scheduler for
        at most SCHEDULER_WAIT_S, so generation goes on between attempts."""
        timeout = DEFAULT_COMPLETE_TIMEOUT if obj.timeout is None else obj.timeout
        deadline = time.monotonic() + timeout
        attempt = dataclasses.replace(obj, scheduler_wait_s=SCHEDULER_WAIT_S)
        while True:
            result = (await self.complete_weights_update_communicator(attempt))[0]
            if not result.pending:
                return result
            if time.monotonic() >= deadline:
                # The session stays open: complete again, or abort.
                return CompleteWeightsUpdateReqOutput(
                    success=False,
                    num_buckets_received=result.num_buckets_received,
                    message=f"timed out after {timeout:g}s with "
                    f"{result.num_buckets_received} buckets received; "
                    f"complete again or abort",
                    status_code=400,
                    session_open=True,
                )
            await asyncio.sleep(SCHEDULER_WAIT_S)

    async def abort_weights_update(
        self: TokenizerManager,
        obj: AbortWeightsUpdateReqInput,
        request: Optional[fastapi.Request] = None,
    ) -> AbortWeightsUpdateReqOutput:
        self.auto_create_handle_loop()
        self._check_two_phase_supported()
        return (await self.abort_weights_update_communicator(obj))[0]


def two_phase_response_content(
    output: Union[
        PrepareWeightsUpdateReqOutput,
        CompleteWeightsUpdateReqOutput,
        AbortWeightsUpdateReqOutput,
    ],
) -> Dict[str, Any]:
    """The JSON answer: the output's fields less routing and the HTTP status."""
    content = dataclasses.asdict(output)
    for key in ("rid", "http_worker_ipc", "status_code", "session_open", "pending"):
        content.pop(key, None)
    return content
