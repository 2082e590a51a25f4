"""Receive a whole weight update into staging buffers, beside the scheduler.

The receiving half of the two-phase weight update (`/prepare_weights_update`,
`/complete_weights_update`): bucket metadata is validated before any byte
moves, every bucket lands in one staging buffer (kept between updates, since a
trainer syncs every step), and nothing touches the model until every bucket
has arrived and matched its sender digest.

Imports only torch (and the digest module beside it), so the data path can be
benchmarked without SGLang.

Staging layout: the tensors of a bucket are packed back to back in metadata
order, as raw bytes; this is `FlattenedTensorBucket`'s layout, so a bucket is
one contiguous uint8 region that a "flattened_bucket" sender broadcasts in one
call. With `load_format=None` each tensor is broadcast on its own, into its
slice of the same region.
"""

from __future__ import annotations

import re
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable, Deque, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from sglang.srt.weight_sync.digest import (
    DIGEST_ALGORITHM,
    MAX_DIGEST_BYTES,
    PSUM_PRIME,
    digest_bytes,
)

LOAD_FORMATS = (None, "flattened_bucket")
# How often a waiting receiver checks for an abort.
_ABORT_POLL = timedelta(seconds=0.2)
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
            raise WeightsUpdateError(f"{where}: unknown field(s) {sorted(unknown)}")
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
            f"checks {DIGEST_ALGORITHM} only: upgrade rlsync on the trainer)"
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


class StagingPool:
    """One reusable buffer: first-touching fresh memory costs more than the
    transfer itself, and a trainer sends the same layout every step."""

    def __init__(self, device: torch.device):
        self.device = torch.device(device)
        self._buffer: Optional[torch.Tensor] = None

    @property
    def nbytes(self) -> int:
        return 0 if self._buffer is None else self._buffer.numel()

    def acquire(self, nbytes: int) -> Tuple[torch.Tensor, bool]:
        """A uint8 buffer of exactly nbytes; True when it was reused."""
        if self._buffer is not None and self._buffer.numel() == nbytes:
            return self._buffer, True
        self.release()
        self._buffer = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        return self._buffer, False

    def release(self) -> None:
        self._buffer = None


def _typed_view(region: torch.Tensor, spec: TensorSpec) -> Optional[torch.Tensor]:
    """The tensor as a view into its staging bytes, if alignment allows."""
    raw = region[spec.offset : spec.offset + spec.nbytes]
    if (region.storage_offset() + spec.offset) % spec.dtype.itemsize:
        return None
    return raw.view(spec.dtype).view(spec.shape)


# --- receiver -------------------------------------------------------------


@dataclass
class ReceiveStats:
    bytes_received: int = 0
    buckets_received: int = 0
    receive_seconds: float = 0.0
    verify_seconds: float = 0.0
    staging_reused: bool = False
    # Seconds from the start of the receive to each bucket's arrival (verified)
    bucket_done_seconds: List[float] = field(default_factory=list)


class StagedWeightReceiver:
    """Receives every bucket of one update from rank 0 of `group` on its own
    thread (and, on CUDA, its own stream) into a staging buffer."""

    def __init__(
        self,
        buckets: Sequence[BucketSpec],
        group: dist.ProcessGroup,
        pool: StagingPool,
        load_format: Optional[str] = None,
        src: int = 0,
    ):
        self.buckets = list(buckets)
        self.group = group
        self.load_format = load_format
        self.src = src
        self.total_bytes = sum(b.nbytes for b in self.buckets)
        self.buffer, reused = pool.acquire(self.total_bytes)
        self.stats = ReceiveStats(staging_reused=reused)
        self._bucket_offsets = []
        offset = 0
        for bucket in self.buckets:
            self._bucket_offsets.append(offset)
            offset += bucket.nbytes
        self.error: Optional[str] = None
        self.digest_errors: List[str] = []
        self._abort = threading.Event()
        self._done = threading.Event()
        self._t0 = 0.0
        self._started = threading.Event()
        # Collectives posted and not finished; the group is unusable while any is.
        self.pending_works: List[dist.Work] = []
        self._stream = (
            torch.cuda.Stream(device=pool.device)
            if pool.device.type == "cuda"
            else None
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

    def abort(self, timeout: float = 5.0) -> bool:
        """Stop receiving; True when the group can still be used (nothing was
        left half-received on it)."""
        self._abort.set()
        self._done.wait(timeout)
        return self._done.is_set() and not self.pending_works

    @property
    def complete(self) -> bool:
        return (
            self._done.is_set()
            and self.error is None
            and self.stats.buckets_received == len(self.buckets)
        )

    # Data -----------------------------------------------------------------

    def bucket_bytes(self, index: int) -> torch.Tensor:
        start = self._bucket_offsets[index]
        return self.buffer[start : start + self.buckets[index].nbytes]

    def verify(self) -> List[str]:
        """Buckets whose bytes did not match the sender digest; one error each."""
        return list(self.digest_errors)

    def _check_digest(self, bucket: BucketSpec) -> None:
        if bucket.digest is None:
            return
        got = digest_bytes(self.bucket_bytes(bucket.index))
        if got != bucket.digest:
            self.digest_errors.append(
                f"bucket {bucket.index} ({bucket.tensors[0].name}, ...): digest "
                f"{got} does not match the sender's {bucket.digest}"
            )

    def named_tensors(self) -> Iterator[Tuple[str, torch.Tensor]]:
        """Views into staging (a copy only where a dtype is misaligned)."""
        for bucket in self.buckets:
            region = self.bucket_bytes(bucket.index)
            for spec in bucket.tensors:
                view = _typed_view(region, spec)
                if view is None:
                    raw = region[spec.offset : spec.offset + spec.nbytes].clone()
                    view = raw.view(spec.dtype).view(spec.shape)
                yield spec.name, view

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
                    self._started.set()
                    self._receive_all()
            else:
                self._started.set()
                self._receive_all()
        except Exception as e:  # reported by complete(), never raised here
            self.error = f"{type(e).__name__}: {e}"
        finally:
            self._started.set()
            self.stats.receive_seconds = time.perf_counter() - t0
            self._done.set()

    def _receive_all(self) -> None:
        if self.load_format == "flattened_bucket":
            self._receive_flattened()
            return
        # Each bucket is verified once the next one is on the wire, so the
        # digest overlaps the transfer instead of following it.
        arrived: Optional[BucketSpec] = None
        for bucket in self.buckets:
            region = self.bucket_bytes(bucket.index)
            if arrived is not None:
                self._finish(arrived)
            for spec in bucket.tensors:
                if not self._receive_tensor(region, spec):
                    return
            arrived = bucket
        if arrived is not None:
            self._finish(arrived)

    def _receive_flattened(self) -> None:
        # Bucket k+1 is posted before bucket k is waited for, so the wire does
        # not idle between buckets, and k is verified while k+1 arrives.
        posted: Deque[Tuple[BucketSpec, dist.Work]] = deque()
        for bucket in self.buckets:
            region = self.bucket_bytes(bucket.index)
            work = self._post(region)
            if work is None:
                return
            posted.append((bucket, work))
            if len(posted) > 1:
                arrived, work = posted.popleft()
                if not self._wait(work, region.is_cuda):
                    return
                self._finish(arrived)
        while posted:
            arrived, work = posted.popleft()
            if not self._wait(work, self.buffer.is_cuda):
                return
            self._finish(arrived)

    def _finish(self, bucket: BucketSpec) -> None:
        t0 = time.perf_counter()
        self._check_digest(bucket)
        self.stats.verify_seconds += time.perf_counter() - t0
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

    def _post(self, tensor: torch.Tensor) -> Optional[dist.Work]:
        if self._abort.is_set():
            self.error = "aborted"
            return None
        work = dist.broadcast(tensor, src=self.src, group=self.group, async_op=True)
        self.pending_works.append(work)
        return work

    def _wait(self, work: dist.Work, is_cuda: bool) -> bool:
        """Wait for one posted receive, checking for an abort meanwhile."""
        while True:
            if is_cuda:
                if work.is_completed():
                    break
                time.sleep(0.0005)
            else:
                try:
                    work.wait(timeout=_ABORT_POLL)
                    break
                except RuntimeError as e:
                    if "timed out" not in str(e).lower():
                        raise
            if self._abort.is_set():
                self.error = "aborted while waiting for bytes from the sender"
                return False
        if is_cuda:
            work.wait()
        self.pending_works.remove(work)
        return True
