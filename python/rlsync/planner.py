"""Plan buckets: named tensors, in order, under a byte budget per bucket.

`plan_buckets` plans tensors it holds; `plan_spec_buckets` plans the same
buckets from `TensorSpec`s alone (name, dtype, shape: no data), so that a
streaming sender can announce every bucket before it has a single tensor.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Optional, Sequence, Union

import torch

from rlsync.protocol import BucketMetadata


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_of(dtype: Union[torch.dtype, str]) -> torch.dtype:
    """A torch dtype from itself or its name ("bfloat16", "torch.bfloat16")."""
    if isinstance(dtype, torch.dtype):
        return dtype
    found = getattr(torch, str(dtype).removeprefix("torch."), None)
    if not isinstance(found, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}")
    return found


@dataclass(frozen=True)
class TensorSpec:
    """A tensor without its data: what the engines need to know at prepare."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]

    @classmethod
    def of(cls, name: str, tensor: torch.Tensor) -> "TensorSpec":
        """The spec of `tensor` (a DTensor's is its global shape); reads no data."""
        return cls(name, tensor.dtype, tuple(tensor.shape))

    @property
    def numel(self) -> int:
        n = 1
        for dim in self.shape:
            n *= dim
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    def mismatch(self, tensor: torch.Tensor, name: Optional[str] = None) -> str:
        """What in `tensor` (and the `name` it came with, if any) disagrees
        with this spec; "" when nothing does."""
        wrong = []
        if name is not None and name != self.name:
            wrong.append(f"name {name!r}")
        if tensor.dtype != self.dtype:
            wrong.append(
                f"dtype {dtype_name(tensor.dtype)}, not {dtype_name(self.dtype)}"
            )
        if tuple(tensor.shape) != self.shape:
            wrong.append(f"shape {list(tensor.shape)}, not {list(self.shape)}")
        return ", ".join(wrong)


SpecLike = Union[TensorSpec, tuple[str, Union[torch.dtype, str], Sequence[int]]]


def as_spec(spec: SpecLike) -> TensorSpec:
    """A TensorSpec from itself or a `(name, dtype, shape)` tuple."""
    if isinstance(spec, TensorSpec):
        return spec
    name, dtype, shape = spec
    if not (isinstance(name, str) and name):
        raise ValueError(f"a spec needs a name, got {name!r}")
    dims = tuple(int(d) for d in shape)
    if not all(d >= 0 for d in dims):
        raise ValueError(f"{name}: negative shape {list(dims)}")
    return TensorSpec(name, dtype_of(dtype), dims)


@dataclass
class Bucket:
    """Tensors sent together; `metadata()` describes them for
    /prepare_weights_update (`meta()`: the same as JSON)."""

    names: list[str] = field(default_factory=list)
    tensors: list[torch.Tensor] = field(default_factory=list)
    nbytes: int = 0

    def metadata(self, digest: Optional[str] = None) -> BucketMetadata:
        return BucketMetadata(
            names=list(self.names),
            dtypes=[dtype_name(t.dtype) for t in self.tensors],
            shapes=[list(t.shape) for t in self.tensors],
            digest=digest,
        )

    def meta(self, digest: Optional[str] = None) -> dict:
        return self.metadata(digest).to_json()


def bucket_budget(
    index: int, bucket_bytes: int, first_bucket_bytes: Optional[int]
) -> int:
    """Bucket `index`'s byte budget: with `first_bucket_bytes`, the first
    buckets ramp up (x4 each) to `bucket_bytes`, so the wire starts while the
    sender packs the big ones."""
    if first_bucket_bytes is None:
        return bucket_bytes
    return min(bucket_bytes, first_bucket_bytes * 4**index)


def plan_counts(
    named_sizes: Iterable[tuple[str, int]],
    bucket_bytes: int,
    first_bucket_bytes: Optional[int] = None,
) -> list[int]:
    """The greedy rule every planner shares: how many consecutive tensors
    each bucket takes, given each tensor's (name, byte count). Order is kept,
    every tensor appears once, no bucket exceeds its budget (`bucket_budget`)
    unless one tensor alone does (then it gets a bucket of its own)."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")
    if first_bucket_bytes is not None and first_bucket_bytes <= 0:
        raise ValueError(f"first_bucket_bytes must be > 0, got {first_bucket_bytes}")
    counts: list[int] = []
    count = nbytes = 0
    seen: set[str] = set()
    for name, size in named_sizes:
        if name in seen:
            raise ValueError(f"duplicate tensor name {name!r}")
        seen.add(name)
        budget = bucket_budget(len(counts), bucket_bytes, first_bucket_bytes)
        if count and nbytes + size > budget:
            counts.append(count)
            count = nbytes = 0
        count += 1
        nbytes += size
    if count:
        counts.append(count)
    return counts


def plan_buckets(
    named_tensors: Iterable[tuple[str, torch.Tensor]],
    bucket_bytes: int,
    first_bucket_bytes: Optional[int] = None,
) -> list[Bucket]:
    """Greedy and deterministic (`plan_counts`): order is kept, every tensor
    appears once, no bucket exceeds its budget unless one tensor alone does."""
    pairs = list(named_tensors)
    counts = plan_counts(
        ((name, t.numel() * t.element_size()) for name, t in pairs),
        bucket_bytes,
        first_bucket_bytes,
    )
    buckets: list[Bucket] = []
    start = 0
    for count in counts:
        chunk = pairs[start : start + count]
        start += count
        buckets.append(
            Bucket(
                names=[name for name, _ in chunk],
                tensors=[t for _, t in chunk],
                nbytes=sum(t.numel() * t.element_size() for _, t in chunk),
            )
        )
    return buckets


@dataclass
class BucketPlan:
    """A bucket planned from specs: which tensors it will hold, not the
    tensors themselves."""

    specs: list[TensorSpec]

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.specs]

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.specs)

    def metadata(self, digest: Optional[str] = None) -> BucketMetadata:
        return BucketMetadata(
            names=self.names,
            dtypes=[dtype_name(s.dtype) for s in self.specs],
            shapes=[list(s.shape) for s in self.specs],
            digest=digest,
        )


def plan_spec_buckets(
    specs: Iterable[SpecLike],
    bucket_bytes: int,
    first_bucket_bytes: Optional[int] = None,
) -> list[BucketPlan]:
    """`plan_buckets` from specs alone: the same buckets for the same names
    and sizes, without a byte of data."""
    resolved = [as_spec(s) for s in specs]
    counts = plan_counts(
        ((s.name, s.nbytes) for s in resolved), bucket_bytes, first_bucket_bytes
    )
    plans: list[BucketPlan] = []
    start = 0
    for count in counts:
        plans.append(BucketPlan(resolved[start : start + count]))
        start += count
    return plans
