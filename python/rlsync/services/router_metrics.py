"""Prometheus metrics of `rlsync router` (`GET /metrics`).

Names follow SGLang's (`sglang:num_requests_running`) with an `rlsync:`
prefix, and Prometheus' conventions: the unit in the name, `_total` on
counters. Each app has its own registry, so several routers in one process
(tests) do not collide.

    gauge      rlsync:router_workers{state}: workers per state
    gauge      rlsync:router_worker_state{worker,state}: 1 for its state, 0 else
    gauge      rlsync:router_worker_in_flight_requests{worker}
    counter    rlsync:router_routed_requests_total{worker}: generation routed
    counter    rlsync:router_admin_broadcasts_total{route,outcome}
    histogram  rlsync:router_admin_lock_wait_seconds{route}: lock waits
    counter    rlsync:router_admin_lock_timeouts_total{route}: 503s past
               --admin-wait

A worker's state is the first of dead, disabled, updating, rejoining that
holds, else ready (the `state` of `GET /workers`, without its reason). The
worker gauges are read from the router's own state at each scrape.
"""

from __future__ import annotations

from typing import Iterable, Protocol, Sequence

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

PREFIX = "rlsync:router_"
WORKER_STATES = ("ready", "updating", "rejoining", "disabled", "dead")


class Worker(Protocol):
    """What the gauges read of a router's worker (`router.Worker`)."""

    url: str
    in_flight: int
    routed: int

    @property
    def state(self) -> str: ...


# ok: every live worker succeeded; partial: some did; failed: none did;
# refused: the router answered without asking a worker (a 400 or 413 for the
# input, a 503 past --admin-wait, a 503 with no live worker).
OUTCOMES = ("ok", "partial", "failed", "refused")
# From a free lock (well under a millisecond) to a caller that waits out a
# weight update (--admin-wait, 30 s by default, may be set far higher).
LOCK_WAIT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
)


def outcome(successes: Sequence[bool]) -> str:
    """ok, partial or failed: a broadcast's outcome from its workers'
    successes (one per worker asked)."""
    if successes and all(successes):
        return "ok"
    return "partial" if any(successes) else "failed"


class _WorkerCollector(Collector):
    """The worker gauges, read from the router's workers at each scrape."""

    def __init__(self, workers: Sequence[Worker]):
        self.workers = workers

    def describe(self) -> Iterable[Metric]:
        return self._families()

    def collect(self) -> Iterable[Metric]:
        families = self._families()
        counts = dict.fromkeys(WORKER_STATES, 0)
        for w in self.workers:
            state = w.state
            counts[state] += 1
            for s in WORKER_STATES:
                families[1].add_metric([w.url, s], 1 if s == state else 0)
            families[2].add_metric([w.url], w.in_flight)
            families[3].add_metric([w.url], w.routed)
        for s, n in counts.items():
            families[0].add_metric([s], n)
        return families

    @staticmethod
    def _families() -> list[Metric]:
        return [
            GaugeMetricFamily(
                PREFIX + "workers",
                "Workers per state (ready, updating, rejoining, disabled, dead).",
                labels=["state"],
            ),
            GaugeMetricFamily(
                PREFIX + "worker_state",
                "1 for the worker's state, 0 for the other states.",
                labels=["worker", "state"],
            ),
            GaugeMetricFamily(
                PREFIX + "worker_in_flight_requests",
                "Generation requests in flight on the worker.",
                labels=["worker"],
            ),
            CounterMetricFamily(
                PREFIX + "routed_requests",
                "Generation requests routed to the worker.",
                labels=["worker"],
            ),
        ]


class RouterMetrics:
    """The router's metrics, in a registry of their own."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(
        self,
        workers: Sequence[Worker],
        admin_routes: Iterable[str],
        locked_routes: Iterable[str],
    ):
        self.registry = CollectorRegistry()
        self.registry.register(_WorkerCollector(workers))
        self.broadcasts = Counter(
            PREFIX + "admin_broadcasts_total",
            "Admin calls broadcast to the workers, by route and outcome "
            "(ok, partial, failed, refused).",
            ["route", "outcome"],
            registry=self.registry,
        )
        self.lock_wait = Histogram(
            PREFIX + "admin_lock_wait_seconds",
            "Seconds a caller waited for the admin lock, timed-out waits included.",
            ["route"],
            buckets=LOCK_WAIT_BUCKETS,
            registry=self.registry,
        )
        self.lock_timeouts = Counter(
            PREFIX + "admin_lock_timeouts_total",
            "Admin calls answered 503 after waiting --admin-wait for the admin lock.",
            ["route"],
            registry=self.registry,
        )
        # Every series from zero, so a rate sees the first call.
        for route in admin_routes:
            for o in OUTCOMES:
                self.broadcasts.labels(route=route, outcome=o)
        for route in locked_routes:
            self.lock_wait.labels(route=route)
            self.lock_timeouts.labels(route=route)

    def broadcast(self, route: str, outcome: str) -> None:
        self.broadcasts.labels(route=route, outcome=outcome).inc()

    def waited(self, route: str, seconds: float, timed_out: bool) -> None:
        self.lock_wait.labels(route=route).observe(seconds)
        if timed_out:
            self.lock_timeouts.labels(route=route).inc()

    def render(self) -> bytes:
        """The exposition, in Prometheus' text format."""
        return generate_latest(self.registry)
