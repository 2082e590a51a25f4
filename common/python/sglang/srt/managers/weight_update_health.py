"""Keep a server healthy while weights are updated, but not forever.

Weight-update operations block the scheduler: group initialisation waits for
the trainer to join, a distributed update waits for its bytes. Meanwhile the
health check cannot generate a token and watchdogs see no progress, so
orchestrators kill or drain a healthy server.

- Tokenizer side: `WeightUpdateTracker` records the operations in flight (a
  set, so overlapping operations and failures stay correct); `/health` and
  `/health_generate` answer 200 at once while one runs and is younger than its
  deadline, and 503 naming the operation once it is older.
- Metrics: with --enable-metrics, /metrics counts both answers and the
  operations in flight (weight_sync/sync_metrics.py).
- Scheduler side: `pause_watchdogs_during_weight_update` pauses the scheduler's
  watchdogs up to the deadline. The detokenizer's need no pause: its watchdog
  does not count while it waits for the scheduler.
"""

from __future__ import annotations

import functools
import itertools
import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, Iterator, List, Optional, Tuple

from fastapi import Response

from sglang.srt.weight_sync.sync_metrics import (
    HEALTHY_WHILE_UPDATING,
    PAST_DEADLINE,
    WeightUpdateHealthMetrics,
    weight_update_health_metrics,
)

if TYPE_CHECKING:
    from sglang.srt.managers.scheduler import Scheduler

logger = logging.getLogger(__name__)

# Added to an operation's own timeout so that it can fail and report first.
_TIMEOUT_GRACE_S = 10.0


@dataclass
class WeightUpdateOperation:
    name: str
    started: float
    deadline: float
    # The two-phase session the call named, if any
    session_id: Optional[str] = None

    def age(self, now: float) -> float:
        return now - self.started

    @property
    def label(self) -> str:
        """How a health answer names the operation."""
        if self.session_id is not None:
            return f"{self.name} of session {self.session_id}"
        return self.name


class WeightUpdateTracker:
    def __init__(self, default_deadline: float):
        self.default_deadline = default_deadline
        self._operations: Dict[int, WeightUpdateOperation] = {}
        self._ids = itertools.count()
        self.metrics: Optional[WeightUpdateHealthMetrics] = None

    def record_metrics(self) -> None:
        """Count the operations in flight and the health answers on /metrics."""
        self.metrics = weight_update_health_metrics()

    def begin(
        self,
        name: str,
        timeout: Optional[float] = None,
        session_id: Optional[str] = None,
    ) -> int:
        # The operator's deadline bounds every operation; an operation's own
        # timeout can only shorten it.
        deadline = self.default_deadline
        if timeout is not None:
            deadline = min(deadline, timeout + _TIMEOUT_GRACE_S)
        op_id = next(self._ids)
        self._operations[op_id] = WeightUpdateOperation(
            name=name,
            started=time.monotonic(),
            deadline=deadline,
            session_id=session_id,
        )
        if self.metrics is not None:
            self.metrics.began(name)
        return op_id

    def end(self, op_id: int) -> None:
        if self.metrics is not None and op_id in self._operations:
            self.metrics.ended(self._operations[op_id].name)
        self._operations.pop(op_id, None)

    @property
    def in_progress(self) -> bool:
        return bool(self._operations)

    def operations(self) -> List[WeightUpdateOperation]:
        return list(self._operations.values())

    def stuck(self) -> List[Tuple[WeightUpdateOperation, float]]:
        now = time.monotonic()
        return [
            (op, op.age(now))
            for op in self._operations.values()
            if op.age(now) > op.deadline
        ]


def track_weight_update(name: str):
    """Decorate a TokenizerManager method `(self, obj, request=None)`."""

    def decorator(func):
        @functools.wraps(func)
        async def wrapper(self, *args, **kwargs):
            tracker: Optional[WeightUpdateTracker] = getattr(
                self, "weight_update_tracker", None
            )
            if tracker is None:
                return await func(self, *args, **kwargs)
            obj = args[0] if args else kwargs.get("obj")
            op_id = tracker.begin(
                name,
                timeout=getattr(obj, "timeout", None),
                session_id=getattr(obj, "session_id", None),
            )
            try:
                return await func(self, *args, **kwargs)
            finally:
                tracker.end(op_id)

        return wrapper

    return decorator


def weight_update_health_response(tokenizer_manager) -> Optional[Response]:
    """The health answer while a weight update runs; None when none runs."""
    tracker: Optional[WeightUpdateTracker] = getattr(
        tokenizer_manager, "weight_update_tracker", None
    )
    if tracker is None or not tracker.in_progress:
        return None
    stuck = tracker.stuck()
    if tracker.metrics is not None:
        tracker.metrics.answered(PAST_DEADLINE if stuck else HEALTHY_WHILE_UPDATING)
    if not stuck:
        now = time.monotonic()
        running = ", ".join(
            f"{op.label} ({op.age(now):.1f}s)" for op in tracker.operations()
        )
        return Response(
            content=f"weight update in progress: {running}", status_code=200
        )
    message = "; ".join(
        f"weight update operation '{op.label}' has run for {age:.1f}s, "
        f"past its deadline of {op.deadline:.1f}s"
        for op, age in stuck
    )
    logger.error(f"Health check failed: {message}")
    return Response(content=message, status_code=503)


@contextmanager
def watchdogs_paused(scheduler: Scheduler) -> Iterator[None]:
    """The scheduler's watchdogs paused while a weight operation may block."""
    watchdogs = [
        w
        for w in (
            getattr(scheduler, "watchdog", None),
            getattr(scheduler, "soft_watchdog", None),
        )
        if w is not None
    ]
    # Past the operator's deadline /health answers 503, and the watchdogs
    # count their timeout again: a load that never returns ends the server
    # instead of blocking it for good.
    limit = scheduler.server_args.weight_update_health_deadline
    pauses = [(watchdog, watchdog.pause(limit)) for watchdog in watchdogs]
    try:
        yield
    finally:
        for watchdog, pause in pauses:
            watchdog.resume(pause)


def pause_watchdogs_during_weight_update(func):
    """Decorate a Scheduler handler that may block on a weight update."""

    @functools.wraps(func)
    def wrapper(self: Scheduler, recv_req):
        with watchdogs_paused(self):
            return func(self, recv_req)

    return wrapper
