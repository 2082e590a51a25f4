"""Plan buckets: named tensors, in order, under a byte budget per bucket."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Optional

import torch

from rlsync.protocol import BucketMetadata


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


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


def plan_buckets(
    named_tensors: Iterable[tuple[str, torch.Tensor]],
    bucket_bytes: int,
    first_bucket_bytes: Optional[int] = None,
) -> list[Bucket]:
    """Greedy and deterministic: order is kept, every tensor appears once, no
    bucket exceeds its budget (`bucket_budget`) unless one tensor alone does
    (then it gets a bucket of its own)."""
    assert bucket_bytes > 0, f"bucket_bytes must be > 0, got {bucket_bytes}"
    assert (
        first_bucket_bytes is None or first_bucket_bytes > 0
    ), f"first_bucket_bytes must be > 0, got {first_bucket_bytes}"
    buckets: list[Bucket] = []
    current = Bucket()
    seen: set[str] = set()
    for name, tensor in named_tensors:
        assert name not in seen, f"duplicate tensor name {name!r}"
        seen.add(name)
        size = tensor.numel() * tensor.element_size()
        budget = bucket_budget(len(buckets), bucket_bytes, first_bucket_bytes)
        if current.names and current.nbytes + size > budget:
            buckets.append(current)
            current = Bucket()
        current.names.append(name)
        current.tensors.append(tensor)
        current.nbytes += size
    if current.names:
        buckets.append(current)
    return buckets
