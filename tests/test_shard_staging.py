"""Atomic updates for a model that does not fit twice: each rank stages its shard.

One TP 2 server of the demo-size Llama (51 MB) whose staging budget is 80 %
of the model, with the staged copy in host memory
(`--weight-update-staging host`). Staging the whole update on every rank
(what the series did before) is a 413 there; a rank's own shard plus two
bucket buffers fits. The trainer streams: metadata up front, each tensor made
on demand by a generator, each bucket's digest sent with complete.

The oracle is upstream's own disk loader: the same weights saved as
safetensors and loaded with `/update_weights_from_disk` must give the same
weights checksum.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest
import requests
import torch
from safetensors.torch import load_file

from harness import cpu_sglang
from harness.metrics import scrape, total
from harness.tiny_model import make_tiny_model
from harness.trainer import gloo_sender
from harness.weights import Weights, perturbed, save_checkpoint
from rlsync import client
from rlsync.planner import plan_buckets
from rlsync.sender import SyncError, WeightSender, broadcast_buckets
from rlsync.stream import specs_of

pytestmark = [pytest.mark.server, pytest.mark.needs("shard_staging")]

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "build"
BUCKET_BYTES = 2 << 20
BUDGET_SHARE = 0.8


def model_bytes(weights: Weights) -> int:
    return sum(t.numel() * t.element_size() for _, t in weights)


@pytest.fixture(scope="module")
def demo_model() -> Path:
    return make_tiny_model(BUILD / "models", "demo")


@pytest.fixture(scope="module")
def original(demo_model: Path) -> Weights:
    return list(load_file(str(demo_model / "model.safetensors")).items())


@pytest.fixture(scope="module")
def budget_server(request, demo_model: Path, original: Weights) -> cpu_sglang.Server:
    budget_mb = BUDGET_SHARE * model_bytes(original) / 2**20
    server = cpu_sglang.launch(
        demo_model,
        BUILD / "logs" / f"shard-staging-tp2-{cpu_sglang.free_port()}.log",
        tp=2,
        extra_args=[
            "--enable-metrics",
            "--weight-update-staging",
            "host",
            "--weight-update-staging-budget-mb",
            f"{budget_mb:.3f}",
        ],
    )
    request.addfinalizer(server.stop)
    return server


@pytest.fixture
def sender(budget_server: cpu_sglang.Server) -> Iterator[WeightSender]:
    sender = gloo_sender(budget_server.url, 2, BUCKET_BYTES, "shard_staging")
    yield sender
    sender.close()


def checksum(url: str) -> str:
    return client.weights_checksum(url, timeout=120)["checksum"]


def made_on_demand(weights: Weights, alive: list[int]) -> Iterator[torch.Tensor]:
    """Each tensor as a fresh copy made when the sender asks for it."""
    for _, tensor in weights:
        copy = tensor.clone()
        alive.append(copy.numel())
        yield copy


def disk_load(url: str, src: Path, dest: Path, weights: Weights) -> str:
    """Upstream's own loader over `weights`: the checksum it gives."""
    client.update_weights_from_disk(url, str(save_checkpoint(src, dest, weights)))
    return checksum(url)


def test_a_model_that_does_not_fit_twice_syncs_bit_exact_against_disk_load(
    budget_server, sender, demo_model, original, tmp_path
):
    url = budget_server.url
    served = checksum(url)
    new = perturbed(original, seed=25)
    made: list[int] = []
    result = sender.sync_stream(
        specs_of(new), made_on_demand(new, made), weight_version="streamed", atomic=True
    )
    assert result.success, result.engines
    assert len(made) == len(new), "every tensor was made once, on demand"
    assert result.bytes == model_bytes(new)
    streamed = checksum(url)
    assert streamed != served
    assert client.get_weight_version(url) == "streamed"

    oracle = disk_load(url, demo_model, tmp_path / "new", new)
    assert streamed == oracle, "the staged sync equals upstream's disk load"
    client.update_weights_from_disk(url, str(demo_model))
    assert checksum(url) == served


def test_staging_is_a_shard_plus_two_buckets_and_reported(
    budget_server, sender, original
):
    """The prepare answer's figure, per rank: at most 0.55 x the model plus
    two bucket buffers (each rank keeps half of every sharded tensor)."""
    url = budget_server.url
    buckets = plan_buckets(original, BUCKET_BYTES)
    answer = client.prepare_weights_update(
        url,
        [b.metadata() for b in buckets],
        group_name=sender.group_name,
        load_format="flattened_bucket",
    )
    try:
        ring = 2 * max(b.nbytes for b in buckets)
        per_rank = [r["staging_bytes"] for r in answer.extra["rank_staging_bytes"]]
        assert len(per_rank) == 2, answer.extra
        assert answer.staging_bytes == max(per_rank)
        assert max(per_rank) <= 0.55 * model_bytes(original) + ring, per_rank
        assert max(per_rank) < BUDGET_SHARE * model_bytes(original)
        gauge = total(scrape(url), "sglang:weight_sync_staging_bytes")
        assert gauge == per_rank[0], "TP rank 0's staging, on /metrics"
    finally:
        # The served weights themselves: the session ends as it began.
        broadcast_buckets(buckets, sender.group)
        client.complete_weights_update(url, group_name=sender.group_name)


def test_partial_update_of_one_fused_slice_keeps_every_other_byte(
    budget_server, sender, demo_model, original, tmp_path
):
    """k_proj is one slice of the fused qkv_proj on each rank: q and v keep
    their bytes, and every other parameter too (checksum over all of them
    equals a disk load of the original with k_proj alone replaced)."""
    url = budget_server.url
    served = checksum(url)
    name = "model.layers.3.self_attn.k_proj.weight"
    tensor = dict(original)[name]
    new_k = (tensor.float() + 0.05).to(tensor.dtype)
    result = sender.sync_stream([(name, tensor.dtype, tensor.shape)], iter([new_k]))
    assert result.success, result.engines
    partial = checksum(url)
    assert partial != served
    replaced = [(n, new_k if n == name else t) for n, t in original]
    assert partial == disk_load(url, demo_model, tmp_path / "k", replaced)
    client.update_weights_from_disk(url, str(demo_model))
    assert checksum(url) == served


def test_verified_but_not_applied_leaves_the_served_weights_untouched(
    budget_server, sender, original
):
    """The loader wrote every bucket into the staged copy, not the model:
    until the apply the checksum is the old one."""
    url = budget_server.url
    served = checksum(url)
    new = perturbed(original, seed=7)
    result = sender.sync_stream(specs_of(new), (t for _, t in new), apply=False)
    assert result.verified, result.engines
    assert checksum(url) == served, "verified, not applied: old weights"
    applied = client.complete_weights_update(url, group_name=sender.group_name)
    assert applied.applied
    assert checksum(url) != served
    sender.sync_stream(specs_of(original), (t for _, t in original))
    assert checksum(url) == served


def test_deferred_digests_are_required_and_checked_at_complete(
    budget_server, sender, original
):
    """A session prepared with defer_digests applies nothing without the
    digests, or with a wrong one; the old weights keep serving."""
    url, group = budget_server.url, sender.group_name
    served = checksum(url)
    new = perturbed(original, seed=3)
    buckets = plan_buckets(new, BUCKET_BYTES)
    client.prepare_weights_update(
        url,
        [b.metadata() for b in buckets],
        group_name=group,
        load_format="flattened_bucket",
        defer_digests=True,
    )
    broadcast_buckets(buckets, sender.group)
    missing = requests.post(
        url + "/complete_weights_update", json={"group_name": group}, timeout=120
    )
    assert missing.status_code == 400, missing.text
    assert "digests: the session was prepared with defer_digests" in missing.text
    short = requests.post(
        url + "/complete_weights_update",
        json={"group_name": group, "digests": ["psum61:0:0"]},
        timeout=120,
    )
    assert short.status_code == 400 and "digests" in short.json()["message"]
    wrong = [f"psum61:{i:016x}:{i:016x}" for i in range(len(buckets))]
    refused = requests.post(
        url + "/complete_weights_update",
        json={"group_name": group, "digests": wrong},
        timeout=120,
    )
    assert refused.status_code == 400, refused.text
    assert "does not match the sender's" in refused.json()["message"]
    assert checksum(url) == served, "nothing applied"
    # The session was discarded: the next streamed sync works.
    result = sender.sync_stream(specs_of(new), (t for _, t in new))
    assert result.success
    assert checksum(url) != served
    sender.sync_stream(specs_of(original), (t for _, t in original))
    assert checksum(url) == served


def test_a_generator_that_dies_mid_stream_leaves_the_old_weights(
    budget_server, sender, original
):
    url = budget_server.url
    served = checksum(url)
    new = perturbed(original, seed=11)

    def dies_halfway() -> Iterator[torch.Tensor]:
        for i, (_, tensor) in enumerate(new):
            if i == len(new) // 2:
                raise RuntimeError("trainer rank lost")
            yield tensor

    with pytest.raises(SyncError, match="trainer rank lost"):
        sender.sync_stream(specs_of(new), dies_halfway())
    assert checksum(url) == served
    # The copy of that transfer is gone: a new trainer's sync applies.
    again = gloo_sender(url, 2, BUCKET_BYTES, "shard_staging_again")
    try:
        assert again.sync_stream(specs_of(new), (t for _, t in new)).success
        assert checksum(url) != served
        again.sync_stream(specs_of(original), (t for _, t in original))
    finally:
        again.close()
    assert checksum(url) == served


def test_other_weight_writes_wait_for_an_open_session(
    budget_server, sender, demo_model, original, tmp_path
):
    """The apply copies the weights as they were at prepare with the update
    written in: a disk load in between is refused (it would be undone), and
    digests sent again after the verify must be the ones verified."""
    url, group = budget_server.url, sender.group_name
    served = checksum(url)
    name = "model.layers.0.self_attn.k_proj.weight"
    tensor = dict(original)[name]
    new_k = (tensor.float() - 0.05).to(tensor.dtype)
    other = save_checkpoint(demo_model, tmp_path / "other", perturbed(original, 5))
    result = sender.sync_stream(
        [(name, tensor.dtype, tensor.shape)], iter([new_k]), apply=False
    )
    assert result.verified, result.engines

    refused = requests.post(
        url + "/update_weights_from_disk", json={"model_path": str(other)}, timeout=120
    )
    assert refused.status_code == 400, refused.text
    assert f"session is open on group '{group}'" in refused.json()["message"]
    assert checksum(url) == served

    wrong = requests.post(
        url + "/complete_weights_update",
        json={
            "group_name": group,
            "digests": ["psum61:0000000000000001:0000000000000001"],
        },
        timeout=120,
    )
    assert wrong.status_code == 400, wrong.text
    assert "is not the digest bucket 0 was verified with" in wrong.json()["message"]
    assert client.complete_weights_update(url, group_name=group).applied
    replaced = [(n, new_k if n == name else t) for n, t in original]
    assert checksum(url) == disk_load(url, demo_model, tmp_path / "k0", replaced)
    client.update_weights_from_disk(url, str(demo_model))
    assert checksum(url) == served
