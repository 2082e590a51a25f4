"""Prometheus figures of weight syncs, on SGLang's /metrics (--enable-metrics).

- Scheduler side (`WeightSyncMetrics`): two-phase syncs by outcome, bytes
  received, receive/verify/apply seconds, the serving stall of the apply,
  sessions open and digest mismatches. TP rank 0 of each data-parallel
  replica records them, so that a sync counts once whatever the TP size.
- Tokenizer side (`WeightUpdateHealthMetrics`): weight operations in flight
  and the health answers given while one runs.

prometheus_client is imported only once metrics are enabled, after SGLang has
set PROMETHEUS_MULTIPROC_DIR: every process writes its own figures there and
/metrics sums them (gauges over the live processes).
"""

from __future__ import annotations

import functools
from typing import Dict, Optional, Tuple

# 5 ms to about 22 minutes, doubling: a sync of a tiny model on CPU to one of
# a large model over a slow network.
SECONDS_BUCKETS = tuple(0.005 * 2**i for i in range(19))

# Outcomes of a two-phase sync, and why a failed one failed.
APPLIED = "applied"
ABORTED = "aborted"
FAILED = "failed"
REJECTED = "rejected"  # prepare refused it: nothing was received
RECEIVE_ERROR = "receive_error"  # the transfer broke
DIGEST_MISMATCH = "digest_mismatch"  # bytes arrived that the trainer did not send
APPLY_ERROR = "apply_error"  # the model refused the verified weights
CACHE_FLUSH_ERROR = "cache_flush_error"  # applied; the cache flush failed


class WeightSyncMetrics:
    def __init__(self, labels: Dict[str, str]) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        self.labels = labels
        names = list(labels)

        def histogram(name: str, what: str) -> Histogram:
            return Histogram(name, what, names, buckets=SECONDS_BUCKETS)

        self.syncs = Counter(
            "sglang:weight_syncs",
            "Two-phase weight syncs by outcome (applied, aborted, failed) and, "
            "for a failed one, the reason.",
            names + ["outcome", "reason"],
        )
        self.received_bytes = Counter(
            "sglang:weight_sync_received_bytes",
            "Bytes received by two-phase weight syncs.",
            names,
        )
        self.receive_seconds = histogram(
            "sglang:weight_sync_receive_seconds",
            "Seconds from the receiver's start to the last bucket of a sync.",
        )
        self.verify_seconds = histogram(
            "sglang:weight_sync_verify_seconds",
            "Seconds spent verifying the buckets' digests of a sync.",
        )
        self.apply_seconds = histogram(
            "sglang:weight_sync_apply_seconds",
            "Seconds the model took to load a sync's verified weights.",
        )
        self.serving_stall_seconds = histogram(
            "sglang:weight_sync_serving_stall_seconds",
            "Seconds the scheduler ran no batch because of an applied sync "
            "(its complete calls: waiting, verifying, applying, flushing).",
        )
        self.digest_mismatches = Counter(
            "sglang:weight_sync_digest_mismatches",
            "Buckets whose received bytes did not match the sender's digest "
            "(summed over TP ranks).",
            names,
        )
        self.sessions_open = Gauge(
            "sglang:weight_sync_sessions_open",
            "Two-phase weight update sessions open (prepared, not yet ended).",
            names,
            multiprocess_mode="livesum",
        )
        self.staging_bytes = Gauge(
            "sglang:weight_sync_staging_bytes",
            "Bytes the last two-phase weight sync staged on TP rank 0 of each "
            "replica: the copy of its parameters plus its bucket buffers.",
            names,
            multiprocess_mode="livemax",
        )

    def sync_ended(self, outcome: str, reason: str = "") -> None:
        self.syncs.labels(**self.labels, outcome=outcome, reason=reason).inc()

    def session_open(self, is_open: bool) -> None:
        self.sessions_open.labels(**self.labels).set(1 if is_open else 0)

    def staging(self, nbytes: int) -> None:
        self.staging_bytes.labels(**self.labels).set(nbytes)

    def received(
        self, nbytes: int, receive_seconds: Optional[float], verify_seconds: float
    ) -> None:
        """A session's transfer; `receive_seconds` None when it did not end."""
        self.received_bytes.labels(**self.labels).inc(nbytes)
        if receive_seconds is not None:
            self.receive_seconds.labels(**self.labels).observe(receive_seconds)
            self.verify_seconds.labels(**self.labels).observe(verify_seconds)

    def applied(self, apply_seconds: float, serving_stall_seconds: float) -> None:
        self.apply_seconds.labels(**self.labels).observe(apply_seconds)
        self.serving_stall_seconds.labels(**self.labels).observe(serving_stall_seconds)

    def mismatched(self, buckets: int) -> None:
        if buckets:
            self.digest_mismatches.labels(**self.labels).inc(buckets)


@functools.cache
def _sync_metrics(labels: Tuple[Tuple[str, str], ...]) -> WeightSyncMetrics:
    return WeightSyncMetrics(dict(labels))


def weight_sync_metrics(
    labels: Optional[Dict[str, str]],
) -> Optional[WeightSyncMetrics]:
    """The process's metrics; None where this process records none (metrics
    off, or not the recording rank)."""
    if labels is None:
        return None
    return _sync_metrics(tuple(labels.items()))


# Health answers while a weight operation runs.
HEALTHY_WHILE_UPDATING = "healthy_while_updating"
PAST_DEADLINE = "past_deadline"


class WeightUpdateHealthMetrics:
    def __init__(self) -> None:
        from prometheus_client import Counter, Gauge

        self.in_flight = Gauge(
            "sglang:weight_update_operations_in_flight",
            "Weight update operations (HTTP calls) running, by operation.",
            ["operation"],
            multiprocess_mode="livesum",
        )
        self.health_answers = Counter(
            "sglang:weight_update_health_answers",
            "Health checks answered while a weight operation ran: 200 at once "
            "(healthy_while_updating) or 503 (past_deadline).",
            ["answer"],
        )

    def began(self, operation: str) -> None:
        self.in_flight.labels(operation=operation).inc()

    def ended(self, operation: str) -> None:
        self.in_flight.labels(operation=operation).dec()

    def answered(self, answer: str) -> None:
        self.health_answers.labels(answer=answer).inc()


@functools.cache
def weight_update_health_metrics() -> WeightUpdateHealthMetrics:
    return WeightUpdateHealthMetrics()
