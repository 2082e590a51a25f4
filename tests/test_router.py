"""`rlsync router` in front of real SGLang workers on the CPU: a two-phase
sync through it reaches every worker while generation keeps flowing and never
lands on a worker mid-apply; the admin lock answers 503 past its bound; a
failed group init disables a worker until re-enabled; a worker killed
mid-broadcast is marked dead and reported; keys reach the workers, and what
the router cannot read from them is logged; a hostile caller's headers and
bodies are 4xx answers naming what is wrong, never a 5xx."""

from __future__ import annotations

import functools
import http.server
import logging
import threading
import time

import pytest
import requests
from conftest import KEYED_ADMIN_KEY, KEYED_API_KEY
from fastapi.testclient import TestClient

from harness.cpu_sglang import free_port
from harness.router import RouterProc
from harness.weights import greedy, randomized
from rlsync import client
from rlsync.sender import Engine, SyncError, WeightSender
from rlsync.services.router import (
    GENERATION_ROUTES,
    LOCKED_ROUTES,
    OTHER_ADMIN_ROUTES,
    RouterConfig,
    create_app,
)


@pytest.fixture
def router_factory():
    started = []

    def start(workers, *args):
        r = RouterProc(workers, "--health-interval", "0.5", *args)
        started.append(r)
        return r

    yield start
    for r in started:
        r.stop()


def generate(url: str) -> requests.Response:
    return requests.post(
        url + "/generate",
        json={
            "text": "route me",
            "sampling_params": {"max_new_tokens": 8, "temperature": 0},
        },
        timeout=120,
    )


def test_sync_through_router_reaches_both_and_generation_avoids_the_apply(
    server_tp1, server_tp1_replica, router_factory, model_weights
):
    a, b = server_tp1.url, server_tp1_replica.url
    router = router_factory([a, b])
    before = greedy(a, "Fleet")
    checksum_before = client.weights_checksum(a)["checksum"]
    sender = WeightSender(
        [Engine(router.url, tp_size=2)],
        master_port=free_port(),
        group_name=f"router_{free_port()}",
        backend="gloo",
        bucket_bytes=64 << 10,
    )
    sender.connect()
    stop, outcomes = threading.Event(), []

    def load():
        while not stop.is_set():
            resp = generate(router.url)
            outcomes.append(resp.status_code)

    threads = [threading.Thread(target=load) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: len(outcomes) >= 4, 120, "generation through the router")
        result = sender.sync(randomized(model_weights, 51), weight_version="routed-1")
        assert result.success, result.engines
        n_during = len(outcomes)
        wait_for(lambda: len(outcomes) > n_during, 120, "generation after the sync")
    finally:
        stop.set()
        for t in threads:
            t.join(120)
    assert outcomes and all(code == 200 for code in outcomes), outcomes
    sums = [client.weights_checksum(u)["checksum"] for u in (a, b)]
    assert (
        sums[0] == sums[1] != checksum_before
    ), "both workers got the same new weights"
    assert client.get_weight_version(a) == client.get_weight_version(b) == "routed-1"
    assert (
        requests.get(router.url + "/model_info", timeout=10).json()["weight_version"]
        == "routed-1"
    )
    # No request was routed to a worker while its complete (the apply) ran.
    events = router.events()
    for url in (a, b):
        mine = [e for e in events if e["worker"] == url]
        windows, start = [], None
        for e in mine:
            if e["kind"] == "admin_start" and e["detail"] == "/complete_weights_update":
                start = e["t"]
            elif e["kind"] == "admin_end" and e["detail"] == "/complete_weights_update":
                windows.append((start, e["t"]))
        assert windows, f"no complete seen for {url}"
        routed = [e["t"] for e in mine if e["kind"] == "route"]
        assert routed, f"nothing routed to {url}"
        assert not [t for t in routed for s, e in windows if s <= t <= e], url
    sender.sync(model_weights, weight_version="restored")
    sender.close()
    assert greedy(a, "Fleet") == before
    assert client.weights_checksum(a)["checksum"] == checksum_before


def test_admin_lock_bound_then_failed_init_disables_until_enabled(
    server_tp1, router_factory
):
    # No health checks here: torch may retry the rendezvous once past its
    # timeout, and the worker's health then reports the init past its deadline.
    router = router_factory(
        [server_tp1.url],
        "--admin-wait",
        "1",
        "--route-wait",
        "1",
        "--health-interval",
        "600",
    )
    holder = []
    slow = threading.Thread(
        target=lambda: holder.append(
            requests.post(
                router.url + "/init_weights_update_group",
                json={
                    "master_address": "127.0.0.1",
                    "master_port": free_port(),
                    "rank_offset": 1,
                    "world_size": 2,
                    "group_name": "nobody_joins",
                    "backend": "gloo",
                    "timeout": 6,
                },
                timeout=60,
            )
        )
    )
    slow.start()
    wait_for(
        lambda: requests.get(router.url + "/workers", timeout=10).json()["admin_lock"]
        == "/init_weights_update_group",
        30,
        "the init to take the admin lock",
    )
    t0 = time.monotonic()
    second = requests.post(
        router.url + "/pause_generation", json={"mode": "abort"}, timeout=30
    )
    waited = time.monotonic() - t0
    assert second.status_code == 503, second.text
    assert "admin lock held by /init_weights_update_group" in second.json()["message"]
    assert "waited 1s" in second.json()["message"]
    assert waited >= 0.9, f"answered after {waited:.2f}s, before its 1 s bound"
    slow.join(60)
    assert holder[0].status_code >= 400 and not holder[0].json()["success"]
    worker = router.workers()[server_tp1.url]
    assert worker["disabled"] and not worker["routable"]
    assert worker["reason"].startswith("init_weights_update_group failed")
    refused = generate(router.url)
    assert (
        refused.status_code == 503
        and "disabled (init_weights_update_group" in refused.text
    )
    assert generate(server_tp1.url).status_code == 200, "the worker itself is fine"
    enabled = requests.post(
        router.url + "/workers/enable", json={"url": server_tp1.url}, timeout=10
    )
    assert enabled.status_code == 200 and enabled.json()["worker"]["routable"]
    assert generate(router.url).status_code == 200
    bad = requests.post(
        router.url + "/workers/enable", json={"url": "http://x"}, timeout=10
    )
    assert bad.status_code == 400 and bad.json()["message"].startswith("url: no worker")


@pytest.mark.release_independent
def test_worker_killed_mid_broadcast_is_marked_dead_and_reported(
    server_tp1, start_server, router_factory, model_weights
):
    doomed = start_server(tp=1)
    a = server_tp1.url
    router = router_factory([a, doomed.url])
    before = greedy(a, "Fleet")
    sender = WeightSender(
        [Engine(router.url, tp_size=2)],
        master_port=free_port(),
        timeout=30,
        group_name=f"router_kill_{free_port()}",
        backend="gloo",
        bucket_bytes=64 << 10,
    )
    sender.connect()

    def kill_after_first(sent, total, nbytes):
        if sent == 1:
            doomed.stop()

    try:
        with pytest.raises(SyncError) as err:
            sender.sync(randomized(model_weights, 61), progress=kill_after_first)
        assert err.value.step == "broadcast"
        state = wait_for(
            lambda: (s := router.workers()) and s[doomed.url]["dead"] and s,
            10,
            "the router to mark the killed worker dead",
        )
        assert not state[doomed.url]["routable"] and not state[a]["dead"]
        # The next broadcast goes to the live worker and reports the dead one.
        resp = requests.post(
            router.url + "/weights_checker", json={"action": "checksum"}, timeout=60
        )
        body = resp.json()
        assert resp.status_code == 200 and body["success"], body
        assert body["dead"] == [doomed.url] and [w["url"] for w in body["workers"]] == [
            a
        ]
        assert f"not sent to dead workers: {doomed.url}" in body["message"]
        assert greedy(a, "Fleet") == before, "the live worker keeps the old weights"
        assert generate(router.url).status_code == 200, "routing goes on without it"
    finally:
        sender.close()


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.release_independent
def test_restarted_worker_waits_for_the_fleet_version(
    server_tp1, start_server, router_factory, tiny_model
):
    from harness.cpu_sglang import BUILD, launch

    a, b = server_tp1, start_server(tp=1)
    router = router_factory([a.url, b.url])
    synced = requests.post(
        router.url + "/update_weights_from_disk",
        json={"model_path": str(tiny_model), "weight_version": "fleet-2"},
        timeout=120,
    )
    assert synced.status_code == 200, synced.text
    assert (
        requests.get(router.url + "/model_info", timeout=10).json()["weight_version"]
        == "fleet-2"
    )
    b.stop()
    wait_for(lambda: router.workers()[b.url]["dead"], 15, "the router to mark b dead")
    restarted = launch(tiny_model, BUILD / "logs" / "router-restarted.log", port=b.port)
    try:
        state = wait_for(
            lambda: (w := router.workers()[b.url])
            and not w["dead"]
            and w["weight_version"] is not None
            and w,
            30,
            "b back, its version read",
        )
        assert state["rejoining"] and not state["routable"], state
        assert "rejoining (weight_version=default)" in state["state"]
        since = time.monotonic()
        for _ in range(4):
            assert generate(router.url).status_code == 200
        # CLOCK_MONOTONIC is one clock for every process on the machine.
        routed = [
            e["worker"]
            for e in router.events()
            if e["kind"] == "route" and e["t"] > since
        ]
        assert len(routed) == 4 and set(routed) == {a.url}, routed
        # Once it serves the fleet's version it is back in routing.
        requests.post(
            b.url + "/update_weights_from_disk",
            json={"model_path": str(tiny_model), "weight_version": "fleet-2"},
            timeout=120,
        ).raise_for_status()
        wait_for(lambda: router.workers()[b.url]["routable"], 15, "b routable again")
    finally:
        restarted.stop()


def test_router_admin_key_and_forwarded_authorization(keyed_server, router_factory):
    """The worker is the shared keyed server (an admin key and --api-key)."""
    key, api_key, worker = KEYED_ADMIN_KEY, KEYED_API_KEY, keyed_server
    router = router_factory(
        [worker.url], "--admin-api-key", key, "--worker-api-key", api_key
    )
    checksum = {"action": "checksum"}
    assert (
        requests.post(
            router.url + "/weights_checker", json=checksum, timeout=30
        ).status_code
        == 401
    )
    wrong = {"Authorization": "Bearer nope"}
    assert (
        requests.post(
            router.url + "/weights_checker", json=checksum, headers=wrong, timeout=30
        ).status_code
        == 401
    )
    assert requests.get(router.url + "/workers", timeout=30).status_code == 401
    # Bytes no key can hold: a 401 through uvicorn, not a 500 and a traceback.
    for raw in (b"Bearer \xff\xfe", "Bearer clé".encode()):
        for method, path in (("POST", "/weights_checker"), ("GET", "/workers")):
            resp = requests.request(
                method,
                router.url + path,
                json=checksum,
                timeout=30,
                headers={"Authorization": raw},
            )
            assert resp.status_code == 401, (raw, path, resp.text)
        resp = requests.post(
            router.url + "/generate",
            json={"text": "x"},
            timeout=30,
            headers={"Authorization": raw},
        )
        assert resp.status_code == 401, (raw, resp.text)
    right = {"Authorization": f"Bearer {key}"}
    resp = requests.post(
        router.url + "/weights_checker", json=checksum, headers=right, timeout=60
    )
    assert resp.status_code == 200, resp.text  # the worker saw the forwarded key
    answer = resp.json()  # the series' own checksum, or upstream's (0.5.12 on)
    assert answer.get("checksum", "").startswith("sha256:") or answer.get(
        "per_engine_checksum"
    ), answer
    for body in (b"{", b"[1]", b"\xff", b"NaN"):
        resp = requests.post(
            router.url + "/workers/enable", data=body, headers=right, timeout=30
        )
        assert resp.status_code == 400, (body, resp.text)
        assert resp.json()["message"].startswith("body: "), resp.json()
    # The router read the worker's TP size and weight version with its key.
    described = requests.get(router.url + "/workers", headers=right, timeout=10)
    (w,) = described.json()["workers"]
    version = client.get_weight_version(worker.url, api_key=api_key)
    assert w["tp_size"] == 1 and w["weight_version"] == version, w
    events = requests.get(router.url + "/events", headers=right, timeout=10).json()
    assert not [e for e in events if e["kind"] == "unreadable"], events
    # The caller's API key goes with generation requests.
    assert generate(router.url).status_code == 401, "the worker wants its API key"
    resp = requests.post(
        router.url + "/generate",
        json={"text": "x", "sampling_params": {"max_new_tokens": 2}},
        headers={"Authorization": f"Bearer {api_key}"},
        timeout=120,
    )
    assert resp.status_code == 200, resp.text


@pytest.mark.release_independent
def test_router_without_the_workers_key_says_what_it_could_not_read(
    keyed_server, router_factory
):
    """A worker under --api-key (the shared keyed server) answers the
    router's reads with 401s: the router says so, naming the worker and each
    field, in its log and events, instead of silently using None."""
    worker = keyed_server
    router = router_factory([worker.url], "--health-interval", "600")
    events = router.events()
    unread = {e["detail"].split(":")[0]: e for e in events if e["kind"] == "unreadable"}
    assert set(unread) == {"tp_size", "weight_version"}, events
    for field, e in unread.items():
        assert e["worker"] == worker.url and "HTTP 401" in e["detail"], e
    log = router.log()
    for field, path in (("tp_size", "/server_info"), ("weight_version", "/model_info")):
        assert (
            f"worker {worker.url}: could not read {field} from {path}: HTTP 401" in log
        )
    # Its /rlsync_info says which worker failed instead of "not patched".
    resp = requests.get(router.url + "/rlsync_info", timeout=30)
    assert resp.status_code in (200, 502), resp.text
    if resp.status_code == 502:
        assert worker.url in resp.json()["error"] and "HTTP 401" in resp.json()["error"]


# --- malformed input, in process (the router's code, no subprocess) ------------

ADMIN_KEY = "r0uter-adm1n-key"
RIGHT = {"Authorization": f"Bearer {ADMIN_KEY}"}
ROUTER_GETS = ["/workers", "/events", "/metrics", "/rlsync_info", "/model_info"]
ROUTER_POSTS = list(LOCKED_ROUTES + OTHER_ADMIN_ROUTES + GENERATION_ROUTES) + [
    "/workers/enable",
    "/workers/disable",
]
MALFORMED_AUTH = {
    "latin-1 bytes": [("authorization", b"Bearer \xff\xfe")],
    "utf-8 non-ascii": [("authorization", "Bearer clé-😀".encode())],
    "control byte": [("authorization", b"Bearer r0uter-adm1n-key\x01")],
    "two headers": [
        ("authorization", b"Bearer x"),
        ("authorization", RIGHT["Authorization"].encode()),
    ],
}


@pytest.fixture
def in_process(server_tp1):
    """The router app with an admin key in front of the shared worker."""
    config = RouterConfig(
        [server_tp1.url], admin_api_key=ADMIN_KEY, health_interval=600
    )
    with TestClient(create_app(config)) as http:
        yield http


@pytest.mark.release_independent
@pytest.mark.parametrize("variant", sorted(MALFORMED_AUTH))
def test_malformed_authorization_is_a_401_on_every_route(in_process, variant):
    headers = MALFORMED_AUTH[variant]
    for path in ROUTER_POSTS:
        resp = in_process.post(path, json={}, headers=headers)
        assert resp.status_code == 401, (path, resp.status_code, resp.text)
    for path in ROUTER_GETS:
        resp = in_process.get(path, headers=headers)
        assert resp.status_code == 401, (path, resp.status_code, resp.text)


@pytest.mark.release_independent
def test_malformed_authorization_without_a_router_key_is_a_401(server_tp1):
    """No router key: the header is forwarded to the workers, so one no key
    can match stops at the router instead of failing inside a worker."""
    config = RouterConfig([server_tp1.url], health_interval=600)
    with TestClient(create_app(config)) as http:
        for variant, headers in MALFORMED_AUTH.items():
            resp = http.post("/flush_cache", json={}, headers=headers)
            assert resp.status_code == 401, (variant, resp.text)
            resp = http.post("/generate", json={"text": "x"}, headers=headers)
            assert resp.status_code == 401, (variant, resp.text)


@pytest.mark.release_independent
@pytest.mark.parametrize(
    "path,body,field",
    [
        ("/workers/enable", b"{", "body: not JSON"),
        ("/workers/enable", b"\xff\xfe", "body: not JSON"),
        ("/workers/enable", b"[1, 2]", "body: expected a JSON object"),
        ("/workers/enable", b"null", "body: expected a JSON object"),
        ("/workers/enable", b'"url"', "body: expected a JSON object"),
        ("/workers/enable", b'{"url": NaN}', "body: not JSON"),
        ("/workers/enable", b"{}", "url: expected a worker URL"),
        ("/workers/enable", b'{"url": 5}', "url: expected a worker URL"),
        ("/workers/enable", b'{"url": ["http://x"]}', "url: expected a worker URL"),
        ("/workers/enable", b'{"url": "http://nope:1"}', "url: no worker"),
        ("/workers/disable", b'{"url": {"a": 1}}', "url: expected a worker URL"),
        (
            "/workers/disable",
            b'{"url": "WORKER", "reason": 7}',
            "reason: expected a string",
        ),
        ("/init_weights_update_group", b"{", "body: not JSON"),
        (
            "/init_weights_update_group",
            b'{"master_address": "h", "master_port": 1, "rank_offset": "1", "world_size": 2}',
            "rank_offset: expected an integer",
        ),
        (
            "/init_weights_update_group",
            b'{"master_address": "h", "master_port": 1, "rank_offset": true, "world_size": 2}',
            "rank_offset: expected an integer",
        ),
        (
            "/init_weights_update_group",
            b'{"master_address": "h", "master_port": 1, "rank_offset": 0, "world_size": 2}',
            "rank_offset: expected an integer",
        ),
        (
            "/init_weights_update_group",
            b'{"master_address": "h", "master_port": 1, "rank_offset": 1, "world_size": 2.5}',
            "world_size: expected an integer",
        ),
        (
            "/init_weights_update_group",
            b'{"master_address": "h", "master_port": 1, "rank_offset": 1, "world_size": null}',
            "world_size: expected an integer",
        ),
        (
            "/init_weights_update_group",
            b'{"master_address": "h", "master_port": 1, "rank_offset": 1, "world_size": 9}',
            "world_size: 9 but",
        ),
        ("/prepare_weights_update", b"[]", "body: expected a JSON object"),
        ("/complete_weights_update", b"Infinity", "body: not JSON"),
        ("/pause_generation", b"\x00", "body: not JSON"),
        ("/weights_checker", b"1", "body: expected a JSON object"),
        ("/init_weights_update_group", b"{}", "master_address: expected"),
        (
            "/init_weights_update_group",
            b'{"master_address": "h", "master_port": 70000}',
            "master_port: expected",
        ),
        (
            "/init_weights_update_group",
            b'{"master_address": "h", "master_port": 1, "timeout": "5"}',
            "timeout: expected",
        ),
        (
            "/init_weights_update_group",
            b'{"master_address": "h", "master_port": 1, "timeout": 1e300,'
            b' "group_name": 5}',
            "group_name: expected a string",
        ),
        ("/update_weights_from_disk", b"[" * 5000 + b"]" * 5000, "body: nested"),
        ("/weights_checker", b'{"a": ' * 3000 + b"1" + b"}" * 3000, "body: nested"),
        (
            "/workers/disable",
            b'{"url": "WORKER", "reason": "\\ud800"}',
            "reason: holds a lone UTF-16 surrogate",
        ),
        (
            "/complete_weights_update",
            b'{"group_name": "g", "weight_version": "v\\udfff"}',
            "weight_version: holds a lone UTF-16 surrogate",
        ),
    ],
)
def test_bad_body_is_a_400_naming_the_field(in_process, server_tp1, path, body, field):
    body = body.replace(b"WORKER", server_tp1.url.encode())
    resp = in_process.post(path, content=body, headers=RIGHT)
    assert resp.status_code == 400, (resp.status_code, resp.text)
    assert resp.json()["message"].startswith(field), resp.json()
    state = in_process.get("/workers", headers=RIGHT).json()
    assert state["admin_lock"] is None
    assert not state["workers"][0]["disabled"], "a refused call changed nothing"


@pytest.mark.release_independent
def test_bodies_past_the_bound_are_413_before_they_are_read(server_tp1):
    config = RouterConfig(
        [server_tp1.url],
        admin_api_key=ADMIN_KEY,
        health_interval=600,
        max_request_bytes=1 << 20,
    )
    with TestClient(create_app(config)) as http_client:
        big = b'{"group_name": "' + b"x" * (2 << 20) + b'"}'
        resp = http_client.post("/prepare_weights_update", content=big, headers=RIGHT)
        assert resp.status_code == 413, resp.text
        assert resp.json()["message"].startswith("body: larger than 1 MiB")
        control = b'{"url": "' + b"x" * (128 << 10) + b'"}'
        resp = http_client.post("/workers/disable", content=control, headers=RIGHT)
        assert resp.status_code == 413, resp.text
        assert resp.json()["message"] == "body: larger than 64 KiB"
        state = http_client.get("/workers", headers=RIGHT).json()
        assert state["admin_lock"] is None and not state["workers"][0]["disabled"]


@pytest.mark.release_independent
@pytest.mark.parametrize("since", ["abc", "nan", "inf", "-inf", "1e999", ""])
def test_events_since_must_be_a_number(in_process, since):
    resp = in_process.get("/events", params={"since": since}, headers=RIGHT)
    assert resp.status_code == 400, resp.text
    assert resp.json()["message"].startswith("since: "), resp.json()


@pytest.fixture
def foreign_service():
    """An HTTP service that is not SGLang (a worker URL that points elsewhere):
    every path is a 404 page in HTML."""
    handler = functools.partial(
        http.server.SimpleHTTPRequestHandler, directory="/nonexistent"
    )
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    thread.join(10)


@pytest.mark.release_independent
def test_worker_that_is_not_sglang_is_named_not_marked_dead(foreign_service, caplog):
    caplog.set_level(logging.WARNING, logger="rlsync.services.router")
    config = RouterConfig([foreign_service], health_interval=600)
    with TestClient(create_app(config)) as http_client:
        (state,) = http_client.get("/workers").json()["workers"]
        assert not state["dead"], state
        for field, path in (
            ("tp_size", "/server_info"),
            ("weight_version", "/model_info"),
        ):
            line = f"worker {foreign_service}: could not read {field} from {path}: HTTP 404"
            assert line in caplog.text, caplog.text
        resp = http_client.get("/rlsync_info")
        assert resp.status_code == 404, resp.text
        assert resp.json()["error"] == f"{foreign_service} is not patched with rlsync"


def test_router_refuses_a_malformed_key():
    for key in ("clé", "two words", "tab\tkey"):
        with pytest.raises(ValueError, match="admin_api_key: a key must be") as err:
            create_app(RouterConfig(["http://127.0.0.1:1"], admin_api_key=key))
        assert key not in str(err.value)


@pytest.mark.release_independent
def test_sigterm_answers_waiting_generations_503_and_exits_promptly(router_factory):
    """A generation waits for a routable worker (the only one is down); on
    SIGTERM it gets a 503 saying the router is shutting down, and the router
    exits within its shutdown grace instead of holding it up to --route-wait
    (60 s by default)."""
    router = router_factory([f"http://127.0.0.1:{free_port()}"])
    answers: list[requests.Response] = []
    waiting = threading.Thread(target=lambda: answers.append(generate(router.url)))
    waiting.start()
    wait_for(
        lambda: requests.get(router.url + "/workers", timeout=10).json()[
            "waiting_generations"
        ],
        30,
        "the generation to wait for a worker",
    )
    t0 = time.monotonic()
    router.proc.terminate()
    router.proc.wait(30)
    exited_after = time.monotonic() - t0
    waiting.join(30)
    assert answers and answers[0].status_code == 503, answers
    assert "shutting down" in answers[0].text, answers[0].text
    # Well under the 60 s a waiting generation held it before.
    assert exited_after < 15, f"exited {exited_after:.1f}s after SIGTERM"
