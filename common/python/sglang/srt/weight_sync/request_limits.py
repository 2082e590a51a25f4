"""Bound and check the bodies of weight-update requests before they are parsed.

Weight-update routes take --weight-update-max-request-mb; the routes whose
bodies carry tensors or adapters (/update_weights_from_tensor, _from_ipc, the
LoRA routes) take their own, larger --weight-update-max-tensor-request-mb.

FastAPI parses a JSON body on the event loop: a 60 MB /prepare_weights_update
(a million names) held every other request, generation included, for
seconds before validation could refuse it. This ASGI middleware reads the
body of the weight-update routes first and answers 413 once it passes the
limit, without parsing it. A body whose strings hold a lone UTF-16
surrogate ("\\ud800", which Python's json accepts) is a 400: echoed in an
answer or stored as a weight version it would make every later answer that
carries it a 500.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any, Awaitable, Callable, Dict, FrozenSet, Optional, Tuple

WEIGHT_UPDATE_ROUTES: FrozenSet[str] = frozenset(
    {
        "/init_weights_update_group",
        "/destroy_weights_update_group",
        "/update_weights_from_distributed",
        "/prepare_weights_update",
        "/complete_weights_update",
        "/abort_weights_update",
        "/weights_checker",
        "/get_weights_by_name",
        "/update_weights_from_disk",
        "/update_weight_version",
        "/begin_weight_update",
        "/end_weight_update",
    }
)
# Routes whose bodies carry serialized tensors, IPC handles or adapters.
TENSOR_BODY_ROUTES: FrozenSet[str] = frozenset(
    {
        "/update_weights_from_tensor",
        "/update_weights_from_ipc",
        "/load_lora_adapter",
        "/load_lora_adapter_from_tensors",
        "/unload_lora_adapter",
    }
)
# A \\uD800-\\uDFFF escape; whether it is lone is decided by parsing.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _route_path(scope: Dict) -> str:
    """The path the routes match: without the --fastapi-root-path prefix the
    server puts in front of it (the router strips it before matching)."""
    path, root = scope.get("path", ""), scope.get("root_path", "")
    if root and path.startswith(root):
        return path[len(root) :]
    return path


class WeightUpdateBodyLimit:
    def __init__(
        self, app: Any, limit_bytes: int, tensor_limit_bytes: Optional[int] = None
    ):
        self.app = app
        self.limits: Dict[str, Tuple[int, str]] = {
            route: (limit_bytes, "--weight-update-max-request-mb")
            for route in WEIGHT_UPDATE_ROUTES
        }
        if tensor_limit_bytes is not None:
            flag = "--weight-update-max-tensor-request-mb"
            for route in TENSOR_BODY_ROUTES:
                self.limits[route] = (tensor_limit_bytes, flag)

    async def __call__(self, scope: Dict, receive: Callable, send: Callable) -> None:
        path = _route_path(scope)
        if scope["type"] != "http" or path not in self.limits:
            await self.app(scope, receive, send)
            return
        limit, flag = self.limits[path]
        length = dict(scope.get("headers") or []).get(b"content-length", b"")
        if length.isdigit() and int(length) > limit:
            await self._refuse(send, limit, flag)
            return
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                await self.app(scope, _replay([message]), send)
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > limit:
                await self._refuse(send, limit, flag)
                return
            more = message.get("more_body", False)
        raw = b"".join(chunks)
        # Parsed off the event loop, and only when an escape is there.
        if _SURROGATE_ESCAPE.search(raw):
            field = await asyncio.to_thread(_lone_surrogate_field, raw)
            if field is not None:
                message = f"{field}: holds a lone UTF-16 surrogate, not Unicode"
                await _answer(send, 400, message)
                return
        body = {"type": "http.request", "body": raw, "more_body": False}
        await self.app(scope, _replay([body], receive), send)

    async def _refuse(self, send: Callable, limit: int, flag: str) -> None:
        await _answer(
            send, 413, f"body: larger than the {limit / 2**20:g} MiB {flag} allows"
        )


class WorkerWeightUpdateBodyLimit:
    """WeightUpdateBodyLimit in a tokenizer worker process
    (--tokenizer-worker-num > 1). Such a process re-imports the HTTP server's
    module and serves it without the start-up that adds WeightUpdateBodyLimit,
    so the module registers this at import: it takes its limits from
    `server_args()` once that returns the worker's server arguments, and
    passes requests through while it returns None (the single-tokenizer
    server, which adds WeightUpdateBodyLimit itself)."""

    def __init__(self, app: Any, server_args: Callable[[], Optional[Any]]):
        self.app = app
        self.server_args = server_args
        self.limit: Optional[WeightUpdateBodyLimit] = None

    async def __call__(self, scope: Dict, receive: Callable, send: Callable) -> None:
        if self.limit is None:
            args = self.server_args()
            if args is None:
                await self.app(scope, receive, send)
                return
            self.limit = self._limit_of(args)
        await self.limit(scope, receive, send)

    def _limit_of(self, args: Any) -> WeightUpdateBodyLimit:
        return WeightUpdateBodyLimit(
            self.app,
            limit_bytes=int(args.weight_update_max_request_mb * 2**20),
            tensor_limit_bytes=int(args.weight_update_max_tensor_request_mb * 2**20),
        )


def _lone_surrogate_field(raw: bytes) -> Optional[str]:
    """Where the body's first lone surrogate is (`buckets[0].names[3]`),
    or None (none there, or not JSON: the route's own parser says so)."""
    try:
        stack = [("body", json.loads(raw))]
    except (ValueError, RecursionError):  # the route's own parser answers
        return None
    while stack:
        where, value = stack.pop()
        if isinstance(value, dict):
            for key, item in value.items():
                if not _encodes(key):
                    return f"{where} (a key)"
                stack.append((key if where == "body" else f"{where}.{key}", item))
        elif isinstance(value, list):
            stack.extend((f"{where}[{i}]", item) for i, item in enumerate(value))
        elif isinstance(value, str) and not _encodes(value):
            return where
    return None


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


async def _answer(send: Callable, status: int, message: str) -> None:
    body = json.dumps(
        {"success": False, "status": "error", "message": message}
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _replay(
    messages: list, then: Callable[[], Awaitable[Dict]] = None
) -> Callable[[], Awaitable[Dict]]:
    """A `receive` that yields `messages`, then defers to `then`."""
    pending = list(messages)

    async def receive() -> Dict:
        if pending:
            return pending.pop(0)
        if then is None:
            return {"type": "http.disconnect"}
        return await then()

    return receive
