"""What the tokenizer manager provides the two-phase weight
update (tokenizer_two_phase_update_mixin). Its
communicators come from the declarative specs of tokenizer_control_mixin
(_COMMUNICATOR_SPECS).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from sglang.srt.runtime_context import get_parallel

if TYPE_CHECKING:
    from sglang.srt.managers.tokenizer_manager import TokenizerManager


class TokenizerTwoPhaseUpdateHooks:
    def _record_weight_version(self: TokenizerManager, version: str) -> None:
        self._update_weight_version_if_provided(version)

    def _two_phase_unsupported(self: TokenizerManager) -> Optional[str]:
        """Why this server cannot take a two-phase update, or None."""
        if get_parallel().attn_dp_size > 1:
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
