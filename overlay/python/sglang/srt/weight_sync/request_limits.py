"""Bound the bodies of weight-update requests before they are parsed.

FastAPI parses a JSON body on the event loop: a 60 MB /prepare_weights_update
(a million names) held every other request, generation included, for
seconds before validation could refuse it. This ASGI middleware reads the
body of the weight-update routes first and answers 413 once it passes the
limit, without parsing it.
"""

from __future__ import annotations

import json
from typing import Any, Awaitable, Callable, Dict, FrozenSet

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
    }
)


class WeightUpdateBodyLimit:
    def __init__(self, app: Any, limit_bytes: int):
        self.app = app
        self.limit = limit_bytes

    async def __call__(self, scope: Dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http" or scope["path"] not in WEIGHT_UPDATE_ROUTES:
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or []).get(b"content-length", b"")
        if length.isdigit() and int(length) > self.limit:
            await self._refuse(send)
            return
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                await self.app(scope, _replay([message]), send)
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.limit:
                await self._refuse(send)
                return
            more = message.get("more_body", False)
        body = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        await self.app(scope, _replay([body], receive), send)

    async def _refuse(self, send: Callable) -> None:
        body = json.dumps(
            {
                "success": False,
                "status": "error",
                "message": f"body: larger than the {self.limit // 2**20} MiB "
                f"--weight-update-max-request-mb allows",
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
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
