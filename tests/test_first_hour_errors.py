"""Errors a new user meets in the first hour say what to do: NCCL on a
trainer without a GPU, a trainer started before its servers
(`connect(wait=...)`), a 401 (which key), a flag a command lacks, a wait
that ran out (which step, which knob). Against small local HTTP stand-ins
where the answer is all that matters; no SGLang server starts here."""

from __future__ import annotations

import threading
import time
from typing import Any, Iterator

import pytest
import torch

from harness.cpu_sglang import free_port
from harness.http_stand_in import HttpStandIn
from rlsync import cli, client
from rlsync.group import GroupJoin, join_update_group
from rlsync.sender import Engine, SyncError, WeightSender

NOBODY = "http://127.0.0.1:9"  # nothing listens
TWO_PHASE = "two_phase_weight_update"


def health_probes(stand_in: HttpStandIn) -> int:
    return sum(1 for _, path, _ in stand_in.requests if path == "/health")


@pytest.fixture
def stand_in() -> Iterator[HttpStandIn]:
    """A starting server: /health answers 503 (until a test says otherwise),
    every other route 401 (no request here sends its key), 404 elsewhere."""
    with HttpStandIn({("GET", "/health"): (503, {})}, key="never-sent") as server:
        yield server


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a host without CUDA")
@pytest.mark.parametrize("backend", ["nccl", "NCCL"])
def test_nccl_on_a_trainer_without_a_gpu_says_use_gloo(backend):
    """However it is spelled: torch takes "NCCL" for NCCL too."""
    sender = WeightSender([Engine(NOBODY, 1)], master_port=free_port(), backend=backend)
    with pytest.raises(SyncError, match="use backend='gloo'") as err:
        sender.connect()
    assert err.value.step == "connect"


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a host without CUDA")
@pytest.mark.parametrize("join", [join_update_group, GroupJoin])
def test_joining_a_group_over_nccl_without_a_gpu_says_use_gloo_at_once(join):
    """The group join a trainer may call itself refuses NCCL before its
    rendezvous (which would wait out its timeout, then form a group whose
    first collective fails)."""
    started = time.monotonic()
    with pytest.raises(ValueError, match="use backend='gloo'"):
        join("127.0.0.1", free_port(), 2, backend="nccl", timeout=600)
    assert time.monotonic() - started < 300  # not the rendezvous's 600 s


def test_connect_waits_for_a_starting_server(stand_in):
    """The trainer started first: connect(wait=) polls /health until the
    server answers 200, then goes on (here to the next check, which the
    stand-in fails: it is not an rlsync server)."""
    sender = WeightSender(
        [Engine(stand_in.url, 1)], master_port=free_port(), backend="gloo"
    )

    def start_once_probed() -> None:
        with stand_in.received:
            stand_in.received.wait_for(lambda: health_probes(stand_in) >= 2, 60)
        stand_in.answers[("GET", "/health")] = (200, {})

    threading.Thread(target=start_once_probed, daemon=True).start()
    with pytest.raises(SyncError, match="not patched with rlsync"):
        sender.connect(wait=60)
    assert health_probes(stand_in) >= 3


def test_connect_names_the_server_that_never_came(stand_in):
    sender = WeightSender(
        [Engine(stand_in.url, 1), Engine(NOBODY, 1)],
        master_port=free_port(),
        backend="gloo",
    )
    with pytest.raises(SyncError, match="not healthy after 1 s") as err:
        sender.connect(wait=1)
    assert f"{stand_in.url} (HTTP 503" in str(err.value)
    assert f"{NOBODY} (no answer" in str(err.value)


@pytest.mark.parametrize(
    "keys, sent",
    [
        ({"admin_key": "k"}, "the admin key given (admin_key) was refused"),
        ({"api_key": "a"}, "the API key given (api_key) was refused"),
        ({}, "no key was sent"),
    ],
)
def test_a_401_says_which_key_and_where_the_server_reads_it(stand_in, keys, sent):
    with pytest.raises(client.EngineError) as err:
        client.call(stand_in.url, "/flush_cache", {}, **keys)
    assert err.value.status == 401
    assert sent in err.value.message
    assert "--admin-api-key or $SGLANG_ADMIN_API_KEY" in err.value.message


@pytest.mark.parametrize(
    "keys, advice",
    [
        ({}, "no key was sent: pass the admin key (Engine(url, tp_size, admin_key="),
        (
            {"api_key": "a"},
            "a server with an admin key takes only that key on admin routes, so "
            "pass the admin key",
        ),
        (
            {"admin_key": "wrong"},
            "it must equal the server's --admin-api-key, or its --api-key where "
            "it has no admin key",
        ),
        (
            {"admin_key": "wrong", "api_key": "a"},
            "it must equal the server's --admin-api-key",
        ),
    ],
)
def test_a_401_on_an_admin_route_says_it_takes_the_admin_key(stand_in, keys, advice):
    with pytest.raises(client.EngineError) as err:
        client.init_weights_update_group(
            stand_in.url,
            master_address="127.0.0.1",
            master_port=free_port(),
            rank_offset=1,
            world_size=2,
            timeout=5,
            **keys,
        )
    assert err.value.status == 401
    assert "/init_weights_update_group is an admin route" in err.value.message
    assert advice in err.value.message


@pytest.mark.parametrize(
    "keys, advice",
    [
        ({}, "no key was sent: pass the API key (Engine(url, tp_size, api_key="),
        ({"api_key": "wrong"}, "it must equal the server's --api-key"),
    ],
)
def test_a_401_on_an_ordinary_route_says_it_takes_the_api_key(keys, advice):
    with HttpStandIn({}, key="k") as server:
        with pytest.raises(client.EngineError) as err:
            client.get_weight_version(server.url, **keys)
        assert err.value.status == 401
        assert "/model_info is an ordinary route" in err.value.message
        assert "never its admin key" in err.value.message
        assert advice in err.value.message


@pytest.mark.parametrize(
    "argv, said",
    [
        (["status", "--admin-key", "x", NOBODY], "unrecognized arguments: --admin-key"),
        (["status", "127.0.0.1:9"], "argument URL: '127.0.0.1:9' needs a scheme"),
        (["sync-disk", "--path", "/m", "--vllm", "h:1"], "'h:1' needs a scheme"),
        (["router", "--bogus", "x", NOBODY], "unrecognized arguments: --bogus"),
        (["doctor", NOBODY, "--admin-key"], "argument --admin-key: expected one"),
        (["doctor", "--api-key", NOBODY], "the following arguments are required: URL"),
        (["doctor", "--backend", "mpi", NOBODY], "argument --backend: invalid choice"),
        (["doctor", "h:1", "--admin-key", "k"], "'h:1' needs a scheme"),
    ],
)
def test_a_flag_a_command_lacks_gets_argparse_s_message(argv, said, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 2
    assert said in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["doctor", "--admin-key", "a", "--api-key", "k", NOBODY],
        ["doctor", NOBODY, "--admin-key", "a", "--api-key", "k"],
        ["doctor", "--admin-key=a", NOBODY, "--api-key=k", "--timeout", "1"],
    ],
)
def test_doctor_takes_its_options_before_or_after_the_url(argv, capsys):
    """Nothing listens: the doctor runs and says so (exit 1)."""
    assert cli.main(argv) == 1
    assert "FAIL  reachable" in capsys.readouterr().out


def test_connect_wait_that_ran_out_names_the_knob(stand_in):
    sender = WeightSender(
        [Engine(stand_in.url, 1)], master_port=free_port(), backend="gloo"
    )
    with pytest.raises(SyncError, match=r"connect\(wait=1\)") as err:
        sender.connect(wait=1)
    assert err.value.step == "connect"


# An rlsync engine of the series as far as connect() asks: it says yes to
# the group, and never joins it.
ENGINE_THAT_NEVER_JOINS = {
    ("GET", "/rlsync_info"): (200, {"series": 7, "features": [TWO_PHASE]}),
    ("GET", "/server_info"): (200, {"tp_size": 1, "dp_size": 1}),
    ("POST", "/init_weights_update_group"): (200, {"success": True, "message": ""}),
}


def test_a_group_join_that_timed_out_names_the_knob():
    with HttpStandIn(ENGINE_THAT_NEVER_JOINS) as engine:
        sender = WeightSender(
            [Engine(engine.url, 1)], master_port=free_port(), backend="gloo", timeout=2
        )
        with pytest.raises(SyncError) as err:
            sender.connect()
    assert err.value.step == "connect"
    assert "trainer could not join the group" in err.value.message
    assert "[timed out: the group join waits up to WeightSender(timeout=2) s" in (
        err.value.message
    )
    assert "--weight-update-health-deadline" in err.value.message


def connected_sender(url: str, timeout: float) -> WeightSender:
    """A sender past connect() whose broadcast sends nothing: what the
    engines answer is under test, not the transfer."""
    sender = WeightSender(
        [Engine(url, 1)], master_port=free_port(), backend="gloo", timeout=timeout
    )
    sender.group = object()  # type: ignore[assignment]
    sender.features = {url: [TWO_PHASE]}
    sender._broadcast = lambda *args, **kwargs: []  # type: ignore[method-assign]
    return sender


ENGINE_MISSING_BYTES = {
    ("POST", "/prepare_weights_update"): (200, {"status": "ready"}),
    ("POST", "/complete_weights_update"): (
        400,
        {
            "success": False,
            "num_buckets_received": 0,
            "message": "timed out after 2s with 0 buckets received; complete "
            "again or abort",
        },
    ),
    ("POST", "/abort_weights_update"): (200, {"success": True}),
}


@pytest.mark.parametrize("atomic, step", [(False, "apply"), (True, "verify")])
def test_a_complete_that_timed_out_names_the_knob(atomic, step):
    with HttpStandIn(ENGINE_MISSING_BYTES) as engine:
        sender = connected_sender(engine.url, timeout=2)
        with pytest.raises(SyncError) as err:
            sender.sync({"w": torch.zeros(4)}, atomic=atomic)
    assert err.value.step == step
    assert "timed out after 2s with 0 buckets received" in err.value.message
    assert (
        "[timed out: each engine's complete waits up to WeightSender(timeout=2) s "
        "for missing bytes" in err.value.message
    )


def test_a_broadcast_that_timed_out_names_the_knob():
    answers = {
        ("POST", "/prepare_weights_update"): (200, {"status": "ready"}),
        ("POST", "/abort_weights_update"): (200, {"success": True}),
    }

    def timed_out(*args: Any, **kwargs: Any) -> list[str]:
        raise RuntimeError("Timed out waiting 2000ms for send operation to complete")

    with HttpStandIn(answers) as engine:
        sender = connected_sender(engine.url, timeout=2)
        sender._broadcast = timed_out  # type: ignore[method-assign]
        with pytest.raises(SyncError) as err:
            sender.sync({"w": torch.zeros(4)})
    assert err.value.step == "broadcast"
    assert "[timed out: each broadcast waits up to WeightSender(timeout=2) s" in (
        err.value.message
    )


def test_an_error_that_is_no_timeout_names_no_knob():
    answers = {
        **ENGINE_MISSING_BYTES,
        ("POST", "/complete_weights_update"): (
            400,
            {"success": False, "message": "bucket 0: digest mismatch"},
        ),
    }
    with HttpStandIn(answers) as engine:
        sender = connected_sender(engine.url, timeout=2)
        with pytest.raises(SyncError) as err:
            sender.sync({"w": torch.zeros(4)})
    assert "digest mismatch" in err.value.message
    assert "[timed out" not in err.value.message


@pytest.mark.parametrize(
    "info,shape",
    [
        ({"tp_size": 2}, (2, 1)),
        ({"tp_size": 2, "dp_size": 3}, (2, 3)),
        # attention data parallelism: the DP replicas share one TP group
        ({"tp_size": 4, "dp_size": 4, "enable_dp_attention": True}, (4, 1)),
    ],
)
def test_an_engine_from_its_server_has_its_tp_and_dp_sizes(info, shape):
    with HttpStandIn({("GET", "/server_info"): (200, info)}, key="k") as server:
        engine = Engine.from_server(server.url, admin_key="a", api_key="k")
    assert (engine.tp_size, engine.dp_size) == shape
    assert (engine.admin_key, engine.api_key) == ("a", "k")
    assert engine.ranks == shape[0] * shape[1]


@pytest.mark.parametrize(
    "info",
    [
        {},
        {"tp_size": "2"},
        {"tp_size": 0},
        {"tp_size": True},
        {"tp_size": 2, "dp_size": 0},
    ],
)
def test_an_engine_from_a_server_without_sizes_names_what_it_answered(info):
    with HttpStandIn({("GET", "/server_info"): (200, info)}) as server:
        with pytest.raises(client.EngineError, match="tp_size"):
            Engine.from_server(server.url)
