"""The checks /release_memory_occupation and /resume_memory_occupation make
before they change anything. The scheduler asserts that a release finds the
server idle and removes each resumed tag from the released ones: a release
while a request runs (a health check's generate too), a resume of what was
not released or of a tag given twice, or a tag nobody knows ended the
scheduler with an AssertionError or a KeyError. Each is now refused, with
nothing changed, and the caller gets a 400 that says why.

Every TP rank of a replica decides the same (they share its requests and
its released tags); each DP replica decides for itself, and the answer
says how many did what was asked when some did not.
"""

from __future__ import annotations

from collections import Counter
from typing import Collection, List, Optional, Sequence

import torch

from sglang.srt.constants import GPU_MEMORY_ALL_TYPES


def memory_release_refusal(
    tags: Optional[List[str]], released: Collection[str], idle: bool
) -> Optional[str]:
    """Why a release of `tags` (None or []: every type) may not run now."""
    asked = _asked(tags)
    malformed = _malformed(asked)
    if malformed:
        return f"{malformed}; nothing was released"
    again = [tag for tag in asked if tag in released]
    if again:
        return (
            f"tags: {', '.join(again)} released already; resume before "
            f"releasing again; nothing was released"
        )
    if not idle:
        return (
            "the server is not idle (requests are running, waiting or paused "
            "in place): a release needs an idle server; let them finish, or "
            "pause generation with mode 'abort', then release; nothing was "
            "released"
        )
    return None


def memory_resume_refusal(
    tags: Optional[List[str]], released: Collection[str]
) -> Optional[str]:
    """Why a resume of `tags` (None or []: every type) may not run now."""
    asked = _asked(tags)
    malformed = _malformed(asked)
    if malformed:
        return f"{malformed}; nothing was resumed"
    missing = [tag for tag in asked if tag not in released]
    if missing:
        return (
            f"tags: {', '.join(missing)} not released (released: "
            f"{', '.join(sorted(released)) or 'none'}); nothing was resumed"
        )
    return None


def agreed_refusal(refusal: Optional[str], group) -> Optional[str]:
    """The refusal every rank of `group` (the TP CPU group) acts on: the
    first rank's, if any refused. With attention data parallelism each
    rank holds its own requests, so ranks may see idleness differently; a
    rank that refused while the others released left them waiting in a
    barrier. A collective: every rank of the group must call it."""
    if group is None or torch.distributed.get_world_size(group) == 1:
        return refusal
    refusals: List[Optional[str]] = [None] * torch.distributed.get_world_size(group)
    torch.distributed.all_gather_object(refusals, refusal, group=group)
    return next((r for r in refusals if r is not None), None)


def raise_refusals(outputs: Sequence, done: str) -> None:
    """The tokenizer's side: ValueError (a 400 on the HTTP route) when a
    replica refused; `done` says what the others did ("released")."""
    refused = [output.message for output in outputs if not output.success]
    if not refused:
        return
    message = "; ".join(dict.fromkeys(refused))
    if len(refused) < len(outputs):
        message += (
            f" ({len(refused)} of {len(outputs)} DP replicas refused; the "
            f"others {done})"
        )
    raise ValueError(message)


def _asked(tags: Optional[List[str]]) -> List[str]:
    return list(tags) if tags else list(GPU_MEMORY_ALL_TYPES)


def _malformed(tags: List[str]) -> Optional[str]:
    """Tags nobody knows, or one given twice (a resume removes each
    tag it is given from the released ones: a second removal ended it)."""
    unknown = [tag for tag in tags if tag not in GPU_MEMORY_ALL_TYPES]
    if unknown:
        named = ", ".join(repr(tag[:64]) for tag in unknown[:_NAMED])
        more = f" and {len(unknown) - _NAMED} more" if len(unknown) > _NAMED else ""
        return (
            f"tags: unknown {named}{more} (known: "
            f"{', '.join(GPU_MEMORY_ALL_TYPES)})"
        )
    twice = sorted(tag for tag, times in Counter(tags).items() if times > 1)
    if twice:
        return f"tags: {', '.join(twice)} given more than once"
    return None


# How many unknown tags a refusal names
_NAMED = 8
