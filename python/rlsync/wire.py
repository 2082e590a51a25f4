"""How a sync's bytes reach the engines. Every broadcast a `WeightSender`
makes during a sync (each bucket's bytes, each tensor's in the per-tensor
layout, each bucket header) goes through one `Wire`; the default is
torch.distributed's broadcast from rank 0 of the update group.

A subclass wraps it, to trace or count what is sent, or to inject the
faults of a broken transport (bytes changed, broadcasts that never go, a
collective that fails) and check that the engines catch them: the soak
(`make soak`) and the tests do. A wire that sends other bytes than it is
given, or none, is exactly such a fault: the engines' digests and byte
counts are what must catch it.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist


class Wire:
    def broadcast(
        self,
        tensor: torch.Tensor,
        group: dist.ProcessGroup,
        *,
        bucket: int,
        header: bool,
        async_op: bool = False,
    ) -> Optional[dist.Work]:
        """Broadcast `tensor` from rank 0 of `group`: bucket `bucket`'s
        header (`header`), or its bytes (one call per bucket in the
        flattened layout, one per tensor in the per-tensor layout). With
        `async_op`, the work to wait for (anything with `wait()`)."""
        return dist.broadcast(tensor, src=0, group=group, async_op=async_op)


DEFAULT_WIRE = Wire()
