"""Streaming weights: metadata up front, tensors one at a time.

A trainer that cannot (or should not) hold its whole model on rank 0 at once
describes it first, `specs_of(model)` (names, dtypes, shapes: no data), and
then yields the tensors in that order, each made when it is needed:

    specs = specs_of(model)
    sender.sync_stream(specs, fsdp_full_tensors(model), weight_version="step-7")

`WeightSender.sync_stream` prepares every engine from the specs alone, pulls
each tensor only as it packs the bucket that holds it, checks it against its
spec (`TensorStream`), and drops a bucket once its broadcast has ended: at
most two buckets' tensors are alive at once.

With FSDP2 (`torch.distributed.fsdp.fully_shard`) or any DTensor module,
`fsdp_full_tensors` gathers one parameter at a time. The gather is a
collective: every trainer rank iterates the generator, in the same order.
Rank 0 hands it to `sync_stream`; every other rank calls
`drive_gathers(fsdp_full_tensors(model))`, which takes part in each gather
and drops the result. If `sync_stream` raises on rank 0 before the
generator is exhausted, rank 0 still drives the rest of it
(`drive_gathers(generator)`), or the other ranks wait in their gathers.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, AsyncIterator
from typing import Any, Iterable, Iterator, Mapping, Optional, Sequence, Union

import torch

from rlsync.planner import BucketPlan, SpecLike, TensorSpec, as_spec

Weights = Union[
    torch.nn.Module, Mapping[str, torch.Tensor], Iterable[tuple[str, torch.Tensor]]
]
# What a tensor stream yields: tensors, or (name, tensor) pairs whose names
# are checked against the specs too.
TensorItem = Union[torch.Tensor, tuple[str, torch.Tensor]]

__all__ = [
    "AsyncTensorPull",
    "SpecLike",
    "StreamMismatch",
    "TensorItem",
    "TensorSpec",
    "TensorStream",
    "Weights",
    "as_specs",
    "drive_gathers",
    "fsdp_full_tensors",
    "named_tensors",
    "specs_of",
]


def named_tensors(weights: Weights) -> Iterable[tuple[str, torch.Tensor]]:
    """(name, tensor) pairs of a module's parameters, a state dict or any
    iterable of pairs; tensors are referenced, never copied."""
    if isinstance(weights, torch.nn.Module):
        return weights.named_parameters()
    if isinstance(weights, Mapping):
        return weights.items()
    return weights


def specs_of(weights: Weights) -> list[TensorSpec]:
    """The spec of every tensor of a module (its parameters), a state dict or
    (name, tensor) pairs, in their order, without reading any data: a
    DTensor's (an FSDP2 parameter's) shape is already its global shape, so
    nothing is gathered."""
    return [TensorSpec.of(name, tensor) for name, tensor in named_tensors(weights)]


def as_specs(specs: Iterable[SpecLike]) -> list[TensorSpec]:
    """TensorSpecs from TensorSpecs or `(name, dtype, shape)` tuples."""
    return [as_spec(s) for s in specs]


def _is_dtensor(tensor: torch.Tensor) -> bool:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch built without distributed
        return False
    return isinstance(tensor, DTensor)


class StreamMismatch(ValueError):
    """A tensor stream that disagrees with its specs: a tensor of another
    name, dtype or shape, or a stream that ends early or yields too many."""


class TensorStream:
    """Tensors pulled one at a time from `tensors` in the order of `specs`,
    each checked against its spec; holds no tensor itself."""

    def __init__(self, specs: Sequence[TensorSpec], tensors: Iterable[TensorItem]):
        self.specs = specs
        self.pulled = 0
        self._tensors = iter(tensors)

    def pull(self) -> torch.Tensor:
        """The next tensor; StreamMismatch, naming it, unless it matches."""
        index = self.pulled
        if index >= len(self.specs):
            raise RuntimeError("every spec's tensor was pulled already")
        spec = self.specs[index]
        try:
            item = next(self._tensors)
        except StopIteration:
            raise StreamMismatch(
                f"the tensor stream ended after {index} tensor(s); the specs "
                f"name {len(self.specs)} (next: {spec.name!r})"
            ) from None
        self.pulled += 1
        name, tensor = _split(item, index, spec)
        if _is_dtensor(tensor):
            raise StreamMismatch(
                f"tensor {index} {spec.name!r}: a DTensor (a shard); send its "
                "full tensor (`fsdp_full_tensors`)"
            )
        wrong = spec.mismatch(tensor, name)
        if wrong:
            raise StreamMismatch(f"tensor {index} {spec.name!r}: {wrong}")
        return tensor

    def pull_bucket(self, plan: BucketPlan) -> list[torch.Tensor]:
        """The tensors of the next bucket, checked."""
        return [self.pull() for _ in plan.specs]

    def finish(self) -> None:
        """StreamMismatch unless the stream ends with the last spec."""
        if self.pulled != len(self.specs):
            raise RuntimeError("tensors left to pull")
        try:
            next(self._tensors)
        except StopIteration:
            return
        raise StreamMismatch(
            f"the tensor stream yields more than the {len(self.specs)} "
            "tensor(s) the specs name"
        )


def _split(
    item: Any, index: int, spec: TensorSpec
) -> tuple[Optional[str], torch.Tensor]:
    if isinstance(item, torch.Tensor):
        return None, item
    if (
        isinstance(item, tuple)
        and len(item) == 2
        and isinstance(item[0], str)
        and isinstance(item[1], torch.Tensor)
    ):
        return item[0], item[1]
    raise StreamMismatch(
        f"tensor {index} {spec.name!r}: expected a tensor or a (name, tensor) "
        f"pair, got {type(item).__name__}"
    )


class AsyncTensorPull:
    """An async iterator of tensors (an `async def` generator, as frameworks'
    `send_weights(generator)` hooks pass) as a plain iterator for the sending
    thread: each `next()` pulls one item on the event loop `loop` and waits
    for it. Nothing is pulled ahead (a one-slot handoff), so the sender's
    two-bucket bound holds as for a plain generator. Never iterate it on the
    loop's own thread."""

    def __init__(
        self, items: AsyncIterable[TensorItem], loop: asyncio.AbstractEventLoop
    ):
        self._items: AsyncIterator[TensorItem] = items.__aiter__()
        self._loop = loop

    def __iter__(self) -> "AsyncTensorPull":
        return self

    def __next__(self) -> TensorItem:
        more, item = asyncio.run_coroutine_threadsafe(self._pull(), self._loop).result()
        if not more:
            raise StopIteration
        return item

    async def _pull(self) -> tuple[bool, Any]:
        try:
            return True, await self._items.__anext__()
        except StopAsyncIteration:
            return False, None


def fsdp_full_tensors(
    module: torch.nn.Module,
) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full tensor) for each parameter of an FSDP2 (`fully_shard`) or
    DTensor module, in `named_parameters()` order, gathered one parameter at
    a time (`DTensor.full_tensor()`); a parameter that is not a DTensor comes
    as it is (detached). The gather is a collective: every rank of the
    parameters' mesh iterates this, in the same order; rank 0 passes it to
    `WeightSender.sync_stream`, the others to `drive_gathers`. Each rank
    holds one gathered parameter at a time (plus what its consumer keeps)."""
    for name, param in module.named_parameters():
        with torch.no_grad():
            if _is_dtensor(param):
                tensor = param.full_tensor()
            else:
                tensor = param.detach()
        yield name, tensor
        del tensor  # not kept while the next one is gathered


def drive_gathers(tensors: Iterable[Any]) -> int:
    """Exhaust a tensor generator (`fsdp_full_tensors` on the ranks that do
    not send), dropping each item: every gather it runs takes place. The
    number of items."""
    count = 0
    for _ in tensors:
        count += 1
    return count
