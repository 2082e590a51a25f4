"""Weight-sync figures on SGLang's /metrics (--enable-metrics, on the shared
servers), scraped from the real server before and after what each test does:
an applied sync counts once whatever the TP size, with its bytes and times;
refused, aborted and corrupted syncs count by outcome and reason; a blocking
operation shows in flight and the health answers it caused are counted."""

from __future__ import annotations

import concurrent.futures as cf

import pytest
import requests
import torch
import torch.distributed as dist

from harness.cpu_sglang import free_port
from harness.metrics import Samples, families, scrape, total
from harness.trainer import GlooTrainer, update_two_phase
from harness.weights import randomized
from rlsync import client
from rlsync.digest import digest_tensors
from rlsync.group import join_update_group, leave_update_group
from rlsync.planner import plan_buckets

pytestmark = pytest.mark.needs("sync_metrics")

SYNCS = "sglang:weight_syncs_total"
RECEIVED = "sglang:weight_sync_received_bytes_total"
MISMATCHES = "sglang:weight_sync_digest_mismatches_total"
SESSIONS_OPEN = "sglang:weight_sync_sessions_open"
IN_FLIGHT = "sglang:weight_update_operations_in_flight"
HEALTH_ANSWERS = "sglang:weight_update_health_answers_total"
TIMES = ("receive", "verify", "apply", "serving_stall")
# What a sync declares on the scheduler's side, and the tokenizer's gauge.
SYNC_FAMILIES = {
    "sglang:weight_syncs": "counter",
    "sglang:weight_sync_received_bytes": "counter",
    **{f"sglang:weight_sync_{name}_seconds": "histogram" for name in TIMES},
    "sglang:weight_sync_sessions_open": "gauge",
    "sglang:weight_update_operations_in_flight": "gauge",
}


def declared(url: str) -> dict[str, str]:
    return families(requests.get(url + "/metrics", timeout=30).text)


def grew(before: Samples, after: Samples, name: str, **labels: str) -> float:
    return total(after, name, **labels) - total(before, name, **labels)


@pytest.mark.parametrize("tp", [1, 2])
def test_an_applied_sync_counts_once_with_its_bytes_and_times(
    tp, server_tp1, server_tp2, model_weights
):
    server = server_tp1 if tp == 1 else server_tp2
    before = scrape(server.url)
    trainer = GlooTrainer([server.url], [tp], group_name=f"metrics_{free_port()}")
    try:
        (answer,) = update_two_phase(trainer, model_weights)
    finally:
        trainer.close()
    after = scrape(server.url)

    assert answer.success and answer.applied
    types = declared(server.url)
    assert {name: types.get(name) for name in SYNC_FAMILIES} == SYNC_FAMILIES
    assert grew(before, after, SYNCS, outcome="applied") == 1
    assert grew(before, after, SYNCS) == 1, "one sync, one count (not one per rank)"
    nbytes = sum(t.numel() * t.element_size() for _, t in model_weights)
    assert grew(before, after, RECEIVED) == answer.stats["bytes_received"] >= nbytes
    for name in TIMES:
        histogram = f"sglang:weight_sync_{name}_seconds"
        assert grew(before, after, histogram + "_count") == 1, name
        assert grew(before, after, histogram + "_sum") >= 0, name
    stall = grew(before, after, "sglang:weight_sync_serving_stall_seconds_sum")
    assert stall >= answer.stats["apply_seconds"] > 0
    assert grew(before, after, MISMATCHES) == 0
    assert total(after, SESSIONS_OPEN) == 0
    assert total(after, IN_FLIGHT) == 0
    replicas = {dict(labels)["dp_rank"] for name, labels in after if name == SYNCS}
    assert replicas == {"0"}


def test_refused_corrupted_and_aborted_syncs_count_by_reason(server_tp1, model_weights):
    url = server_tp1.url
    trainer = GlooTrainer([url], [1], group_name=f"faults_{free_port()}")
    group = trainer.group_name
    buckets = plan_buckets(randomized(model_weights, 3), 64 << 10)
    meta = [b.meta(digest_tensors(b.tensors)) for b in buckets]
    try:
        before = scrape(url)
        # Refused at prepare: no such group.
        with pytest.raises(client.EngineError) as refused:
            client.prepare_weights_update(
                url, meta, group_name="no_such_group", load_format="flattened_bucket"
            )
        assert refused.value.status == 400
        refused_at = scrape(url)
        assert grew(before, refused_at, SYNCS, outcome="failed", reason="rejected") == 1
        assert total(refused_at, SESSIONS_OPEN) == 0

        # A flipped bit on the wire: every byte arrives, the digest catches it.
        client.prepare_weights_update(
            url, meta, group_name=group, load_format="flattened_bucket"
        )
        for i, b in enumerate(buckets):
            flat = torch.cat([t.reshape(-1).view(torch.uint8) for t in b.tensors])
            if i == 1:
                flat[7] ^= 0x01
            dist.broadcast(flat, src=0, group=trainer.group)
        with pytest.raises(client.EngineError) as corrupted:
            client.complete_weights_update(url, group_name=group)
        assert "does not match the sender's" in str(corrupted.value)
        corrupted_at = scrape(url)

        # Prepared, then aborted before any byte: open while prepared. (The
        # receive it posted leaves the group unusable: the last step.)
        client.prepare_weights_update(
            url, meta, group_name=group, load_format="flattened_bucket"
        )
        assert total(scrape(url), SESSIONS_OPEN) == 1
        client.abort_weights_update(url, group_name=group)
        after = scrape(url)
    finally:
        trainer.close()
    reason = dict(outcome="failed", reason="digest_mismatch")
    assert grew(refused_at, corrupted_at, SYNCS, **reason) == 1
    assert grew(refused_at, corrupted_at, SYNCS) == 1
    assert grew(refused_at, corrupted_at, MISMATCHES) == 1
    assert grew(refused_at, corrupted_at, RECEIVED) == sum(b.nbytes for b in buckets)
    timed = "sglang:weight_sync_receive_seconds_count"
    assert grew(refused_at, corrupted_at, timed) == 1
    assert total(corrupted_at, SESSIONS_OPEN) == 0
    assert grew(corrupted_at, after, SYNCS, outcome="aborted") == 1
    assert grew(corrupted_at, after, SYNCS) == 1
    assert grew(corrupted_at, after, timed) == 0, "nothing was received"
    assert grew(before, after, "sglang:weight_sync_apply_seconds_count") == 0
    assert total(after, SESSIONS_OPEN) == 0


def test_a_blocking_operation_is_in_flight_and_its_health_answers_count(
    server_tp1,
):
    url, port = server_tp1.url, free_port()
    group = f"in_flight_{port}"
    operation = dict(operation="init_weights_update_group")
    healthy = dict(answer="healthy_while_updating")
    before = scrape(url)
    assert total(before, IN_FLIGHT, **operation) == 0
    with cf.ThreadPoolExecutor(1) as pool:
        init = pool.submit(
            client.init_weights_update_group,
            url,
            master_address="127.0.0.1",
            master_port=port,
            rank_offset=1,
            world_size=2,
            group_name=group,
            backend="gloo",
        )
        server_tp1.wait_for_log(f"master_port={port}")
        during = scrape(url)
        probes = [requests.get(url + "/health", timeout=30) for _ in range(3)]
        answered = scrape(url)
        pg = join_update_group("127.0.0.1", port, 2, group_name=group, timeout=60)
        init.result(timeout=60)
    after = scrape(url)
    client.destroy_weights_update_group(url, group_name=group)
    leave_update_group(pg)

    assert total(during, IN_FLIGHT, **operation) == 1
    assert [p.status_code for p in probes] == [200] * 3
    assert all("weight update in progress" in p.text for p in probes)
    assert grew(during, answered, HEALTH_ANSWERS, **healthy) == 3
    assert declared(url)["sglang:weight_update_health_answers"] == "counter"
    assert grew(before, after, HEALTH_ANSWERS, answer="past_deadline") == 0
    assert total(after, IN_FLIGHT, **operation) == 0
