"""Token-in/token-out servers (`--skip-tokenizer-init`), as RL rollouts run
SGLang: the scheduler's detokenizer channel then leads to the tokenizer
manager, and every weight operation must still work there: group init with a
late trainer and health meanwhile, the two-phase sync, the checksum, abort
and per-rank results (at TP 2)."""

from __future__ import annotations

import concurrent.futures as cf

import requests

from harness.cpu_sglang import free_port
from harness.trainer import GlooTrainer, update_two_phase
from harness.weights import randomized
from rlsync import client
from rlsync.group import join_update_group, leave_update_group
from rlsync.planner import plan_buckets

pool = cf.ThreadPoolExecutor(max_workers=4)
PROMPT_IDS = [5, 40, 41, 42, 43, 44, 7]


def greedy_ids(url: str, n: int = 8) -> list[int]:
    resp = requests.post(
        url + "/generate",
        json={
            "input_ids": PROMPT_IDS,
            "sampling_params": {"max_new_tokens": n, "temperature": 0},
        },
        timeout=60,
    )
    resp.raise_for_status()
    return resp.json()["output_ids"]


def test_every_weight_operation_on_a_token_in_token_out_server(
    start_server, model_weights
):
    # TP 2: the token-in/token-out channel is the same at TP 1, and TP 2
    # adds the per-rank results (a TP 1 run was a duplicate on the clock).
    tp = 2
    server = start_server(tp=tp, extra_args=["--skip-tokenizer-init"])
    original = greedy_ids(server.url)
    original_checksum = client.weights_checksum(server.url)["checksum"]

    # Group init with a trainer that joins late; health answers meanwhile.
    port = free_port()
    group = f"skip_tok_{tp}"
    init = pool.submit(
        client.init_weights_update_group,
        server.url,
        master_address="127.0.0.1",
        master_port=port,
        rank_offset=1,
        world_size=1 + tp,
        group_name=group,
        backend="gloo",
        timeout=60,
    )
    server.wait_for_log(f"master_port={port}")
    health = requests.get(server.url + "/health_generate", timeout=10)
    assert health.status_code == 200, health.text
    assert "init_weights_update_group" in health.text
    pg = join_update_group("127.0.0.1", port, 1 + tp, group_name=group, timeout=60)
    answer = init.result(timeout=60)
    assert answer["success"], answer
    assert [r["rank"] for r in answer["rank_results"]] == list(range(tp))
    leave_update_group(pg)
    client.destroy_weights_update_group(server.url, group_name=group)

    trainer = GlooTrainer([server.url], [tp], group_name=f"{group}_sync")
    try:
        new = randomized(model_weights, seed=11)
        (result,) = update_two_phase(trainer, new, weight_version="tito-1")
        assert result.success and result.applied, result
        assert [r.rank for r in result.rank_results] == list(range(tp))
        assert client.get_weight_version(server.url) == "tito-1"
        assert greedy_ids(server.url) != original
        assert client.weights_checksum(server.url)["checksum"] != original_checksum

        update_two_phase(trainer, model_weights)
        assert greedy_ids(server.url) == original
        assert client.weights_checksum(server.url)["checksum"] == original_checksum

        # Abort of a prepared session whose bytes never come: nothing changes.
        meta = [b.meta() for b in plan_buckets(model_weights, 1 << 20)]
        client.prepare_weights_update(server.url, meta, group_name=trainer.group_name)
        aborted = client.abort_weights_update(server.url, group_name=trainer.group_name)
        assert aborted.success and not aborted.group_usable
        assert client.weights_checksum(server.url)["checksum"] == original_checksum
        assert greedy_ids(server.url) == original
    finally:
        trainer.close()
    assert server.alive()
    assert "Invalid object" not in server.log()
