"""WeightSender's per-tensor layout and its verify-only sync, against a real
TP 1 + TP 2 pair in one gloo group: the same sender the harness pushes with."""

from __future__ import annotations

import pytest

from harness.cpu_sglang import free_port
from harness.weights import greedy as served_greedy
from harness.weights import randomized
from rlsync import client
from rlsync.sender import FLATTENED, Engine, WeightSender

PROMPT = "Options"


def greedy(url: str) -> list[int]:
    return served_greedy(url, PROMPT, 10)


@pytest.fixture
def pair(server_tp1, server_tp2):
    sender = WeightSender(
        [Engine(server_tp1.url, 1), Engine(server_tp2.url, 2)],
        master_port=free_port(),
        group_name=f"options_{free_port()}",
        backend="gloo",
        bucket_bytes=64 << 10,
    )
    sender.connect()
    yield sender
    sender.close()


def test_load_format_is_checked_at_construction():
    with pytest.raises(AssertionError, match="load_format"):
        WeightSender([Engine("http://127.0.0.1:1")], master_port=1, load_format="x")


def test_per_tensor_layout_applies_and_answers_each_engines_ranks(pair, model_weights):
    urls = [e.url for e in pair.engines]
    before = [greedy(u) for u in urls]
    pair.load_format = None
    result = pair.sync(randomized(model_weights, 61), weight_version="per-tensor")
    assert result.success and result.verified
    answers = [e.answer for e in result.engines]
    assert [[r.rank for r in a.rank_results] for a in answers] == [[0], [0, 1]]
    assert all(a.weight_version == "per-tensor" for a in answers)
    changed = [greedy(u) for u in urls]
    assert changed[0] == changed[1] != before[0]
    pair.load_format = FLATTENED
    assert pair.sync(model_weights).success
    assert [greedy(u) for u in urls] == before


def test_verify_only_keeps_old_weights_until_the_engines_apply(pair, model_weights):
    urls = [e.url for e in pair.engines]
    before = [greedy(u) for u in urls]
    result = pair.sync(randomized(model_weights, 62), apply=False)
    assert result.verified and not result.success
    assert all(e.answer.ready_to_apply and not e.applied for e in result.engines)
    assert [greedy(u) for u in urls] == before, "a verify-only sync applied"
    for url in urls:  # the sessions stayed open: apply them now
        assert client.complete_weights_update(url, group_name=pair.group_name).applied
    assert greedy(urls[0]) == greedy(urls[1]) != before[0]
    assert pair.sync(model_weights).success
    assert [greedy(u) for u in urls] == before
