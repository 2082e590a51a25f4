"""What the tokenizer manager provides the two-phase weight
update (tokenizer_two_phase_update_mixin): its
communicators to the schedulers, and which servers cannot take the update.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from sglang.srt.managers.io_struct import (
    AbortWeightsUpdateReqOutput,
    CompleteWeightsUpdateReqOutput,
    PrepareWeightsUpdateReqOutput,
)
from sglang.srt.server_args import ServerArgs
from sglang.utils import TypeBasedDispatcher

if TYPE_CHECKING:
    from sglang.srt.managers.tokenizer_manager import TokenizerManager


class TokenizerTwoPhaseUpdateHooks:
    def _record_weight_version(self: TokenizerManager, version: str) -> None:
        self._update_weight_version_if_provided(version)

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

    def _two_phase_unsupported(self: TokenizerManager) -> Optional[str]:
        """Why this server cannot take a two-phase update, or None."""
        if self.server_args.enable_dp_attention:
            return (
                "--enable-dp-attention: the two-phase weight update does not "
                "support attention data parallelism; nothing was done"
            )
        if self.server_args.pp_size > 1:
            return (
                "--pp-size: the two-phase weight update does not support "
                "pipeline parallelism; nothing was done"
            )
        return None
