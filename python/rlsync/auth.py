"""Keys on the wire: what a key may hold, the `Authorization` header a
trainer sends (`bearer_headers`), and how the library's own services (the
admin router, the trainer's control API) check the one they receive."""

from __future__ import annotations

import hmac
from typing import Iterable, Optional, Union


def visible_ascii(value: Union[str, bytes]) -> bool:
    """Visible ASCII, no spaces: what a key may hold."""
    if isinstance(value, bytes):
        return bool(value) and all(0x21 <= b <= 0x7E for b in value)
    return bool(value) and all("!" <= c <= "~" for c in value)


def check_key(name: str, key: str) -> bytes:
    """A key goes into an HTTP header: visible ASCII only, no spaces. The
    key's bytes; a ValueError names the argument, never the key."""
    if not isinstance(key, str) or not visible_ascii(key):
        raise ValueError(
            f"{name}: a key must be visible ASCII characters without spaces"
        )
    return key.encode("ascii")


def authorization(raw_headers: Iterable[tuple[bytes, bytes]]) -> list[bytes]:
    """Every Authorization header of a request, as the bytes that came."""
    return [v for k, v in raw_headers if k.lower() == b"authorization"]


def bearer_ok(raw_headers: Iterable[tuple[bytes, bytes]], key: bytes) -> bool:
    """True when exactly one Authorization header carries `Bearer <key>`.
    Works on the raw bytes (a server's str view of a header is latin-1, and
    hmac refuses non-ASCII str), so any byte a caller sends is a no, never an
    error; compared in constant time."""
    values = authorization(raw_headers)
    if len(values) != 1:
        return False
    scheme, _, token = values[0].strip().partition(b" ")
    if scheme.lower() != b"bearer":
        return False
    return hmac.compare_digest(token.strip(), key)


def bearer_headers(
    admin_key: Optional[str] = None, api_key: Optional[str] = None
) -> dict[str, str]:
    """`Authorization: Bearer <key>`: the admin key where one is given, else
    the API key (a server run with `--api-key` alone guards its admin routes
    with that key), else nothing."""
    for name, key in (("admin_key", admin_key), ("api_key", api_key)):
        if key:
            check_key(name, key)
            return {"Authorization": f"Bearer {key}"}
    return {}
