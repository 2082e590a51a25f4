"""Receive a weight update bucket by bucket, beside the scheduler.

The receiving half of the two-phase weight update (`/prepare_weights_update`,
`/complete_weights_update`): bucket metadata is validated before any byte
moves; each bucket lands in one of a few reused bucket buffers (kept between
updates, since a trainer syncs every step), is digested as it lands, and is
then handed to a sink (the model's own loader writing into a shadow of the
rank's parameters, see shadow_params.py) before its buffer takes the next
bucket. Nothing touches the served model until every bucket has arrived and
matched its sender digest, which may come with `prepare` or, for a sender
that streams, with `complete` (`defer_digests`).

Imports only torch (and the digest module beside it), so the data path can be
benchmarked without SGLang.

Bucket layout: the tensors of a bucket are packed back to back in metadata
order, as raw bytes; this is `FlattenedTensorBucket`'s layout, so a bucket is
one contiguous uint8 region that a "flattened_bucket" sender broadcasts in one
call. With `load_format=None` each tensor is broadcast on its own, into its
slice of the same region.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable, Deque, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from sglang.srt.weight_sync.bucket_header import HEADER_WORDS, read_header
from sglang.srt.weight_sync.digest import (
    DIGEST_ALGORITHM,
    MAX_DIGEST_BYTES,
    PSUM_PRIME,
    digest_bytes,
)

logger = logging.getLogger(__name__)

LOAD_FORMATS = (None, "flattened_bucket")
# How often a waiting receiver checks for an abort.
_ABORT_POLL = timedelta(seconds=0.2)
# How often a CUDA receive is checked for completion; a header, once the
# bucket before it is in, more often: it follows at once, and the next bucket
# is posted only once it is read.
_CUDA_POLL_S = 0.0005
_CUDA_HEADER_POLL_S = 0.00005
# NCCL's watchdog ends the process when a collective outlives its group's
# timeout: a receive on NCCL gives up this long before (a quarter of the
# timeout when that is less) and aborts the group.
_NCCL_GIVE_UP_MARGIN_S = 10.0
_DTYPES: Dict[str, torch.dtype] = {
    name: dtype
    for name, dtype in vars(torch).items()
    if isinstance(dtype, torch.dtype) and not name.startswith("_")
}


class WeightsUpdateError(ValueError):
    """Bad input: the message names the field, `status_code` is the HTTP answer."""

    def __init__(self, message: str, status_code: int = 400):
        super().__init__(message)
        self.status_code = status_code


@dataclass
class TensorSpec:
    name: str
    dtype: torch.dtype
    shape: Tuple[int, ...]
    offset: int  # bytes from the start of its bucket
    nbytes: int


@dataclass
class BucketSpec:
    index: int
    tensors: List[TensorSpec]
    nbytes: int
    digest: Optional[str] = None


def parse_dtype(value: Any, where: str) -> torch.dtype:
    if not isinstance(value, str):
        raise WeightsUpdateError(f"{where}: dtype must be a string, got {value!r}")
    dtype = _DTYPES.get(value.removeprefix("torch."))
    if dtype is None:
        raise WeightsUpdateError(f"{where}: unknown dtype {value!r}")
    return dtype


def parse_shape(value: Any, where: str) -> Tuple[int, ...]:
    if not isinstance(value, (list, tuple)):
        raise WeightsUpdateError(
            f"{where}: shape must be a list of integers, got {value!r}"
        )
    for dim in value:
        # bool is an int in Python; a shape of [True] is a mistake.
        if not isinstance(dim, int) or isinstance(dim, bool):
            raise WeightsUpdateError(f"{where}: dimension {dim!r} is not an integer")
        if dim < 0:
            raise WeightsUpdateError(f"{where}: dimension {dim} is negative")
    return tuple(value)


def parse_buckets(
    num_buckets: Any,
    buckets: Any,
    load_format: Optional[str] = None,
    is_known_name: Optional[Callable[[str], bool]] = None,
) -> List[BucketSpec]:
    """Validate the whole update's metadata; every error names its field."""
    if load_format not in LOAD_FORMATS:
        raise WeightsUpdateError(
            f"load_format: {load_format!r} is not one of {list(LOAD_FORMATS)}"
        )
    if not isinstance(num_buckets, int) or isinstance(num_buckets, bool):
        raise WeightsUpdateError(
            f"num_buckets: must be an integer, got {num_buckets!r}"
        )
    if not isinstance(buckets, list):
        raise WeightsUpdateError("buckets: must be a list")
    if num_buckets != len(buckets):
        raise WeightsUpdateError(
            f"num_buckets: {num_buckets} disagrees with len(buckets) = {len(buckets)}"
        )
    if not buckets:
        raise WeightsUpdateError("buckets: an update needs at least one bucket")
    seen: Dict[str, str] = {}
    specs = []
    for b, bucket in enumerate(buckets):
        where = f"buckets[{b}]"
        if not isinstance(bucket, dict):
            raise WeightsUpdateError(
                f"{where}: must be an object with names, dtypes, shapes"
            )
        unknown = set(bucket) - {"names", "dtypes", "shapes", "digest"}
        if unknown:
            raise WeightsUpdateError(
                f"{where}: unknown field(s) {sorted(map(str, unknown))}"
            )
        lists = {}
        for key in ("names", "dtypes", "shapes"):
            if not isinstance(bucket.get(key), list):
                raise WeightsUpdateError(f"{where}.{key}: missing or not a list")
            lists[key] = bucket[key]
        lengths = {k: len(v) for k, v in lists.items()}
        if len(set(lengths.values())) != 1:
            raise WeightsUpdateError(
                f"{where}: names, dtypes and shapes differ in length ({lengths})"
            )
        if not lists["names"]:
            raise WeightsUpdateError(
                f"{where}.names: a bucket needs at least one tensor"
            )
        tensors, offset = [], 0
        for i, (name, dtype_s, shape_v) in enumerate(
            zip(lists["names"], lists["dtypes"], lists["shapes"])
        ):
            if not isinstance(name, str) or not name:
                raise WeightsUpdateError(
                    f"{where}.names[{i}]: must be a non-empty string"
                )
            if name in seen:
                raise WeightsUpdateError(
                    f"{where}.names[{i}]: duplicate name {name!r} (also at {seen[name]})"
                )
            seen[name] = f"{where}.names[{i}]"
            if is_known_name is not None and not is_known_name(name):
                raise WeightsUpdateError(
                    f"{where}.names[{i}]: the model has no parameter {name!r}"
                )
            dtype = parse_dtype(dtype_s, f"{where}.dtypes[{i}]")
            shape = parse_shape(shape_v, f"{where}.shapes[{i}]")
            numel = 1
            for dim in shape:
                numel *= dim
            nbytes = numel * dtype.itemsize
            tensors.append(TensorSpec(name, dtype, shape, offset, nbytes))
            offset += nbytes
        digest = bucket.get("digest")
        if digest is not None:
            check_digest_format(digest, f"{where}.digest", offset)
        specs.append(BucketSpec(b, tensors, offset, digest))
    return specs


# --- digest ---------------------------------------------------------------

_DIGEST_RE = re.compile(rf"{DIGEST_ALGORITHM}:([0-9a-f]{{16}}):([0-9a-f]{{16}})")


def check_digest_format(digest: Any, where: str, nbytes: Optional[int] = None) -> None:
    """A well-formed digest of this server's algorithm; with `nbytes`, also
    a bucket size the digest supports."""
    match = _DIGEST_RE.fullmatch(digest) if isinstance(digest, str) else None
    if match is None or any(int(v, 16) >= PSUM_PRIME for v in match.groups()):
        found = digest.split(":")[0] if isinstance(digest, str) else None
        hint = (
            f"; digest algorithm {found!r} is not accepted by this server (it "
            f"checks {DIGEST_ALGORITHM} only: the sender must digest with it)"
            if found and found != DIGEST_ALGORITHM and ":" in digest
            else ""
        )
        raise WeightsUpdateError(
            f"{where}: expected '{DIGEST_ALGORITHM}:<s1>:<s2>' with s1 and s2 "
            f"16 lowercase hex digits below 2**61 - 1, got {digest!r}{hint}"
        )
    if nbytes is not None and nbytes >= MAX_DIGEST_BYTES:
        raise WeightsUpdateError(
            f"{where}: {DIGEST_ALGORITHM} digests cover buckets below "
            f"{MAX_DIGEST_BYTES} bytes (256 GiB); this bucket has {nbytes}"
        )


# --- staging --------------------------------------------------------------


# Bucket buffers: bucket k+1 arrives while bucket k is loaded.
RING_BUCKETS = 2


def group_timeout(group: dist.ProcessGroup, device: torch.device) -> Optional[float]:
    """The timeout torch gives `group`'s collectives on `device`, in seconds
    (None when this torch does not say)."""
    try:
        return group._get_backend(device).options._timeout.total_seconds()
    except (AttributeError, RuntimeError):
        return None


class StagingPool:
    """Reusable bucket buffers: first-touching fresh memory costs more than
    the transfer itself, and a trainer sends the same layout every step."""

    def __init__(self, device: torch.device):
        self.device = torch.device(device)
        self._buffers: List[torch.Tensor] = []

    @property
    def nbytes(self) -> int:
        return sum(buffer.numel() for buffer in self._buffers)

    def acquire(
        self, nbytes: int, count: int = RING_BUCKETS
    ) -> Tuple[List[torch.Tensor], bool]:
        """`count` uint8 buffers of nbytes each; True when they were reused."""
        if len(self._buffers) == count and all(
            buffer.numel() == nbytes for buffer in self._buffers
        ):
            return self._buffers, True
        self.release()
        self._buffers = [
            torch.empty(nbytes, dtype=torch.uint8, device=self.device)
            for _ in range(count)
        ]
        return self._buffers, False

    def release(self) -> None:
        self._buffers = []


def ring_bytes(buckets: Sequence[BucketSpec], count: int = RING_BUCKETS) -> int:
    """What the bucket buffers of an update take."""
    return count * max(bucket.nbytes for bucket in buckets)


def _typed_view(region: torch.Tensor, spec: TensorSpec) -> Optional[torch.Tensor]:
    """The tensor as a view into its staging bytes, if alignment allows."""
    raw = region[spec.offset : spec.offset + spec.nbytes]
    if (region.storage_offset() + spec.offset) % spec.dtype.itemsize:
        return None
    return raw.view(spec.dtype).view(spec.shape)


# --- receiver -------------------------------------------------------------

# A bucket's tensors, as views into its buffer, to whoever keeps them.
BucketSink = Callable[[Iterator[Tuple[str, torch.Tensor]]], None]


@dataclass
class ReceiveStats:
    bytes_received: int = 0
    buckets_received: int = 0
    receive_seconds: float = 0.0
    verify_seconds: float = 0.0
    # Seconds the sink (the loader into the shadow) took, summed over buckets
    load_seconds: float = 0.0
    staging_reused: bool = False
    # Seconds from the start of the receive to each bucket's arrival (verified)
    bucket_done_seconds: List[float] = field(default_factory=list)


class GroupReceiver:
    """Receives from rank 0 of `group` on its own thread (and, on CUDA, its
    own stream), every receive abortable while it waits. With a `session_id`
    (a framed session) each bucket is preceded by the sender's header
    (bucket_header.py), which may abort the update instead."""

    def __init__(
        self,
        group: dist.ProcessGroup,
        device: torch.device,
        src: int = 0,
        session_id: Optional[str] = None,
    ):
        self.group = group
        self.src = src
        self.session_id = session_id
        self.buckets: List[BucketSpec] = []
        self.stats = ReceiveStats()
        self.error: Optional[str] = None
        # The sender aborted in band: nothing is left posted on the group.
        self.sender_aborted = False
        # The sender's headers disagree with this session: the group is not
        # in a known state any more.
        self.out_of_step = False
        self._abort = threading.Event()
        self._done = threading.Event()
        self._t0 = 0.0
        self._started = threading.Event()
        # Collectives posted and not finished; the group is unusable while any is.
        self.pending_works: List[dist.Work] = []
        self._posted_at: Dict[int, float] = {}
        # On NCCL a receive is never left posted: the group's destroy would
        # wait for it forever, and its watchdog end the process at the group's
        # timeout. A receive that ends with one posted (aborted, failed, or
        # given up just before that timeout) aborts the group, which ends it.
        self._on_nccl = (
            device.type == "cuda" and dist.get_backend(group) == dist.Backend.NCCL
        )
        timeout = group_timeout(group, device) if self._on_nccl else None
        if self._on_nccl and timeout is None:
            logger.warning(
                "weight update receive: the update group's timeout is unknown; "
                "a silent sender will be caught by NCCL's watchdog"
            )
        self._give_up_after = (
            None
            if timeout is None
            else timeout - min(_NCCL_GIVE_UP_MARGIN_S, timeout / 4)
        )
        self._header = (
            None
            if session_id is None
            else torch.empty(HEADER_WORDS, dtype=torch.int64, device=device)
        )
        self._stream = (
            torch.cuda.Stream(device=device) if device.type == "cuda" else None
        )
        self._thread = threading.Thread(
            target=self._run, name="staged-weight-receiver", daemon=True
        )

    # Lifecycle ------------------------------------------------------------

    def start(self) -> None:
        """Returns once the receive loop runs: the sender may broadcast now."""
        self._thread.start()
        self._started.wait()

    def wait(self, timeout: Optional[float]) -> bool:
        """True when the receive loop has ended (successfully or not)."""
        return self._done.wait(timeout)

    @property
    def done(self) -> bool:
        return self._done.is_set()

    @property
    def in_step(self) -> bool:
        """Nothing the sender may still broadcast is owed to this receive: it
        took the sender's abort header. (The sender was told to broadcast, so
        a receive that ended early for any other reason, even before posting
        anything, may leave the sender's bytes on the wire.)"""
        return self.sender_aborted

    def abort(self, timeout: float = 5.0, sender_grace: float = 0.0) -> bool:
        """Stop receiving; True when the group can still be used: nothing is
        left posted, and the receive ended in step with the sender
        (`in_step`). `sender_grace`: seconds to let the receive end by
        itself first (the sender aborted in band)."""
        if sender_grace > 0 and self._header is not None:
            self._done.wait(sender_grace)
            if not self.sender_aborted:
                # No receive here took the abort header the sender says it
                # sent (every bucket had arrived, or it came too late): it
                # is on the wire, and the group is out of step.
                self.out_of_step = True
        self._abort.set()
        self._done.wait(timeout)
        return (
            self._done.is_set()
            and not self.pending_works
            and not self.out_of_step
            and self.in_step
        )

    @property
    def complete(self) -> bool:
        return (
            self._done.is_set()
            and self.error is None
            and self.stats.buckets_received == len(self.buckets)
        )

    def synchronize(self) -> None:
        if self._stream is not None:
            self._stream.synchronize()

    # Receive loop ---------------------------------------------------------

    def _run(self) -> None:
        t0 = self._t0 = time.perf_counter()
        try:
            if self._stream is not None:
                torch.cuda.set_device(self._stream.device)
                with torch.cuda.stream(self._stream):
                    self._receive_all()
            else:
                self._receive_all()
        except Exception as e:  # reported by complete(), never raised here
            self.error = f"{type(e).__name__}: {e}"
        finally:
            if self._on_nccl and self.pending_works:
                self._abort_group()
            self._started.set()
            self.stats.receive_seconds = time.perf_counter() - t0
            self._done.set()

    def _receive_all(self) -> None:
        raise NotImplementedError

    def _header_for(self, index: int, after: Optional[dist.Work] = None) -> bool:
        """The sender's header before bucket `index` (sent right `after` the
        bucket before it, if given): True when the bucket follows; False when
        the sender aborted or is out of step (`error` says which), or this
        receive was aborted."""
        work = self._post(self._header)
        if work is None or not self._wait(work, self._header.is_cuda, after):
            return False
        aborted, problem = read_header(self._header, self.session_id, index)
        if aborted:
            self.sender_aborted = True
            self.error = "the sender aborted the update"
        elif problem is not None:
            self.out_of_step = True
            self.error = problem
        return not aborted and problem is None

    def _post(self, tensor: torch.Tensor) -> Optional[dist.Work]:
        if self._abort.is_set():
            self.error = "aborted"
            return None
        work = dist.broadcast(tensor, src=self.src, group=self.group, async_op=True)
        self.pending_works.append(work)
        self._posted_at[id(work)] = time.monotonic()
        return work

    def _wait(
        self, work: dist.Work, is_cuda: bool, closely_after: Optional[dist.Work] = None
    ) -> bool:
        """Wait for one posted receive, checking for an abort meanwhile (on
        CUDA more often once `closely_after` has completed). A receive the
        sender leaves unanswered fails at the group's timeout (on NCCL, just
        before it, aborting the group)."""
        posted_at = self._posted_at[id(work)]
        while True:
            if is_cuda:
                if work.is_completed():
                    break
                waited = time.monotonic() - posted_at
                if self._give_up_after is not None and waited > self._give_up_after:
                    self.error = (
                        f"nothing from the sender after {waited:.0f}s, near the "
                        f"update group's timeout, past which NCCL would end this "
                        f"server: the group was aborted; initialise it again"
                    )
                    return False
                close = closely_after is not None and closely_after.is_completed()
                time.sleep(_CUDA_HEADER_POLL_S if close else _CUDA_POLL_S)
            else:
                try:
                    work.wait(timeout=_ABORT_POLL)
                    break
                except RuntimeError as e:
                    if "timed out" not in str(e).lower():
                        raise
                    if work.is_completed():  # between the poll and now
                        self._raise_if_failed(work, posted_at)
                        break
            if self._abort.is_set():
                self.error = "aborted while waiting for bytes from the sender"
                return False
        if is_cuda:
            work.wait()
        self.pending_works.remove(work)
        del self._posted_at[id(work)]
        return True

    def _raise_if_failed(self, work: dist.Work, posted_at: float) -> None:
        """A completed receive's own outcome: its bytes arrived, or it failed
        (at the group's timeout: nothing came from the sender)."""
        try:
            work.wait()
        except RuntimeError as e:
            if "timed out" not in str(e).lower():
                raise
            waited = time.monotonic() - posted_at
            raise RuntimeError(
                f"nothing from the sender after {waited:.0f}s, the update "
                f"group's timeout: {str(e).splitlines()[0]}"
            ) from e

    def _abort_group(self) -> None:
        self.group.abort()
        self.pending_works.clear()
        self._posted_at.clear()


class RefusedSessionReceiver(GroupReceiver):
    """A framed session whose prepare was refused: the sender, told so,
    broadcasts an abort header in place of bucket 0 (the other engines of
    its group wait for it), and this receives it, so that the group stays
    usable here too."""

    def _receive_all(self) -> None:
        self._started.set()
        if self._header_for(0):
            # Bucket 0 follows, and no rank here posts a receive for it: the
            # sender did not hear the refusal, and the group is out of step.
            self.out_of_step = True
            self.error = (
                "bucket 0: the sender sent data to a session whose prepare was "
                "refused, not the abort header"
            )


class StagedWeightReceiver(GroupReceiver):
    """Receives every bucket of one update through a ring of bucket buffers:
    each bucket is digested as it lands and handed to `sink`, which must be
    done with its tensors when it returns (the buffer takes a later bucket).
    `before_first_bucket` runs on the receiving thread before anything is
    received."""

    def __init__(
        self,
        buckets: Sequence[BucketSpec],
        group: dist.ProcessGroup,
        pool: StagingPool,
        load_format: Optional[str] = None,
        src: int = 0,
        sink: Optional[BucketSink] = None,
        before_first_bucket: Optional[Callable[[], None]] = None,
        defer_digests: bool = False,
        session_id: Optional[str] = None,
    ):
        super().__init__(group, pool.device, src, session_id)
        self.buckets = list(buckets)
        self.load_format = load_format
        self.sink = sink
        self.before_first_bucket = before_first_bucket
        self.defer_digests = defer_digests
        self.total_bytes = sum(b.nbytes for b in self.buckets)
        self.ring, reused = pool.acquire(max(b.nbytes for b in self.buckets))
        self.stats.staging_reused = reused
        # Each bucket's digest as it landed (every bucket whose sender digest
        # is known now or comes with complete).
        self.landed_digests: Dict[int, str] = {}
        self.digest_errors: List[str] = []
        # Buckets whose every byte arrived (loaded or not).
        self.buckets_arrived = 0

    @property
    def in_step(self) -> bool:
        """Every bucket arrived (the sender has nothing left to send), or
        the sender aborted in band."""
        return self.sender_aborted or self.buckets_arrived == len(self.buckets)

    # Data -----------------------------------------------------------------

    def _buffer_of(self, bucket: BucketSpec) -> torch.Tensor:
        return self.ring[bucket.index % len(self.ring)][: bucket.nbytes]

    def verify(self, digests: Optional[Sequence[str]] = None) -> List[str]:
        """Buckets whose bytes did not match the sender digest, one error
        each: the digests given with prepare (checked as each landed) and,
        with `digests`, those the sender sends afterwards."""
        errors = list(self.digest_errors)
        for bucket, expected in zip(self.buckets, digests or ()):
            got = self.landed_digests.get(bucket.index)
            if got is not None and got != expected:
                errors.append(_mismatch(bucket, got, expected))
        return errors

    def _check_digest(self, bucket: BucketSpec, region: torch.Tensor) -> None:
        if bucket.digest is None and not self.defer_digests:
            return
        got = self.landed_digests[bucket.index] = digest_bytes(region)
        if bucket.digest is not None and got != bucket.digest:
            self.digest_errors.append(_mismatch(bucket, got, bucket.digest))

    # Receive loop ---------------------------------------------------------

    def _receive_all(self) -> None:
        # Receives are posted only after the sink is ready for the first
        # bucket; the sender's broadcast waits for them meanwhile.
        self._started.set()
        if self.before_first_bucket is not None:
            self.before_first_bucket()
        if self.load_format == "flattened_bucket":
            if self._header is None:
                self._receive_flattened()
            else:
                self._receive_flattened_framed()
            return
        for bucket in self.buckets:
            if self._header is not None and not self._header_for(bucket.index):
                return
            region = self._buffer_of(bucket)
            for spec in bucket.tensors:
                if not self._receive_tensor(region, spec):
                    return
            self._finish(bucket, region)

    def _receive_flattened(self) -> None:
        # Bucket k+1 is posted (into the other buffer) before bucket k is
        # waited for, so the wire does not idle between buckets, and k is
        # verified and loaded while k+1 arrives.
        posted: Deque[Tuple[BucketSpec, dist.Work]] = deque()
        for bucket in self.buckets:
            work = self._post(self._buffer_of(bucket))
            if work is None:
                return
            posted.append((bucket, work))
            if len(posted) == len(self.ring):
                if not self._land(*posted.popleft()):
                    return
        while posted:
            if not self._land(*posted.popleft()):
                return

    def _receive_flattened_framed(self) -> None:
        # Header k is read before bucket k is posted (a posted receive cannot
        # be taken back if it says abort). It follows bucket k-1 on the wire,
        # so it is watched closely once k-1's bytes are in; then bucket k is
        # posted, and k-1 verified and loaded while bucket k arrives.
        landing: Optional[Tuple[BucketSpec, dist.Work]] = None
        for bucket in self.buckets:
            after = None if landing is None else landing[1]
            if not self._header_for(bucket.index, after):
                if landing is not None:  # it arrived before the header
                    self._wait(landing[1], self._header.is_cuda)
                return
            work = self._post(self._buffer_of(bucket))
            if work is None:
                return
            if landing is not None and not self._land(*landing):
                return
            landing = (bucket, work)
        if landing is not None:
            self._land(*landing)

    def _land(self, bucket: BucketSpec, work: dist.Work) -> bool:
        region = self._buffer_of(bucket)
        if not self._wait(work, region.is_cuda):
            return False
        self._finish(bucket, region)
        return True

    def _finish(self, bucket: BucketSpec, region: torch.Tensor) -> None:
        self.buckets_arrived += 1
        t0 = time.perf_counter()
        self._check_digest(bucket, region)
        t1 = time.perf_counter()
        self.stats.verify_seconds += t1 - t0
        if self.sink is not None:
            try:
                self.sink(_bucket_tensors(region, bucket))
            except Exception as e:
                raise RuntimeError(
                    f"loading bucket {bucket.index} ({bucket.tensors[0].name}, "
                    f"...) into the staged copy failed: {type(e).__name__}: {e}"
                ) from e
            self.stats.load_seconds += time.perf_counter() - t1
        self.stats.buckets_received += 1
        self.stats.bytes_received += bucket.nbytes
        self.stats.bucket_done_seconds.append(time.perf_counter() - self._t0)

    def _receive_tensor(self, region: torch.Tensor, spec: TensorSpec) -> bool:
        view = _typed_view(region, spec)
        if view is not None:
            return self._broadcast(view)
        # Misaligned for its dtype: receive aside, then copy its bytes in.
        tmp = torch.empty(spec.shape, dtype=spec.dtype, device=region.device)
        if not self._broadcast(tmp):
            return False
        region[spec.offset : spec.offset + spec.nbytes].copy_(
            tmp.reshape(-1).view(torch.uint8)
        )
        return True

    def _broadcast(self, tensor: torch.Tensor) -> bool:
        work = self._post(tensor)
        return work is not None and self._wait(work, tensor.is_cuda)


def _bucket_tensors(
    region: torch.Tensor, bucket: BucketSpec
) -> Iterator[Tuple[str, torch.Tensor]]:
    """Views into the bucket's bytes (a copy only where a dtype is misaligned)."""
    for spec in bucket.tensors:
        view = _typed_view(region, spec)
        if view is None:
            raw = region[spec.offset : spec.offset + spec.nbytes].clone()
            view = raw.view(spec.dtype).view(spec.shape)
        yield spec.name, view


def _mismatch(bucket: BucketSpec, got: str, expected: str) -> str:
    return (
        f"bucket {bucket.index} ({bucket.tensors[0].name}, ...): digest "
        f"{got} does not match the sender's {expected}"
    )
