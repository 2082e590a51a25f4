"""Seed 000's trainer API (`rlsync.trainer_server`) against two real servers
(TP 1 + TP 2): register the engines, sync, sync back; bad input names the
field."""

from __future__ import annotations

from urllib.parse import urlparse

import pytest
from fastapi.testclient import TestClient

from harness.cpu_sglang import free_port
from harness.weights import greedy, randomized
from rlsync import client
from rlsync.trainer_server import create_trainer_app


@pytest.fixture
def trainer(model_weights):
    current = {"weights": model_weights}
    app = create_trainer_app(
        lambda: current["weights"], backend="gloo", group_name=f"tomni_{free_port()}"
    )
    with TestClient(app) as http:
        yield http, current


def register(http, url: str, world_size: int):
    u = urlparse(url)
    return http.post(
        "/add_inference_endpoint",
        json={"host": u.hostname, "port": u.port, "world_size": world_size},
    )


def test_register_then_sync_into_every_engine_and_back(
    trainer, server_tp1, server_tp2, model_weights
):
    http, current = trainer
    urls = [server_tp1.url, server_tp2.url]
    before = [greedy(u, "Tomni") for u in urls]
    assert register(http, urls[0], 1).status_code == 200
    resp = register(http, urls[1], 2)
    assert [e["tp_size"] for e in resp.json()["endpoints"]] == [1, 2]
    port = free_port()
    current["weights"] = randomized(model_weights, 71)
    resp = http.post(
        "/sync_inference_weights",
        json={"master_port": port, "buffer_size_mb": 1, "weight_version": "tomni-1"},
    )
    body = resp.json()
    assert resp.status_code == 200 and body["success"], body
    assert body["http_calls"] == 4 and body["buckets"] >= 1
    assert [e["applied"] for e in body["engines"]] == [True, True]
    sent = dict(current["weights"])["model.norm.weight"].float()[:8].tolist()
    for url, old in zip(urls, before):
        assert greedy(url, "Tomni") != old
        got = client.get_weights_by_name(url, "model.norm.weight", truncate_size=8)
        assert got == sent, url
    assert all(client.get_weight_version(u) == "tomni-1" for u in urls)
    current["weights"] = model_weights
    resp = http.post(
        "/sync_inference_weights",
        json={"master_port": port, "buffer_size_mb": 1, "atomic": True},
    )
    assert resp.status_code == 200 and resp.json()["http_calls"] == 6, resp.json()
    assert [greedy(u, "Tomni") for u in urls] == before


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
            {"host": "h", "port": 1, "world_size": "4"},
            "world_size: expected an integer",
        ),
        ("/add_inference_endpoint", {"port": 1, "world_size": 1}, "host: required"),
        ("/sync_inference_weights", {"master_port": 29600}, "buffer_size_mb: required"),
        (
            "/sync_inference_weights",
            {"master_port": 29600, "buffer_size_mb": 0},
            "buffer_size_mb: out of range",
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
    ],
)
def test_bad_input_names_the_field(trainer, path, body, message):
    http, _ = trainer
    resp = http.post(path, json=body)
    assert (
        resp.status_code in (400, 404) and message in resp.json()["message"]
    ), resp.json()
