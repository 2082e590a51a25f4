"""Data parallel (`--dp-size 2`): every DP replica's TP ranks join the update
group at `rank_offset + dp_rank * tp_size + tp_rank`, receive, verify and
apply; answers name DP and TP rank; a transfer that one replica cannot
verify is applied by none."""

from __future__ import annotations

import concurrent.futures as cf

import pytest
import requests
import torch

from harness.cpu_sglang import free_port
from harness.weights import randomized
from rlsync import client
from rlsync.group import join_update_group, leave_update_group
from rlsync.planner import plan_buckets
from rlsync.sender import Engine, SyncError, WeightSender

pytestmark = pytest.mark.needs("data_parallel_weight_update")

PROMPTS = [f"replica {i}" for i in range(6)]
pool = cf.ThreadPoolExecutor(6)


def greedy_all(url: str) -> list[list[int]]:
    """Several requests at once, so the DP controller spreads them over both
    replicas; each answer says which replica served it."""

    def one(prompt: str) -> tuple[int, list[int]]:
        resp = requests.post(
            url + "/generate",
            json={
                "text": prompt,
                "sampling_params": {"max_new_tokens": 6, "temperature": 0},
            },
            timeout=60,
        )
        resp.raise_for_status()
        body = resp.json()
        return body["meta_info"]["dp_rank"], body["output_ids"]

    answers = list(pool.map(one, PROMPTS))
    assert {dp for dp, _ in answers} == {0, 1}, "both replicas must serve"
    return [ids for _, ids in answers]


@pytest.fixture(scope="module")
def dp_server(request, tiny_model):
    from tests.conftest import _start

    server = _start(request, tiny_model, 1, False, ["--dp-size", "2"], name="dp2")
    request.addfinalizer(server.stop)
    return server


@pytest.fixture
def sender(dp_server):
    sender = WeightSender(
        [Engine(dp_server.url, tp_size=1, dp_size=2)],
        master_port=free_port(),
        group_name=f"dp_{free_port()}",
        backend="gloo",
        bucket_bytes=64 << 10,
    )
    sender.connect()
    yield sender
    sender.close()


def test_every_replica_receives_verifies_and_applies(dp_server, sender, model_weights):
    url = dp_server.url
    before = greedy_all(url)
    original = client.weights_checksum(url)
    assert [(r["dp_rank"], r["rank"]) for r in original["rank_results"]] == [
        (0, 0),
        (1, 0),
    ]
    # With a flush no request reuses prefix KV computed under other weights,
    # so equal weights give equal completions.
    result = sender.sync(
        randomized(model_weights, 61), weight_version="dp-1", flush_cache=True
    )
    assert result.success, result
    (engine,) = result.engines
    assert engine.applied and engine.weight_version == "dp-1"
    after = client.weights_checksum(url)
    dp0, dp1 = (r["checksum"] for r in after["rank_results"])
    assert dp0 == dp1 != original["rank_results"][0]["checksum"]
    assert greedy_all(url) != before
    assert client.get_weight_version(url) == "dp-1"

    sender.sync(model_weights, weight_version="dp-0", flush_cache=True)
    assert client.weights_checksum(url)["checksum"] == original["checksum"]
    assert greedy_all(url) == before


def test_group_init_answers_name_dp_and_tp_rank(dp_server):
    resp = requests.post(
        dp_server.url + "/init_weights_update_group",
        json={
            "master_address": "127.0.0.1",
            "master_port": free_port(),
            "rank_offset": 1,
            "world_size": 3,
            "group_name": "dp_nobody",
            "backend": "gloo",
            "timeout": 3,
        },
        timeout=120,
    )
    assert resp.status_code == 400
    ranks = resp.json()["rank_results"]
    assert [(r["dp_rank"], r["rank"]) for r in ranks] == [(0, 0), (1, 0)]
    assert not any(r["success"] for r in ranks)


def test_an_init_that_one_replica_refuses_leaves_no_replica_in_the_group(
    dp_server,
):
    """A trainer that counts one replica (world size 2): replica 0 joins as
    rank 1, replica 1 (rank 2) cannot. Replica 0 must leave again, or a later
    single-phase update would reach one replica only and split the weights."""
    url, port = dp_server.url, free_port()
    group = f"dp_half_{port}"
    init = pool.submit(
        requests.post,
        url + "/init_weights_update_group",
        json={
            "master_address": "127.0.0.1",
            "master_port": port,
            "rank_offset": 1,
            "world_size": 2,
            "group_name": group,
            "backend": "gloo",
            "timeout": 30,
        },
        timeout=120,
    )
    pg = join_update_group("127.0.0.1", port, 2, group_name=group, timeout=60)
    try:
        resp = init.result(timeout=120)
    finally:
        leave_update_group(pg)
    assert resp.status_code == 400, resp.text
    body = resp.json()
    joined = [(r["dp_rank"], r["success"]) for r in body["rank_results"]]
    assert joined == [(0, True), (1, False)], body
    assert "the ranks that joined left the group again" in body["message"]
    destroy = requests.post(
        url + "/destroy_weights_update_group", json={"group_name": group}, timeout=60
    )
    assert destroy.status_code == 400, "no replica may keep the group"
    assert not any(r["success"] for r in destroy.json()["rank_results"])


def test_a_corrupted_transfer_is_applied_by_no_replica(
    dp_server, sender, model_weights
):
    url = dp_server.url
    before = client.weights_checksum(url)["checksum"]
    new = randomized(model_weights, 62)
    buckets = plan_buckets(new, 64 << 10)
    from rlsync.digest import digest_tensors

    meta = [b.meta(digest_tensors(b.tensors)) for b in buckets]
    client.prepare_weights_update(
        url, meta, group_name=sender.group_name, load_format="flattened_bucket"
    )
    for i, b in enumerate(buckets):
        flat = torch.cat(
            [t.contiguous().reshape(-1).view(torch.uint8) for t in b.tensors]
        )
        if i == 1:
            flat[7] ^= 0x40  # corrupted on the wire
        torch.distributed.broadcast(flat, src=0, group=sender.group)
    with pytest.raises(client.EngineError, match="does not match the sender's"):
        client.complete_weights_update(url, group_name=sender.group_name)
    assert client.weights_checksum(url)["checksum"] == before
    assert (
        requests.post(
            url + "/abort_weights_update",
            json={"group_name": sender.group_name},
            timeout=30,
        ).status_code
        == 409
    ), "no replica may keep a session"
    result = sender.sync(new)
    assert result.success
    sender.sync(model_weights)
    assert client.weights_checksum(url)["checksum"] == before


def test_a_sender_that_counts_one_replica_fails_at_connect(dp_server):
    sender = WeightSender(
        [Engine(dp_server.url, tp_size=1)],
        master_port=free_port(),
        group_name=f"dp_short_{free_port()}",
        backend="gloo",
        timeout=10,
    )
    with pytest.raises(SyncError, match=r"brings 2 rank\(s\) .* counts 1"):
        sender.connect()
    sender.close()


def test_the_router_counts_every_dp_and_tp_rank(dp_server):
    """In front of a `--dp-size 2` worker the router sizes the fleet as two
    ranks: /server_info says so, and a group init that counts one is refused
    before any worker is asked."""
    from fastapi.testclient import TestClient

    from rlsync.services.router import RouterConfig, create_app

    config = RouterConfig([dp_server.url], health_interval=600)
    with TestClient(create_app(config)) as router:
        assert router.get("/server_info").json() == {"tp_size": 2, "dp_size": 1}
        (worker,) = router.get("/workers").json()["workers"]
        assert (worker["tp_size"], worker["dp_size"]) == (1, 2), worker
        resp = router.post(
            "/init_weights_update_group",
            json={
                "master_address": "127.0.0.1",
                "master_port": free_port(),
                "rank_offset": 1,
                "world_size": 2,
                "group_name": f"dp_router_{free_port()}",
                "backend": "gloo",
            },
        )
        assert resp.status_code == 400, resp.text
        assert resp.json()["message"].startswith("world_size: 2 but"), resp.json()
