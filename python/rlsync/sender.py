"""WeightSender: the trainer's rank 0 of one update group spanning N engines.

`sync()` plans buckets, prepares every engine in parallel, broadcasts each
bucket in the flattened layout, and completes every engine in parallel: two
HTTP calls per engine (three with `atomic=True`, where every engine first
verifies and only then do all apply). A sync either applies on every engine
(or, with `apply=False`, leaves every engine ready to apply) and returns a
`SyncResult`, or raises `SyncError` naming the step; on every failure path
each session the sync may have left open is aborted, so the old weights keep
serving where nothing applied and the next sync never meets a stale session.

`sync_stream()` does the same from specs and a generator of tensors
(`rlsync.stream`): the buckets are planned from the specs, each tensor is
pulled only while its bucket is packed, and a bucket is dropped once its
broadcast has ended, so at most two buckets' tensors are alive at once. Its
digests follow the bytes: the prepare says `defer_digests` and the first
complete brings them. `sync()` is the same path over tensors already in
memory, with the digests sent at prepare.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import logging
import re
import sys
import threading
import time
import warnings
from collections.abc import AsyncIterable
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional, Sequence, Union

import httpx
import torch
import torch.distributed as dist

from rlsync import client
from rlsync.digest import digest_bytes, digest_tensors
from rlsync.engine import Engine
from rlsync.framing import BucketFraming, abort_on_failure
from rlsync.group import (
    GroupJoin,
    check_group_timeout,
    leave_update_group,
    nccl_without_gpu,
)
from rlsync.planner import Bucket, BucketPlan, SpecLike, TensorSpec, plan_spec_buckets
from rlsync.protocol import CompleteWeightsUpdateResponse, ProtocolError
from rlsync.stream import (
    AsyncTensorPull,
    TensorItem,
    TensorStream,
    Weights,
    named_tensors,
)
from rlsync.wire import DEFAULT_WIRE, Wire

logger = logging.getLogger(__name__)

__all__ = [
    "Engine",
    "EngineOutcome",
    "SyncError",
    "SyncResult",
    "WeightSender",
    "Weights",
    "broadcast_buckets",
    "broadcast_tensors",
    "named_tensors",
    "progress_bar",
    "stream_buckets",
    "stream_tensors",
]

# progress(buckets_sent, buckets_total, bytes_sent)
Progress = Callable[[int, int, int], None]


def progress_bar(desc: str = "rlsync sync") -> Progress:
    """A tqdm bar over buckets where tqdm is installed, else a line on stderr
    per bucket."""
    try:
        from tqdm import tqdm
    except ImportError:
        tqdm = None
    state: dict = {}

    def update(sent: int, total: int, nbytes: int) -> None:
        if tqdm is None:
            print(
                f"{desc}: bucket {sent}/{total}, {nbytes / 1e6:.1f} MB", file=sys.stderr
            )
            return
        if "bar" not in state:
            state["bar"] = tqdm(total=total, desc=desc, unit="bucket")
        state["bar"].update(sent - state["bar"].n)
        state["bar"].set_postfix_str(f"{nbytes / 1e6:.1f} MB")
        if sent == total:
            state.pop("bar").close()

    return update


@dataclass
class EngineOutcome:
    """One engine's answer to a sync's last complete (or, for a failed verify
    round, to its verify-only complete).

    `answered`: the call returned an answer (HTTP 200 with success); False
    when it raised (an error status, no answer at all, a malformed body), and
    `message` then says why. `applied`: the engine serves the sent weights.
    An engine can answer without applying (`sync(apply=False)`: it is ready
    to apply) and, rarely, apply without answering cleanly (applied, but the
    cache flush failed)."""

    url: str
    answered: bool
    applied: bool
    message: str
    weight_version: Optional[str] = None
    # The engine's own answer (rank results, stats); for a call that failed,
    # its error answer where it sent one, else None.
    answer: Optional[CompleteWeightsUpdateResponse] = None

    @property
    def success(self) -> bool:
        """Deprecated: `answered` (the call returned, which is not "applied";
        `SyncResult.success` means every engine applied)."""
        warnings.warn(
            "EngineOutcome.success is deprecated: read `answered` (the call "
            "returned) or `applied` (the engine serves the new weights)",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.answered

    @property
    def ready_to_apply(self) -> bool:
        """Every byte arrived and checked out; the engine's session is open
        for an apply (`sync(apply=False)`)."""
        return self.answered and self.answer is not None and self.answer.ready_to_apply

    @property
    def received(self) -> bool:
        """The engine received every byte on every rank (it applied them or
        is ready to)."""
        return self.applied or self.ready_to_apply


@dataclass
class SyncResult:
    bytes: int
    buckets: int
    seconds: float
    http_calls: int
    weight_version: Optional[str]
    engines: list[EngineOutcome] = field(default_factory=list)
    # The buckets carried digests that every engine compared before it
    # applied (or answered ready to apply): `WeightSender(digests=True)`.
    digests: bool = True
    # The sync's session on every engine (engines that name sessions): pass
    # it to complete or abort a session that `sync(apply=False)` left open.
    session_id: Optional[str] = None

    @property
    def gbps(self) -> float:
        return self.bytes / self.seconds / 1e9 if self.seconds else 0.0

    @property
    def success(self) -> bool:
        """Every engine applied."""
        return bool(self.engines) and all(e.applied for e in self.engines)

    @property
    def received(self) -> bool:
        """Every engine received every byte on every rank: it applied them, or
        with `sync(apply=False)` it is ready to. Without digests that is a
        count of the bytes, not a check of their content."""
        return bool(self.engines) and all(e.received for e in self.engines)

    @property
    def verified(self) -> bool:
        """Every engine received every byte and compared each bucket with its
        digest. False with `WeightSender(digests=False)`: nothing was
        compared."""
        return self.digests and self.received


class SyncError(RuntimeError):
    """A sync that failed at `step` ("connect", "prepare", "broadcast",
    "verify" or "apply"). `result`: the per-engine outcomes where the sync
    got as far as a complete ("verify", "apply"), else None.
    `group_usable`: False when an engine's update group must be
    re-initialised (left mid-transfer, or its abort failed): `close()` the
    sender and `connect()` a new one before the next sync."""

    def __init__(
        self,
        step: str,
        message: str,
        result: Optional[SyncResult] = None,
        *,
        group_usable: bool = True,
    ):
        super().__init__(f"{step}: {message}")
        self.step, self.message = step, message
        self.result = result
        self.group_usable = group_usable


@dataclass
class _Aborted:
    """What aborting the engines' sessions found: a note per engine that
    went wrong, and whether every engine's group is still usable."""

    notes: list[str] = field(default_factory=list)
    group_usable: bool = True
    # Engines that had no such session to abort (409), and what they said:
    # after a failed transfer, whatever ended it there (another caller's
    # abort or destroy, a memory release) and so why the transfer failed.
    ended: list[str] = field(default_factory=list)

    def lost(self, url: str, why: str) -> None:
        self.notes.append(f"{url}: {why}")
        self.group_usable = False

    def __str__(self) -> str:
        return "; ".join(self.notes)

    def __bool__(self) -> bool:
        return bool(self.notes)


def _session(session_id: Optional[str]) -> dict[str, str]:
    """The `session_id` argument, passed only where there is one."""
    return {} if session_id is None else {"session_id": session_id}


def _awaits_abort_header(exc: BaseException) -> bool:
    """A refused framed prepare: the engine waits for the abort header."""
    body = getattr(exc, "body", None)
    return isinstance(body, dict) and body.get("awaits_abort_header") is True


def _answered_an_error(exc: BaseException) -> bool:
    """The engine refused the call with an HTTP error status."""
    return isinstance(exc, client.EngineError) and (exc.status or 0) >= 400


def _never_reached(exc: BaseException) -> bool:
    """The call's connection never opened: the engine saw nothing."""
    return isinstance(exc.__cause__, (httpx.ConnectError, httpx.ConnectTimeout))


def _outcome(
    engine: Engine, res: object, weight_version: Optional[str]
) -> EngineOutcome:
    """An engine's outcome from its complete's answer or exception;
    `weight_version` (the requested one) where the engine applied."""
    if isinstance(res, Exception):
        # An error answer may still say that the engine applied (applied, but
        # the cache flush failed): report what the engine says it did.
        body = getattr(res, "body", None)
        body = body if isinstance(body, dict) else {}
        applied = body.get("applied") is True
        version = (body.get("weight_version") or weight_version) if applied else None
        try:  # the rank results of an error answer say which rank failed
            answer = CompleteWeightsUpdateResponse.from_json(body) if body else None
        except ProtocolError:
            answer = None
        return EngineOutcome(engine.url, False, applied, str(res), version, answer)
    assert isinstance(res, CompleteWeightsUpdateResponse), res
    version = (res.weight_version or weight_version) if res.applied else None
    return EngineOutcome(
        engine.url, True, res.applied, res.message, version, answer=res
    )


def _which_did(
    outcomes: list[EngineOutcome],
    did: Callable[[EngineOutcome], bool],
    failed: str,
    succeeded: str,
) -> str:
    """Which engines did not (`failed`) and why, and which did (`succeeded`)."""
    bad = [o for o in outcomes if not did(o)]
    good = [o.url for o in outcomes if did(o)]
    return (
        f"{len(bad)} of {len(outcomes)} engine(s) {failed}: "
        + "; ".join(f"{o.url}: {o.message}" for o in bad)
        + f"; {succeeded}: {', '.join(good) or 'none'}"
    )


def _not_applied(outcomes: list[EngineOutcome]) -> str:
    return _which_did(outcomes, lambda o: o.applied, "did not apply", "applied on")


def _not_ready(outcomes: list[EngineOutcome]) -> str:
    return _which_did(
        outcomes, lambda o: o.ready_to_apply, "not ready to apply", "ready on"
    )


def _flatten(
    tensors: list[torch.Tensor], device: Optional[torch.device], pack: str = "copy"
) -> torch.Tensor:
    """The tensors' bytes back to back (SGLang's FlattenedTensorBucket layout).
    "copy" packs with one memcpy per tensor (copy engines on GPU, so the
    packing does not take SMs from the broadcast in flight); "cat" with one
    torch.cat kernel."""
    parts = [t.detach().contiguous().reshape(-1).view(torch.uint8) for t in tensors]
    span = _adjacent_span(parts)
    if span is not None and (device is None or span.device == device):
        return span  # already packed in memory (e.g. a trainer's flat buffer)
    if pack == "cat":
        flat = torch.cat(parts)
        return flat if device is None else flat.to(device, non_blocking=True)
    if pack != "copy":
        raise ValueError(f"pack must be 'copy' or 'cat', got {pack!r}")
    flat = torch.empty(
        sum(p.numel() for p in parts),
        dtype=torch.uint8,
        device=device or parts[0].device,
    )
    offset = 0
    for part in parts:
        flat[offset : offset + part.numel()].copy_(part, non_blocking=True)
        offset += part.numel()
    return flat


def _adjacent_span(parts: list[torch.Tensor]) -> Optional[torch.Tensor]:
    """One uint8 view over `parts` when they lie back to back in one storage."""
    storage = parts[0].untyped_storage()
    end = parts[0].data_ptr()
    for part in parts:
        if (
            part.untyped_storage().data_ptr() != storage.data_ptr()
            or part.data_ptr() != end
        ):
            return None
        end += part.numel()
    start = parts[0].data_ptr() - storage.data_ptr()
    span = torch.empty(0, dtype=torch.uint8, device=parts[0].device)
    return span.set_(storage, start, (end - parts[0].data_ptr(),))


def stream_buckets(
    plans: Sequence[BucketPlan],
    stream: TensorStream,
    group: dist.ProcessGroup,
    device: Optional[torch.device] = None,
    report: Optional[Progress] = None,
    pack: str = "copy",
    digests: bool = False,
    copy_as_pulled: bool = False,
    framing: Optional[BucketFraming] = None,
    wire: Wire = DEFAULT_WIRE,
) -> list[str]:
    """The data path: one broadcast per bucket from rank 0, in the flattened
    layout. Bucket k+1 is pulled from `stream` and packed while bucket k is on
    the wire; a bucket's tensors and packed bytes are dropped once its
    broadcast has ended, so at most two buckets' tensors are alive at once.
    The stream must end with the last bucket (checked before that bucket is
    sent). With `digests`, each bucket's digest over the bytes it sends,
    computed just before sending (else []). `copy_as_pulled`: each tensor is
    copied into its bucket's bytes before the next one is pulled, so a
    generator may yield one reused buffer (a streamed sync's tensors).
    `framing`: a header goes before each bucket, and a failure (of the
    stream, of `report`) sends the abort header in place of the next.
    `wire`: what broadcasts each bucket (`rlsync.wire`)."""
    framing = framing or _Unframed()
    in_flight = None  # (work, flat): the buffer must live until the work ends
    sent_digests: list[str] = []
    sent = 0
    try:
        for i, plan in enumerate(plans):
            if copy_as_pulled:
                flat = _pack_as_pulled(plan, stream, device)
            else:
                flat = _flatten(stream.pull_bucket(plan), device, pack)
            if i == len(plans) - 1:
                stream.finish()
            if digests:
                sent_digests.append(digest_bytes(flat))
            if in_flight is not None:
                framing.collective(in_flight[0].wait)
            in_flight = None  # bucket k-1 is dropped here
            framing.announce(i)
            work = framing.collective(
                lambda: wire.broadcast(
                    flat, group, bucket=i, header=False, async_op=True
                )
            )
            in_flight, flat = (work, flat), None
            sent += plan.nbytes
            if report is not None:
                report(i + 1, len(plans), sent)
        if in_flight is not None:
            framing.collective(in_flight[0].wait)
    except BaseException:
        if isinstance(framing, BucketFraming):
            abort_on_failure(framing, in_flight and in_flight[0])
        raise
    return sent_digests


def stream_tensors(
    plans: Sequence[BucketPlan],
    stream: TensorStream,
    group: dist.ProcessGroup,
    device: Optional[torch.device] = None,
    report: Optional[Progress] = None,
    digests: bool = False,
    copy_as_pulled: bool = False,
    framing: Optional[BucketFraming] = None,
    wire: Wire = DEFAULT_WIRE,
) -> list[str]:
    """Upstream's per-tensor layout (`load_format` None): one broadcast per
    tensor, in the metadata's order, a bucket pulled from `stream` at a time.
    With `digests`, each bucket's digest (else []). `copy_as_pulled`,
    `framing` and `wire` as for `stream_buckets`."""
    framing = framing or _Unframed()
    sent_digests: list[str] = []
    sent = 0
    mid_bucket = False  # the engines wait for a tensor, not for a header
    try:
        for i, plan in enumerate(plans):
            if copy_as_pulled:
                tensors = [stream.pull().detach().clone() for _ in plan.specs]
            else:
                tensors = stream.pull_bucket(plan)
            if i == len(plans) - 1:
                stream.finish()
            if digests:
                sent_digests.append(digest_tensors(tensors))
            framing.announce(i)
            mid_bucket = True
            for tensor in tensors:
                tensor = tensor.detach().contiguous()
                tensor = tensor if device is None else tensor.to(device)
                framing.collective(
                    lambda: wire.broadcast(tensor, group, bucket=i, header=False)
                )
            mid_bucket = False
            tensors = tensor = None  # dropped before the next bucket is pulled
            sent += plan.nbytes
            if report is not None:
                report(i + 1, len(plans), sent)
    except BaseException:
        if isinstance(framing, BucketFraming) and not mid_bucket:
            abort_on_failure(framing, None)
        raise
    return sent_digests


class _Unframed:
    """No headers: the collectives run as they are."""

    def collective(self, call: Callable[[], Any]) -> Any:
        return call()

    def announce(self, index: int) -> None:
        pass


def _pack_as_pulled(
    plan: BucketPlan, stream: TensorStream, device: Optional[torch.device]
) -> torch.Tensor:
    """The bucket's bytes (the flattened layout), each tensor copied in as
    soon as it is pulled: the stream may reuse its memory for the next one."""
    flat: Optional[torch.Tensor] = None
    offset = 0
    for _ in plan.specs:
        part = stream.pull().detach().contiguous().reshape(-1).view(torch.uint8)
        if flat is None:
            flat = torch.empty(
                plan.nbytes, dtype=torch.uint8, device=device or part.device
            )
        flat[offset : offset + part.numel()].copy_(part)
        offset += part.numel()
    assert flat is not None, "a bucket holds at least one tensor"
    return flat


def _plans_and_stream(buckets: list[Bucket]) -> tuple[list[BucketPlan], TensorStream]:
    plans = [
        BucketPlan([TensorSpec.of(n, t) for n, t in zip(b.names, b.tensors)])
        for b in buckets
    ]
    specs = [spec for plan in plans for spec in plan.specs]
    return plans, TensorStream(specs, (t for b in buckets for t in b.tensors))


def broadcast_buckets(
    buckets: list[Bucket],
    group: dist.ProcessGroup,
    device: Optional[torch.device] = None,
    report: Optional[Progress] = None,
    pack: str = "copy",
) -> None:
    """`stream_buckets` over buckets already in memory."""
    plans, stream = _plans_and_stream(buckets)
    stream_buckets(plans, stream, group, device, report, pack)


def broadcast_tensors(
    buckets: list[Bucket],
    group: dist.ProcessGroup,
    device: Optional[torch.device] = None,
    report: Optional[Progress] = None,
) -> None:
    """`stream_tensors` over buckets already in memory."""
    plans, stream = _plans_and_stream(buckets)
    stream_tensors(plans, stream, group, device, report)


REQUIRED_FEATURES = ("two_phase_weight_update",)
# What a streamed sync needs of every engine: digests sent with complete.
STREAMING_FEATURE = "shard_staging"
# Engines with it name each sync's session, so that a late call from this
# sender (or another trainer's) never completes or aborts another session.
SESSION_ID_FEATURE = "session_ids"
# Engines with it take a header before each bucket: an abort this sender
# sends in band (a refused prepare, a failed stream) keeps their groups.
IN_BAND_ABORT_FEATURE = "in_band_abort"
FLATTENED = "flattened_bucket"
# Seconds connect() waits for the trainer's torn-down join before it raises.
JOIN_GRACE = 10.0
# A wait that ran out, in an error's text (httpx's, torch's, an engine's
# own); not a connection that never opened (client.CONNECT_TIMEOUT's).
TIMED_OUT = re.compile(
    r"(?<!ConnectTimeout: )timed out|timing out|before the timeout", re.IGNORECASE
)


class WeightSender:
    def __init__(
        self,
        engines: list[Engine],
        *,
        master_address: str = "127.0.0.1",
        master_port: int,
        group_name: str = "rlsync",
        backend: str = "nccl",
        bucket_bytes: int = 1 << 30,
        digests: bool = True,
        device: Optional[torch.device] = None,
        timeout: float = 300.0,
        load_format: Optional[str] = FLATTENED,
        in_band_abort: bool = True,
        wire: Optional[Wire] = None,
    ):
        """`load_format`: "flattened_bucket" (one broadcast per bucket, the
        fast path) or None (one per tensor, upstream's layout).

        `in_band_abort` (where every engine has the feature): a header goes
        before each bucket, so a sync that fails while this sender is alive
        aborts in band and no engine's group needs re-initialising. Each
        bucket then costs a header's round trip on the engines' side (about
        0.3 ms: 1.07x with 1 GiB buckets on two H100s over NVLink, more with
        small buckets); False sends none.

        `digests=False` sends no bucket digests: every engine still checks
        that every bucket arrived whole on every rank (byte counts), not what
        the bytes are, so `SyncResult.verified` is False and
        `SyncResult.received` says that every byte arrived. A verify round
        (`atomic=True`, or `apply=False`) is still allowed without digests,
        since it still keeps any engine from applying unless every engine
        holds every byte, but it logs a warning once per sender: it cannot
        catch corrupted bytes.

        `wire` (`rlsync.wire.Wire`): what makes each broadcast of a sync;
        the default is torch.distributed's. A wrapper traces what is sent, or
        injects a broken transport's faults (as the soak does)."""
        if not engines:
            raise ValueError("WeightSender needs at least one engine")
        if load_format not in (FLATTENED, None):
            raise ValueError(
                f"load_format must be {FLATTENED!r} or None, got {load_format!r}"
            )
        if len({e.url for e in engines}) != len(engines):
            raise ValueError("duplicate engine URL")
        check_group_timeout(timeout)
        self.engines = engines
        self.master_address, self.master_port = master_address, master_port
        # As torch names it: "NCCL" is NCCL too.
        self.group_name, self.backend = group_name, backend.lower()
        self.bucket_bytes, self.digests = bucket_bytes, digests
        self.device, self.timeout = device, timeout
        self.load_format = load_format
        self.in_band_abort = in_band_abort
        self.wire = wire or DEFAULT_WIRE
        self.world_size = 1 + sum(e.ranks for e in engines)
        self.group: Optional[dist.ProcessGroup] = None
        # Each engine's /rlsync_info features, read by connect().
        self.features: dict[str, list[str]] = {}
        # Engines whose session a failed sync may have left open because its
        # abort failed too (URL -> that session's id): the next sync aborts
        # them again before preparing.
        self._stale: dict[str, Optional[str]] = {}
        # The session of the sync in progress (or last run), where every
        # engine names sessions.
        self.session_id: Optional[str] = None
        self._warned_unverified = False
        self._pool = cf.ThreadPoolExecutor(max_workers=max(4, 2 * len(engines)))

    def _each(self, fn, engines=None) -> list[tuple[Engine, object]]:
        """fn(engine) on every engine at once; exceptions are returned, not raised."""
        engines = self.engines if engines is None else engines
        futures = [(e, self._pool.submit(fn, e)) for e in engines]
        out = []
        for engine, fut in futures:
            try:
                out.append((engine, fut.result()))
            except Exception as e:
                out.append((engine, e))
        return out

    def connect(self, wait: float = 0.0) -> None:
        """Every engine joins the group (rank offsets in list order), then us.
        Fails first, naming the engine, if one lacks the two-phase update; an
        engine that refuses the group fails it at once, and the trainer's own
        join is torn down before the SyncError is raised. `wait`: seconds to
        wait first for every engine's /health to answer 200 (a trainer
        started with its servers), logging which engines it still waits for
        every 10 s; past it, SyncError naming them. NCCL on a trainer
        without a GPU fails at once, saying to use gloo."""
        problem = nccl_without_gpu(self.backend)
        if problem:
            raise SyncError("connect", problem)
        if wait > 0:
            self._wait_until_healthy(wait)
        for engine, res in self._each(
            lambda e: client.require_features(
                e.url, REQUIRED_FEATURES, api_key=e.api_key
            )
        ):
            if isinstance(res, Exception):
                raise SyncError("connect", str(res))
            self.features[engine.url] = list(res.get("features", []))
        for engine, res in self._each(
            lambda e: client.update_group_ranks(e.url, api_key=e.api_key)
        ):
            if isinstance(res, Exception):
                raise SyncError("connect", str(res))
            if res != engine.ranks:
                raise SyncError(
                    "connect",
                    f"{engine.url} brings {res} rank(s) to the update group "
                    f"(dp_size x tp_size), but Engine(tp_size={engine.tp_size}, "
                    f"dp_size={engine.dp_size}) counts {engine.ranks}",
                )
        futures = self._init_engines()
        join = GroupJoin(
            self.master_address,
            self.master_port,
            self.world_size,
            group_name=self.group_name,
            backend=self.backend,
            timeout=self.timeout,
        ).start()
        try:
            refused = self._wait_for_join(join, futures)
        except BaseException:
            join.cancel(JOIN_GRACE)
            raise
        if refused:
            join.cancel(JOIN_GRACE)
            raise SyncError("connect", self._naming_the_knob("connect", refused))
        try:
            self.group = join.result()
        except Exception as e:
            raise SyncError(
                "connect",
                self._naming_the_knob(
                    "connect", [f"trainer could not join the group: {e}"]
                ),
            ) from e
        failed = []
        for engine, fut in futures:
            try:
                fut.result()
            except Exception as e:
                failed.append(f"{engine.url}: {e}")
        if failed:
            leave_update_group(self.group)
            self.group = None
            raise SyncError("connect", self._naming_the_knob("connect", failed))

    def _wait_until_healthy(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        next_note = time.monotonic() + 10.0
        pause = threading.Event()
        while True:
            answers = {
                e.url: a
                for e, a in self._each(lambda e: client.health_detail(e.url, timeout=5))
            }
            waiting = {url: a for url, a in answers.items() if a[0] != 200}
            if not waiting:
                return
            now = time.monotonic()
            if now >= deadline:
                raise SyncError(
                    "connect",
                    f"not healthy after {seconds:g} s (connect(wait={seconds:g}): "
                    f"how long connect() waits for every /health to answer 200): "
                    + "; ".join(
                        f"{url} ({'no answer' if code == 0 else f'HTTP {code}'}: "
                        f"{body[:120]})"
                        for url, (code, body) in waiting.items()
                    ),
                )
            if now >= next_note:
                logger.warning(
                    "rlsync connect: waiting for %s (%.0f s left)",
                    ", ".join(waiting),
                    deadline - now,
                )
                next_note = now + 10.0
            pause.wait(min(1.0, max(0.0, deadline - now)))

    def _init_engines(self) -> list[tuple[Engine, cf.Future]]:
        """`init_weights_update_group` on every engine at once, each at its
        rank offset (engines in list order after the trainer's rank 0)."""
        futures, offset = [], 1
        for e in self.engines:
            future = self._pool.submit(
                client.init_weights_update_group,
                e.url,
                master_address=self.master_address,
                master_port=self.master_port,
                rank_offset=offset,
                world_size=self.world_size,
                group_name=self.group_name,
                backend=self.backend,
                timeout=self.timeout,
                **e.keys,
            )
            futures.append((e, future))
            offset += e.ranks
        return futures

    @staticmethod
    def _wait_for_join(
        join: GroupJoin, futures: list[tuple[Engine, cf.Future]]
    ) -> list[str]:
        """Wait until the trainer's join ends or an engine refuses the group
        (a bad key, bad arguments: it never joins, so fail now, naming it,
        instead of waiting out the rendezvous). The refusals, if any."""
        pending = {f for _, f in futures} | {join.future}
        while not join.future.done():
            done, pending = cf.wait(pending, return_when=cf.FIRST_COMPLETED)
            refused = [
                f"{e.url}: {f.exception()}"
                for e, f in futures
                if f in done and f.exception() is not None
            ]
            if refused:
                return refused
        return []

    def _abort_all(
        self,
        engines=None,
        session_ids: Optional[dict[str, Optional[str]]] = None,
        abort_header_sent: bool = False,
        abort_header_sent_groups: Optional[list[str]] = None,
    ) -> "_Aborted":
        """Abort the session on each of `engines` (default: all), this sync's
        (or `session_ids[url]`); what went wrong, if anything. An engine
        without that session answers 409: there was nothing to close (a
        failed complete discarded it, or the engine applied), which is fine.
        An engine whose abort failed is aborted again before the next sync
        prepares. `abort_header_sent`: this sync aborted in band first."""
        header: dict[str, Any] = (
            {"abort_header_sent": True} if abort_header_sent else {}
        )
        if abort_header_sent_groups is not None:
            header["abort_header_sent_groups"] = abort_header_sent_groups
        out = _Aborted()

        def session_of(engine: Engine) -> Optional[str]:
            if session_ids is not None:
                return session_ids.get(engine.url)
            return self.session_id

        for engine, res in self._each(
            lambda e: client.abort_weights_update(
                e.url,
                group_name=self.group_name,
                **_session(session_of(e)),
                **header,
                **e.keys,
            ),
            engines,
        ):
            if isinstance(res, client.EngineError) and res.status == 409:
                self._stale.pop(engine.url, None)
                body = res.body if isinstance(res.body, dict) else {}
                out.ended.append(f"{engine.url}: {client.error_message(body)}")
                if body.get("group_usable") is False:
                    out.lost(engine.url, "group must be re-initialised")
            elif isinstance(res, Exception):
                self._stale[engine.url] = session_of(engine)
                out.lost(engine.url, f"abort failed: {res}")
            else:
                self._stale.pop(engine.url, None)
                if not res.group_usable:
                    out.lost(engine.url, "group must be re-initialised")
        return out

    def _abort_stale(self) -> None:
        """Before a sync: abort the sessions an earlier failed sync could not."""
        urls = {e.url for e in self.engines}
        self._stale = {u: s for u, s in self._stale.items() if u in urls}
        stale = [e for e in self.engines if e.url in self._stale]
        if stale:
            aborted = self._abort_all(stale, dict(self._stale))
            logger.warning(
                "rlsync sync: aborted the sessions a failed sync left open on "
                "%s (%s)",
                ", ".join(e.url for e in stale),
                aborted or "ok",
            )

    def sync(
        self,
        weights: Weights,
        weight_version: Optional[str] = None,
        atomic: bool = False,
        progress: Union[bool, Progress] = False,
        flush_cache: Optional[bool] = None,
        apply: bool = True,
    ) -> SyncResult:
        """Push `weights` (a module, a state dict or (name, tensor) pairs) to
        every engine. `atomic`: no engine applies until all have verified.
        `progress`: True for a bar over buckets, or a callable. `flush_cache`:
        by default every engine applies in place and empties its prefix cache
        if no request is in flight then (a request in flight finishes on the
        new weights, and cached prefixes keep the old weights' KV); True:
        in-flight requests finish on the old weights, then every engine
        applies and empties its prefix cache, so no request reuses KV
        computed under the old weights; False: the cache is kept.
        `apply=False`: every engine receives and verifies, keeps serving the
        old weights, and keeps its session open for a later
        `client.complete_weights_update` (apply) or `abort_weights_update`.
        The tensors are in memory already, so their digests go with the
        prepare (every series' servers take them there).

        Returns a `SyncResult` only when every engine applied (with
        `apply=False`: every engine is ready to apply). Otherwise raises
        `SyncError` naming the step ("prepare", "broadcast", "verify" for the
        verify round or a failed `apply=False` sync, "apply"), which engines
        applied and which did not and why; `SyncError.result` holds the
        per-engine outcomes once a complete ran. Every session the sync may
        have left open is aborted first (with `apply=False`, the ready
        engines' too), so the next sync starts clean; where nothing applied,
        the old weights keep serving."""
        pairs = list(named_tensors(weights))
        plans = plan_spec_buckets(
            [TensorSpec.of(name, t) for name, t in pairs], self.bucket_bytes
        )
        digests = None
        if self.digests:
            tensors = iter(t for _, t in pairs)
            digests = [
                digest_tensors([next(tensors) for _ in plan.specs]) for plan in plans
            ]
        return self._sync(
            plans,
            pairs,
            digests,
            held=True,
            weight_version=weight_version,
            atomic=atomic,
            progress=progress,
            flush_cache=flush_cache,
            apply=apply,
        )

    def sync_stream(
        self,
        specs: Iterable[SpecLike],
        tensors: Iterable[TensorItem],
        weight_version: Optional[str] = None,
        atomic: bool = False,
        progress: Union[bool, Progress] = False,
        flush_cache: Optional[bool] = None,
        apply: bool = True,
    ) -> SyncResult:
        """`sync` with bounded memory: `specs` (TensorSpecs or `(name, dtype,
        shape)` tuples) describe every tensor up front, and `tensors` (an
        iterable, typically a generator) yields them, or `(name, tensor)`
        pairs, in exactly that order. Every engine is prepared from the specs;
        each tensor is pulled only while its bucket is packed and checked
        against its spec, and a bucket is dropped once its broadcast has
        ended: at most two buckets' tensors are alive at once. A tensor that
        disagrees with its spec, a stream that ends early or yields too many,
        or an exception raised by the generator aborts every engine and
        raises SyncError("broadcast", ...) naming it (chained to it). With
        digests on, the prepare says `defer_digests` and the first complete
        brings each bucket's digest, computed just before it was sent.
        Other arguments, the result and the failures as for `sync`."""
        return self._sync(
            plan_spec_buckets(specs, self.bucket_bytes),
            tensors,
            None,
            weight_version=weight_version,
            atomic=atomic,
            progress=progress,
            flush_cache=flush_cache,
            apply=apply,
        )

    async def sync_async(
        self,
        weights: Weights,
        weight_version: Optional[str] = None,
        atomic: bool = False,
        progress: Union[bool, Progress] = False,
        flush_cache: Optional[bool] = None,
        apply: bool = True,
    ) -> SyncResult:
        """`sync` in a worker thread: the event loop keeps running meanwhile."""
        return await asyncio.to_thread(
            self.sync, weights, weight_version, atomic, progress, flush_cache, apply
        )

    async def sync_stream_async(
        self,
        specs: Iterable[SpecLike],
        tensors: Union[Iterable[TensorItem], AsyncIterable[TensorItem]],
        weight_version: Optional[str] = None,
        atomic: bool = False,
        progress: Union[bool, Progress] = False,
        flush_cache: Optional[bool] = None,
        apply: bool = True,
    ) -> SyncResult:
        """`sync_stream` in a worker thread: the event loop keeps running
        meanwhile. `tensors` may be an async iterator (an `async def`
        generator): each item is pulled on this loop when the sending thread
        asks for it, one at a time (`AsyncTensorPull`), so the two-bucket
        bound holds as for a plain generator."""
        if isinstance(tensors, AsyncIterable):
            tensors = AsyncTensorPull(tensors, asyncio.get_running_loop())
        return await asyncio.to_thread(
            self.sync_stream,
            specs,
            tensors,
            weight_version,
            atomic,
            progress,
            flush_cache,
            apply,
        )

    def _sync(
        self,
        plans: list[BucketPlan],
        tensors: Iterable[TensorItem],
        prepare_digests: Optional[list[str]],
        *,
        held: bool = False,
        weight_version: Optional[str],
        atomic: bool,
        progress: Union[bool, Progress],
        flush_cache: Optional[bool],
        apply: bool,
    ) -> SyncResult:
        """Every sync: prepare, broadcast (pulling `tensors` as the buckets
        are packed), verify, apply. `held`: the tensors stay valid for the
        whole sync (`sync`'s, in memory already); else each is copied as it
        is pulled. `prepare_digests`: one per bucket, sent
        with the prepare; None with digests on defers them to the first
        complete."""
        if self.group is None:
            raise RuntimeError("call connect() first")
        if not plans:
            raise ValueError("nothing to send")
        report = progress_bar() if progress is True else (progress or None)
        defer_digests = self.digests and prepare_digests is None
        if defer_digests:
            self._require_streaming()
        if not self.digests and (atomic or not apply):
            self._warn_unverified()
        self._abort_stale()
        self.session_id = self._new_session_id()
        session = _session(self.session_id)
        meta = [
            plan.metadata(None if prepare_digests is None else prepare_digests[i])
            for i, plan in enumerate(plans)
        ]
        total = sum(plan.nbytes for plan in plans)
        t0 = time.perf_counter()
        calls = 0

        def result_of(outcomes: list[EngineOutcome], http_calls: int) -> SyncResult:
            return SyncResult(
                bytes=total,
                buckets=len(plans),
                seconds=time.perf_counter() - t0,
                http_calls=http_calls,
                weight_version=weight_version,
                engines=outcomes,
                digests=self.digests,
                session_id=self.session_id,
            )

        # Passed only when set: a sync with prepare-time digests makes the
        # same client calls as before.
        defer = {"defer_digests": True} if defer_digests else {}
        framing = self._framing(len(plans))
        framed = {"framed": True} if framing is not None else {}
        prepared = self._each(
            lambda e: client.prepare_weights_update(
                e.url,
                meta,
                group_name=self.group_name,
                load_format=self.load_format,
                weight_version=weight_version,
                **defer,
                **session,
                **framed,
                **e.keys,
            )
        )
        calls += len(self.engines)
        failed = [(e, r) for e, r in prepared if isinstance(r, Exception)]
        if failed:
            if framing is not None and all(_awaits_abort_header(r) for _, r in failed):
                # Every engine waits for the header of bucket 0, those that
                # refused too: abort in band, and every group stays usable.
                abort_on_failure(framing, None)
                aborted = self._abort_all(abort_header_sent=framing.aborted)
                raise SyncError(
                    "prepare",
                    "; ".join(f"{e.url}: {r}" for e, r in failed)
                    + f" (every engine aborted: {aborted or 'groups usable'})",
                    group_usable=aborted.group_usable,
                )
            # Abort every engine that may hold a session: those that answered
            # ready, and those whose answer never came (the prepare may have
            # opened one); not those that refused it or that it never reached.
            opened = [
                e
                for e, r in prepared
                if not isinstance(r, Exception)
                or _awaits_abort_header(r)
                or not (_answered_an_error(r) or _never_reached(r))
            ]
            aborted = self._abort_all(opened)
            raise SyncError(
                "prepare",
                "; ".join(f"{e.url}: {r}" for e, r in failed)
                + f" (others aborted: {aborted or 'ok'})",
                group_usable=aborted.group_usable,
            )
        try:
            specs = [spec for plan in plans for spec in plan.specs]
            sent_digests = self._broadcast(
                plans,
                TensorStream(specs, tensors),
                report,
                defer_digests,
                copy_as_pulled=not held,
                framing=framing,
            )
        except BaseException as exc:
            in_band = framing is not None and framing.aborted
            aborted = self._abort_all(abort_header_sent=in_band)
            ended = (
                f"; the session had ended already on {'; '.join(aborted.ended)}"
                if aborted.ended
                else ""
            )
            raise SyncError(
                "broadcast",
                self._naming_the_knob("broadcast", [f"{type(exc).__name__}: {exc}"])
                + f"; every engine aborted ({aborted or 'groups usable'})"
                + ended,
                group_usable=aborted.group_usable,
            ) from exc
        # The first complete brings the deferred digests.
        return self._complete_sync(
            result_of,
            calls,
            sent_digests if defer_digests else None,
            weight_version=weight_version,
            atomic=atomic,
            flush_cache=flush_cache,
            apply=apply,
        )

    def _complete_sync(
        self,
        result_of: Callable[[list[EngineOutcome], int], SyncResult],
        calls: int,
        deferred_digests: Optional[list[str]],
        *,
        weight_version: Optional[str],
        atomic: bool,
        flush_cache: Optional[bool],
        apply: bool,
    ) -> SyncResult:
        """After every byte was sent: the verify round (`atomic`), then the
        complete that applies (or, `apply=False`, verifies only), and every
        session the sync may have left open aborted where it failed.
        `result_of(outcomes, http_calls)`: the sync's result."""
        session = _session(self.session_id)
        digests: dict[str, Any] = (
            {} if deferred_digests is None else {"digests": deferred_digests}
        )
        if atomic and apply:
            verified = self._each(
                lambda e: client.complete_weights_update(
                    e.url,
                    group_name=self.group_name,
                    apply=False,
                    **digests,
                    **session,
                    **self._complete_timeouts,
                    **e.keys,
                )
            )
            digests = {}
            calls += len(self.engines)
            checked = [_outcome(e, r, weight_version) for e, r in verified]
            if not all(o.ready_to_apply for o in checked):
                # A complete that failed may keep its session (a timeout, a
                # malformed request): abort every engine, the ready ones too.
                aborted = self._abort_all()
                calls += len(self.engines)
                raise SyncError(
                    "verify",
                    self._naming_the_knob("verify", [_not_ready(checked)])
                    + f"; no engine applied, every engine aborted ({aborted or 'ok'})",
                    result_of(checked, calls),
                    group_usable=aborted.group_usable,
                )
        done = self._each(
            lambda e: client.complete_weights_update(
                e.url,
                group_name=self.group_name,
                weight_version=weight_version,
                flush_cache=flush_cache,
                apply=apply,
                **digests,
                **session,
                **self._complete_timeouts,
                **e.keys,
            )
        )
        calls += len(self.engines)
        outcomes = [_outcome(e, r, weight_version) for e, r in done]
        if apply:
            left = [e for e, o in zip(self.engines, outcomes) if not o.applied]
        else:
            left = [e for e, o in zip(self.engines, outcomes) if not o.ready_to_apply]
        if left:
            # Close every session the sync may have left open: where the
            # complete failed or did not apply (with apply=False, the ready
            # engines' too: none is to apply once the sync failed).
            closing = left if apply else self.engines
            aborted = self._abort_all(closing)
            calls += len(closing)
            result = result_of(outcomes, calls)
            self._log(result, apply)
            notes = str(aborted) or "ok"
            if apply:
                message = (
                    self._naming_the_knob("apply", [_not_applied(outcomes)])
                    + f"; their sessions aborted ({notes})"
                )
            else:
                message = (
                    self._naming_the_knob("verify", [_not_ready(outcomes)])
                    + f"; nothing applied, every engine aborted ({notes})"
                )
            raise SyncError(
                "apply" if apply else "verify",
                message,
                result,
                group_usable=aborted.group_usable,
            )
        result = result_of(outcomes, calls)
        unclean = [o for o in outcomes if not o.answered]
        if unclean:  # applied, but the answer was an error (a failed cache flush)
            logger.warning(
                "rlsync sync: applied with errors: %s",
                "; ".join(f"{o.url}: {o.message}" for o in unclean),
            )
        self._log(result, apply)
        return result

    def _log(self, result: SyncResult, apply: bool) -> None:
        logger.info(
            "rlsync sync: %d bytes, %d buckets, %d HTTP calls, %.3f s, %.2f GB/s, "
            "%s on %d/%d engines",
            result.bytes,
            result.buckets,
            result.http_calls,
            result.seconds,
            result.gbps,
            "applied" if apply else "ready to apply",
            sum(e.applied if apply else e.ready_to_apply for e in result.engines),
            len(result.engines),
        )

    def _warn_unverified(self) -> None:
        if not self._warned_unverified:
            self._warned_unverified = True
            logger.warning(
                "rlsync sync: WeightSender(digests=False): the verify round "
                "checks that every byte arrived on every rank, not what the "
                "bytes are; corrupted bytes would be applied"
            )

    def _new_session_id(self) -> Optional[str]:
        """A fresh id for this sync's sessions where every engine takes one."""
        if self.features and all(
            SESSION_ID_FEATURE in self.features.get(e.url, ()) for e in self.engines
        ):
            return client.new_session_id()
        return None

    def _require_streaming(self) -> None:
        """An engine of an older series takes digests with prepare only."""
        older = [
            url
            for url, features in self.features.items()
            if STREAMING_FEATURE not in features
        ]
        if older:
            raise SyncError(
                "prepare",
                f"{', '.join(older)}: the server's rlsync series has no "
                f"{STREAMING_FEATURE} (digests sent with complete); upgrade it, "
                f"or use sync() or WeightSender(digests=False)",
            )

    @property
    def _complete_timeouts(self) -> dict[str, float]:
        """An engine waits for missing bytes (or, for a cache flush, for
        in-flight requests) no longer than this sender's timeout."""
        return {
            "wait_timeout": self.timeout,
            "timeout": self.timeout + client.COMPLETE_MARGIN,
        }

    def _naming_the_knob(self, step: str, errors: list[str]) -> str:
        """`errors` joined; where one says that a wait ran out, followed by
        what bounds that wait in `step` and how to change it."""
        message = "; ".join(errors)
        if not any(TIMED_OUT.search(error) for error in errors):
            return message
        return f"{message} [timed out: {self._knob(step)}]"

    def _knob(self, step: str) -> str:
        """What bounds the waits of `step`, named as the caller sets it."""
        timeout = f"WeightSender(timeout={self.timeout:g})"
        if step == "connect":
            return (
                f"the group join waits up to {timeout} s on the trainer and on "
                f"every engine, which caps it at its --weight-update-health-deadline"
            )
        if step == "broadcast":
            return f"each broadcast waits up to {timeout} s (the group's timeout)"
        return (
            f"each engine's complete waits up to {timeout} s for missing bytes "
            f"(with flush_cache, for requests in flight); its answer is awaited "
            f"{self.timeout + client.COMPLETE_MARGIN:g} s"
        )

    def _broadcast(
        self,
        plans: list[BucketPlan],
        stream: TensorStream,
        report: Optional[Progress],
        digests: bool,
        copy_as_pulled: bool,
        framing: Optional[BucketFraming],
    ) -> list[str]:
        if self.group is None:
            raise RuntimeError("call connect() first")
        if self.load_format == FLATTENED:
            return stream_buckets(
                plans,
                stream,
                self.group,
                self.device,
                report,
                digests=digests,
                copy_as_pulled=copy_as_pulled,
                framing=framing,
                wire=self.wire,
            )
        return stream_tensors(
            plans,
            stream,
            self.group,
            self.device,
            report,
            digests,
            copy_as_pulled,
            framing=framing,
            wire=self.wire,
        )

    def _framing(self, buckets: int) -> Optional[BucketFraming]:
        """Headers before the buckets, where every engine takes them (and so
        the sync can abort in band, keeping the group)."""
        if (
            not self.in_band_abort
            or self.session_id is None
            or not all(
                IN_BAND_ABORT_FEATURE in self.features.get(e.url, ())
                for e in self.engines
            )
        ):
            return None
        if self.group is None:
            raise RuntimeError("call connect() first")
        device = self.device or ("cuda" if self.backend == "nccl" else "cpu")
        return BucketFraming(self.session_id, self.group, buckets, device, self.wire)

    def close(self) -> None:
        for engine, _ in self._each(
            lambda e: client.destroy_weights_update_group(
                e.url, group_name=self.group_name, **e.keys
            )
        ):
            pass
        if self.group is not None:
            leave_update_group(self.group)
            self.group = None
        self._pool.shutdown(wait=False)
