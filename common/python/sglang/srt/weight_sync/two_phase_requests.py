"""The two-phase weight update's requests and answers on the tokenizer and
HTTP side: the prepare body parsed and checked
off the event loop, validation errors that name the field, the JSON answer,
the message of a complete that ran out of time, and the writer lock taken
before a deadline.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import time
from typing import Any, Dict, List, Union

import msgspec
import pydantic

from sglang.srt.managers.io_struct import (
    AbortWeightsUpdateReqOutput,
    CompleteWeightsUpdateReqOutput,
    PrepareWeightsUpdateReqInput,
    PrepareWeightsUpdateReqOutput,
)
from sglang.srt.utils.aio_rwlock import RWLock
from sglang.srt.weight_sync.session_shares import parse_shares

# How long one complete attempt may hold the scheduler while bytes still arrive.
SCHEDULER_WAIT_S = 0.005


def timed_out_message(
    timeout: float, results: List[CompleteWeightsUpdateReqOutput]
) -> str:
    """Why a complete that ran out of time is still pending: bytes missing, or
    (every byte verified) a cache flush waiting for in-flight requests."""
    if all(r.ready_to_apply for r in results):
        return (
            f"timed out after {timeout:g}s waiting for the in-flight requests "
            f"to finish before the cache flush (every bucket received and "
            f"verified, nothing applied); complete again or abort"
        )
    received = min(r.num_buckets_received for r in results)
    return (
        f"timed out after {timeout:g}s with {received} buckets received; "
        f"complete again or abort"
    )


async def acquire_writer_before(lock: RWLock, deadline: float) -> bool:
    """The writer lock (in-flight requests finish, new ones wait), unless
    the deadline passes first."""
    try:
        await asyncio.wait_for(
            lock.acquire_writer(), max(0.0, deadline - time.monotonic())
        )
        return True
    except asyncio.TimeoutError:
        # Readers that queued behind the waiting writer may go on now.
        async with lock._lock:
            lock._cond.notify_all()
        return False


def parse_prepare_body(body: bytes) -> PrepareWeightsUpdateReqInput:
    """The request from its JSON body, with every check that needs no model
    (types, lengths, dtypes, shapes, duplicates, digests); ValueError naming
    the field otherwise. Runs in a thread: parsing a large body on the event
    loop, or checking it on the scheduler, would stall serving."""
    try:
        payload = json.loads(body)
    except ValueError as e:
        raise ValueError(f"body: not JSON ({e})") from None
    except RecursionError:
        raise ValueError("body: nested too deeply") from None
    if not isinstance(payload, dict):
        raise ValueError("body: must be a JSON object")
    unknown = sorted(set(payload) - _PREPARE_FIELDS)
    if unknown:
        name = unknown[0]
        if not 0 < len(name) <= 64:  # an empty or long name: quoted, cut short
            name = repr(name[:64]) + ("..." if len(name) > 64 else "")
        raise ValueError(
            f"{name}: not a field of a prepare (its fields: {_PREPARE_FIELDS_TEXT})"
        )
    try:
        obj = _PREPARE_ADAPTER.validate_python(payload)
    except pydantic.ValidationError as e:
        raise ValueError(validation_message(e)) from None
    parse_shares(
        obj.group_name, obj.num_buckets, obj.buckets, obj.shares, obj.load_format
    )
    return obj


def validation_message(error: pydantic.ValidationError) -> str:
    # A msgspec request validates as "an instance, or a dict built into one":
    # the error that names the field is the dict branch's, under its own loc.
    errors = error.errors()
    first = next((e for e in errors if e["type"] != "is_instance_of"), errors[0])
    message = str(first.get("msg", "invalid"))
    loc = first.get("loc", ())
    if loc and str(loc[0]).startswith("function-after["):
        loc = loc[1:]
    where = ".".join(str(part) for part in loc)
    if not where:  # raised by the request's own checks, which name the field
        return message.removeprefix("Value error, ")
    return f"{where}: {message}"


def check_as_its_route(obj: Any) -> None:
    """Check a two-phase request built in Python (the offline Engine's) as
    its HTTP route checks one it parses: strict types ("false" is no flag,
    "1" no count, a string no list), which a request's constructor does not
    check. ValueError naming the field otherwise."""
    if isinstance(obj, msgspec.Struct):
        fields = msgspec.structs.asdict(obj)
    else:
        fields = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    try:
        _adapter_of(type(obj)).validate_python(fields)
    except pydantic.ValidationError as e:
        raise ValueError(validation_message(e)) from None


@functools.lru_cache(maxsize=None)
def _adapter_of(request_class: type) -> pydantic.TypeAdapter:
    return pydantic.TypeAdapter(request_class)


def two_phase_response_content(
    output: Union[
        PrepareWeightsUpdateReqOutput,
        CompleteWeightsUpdateReqOutput,
        AbortWeightsUpdateReqOutput,
    ],
) -> Dict[str, Any]:
    """The JSON answer: the output's fields less routing and the HTTP status."""
    if isinstance(output, msgspec.Struct):
        content = msgspec.structs.asdict(output)
    else:
        content = dataclasses.asdict(output)
    for key in ("rid", "http_worker_ipc", "status_code", "session_open", "pending"):
        content.pop(key, None)
    return content


_PREPARE_ADAPTER = pydantic.TypeAdapter(PrepareWeightsUpdateReqInput)
# A prepare's fields (a dataclass's or a msgspec struct's): another one in
# the body (a misspelt "load_fromat") is a 400 naming it, not a default
# silently taken.
_PREPARE_FIELDS = frozenset(
    getattr(PrepareWeightsUpdateReqInput, "__struct_fields__", None)
    or PrepareWeightsUpdateReqInput.__dataclass_fields__
)
_PREPARE_FIELDS_TEXT = ", ".join(sorted(_PREPARE_FIELDS - {"rid", "http_worker_ipc"}))
