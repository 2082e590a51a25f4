"""`/weights_checker` action "checksum" on real servers (the series' own on
0.5.10, upstream's on 0.5.23, one answer through the client): equal replicas
agree, an update changes it, syncing both makes them agree again."""

from __future__ import annotations

import pytest
import requests

from harness.cpu_sglang import free_port
from harness.trainer import GlooTrainer, update_two_phase
from harness.weights import randomized
from rlsync import client


def test_replicas_agree_differ_after_one_update_agree_after_both(
    server_tp1, server_tp1_replica, model_weights
):
    a, b = server_tp1.url, server_tp1_replica.url
    first = client.weights_checksum(a)
    assert first["checksum"] == client.weights_checksum(a)["checksum"], "stable"
    assert first["checksum"].startswith("sha256:") and len(first["checksum"]) == 71
    assert first["num_tensors"] > 0
    if first["source"] == "rlsync":  # the series' strict checksum counts bytes
        assert first["num_bytes"] > 0
    assert client.weights_checksum(b)["checksum"] == first["checksum"]

    new = randomized(model_weights, 77)
    to_a = GlooTrainer([a], [1], group_name=f"checksum_a_{free_port()}")
    to_b = GlooTrainer([b], [1], group_name=f"checksum_b_{free_port()}")
    try:
        update_two_phase(to_a, new)
        assert client.weights_checksum(a)["checksum"] != first["checksum"]
        assert client.weights_checksum(b)["checksum"] == first["checksum"]
        update_two_phase(to_b, new)
        assert checksum(a) == checksum(b) != first["checksum"]
        update_two_phase(to_a, model_weights)
        update_two_phase(to_b, model_weights)
        assert checksum(a) == checksum(b) == first["checksum"]
    finally:
        to_a.close()
        to_b.close()


def checksum(url: str) -> str:
    return client.weights_checksum(url)["checksum"]


def test_tp2_answers_every_rank(server_tp2):
    body = client.weights_checksum(server_tp2.url)
    ranks = body["rank_results"]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert all(r["success"] and r["checksum"].startswith("sha256:") for r in ranks)
    assert ranks[0]["checksum"] != ranks[1]["checksum"], "each rank hashes its shard"
    assert body["num_tensors"] == sum(r["num_tensors"] for r in ranks)
    if body["source"] == "rlsync":
        assert body["num_bytes"] == sum(r["num_bytes"] for r in ranks)


@pytest.mark.needs("rank_results", "weights_checksum")  # the series' checker
def test_other_actions_answer_per_rank(server_tp2):
    resp = requests.post(
        server_tp2.url + "/weights_checker", json={"action": "snapshot"}, timeout=60
    )
    assert resp.status_code == 200, resp.text
    assert [r["rank"] for r in resp.json()["rank_results"]] == [0, 1]


@pytest.mark.needs("weights_checksum")
def test_unknown_action_is_400_listing_valid_ones(server_tp1):
    resp = requests.post(
        server_tp1.url + "/weights_checker", json={"action": "chksum"}, timeout=60
    )
    assert resp.status_code == 400
    message = resp.json()["message"]
    assert "action: unknown action 'chksum'" in message
    for action in ("snapshot", "reset_tensors", "compare", "checksum"):
        assert action in message
