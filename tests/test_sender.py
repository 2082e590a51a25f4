"""WeightSender against two real servers (TP 1 + TP 2) in one gloo group."""

from __future__ import annotations

import pytest
import torch

from harness.cpu_sglang import free_port
from harness.weights import greedy as served_greedy
from harness.weights import randomized
from rlsync import client
from rlsync.sender import Engine, SyncError, WeightSender

PROMPT = "Fleet"


def greedy(url: str) -> list[int]:
    return served_greedy(url, PROMPT, 10)


@pytest.fixture
def fleet(server_tp1, server_tp2):
    sender = WeightSender(
        [Engine(server_tp1.url, 1), Engine(server_tp2.url, 2)],
        master_port=free_port(), group_name=f"fleet_{free_port()}", backend="gloo",
        bucket_bytes=64 << 10,
    )  # fmt: skip
    sender.connect()
    yield sender
    sender.close()


@pytest.mark.parametrize("atomic", [False, True])
def test_sync_reaches_every_engine_then_restores(fleet, model_weights, atomic):
    urls = [e.url for e in fleet.engines]
    before = [greedy(u) for u in urls]
    assert before[0] == before[1]
    result = fleet.sync(
        randomized(model_weights, 21), weight_version="step-1", atomic=atomic
    )
    assert result.success and result.buckets > 3
    assert result.http_calls == (3 if atomic else 2) * len(urls)
    assert result.bytes == sum(t.numel() * t.element_size() for _, t in model_weights)
    after = [greedy(u) for u in urls]
    assert after[0] == after[1] != before[0], "replicas must agree on the new weights"
    assert all(client.get_weight_version(u) == "step-1" for u in urls)
    fleet.sync(model_weights, weight_version="restored", atomic=atomic)
    assert [greedy(u) for u in urls] == before


def test_trainer_exception_mid_broadcast_aborts_every_engine(
    fleet, model_weights, monkeypatch
):
    urls = [e.url for e in fleet.engines]
    before = [greedy(u) for u in urls]
    real_broadcast = torch.distributed.broadcast
    calls = {"n": 0}

    def flaky(tensor, src, group=None, async_op=False):
        calls["n"] += 1  # the third bucket fails on the trainer side
        if calls["n"] == 3:
            raise RuntimeError("NCCL error: unhandled system error")
        return real_broadcast(tensor, src, group=group, async_op=async_op)

    monkeypatch.setattr(torch.distributed, "broadcast", flaky)
    with pytest.raises(SyncError, match="broadcast: RuntimeError: NCCL error") as err:
        fleet.sync(randomized(model_weights, 23))
    assert "group must be re-initialised" in str(err.value)
    monkeypatch.undo()
    assert [greedy(u) for u in urls] == before, "old weights must keep serving"
