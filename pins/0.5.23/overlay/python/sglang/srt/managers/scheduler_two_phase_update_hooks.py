"""What the scheduler provides the two-phase weight update
(scheduler_two_phase_update_mixin).

A two-phase update does not run inside the begin/end weight-update session,
which restores the checkpoint layout of re-packed layers on the live model:
the model serves while the update arrives. While one is open
begin_weight_update is refused, and with it a single-phase update; prepare is
refused while that session is open, and where SGLang refuses in-place
updates (a weight cache shared with other engines, derived-weight caches).
The update groups live in the model runner's weight updater, and an update
loads into every runner the weight updater selects (the target and a draft
model).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Optional

import torch
import zmq

from sglang.srt.model_executor.model_runner_components.weight_updater import (
    _unsupported_derived_weight_cache_error,
)
from sglang.srt.runtime_context import get_observability, get_parallel, get_serving
from sglang.srt.weight_sync.staged_receiver import WeightsUpdateError

if TYPE_CHECKING:
    from sglang.srt.managers.scheduler import Scheduler


class SchedulerTwoPhaseUpdateHooks:
    @property
    def _update_groups(self: Scheduler) -> Dict[str, Any]:
        return self.tp_worker.model_runner.weight_updater._model_update_group

    def _request_sockets(self: Scheduler) -> List[zmq.Socket]:
        """The sockets requests arrive on; none on ranks that get them by
        broadcast from rank 0 (a scripted tokenizer receiver is no socket)."""
        channels = self.ipc_channels
        sockets = (channels.recv_from_tokenizer, channels.recv_from_rpc)
        return [socket for socket in sockets if isinstance(socket, zmq.Socket)]

    def _refuse_beside_release_session(self: Scheduler) -> None:
        if self.weight_updater._session is not None:
            raise WeightsUpdateError(
                "a weight-update session (/begin_weight_update) is already "
                "open; end it first",
                status_code=409,
            )
        updater = self.tp_worker.model_runner.weight_updater
        try:
            updater._assert_weight_cache_inactive("a two-phase weight update")
        except RuntimeError as e:
            raise WeightsUpdateError(str(e)) from None
        error = _unsupported_derived_weight_cache_error(updater.get_model())
        if error is not None:
            raise WeightsUpdateError(error)

    def _staged_models(self: Scheduler) -> List[torch.nn.Module]:
        """The models an update loads into: every runner the weight updater
        selects (the target and a draft model)."""
        return [
            runner.weight_updater.get_model()
            for _, runner in self.weight_updater._select_runners()
        ]

    def _weight_sync_metrics_labels(self: Scheduler) -> Optional[Dict[str, str]]:
        """Labels of this rank's weight-sync metrics (weight_sync/
        sync_metrics.py); None unless metrics are on and this is TP rank 0
        of its replica."""
        if not get_observability().enable_metrics or self.tp_rank != 0:
            return None
        return {
            "model_name": get_serving().served_model_name,
            "dp_rank": str(get_parallel().dp_rank or 0),
        }

    def _record_applied_version(self: Scheduler, version: Optional[str]) -> None:
        self.weight_updater.record_weight_version_after_update(version)
