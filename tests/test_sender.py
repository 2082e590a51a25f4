"""WeightSender against two real servers (TP 1 + TP 2) in one gloo group."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from conftest import KEYED_ADMIN_KEY, KEYED_API_KEY

from harness import cpu_sglang
from harness.cpu_sglang import free_port
from harness.weights import greedy as served_greedy
from harness.weights import randomized
from rlsync import client
from rlsync.group import GroupJoin
from rlsync.sender import FLATTENED, Engine, SyncError, WeightSender

PROMPT = "Fleet"
ROOT = Path(__file__).resolve().parents[1]
ADMIN_KEY, API_KEY = KEYED_ADMIN_KEY, KEYED_API_KEY


@pytest.fixture
def locked(keyed_server):
    """A server with an admin key and an ordinary API key."""
    return keyed_server


def join_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name == "rlsync-join"]


def port_refuses(port: int) -> bool:
    """True when nothing listens on the port (the rendezvous store is gone)."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


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


# The library's reaction is the subject; aborts on a live engine run on every pin.
@pytest.mark.release_independent
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


def test_engine_refusing_the_group_fails_connect_at_once_and_tears_the_join_down(
    locked,
):
    """An engine that answers init with an error never joins; connect says so
    at once instead of waiting out the trainer's rendezvous timeout, and the
    trainer's own join is gone: no thread left in the rendezvous, no store
    listening on the master port."""
    port = free_port()
    sender = WeightSender(
        [Engine(locked.url, 1, api_key=API_KEY)],  # the API key is not the admin key
        master_port=port,
        backend="gloo",
        timeout=120,
        group_name=f"refused_{free_port()}",
    )
    t0 = time.monotonic()
    with pytest.raises(SyncError, match="init_weights_update_group: HTTP 401") as err:
        sender.connect()
    assert time.monotonic() - t0 < 20, "not the 120 s rendezvous timeout"
    assert err.value.step == "connect" and locked.url in str(err.value)
    assert join_threads() == [], "the trainer's join was left running"
    assert port_refuses(port), "the rendezvous store still listens"
    assert sender.group is None


def test_a_join_that_failed_on_its_own_releases_its_port():
    """An engine reaches the trainer's rendezvous store and dies before it
    joins the process group: the trainer's join fails within its timeout,
    and its store stops listening at once, though the caller keeps the
    error (as a trainer keeps a SyncError) and no cancel() ran."""
    port = free_port()
    join = GroupJoin("127.0.0.1", port, 2, group_name="dies_in_between", timeout=3.0)
    join.start()
    deadline = time.monotonic() + 30
    while port_refuses(port):  # until the store listens
        assert time.monotonic() < deadline, "the rendezvous store never listened"
        time.sleep(0.05)
    engine = dist.TCPStore("127.0.0.1", port, 2, False, timedelta(seconds=10))
    del engine  # the engine is gone before the process group forms
    error = join.future.exception(timeout=60)
    assert error is not None, "the join cannot succeed without its engine"
    assert port_refuses(port), "the failed join's store still holds its port"


# The engine joins with LATE_LEFT_S of the trainer's LATE_JOIN_S left, then
# posts its receive later than that (within LATE_JOIN_S).
LATE_JOIN_S, LATE_LEFT_S, LATE_RECEIVE_S = 12.0, 4.0, 8.0


def _late_engine(port: int, group: str, go, result) -> None:
    """Rank 1: joins once `go` is set, then receives later than the
    trainer's join had left."""
    from rlsync.group import join_update_group, leave_update_group

    go.wait(60)
    pg = join_update_group("127.0.0.1", port, 2, rank=1, group_name=group, timeout=60)
    time.sleep(LATE_RECEIVE_S)  # the lateness under test
    received = torch.zeros(4)
    dist.broadcast(received, src=0, group=pg)
    result.put(received.tolist())
    leave_update_group(pg)


def test_a_join_whose_engine_came_late_keeps_the_whole_timeout_for_broadcasts():
    """The trainer's join timeout bounds the join; its group's broadcasts
    keep all of it. An engine that joins with seconds of the trainer's join
    left, then receives later than those seconds, gets the bytes (the
    trainer's broadcast timed out at the seconds left)."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    port, group = free_port(), f"late_engine_{free_port()}"
    go, result = ctx.Event(), ctx.Queue()
    engine = ctx.Process(target=_late_engine, args=(port, group, go, result))
    engine.start()
    try:
        t0 = time.monotonic()
        join = GroupJoin("127.0.0.1", port, 2, group_name=group, timeout=LATE_JOIN_S)
        join.start()
        time.sleep(max(0.0, t0 + LATE_JOIN_S - LATE_LEFT_S - time.monotonic()))
        go.set()
        pg = join.future.result(timeout=60)
        sent = torch.arange(4, dtype=torch.float32) + 1
        dist.broadcast(sent, src=0, group=pg)
        assert result.get(timeout=60) == sent.tolist()
        dist.destroy_process_group(pg)
    finally:
        engine.join(60)
        if engine.is_alive():
            engine.kill()
    assert engine.exitcode == 0


# The trainer's side of a refused NCCL group on a host without CUDA: the
# engine refuses (no GPU), then the process must exit normally.
NCCL_CHILD = """
import json, sys, threading
from rlsync.sender import Engine, SyncError, WeightSender
sender = WeightSender([Engine(sys.argv[1], 1)], master_port=int(sys.argv[2]),
                      backend="nccl", timeout=120, group_name="nccl_refused")
try:
    sender.connect()
    print(json.dumps({"error": None}))
except SyncError as e:
    joins = [t.name for t in threading.enumerate() if t.name == "rlsync-join"]
    print(json.dumps({"error": str(e), "step": e.step, "joins": joins}))
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a host without CUDA")
def test_failed_nccl_rendezvous_raises_and_the_trainer_exits_normally(server_tp1):
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'python'}:{ROOT}"}
    for attempt in range(3):  # the abort it guards against raced the exit
        child = subprocess.run(
            [sys.executable, "-c", NCCL_CHILD, server_tp1.url, str(free_port())],
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert "terminate called" not in child.stderr, (attempt, child.stderr[-2000:])
        assert child.returncode == 0, (attempt, child.returncode, child.stderr[-2000:])
        result = json.loads(child.stdout.strip().splitlines()[-1])
        assert result["error"] and result["step"] == "connect", result
        assert "NCCL" in result["error"], result
        assert result["joins"] == [], f"attempt {attempt}: join left running"


# A trainer that exits while its join still waits for ranks that never come.
EXIT_CHILD = """
import socket, sys, time
from rlsync.group import GroupJoin
port = int(sys.argv[1])
join = GroupJoin("127.0.0.1", port, 3, group_name="never_joined", timeout=300).start()
deadline = time.monotonic() + 60
while time.monotonic() < deadline:  # until the rendezvous store listens
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        break
    except OSError:
        time.sleep(0.05)
print("waiting in the rendezvous", flush=True)
"""


def test_exit_during_a_join_tears_it_down_and_exits_normally():
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'python'}:{ROOT}"}
    t0 = time.monotonic()
    child = subprocess.run(
        [sys.executable, "-c", EXIT_CHILD, str(free_port())],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "waiting in the rendezvous" in child.stdout, child.stderr[-2000:]
    assert child.returncode == 0 and "terminate called" not in child.stderr, (
        child.returncode,
        child.stderr[-2000:],
    )
    assert time.monotonic() - t0 < 60, "exit waited for the 300 s rendezvous"


def test_engine_keys_reach_protected_routes(locked, model_weights):
    """Under --admin-api-key and --api-key: the admin key goes to admin
    routes, the API key to ordinary ones, and a sync goes through."""
    url = locked.url
    sender = WeightSender(
        [Engine(url, 1, admin_key=ADMIN_KEY, api_key=API_KEY)],
        master_port=free_port(),
        backend="gloo",
        timeout=60,
        group_name=f"keys_{free_port()}",
        digests=False,  # the keys are under test here, not the digests
    )
    sender.connect()
    try:
        result = sender.sync(randomized(model_weights, 81), weight_version="keyed-1")
        assert result.success, result.engines
    finally:
        sender.close()
    assert client.get_weight_version(url, api_key=API_KEY) == "keyed-1"
    sent = dict(randomized(model_weights, 81))["model.norm.weight"]
    got = client.get_weights_by_name(
        url, "model.norm.weight", truncate_size=4, admin_key=ADMIN_KEY
    )
    assert got == sent.float()[:4].tolist()
    with pytest.raises(client.EngineError, match="HTTP 401"):
        client.get_weights_by_name(url, "model.norm.weight", truncate_size=4)
    with pytest.raises(client.EngineError, match="HTTP 401"):
        client.get_weight_version(url)
    assert "Engine(url=" in repr(sender.engines[0])
    assert ADMIN_KEY not in repr(sender.engines[0])


# --- per-tensor layout and verify-only syncs ----------------------------------


def served_exactly(url: str, sent: list[tuple[str, torch.Tensor]]) -> bool:
    """The engine serves the sent value of a parameter every rank holds whole."""
    name = "model.norm.weight"
    got = client.get_weights_by_name(url, name, truncate_size=10**6)
    return torch.equal(torch.tensor(got), dict(sent)[name].float())


@pytest.mark.parametrize("timeout", [0, -1, float("nan"), 8 * 24 * 3600.0, 1e300])
def test_a_timeout_not_above_zero_or_over_a_week_is_refused_at_construction(timeout):
    """It bounds the join and every broadcast: past a week it overflows the
    backends' clocks (the join failed, blamed on the network)."""
    with pytest.raises(
        ValueError, match="timeout must be above 0 s and at most a week"
    ):
        WeightSender([Engine("http://127.0.0.1:1", 1)], master_port=1, timeout=timeout)
    with pytest.raises(ValueError, match="timeout must be above 0 s"):
        GroupJoin("127.0.0.1", free_port(), 2, timeout=timeout)


def test_load_format_is_checked_at_construction():
    with pytest.raises(ValueError, match="load_format"):
        WeightSender([Engine("http://127.0.0.1:1")], master_port=1, load_format="x")


def test_per_tensor_layout_applies_and_answers_each_engines_ranks(fleet, model_weights):
    urls = [e.url for e in fleet.engines]
    before = [greedy(u) for u in urls]
    fleet.load_format = None
    new = randomized(model_weights, 61)
    result = fleet.sync(new, weight_version="per-tensor")
    assert result.success and result.verified
    answers = [e.answer for e in result.engines]
    assert [[r.rank for r in a.rank_results] for a in answers] == [[0], [0, 1]]
    assert all(a.weight_version == "per-tensor" for a in answers)
    assert all(served_exactly(u, new) for u in urls)
    assert all(greedy(u) != b for u, b in zip(urls, before))
    fleet.load_format = FLATTENED
    assert fleet.sync(model_weights).success
    assert [greedy(u) for u in urls] == before


def test_verify_only_keeps_old_weights_until_the_engines_apply(fleet, model_weights):
    urls = [e.url for e in fleet.engines]
    before = [greedy(u) for u in urls]
    new = randomized(model_weights, 62)
    result = fleet.sync(new, apply=False)
    assert result.verified and not result.success
    assert all(e.answer.ready_to_apply and not e.applied for e in result.engines)
    assert [greedy(u) for u in urls] == before, "a verify-only sync applied"
    for url in urls:  # the sessions stayed open: apply them now
        assert client.complete_weights_update(url, group_name=fleet.group_name).applied
    assert all(served_exactly(u, new) for u in urls)
    assert all(greedy(u) != b for u, b in zip(urls, before))
    assert fleet.sync(model_weights).success
    assert [greedy(u) for u in urls] == before
