"""One two-phase session whose update several senders stream, each over its
own update group: a pipeline-parallel trainer creates a group per stage, and
each stage's last rank sends only its stage's layers, so no trainer rank
holds more than its stage.

Each share has a receiver of its own (a thread, on CUDA a stream, and bucket
buffers), and every share loads into the one staged copy of the weights, one
bucket at a time. The session waits for, verifies, aborts and applies the
shares together: nothing is applied until every share has arrived and
verified on every rank, and aborting the session aborts every share.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import torch

from sglang.srt.weight_sync.staged_receiver import (
    BucketSpec,
    GroupReceiver,
    ReceiveStats,
    WeightsUpdateError,
    parse_buckets,
)

# Update groups one session may span (a pipeline of this many stages).
MAX_SHARES = 64


@dataclass
class ShareSpec:
    """One sender's part of the update: its group and its buckets."""

    group_name: str
    buckets: List[BucketSpec]


def parse_shares(
    group_name: str,
    num_buckets: Any,
    buckets: Any,
    shares: Optional[List[Any]],
    load_format: Optional[str],
    is_known_name: Optional[Callable[[str], bool]] = None,
) -> List[ShareSpec]:
    """The update's shares: the top-level buckets are `group_name`'s, then
    each of `shares` (`{group_name, num_buckets, buckets}`) another group's.
    Every error names its field; a tensor may be in one share only."""
    out = [
        ShareSpec(
            group_name, parse_buckets(num_buckets, buckets, load_format, is_known_name)
        )
    ]
    if shares is None:
        return out
    if not isinstance(shares, list):
        raise WeightsUpdateError("shares: must be a list")
    if len(shares) + 1 > MAX_SHARES:
        raise WeightsUpdateError(
            f"shares: {len(shares)} shares, at most {MAX_SHARES - 1} besides "
            f"group_name's"
        )
    for k, share in enumerate(shares):
        where = f"shares[{k}]"
        if not isinstance(share, dict):
            raise WeightsUpdateError(
                f"{where}: must be an object with group_name, num_buckets, buckets"
            )
        unknown = set(share) - {"group_name", "num_buckets", "buckets"}
        if unknown:
            raise WeightsUpdateError(f"{where}: unknown field(s) {sorted(unknown)}")
        name = share.get("group_name")
        if not isinstance(name, str) or not name:
            raise WeightsUpdateError(f"{where}.group_name: must be a non-empty string")
        if any(s.group_name == name for s in out):
            raise WeightsUpdateError(
                f"{where}.group_name: group '{name}' already sends a share of "
                f"this update"
            )
        try:
            specs = parse_buckets(
                share.get("num_buckets"),
                share.get("buckets"),
                load_format,
                is_known_name,
            )
        except WeightsUpdateError as e:
            raise WeightsUpdateError(f"{where}.{e}", e.status_code) from None
        out.append(ShareSpec(name, specs))
    _check_disjoint(out)
    return out


def _check_disjoint(shares: Sequence[ShareSpec]) -> None:
    seen: Dict[str, str] = {}
    for k, share in enumerate(shares):
        prefix = "" if k == 0 else f"shares[{k - 1}]."
        for bucket in share.buckets:
            for i, spec in enumerate(bucket.tensors):
                where = f"{prefix}buckets[{bucket.index}].names[{i}]"
                if spec.name in seen:
                    raise WeightsUpdateError(
                        f"{where}: {spec.name!r} is also sent at {seen[spec.name]}; "
                        f"each tensor belongs to one share"
                    )
                seen[spec.name] = where


def check_one_owner(
    shares: Sequence[ShareSpec], target_of: Callable[[str], Tuple[str, Any]]
) -> None:
    """No two shares load into the same part of one parameter (`target_of`
    maps a name to its parameter and the shard of it the name fills, None
    for the whole): the shares arrive in no fixed order, so which one
    would win is chance. A fused parameter's shards may come from
    different shares (q_proj from one, k_proj from another)."""
    owners: Dict[Tuple[str, Any], str] = {}
    wholes: Dict[str, str] = {}
    parts: Dict[str, str] = {}
    for k, share in enumerate(shares):
        prefix = "" if k == 0 else f"shares[{k - 1}]."
        for bucket in share.buckets:
            for i, spec in enumerate(bucket.tensors):
                where = f"{prefix}buckets[{bucket.index}].names[{i}]"
                param, shard = target_of(spec.name)
                clash = (
                    owners.get((param, shard))
                    if shard is not None
                    else parts.get(param) or wholes.get(param)
                )
                if shard is not None and clash is None:
                    clash = wholes.get(param)
                if clash is not None and not clash.startswith(prefix + "buckets"):
                    raise WeightsUpdateError(
                        f"{where}: {spec.name!r} loads into the same part of "
                        f"{param!r} as {clash}, which another share sends; "
                        f"each parameter part belongs to one share"
                    )
                owners[(param, shard)] = where
                if shard is None:
                    wholes.setdefault(param, where)
                else:
                    parts.setdefault(param, where)


class SerialSink:
    """The staged copy as every share's receivers reach it: `begin` runs
    once, before the first bucket of any share is loaded, and one bucket is
    loaded at a time (the loader is not written for concurrent callers)."""

    def __init__(
        self,
        begin: Callable[[], None],
        load: Callable[[Iterable[Tuple[str, torch.Tensor]]], None],
    ):
        self._begin, self._load = begin, load
        self._lock = threading.Lock()
        self._begun = False

    def begin(self) -> None:
        with self._lock:
            if not self._begun:
                self._begin()
                self._begun = True

    def load(self, named_tensors: Iterable[Tuple[str, torch.Tensor]]) -> None:
        with self._lock:
            self._load(named_tensors)


class SharedSessionReceiver:
    """The receivers of a session's shares, seen as one receiver. Buckets and
    digests are in share order: group_name's, then each of `shares`'."""

    def __init__(self, shares: List[Tuple[str, GroupReceiver]]):
        self.shares = shares
        first = shares[0][1]
        self.defer_digests = getattr(first, "defer_digests", False)
        self.buckets: List[BucketSpec] = []
        # Where each share's buckets start in `buckets`.
        self._starts: List[int] = []
        for _, receiver in shares:
            self._starts.append(len(self.buckets))
            self.buckets += [
                dataclasses.replace(bucket, index=len(self.buckets) + i)
                for i, bucket in enumerate(receiver.buckets)
            ]
        self.total_bytes = sum(b.nbytes for b in self.buckets)
        # After abort(): whether each share's group can still be used.
        self.usable: Dict[str, bool] = {}

    @property
    def group_names(self) -> List[str]:
        return [name for name, _ in self.shares]

    @property
    def stats(self) -> ReceiveStats:
        parts = [receiver.stats for _, receiver in self.shares]
        return ReceiveStats(
            bytes_received=sum(p.bytes_received for p in parts),
            buckets_received=sum(p.buckets_received for p in parts),
            receive_seconds=max(p.receive_seconds for p in parts),
            verify_seconds=sum(p.verify_seconds for p in parts),
            load_seconds=sum(p.load_seconds for p in parts),
            staging_reused=all(p.staging_reused for p in parts),
        )

    @property
    def error(self) -> Optional[str]:
        errors = [
            f"group '{name}': {receiver.error}"
            for name, receiver in self.shares
            if receiver.error is not None
        ]
        return "; ".join(errors) or None

    @property
    def pending_works(self) -> List[Any]:
        return [w for _, receiver in self.shares for w in receiver.pending_works]

    @property
    def landed_digests(self) -> Dict[int, str]:
        out = {}
        for start, (_, receiver) in zip(self._starts, self.shares):
            for index, digest in getattr(receiver, "landed_digests", {}).items():
                out[start + index] = digest
        return out

    def start(self) -> None:
        for _, receiver in self.shares:
            receiver.start()

    def wait(self, timeout: Optional[float]) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        for _, receiver in self.shares:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not receiver.wait(left):
                return False
        return True

    @property
    def done(self) -> bool:
        return all(receiver.done for _, receiver in self.shares)

    @property
    def complete(self) -> bool:
        return all(receiver.complete for _, receiver in self.shares)

    def abort(
        self,
        timeout: float = 5.0,
        sender_grace: float = 0.0,
        graced_groups: Optional[Sequence[str]] = None,
    ) -> bool:
        """Abort every share (each within `timeout`); True when every
        share's group can still be used, `usable` says which can. The
        receivers of `graced_groups` (default: all) get `sender_grace`
        seconds to take their sender's abort header."""
        for name, receiver in self.shares:
            graced = graced_groups is None or name in graced_groups
            self.usable[name] = receiver.abort(timeout, sender_grace if graced else 0)
        return all(self.usable.values())

    def synchronize(self) -> None:
        for _, receiver in self.shares:
            receiver.synchronize()

    def verify(self, digests: Optional[Sequence[str]] = None) -> List[str]:
        errors = []
        for start, (name, receiver) in zip(self._starts, self.shares):
            part = None
            if digests is not None:
                part = list(digests[start : start + len(receiver.buckets)])
            errors += [f"group '{name}': {e}" for e in receiver.verify(part)]
        return errors
