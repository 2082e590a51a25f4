"""WeightSender.sync_stream: tensors pulled lazily with bounded memory, digests
sent after the bytes (`defer_digests`), the async variants, and the old
`sync()` unchanged.

The bytes go over a real gloo update group to a receiver process (rank 1),
which posts one receive for each broadcast the trainer makes. The HTTP calls
of `rlsync.client` are stubbed here (and only here: the server's side of the
protocol is tested against real servers elsewhere); the stubs answer as the
protocol says, checking the digests against the bytes the receiver got.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import socket
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

import numpy as np
import pytest
import torch
import torch.distributed as dist

from rlsync import client
from rlsync.client import EngineError
from rlsync.digest import digest_bytes, digest_tensors
from rlsync.group import join_update_group, leave_update_group
from rlsync.planner import TensorSpec, plan_buckets, plan_spec_buckets
from rlsync.protocol import (
    AbortWeightsUpdateResponse,
    BucketMetadata,
    CompleteWeightsUpdateResponse,
    PrepareWeightsUpdateResponse,
)
from rlsync.sender import Engine, SyncError, WeightSender
from rlsync.stream import specs_of
from rlsync.wire import Wire

URLS = ("http://engine-a:30000", "http://engine-b:30000")
BUCKET_BYTES = 4096
# Buckets of several tensors (packed by copy), of one tensor (sent as a view
# of it), one over the budget, odd byte counts (bfloat16 x 3 is 6 bytes).
SPECS = [
    TensorSpec("embed.weight", torch.float32, (16, 16)),  # 1024 B
    TensorSpec("layers.0.norm", torch.bfloat16, (3,)),  # 6 B
    TensorSpec("layers.0.q", torch.float32, (16, 32)),  # 2048 B
    TensorSpec("layers.0.k", torch.float32, (32, 32)),  # 4096 B: alone
    TensorSpec("layers.0.v", torch.bfloat16, (24, 32)),  # 1536 B
    TensorSpec("layers.0.o", torch.bfloat16, (24, 32)),  # 1536 B
    TensorSpec("layers.1.mlp", torch.float32, (64, 64)),  # 16 KiB: over budget
    TensorSpec("layers.1.norm", torch.bfloat16, (5,)),  # 10 B
    TensorSpec("lm_head.weight", torch.float32, (32, 16)),  # 2048 B
    TensorSpec("lm_head.bias", torch.float32, (32,)),  # 128 B
]
# Seconds any wait of this module may take before it fails.
DEADLINE = 30.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_tensor(spec: TensorSpec, seed: int, index: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 1000 + index)
    return torch.randn(spec.shape, generator=g).to(spec.dtype)


def as_bytes(tensor: torch.Tensor) -> bytes:
    return tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def bucket_tensors(seed: int) -> list[list[torch.Tensor]]:
    """The tensors of each planned bucket, made afresh (for comparisons)."""
    out, index = [], 0
    for plan in plan_spec_buckets(SPECS, BUCKET_BYTES):
        out.append([make_tensor(s, seed, index + k) for k, s in enumerate(plan.specs)])
        index += len(plan.specs)
    return out


# --- the receiver process (rank 1 of the update group) ---------------------


def receiver_main(conn, port: int, group_name: str) -> None:
    """Joins the group as rank 1; then, per command: ("recv", dtype, shape)
    posts one broadcast receive, ("take",) sends back the bytes received
    since the last take, ("stop",) leaves."""
    group = join_update_group(
        "127.0.0.1", port, 2, rank=1, group_name=group_name, timeout=DEADLINE
    )
    conn.send("joined")
    received: list[bytes] = []
    while True:
        command = conn.recv()
        if command[0] == "recv":
            buffer = torch.empty(command[2], dtype=command[1])
            dist.broadcast(buffer, 0, group)
            received.append(as_bytes(buffer))
        elif command[0] == "take":
            conn.send(received)
            received = []
        else:
            break
    leave_update_group(group)


@dataclass
class Receiver:
    conn: Any
    group: dist.ProcessGroup
    lock: threading.Lock = field(default_factory=threading.Lock)

    def expect(self, tensor: torch.Tensor) -> None:
        with self.lock:
            self.conn.send(("recv", tensor.dtype, tuple(tensor.shape)))

    def take(self) -> list[bytes]:
        with self.lock:
            self.conn.send(("take",))
            assert self.conn.poll(DEADLINE), "the receiver did not answer"
            return self.conn.recv()


@pytest.fixture(scope="module")
def receiver():
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    port, name = free_port(), f"stream_{free_port()}"
    proc = ctx.Process(target=receiver_main, args=(child, port, name), daemon=True)
    proc.start()
    try:
        group = join_update_group(
            "127.0.0.1", port, 2, rank=0, group_name=name, timeout=DEADLINE
        )
        assert parent.poll(DEADLINE) and parent.recv() == "joined"
        yield Receiver(parent, group)
        parent.send(("stop",))
        proc.join(DEADLINE)
        leave_update_group(group)
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join(DEADLINE)


# --- the engines' HTTP side, stubbed -----------------------------------------


@dataclass
class Call:
    url: str
    endpoint: str
    kwargs: dict[str, Any]


class Fleet:
    """Answers prepare, complete and abort as the protocol says: a complete
    checks that every bucket arrived with its size and matches its digest
    (from the prepare, or with `defer_digests` the ones the first complete
    brings), and is a 400 otherwise."""

    def __init__(self, receiver: Receiver):
        self.receiver = receiver
        self.calls: list[Call] = []
        self._lock = threading.Lock()
        self._meta: list[BucketMetadata] = []
        self._received: Optional[list[bytes]] = None
        self._deferred = False
        self._digests: dict[str, list[str]] = {}  # per engine, once given

    def of(self, endpoint: str) -> list[Call]:
        return [c for c in self.calls if c.endpoint == endpoint]

    def prepare(self, url: str, buckets, **kwargs) -> PrepareWeightsUpdateResponse:
        with self._lock:
            self.calls.append(Call(url, "prepare", dict(kwargs, buckets=buckets)))
            self._meta, self._received = list(buckets), None
            self._deferred = kwargs.get("defer_digests", False)
            self._digests.clear()
        nbytes = sum(bucket_bytes(b) for b in buckets)
        return PrepareWeightsUpdateResponse("ready", num_bytes=nbytes)

    def received(self) -> list[bytes]:
        """Every bucket's bytes, as the receiver holds them."""
        with self._lock:
            if self._received is None:
                sizes = [bucket_bytes(b) for b in self._meta]
                data, out = b"".join(self.receiver.take()), []
                for size in sizes:
                    out.append(data[:size])
                    data = data[size:]
                assert not data, "more bytes than the metadata describes"
                self._received = out
            return self._received

    def complete(self, url: str, **kwargs) -> CompleteWeightsUpdateResponse:
        with self._lock:
            self.calls.append(Call(url, "complete", kwargs))
        received = self.received()
        sent = kwargs.get("digests")
        if self._deferred:
            if sent is not None:
                self._digests[url] = list(sent)
            if url not in self._digests:
                raise EngineError(url, "/complete_weights_update", 400, "no digests")
            expected = self._digests[url]
        else:
            assert sent is None, "digests at complete after prepare-time digests"
            expected = [b.digest for b in self._meta]
        for i, (data, meta) in enumerate(zip(received, self._meta)):
            if len(data) != bucket_bytes(meta):
                raise EngineError(url, "/complete_weights_update", 400, f"short {i}")
            got = digest_bytes(torch.frombuffer(bytearray(data), dtype=torch.uint8))
            if expected[i] is not None and got != expected[i]:
                raise EngineError(
                    url, "/complete_weights_update", 400, f"buckets[{i}]: digest"
                )
        apply = kwargs.get("apply", True)
        return CompleteWeightsUpdateResponse(
            success=True,
            num_buckets_received=len(received),
            applied=apply,
            ready_to_apply=not apply,
            weight_version=kwargs.get("weight_version") if apply else None,
        )

    def abort(self, url: str, **kwargs) -> AbortWeightsUpdateResponse:
        with self._lock:
            self.calls.append(Call(url, "abort", kwargs))
            self._received = None
        self.receiver.take()  # staged bytes discarded
        return AbortWeightsUpdateResponse(success=True)


def bucket_bytes(meta: BucketMetadata) -> int:
    return sum(
        TensorSpec(n, getattr(torch, d), tuple(s)).nbytes
        for n, d, s in zip(meta.names, meta.dtypes, meta.shapes)
    )


@pytest.fixture
def fleet(receiver, monkeypatch) -> Fleet:
    fake = Fleet(receiver)
    monkeypatch.setattr(client, "prepare_weights_update", fake.prepare)
    monkeypatch.setattr(client, "complete_weights_update", fake.complete)
    monkeypatch.setattr(client, "abort_weights_update", fake.abort)
    real_broadcast = dist.broadcast

    def broadcast(tensor, src, group=None, async_op=False):
        assert group is receiver.group and src == 0
        receiver.expect(tensor)  # the receiver posts the matching receive
        return real_broadcast(tensor, src, group=group, async_op=async_op)

    monkeypatch.setattr(dist, "broadcast", broadcast)
    return fake


def make_sender(receiver: Receiver, **kwargs) -> WeightSender:
    sender = WeightSender(
        [Engine(u) for u in URLS],
        master_port=free_port(),
        backend="gloo",
        bucket_bytes=BUCKET_BYTES,
        **kwargs,
    )
    sender.group = receiver.group  # joined by the fixture: no HTTP connect
    return sender


@pytest.fixture
def sender(receiver):
    sender = make_sender(receiver)
    yield sender
    sender._pool.shutdown(wait=True)


# --- a generator that makes each tensor on demand and watches them -----------


class Tracked:
    """Tensors made on demand; at each pull, which buckets still have
    tensors alive. Each tensor's memory is a numpy array of its own, watched
    by a weak reference: it dies when the last tensor or view of that memory
    (a packed bucket that is a view of it included) is gone. The generator
    itself holds none."""

    def __init__(self, seed: int = 1):
        self.seed = seed
        self.bucket_of = [
            b
            for b, plan in enumerate(plan_spec_buckets(SPECS, BUCKET_BYTES))
            for _ in plan.specs
        ]
        self.refs: list[weakref.ref] = []
        self.alive_buckets: list[set[int]] = []  # per pull, with the pulled one

    def alive(self) -> list[int]:
        return [i for i, ref in enumerate(self.refs) if ref() is not None]

    def _make(self, index: int) -> torch.Tensor:
        self.alive_buckets.append(
            {self.bucket_of[i] for i in self.alive()} | {self.bucket_of[index]}
        )
        spec = SPECS[index]
        memory = np.empty(spec.nbytes, dtype=np.uint8)
        tensor = torch.from_numpy(memory).view(spec.dtype).view(spec.shape)
        tensor.copy_(make_tensor(spec, self.seed, index))
        self.refs.append(weakref.ref(memory))
        return tensor

    def tensors(self) -> Iterator[torch.Tensor]:
        for index in range(len(SPECS)):
            yield self._make(index)

    async def async_tensors(self):
        for index in range(len(SPECS)):
            await asyncio.sleep(0)
            yield self._make(index)

    def check_bound(self) -> None:
        assert len(self.refs) == len(SPECS), "every tensor pulled once"
        for index, buckets in enumerate(self.alive_buckets):
            current = self.bucket_of[index]
            assert buckets <= {current - 1, current}, (
                f"pulling tensor {index} (bucket {current}): tensors of buckets "
                f"{sorted(buckets)} alive; at most the one on the wire and the "
                "one being packed may be"
            )
        assert not self.alive(), f"tensors {self.alive()} outlived the sync"


def expected_digests(seed: int) -> list[str]:
    return [digest_tensors(ts) for ts in bucket_tensors(seed)]


def check_received(fleet: Fleet, seed: int) -> None:
    expected = bucket_tensors(seed)
    got = fleet.received()
    assert got == [b"".join(as_bytes(t) for t in ts) for ts in expected]
    for data, tensors in zip(got, expected):
        flat = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        assert digest_bytes(flat) == digest_tensors(tensors)


# --- tests ---------------------------------------------------------------------


def test_spec_planner_plans_what_plan_buckets_plans():
    tensors = [(s.name, make_tensor(s, 0, i)) for i, s in enumerate(SPECS)]
    for first in (None, 1000):
        held = plan_buckets(tensors, BUCKET_BYTES, first)
        planned = plan_spec_buckets(specs_of(dict(tensors)), BUCKET_BYTES, first)
        assert [b.names for b in held] == [p.names for p in planned]
        assert [b.nbytes for b in held] == [p.nbytes for p in planned]
        assert [b.meta() for b in held] == [p.metadata().to_json() for p in planned]
    tuples = [(s.name, str(s.dtype), list(s.shape)) for s in SPECS]
    assert plan_spec_buckets(tuples, BUCKET_BYTES) == plan_spec_buckets(
        SPECS, BUCKET_BYTES
    )


def test_stream_holds_at_most_two_buckets_and_sends_their_bytes(sender, fleet):
    tracked = Tracked(seed=3)
    result = sender.sync_stream(SPECS, tracked.tensors(), weight_version="v3")
    assert result.success and result.buckets == len(expected_digests(3)) == 5
    assert result.bytes == sum(s.nbytes for s in SPECS)
    tracked.check_bound()
    check_received(fleet, 3)
    [first, second] = fleet.of("complete")
    assert first.kwargs["digests"] == second.kwargs["digests"] == expected_digests(3)


def test_stream_in_the_per_tensor_layout(receiver, fleet):
    """Also: specs as (name, dtype, shape) tuples, tensors as (name, tensor)."""
    sender = make_sender(receiver, load_format=None)
    tracked = Tracked(seed=4)
    specs = [(s.name, str(s.dtype).removeprefix("torch."), s.shape) for s in SPECS]
    names = [s.name for s in SPECS]
    try:  # the zip is the stream's alone: it holds the last pair it made
        assert sender.sync_stream(
            specs, zip(names, tracked.tensors()), atomic=True
        ).success
    finally:
        sender._pool.shutdown(wait=True)
    tracked.check_bound()
    check_received(fleet, 4)
    assert fleet.of("complete")[0].kwargs["digests"] == expected_digests(4)


def wrong_shape(tensors):
    for i, t in enumerate(tensors):
        yield t.t().contiguous() if i == 8 else t  # same size, other layout


def wrong_dtype(tensors):
    for i, t in enumerate(tensors):
        yield t.double() if i == 4 else t


def wrong_name(tensors):
    for i, t in enumerate(tensors):
        yield ("layers.0.x" if i == 5 else SPECS[i].name), t


def raises(tensors):
    for i, t in enumerate(tensors):
        if i == 7:
            raise MemoryError("the trainer ran out of memory")
        yield t


def ends_early(tensors):
    for i, t in enumerate(tensors):
        if i < len(SPECS) - 1:
            yield t


def yields_too_many(tensors):
    yield from tensors
    yield torch.zeros(4)


@pytest.mark.parametrize(
    "stream, message",
    [
        (wrong_shape, "tensor 8 'lm_head.weight': shape [16, 32], not [32, 16]"),
        (wrong_dtype, "tensor 4 'layers.0.v': dtype float64, not bfloat16"),
        (wrong_name, "tensor 5 'layers.0.o': name 'layers.0.x'"),
        (raises, "MemoryError: the trainer ran out of memory"),
        (ends_early, "ended after 9 tensor(s); the specs name 10"),
        (yields_too_many, "more than the 10 tensor(s) the specs name"),
    ],
)
@pytest.mark.parametrize("atomic", [False, True])
def test_a_stream_that_disagrees_aborts_every_engine(
    sender, fleet, stream, message, atomic
):
    with pytest.raises(SyncError) as err:
        sender.sync_stream(SPECS, stream(Tracked().tensors()), atomic=atomic)
    assert err.value.step == "broadcast"
    assert message in str(err.value) and "every engine aborted" in str(err.value)
    if stream is raises:
        assert isinstance(err.value.__cause__, MemoryError)
    assert sorted(c.url for c in fleet.of("abort")) == sorted(URLS)
    assert not fleet.of("complete"), "nothing may complete, let alone apply"
    # The group is still in step: the next sync goes through.
    fleet.calls.clear()
    assert sender.sync_stream(SPECS, Tracked(seed=5).tensors()).success
    check_received(fleet, 5)


@pytest.mark.parametrize("atomic, apply", [(False, True), (True, True), (False, False)])
@pytest.mark.parametrize("digests", [True, False])
def test_digests_follow_the_bytes(receiver, fleet, atomic, apply, digests):
    sender = make_sender(receiver, digests=digests)
    try:
        result = sender.sync_stream(
            SPECS, Tracked(seed=6).tensors(), atomic=atomic, apply=apply
        )
    finally:
        sender._pool.shutdown(wait=True)
    assert result.received and result.verified == digests and result.success == apply
    prepares, completes = fleet.of("prepare"), fleet.of("complete")
    assert len(prepares) == 2 and len(completes) == (4 if atomic else 2)
    for call in prepares:
        assert call.kwargs.get("defer_digests", False) is digests
        assert all(b.digest is None for b in call.kwargs["buckets"])
    first, later = completes[:2], completes[2:]
    assert [c.kwargs.get("apply", True) for c in first] == [apply and not atomic] * 2
    for call in first:
        assert call.kwargs.get("digests") == (expected_digests(6) if digests else None)
    assert all("digests" not in c.kwargs for c in later)
    check_received(fleet, 6)


def test_a_wrong_deferred_digest_fails_the_complete(sender, fleet, monkeypatch):
    """The stub engine refuses digests that disagree with the bytes: the
    checks above would catch a sender whose digests were off."""
    import rlsync.sender as sender_module

    real = sender_module.digest_bytes
    monkeypatch.setattr(sender_module, "digest_bytes", lambda b: real(b[1:]))
    with pytest.raises(SyncError, match="verify: .*digest"):
        sender.sync_stream(SPECS, Tracked().tensors(), atomic=True)


def test_sync_still_sends_digests_with_prepare(sender, fleet):
    weights = {
        s.name: t for s, t in zip(SPECS, (t for ts in bucket_tensors(7) for t in ts))
    }
    result = sender.sync(weights, weight_version="v7")
    assert result.success and result.buckets == 5
    for call in fleet.of("prepare"):
        assert "defer_digests" not in call.kwargs
        assert [b.digest for b in call.kwargs["buckets"]] == expected_digests(7)
    assert all("digests" not in c.kwargs for c in fleet.of("complete"))
    check_received(fleet, 7)


def test_client_sends_the_new_fields_only_when_set(monkeypatch):
    bodies: list[dict] = []

    def call(url, endpoint, payload=None, **kwargs):
        bodies.append(payload)
        if endpoint == "/prepare_weights_update":
            return {"status": "ready", "staging_bytes": 64, "rank_staging_bytes": [64]}
        return {"success": True, "applied": True}

    monkeypatch.setattr(client, "call", call)
    meta = [BucketMetadata(["w"], ["float32"], [[4]])]
    answer = client.prepare_weights_update(URLS[0], meta, defer_digests=True)
    assert answer.staging_bytes == 64 and answer.extra == {"rank_staging_bytes": [64]}
    client.prepare_weights_update(URLS[0], meta)
    assert bodies[0]["defer_digests"] is True and "defer_digests" not in bodies[1]
    client.complete_weights_update(URLS[0], digests=["psum61:1:2"])
    client.complete_weights_update(URLS[0])
    assert bodies[2]["digests"] == ["psum61:1:2"] and "digests" not in bodies[3]
    with pytest.raises(ValueError, match="carry no digest"):
        meta[0].digest = "psum61:1:2"
        client.prepare_weights_update(URLS[0], meta, defer_digests=True)


def outcome(result) -> tuple:
    return (
        result.bytes,
        result.buckets,
        result.http_calls,
        result.weight_version,
        [(e.url, e.answered, e.applied, e.weight_version) for e in result.engines],
    )


@pytest.mark.parametrize("source", ["async generator", "generator", "weights"])
def test_async_sync_keeps_the_loop_ticking(sender, fleet, source, monkeypatch):
    """The loop runs while prepare waits for it to tick: a sync that ran on
    the loop would block the ticks and fail its prepare at the deadline."""
    blocking = (
        sender.sync_stream(SPECS, Tracked(seed=8).tensors(), weight_version="v8")
        if source != "weights"
        else sender.sync(dict(zip([s.name for s in SPECS], Tracked(8).tensors())), "v8")
    )
    blocking_bytes = fleet.received()
    ticked = threading.Event()
    stub_prepare = fleet.prepare

    def prepare(url, buckets, **kwargs):
        assert ticked.wait(DEADLINE), "the event loop did not tick during prepare"
        return stub_prepare(url, buckets, **kwargs)

    monkeypatch.setattr(client, "prepare_weights_update", prepare)
    tracked = Tracked(seed=8)

    async def main():
        ticks = 0
        done = asyncio.Event()

        async def ticker():
            nonlocal ticks
            while not done.is_set():
                ticks += 1
                if ticks == 5:
                    ticked.set()
                await asyncio.sleep(0.001)

        task = asyncio.create_task(ticker())
        try:
            if source == "async generator":
                result = await sender.sync_stream_async(
                    SPECS, tracked.async_tensors(), weight_version="v8"
                )
            elif source == "generator":
                result = await sender.sync_stream_async(
                    SPECS, tracked.tensors(), weight_version="v8"
                )
            else:
                weights = dict(zip([s.name for s in SPECS], tracked.tensors()))
                result = await sender.sync_async(weights, weight_version="v8")
        finally:
            done.set()
            await task
        return result, ticks

    result, ticks = asyncio.run(main())
    assert ticks >= 5
    assert outcome(result) == outcome(blocking)
    assert fleet.received() == blocking_bytes
    if source != "weights":
        tracked.check_bound()
    check_received(fleet, 8)


def test_a_generator_may_reuse_one_buffer_for_every_tensor(sender, fleet):
    """Frameworks gather each tensor into one reused buffer: the sender
    copies each tensor into its bucket before it pulls the next one."""
    expected = [make_tensor(s, 8, i) for i, s in enumerate(SPECS)]
    buffer = torch.empty(max(s.nbytes for s in SPECS), dtype=torch.uint8)

    def into_one_buffer() -> Iterator[torch.Tensor]:
        for spec, tensor in zip(SPECS, expected):
            view = buffer[: spec.nbytes].view(spec.dtype).view(spec.shape)
            view.copy_(tensor)
            yield view

    assert sender.sync_stream(SPECS, into_one_buffer()).success
    check_received(fleet, 8)


# --- the wire: every broadcast of a sync, and a faulty transport --------------


class RecordingWire(Wire):
    """Records each broadcast; bucket `corrupt`'s bytes go out with their
    first byte changed (a copy: the trainer's tensors stay as they are)."""

    def __init__(self, corrupt: Optional[int] = None):
        self.corrupt = corrupt
        self.calls: list[tuple[int, bool, int]] = []

    def broadcast(self, tensor, group, *, bucket, header, async_op=False):
        self.calls.append((bucket, header, tensor.numel() * tensor.element_size()))
        if bucket == self.corrupt and not header:
            tensor = tensor.clone()
            tensor.view(torch.uint8).view(-1)[0] ^= 0xFF
        return super().broadcast(
            tensor, group, bucket=bucket, header=header, async_op=async_op
        )


@pytest.mark.parametrize("load_format", ["flattened_bucket", None])
def test_every_broadcast_of_a_sync_goes_through_the_wire(receiver, fleet, load_format):
    wire = RecordingWire()
    sender = make_sender(receiver, wire=wire, load_format=load_format)
    try:
        assert sender.sync_stream(SPECS, Tracked(seed=8).tensors()).success
    finally:
        sender._pool.shutdown(wait=True)
    plans = plan_spec_buckets(SPECS, BUCKET_BYTES)
    if load_format is None:  # one broadcast per tensor
        want = [(b, False, s.nbytes) for b, p in enumerate(plans) for s in p.specs]
    else:
        want = [(b, False, p.nbytes) for b, p in enumerate(plans)]
    assert wire.calls == want
    check_received(fleet, 8)


def test_a_wire_that_changes_a_byte_is_caught_by_the_digest(receiver, fleet):
    wire = RecordingWire(corrupt=2)
    sender = make_sender(receiver, wire=wire)
    weights = list(zip([s.name for s in SPECS], Tracked(seed=9).tensors()))
    try:
        with pytest.raises(SyncError, match=r"verify: .*buckets\[2\]: digest") as err:
            sender.sync(weights, atomic=True)
    finally:
        sender._pool.shutdown(wait=True)
    assert err.value.group_usable, "every bucket arrived: the group is in step"
    assert sorted(c.url for c in fleet.of("abort")) == sorted(URLS)
    assert all(c.kwargs.get("apply") is False for c in fleet.of("complete"))


def test_a_sync_error_says_when_the_group_must_be_re_initialised(
    sender, fleet, monkeypatch
):
    """An engine whose abort says the group was left mid-transfer: the
    SyncError says so in a field a trainer can test, not only in words."""

    def failing(*args, **kwargs):
        raise MemoryError("the generator failed")
        yield

    def abort(url: str, **kwargs) -> AbortWeightsUpdateResponse:
        fleet.abort(url, **kwargs)
        return AbortWeightsUpdateResponse(success=True, group_usable=url != URLS[1])

    monkeypatch.setattr(client, "abort_weights_update", abort)
    with pytest.raises(SyncError) as err:
        sender.sync_stream(SPECS, failing())
    assert err.value.step == "broadcast" and not err.value.group_usable
    assert f"{URLS[1]}: group must be re-initialised" in str(err.value)
