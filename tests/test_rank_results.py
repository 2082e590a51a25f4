"""Admin weight operations at TP 2 answer every rank's result (the
`rank_results` feature)."""

from __future__ import annotations

import concurrent.futures as cf

import pytest
import requests
import torch
import torch.distributed as dist

from harness.cpu_sglang import free_port
from rlsync import client
from rlsync.group import join_update_group, leave_update_group

pytestmark = pytest.mark.needs("rank_results")

pool = cf.ThreadPoolExecutor(2)


def post(url: str, endpoint: str, payload: dict) -> requests.Response:
    return requests.post(url + endpoint, json=payload, timeout=120)


def assert_two_ranks(body: dict, success: bool = True) -> None:
    ranks = body["rank_results"]
    assert [r["rank"] for r in ranks] == [0, 1], body
    assert all(r["success"] is success for r in ranks), ranks


def test_group_update_destroy_and_disk_answer_every_rank(server_tp2, tiny_model):
    url, group, port = server_tp2.url, f"ranks_{free_port()}", free_port()
    init_body = dict(master_address="127.0.0.1", master_port=port, rank_offset=1)
    init_body.update(world_size=3, group_name=group, backend="gloo")
    init = pool.submit(post, url, "/init_weights_update_group", init_body)
    pg = join_update_group("127.0.0.1", port, 3, group_name=group, timeout=60)
    resp = init.result()
    assert resp.status_code == 200 and resp.json()["success"]
    assert_two_ranks(resp.json())

    name = "model.norm.weight"
    original = torch.tensor(client.get_weights_by_name(url, name, truncate_size=10**6))
    value = original.to(torch.bfloat16)
    update_body = dict(names=[name], dtypes=["bfloat16"], shapes=[list(value.shape)])
    update_body.update(group_name=group)
    # Upstream's single-phase update runs inside its session where the
    # release has one (0.5.23).
    opened = client.begin_weight_update(url)
    try:
        update = pool.submit(post, url, "/update_weights_from_distributed", update_body)
        dist.broadcast(value, src=0, group=pg)
        resp = update.result()
    finally:
        if opened:
            client.end_weight_update(url)
    assert resp.status_code == 200, resp.text
    assert_two_ranks(resp.json())

    resp = post(url, "/destroy_weights_update_group", {"group_name": group})
    assert resp.status_code == 200
    assert_two_ranks(resp.json())
    leave_update_group(pg)

    resp = post(url, "/update_weights_from_disk", {"model_path": str(tiny_model)})
    assert resp.status_code == 200, resp.text
    assert_two_ranks(resp.json())


def test_failed_group_init_reports_both_ranks(server_tp2):
    """A group init every rank refuses at once (its name is a live group's),
    so none waits for a trainer that never comes."""
    url, group, port = server_tp2.url, f"taken_{free_port()}", free_port()
    body = dict(master_address="127.0.0.1", master_port=port, rank_offset=1)
    body.update(world_size=3, group_name=group, backend="gloo")
    init = pool.submit(post, url, "/init_weights_update_group", body)
    pg = join_update_group("127.0.0.1", port, 3, group_name=group, timeout=60)
    try:
        assert init.result().status_code == 200
        resp = post(url, "/init_weights_update_group", {**body, "master_port": 1})
        assert resp.status_code == 400, resp.text
        answer = resp.json()
        assert not answer["success"] and "already exists" in answer["message"]
        assert_two_ranks(answer, success=False)
    finally:
        post(url, "/destroy_weights_update_group", {"group_name": group})
        leave_update_group(pg)
