"""The seam between the two-phase weight update's mixins
(scheduler_two_phase_update_mixin, tokenizer_two_phase_update_mixin) and the
scheduler and tokenizer manager they extend.

`SchedulerTwoPhaseUpdateHooks` and `TokenizerTwoPhaseUpdateHooks`
(scheduler_two_phase_update_hooks.py, tokenizer_two_phase_update_hooks.py),
which the mixins subclass, hold what reads the managers' internals. What the
hooks must define is declared here, as Protocols: every method. The
mixins read nothing else of the scheduler and the tokenizer manager but the
public members declared beside them, and no private state of the
scheduler or the tokenizer manager but through a hook.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Protocol


class SchedulerTwoPhaseUpdateHooksProtocol(Protocol):
    """What `SchedulerTwoPhaseUpdateHooks` defines."""

    @property
    def _update_groups(self) -> Dict[str, Any]:
        """The update groups by name (where the scheduler keeps them)."""

    def _request_sockets(self) -> List[Any]:
        """The ZMQ sockets requests arrive on (none on ranks that get them
        by broadcast), which an idle scheduler waits on while weights
        arrive."""

    def _refuse_beside_release_session(self) -> None:
        """Raise WeightsUpdateError while the scheduler's own weight-update
        session is open (409), or where the scheduler refuses to update this
        model's weights in place (400)."""

    def _record_applied_version(self, version: Optional[str]) -> None:
        """Record the weight version an apply installed, where the scheduler
        keeps it (if it does)."""

    def _weight_sync_metrics_labels(self) -> Optional[Dict[str, str]]:
        """Labels of this rank's weight-sync metrics; None unless metrics are
        on and this is TP rank 0 of its replica."""

    def _staged_models(self) -> List[Any]:
        """The models an update loads into (the served one; a draft model
        too where an update loads into both)."""


class SchedulerMembers(Protocol):
    """Public members of the scheduler the mixin reads: its own, or, where it
    lacks one, added by the hooks."""

    server_args: Any
    tp_rank: int
    tp_size: int
    tp_worker: Any

    def flush_cache(self) -> Any: ...

    def is_fully_idle(self) -> bool: ...


class TokenizerTwoPhaseUpdateHooksProtocol(Protocol):
    """What `TokenizerTwoPhaseUpdateHooks` defines."""

    def _two_phase_unsupported(self) -> Optional[str]:
        """Why this server cannot take a two-phase update, or None."""

    def _record_weight_version(self, version: str) -> None:
        """Record the weight version an apply installed as the server's (what
        /get_weight_version answers)."""


class TokenizerMembers(Protocol):
    """Public members of the tokenizer manager the mixin reads: its own, and
    the communicators to the schedulers the two-phase update adds (by the
    hooks, or by the tokenizer manager's communicator specs)."""

    server_args: Any
    model_update_lock: Any
    is_pause: bool
    is_pause_cond: Any
    prepare_weights_update_communicator: Any
    complete_weights_update_communicator: Any
    abort_weights_update_communicator: Any

    def auto_create_handle_loop(self) -> None: ...
