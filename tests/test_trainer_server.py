"""The trainer's control API (`rlsync.services.trainer_server`) against two real
servers (TP 1 + TP 2): register the engines, sync, sync back; bad input is a
4xx naming the field. Its security (keys, hosts, sizes, secrets) is in
test_trainer_security.py."""

from __future__ import annotations

import logging
from urllib.parse import urlparse

import pytest
from fastapi.testclient import TestClient

from harness.cpu_sglang import free_port
from harness.weights import greedy, randomized
from rlsync import client
from rlsync.services.trainer_server import create_trainer_app

# The trainer-side code is the subject; the first pin's run covers it.
pytestmark = pytest.mark.release_independent

API_KEY = "trainer-api-key-0123456789"
ADMIN_KEY = "engine-admin-key-9876543210"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
PROMPT = "Trainer"


def make_app(weights=lambda: [], **kw):
    kw.setdefault("api_key", API_KEY)
    return create_trainer_app(
        weights, backend="gloo", group_name=f"trainer_{free_port()}", **kw
    )


@pytest.fixture
def api():
    """The API with no engine behind it, and a client that sends the key."""
    with TestClient(make_app(admin_key=ADMIN_KEY), headers=AUTH) as http:
        yield http


@pytest.fixture
def trainer(model_weights):
    current = {"weights": model_weights}
    app = make_app(lambda: current["weights"], admin_key=ADMIN_KEY)
    with TestClient(app, headers=AUTH) as http:
        yield http, current


def register(http, url: str, world_size: int):
    u = urlparse(url)
    return http.post(
        "/add_inference_endpoint",
        json={"host": u.hostname, "port": u.port, "world_size": world_size},
    )


def assert_no_secret(resp) -> None:
    for secret in (API_KEY, ADMIN_KEY):
        assert secret not in resp.text, f"{resp.request.url.path} answers a key"


def test_register_then_sync_into_every_engine_and_back(
    trainer, server_tp1, server_tp2, model_weights, caplog
):
    caplog.set_level(logging.DEBUG)
    http, current = trainer
    urls = [server_tp1.url, server_tp2.url]
    before = [greedy(u, PROMPT) for u in urls]
    answers = [register(http, urls[0], 1), register(http, urls[1], 2)]
    assert [a.status_code for a in answers] == [200, 200]
    assert [e["tp_size"] for e in answers[1].json()["endpoints"]] == [1, 2]
    port = free_port()
    current["weights"] = randomized(model_weights, 71)
    resp = http.post(
        "/sync_inference_weights",
        json={"master_port": port, "buffer_size_mb": 1, "weight_version": "trainer-1"},
    )
    answers.append(resp)
    body = resp.json()
    assert resp.status_code == 200 and body["success"], body
    assert body["http_calls"] == 4 and body["buckets"] >= 1
    assert [e["applied"] for e in body["engines"]] == [True, True]
    sent = dict(current["weights"])["model.norm.weight"].float()[:8].tolist()
    for url, old in zip(urls, before):
        assert greedy(url, PROMPT) != old
        got = client.get_weights_by_name(url, "model.norm.weight", truncate_size=8)
        assert got == sent, url
    assert all(client.get_weight_version(u) == "trainer-1" for u in urls)
    current["weights"] = model_weights
    resp = http.post(
        "/sync_inference_weights",
        json={"master_port": port, "buffer_size_mb": 1, "atomic": True},
    )
    answers += [resp, http.get("/inference_endpoints")]
    assert resp.status_code == 200 and resp.json()["http_calls"] == 6, resp.json()
    assert [greedy(u, PROMPT) for u in urls] == before
    for a in answers:
        assert_no_secret(a)
    assert ADMIN_KEY not in caplog.text and API_KEY not in caplog.text


@pytest.mark.parametrize(
    "path,body,message",
    [
        (
            "/add_inference_endpoint",
            {"host": "h", "port": 70000, "world_size": 1},
            "port: out of range",
        ),
        (
            "/add_inference_endpoint",
            {"host": "h", "port": True, "world_size": 1},
            "port: expected an integer",
        ),
        (
            "/add_inference_endpoint",
            {"host": "h", "port": 1, "world_size": "4"},
            "world_size: expected an integer",
        ),
        ("/add_inference_endpoint", {"port": 1, "world_size": 1}, "host: required"),
        ("/add_inference_endpoint", [1, 2], "body: expected a JSON object"),
        ("/sync_inference_weights", {"master_port": 29600}, "buffer_size_mb: required"),
        (
            "/sync_inference_weights",
            {"master_port": 29600, "buffer_size_mb": 0},
            "buffer_size_mb: out of range",
        ),
        (
            "/sync_inference_weights",
            {"master_port": 29600, "buffer_size_mb": 1 << 40},
            "buffer_size_mb: out of range",
        ),
        (
            "/sync_inference_weights",
            {"master_port": 29600, "buffer_size_mb": 8, "atomic": "yes"},
            "atomic: expected bool",
        ),
        (
            "/sync_inference_weights",
            {"master_port": 29600, "buffer_size_mb": 8},
            "no inference endpoint",
        ),
        (
            "/remove_inference_endpoint",
            {"host": "h", "port": 1},
            "host/port: no endpoint http://h:1",
        ),
        (
            "/remove_inference_endpoint",
            {"host": "h/x", "port": 1},
            "host: expected a hostname",
        ),
    ],
)
def test_bad_input_names_the_field(api, path, body, message):
    resp = api.post(path, json=body)
    assert resp.status_code in (400, 404), resp.text
    assert message in resp.json()["message"], resp.json()


@pytest.mark.parametrize("raw", [b"", b"{", b"\xff\xfe\x00", b"null"])
def test_body_that_is_not_a_json_object_is_a_400(api, raw):
    for path in ("/add_inference_endpoint", "/sync_inference_weights"):
        resp = api.post(path, content=raw, headers={"content-type": "application/json"})
        assert resp.status_code == 400, (path, raw, resp.text)
        assert resp.json()["message"].startswith("body: "), resp.json()
