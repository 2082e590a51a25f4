"""One atomic update from several senders: a trainer of two pipeline stages
(two processes, coordinated over their own gloo group), each sending only
its own layers over its own update group into a TP 1 and a TP 2 engine.

The update applies once, bit-exact against upstream's disk load of the same
weights; while it runs, every checksum taken of either engine is the old
weight set's or the new one's, never a mix; a stage that dies mid-send
leaves both engines serving the old weights.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from harness.cpu_sglang import free_port
from harness.weights import perturbed, save_checkpoint
from rlsync import client
from rlsync.group import GroupJoin, leave_update_group
from rlsync.sender import Engine

BUCKET_BYTES = 16 << 10
DEADLINE = 240.0


def stage_of(name: str) -> int:
    """Stage 0: the embedding and the first layer; stage 1: the rest."""
    return 0 if "embed_tokens" in name or ".layers.0." in name else 1


def join_coordination(rank: int, port: int, timeout: float) -> None:
    """The two stage senders' own gloo group (the default one here)."""
    import torch.distributed as dist

    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=2,
        timeout=timedelta(seconds=timeout),
    )


def stage_main(
    rank: int,
    coord_port: int,
    engines: list[tuple[str, int]],
    groups: list[str],
    ports: list[int],
    weights_file: str,
    seed: int,
    die_after_buckets: int,
    out: Any,
) -> None:
    """One stage's sending rank: its share of `perturbed(weights, seed)`."""
    import torch.distributed as dist

    from rlsync.sender import SyncError
    from rlsync.stages import StageSender

    torch.set_num_threads(1)
    join_coordination(rank, coord_port, timeout=60)
    original = list(load_file(weights_file).items())
    mine = [(n, t) for n, t in perturbed(original, seed) if stage_of(n) == rank]
    sender = StageSender(
        [Engine(url, tp) for url, tp in engines],
        coordination=dist.group.WORLD,
        group_name=groups[rank],
        master_port=ports[rank],
        backend="gloo",
        bucket_bytes=BUCKET_BYTES,
        # Within the test's deadline; on the loaded 2-core CI machine a
        # stage's join once took longer than 60 s (two groups, three ranks).
        timeout=120,
    )
    try:
        sender.connect()
    except SyncError as e:  # said at once, not by the test's deadline
        out.put((rank, "error", (e.step, str(e), e.group_usable)))
        return
    out.put((rank, "connected", None))

    def die(sent: int, total: int, nbytes: int) -> None:
        if sent == die_after_buckets:
            os.kill(os.getpid(), signal.SIGKILL)

    try:
        result = sender.sync(
            mine,
            weight_version=f"stages-{seed}",
            atomic=True,
            progress=die if die_after_buckets else False,
        )
        out.put((rank, "applied", (result.buckets, result.bytes, result.session_id)))
    except SyncError as e:
        out.put((rank, "error", (e.step, str(e), e.group_usable)))
    sender.close()
    dist.destroy_process_group()


def checksum(url: str) -> str:
    return client.weights_checksum(url, timeout=120)["checksum"]


class Watch:
    """Checksums of every engine, taken one after another until stopped."""

    def __init__(self, urls: list[str]):
        self.urls, self.seen = urls, {u: [] for u in urls}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            for url in self.urls:
                self.seen[url].append(checksum(url))

    def end(self) -> dict[str, list[str]]:
        self.stop.set()
        self.thread.join(DEADLINE)
        return self.seen


def run_stages(
    engines: list[tuple[str, int]], weights_file: Path, seed: int, die: int = 0
) -> dict[int, tuple[str, Any]]:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    tag = free_port()
    groups = [f"stage{k}-{tag}" for k in range(2)]
    ports = [free_port(), free_port()]
    coord = free_port()
    procs = [
        ctx.Process(
            target=stage_main,
            args=(
                k,
                coord,
                engines,
                groups,
                ports,
                str(weights_file),
                seed,
                die if k == 1 else 0,
                out,
            ),
            daemon=True,
        )
        for k in range(2)
    ]
    for p in procs:
        p.start()
    answers: dict[int, tuple[str, Any]] = {}
    try:
        while len(answers) < 2 - (1 if die else 0):
            rank, what, detail = out.get(timeout=DEADLINE)
            if what != "connected":
                answers[rank] = (what, detail)
    finally:
        for p in procs:
            p.join(DEADLINE)
            if p.is_alive():
                p.kill()
    return answers


@pytest.fixture
def engines(server_tp1, server_tp2) -> list[tuple[str, int]]:
    return [(server_tp1.url, 1), (server_tp2.url, 2)]


def test_two_stages_make_one_update_bit_exact_and_never_a_mix(
    engines, tiny_model, tmp_path
):
    urls = [url for url, _ in engines]
    weights_file = tiny_model / "model.safetensors"
    original = list(load_file(str(weights_file)).items())
    old = {url: checksum(url) for url in urls}
    watch = Watch(urls)
    answers = run_stages(engines, weights_file, seed=41)
    seen = watch.end()
    assert answers[0][0] == "applied" and answers[1] == answers[0], answers
    buckets, nbytes, session_id = answers[0][1]
    assert nbytes == sum(t.numel() * t.element_size() for _, t in original)
    new = {url: checksum(url) for url in urls}
    for url in urls:
        assert new[url] != old[url]
        mixed = set(seen[url]) - {old[url], new[url]}
        assert not mixed, f"{url} served a mix of stages during the update"
        assert client.get_weight_version(url) == "stages-41"
    ckpt = save_checkpoint(tiny_model, tmp_path / "new", perturbed(original, 41))
    try:
        for url in urls:  # upstream's own load of the same weights
            client.update_weights_from_disk(url, str(ckpt))
            assert checksum(url) == new[url], "the update equals the disk load"
    finally:
        for url in urls:
            client.update_weights_from_disk(url, str(tiny_model))
    assert {url: checksum(url) for url in urls} == old


def test_a_stage_that_dies_mid_send_leaves_the_old_weights(engines, tiny_model):
    urls = [url for url, _ in engines]
    weights_file = tiny_model / "model.safetensors"
    old = {url: checksum(url) for url in urls}
    answers = run_stages(engines, weights_file, seed=42, die=1)
    step, message, usable = answers[0][1]
    assert answers[0][0] == "error" and step == "broadcast", answers
    assert "every engine aborted" in message and not usable
    for url in urls:
        assert checksum(url) == old[url], "nothing applied"
        assert client.health_detail(url, timeout=30)[0] == 200
        assert client.get_weight_version(url) != "stages-42"


BUCKET = {"names": ["model.norm.weight"], "dtypes": ["float32"], "shapes": [[64]]}
OTHER = {"names": ["lm_head.weight"], "dtypes": ["float32"], "shapes": [[512, 64]]}


@pytest.mark.parametrize(
    "shares, message",
    [
        ("stage1", "shares: "),
        ([["stage1"]], "shares.0"),
        ([{"group_name": "g", "num_buckets": 1, "buckets": [OTHER]}], "group 'g'"),
        (
            [{"group_name": "s1", "num_buckets": 1, "buckets": [BUCKET]}],
            "shares[0].buckets[0].names[0]: 'model.norm.weight' is also sent at "
            "buckets[0].names[0]",
        ),
        (
            [{"group_name": "s1", "num_buckets": 2, "buckets": [OTHER]}],
            "shares[0].num_buckets: 2 disagrees with len(buckets) = 1",
        ),
        (
            [{"group_name": "s1", "num_buckets": 1, "buckets": [OTHER], "x": 1}],
            "shares[0]: unknown field(s) ['x']",
        ),
        ([{"group_name": "", "num_buckets": 1, "buckets": [OTHER]}], "shares[0]"),
    ],
)
def test_malformed_shares_are_a_400_naming_the_field(server_tp1, shares, message):
    body = {"group_name": "g", "num_buckets": 1, "buckets": [BUCKET], "shares": shares}
    with pytest.raises(client.EngineError) as err:
        client.call(server_tp1.url, "/prepare_weights_update", body, timeout=30)
    assert err.value.status == 400, err.value
    assert message in err.value.message, err.value.message
    with pytest.raises(client.EngineError, match="no weight update session is open"):
        client.abort_weights_update(server_tp1.url, group_name="g", timeout=30)


@pytest.fixture
def two_groups(server_tp1):
    """Two update groups between this process and the TP 1 server."""
    names, groups = [f"share{k}-{free_port()}" for k in range(2)], []
    try:
        for name in names:
            port = free_port()
            join = GroupJoin("127.0.0.1", port, 2, group_name=name, timeout=60)
            join.start()
            client.init_weights_update_group(
                server_tp1.url,
                master_address="127.0.0.1",
                master_port=port,
                rank_offset=1,
                world_size=2,
                group_name=name,
                backend="gloo",
                timeout=60,
            )
            assert join.future.exception(timeout=60) is None
            groups.append(join.result())
        yield names
    finally:
        for name in names:
            try:
                client.destroy_weights_update_group(server_tp1.url, group_name=name)
            except client.EngineError:
                pass
        for group in groups:
            leave_update_group(group)


def q_proj(fused: bool) -> dict:
    name = "qkv_proj" if fused else "q_proj"
    shape = [64 + 2 * 64, 64] if fused else [64, 64]
    return {
        "names": [f"model.layers.0.self_attn.{name}.weight"],
        "dtypes": ["float32"],
        "shapes": [shape],
    }


@pytest.mark.parametrize(
    "top, share, message",
    [
        (
            q_proj(False),
            q_proj(True),
            "shares[0].buckets[0].names[0]: 'model.layers.0.self_attn.qkv_proj."
            "weight' loads into the same part of",
        ),
        (
            BUCKET,
            {"names": ["lm_head.weight"], "dtypes": ["float32"], "shapes": [[3, 3]]},
            "shares[0].buckets[0].shapes[0]",
        ),
    ],
    ids=["fused_and_unfused_in_two_shares", "a_share_s_shape"],
)
def test_a_share_s_tensor_refused_at_prepare_names_the_share(
    server_tp1, two_groups, top, share, message
):
    body = {
        "group_name": two_groups[0],
        "num_buckets": 1,
        "buckets": [top],
        "shares": [{"group_name": two_groups[1], "num_buckets": 1, "buckets": [share]}],
    }
    with pytest.raises(client.EngineError) as err:
        client.call(server_tp1.url, "/prepare_weights_update", body, timeout=60)
    assert err.value.status == 400 and message in err.value.message, err.value
    with pytest.raises(client.EngineError, match="no weight update session is open"):
        client.abort_weights_update(server_tp1.url, group_name=two_groups[0])


def test_an_abort_naming_a_group_of_no_share_changes_nothing(server_tp1, two_groups):
    url = server_tp1.url
    answer = client.prepare_weights_update(
        url,
        [BUCKET],
        group_name=two_groups[0],
        shares={two_groups[1]: [OTHER]},
        framed=True,
        session_id=client.new_session_id(),
    )
    with pytest.raises(client.EngineError) as err:
        client.abort_weights_update(
            url,
            group_name=two_groups[0],
            session_id=answer.session_id,
            abort_header_sent_groups=[two_groups[1], "elsewhere"],
        )
    assert err.value.status == 400, err.value
    assert "abort_header_sent_groups: ['elsewhere']" in err.value.message
    # The session is still open: a proper abort closes it.
    done = client.abort_weights_update(
        url, group_name=two_groups[1], session_id=answer.session_id
    )
    assert done.session_id == answer.session_id


def lone_stage(rank: int, coord_port: int, out: Any) -> None:
    """Stage 0 calls sync(); stage 1 joins the coordination and leaves."""
    import torch.distributed as dist

    from rlsync.sender import SyncError
    from rlsync.stages import StageSender

    join_coordination(rank, coord_port, timeout=10)
    if rank == 1:
        return
    sender = StageSender(
        [Engine("http://127.0.0.1:9", 1)],
        coordination=dist.group.WORLD,
        group_name="stage0",
        master_port=free_port(),
        backend="gloo",
    )
    try:
        sender.sync([("w", torch.zeros(4))], atomic=True)
        out.put(("returned", None))
    except SyncError as e:
        out.put(("SyncError", (e.step, e.message)))
    except BaseException as e:
        out.put((type(e).__name__, str(e)))


def test_a_stage_that_never_calls_sync_is_a_sync_error_for_the_others():
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    coord = free_port()
    procs = [
        ctx.Process(target=lone_stage, args=(k, coord, out), daemon=True)
        for k in range(2)
    ]
    for p in procs:
        p.start()
    try:
        what, detail = out.get(timeout=DEADLINE)
    finally:
        for p in procs:
            p.join(DEADLINE)
            if p.is_alive():
                p.kill()
    assert what == "SyncError", (what, detail)
    step, message = detail
    assert step == "prepare" and "the stages lost each other" in message
    assert "nothing was sent" in message
