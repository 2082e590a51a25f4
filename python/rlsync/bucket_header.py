# Generated from common/python/sglang/srt/weight_sync/bucket_header.py by `make overlay`; do not edit.
"""Bucket headers of a framed two-phase weight update.

A sender that prepares with `framed` broadcasts a header before each bucket:
HEADER_WORDS int64 words, [HEADER_MAGIC, the session's tag, the bucket's
index, a command]. DATA: the bucket follows. ABORT: nothing follows, and
every receiver stops in step with the sender, leaving nothing posted on the
group, which stays usable: an abort the sender asks for costs no group
re-initialisation. The tag (63 bits of the session id's SHA-256) tells a
receiver that what follows belongs to its own session.

Imports only torch, so a sender can frame its buckets without SGLang.
"""

from __future__ import annotations

import hashlib
from typing import Optional, Tuple, Union

import torch

HEADER_MAGIC = 0x726C73796E6301  # the format's version in the low byte: 1
HEADER_WORDS = 4
DATA = 1
ABORT = 2


def session_tag(session_id: str) -> int:
    """63 bits of the session id's SHA-256 (a non-negative int64)."""
    digest = hashlib.sha256(session_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def make_header(
    session_id: str, index: int, command: int, device: Union[str, torch.device]
) -> torch.Tensor:
    """The header a sender broadcasts before bucket `index` (or in its place)."""
    words = [HEADER_MAGIC, session_tag(session_id), index, command]
    return torch.tensor(words, dtype=torch.int64, device=device)


def read_header(
    header: torch.Tensor, session_id: str, index: int
) -> Tuple[bool, Optional[str]]:
    """What a received header says where bucket `index` of the session was
    due: (the sender aborted, what is wrong with it or None)."""
    magic, tag, got, command = header.tolist()
    if magic != HEADER_MAGIC:
        return False, (
            f"bucket {index}: the sender sent no bucket header (the session "
            f"was prepared with framed=true)"
        )
    if tag != session_tag(session_id):
        return False, f"bucket {index}: the header names another session"
    if command == ABORT:
        return True, None
    if command != DATA or got != index:
        return False, (
            f"bucket {index}: the header announces bucket {got} (command "
            f"{command}); the sender and this receiver are out of step"
        )
    return False, None
