"""Faults on one TP rank of a real TP 2 server (harness.server_faults), with
WeightSender over gloo: a two-phase apply answers what every rank did, and
a sync that fails while its trainer is alive (an engine refuses prepare, the
trainer's tensor stream breaks) aborts in band, so every engine's update
group stays usable and the next sync needs no new group."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest
import torch
import torch.distributed as dist

from harness.cpu_sglang import Server, free_port
from harness.server_faults import fault_env
from harness.trainer import GlooTrainer, gloo_sender
from harness.weights import Weights, perturbed
from rlsync import client
from rlsync.bucket_header import DATA, make_header
from rlsync.protocol import BucketMetadata
from rlsync.sender import Engine, SyncError, WeightSender
from rlsync.stream import specs_of

NAME = "model.norm.weight"


@pytest.fixture(scope="module")
def refusal_flag(tmp_path_factory) -> Path:
    """While this file exists, TP rank 1 of the fault server refuses prepare."""
    return tmp_path_factory.mktemp("faults") / "refuse-staging"


@pytest.fixture(scope="module")
def fault_server(start_module_server, refusal_flag) -> Server:
    env = fault_env(
        refusal_flag.parent,
        flush_cache_fails_on=[1],
        refuse_staging_on=[1],
        refuse_staging_while=refusal_flag,
    )
    return start_module_server(tp=2, env=env)


def serves(url: str, weights: Weights) -> bool:
    served = client.get_weights_by_name(url, NAME, truncate_size=10**6)
    sent = dict(weights)[NAME]
    return torch.equal(torch.tensor(served).to(sent.dtype), sent)


@pytest.fixture
def two_engines(fault_server, server_tp1) -> Iterator[WeightSender]:
    """One sender, one group: the fault server (TP 2) and the shared TP 1."""
    sender = WeightSender(
        [Engine(fault_server.url, tp_size=2), Engine(server_tp1.url, tp_size=1)],
        master_port=free_port(),
        group_name=f"in_band_{free_port()}",
        backend="gloo",
        bucket_bytes=64 << 10,
        timeout=120,
    )
    sender.connect()
    yield sender
    sender.close()


@pytest.mark.needs("apply_outcome_of_every_rank")
def test_a_cache_flush_failing_on_one_rank_is_an_apply_with_its_version(
    fault_server, model_weights
):
    """TP rank 1's cache flush fails, rank 0's succeeds: every rank applied,
    so the answer (an error, for the flush) says applied, the server records
    the version and serves the new weights, and the failure names rank 1
    (the answering rank 0 used to say "not applied" and drop the version)."""
    sender = gloo_sender(fault_server.url, 2, 64 << 10, "flush_fault")
    try:
        new = perturbed(model_weights, seed=5)
        # Applied everywhere: no SyncError; the engine's error answer is kept.
        result = sender.sync(new, weight_version="flush-fault", flush_cache=True)
        (outcome,) = result.engines
        assert outcome.applied and not outcome.answered, outcome
        assert outcome.weight_version == "flush-fault", outcome
        ranks = outcome.answer.rank_results
        assert [(r.rank, r.applied, r.success) for r in ranks] == [
            (0, True, True),
            (1, True, False),
        ], ranks
        assert "rank(s) 1" in outcome.message and "cache flush" in outcome.message
        assert "mixed" not in outcome.message
        assert client.get_weight_version(fault_server.url) == "flush-fault"
        assert serves(fault_server.url, new)
    finally:
        sender.close()


@pytest.mark.needs("in_band_abort")
def test_a_refused_prepare_keeps_every_engines_group(
    two_engines, fault_server, server_tp1, refusal_flag, model_weights
):
    """TP rank 1 of one engine refuses prepare (413): the sender aborts in
    band, nothing applies anywhere, both groups stay usable, and the next
    sync through the same group applies on both engines."""
    sender, new = two_engines, perturbed(model_weights, seed=21)
    refusal_flag.touch()
    try:
        with pytest.raises(SyncError) as raised:
            sender.sync(new, weight_version="refused")
    finally:
        refusal_flag.unlink()
    message = str(raised.value)
    assert raised.value.step == "prepare" and "HTTP 413" in message, message
    assert "staging refused on TP rank 1" in message, message
    assert "every engine aborted: groups usable" in message, message
    for url in (fault_server.url, server_tp1.url):
        assert not serves(url, new) and client.get_weight_version(url) != "refused"

    result = sender.sync(new, weight_version="after-refusal")
    assert result.success, result.engines
    for url in (fault_server.url, server_tp1.url):
        assert serves(url, new)
        assert client.get_weight_version(url) == "after-refusal"
    sender.sync(model_weights, weight_version="restored")


@pytest.mark.needs("in_band_abort")
def test_a_stream_that_fails_mid_sync_aborts_in_band(
    two_engines, fault_server, server_tp1, model_weights
):
    """The trainer's tensor generator raises after a few buckets went out:
    the sender aborts in band, the old weights keep serving, the groups
    stay usable and the next sync applies."""
    sender, new = two_engines, perturbed(model_weights, seed=22)
    specs = specs_of(new)

    def breaks_after_a_few():
        for i, (_, tensor) in enumerate(new):
            if i == len(new) // 2:
                raise RuntimeError("the trainer's gather failed")
            yield tensor

    with pytest.raises(SyncError) as raised:
        sender.sync_stream(specs, breaks_after_a_few(), weight_version="broken")
    message = str(raised.value)
    assert raised.value.step == "broadcast", message
    assert "the trainer's gather failed" in message, message
    assert "every engine aborted (groups usable)" in message, message
    for url in (fault_server.url, server_tp1.url):
        assert not serves(url, new) and client.get_weight_version(url) != "broken"

    result = sender.sync_stream(specs, (t for _, t in new), weight_version="whole")
    assert result.success, result.engines
    assert all(serves(url, new) for url in (fault_server.url, server_tp1.url))
    sender.sync(model_weights, weight_version="restored")


@pytest.fixture
def raw_trainer(server_tp1) -> Iterator[GlooTrainer]:
    """Rank 0 of a group with the shared TP 1 server, sending by hand."""
    trainer = GlooTrainer([server_tp1.url], [1], group_name=f"raw_{free_port()}")
    yield trainer
    trainer.close()


def framed_prepare(trainer: GlooTrainer, weights: Weights, session_id: str):
    return client.prepare_weights_update(
        trainer.urls[0],
        [BucketMetadata([NAME], ["bfloat16"], [list(dict(weights)[NAME].shape)])],
        group_name=trainer.group_name,
        load_format="flattened_bucket",
        session_id=session_id,
        framed=True,
    )


def abort_saying_a_header_was_sent(trainer: GlooTrainer, session_id: str):
    return client.abort_weights_update(
        trainer.urls[0],
        group_name=trainer.group_name,
        session_id=session_id,
        abort_header_sent=True,
    )


@pytest.mark.needs("in_band_abort")
def test_a_refused_session_that_gets_a_data_header_gives_the_group_up(
    raw_trainer, model_weights
):
    """A buggy sender broadcasts bucket 0's header to an engine that refused
    the prepare: no rank there takes the bucket that would follow, so the
    group is out of step and the abort says so (it was reported usable)."""
    url, session_id = raw_trainer.urls[0], client.new_session_id()
    with pytest.raises(client.EngineError) as refused:
        client.prepare_weights_update(
            url,
            [BucketMetadata(["model.no_such.weight"], ["bfloat16"], [[4]])],
            group_name=raw_trainer.group_name,
            session_id=session_id,
            framed=True,
        )
    assert refused.value.body["awaits_abort_header"] is True, refused.value.body
    header = make_header(session_id, 0, DATA, "cpu")
    dist.broadcast(header, src=0, group=raw_trainer.group)
    answer = abort_saying_a_header_was_sent(raw_trainer, session_id)
    assert answer.success and answer.group_usable is False, answer


@pytest.mark.needs("in_band_abort")
def test_an_abort_header_no_receive_took_gives_the_group_up(raw_trainer, model_weights):
    """Every bucket arrived, so no receive waits for a header; an abort that
    says a header was sent cannot have it taken: the group is reported out
    of step (it was reported usable, with a stray header on the wire)."""
    url, session_id = raw_trainer.urls[0], client.new_session_id()
    framed_prepare(raw_trainer, model_weights, session_id)
    tensor = dict(model_weights)[NAME].contiguous()
    dist.broadcast(
        make_header(session_id, 0, DATA, "cpu"), src=0, group=raw_trainer.group
    )
    dist.broadcast(tensor.view(torch.uint8), src=0, group=raw_trainer.group)
    answer = abort_saying_a_header_was_sent(raw_trainer, session_id)
    assert answer.success and answer.group_usable is False, answer
    assert client.get_weight_version(url) != "raw", "nothing applied"


@pytest.mark.needs("in_band_abort")
def test_a_sender_gone_after_a_header_leaves_the_group_given_up(
    raw_trainer, model_weights
):
    """The sender announces bucket 0 and goes silent (as a killed trainer
    does): the receive for bucket 0 stays posted, so an abort without the
    abort header gives the group up, and the old weights keep serving."""
    url, session_id = raw_trainer.urls[0], client.new_session_id()
    before = client.get_weights_by_name(url, NAME, truncate_size=10**6)
    framed_prepare(raw_trainer, model_weights, session_id)
    header = make_header(session_id, 0, DATA, "cpu")
    dist.broadcast(header, src=0, group=raw_trainer.group)
    answer = client.abort_weights_update(
        url, group_name=raw_trainer.group_name, session_id=session_id
    )
    assert answer.success and answer.group_usable is False, answer
    assert client.get_weights_by_name(url, NAME, truncate_size=10**6) == before
