"""JSON request bodies for rlsync's own HTTP services (the router and the
trainer's control API): bounded while they are read, parsed strictly, and
refused with a `ValueError` naming `body` when they are not a JSON object of
valid Unicode. Python's `json` accepts lone UTF-16 surrogates (`"\\ud800"`),
which then fail every encoder that answers or logs them: refused here, not
echoed later as a 500."""

from __future__ import annotations

import json
from typing import Any, AsyncIterator

# A prepare body for a large model is a few MiB; SGLang's own bound is 16 MiB.
DEFAULT_MAX_BODY_BYTES = 64 << 20


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_json_object(raw: bytes, empty_ok: bool = True) -> dict:
    """`raw` as a JSON object ({} when empty, if `empty_ok`); ValueError
    naming `body`."""
    if not raw.strip():
        if empty_ok:
            return {}
        raise ValueError("body: expected a JSON object, got nothing")
    try:
        body = json.loads(raw, parse_constant=_no_constant)
    except ValueError as e:  # also bytes that are not UTF-8
        raise ValueError(f"body: not JSON: {e}") from e
    except RecursionError:
        raise ValueError("body: nested too deeply") from None
    if not isinstance(body, dict):
        raise ValueError(f"body: expected a JSON object, got {type(body).__name__}")
    for key, value in body.items():
        if not _is_unicode(key) or not _is_unicode(value):
            name = key if _is_unicode(key) else ascii(key)
            raise ValueError(f"{name}: holds a lone UTF-16 surrogate, not Unicode")
    return body


def _is_unicode(value: Any) -> bool:
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    except RecursionError:
        raise ValueError("body: nested too deeply") from None
    return True


async def read_json_object(
    chunks: AsyncIterator[bytes],
    max_bytes: int = DEFAULT_MAX_BODY_BYTES,
    empty_ok: bool = True,
) -> dict:
    """The body from its chunks (Starlette's `request.stream()`), refused
    once it passes `max_bytes` without reading the rest."""
    parts, size = [], 0
    async for chunk in chunks:
        size += len(chunk)
        if size > max_bytes:
            raise BodyTooLarge(f"body: larger than {_size(max_bytes)}")
        parts.append(chunk)
    return parse_json_object(b"".join(parts), empty_ok)


def _size(num_bytes: int) -> str:
    if num_bytes >= 1 << 20:
        return f"{num_bytes / (1 << 20):g} MiB"
    return f"{num_bytes / (1 << 10):g} KiB"


class BodyTooLarge(ValueError):
    """A body past the bound: answer 413."""
