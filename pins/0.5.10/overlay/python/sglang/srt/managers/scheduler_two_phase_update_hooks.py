"""What the scheduler provides the two-phase weight update
(scheduler_two_phase_update_mixin): where the
update groups live, the sockets an idle scheduler waits on, and the models an
update loads into. The scheduler has no weight-update session of its
own, so there is nothing to open, close or refuse beside one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Optional

import torch
import zmq

if TYPE_CHECKING:
    from sglang.srt.managers.scheduler import Scheduler


class SchedulerTwoPhaseUpdateHooks:
    @property
    def _update_groups(self: Scheduler) -> Dict[str, Any]:
        return self.tp_worker.model_runner._model_update_group

    def _request_sockets(self: Scheduler) -> List[zmq.Socket]:
        """The sockets requests arrive on; none on ranks that get them by
        broadcast from rank 0."""
        sockets = (self.recv_from_tokenizer, self.recv_from_rpc)
        return [socket for socket in sockets if socket is not None]

    def _refuse_beside_release_session(self: Scheduler) -> None:
        """Nothing to refuse: the scheduler has no session of its own."""

    def _staged_models(self: Scheduler) -> List[torch.nn.Module]:
        """The models an update loads into: the served one."""
        return [self.tp_worker.model_runner.model]

    def _weight_sync_metrics_labels(self: Scheduler) -> Optional[Dict[str, str]]:
        """Labels of this rank's weight-sync metrics (weight_sync/
        sync_metrics.py); None unless metrics are on and this is TP rank 0
        of its replica."""
        if not self.enable_metrics or self.tp_rank != 0:
            return None
        return {
            "model_name": self.server_args.served_model_name,
            "dp_rank": str(self.dp_rank or 0),
        }

    def _record_applied_version(self: Scheduler, version: Optional[str]) -> None:
        """The tokenizer manager records it from the complete's answer."""
