"""Two-phase sessions have ids: a late call from a trainer that died, naming
its own session, never completes, aborts or destroys another trainer's
session (real servers, TP 2 and TP 1, trainer over gloo)."""

from __future__ import annotations

import pytest
import requests
import torch
import torch.distributed as dist

from harness.cpu_sglang import free_port
from harness.trainer import GlooTrainer
from harness.weights import perturbed
from rlsync import client
from rlsync.protocol import BucketMetadata
from rlsync.sender import Engine, WeightSender

pytestmark = pytest.mark.needs("session_ids")

NAME = "model.norm.weight"


def connected_sender(url: str, tp: int, group_name: str) -> WeightSender:
    sender = WeightSender(
        [Engine(url, tp_size=tp)],
        master_port=free_port(),
        group_name=group_name,
        backend="gloo",
        bucket_bytes=64 << 10,
        timeout=120,
    )
    sender.connect()
    return sender


def one_bucket(weights) -> list[BucketMetadata]:
    tensor = dict(weights)[NAME]
    return [BucketMetadata([NAME], ["bfloat16"], [list(tensor.shape)])]


def refusal(call, *args, **kwargs) -> client.EngineError:
    with pytest.raises(client.EngineError) as raised:
        call(*args, **kwargs)
    return raised.value


def test_a_dead_trainers_late_calls_leave_the_new_trainers_session_alone(
    server_tp2, model_weights
):
    """Trainer A prepares on group g and dies; the operator destroys g;
    trainer B re-creates g and syncs. While B's bytes are on the wire, A's
    late abort, complete and destroy (each naming A's session) are refused
    and change nothing: B's update applies."""
    url, group = server_tp2.url, f"stale_{free_port()}"
    a = GlooTrainer([url], [2], group_name=group)
    a_session = client.prepare_weights_update(
        url, one_bucket(model_weights), group_name=group
    ).session_id
    assert a_session and len(a_session) >= 16
    client.destroy_weights_update_group(url, group_name=group)  # the operator
    dist.destroy_process_group(a.group)  # trainer A is gone

    b = connected_sender(url, 2, group)
    late: dict[str, client.EngineError] = {}

    def late_calls_from_a(sent: int, total: int, nbytes: int) -> None:
        if sent != 1:
            return
        late["abort"] = refusal(
            client.abort_weights_update, url, group_name=group, session_id=a_session
        )
        late["complete"] = refusal(
            client.complete_weights_update,
            url,
            group_name=group,
            session_id=a_session,
            weight_version="from-a",
        )
        late["destroy"] = refusal(
            client.destroy_weights_update_group,
            url,
            group_name=group,
            session_id=a_session,
        )

    new = perturbed(model_weights, seed=9)
    try:
        result = b.sync(new, weight_version="from-b", progress=late_calls_from_a)
        assert result.success and result.session_id not in (None, a_session)
        assert sorted(late) == ["abort", "complete", "destroy"]
        for call, error in late.items():
            assert error.status == (400 if call == "destroy" else 409), (call, error)
            message = str(error)
            assert "session_id:" in message, message
            assert f"'{a_session}' has ended (aborted)" in message, message
            assert f"the open session is '{result.session_id}'" in message, message
        assert client.get_weight_version(url) == "from-b"
        served = client.get_weights_by_name(url, NAME, truncate_size=10**6)
        sent = dict(new)[NAME]
        assert torch.equal(torch.tensor(served).to(sent.dtype), sent)
        # No session open now: A's destroy still names a session of the
        # group as it was before B created it again, and changes nothing.
        error = refusal(
            client.destroy_weights_update_group,
            url,
            group_name=group,
            session_id=a_session,
        )
        assert "was destroyed since" in str(error), error
        from_b = b.session_id
        b.sync(model_weights, weight_version="restored")
        # B's first session is not the group's last one any more: a late
        # destroy naming it changes nothing.
        error = refusal(
            client.destroy_weights_update_group,
            url,
            group_name=group,
            session_id=from_b,
        )
        assert "a later session used group" in str(error), error
        # B's own last session names the group as it is: B may destroy it.
        client.destroy_weights_update_group(
            url, group_name=group, session_id=b.session_id
        )
    finally:
        b.close()


def test_ids_that_name_no_open_session_are_refused_naming_the_field(
    server_tp1, model_weights
):
    url = server_tp1.url
    sender = connected_sender(url, 1, f"ids_{free_port()}")
    try:
        stranger = client.new_session_id()
        for call in (client.complete_weights_update, client.abort_weights_update):
            error = refusal(
                call, url, group_name=sender.group_name, session_id=stranger
            )
            assert error.status == 409, error
            assert f"no session '{stranger}' was opened on this server" in str(error)

        result = sender.sync(model_weights, weight_version="ids")
        ended = result.session_id
        assert ended is not None
        error = refusal(
            client.complete_weights_update,
            url,
            group_name=sender.group_name,
            session_id=ended,
        )
        assert error.status == 409 and f"'{ended}' has ended (applied)" in str(error)
        # An id names one session: a prepare may not reuse it, and a late
        # duplicate of a framed prepare opens nothing that waits.
        error = refusal(
            client.prepare_weights_update,
            url,
            one_bucket(model_weights),
            group_name=sender.group_name,
            session_id=ended,
            framed=True,
        )
        assert error.status == 409 and "named an earlier session" in str(error)
        assert error.body.get("awaits_abort_header") is False, error.body

        for path, body in [
            ("/prepare_weights_update", {"num_buckets": 1, "buckets": []}),
            ("/complete_weights_update", {}),
            ("/abort_weights_update", {}),
            ("/destroy_weights_update_group", {}),
        ]:
            for bad in ["short", "x" * 129, "no spaces in ids!!", 12345678901234567]:
                payload = {**body, "group_name": sender.group_name, "session_id": bad}
                resp = requests.post(url + path, json=payload, timeout=60)
                assert 400 <= resp.status_code < 500, (path, bad, resp.text)
                assert "session_id" in resp.text, (path, bad, resp.text)
        # Nothing above opened, closed or changed anything.
        assert sender.sync(model_weights, weight_version="ids-2").success
    finally:
        sender.close()
