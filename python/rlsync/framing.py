"""The sender's side of a framed two-phase session: a header before each
bucket, and, when the sync fails while this sender is alive and its group is
sound, an abort header in place of the next bucket. Every engine's posted
receive then ends in step with the sender, nothing is left posted, and the
group stays usable: an abort costs no group re-initialisation. Only a sender
that dies, or a broken collective, still leaves the group to be destroyed.
"""

from __future__ import annotations

from typing import Callable, Optional, TypeVar, Union

import torch
import torch.distributed as dist

from rlsync.bucket_header import ABORT, DATA, make_header
from rlsync.wire import DEFAULT_WIRE, Wire

T = TypeVar("T")


class BucketFraming:
    def __init__(
        self,
        session_id: str,
        group: dist.ProcessGroup,
        buckets: int,
        device: Union[str, torch.device],
        wire: Wire = DEFAULT_WIRE,
    ):
        self.session_id, self.group = session_id, group
        self.buckets, self.device = buckets, device
        self.wire = wire
        # The header the engines wait for next (none once every bucket went).
        self.next_index = 0
        # A collective on the group failed: nothing more may be sent on it.
        self.broken = False
        self.aborted = False

    def collective(self, call: Callable[[], T]) -> T:
        """Run a collective of the sync; a failure marks the group broken."""
        try:
            return call()
        except BaseException:
            self.broken = True
            raise

    def announce(self, index: int) -> None:
        """The header before bucket `index`."""
        header = make_header(self.session_id, index, DATA, self.device)
        self.collective(
            lambda: self.wire.broadcast(header, self.group, bucket=index, header=True)
        )
        self.next_index = index + 1

    def abort(self) -> bool:
        """Broadcast the abort header where the engines wait for the next
        bucket's; False where none waits (every bucket went) or the group is
        broken (then only an abort over HTTP, which destroys it, is left)."""
        if self.aborted:
            return True
        if self.broken or self.next_index >= self.buckets:
            return False
        index = self.next_index
        header = make_header(self.session_id, index, ABORT, self.device)
        self.collective(
            lambda: self.wire.broadcast(header, self.group, bucket=index, header=True)
        )
        self.aborted = True
        return True


def abort_on_failure(
    framing: Optional[BucketFraming], in_flight: Optional[dist.Work]
) -> None:
    """After a failure (an engine refused prepare, the data path broke): let
    the bucket on the wire finish, then abort in band, where the group is
    sound. Never raises: a failed abort leaves `aborted` False, and the
    abort over HTTP then gives the group up."""
    if framing is None or framing.broken:
        return
    try:
        if in_flight is not None:
            framing.collective(in_flight.wait)
        framing.abort()
    except Exception:
        pass  # the group is broken: the abort over HTTP destroys it
