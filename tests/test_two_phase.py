"""Two-phase weight update (patch `two-phase-weight-update`) on the real server, over gloo: the
protocol, bad input, faults, serving during the transfer, and no race."""

from __future__ import annotations

import concurrent.futures as cf
import json
import multiprocessing as mp
import os
import threading
import time

import psutil
import pytest
import requests
import torch
import torch.distributed as dist
from conftest import KEYED_ADMIN_KEY

from harness.cpu_sglang import free_port
from harness.trainer import GlooTrainer, update_two_phase
from harness.weights import greedy as served_greedy
from harness.weights import randomized
from rlsync import client
from rlsync.digest import digest_tensors
from rlsync.group import join_update_group, leave_update_group
from rlsync.planner import plan_buckets

PROMPT = "Weights in flight"
SAMPLED = [
    "model.norm.weight",
    "model.layers.1.mlp.down_proj.weight",
    "model.embed_tokens.weight",
]


def greedy(url: str, n: int = 12) -> list[int]:
    return served_greedy(url, PROMPT, n)


def sampled(url: str) -> dict[str, list]:
    return {n: client.get_weights_by_name(url, n, truncate_size=4) for n in SAMPLED}


def post(url: str, endpoint: str, payload: dict) -> requests.Response:
    return requests.post(url + endpoint, json=payload, timeout=60)


def wait_until(condition, timeout: float) -> bool:
    """Polls `condition` until it holds (True) or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@pytest.fixture
def trainer_tp1(server_tp1):
    trainer = GlooTrainer([server_tp1.url], [1], group_name=f"tp1_{free_port()}")
    yield trainer
    trainer.close()


# --- the protocol -----------------------------------------------------------


@pytest.mark.parametrize("load_format", ["flattened_bucket", None])
@pytest.mark.parametrize("tp", [1, 2])
def test_full_update_then_restore(
    tp, load_format, server_tp1, server_tp2, model_weights, monkeypatch
):
    server = server_tp1 if tp == 1 else server_tp2
    original_out, original_sampled = greedy(server.url), sampled(server.url)
    trainer = GlooTrainer([server.url], [tp], group_name=f"full_{tp}_{load_format}")
    calls = []
    http = client.http_client()  # every rlsync.client call goes through it
    real_request = http.request
    monkeypatch.setattr(
        http, "request", lambda *a, **k: calls.append(a[1]) or real_request(*a, **k)
    )
    try:
        new = randomized(model_weights, seed=tp)
        bucket_bytes = 64 << 10
        n_buckets = len(plan_buckets(new, bucket_bytes))
        assert n_buckets > 3
        (result,) = update_two_phase(
            trainer,
            new,
            load_format=load_format,
            bucket_bytes=bucket_bytes,
            weight_version="v-new",
        )
        assert calls == [
            server.url + "/prepare_weights_update",
            server.url + "/complete_weights_update",
        ]
        assert result.success and result.applied
        assert result.num_buckets_received == n_buckets
        assert [r.rank for r in result.rank_results] == list(range(tp))
        expected = dict(new)
        got = sampled(server.url)
        for name in SAMPLED:
            want = (
                expected[name].float().flatten()[:4].tolist()
                if name == "model.norm.weight"
                else None
            )
            if want is not None:
                assert got[name] == want
            assert got[name] != original_sampled[name]
        assert client.get_weight_version(server.url) == "v-new"
        assert greedy(server.url) != original_out

        update_two_phase(
            trainer, model_weights, load_format=load_format, bucket_bytes=bucket_bytes
        )
        assert greedy(server.url) == original_out
        assert sampled(server.url) == original_sampled
    finally:
        trainer.close()


def test_every_parameter_value_lands(server_tp1, trainer_tp1, model_weights):
    """Compare a whole 2-D parameter, not just a prefix, after an update."""
    name = "model.layers.0.mlp.down_proj.weight"
    new = randomized(model_weights, seed=7)
    update_two_phase(trainer_tp1, new)
    got = torch.tensor(
        client.get_weights_by_name(server_tp1.url, name, truncate_size=10**6)
    )
    assert torch.equal(got, dict(new)[name].float())
    update_two_phase(trainer_tp1, model_weights)


def test_race_is_gone_50_updates_without_sleep(server_tp1, trainer_tp1, model_weights):
    before = greedy(server_tp1.url)
    small = [(n, t) for n, t in model_weights if "layers.1" in n]
    for i in range(50):
        weights = small if i % 2 == 0 else randomized(small, seed=i)
        (result,) = update_two_phase(trainer_tp1, weights, bucket_bytes=32 << 10)
        assert result.success, (i, result)
    update_two_phase(trainer_tp1, model_weights)
    assert greedy(server_tp1.url) == before


def test_serving_continues_during_the_transfer(server_tp1, trainer_tp1, model_weights):
    tokens_at: list[float] = []
    errors: list[str] = []
    last: dict = {}

    def stream():
        params = {"max_new_tokens": 300, "temperature": 0, "ignore_eos": True}
        try:
            with requests.post(
                server_tp1.url + "/generate",
                json={"text": "stream", "stream": True, "sampling_params": params},
                stream=True,
                timeout=120,
            ) as resp:
                for line in resp.iter_lines():
                    if line.startswith(b"data:") and line != b"data: [DONE]":
                        tokens_at.append(time.monotonic())
                        last.update(json.loads(line[5:])["meta_info"])
        except Exception as e:  # reported below
            errors.append(repr(e))

    thread = threading.Thread(target=stream)
    thread.start()
    assert wait_until(lambda: len(tokens_at) >= 3, 60), "stream did not start"
    during: list[int] = []

    def hold(i):  # after the first bucket the trainer waits for 5 more tokens
        if i == 0:
            start = len(tokens_at)
            more = lambda: len(tokens_at) >= start + 5 or not thread.is_alive()
            wait_until(more, 60)
            during.append(len(tokens_at) - start)

    new = randomized(model_weights, seed=3)
    (result,) = update_two_phase(
        trainer_tp1, new, bucket_bytes=64 << 10, between_buckets=hold
    )
    thread.join(120)
    assert result.success
    assert not errors, errors
    assert during[0] >= 5, f"only {during[0]} tokens while the transfer was open"
    assert last["completion_tokens"] == 300
    assert last["finish_reason"]["type"] == "length"
    update_two_phase(trainer_tp1, model_weights)


def scheduler_blocked_share(server, polls: int = 50) -> float:
    """The share of `polls` that find the scheduler's main thread blocked in
    the kernel (state S) rather than running or waiting for a core (R): a
    busy loop reads R however loaded the host is."""
    (sched,) = server.schedulers()
    blocked = 0
    for _ in range(polls):
        blocked += sched.status() == psutil.STATUS_SLEEPING
        time.sleep(0.01)  # between polls
    return blocked / polls


@pytest.mark.needs("idle_scheduler_yields_to_receiver")
def test_idle_scheduler_yields_to_a_receive(start_server, model_weights):
    # Upstream's default: an idle scheduler polls its sockets in a busy loop.
    server = start_server(sleep_on_idle=False)
    spinning = scheduler_blocked_share(server)
    assert spinning <= 0.25, f"control: the idle scheduler blocked in {spinning:.0%}"
    trainer = GlooTrainer([server.url], [1], group_name=f"yield_{free_port()}")
    during: dict = {}

    def hold(i: int) -> None:  # the receiver waits for bytes meanwhile
        if i == 0:
            during["blocked"] = scheduler_blocked_share(server)
            # The scheduler still wakes for a request while it waits.
            during["greedy"] = greedy(server.url)

    try:
        (result,) = update_two_phase(
            trainer,
            randomized(model_weights, seed=5),
            bucket_bytes=64 << 10,
            between_buckets=hold,
        )
        assert result.success, result.message
        assert during["blocked"] >= 0.75, (
            f"the idle scheduler blocked in {during['blocked']:.0%} of polls while "
            f"a receive ran ({spinning:.0%} without one)"
        )
        assert len(during["greedy"]) == 12
    finally:
        trainer.close()


# --- bad input ----------------------------------------------------------------

GOOD = {"names": ["model.norm.weight"], "dtypes": ["bfloat16"], "shapes": [[64]]}


def bad_prepare_cases(group: str):
    def req(buckets, **kw):
        return {
            "num_buckets": len(buckets),
            "buckets": buckets,
            "group_name": group,
            **kw,
        }

    return [
        (
            {**req([GOOD]), "num_buckets": 2},
            "num_buckets: 2 disagrees with len(buckets) = 1",
        ),
        (
            req([{**GOOD, "dtypes": []}]),
            "buckets[0]: names, dtypes and shapes differ in length",
        ),
        (
            req([{**GOOD, "dtypes": ["bfloat17"]}]),
            "buckets[0].dtypes[0]: unknown dtype 'bfloat17'",
        ),
        (
            req([{**GOOD, "shapes": [[-64]]}]),
            "buckets[0].shapes[0]: dimension -64 is negative",
        ),
        (
            req([{**GOOD, "shapes": [[6.4]]}]),
            "buckets[0].shapes[0]: dimension 6.4 is not an integer",
        ),
        (req([GOOD, GOOD]), "buckets[1].names[0]: duplicate name 'model.norm.weight'"),
        (
            req([{**GOOD, "names": ["model.norm.wieght"]}]),
            "buckets[0].names[0]: the model has no parameter",
        ),
        (req([GOOD], group_name="nope"), "group_name: no update group 'nope'"),
        (req([GOOD], load_format="zip"), "load_format: 'zip' is not one of"),
        (req([{**GOOD, "digest": "md5:abc"}]), "buckets[0].digest: expected 'psum61:"),
        (req([]), "buckets: an update needs at least one bucket"),
    ]


def test_bad_metadata_is_rejected_naming_the_field(server_tp1, trainer_tp1):
    for payload, message in bad_prepare_cases(trainer_tp1.group_name):
        resp = post(server_tp1.url, "/prepare_weights_update", payload)
        assert resp.status_code == 400, (payload, resp.text)
        assert resp.json()["status"] == "error"
        assert message in resp.json()["message"], (message, resp.json())
    # Nothing was left open by the rejections.
    assert (
        post(
            server_tp1.url,
            "/abort_weights_update",
            {"group_name": trainer_tp1.group_name},
        ).status_code
        == 409
    )


def test_staging_over_budget_is_413(server_tp1, trainer_tp1):
    huge = {
        "names": ["model.embed_tokens.weight"],
        "dtypes": ["float32"],
        "shapes": [[512, 65536]],
    }
    resp = post(
        server_tp1.url,
        "/prepare_weights_update",
        {"num_buckets": 1, "buckets": [huge], "group_name": trainer_tp1.group_name},
    )
    assert resp.status_code == 413
    assert (
        "more than the --weight-update-staging-budget-mb of 64.0 MiB"
        in resp.json()["message"]
    )


def test_session_already_open_is_409_and_protocol_order(server_tp1, trainer_tp1):
    url, group = server_tp1.url, trainer_tp1.group_name
    payload = {"num_buckets": 1, "buckets": [GOOD], "group_name": group}
    resp = post(url, "/complete_weights_update", {"group_name": group})
    assert (
        resp.status_code == 409
        and "call /prepare_weights_update first" in resp.json()["message"]
    )
    resp = post(url, "/abort_weights_update", {"group_name": group})
    assert resp.status_code == 409 and "nothing to abort" in resp.json()["message"]
    assert post(url, "/prepare_weights_update", payload).json()["status"] == "ready"
    second = post(url, "/prepare_weights_update", payload)
    assert second.status_code == 409 and "already open" in second.json()["message"]
    # The session in the way is named in a field, for a restarted trainer
    # to abort it without reading messages.
    assert second.json()["open_session_group"] == group
    for endpoint in ("/complete_weights_update", "/abort_weights_update"):
        other = post(url, endpoint, {"group_name": "not-" + group})
        assert other.status_code == 400, (endpoint, other.text)
        assert other.json()["open_session_group"] == group, endpoint
    norm = torch.tensor(
        client.get_weights_by_name(url, "model.norm.weight", truncate_size=10**6)
    )
    dist.broadcast(norm.to(torch.bfloat16), src=0, group=trainer_tp1.group)
    first = post(url, "/complete_weights_update", {"group_name": group})
    assert first.status_code == 200 and first.json()["success"]
    again = post(url, "/complete_weights_update", {"group_name": group})
    assert again.status_code == 409


def test_a_two_phase_update_and_upstreams_weight_update_session_exclude_each_other(
    server_tp1, trainer_tp1
):
    """Where the scheduler has a weight-update session of its own (0.5.21 and
    later), a two-phase update never opens it: beginning it restores re-packed
    layers' checkpoint layout on the model that keeps serving, and ending it
    re-packs them. Neither runs beside the other, and neither leaves the other
    blocked."""
    url, group = server_tp1.url, trainer_tp1.group_name
    payload = {"num_buckets": 1, "buckets": [GOOD], "group_name": group}
    if not client.begin_weight_update(url):
        pytest.skip("this release's scheduler has no weight-update session")
    try:
        resp = post(url, "/prepare_weights_update", payload)
        assert resp.status_code == 409, resp.text
        assert "(/begin_weight_update) is already open" in resp.json()["message"]
    finally:
        client.end_weight_update(url)
    assert post(url, "/prepare_weights_update", payload).json()["status"] == "ready"
    try:
        begin = post(url, "/begin_weight_update", {}).json()
        assert not begin["success"], begin
        assert "a two-phase weight update is open" in begin["message"], begin
        end = post(url, "/end_weight_update", {}).json()
        assert not end["success"], end
        assert "no weight-update session is open" in end["message"], end
    finally:
        resp = post(url, "/abort_weights_update", {"group_name": group})
        assert resp.status_code == 200, resp.text
    assert client.begin_weight_update(url)
    client.end_weight_update(url)


def test_verify_only_then_apply(server_tp1, trainer_tp1, model_weights):
    before = greedy(server_tp1.url)
    (result,) = update_two_phase(
        trainer_tp1, randomized(model_weights, 11), apply=False
    )
    assert result.success and result.ready_to_apply and not result.applied
    assert greedy(server_tp1.url) == before, "verify-only must not apply"
    applied = client.complete_weights_update(
        server_tp1.url, group_name=trainer_tp1.group_name
    )
    assert applied.applied
    assert greedy(server_tp1.url) != before
    update_two_phase(trainer_tp1, model_weights)
    assert greedy(server_tp1.url) == before


# --- faults -------------------------------------------------------------------


def test_corrupted_bucket_fails_naming_it_weights_untouched(
    server_tp1, trainer_tp1, model_weights
):
    url, group = server_tp1.url, trainer_tp1.group_name
    before_out, before_sampled = greedy(url), sampled(url)
    buckets = plan_buckets(randomized(model_weights, 5), 64 << 10)
    meta = [b.meta(digest_tensors(b.tensors)) for b in buckets]
    client.prepare_weights_update(
        url, meta, group_name=group, load_format="flattened_bucket"
    )
    for i, b in enumerate(buckets):
        flat = torch.cat([t.reshape(-1).view(torch.uint8) for t in b.tensors])
        if i == 2:
            flat[1234] ^= 0x10  # one flipped bit on the wire
        dist.broadcast(flat, src=0, group=trainer_tp1.group)
    resp = post(url, "/complete_weights_update", {"group_name": group})
    assert resp.status_code == 400
    body = resp.json()
    assert not body["success"] and "bucket 2 (" in body["message"]
    assert "does not match the sender's" in body["message"]
    assert greedy(url) == before_out and sampled(url) == before_sampled
    # The transfer itself completed: the group is still usable.
    (ok,) = update_two_phase(trainer_tp1, model_weights)
    assert ok.success


def test_swapped_buckets_are_caught(server_tp1, trainer_tp1, model_weights):
    url, group = server_tp1.url, trainer_tp1.group_name
    before = greedy(url)
    buckets = plan_buckets(randomized(model_weights, 6), 64 << 10)
    same = [
        i for i in range(len(buckets) - 1) if buckets[i].nbytes == buckets[i + 1].nbytes
    ]
    assert same, "need two buckets of one size"
    a = same[0]
    meta = [b.meta(digest_tensors(b.tensors)) for b in buckets]
    client.prepare_weights_update(
        url, meta, group_name=group, load_format="flattened_bucket"
    )
    order = list(range(len(buckets)))
    order[a], order[a + 1] = order[a + 1], order[a]
    for i in order:
        flat = torch.cat([t.reshape(-1).view(torch.uint8) for t in buckets[i].tensors])
        dist.broadcast(flat, src=0, group=trainer_tp1.group)
    body = post(url, "/complete_weights_update", {"group_name": group}).json()
    assert not body["success"]
    assert f"bucket {a} (" in body["message"] and f"bucket {a + 1} (" in body["message"]
    assert greedy(url) == before


def _dying_trainer(url: str, port: int, group: str, meta: list, first: torch.Tensor):
    pg = join_update_group("127.0.0.1", port, 2, group_name=group, timeout=60)
    client.prepare_weights_update(
        url, meta, group_name=group, load_format="flattened_bucket"
    )
    dist.broadcast(first, src=0, group=pg)
    os._exit(17)  # killed mid-transfer: no goodbye


def test_trainer_killed_mid_transfer(server_tp1, model_weights):
    url = server_tp1.url
    before_out, before_sampled = greedy(url), sampled(url)
    port, group = free_port(), f"dying_{free_port()}"
    buckets = plan_buckets(randomized(model_weights, 9), 64 << 10)
    meta = [b.meta(digest_tensors(b.tensors)) for b in buckets]
    first = torch.cat([t.reshape(-1).view(torch.uint8) for t in buckets[0].tensors])
    init = threading.Thread(
        target=client.init_weights_update_group,
        args=(url,),
        kwargs=dict(
            master_address="127.0.0.1",
            master_port=port,
            rank_offset=1,
            world_size=2,
            group_name=group,
            backend="gloo",
        ),
    )
    init.start()
    proc = mp.get_context("spawn").Process(
        target=_dying_trainer, args=(url, port, group, meta, first)
    )
    proc.start()
    proc.join(60)
    init.join(60)
    assert proc.exitcode == 17
    # Answered within post's 60 s: complete's own 20 s, not the group's 120 s.
    resp = post(url, "/complete_weights_update", {"group_name": group, "timeout": 20})
    body = resp.json()
    assert resp.status_code == 400 and not body["success"], body
    assert body["num_buckets_received"] < len(buckets)
    assert greedy(url) == before_out and sampled(url) == before_sampled
    # Re-initialise the group, then a new update succeeds.
    trainer = GlooTrainer([url], [1], group_name=f"after_{port}")
    try:
        (ok,) = update_two_phase(trainer, model_weights)
        assert ok.success and greedy(url) == before_out
    finally:
        trainer.close()


# The trainer joins with LATE_LEFT_S of the init's LATE_INIT_S left, then
# sends later than that (within LATE_INIT_S).
LATE_INIT_S, LATE_LEFT_S, LATE_SEND_S = 12.0, 4.0, 8.0


@pytest.mark.needs("update_group_on_route")
def test_a_trainer_that_joined_late_gets_the_groups_whole_timeout(
    server_tp1, model_weights
):
    """The init's timeout bounds the join; the group's collectives keep all of
    it. A trainer that joins with seconds of the init left, then sends a
    bucket later than those seconds, is served (its broadcast timed out at
    the seconds left: with NCCL that takes the scheduler down)."""
    server, url = server_tp1, server_tp1.url
    before = greedy(url)
    port = free_port()
    group = f"late_collective_{port}"
    init = cf.ThreadPoolExecutor(1).submit(
        client.init_weights_update_group,
        url,
        master_address="127.0.0.1",
        master_port=port,
        rank_offset=1,
        world_size=2,
        group_name=group,
        backend="gloo",
        timeout=LATE_INIT_S,
    )
    server.wait_for_log(f"master_port={port}")  # its init's clock runs
    time.sleep(LATE_INIT_S - LATE_LEFT_S)  # the lateness under test
    pg = join_update_group("127.0.0.1", port, 2, group_name=group, timeout=60)
    try:
        assert init.result(timeout=60)["success"]
        new = randomized(model_weights, 11)
        for weights, delay in ((new, LATE_SEND_S), (model_weights, 0.0)):
            buckets = plan_buckets(weights, 64 << 10)
            meta = [b.meta(digest_tensors(b.tensors)) for b in buckets]
            client.prepare_weights_update(
                url, meta, group_name=group, load_format="flattened_bucket"
            )
            time.sleep(delay)  # the engine waits for bucket 0 meanwhile
            for bucket in buckets:
                flat = torch.cat(
                    [t.reshape(-1).view(torch.uint8) for t in bucket.tensors]
                )
                dist.broadcast(flat, src=0, group=pg)
            body = post(url, "/complete_weights_update", {"group_name": group}).json()
            assert body["success"], body
            if weights is new:
                name = "model.layers.0.mlp.down_proj.weight"
                landed = client.get_weights_by_name(url, name, truncate_size=10**6)
                assert torch.equal(torch.tensor(landed), dict(new)[name].float())
        assert greedy(url) == before
    finally:
        client.destroy_weights_update_group(url, group_name=group)
        leave_update_group(pg)


def test_abort_while_waiting_for_bytes_that_never_come(server_tp1, model_weights):
    url = server_tp1.url
    before = greedy(url)
    trainer = GlooTrainer([url], [1], group_name=f"abort_{free_port()}")
    meta = [b.meta() for b in plan_buckets(model_weights, 64 << 10)]
    client.prepare_weights_update(url, meta, group_name=trainer.group_name)
    # An abort that waited for the bytes would wait out the group's 120 s
    # timeout: the call's own 60 s ends first and raises.
    body = client.abort_weights_update(url, group_name=trainer.group_name, timeout=60)
    assert body.success and body.group_usable is False
    assert "call /init_weights_update_group again" in body.message
    assert greedy(url) == before
    leave_update_group(trainer.group)
    trainer2 = GlooTrainer([url], [1], group_name=trainer.group_name)
    try:
        (ok,) = update_two_phase(trainer2, model_weights)
        assert ok.success
    finally:
        trainer2.close()


def test_admin_key_required(keyed_server, model_weights):
    server = keyed_server
    payload = {"num_buckets": 1, "buckets": [GOOD], "group_name": "g"}
    for endpoint in (
        "/prepare_weights_update",
        "/complete_weights_update",
        "/abort_weights_update",
    ):
        assert post(server.url, endpoint, payload).status_code == 401, endpoint
        wrong = requests.post(
            server.url + endpoint,
            json=payload,
            headers={"Authorization": "Bearer nope"},
            timeout=30,
        )
        assert wrong.status_code == 401, endpoint
    trainer = GlooTrainer(
        [server.url], [1], group_name=f"keyed_{free_port()}", admin_key=KEYED_ADMIN_KEY
    )
    try:
        (ok,) = update_two_phase(trainer, model_weights)
        assert ok.success
    finally:
        trainer.close()


def test_complete_waiting_for_bytes_does_not_hold_serving_and_times_out_open(
    server_tp1, trainer_tp1, model_weights
):
    """complete waits for late bytes without stopping generation; when its
    timeout passes the session stays open, and a later complete applies."""
    url, group = server_tp1.url, trainer_tp1.group_name
    before = greedy(url)
    buckets = plan_buckets(randomized(model_weights, 13), 64 << 10)
    meta = [b.meta(digest_tensors(b.tensors)) for b in buckets]
    flats = [
        torch.cat([t.reshape(-1).view(torch.uint8) for t in b.tensors]) for b in buckets
    ]
    client.prepare_weights_update(
        url, meta, group_name=group, load_format="flattened_bucket"
    )
    half = len(flats) // 2
    for flat in flats[:half]:
        dist.broadcast(flat, src=0, group=trainer_tp1.group)
    waiting = threading.Thread(
        target=lambda: results.append(
            post(url, "/complete_weights_update", {"group_name": group, "timeout": 4})
        )
    )
    results: list = []
    waiting.start()
    out = requests.post(
        url + "/generate",
        json={"text": "x", "sampling_params": {"max_new_tokens": 4}},
        timeout=30,
    )
    assert out.status_code == 200, out.text
    # Answered while complete still waits (its 4 s timeout ends it, not bytes).
    assert waiting.is_alive() and not results, "generation held by complete"
    waiting.join(30)
    body = results[0].json()
    assert results[0].status_code == 400
    assert (
        f"timed out after 4s with {half} buckets received; complete again or abort"
        in body["message"]
    )
    assert greedy(url) == before
    for flat in flats[half:]:
        dist.broadcast(flat, src=0, group=trainer_tp1.group)
    done = client.complete_weights_update(url, group_name=group)
    assert done.applied and greedy(url) != before
    update_two_phase(trainer_tp1, model_weights)
    assert greedy(url) == before
