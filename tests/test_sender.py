"""WeightSender against two real servers (TP 1 + TP 2) in one gloo group."""

from __future__ import annotations

import time

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
        master_port=free_port(),
        group_name=f"fleet_{free_port()}",
        backend="gloo",
        bucket_bytes=64 << 10,
    )
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


def test_engine_down_at_prepare_names_it_and_aborts_the_others(
    server_tp1, start_server, model_weights
):
    doomed = start_server(tp=1)
    sender = WeightSender(
        [Engine(server_tp1.url, 1), Engine(doomed.url, 1)],
        master_port=free_port(),
        group_name=f"down_{free_port()}",
        backend="gloo",
        bucket_bytes=64 << 10,
    )
    sender.connect()
    before = greedy(server_tp1.url)
    doomed.stop()
    try:
        with pytest.raises(SyncError) as err:
            sender.sync(randomized(model_weights, 31), weight_version="never")
        assert err.value.step == "prepare"
        assert doomed.url in str(err.value) and "/prepare_weights_update" in str(
            err.value
        )
        assert "others aborted" in str(err.value)
        # The live engine has no session left open and still serves the old weights.
        assert greedy(server_tp1.url) == before
        assert client.get_weight_version(server_tp1.url) != "never"
        with pytest.raises(
            client.EngineError, match="no weight update session|HTTP 400"
        ):
            client.complete_weights_update(server_tp1.url, group_name=sender.group_name)
    finally:
        sender.close()


def test_sync_takes_a_module_or_a_state_dict(fleet, model_weights):
    """No second copy of the weights on the trainer: buckets reference them."""
    url = fleet.engines[0].url
    before = greedy(url)
    module = torch.nn.Module()
    for name, t in randomized(model_weights, 41):
        holder = module
        *path, leaf = name.split(".")
        for part in path:
            if not hasattr(holder, part):
                holder.add_module(part, torch.nn.Module())
            holder = getattr(holder, part)
        holder.register_parameter(leaf, torch.nn.Parameter(t, requires_grad=False))
    seen = []
    assert fleet.sync(module, progress=lambda *a: seen.append(a)).success
    assert greedy(url) != before
    assert seen[-1][0] == seen[-1][1] and seen[-1][2] == sum(
        t.numel() * t.element_size() for _, t in model_weights
    )
    assert fleet.sync(dict(model_weights)).success
    assert greedy(url) == before


def test_engine_refusing_the_group_fails_connect_at_once(start_server):
    """An engine that answers init with an error never joins; connect says so
    at once instead of waiting out the trainer's rendezvous timeout."""
    locked = start_server(extra_args=["--admin-api-key", "k3y"])
    sender = WeightSender(
        [Engine(locked.url, 1)],
        master_port=free_port(),
        backend="gloo",
        timeout=120,
        group_name=f"refused_{free_port()}",
    )
    t0 = time.monotonic()
    with pytest.raises(SyncError, match="init_weights_update_group: HTTP 401") as err:
        sender.connect()
    assert time.monotonic() - t0 < 20, "not the 120 s rendezvous timeout"
    assert err.value.step == "connect" and locked.url in str(err.value)
