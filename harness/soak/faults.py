"""The soak's faults: which kinds there are, each sync's draw (seeded, made
before the first sync runs), and the transport a fault breaks.

Each fault reaches the sync through a seam `WeightSender` documents, never
through a copy of the sync:

| fault | injected through |
|---|---|
| trainer_killed | the progress callback SIGKILLs the trainer with bucket j on the wire |
| abort (transfer) | the tensor generator raises when bucket j is pulled |
| abort (complete_waiting) | the wire drops buckets j.. ; another thread aborts the session while complete waits |
| abort (verified) | `sync(apply=False)`, then an abort of its session |
| short_transfer | the wire drops buckets j.. (the engines' byte counts must notice) |
| corrupted_bucket | the wire changes one byte of bucket j after its digest was taken |
| wrong_shape | the trainer's tensors: one has a shape the served model lacks |
| destroy_during_session | the wire: before bucket j's header the operator destroys the group, and the next broadcast fails |
| engine_restart | one server restarted on its port between syncs |
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from harness.soak.common import Named
from rlsync.wire import Wire

FAULTS = (
    "none",
    "trainer_killed",
    "abort",
    "short_transfer",
    "corrupted_bucket",
    "wrong_shape",
    "destroy_during_session",
    "engine_restart",
)
# Syncs that must apply everywhere; every other fault must leave the old weights.
MUST_APPLY = ("none", "engine_restart")
# Faults the trainer survives and ends in band or over HTTP with every byte
# accounted for: the update group must stay usable (no re-initialisation).
KEEPS_GROUP = ("none", "corrupted_bucket", "wrong_shape", "abort")
ABORT_MOMENTS = ("transfer", "complete_waiting", "verified")


def keeps_group(kind: str, params: dict[str, Any]) -> bool:
    """Whether a sync with this fault must leave every group usable. An
    abort while complete waits for buckets that never come cannot: a posted
    receive is only cancelled by giving the group up."""
    return kind in KEEPS_GROUP and params.get("moment") != "complete_waiting"


def misshape(tensor: torch.Tensor, how: str) -> torch.Tensor:
    """The trainer's tensor under a shape the served model does not have."""
    if how == "transposed":
        return tensor.t().contiguous()
    if how == "one_row_short":
        return tensor[:-1].contiguous()
    raise ValueError(f"how must be 'transposed' or 'one_row_short', not {how!r}")


@dataclass
class SyncPlan:
    index: int
    kind: str
    flush_cache: bool
    params: dict[str, Any]
    pick: float  # which of the weight sets that neither server serves


class FaultPlanner:
    """Every sync's fault, drawn from one seeded generator."""

    def __init__(
        self,
        seed: int,
        kinds: tuple[str, ...],
        original: Named,
        bucket_sizes: list[int],
        servers: list[str],
        flush_cache: str,
    ) -> None:
        self.rng = random.Random(seed)
        self.kinds, self.original = kinds, original
        self.sizes, self.servers = bucket_sizes, servers
        self.flush_cache = flush_cache
        self.cycles: dict[str, list[str]] = {}

    def plan(self, syncs: int) -> list[SyncPlan]:
        """The kinds in seeded rounds (each kind once per round, in a random
        order), then each one's parameters and flush_cache, so that a seed
        gives the same faults whatever the servers do."""
        kinds: list[str] = []
        while len(kinds) < syncs:
            round_ = list(self.kinds)
            self.rng.shuffle(round_)
            kinds += round_
        plans = []
        for index, kind in enumerate(kinds[:syncs], start=1):
            flush = {"true": True, "false": False}.get(self.flush_cache)
            if flush is None:
                flush = self.rng.random() < 0.5
            params = self.draw(kind)
            plans.append(SyncPlan(index, kind, flush, params, self.rng.random()))
        return plans

    def cycle(self, key: str, options: list[str]) -> str:
        """The next of `options` in seeded shuffled cycles (each once per
        cycle), so that a variant of a fault is not left out by chance."""
        if not self.cycles.get(key):
            self.cycles[key] = self.rng.sample(options, len(options))
        return self.cycles[key].pop()

    def draw(self, kind: str) -> dict[str, Any]:
        """The fault's parameters."""
        rng, sizes = self.rng, self.sizes
        n = len(sizes)
        if kind == "trainer_killed":
            byte = rng.randrange(sum(sizes))
            starts = list(itertools.accumulate([0, *sizes]))
            j = max(i for i in range(n) if starts[i] <= byte)
            return {"byte": byte, "bucket": j, "bucket_offset": byte - starts[j]}
        if kind == "abort":
            moment = self.cycle(kind, list(ABORT_MOMENTS))
            if moment == "verified":
                return {"moment": moment}
            return {"moment": moment, "bucket": rng.randrange(n)}
        if kind in ("short_transfer", "destroy_during_session"):
            return {"bucket": rng.randrange(n), "of": n}
        if kind == "corrupted_bucket":
            j = rng.randrange(n)
            return {
                "bucket": j,
                "offset": rng.randrange(sizes[j]),
                "xor": rng.randrange(1, 256),
            }
        if kind == "wrong_shape":
            how = self.cycle(kind, ["one_row_short", "transposed"])
            # Transposing a square matrix would not change its shape.
            matrices = [
                (k, t)
                for k, t in self.original
                if t.dim() == 2 and (how != "transposed" or t.shape[0] != t.shape[1])
            ]
            name, t = rng.choice(matrices)
            return {
                "name": name,
                "how": how,
                "model_shape": list(t.shape),
                "sent_shape": list(misshape(t, how).shape),
            }
        if kind == "engine_restart":
            return {"server": self.cycle(kind, self.servers)}
        return {}


class FaultInjected(RuntimeError):
    """Raised where a fault makes the trainer's side fail."""


class _NotSent:
    """The work of a broadcast the wire dropped: nothing to wait for."""

    def wait(self, timeout: Any = None) -> bool:
        return True


class FaultyWire(Wire):
    """The soak trainer's transport: every broadcast goes through as it is,
    except what the armed fault says. Armed per sync; `disarm()` after."""

    def __init__(self) -> None:
        self.disarm()

    def disarm(self) -> None:
        self.corrupt: Optional[tuple[int, int, int]] = None  # bucket, offset, xor
        self.drop_from: Optional[int] = None
        self.fail_before: Optional[tuple[int, Callable[[], None]]] = None
        self.dropped = 0

    def broadcast(
        self,
        tensor: torch.Tensor,
        group: dist.ProcessGroup,
        *,
        bucket: int,
        header: bool,
        async_op: bool = False,
    ) -> Any:
        if self.drop_from is not None and bucket >= self.drop_from:
            self.dropped += 1
            return _NotSent() if async_op else None
        if header and self.fail_before is not None and bucket == self.fail_before[0]:
            self.fail_before[1]()
            raise FaultInjected(f"the broadcast of bucket {bucket}'s header failed")
        if not header and self.corrupt is not None and bucket == self.corrupt[0]:
            _, offset, xor = self.corrupt
            tensor = tensor.clone()  # the trainer's own bytes stay as they are
            tensor.view(-1).view(torch.uint8)[offset] ^= xor
        return super().broadcast(
            tensor, group, bucket=bucket, header=header, async_op=async_op
        )
