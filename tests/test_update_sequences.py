"""Two-phase updates under the calls a buggy or dying trainer makes: every
check that could fail the apply runs at prepare, a cache flush under load
gets coherent semantics, a session owns its group (destroy, re-init and a
single-phase update cannot pull it away), and an unknown group is a 400, not
a dead server. Real server on CPU, trainer over gloo."""

from __future__ import annotations

import concurrent.futures as cf
import json
import threading
import time

import pytest
import requests
import torch

from harness.cpu_sglang import free_port
from harness.metrics import scrape, total
from harness.trainer import GlooTrainer, update_two_phase
from harness.weights import randomized
from rlsync import client
from rlsync.digest import digest_tensors
from rlsync.engine import Engine
from rlsync.planner import plan_buckets
from rlsync.sender import SyncError, WeightSender, broadcast_buckets

pool = cf.ThreadPoolExecutor(max_workers=8)


def post(url: str, endpoint: str, payload: dict, timeout: float = 60):
    return requests.post(url + endpoint, json=payload, timeout=timeout)


def checksum(url: str) -> str:
    return client.weights_checksum(url)["checksum"]


def generate(url: str, text: str, n: int = 8, timeout: float = 60) -> list[int]:
    resp = requests.post(
        url + "/generate",
        json={"text": text, "sampling_params": {"max_new_tokens": n, "temperature": 0}},
        timeout=timeout,
    )
    resp.raise_for_status()
    return resp.json()["output_ids"]


def no_session_open(url: str, group: str) -> bool:
    return post(url, "/abort_weights_update", {"group_name": group}).status_code == 409


def full_metadata(weights, **overrides) -> dict:
    """One bucket with every tensor, the way a trainer sends a whole model;
    overrides: {name: {"shapes": [...]} or {"dtypes": "..."}}."""
    names, dtypes, shapes = [], [], []
    for name, tensor in weights:
        names.append(name)
        dtypes.append(overrides.get(name, {}).get("dtypes", str(tensor.dtype)[6:]))
        shapes.append(overrides.get(name, {}).get("shapes", list(tensor.shape)))
    return {"names": names, "dtypes": dtypes, "shapes": shapes}


@pytest.fixture
def trainer_tp1(server_tp1):
    trainer = GlooTrainer([server_tp1.url], [1], group_name=f"seq_{free_port()}")
    yield trainer
    trainer.close()


# --- all-or-nothing: whatever can fail the apply fails at prepare ----------


@pytest.mark.parametrize("tp", [1, 2])
def test_wrong_shape_or_dtype_is_refused_at_prepare(
    tp, server_tp1, server_tp2, model_weights
):
    server = server_tp1 if tp == 1 else server_tp2
    trainer = GlooTrainer([server.url], [tp], group_name=f"shape_{tp}")
    last = model_weights[-1][0]
    cases = [
        # The last tensor of a whole-model bucket: the apply would have
        # written every tensor before it.
        ({last: {"shapes": [512, 63]}}, "buckets[0].shapes[{i}]", last),
        ({"model.norm.weight": {"shapes": []}}, "buckets[0].shapes[{i}]", None),
        ({"model.norm.weight": {"shapes": [0, 2**70]}}, "buckets[0].shapes[{i}]", None),
        ({"model.norm.weight": {"dtypes": "qint8"}}, "buckets[0].dtypes[{i}]", None),
        ({"model.norm.weight": {"dtypes": "int8"}}, "buckets[0].dtypes[{i}]", None),
        ({"model.norm.weight": {"dtypes": "bool"}}, "buckets[0].dtypes[{i}]", None),
    ]
    names = [n for n, _ in model_weights]
    try:
        before = checksum(server.url)
        for overrides, field, _ in cases:
            (name,) = overrides
            meta = full_metadata(model_weights, **overrides)
            resp = post(
                server.url,
                "/prepare_weights_update",
                {"num_buckets": 1, "buckets": [meta], "group_name": trainer.group_name},
            )
            assert resp.status_code == 400, (overrides, resp.text)
            message = resp.json()["message"]
            assert field.format(i=names.index(name)) in message, (overrides, message)
            assert name in message
            assert no_session_open(server.url, trainer.group_name)
        # A linear layer's own fused name: its full shape or nothing (the
        # fused loaders zero-pad or narrow whatever they get).
        for fused, shape in (
            ("model.layers.1.self_attn.qkv_proj.weight", [3, 64]),
            ("model.layers.0.mlp.gate_up_proj.weight", [512, 64]),
        ):
            bucket = {"names": [fused], "dtypes": ["bfloat16"], "shapes": [shape]}
            resp = post(
                server.url,
                "/prepare_weights_update",
                {
                    "num_buckets": 1,
                    "buckets": [bucket],
                    "group_name": trainer.group_name,
                },
            )
            assert resp.status_code == 400, resp.text
            assert "cannot be its full shape" in resp.json()["message"]
            assert "buckets[0].shapes[0]:" in resp.json()["message"]
        assert no_session_open(server.url, trainer.group_name)
        assert checksum(server.url) == before
        # A correct update still goes through on the same group.
        (result,) = update_two_phase(trainer, randomized(model_weights, seed=21))
        assert result.success and result.applied
        update_two_phase(trainer, model_weights)
        assert checksum(server.url) == before
    finally:
        trainer.close()


# --- flush_cache under load -------------------------------------------------

SHARED_PREFIX = "The quick brown fox jumps over the lazy dog; " * 3


def test_flush_cache_under_load_drains_then_flushes(
    server_tp1, trainer_tp1, model_weights
):
    """A long request is in flight and a prefix is cached under the old
    weights; complete(flush_cache=true) lets the long request finish, applies,
    flushes, and a new request sharing the prefix is computed afresh."""
    url = server_tp1.url
    # Caches the prefix under the old weights.
    old_answer = generate(url, SHARED_PREFIX + "A")
    new = randomized(model_weights, seed=31)
    buckets = plan_buckets(new, 1 << 20)
    meta = [b.meta() for b in buckets]
    client.prepare_weights_update(
        url, meta, group_name=trainer_tp1.group_name, weight_version="flushed-1"
    )
    for b in buckets:
        for t in b.tensors:
            torch.distributed.broadcast(t.contiguous(), src=0, group=trainer_tp1.group)

    first_chunk = threading.Event()
    long_answer: dict = {}

    def long_request():
        with requests.post(
            url + "/generate",
            json={
                "text": "long",
                "sampling_params": {
                    "max_new_tokens": 160,
                    "temperature": 0,
                    "ignore_eos": True,
                },
                "stream": True,
            },
            stream=True,
            timeout=120,
        ) as resp:
            long_answer["status"] = resp.status_code
            for line in resp.iter_lines():
                if line.startswith(b"data:") and line != b"data: [DONE]":
                    first_chunk.set()
                    long_answer["last"] = json.loads(line[5:])
        first_chunk.set()

    streaming = pool.submit(long_request)
    assert first_chunk.wait(60)
    completing = pool.submit(
        post,
        url,
        "/complete_weights_update",
        {"group_name": trainer_tp1.group_name, "flush_cache": True},
    )
    # The new request arrives while complete waits for the long one.
    deadline = time.monotonic() + 60
    while "complete_weights_update" not in requests.get(url + "/health").text:
        assert time.monotonic() < deadline, "complete never started"
        time.sleep(0.05)
    newer = pool.submit(generate, url, SHARED_PREFIX + "A")

    answer = completing.result(timeout=120)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["success"] and body["applied"], body
    assert body["weight_version"] == "flushed-1"
    assert client.get_weight_version(url) == "flushed-1"
    streaming.result(timeout=120)
    assert long_answer["status"] == 200
    assert len(long_answer["last"]["output_ids"]) == 160  # not cut short
    served = newer.result(timeout=60)

    # A fresh computation on the new weights: the same prompt on an emptied
    # cache. The new request may also have been served before the apply (it
    # can arrive while complete still verifies, before new requests are held
    # back): then it is the old weights' answer. Never a mix of the new
    # weights and the prefix's old KV.
    assert requests.post(url + "/flush_cache", timeout=30).status_code == 200
    fresh = generate(url, SHARED_PREFIX + "A")
    assert fresh != old_answer, "the new weights must answer differently"
    assert served in (fresh, old_answer)
    update_two_phase(trainer_tp1, model_weights)


def test_flush_cache_that_times_out_waiting_for_requests_says_so(
    server_tp1, trainer_tp1, model_weights
):
    """A cache flush waits for the in-flight requests; when complete's
    timeout passes first, the answer says that every byte arrived and what
    it waited for, nothing is applied, and the session stays open."""
    url = server_tp1.url
    before = checksum(url)
    buckets = plan_buckets(randomized(model_weights, seed=33), 1 << 20)
    client.prepare_weights_update(
        url, [b.meta() for b in buckets], group_name=trainer_tp1.group_name
    )
    for b in buckets:
        for t in b.tensors:
            torch.distributed.broadcast(t.contiguous(), src=0, group=trainer_tp1.group)
    first_chunk, stop = threading.Event(), threading.Event()

    def endless_request():
        with requests.post(
            url + "/generate",
            json={
                "text": "long",
                "sampling_params": {"max_new_tokens": 1800, "ignore_eos": True},
                "stream": True,
            },
            stream=True,
            timeout=120,
        ) as resp:
            for _ in resp.iter_lines():
                first_chunk.set()
                if stop.is_set():
                    return  # closing the stream aborts the request

    streaming = pool.submit(endless_request)
    assert first_chunk.wait(60)
    resp = post(
        url,
        "/complete_weights_update",
        {"group_name": trainer_tp1.group_name, "flush_cache": True, "timeout": 1},
    )
    stop.set()
    streaming.result(timeout=60)
    assert resp.status_code == 400, resp.text
    body = resp.json()
    assert body["message"].startswith(
        "timed out after 1s waiting for the in-flight requests to finish before "
        "the cache flush (every bucket received and verified, nothing applied)"
    ), body
    assert not body["applied"] and body["num_buckets_received"] == len(buckets)
    assert checksum(url) == before
    # The session is still open; with the request gone the flush goes through.
    done = post(
        url,
        "/complete_weights_update",
        {"group_name": trainer_tp1.group_name, "flush_cache": True},
    )
    assert done.status_code == 200 and done.json()["applied"], done.text
    assert checksum(url) != before
    update_two_phase(trainer_tp1, model_weights)
    assert checksum(url) == before


def test_flush_cache_with_drain_false_is_refused_before_anything(
    server_tp1, trainer_tp1, model_weights
):
    url = server_tp1.url
    before = checksum(url)
    new = randomized(model_weights, seed=32)
    buckets = plan_buckets(new, 1 << 20)
    client.prepare_weights_update(
        url, [b.meta() for b in buckets], group_name=trainer_tp1.group_name
    )
    for b in buckets:
        for t in b.tensors:
            torch.distributed.broadcast(t.contiguous(), src=0, group=trainer_tp1.group)
    resp = post(
        url,
        "/complete_weights_update",
        {"group_name": trainer_tp1.group_name, "flush_cache": True, "drain": False},
    )
    assert resp.status_code == 400
    assert resp.json()["message"].startswith("flush_cache:")
    assert not resp.json()["applied"]
    assert checksum(url) == before
    # The session is still there: complete it in place.
    done = post(url, "/complete_weights_update", {"group_name": trainer_tp1.group_name})
    assert done.status_code == 200 and done.json()["applied"]
    assert checksum(url) != before
    update_two_phase(trainer_tp1, model_weights)
    assert checksum(url) == before


# --- a session owns its group -----------------------------------------------


def test_destroy_during_an_open_session_aborts_it_and_never_blocks_serving(
    server_tp1, model_weights
):
    url = server_tp1.url
    group = f"destroyed_{free_port()}"
    trainer = GlooTrainer([url], [1], group_name=group)
    before = checksum(url)
    meta = [b.meta() for b in plan_buckets(model_weights, 1 << 20)]
    client.prepare_weights_update(url, meta, group_name=group)
    # The receiver is waiting for bytes that never come; the trainer is alive.
    resp = post(url, "/destroy_weights_update_group", {"group_name": group}, 30)
    assert resp.status_code == 200, resp.text
    assert "aborted" in resp.json()["message"]
    generate(url, "still serving", timeout=30)
    assert no_session_open(url, group)
    assert checksum(url) == before
    # The trainer re-initialises the same name and syncs.
    torch.distributed.destroy_process_group(trainer.group)
    trainer = GlooTrainer([url], [1], group_name=group)
    try:
        # The old trainer's late abort finds no session and leaves the new
        # group alone.
        late = post(url, "/abort_weights_update", {"group_name": group})
        assert late.status_code == 409, late.text
        (result,) = update_two_phase(trainer, randomized(model_weights, seed=41))
        assert result.success and result.applied
        update_two_phase(trainer, model_weights)
        assert checksum(url) == before
    finally:
        trainer.close()


def test_an_open_session_keeps_its_group(server_tp1, trainer_tp1, model_weights):
    url, group = server_tp1.url, trainer_tp1.group_name
    meta = [b.meta() for b in plan_buckets(model_weights, 1 << 20)]
    client.prepare_weights_update(url, meta, group_name=group)
    again = post(
        url,
        "/init_weights_update_group",
        {
            "master_address": "127.0.0.1",
            "master_port": free_port(),
            "rank_offset": 1,
            "world_size": 2,
            "group_name": group,
            "backend": "gloo",
            "timeout": 5,
        },
    )
    assert again.status_code == 400
    assert "a weight update session is open" in again.json()["message"]
    single = post(
        url,
        "/update_weights_from_distributed",
        {
            "names": ["model.norm.weight"],
            "dtypes": ["bfloat16"],
            "shapes": [[64]],
            "group_name": group,
        },
    )
    assert single.status_code == 400
    # Where the scheduler has a weight-update session of its own (0.5.21+),
    # a single-phase update needs it, and it cannot open beside ours.
    message = single.json()["message"]
    if "a weight update session is open" not in message:
        assert "must run between begin_weight_update()" in message, message
        begin = post(url, "/begin_weight_update", {}).json()
        assert not begin["success"], begin
        assert "a two-phase weight update is open" in begin["message"], begin
    aborted = post(url, "/abort_weights_update", {"group_name": group})
    assert aborted.status_code == 200


# --- a memory release (the colocated RL step) and an open session ---------


def release(url: str, endpoint: str, tags: list[str]) -> None:
    resp = post(url, endpoint, {"tags": tags})
    assert resp.status_code == 200, resp.text


@pytest.mark.parametrize("tp", [1, 2])
def test_a_weights_release_aborts_the_open_session_and_prepare_waits_for_resume(
    tp, server_tp1, server_tp2, model_weights
):
    """The staged copy and the apply read and write the served weights, so a
    release of their memory may not run under an open session: it aborts
    it, and no prepare stages against released weights until the resume."""
    url = (server_tp1 if tp == 1 else server_tp2).url
    before = checksum(url)
    meta = [b.meta() for b in plan_buckets(model_weights, 1 << 20)]
    group = f"released_{tp}_{free_port()}"
    trainer = GlooTrainer([url], [tp], group_name=group)
    released = False
    try:
        client.prepare_weights_update(url, meta, group_name=group)
        release(url, "/release_memory_occupation", ["weights"])
        released = True
        # A late call that names no session is told how the last one ended.
        for endpoint in ("/complete_weights_update", "/abort_weights_update"):
            late = post(url, endpoint, {"group_name": group})
            assert late.status_code == 409, late.text
            message = late.json()["message"]
            assert message.startswith("no weight update session is open ("), message
            assert "has ended: aborted: the served weights' memory was " in message
        refused = post(
            url,
            "/prepare_weights_update",
            {"group_name": group, "num_buckets": len(meta), "buckets": meta},
        )
        assert refused.status_code == 409, refused.text
        assert "/release_memory_occupation" in refused.json()["message"]
        release(url, "/resume_memory_occupation", ["weights"])
        released = False
        assert checksum(url) == before
        generate(url, "serving again", timeout=30)
    finally:
        if released:
            post(url, "/resume_memory_occupation", {"tags": ["weights"]})
        trainer.close()
    # The aborted receive may have cost the group: a new one syncs.
    trainer = GlooTrainer([url], [tp], group_name=f"resumed_{tp}_{free_port()}")
    try:
        (result,) = update_two_phase(trainer, randomized(model_weights, seed=43))
        assert result.success and result.applied, result
        assert checksum(url) != before
        update_two_phase(trainer, model_weights)
        assert checksum(url) == before
    finally:
        trainer.close()


def test_a_weights_release_aborts_the_open_session_mid_transfer_and_the_sender_says_so(
    server_tp1, model_weights
):
    """A release while the trainer's buckets are on the wire: the engine
    drops its receive, so the trainer's next broadcast waits out the group's
    timeout; the sync's error then says that the engine's session was
    aborted by the release (not only that the broadcast timed out), that the
    group must be re-initialised, and the old weights serve after resume."""
    url = server_tp1.url
    before = checksum(url)
    released: list[int] = []

    def release_after_the_first_bucket(sent: int, total: int, nbytes: int) -> None:
        if sent == 1 and total > 1:
            release(url, "/release_memory_occupation", ["weights"])
            released.append(sent)

    sender = WeightSender(
        [Engine(url, tp_size=1)],
        master_port=free_port(),
        group_name=f"released_mid_transfer_{free_port()}",
        backend="gloo",
        bucket_bytes=64 << 10,
        timeout=10,  # the trainer's blocked broadcast ends here
    )
    sender.connect()
    try:
        with pytest.raises(SyncError) as failed:
            sender.sync(
                randomized(model_weights, seed=45),
                progress=release_after_the_first_bucket,
            )
    finally:
        if released:
            release(url, "/resume_memory_occupation", ["weights"])
        sender.close()
    assert released == [1]
    error = failed.value
    assert error.step == "broadcast" and not error.group_usable, error
    assert f"session '{sender.session_id}' has ended (aborted: " in str(error)
    assert "memory was released (/release_memory_occupation)" in str(error)
    assert checksum(url) == before
    generate(url, "serving again", timeout=30)


def test_a_kv_cache_release_keeps_the_open_session(
    server_tp1, trainer_tp1, model_weights
):
    url = server_tp1.url
    before = checksum(url)
    released_at: list[int] = []

    def release_kv_cache_once(bucket: int) -> None:
        if bucket == 0:
            release(url, "/release_memory_occupation", ["kv_cache"])
            release(url, "/resume_memory_occupation", ["kv_cache"])
            released_at.append(bucket)

    new = randomized(model_weights, seed=44)
    (result,) = update_two_phase(
        trainer_tp1, new, bucket_bytes=1 << 16, between_buckets=release_kv_cache_once
    )
    assert released_at == [0] and result.num_buckets_received > 1
    assert result.success and result.applied, result
    assert checksum(url) != before
    update_two_phase(trainer_tp1, model_weights)
    assert checksum(url) == before


def test_every_release_gives_back_the_staging_kept_between_updates(
    server_tp1, trainer_tp1, model_weights
):
    """A server keeps an update's staging for the next one (it is then
    reused); a memory release, of the KV cache alone too, frees it for the
    trainer that runs meanwhile, so the next prepare allocates it anew."""
    url, group = server_tp1.url, trainer_tp1.group_name
    buckets = plan_buckets(model_weights, 1 << 20)
    meta = [b.meta() for b in buckets]
    before = checksum(url)

    def staging_reused_at_prepare() -> bool:
        """An update with the served weights; whether its prepare reused."""
        ready = post(
            url,
            "/prepare_weights_update",
            {
                "group_name": group,
                "num_buckets": len(meta),
                "buckets": meta,
                "load_format": "flattened_bucket",
            },
        )
        assert ready.status_code == 200, ready.text
        broadcast_buckets(buckets, trainer_tp1.group)
        done = post(url, "/complete_weights_update", {"group_name": group})
        assert done.status_code == 200 and done.json()["applied"], done.text
        return ready.json()["staging_reused"]

    staging_reused_at_prepare()
    assert staging_reused_at_prepare() is True
    release(url, "/release_memory_occupation", ["kv_cache"])
    release(url, "/resume_memory_occupation", ["kv_cache"])
    assert staging_reused_at_prepare() is False
    assert staging_reused_at_prepare() is True
    assert checksum(url) == before


# --- an unknown group is an error for the caller, not the end of the server


@pytest.mark.parametrize("tp", [1, 2])
def test_unknown_or_empty_group_is_400_and_the_server_lives(
    tp, server_tp1, server_tp2, model_weights
):
    server = server_tp1 if tp == 1 else server_tp2
    update = post(
        server.url,
        "/update_weights_from_distributed",
        {
            "names": ["model.norm.weight"],
            "dtypes": ["bfloat16"],
            "shapes": [[64]],
            "group_name": "no-such-group",
        },
    )
    assert update.status_code == 400
    assert "group_name: no update group 'no-such-group'" in update.json()["message"]
    empty = post(
        server.url,
        "/init_weights_update_group",
        {
            "master_address": "127.0.0.1",
            "master_port": free_port(),
            "rank_offset": 1,
            "world_size": 1 + tp,
            "group_name": "",
            "backend": "gloo",
        },
    )
    assert empty.status_code == 400
    assert "group_name: must not be empty" in empty.json()["message"]
    destroy = post(
        server.url, "/destroy_weights_update_group", {"group_name": "no-such-group"}
    )
    assert destroy.status_code == 400
    assert "group_name: no update group 'no-such-group'" in destroy.json()["message"]
    assert server.alive()
    generate(server.url, "alive")
    trainer = GlooTrainer([server.url], [tp], group_name=f"after_unknown_{tp}")
    try:
        before = checksum(server.url)
        (result,) = update_two_phase(trainer, randomized(model_weights, seed=51))
        assert result.success and result.applied
        update_two_phase(trainer, model_weights)
        assert checksum(server.url) == before
    finally:
        trainer.close()


def test_a_taken_group_name_is_refused_at_once(server_tp1, trainer_tp1):
    """Initialising a live group's name again would wait out a rendezvous and
    then drop the live group."""
    url, group = server_tp1.url, trainer_tp1.group_name
    again = post(
        url,
        "/init_weights_update_group",
        {
            "master_address": "127.0.0.1",
            "master_port": free_port(),
            "rank_offset": 1,
            "world_size": 2,
            "group_name": group,
            "backend": "gloo",
            "timeout": 60,
        },
    )
    assert again.status_code == 400
    assert f"an update group '{group}' already exists" in again.json()["message"]
    # No session: the abort says so, and that the group is still there.
    aborted = post(url, "/abort_weights_update", {"group_name": group})
    assert aborted.status_code == 409 and aborted.json()["group_usable"] is True
    gone = post(url, "/abort_weights_update", {"group_name": "never-made"})
    assert gone.status_code == 409 and gone.json()["group_usable"] is False


def test_concurrent_completes_apply_once_and_never_answer_500(
    server_tp1, trainer_tp1, model_weights
):
    """A trainer that retries complete while its first call still waits for
    the bytes: one call applies, the others find the session ended (409);
    none is a 5xx (upstream's communicator asserted on this hand-off)."""
    url, group = server_tp1.url, trainer_tp1.group_name
    before = checksum(url)
    buckets = plan_buckets(model_weights, 64 << 10)
    meta = [b.meta(digest_tensors(b.tensors)) for b in buckets]
    client.prepare_weights_update(
        url, meta, group_name=group, load_format="flattened_bucket"
    )
    body = {"group_name": group, "timeout": 120}
    completes = [
        pool.submit(post, url, "/complete_weights_update", body, 180) for _ in range(3)
    ]

    def waiting() -> float:
        in_flight = "sglang:weight_update_operations_in_flight"
        return total(scrape(url), in_flight, operation="complete_weights_update")

    deadline = time.monotonic() + 60
    while waiting() < 3:
        assert time.monotonic() < deadline, "the three completes never all waited"
        time.sleep(0.05)
    for b in buckets:
        flat = torch.cat([t.reshape(-1).view(torch.uint8) for t in b.tensors])
        torch.distributed.broadcast(flat, src=0, group=trainer_tp1.group)
    answers = [f.result(timeout=180) for f in completes]

    statuses = sorted(a.status_code for a in answers)
    assert statuses == [200, 409, 409], [a.text for a in answers]
    (applied,) = [a.json() for a in answers if a.status_code == 200]
    assert applied["success"] and applied["applied"]
    for late in (a.json() for a in answers if a.status_code == 409):
        # The session it waited for (named since its first answer) ended,
        # applied by the other call.
        assert "has ended" in late["message"] and "applied" in late["message"]
    assert checksum(url) == before
    assert no_session_open(url, group)
