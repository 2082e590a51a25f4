"""`rlsync router` in front of real SGLang workers on the CPU: a two-phase
sync through it reaches every worker while generation keeps flowing and never
lands on a worker mid-apply; the admin lock answers 503 past its bound; a
failed group init disables a worker until re-enabled; a worker killed
mid-broadcast is marked dead and reported."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests

from harness.cpu_sglang import free_port
from harness.weights import greedy, randomized
from rlsync import client
from rlsync.sender import Engine, SyncError, WeightSender

ROOT = Path(__file__).resolve().parents[1]


class RouterProc:
    def __init__(self, workers: list[str], *args: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "rlsync.cli",
                "router",
                *workers,
                "--port",
                str(self.port),
                "--health-interval",
                "0.5",
                *args,
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                requests.get(self.url + "/workers", timeout=2)
                return
            except requests.RequestException:
                time.sleep(0.1)
        self.stop()
        raise TimeoutError("router did not start")

    def workers(self) -> dict:
        return {
            w["url"]: w
            for w in requests.get(self.url + "/workers", timeout=10).json()["workers"]
        }

    def events(self) -> list[dict]:
        return requests.get(self.url + "/events", timeout=10).json()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@pytest.fixture
def router_factory():
    started = []

    def start(workers, *args):
        r = RouterProc(workers, *args)
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
    server_tp1, start_server, router_factory, model_weights
):
    a, b = server_tp1.url, start_server(tp=1).url
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
        while len(outcomes) < 4:
            time.sleep(0.05)
        result = sender.sync(randomized(model_weights, 51), weight_version="routed-1")
        assert result.success, result.engines
        n_during = len(outcomes)
        time.sleep(0.5)
        assert len(outcomes) > n_during, "generation flows after the sync"
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
    time.sleep(0.3)  # let it take the lock
    t0 = time.monotonic()
    second = requests.post(
        router.url + "/pause_generation", json={"mode": "abort"}, timeout=30
    )
    waited = time.monotonic() - t0
    assert second.status_code == 503, second.text
    assert "admin lock held by /init_weights_update_group" in second.json()["message"]
    assert 0.9 <= waited < 4, waited
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
            lambda: (w := router.workers()[b.url]) and not w["dead"] and w, 30, "b back"
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


def test_router_admin_key_and_forwarded_authorization(start_server, router_factory):
    key = "r0uter-adm1n"
    worker = start_server(env={"SGLANG_ADMIN_API_KEY": key})
    router = router_factory([worker.url], "--admin-api-key", key)
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
    right = {"Authorization": f"Bearer {key}"}
    resp = requests.post(
        router.url + "/weights_checker", json=checksum, headers=right, timeout=60
    )
    assert resp.status_code == 200, resp.text  # the worker saw the forwarded key
    assert resp.json()["checksum"].startswith("sha256:")
    assert generate(router.url).status_code == 200, "generation needs no admin key"
