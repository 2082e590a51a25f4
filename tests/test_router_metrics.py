"""`rlsync router`'s `GET /metrics`, in process in front of fake workers (no
SGLang): Prometheus' text format behind the admin key as `/workers` is,
broadcasts counted by route and outcome, admin-lock waits and timeouts, and
the worker gauges following each worker's state."""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Iterator
from typing import Any, Callable, Optional

import pytest
from fastapi.testclient import TestClient

from harness.metrics import Samples, families, parse, value
from rlsync.services.router import RouterConfig, create_app

ADMIN_KEY = "r0uter-adm1n-key"
RIGHT = {"Authorization": f"Bearer {ADMIN_KEY}"}
NOBODY = "http://127.0.0.1:9"  # nothing listens: a worker dead from the start


class FakeWorker:
    """An SGLang worker as the router sees it: `/health`, `/server_info`,
    `/model_info`, `/generate`, and admin routes answering success, except
    the routes in `fail` (a 500 with `success: false`), those in `answers`
    (that status and body) and those in `hold` (answered once their event is
    set, GET /health too). `bodies` records each POST's JSON body by route."""

    def __init__(self) -> None:
        self.fail: set[str] = set()
        self.answers: dict[str, tuple[int, Any]] = {}
        self.bodies: dict[str, list[Any]] = {}
        self.hold: dict[str, threading.Event] = {}
        self.holding = threading.Event()  # a held route has been asked
        self.server_info: dict[str, Any] = {"tp_size": 1, "dp_size": 1}
        worker = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def answer(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                answers = {
                    "/health": {},
                    "/server_info": worker.server_info,
                    "/model_info": {"weight_version": "v0"},
                }
                if self.path in worker.hold:  # a host that stopped answering
                    worker.holding.set()
                    worker.hold[self.path].wait(60)
                if self.path in answers:
                    self.answer(200, answers[self.path])
                else:
                    self.answer(404, {"detail": "Not Found"})

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                try:
                    worker.bodies.setdefault(self.path, []).append(json.loads(raw))
                except ValueError:
                    pass
                if self.path in worker.answers:
                    return self.answer(*worker.answers[self.path])
                if self.path == "/generate":
                    return self.answer(200, {"text": "fake"})
                if self.path in worker.hold:
                    worker.holding.set()
                    worker.hold[self.path].wait(30)
                if self.path in worker.fail:
                    return self.answer(500, {"success": False, "message": "fake"})
                self.answer(200, {"success": True, "message": ""})

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        for event in self.hold.values():
            event.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


@pytest.fixture
def fake_workers() -> Iterator[Callable[[int], list[FakeWorker]]]:
    made: list[FakeWorker] = []

    def make(n: int) -> list[FakeWorker]:
        new = [FakeWorker() for _ in range(n)]
        made.extend(new)
        return new

    yield make
    for w in made:
        w.close()


def router_client(workers: list[str], **options: Any) -> TestClient:
    config = RouterConfig(
        workers, admin_api_key=ADMIN_KEY, **{"health_interval": 600, **options}
    )
    return TestClient(create_app(config))


def scrape(http: TestClient, headers: Optional[dict[str, str]] = None) -> Samples:
    resp = http.get("/metrics", headers=RIGHT if headers is None else headers)
    assert resp.status_code == 200, resp.text
    return parse(resp.text)


BROADCASTS = "rlsync:router_admin_broadcasts_total"
LOCK_WAITS = "rlsync:router_admin_lock_wait_seconds_count"
LOCK_WAIT_SUM = "rlsync:router_admin_lock_wait_seconds_sum"
LOCK_TIMEOUTS = "rlsync:router_admin_lock_timeouts_total"
WORKERS = "rlsync:router_workers"
WORKER_STATE = "rlsync:router_worker_state"


def test_metrics_are_prometheus_text_behind_the_admin_key(fake_workers):
    (w,) = fake_workers(1)
    with router_client([w.url]) as http:
        assert http.get("/metrics").status_code == 401
        wrong = http.get("/metrics", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        malformed = http.get("/metrics", headers=[("authorization", b"Bearer \xff")])
        assert malformed.status_code == 401
        assert http.get("/workers").status_code == 401, "the same rule as /workers"
        resp = http.get("/metrics", headers=RIGHT)
        assert resp.status_code == 200, resp.text
        assert resp.headers["content-type"].startswith("text/plain; version=")
        assert families(resp.text) == {
            "rlsync:router_workers": "gauge",
            "rlsync:router_worker_state": "gauge",
            "rlsync:router_worker_in_flight_requests": "gauge",
            "rlsync:router_routed_requests": "counter",
            "rlsync:router_admin_broadcasts": "counter",
            "rlsync:router_admin_lock_wait_seconds": "histogram",
            "rlsync:router_admin_lock_timeouts": "counter",
        }, resp.text
        assert "# TYPE rlsync:router_admin_broadcasts_total counter" in resp.text
        samples = scrape(http)
        assert value(samples, WORKERS, state="ready") == 1
        assert value(samples, BROADCASTS, route="/flush_cache", outcome="ok") == 0
        assert (
            BROADCASTS,
            frozenset({("route", "/flush_cache"), ("outcome", "ok")}),
        ) in samples, "every route and outcome is exported from zero"
    # Without an admin key /metrics is open, as /workers is; a second router
    # in the same process has registries of its own.
    config = RouterConfig([w.url], health_interval=600)
    with TestClient(create_app(config)) as one, TestClient(create_app(config)) as two:
        one.post("/flush_cache", json={})
        assert value(scrape(one, {}), BROADCASTS, route="/flush_cache", outcome="ok")
        assert not value(
            scrape(two, {}), BROADCASTS, route="/flush_cache", outcome="ok"
        )


def test_broadcasts_are_counted_by_route_and_outcome(fake_workers):
    a, b = fake_workers(2)
    b.fail = {"/flush_cache", "/weights_checker"}
    a.fail = {"/weights_checker"}
    with router_client([a.url, b.url]) as http:
        calls = [
            ("/pause_generation", {"mode": "abort"}, 200, "ok"),
            ("/continue_generation", {}, 200, "ok"),
            ("/flush_cache", {}, 500, "partial"),
            ("/weights_checker", {"action": "checksum"}, 500, "failed"),
            # Refused by the router itself, no worker asked: before the lock,
            # so no lock wait either.
            ("/init_weights_update_group", {"master_port": 1}, 400, "refused"),
        ]
        for path, body, status, outcome in calls:
            before = scrape(http)
            resp = http.post(path, json=body, headers=RIGHT)
            assert resp.status_code == status, (path, resp.text)
            after = scrape(http)
            for o in ("ok", "partial", "failed", "refused"):
                delta = value(after, BROADCASTS, route=path, outcome=o) - value(
                    before, BROADCASTS, route=path, outcome=o
                )
                assert delta == (1 if o == outcome else 0), (path, o, delta)
            waits = value(after, LOCK_WAITS, route=path) - value(
                before, LOCK_WAITS, route=path
            )
            locked = path in ("/pause_generation", "/continue_generation")
            assert waits == (1 if locked else 0), (path, waits)
        # A bad body is refused too; a caller without the key is not counted.
        resp = http.post("/weights_checker", content=b"{", headers=RIGHT)
        assert resp.status_code == 400
        assert http.post("/weights_checker", json={}).status_code == 401
        samples = scrape(http)
        assert (
            value(samples, BROADCASTS, route="/weights_checker", outcome="refused") == 1
        )
        assert (
            sum(v for (name, _), v in samples.items() if name == BROADCASTS)
            == len(calls) + 1
        )
        assert value(samples, LOCK_TIMEOUTS, route="/pause_generation") == 0


def test_admin_lock_wait_and_timeout(fake_workers):
    a, b = fake_workers(2)
    release = threading.Event()
    a.hold = {"/pause_generation": release}
    with router_client([a.url, b.url], admin_wait=0.3) as http:
        holder: list[Any] = []
        pause = threading.Thread(
            target=lambda: holder.append(
                http.post("/pause_generation", json={}, headers=RIGHT)
            )
        )
        pause.start()
        try:
            assert a.holding.wait(10), "the pause never reached the worker"
            during = scrape(http)
            # Both workers left routing for the pause broadcast.
            assert value(during, WORKERS, state="updating") == 2
            assert value(during, WORKER_STATE, worker=a.url, state="updating") == 1
            assert value(during, WORKER_STATE, worker=a.url, state="ready") == 0
            t0 = time.monotonic()
            resp = http.post("/continue_generation", json={}, headers=RIGHT)
            assert time.monotonic() - t0 >= 0.3
            assert resp.status_code == 503, resp.text
            assert "admin lock held by /pause_generation" in resp.json()["message"]
        finally:
            release.set()
            pause.join(30)
        assert holder and holder[0].status_code == 200, holder
        samples = scrape(http)
        route = "/continue_generation"
        assert value(samples, LOCK_TIMEOUTS, route=route) == 1
        assert value(samples, LOCK_WAITS, route=route) == 1
        assert value(samples, LOCK_WAIT_SUM, route=route) >= 0.3
        assert value(samples, BROADCASTS, route=route, outcome="refused") == 1
        assert value(samples, LOCK_TIMEOUTS, route="/pause_generation") == 0
        assert value(samples, LOCK_WAITS, route="/pause_generation") == 1
        assert value(samples, BROADCASTS, route="/pause_generation", outcome="ok") == 1
        assert value(samples, WORKERS, state="ready") == 2, "back in routing"
        # The lock is free again: the next caller waits well under its bound.
        resp = http.post(route, json={}, headers=RIGHT)
        assert resp.status_code == 200, resp.text
        samples = scrape(http)
        assert value(samples, LOCK_WAITS, route=route) == 2
        assert value(samples, LOCK_TIMEOUTS, route=route) == 1


def test_worker_gauges_follow_disable_enable_and_routing(fake_workers):
    a, b = fake_workers(2)
    with router_client([a.url, b.url, NOBODY]) as http:
        samples = scrape(http)
        assert value(samples, WORKERS, state="ready") == 2
        assert value(samples, WORKERS, state="dead") == 1
        assert value(samples, WORKER_STATE, worker=NOBODY, state="dead") == 1
        resp = http.post(
            "/workers/disable", json={"url": b.url, "reason": "drain"}, headers=RIGHT
        )
        assert resp.status_code == 200, resp.text
        samples = scrape(http)
        assert value(samples, WORKERS, state="ready") == 1
        assert value(samples, WORKERS, state="disabled") == 1
        assert value(samples, WORKER_STATE, worker=b.url, state="disabled") == 1
        assert value(samples, WORKER_STATE, worker=b.url, state="ready") == 0
        assert value(samples, WORKER_STATE, worker=a.url, state="ready") == 1
        for _ in range(3):
            assert http.post("/generate", json={"text": "x"}).status_code == 200
        samples = scrape(http)
        routed = "rlsync:router_routed_requests_total"
        assert value(samples, routed, worker=a.url) == 3
        assert value(samples, routed, worker=b.url) == 0, "disabled: none routed"
        in_flight = "rlsync:router_worker_in_flight_requests"
        assert value(samples, in_flight, worker=a.url) == 0
        resp = http.post("/workers/enable", json={"url": b.url}, headers=RIGHT)
        assert resp.status_code == 200, resp.text
        samples = scrape(http)
        assert value(samples, WORKERS, state="ready") == 2
        assert value(samples, WORKERS, state="disabled") == 0
        assert value(samples, WORKER_STATE, worker=b.url, state="ready") == 1


def test_a_prepare_reaches_every_worker_with_one_session_and_honest_awaits(
    fake_workers,
):
    """A prepare without a session id gets one id, the same on every worker.
    A refusal says `awaits_abort_header` only when every worker's ranks wait
    for the trainer's abort header (ready, or refused and waiting): a trainer
    that broadcast it while one worker posted nothing would hang."""
    a, b = fake_workers(2)
    ready = (200, {"status": "ready", "message": "", "session_id": "s" * 24})
    waiting = (413, {"status": "error", "message": "big", "awaits_abort_header": True})
    refused = (
        409,
        {"status": "error", "message": "open", "awaits_abort_header": False},
    )
    body = {"num_buckets": 1, "buckets": [], "group_name": "g"}
    with router_client([a.url, b.url]) as http:
        for answer_a, answer_b, awaits in [
            (ready, waiting, True),
            (waiting, waiting, True),
            (waiting, refused, False),
            (ready, refused, False),
        ]:
            a.answers["/prepare_weights_update"] = answer_a
            b.answers["/prepare_weights_update"] = answer_b
            resp = http.post("/prepare_weights_update", json=body, headers=RIGHT)
            assert resp.json()["awaits_abort_header"] is awaits, (answer_a, answer_b)
    sent = [w.bodies["/prepare_weights_update"] for w in (a, b)]
    for first, second in zip(*sent):
        assert first["session_id"] == second["session_id"]
        assert len(first["session_id"]) >= 16
    assert len({body["session_id"] for body in sent[0]}) == len(sent[0])


# --- health probes: at once, each within its deadline -------------------------


def workers_view(http: TestClient) -> dict[str, dict[str, Any]]:
    resp = http.get("/workers", headers=RIGHT)
    assert resp.status_code == 200, resp.text
    return {w["url"]: w for w in resp.json()["workers"]}


def wait_for(http: TestClient, done: Callable[[dict], bool], what: str) -> dict:
    """Poll /workers until `done(view)`, within a deadline."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        view = workers_view(http)
        if done(view):
            return view
        time.sleep(0.05)
    raise AssertionError(f"{what}: not within 30 s: {workers_view(http)}")


def test_a_worker_that_stops_answering_holds_up_no_other_check(fake_workers):
    """A host that vanished (its /health never answers) is first in the
    list: the worker that died behind it is marked dead while that probe
    still waits, and the healthy one is never marked dead."""
    vanished, healthy, dying = fake_workers(3)
    urls = [vanished.url, healthy.url, dying.url]
    with router_client(urls, health_interval=0.1, health_timeout=120) as http:
        vanished.hold["/health"] = threading.Event()
        dying.close()  # connection refused from now on
        view = wait_for(http, lambda v: v[dying.url]["dead"], "the dead worker seen")
        assert vanished.holding.is_set(), "the vanished worker was probed"
        assert not view[vanished.url]["dead"], "its probe still waits"
        assert not view[healthy.url]["dead"]
        assert "health check failed" in view[dying.url]["reason"]
        vanished.hold["/health"].set()
        assert not workers_view(http)[healthy.url]["dead"]


def test_a_probe_past_its_deadline_marks_only_that_worker_dead(fake_workers):
    vanished, healthy = fake_workers(2)
    with router_client(
        [vanished.url, healthy.url], health_interval=0.1, health_timeout=0.5
    ) as http:
        vanished.hold["/health"] = threading.Event()  # never set while we look
        view = wait_for(http, lambda v: v[vanished.url]["dead"], "the vanished one")
        assert view[vanished.url]["reason"] == "health check timed out after 0.5 s"
        assert not view[healthy.url]["dead"]
        assert not vanished.hold["/health"].is_set(), "the deadline, not an answer"


@pytest.mark.parametrize("field", ["health_interval", "health_timeout"])
@pytest.mark.parametrize("seconds", [0, -1.0])
def test_health_seconds_must_be_positive(field, seconds):
    with pytest.raises(ValueError, match=f"{field}: seconds must be > 0"):
        RouterConfig([NOBODY], **{field: seconds})


def test_a_workers_update_group_ranks_follow_the_libraries_rule(fake_workers):
    """TP and DP as `/server_info` says, except that attention data
    parallelism's replicas share one TP group (as `Engine.from_server`)."""
    plain, attention = fake_workers(2)
    plain.server_info = {"tp_size": 2, "dp_size": 4}
    attention.server_info = {"tp_size": 2, "dp_size": 4, "enable_dp_attention": True}
    with router_client([plain.url, attention.url]) as http:
        view = workers_view(http)
    assert (view[plain.url]["tp_size"], view[plain.url]["dp_size"]) == (2, 4)
    assert (view[attention.url]["tp_size"], view[attention.url]["dp_size"]) == (2, 1)
