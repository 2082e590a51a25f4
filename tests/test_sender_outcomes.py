"""WeightSender's words match what happened, against a real server (TP 1,
trainer over gloo): a sync that did not apply everywhere raises SyncError
naming the engines (the outcomes attached), every session it may have left
open is aborted so that the next sync goes through, and without digests a
sync says that the bytes arrived, not that they were verified."""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import logging
import threading
import time
from typing import Iterator

import pytest
import requests

import rlsync.sender as sender_module
from harness import cpu_sglang
from harness.weights import randomized
from rlsync import client
from rlsync.digest import digest_bytes
from rlsync.sender import Engine, SyncError, WeightSender
from rlsync.stream import specs_of

# Seconds every wait of a sync may take, but for the one that must time out.
TIMEOUT = 60.0
pool = cf.ThreadPoolExecutor(max_workers=2)


def checksum(url: str) -> str:
    return client.weights_checksum(url, timeout=60)["checksum"]


def no_session_open(sender: WeightSender) -> bool:
    """An abort of the sender's group finds nothing to abort (409)."""
    url = sender.engines[0].url
    try:
        client.abort_weights_update(url, group_name=sender.group_name, timeout=60)
    except client.EngineError as e:
        return e.status == 409
    return False  # it aborted a session that was left open


def make_sender(url: str, **kwargs) -> WeightSender:
    sender = WeightSender(
        [Engine(url, 1)],
        master_port=cpu_sglang.free_port(),
        group_name=f"outcomes_{cpu_sglang.free_port()}",
        backend="gloo",
        bucket_bytes=64 << 10,
        timeout=TIMEOUT,
        **kwargs,
    )
    sender.connect()
    return sender


@pytest.fixture
def sender(server_tp1) -> Iterator[WeightSender]:
    sender = make_sender(server_tp1.url)
    yield sender
    sender.close()


@contextlib.contextmanager
def request_in_flight(url: str) -> Iterator[cf.Future]:
    """A long streaming /generate, in flight until the block ends (closing
    the stream aborts it)."""
    first_chunk, stop = threading.Event(), threading.Event()

    def endless_request() -> None:
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
                    return

    streaming = pool.submit(endless_request)
    try:
        assert first_chunk.wait(60), "the long request did not start"
        yield streaming
    finally:
        stop.set()
        streaming.result(timeout=60)
        # A closed stream leaves its request running until the server
        # notices; abort it and wait until nothing runs, so that what comes
        # next (a cache flush, a reload from disk) meets an idle server.
        abort = {"rid": "", "abort_all": True}
        requests.post(url + "/abort_request", json=abort, timeout=30)
        assert wait_for_no_running_request(url), "the long request kept running"


def wait_for_no_running_request(url: str, timeout: float = 60.0) -> bool:
    """Whether every scheduler reports no request running or waiting (its
    own count: /get_load where the server has it, else /v1/loads) before
    `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        resp = requests.get(url + "/get_load", timeout=30)
        if resp.status_code == 404:
            loads = requests.get(url + "/v1/loads", timeout=30).json()["loads"]
            busy = [d["num_running_reqs"] + d["num_waiting_reqs"] for d in loads]
        else:
            busy = [d["num_reqs"] + d["num_waiting_reqs"] for d in resp.json()]
        if not any(busy):
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("atomic", [False, True])
def test_a_final_complete_that_fails_raises_and_the_next_sync_goes_through(
    sender, server_tp1, model_weights, atomic
):
    """A final complete that fails with the session verified and open (a
    cache flush asked for while a request is in flight and generation is
    paused in place: the engine refuses it and keeps the session; the
    drain's own timeout is tested in test_update_sequences). The sync
    raises, naming the engine, aborts that session, and the next sync
    applies instead of meeting a 409 at prepare."""
    url = server_tp1.url
    before = checksum(url)
    with request_in_flight(url) as streaming:
        # Paused in place, the request stays in flight however fast this
        # machine generates (a drain timed against its speed once passed).
        client.pause_generation(url, mode="in_place")
        try:
            with pytest.raises(SyncError) as err:
                sender.sync(
                    randomized(model_weights, 91),
                    weight_version="never",
                    atomic=atomic,
                    flush_cache=True,
                )
        finally:
            client.continue_generation(url)
        assert not streaming.done(), "the request ended before the complete"
    message = str(err.value)
    assert err.value.step == "apply", message
    assert f"1 of 1 engine(s) did not apply: {url}: " in message
    assert "a cache flush needs them finished; nothing applied" in message
    assert "applied on: none" in message and "their sessions aborted (ok)" in message
    result = err.value.result
    assert result is not None and not result.success
    [outcome] = result.engines
    assert outcome.url == url and not outcome.answered and not outcome.applied
    assert result.http_calls == (4 if atomic else 3)  # and the abort
    assert checksum(url) == before, "nothing may have applied"
    assert client.get_weight_version(url) != "never"
    assert no_session_open(sender), "the failed sync left its session open"

    # The next sync meets no stale session: it prepares, sends and applies.
    result = sender.sync(model_weights, weight_version="after-failure", atomic=atomic)
    assert result.success and result.verified
    assert client.get_weight_version(url) == "after-failure"
    assert checksum(url) == before


def malformed(flat) -> str:
    return "psum61:not-a-digest"


def wrong(flat) -> str:
    """A well-formed digest, of other bytes."""
    return digest_bytes(flat[1:])


@pytest.mark.needs("shard_staging")
@pytest.mark.parametrize("digest", [malformed, wrong])
@pytest.mark.parametrize("atomic, step", [(False, "apply"), (True, "verify")])
def test_a_complete_that_refuses_the_digests_raises_and_closes_the_session(
    sender, server_tp1, model_weights, monkeypatch, digest, atomic, step
):
    """The trainer sends digests the engine refuses after every byte arrived
    (deferred digests, with the first complete): a malformed one keeps the
    session open (400 naming `digests`), a wrong one discards it (the abort
    then finds none: a 409, which is fine). Either way the sync raises at the
    complete it failed, naming the engine, no session is left open and the
    next sync goes through."""
    url = server_tp1.url
    before = checksum(url)
    new = randomized(model_weights, 92)
    monkeypatch.setattr(sender_module, "digest_bytes", digest)
    with pytest.raises(SyncError) as err:
        sender.sync_stream(
            specs_of(dict(new)),
            (t for _, t in new),
            weight_version="never",
            atomic=atomic,
        )
    monkeypatch.undo()
    message = str(err.value)
    assert err.value.step == step, message
    assert no_session_open(sender), "the failed sync left its session open"
    assert url in message, message
    why = {malformed: "digests[0]: expected", wrong: "verification failed"}[digest]
    assert why in message, message
    if step == "apply":
        assert "did not apply" in message and "applied on: none" in message
    else:
        assert "not ready to apply" in message and "no engine applied" in message
    assert message.endswith("(ok)"), "the abort closed the session, or found none"
    [outcome] = err.value.result.engines
    assert not outcome.answered and not outcome.applied and not outcome.ready_to_apply
    assert checksum(url) == before
    result = sender.sync(model_weights, weight_version="after-digests")
    assert result.success and client.get_weight_version(url) == "after-digests"
    assert checksum(url) == before


@pytest.mark.needs("shard_staging")
def test_a_verify_only_sync_that_fails_raises_and_leaves_no_session(
    sender, server_tp1, model_weights, monkeypatch
):
    """`apply=False` must end with every engine ready to apply; one that is
    not is a SyncError at "verify", and no session stays open (the ready
    engines' neither: nothing is to apply)."""
    url = server_tp1.url
    before = checksum(url)
    new = randomized(model_weights, 93)
    monkeypatch.setattr(sender_module, "digest_bytes", malformed)
    with pytest.raises(SyncError) as err:
        sender.sync_stream(specs_of(dict(new)), (t for _, t in new), apply=False)
    monkeypatch.undo()
    assert err.value.step == "verify" and url in str(err.value)
    assert "nothing applied, every engine aborted (ok)" in str(err.value)
    assert not err.value.result.received
    assert no_session_open(sender)
    assert checksum(url) == before
    assert sender.sync(model_weights).success
    assert checksum(url) == before


def test_an_engine_nobody_answers_fails_the_prepare_and_the_other_is_aborted(
    server_tp1, model_weights
):
    """A second engine where nothing listens (a host that went away after
    connect): the prepare fails naming it, and the engine that prepared is
    aborted (it had answered ready, so bytes may be on the wire: its group
    is given up and the error says so); the unreachable one is
    not called again. After a reconnect the next sync goes through."""
    url = server_tp1.url
    before = checksum(url)
    dead = f"http://127.0.0.1:{cpu_sglang.free_port()}"
    sender = make_sender(url)
    try:
        sender.engines.append(Engine(dead, 1))
        with pytest.raises(SyncError) as err:
            sender.sync(randomized(model_weights, 94), weight_version="never")
        sender.engines.pop()
        message = str(err.value)
        assert err.value.step == "prepare" and err.value.result is None
        assert message.startswith(f"prepare: {dead}: ") and "ConnectError" in message
        assert message.endswith(
            f"(others aborted: {url}: group must be re-initialised)"
        ), message
        assert err.value.group_usable is False
        assert "abort failed" not in message, "the unreachable engine was called"
        assert no_session_open(sender)
        assert checksum(url) == before
    finally:
        sender.close()
    again = make_sender(url)
    try:
        assert again.sync(model_weights).success
    finally:
        again.close()
    assert checksum(url) == before


def test_without_digests_a_sync_is_received_not_verified(
    server_tp1, model_weights, caplog
):
    """`WeightSender(digests=False)`: the engine applies once every byte
    arrived (counted), but nothing compared their content: `verified` is
    False, `received` True. An atomic sync without digests is allowed, with
    one warning per sender."""
    url = server_tp1.url
    before = checksum(url)
    sender = make_sender(url, digests=False)
    caplog.set_level(logging.WARNING, logger="rlsync.sender")
    try:
        result = sender.sync(
            randomized(model_weights, 95), weight_version="no-digests", atomic=True
        )
        assert result.success and result.received and not result.verified
        assert not result.digests
        [outcome] = result.engines
        assert outcome.answered and outcome.applied and outcome.received
        assert outcome.weight_version == "no-digests"
        assert client.get_weight_version(url) == "no-digests"
        assert checksum(url) != before
        restored = sender.sync(model_weights, atomic=True)
        assert restored.received and not restored.verified
    finally:
        sender.close()
    assert checksum(url) == before
    warned = [r for r in caplog.records if "digests=False" in r.getMessage()]
    assert len(warned) == 1, [r.getMessage() for r in caplog.records]


def test_engine_outcome_success_is_a_deprecated_alias_of_answered(
    sender, model_weights
):
    result = sender.sync(model_weights)
    assert result.success and result.verified and result.received
    [outcome] = result.engines
    with pytest.warns(DeprecationWarning, match="answered"):
        assert outcome.success is outcome.answered is True


def cached_tokens(url: str, text: str) -> int:
    """The prompt tokens a one-token request of `text` took from the prefix
    cache."""
    body = {"text": text, "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
    resp = requests.post(url + "/generate", json=body, timeout=60)
    assert resp.status_code == 200, resp.text
    return resp.json()["meta_info"]["cached_tokens"]


def test_no_request_after_a_sync_reuses_the_old_weights_kv_unless_it_had_to(
    server_tp1, sender, model_weights
):
    """By default each engine flushes its prefix cache after the apply when
    no request is in flight, so a request after the sync computes its prefix
    on the new weights; with a request in flight (it cannot be flushed under
    it) or with flush_cache=False the cache stays, and the answer says so."""
    url = server_tp1.url
    assert wait_for_no_running_request(url)
    prompt = "A prefix cached under the weights of its time. " * 4
    cached_tokens(url, prompt)
    assert cached_tokens(url, prompt) > 0  # control: the prefix is cached

    result = sender.sync(randomized(model_weights, 61), weight_version="flushed")
    (answer,) = [engine.answer for engine in result.engines]
    assert result.success and answer.applied and answer.cache_flushed, answer
    assert "and flushed the cache" in answer.message
    assert cached_tokens(url, prompt) == 0

    result = sender.sync(model_weights, weight_version="kept", flush_cache=False)
    (answer,) = [engine.answer for engine in result.engines]
    assert result.success and answer.applied and not answer.cache_flushed, answer
    assert cached_tokens(url, prompt) > 0

    with request_in_flight(url) as streaming:
        # Paused in place, the request stays in flight at the apply.
        client.pause_generation(url, mode="in_place")
        try:
            result = sender.sync(randomized(model_weights, 62), weight_version="busy")
        finally:
            client.continue_generation(url)
        assert not streaming.done(), "the request ended before the complete"
    (answer,) = [engine.answer for engine in result.engines]
    assert result.success and answer.applied and not answer.cache_flushed, answer
    assert cached_tokens(url, prompt) > 0
    sender.sync(model_weights, weight_version="restored")
