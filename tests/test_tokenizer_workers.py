"""Several tokenizer workers (`--tokenizer-worker-num 2`), and detokenizer
workers where the release has them, with data parallelism but on 0.5.10:
the two-phase update reaches every replica from whichever worker takes the
call, with and without a cache flush, and a weight-update body past the limit is a 413
there too, under a root path (a proxy's prefix) as well."""

from __future__ import annotations

import pytest
import requests
from conftest import ACTIVE_PIN

from devtools import series
from harness.cpu_sglang import free_port
from harness.weights import randomized
from rlsync import client
from rlsync.sender import Engine, WeightSender

pytestmark = pytest.mark.needs("data_parallel_weight_update")


# From 0.5.12 detokenizer workers too: the router passes on only what it
# knows how to route (a weight operation once sent the detokenizer a pause
# with no routing key, and the router's assert ended the server).
DETOKENIZER_WORKERS = (
    ["--detokenizer-worker-num", "2"]
    if series.version_key(ACTIVE_PIN) >= series.version_key("0.5.12")
    else []
)


# 0.5.10 serves its workers with uvicorn's supervisor, which kills a worker
# that misses its 5 s ping: on two cores, while two DP replicas warm up,
# that took every worker down. One replica there.
DP_SIZE = 1 if ACTIVE_PIN == "0.5.10" else 2


@pytest.fixture(scope="module")
def workers_server(request, tiny_model):
    from tests.conftest import _start

    server = _start(
        request,
        tiny_model,
        1,
        False,
        # Behind a proxy that strips /api: the server puts it in front of
        # every path it sees, and the routes match without it.
        ["--dp-size", str(DP_SIZE), "--tokenizer-worker-num", "2"]
        + ["--fastapi-root-path", "/api"]
        + DETOKENIZER_WORKERS,
        name="workers2",
    )
    request.addfinalizer(server.stop)
    return server


def test_an_update_through_several_workers_applies_on_every_replica(
    workers_server, model_weights
):
    url = workers_server.url
    sender = WeightSender(
        [Engine(url, tp_size=1, dp_size=DP_SIZE)],
        master_port=free_port(),
        group_name=f"workers_{free_port()}",
        backend="gloo",
        bucket_bytes=64 << 10,
    )
    sender.connect()
    try:
        original = client.weights_checksum(url)["checksum"]
        for seed, flush in ((7, True), (8, None)):
            result = sender.sync(randomized(model_weights, seed), flush_cache=flush)
            assert result.success, result
            after = client.weights_checksum(url)
            ranks = {r["checksum"] for r in after["rank_results"]}
            assert len(after["rank_results"]) == DP_SIZE
            assert len(ranks) == 1 and ranks != {original}
            (original,) = ranks
    finally:
        sender.close()


def test_a_body_past_the_limit_is_a_413_in_a_tokenizer_worker(workers_server):
    """The workers serve every request (the main process serves none), and
    they never ran the start-up that bounds the single-tokenizer server's
    bodies; and under a root path no route matched the limit's: a 17 MiB
    body was parsed either way, and answered 400 for its fields."""
    big = b'{"group_name": "' + b"x" * (17 << 20) + b'"}'
    resp = requests.post(
        workers_server.url + "/prepare_weights_update",
        data=big,
        headers={"Content-Type": "application/json"},
        timeout=60,
    )
    assert resp.status_code == 413, resp.text[:300]
    assert "--weight-update-max-request-mb" in resp.json()["message"]
