"""The trainer's control API: engines register with the trainer, and one call
syncs the trainer's current weights into all of them.

    POST /add_inference_endpoint    {"host": "localhost", "port": 30000, "world_size": 4}
    POST /remove_inference_endpoint {"host": "localhost", "port": 30000}
    GET  /inference_endpoints
    POST /sync_inference_weights    {"master_port": 29600, "buffer_size_mb": 1024,
                                     "weight_version": "step-100"?, "atomic": false?}

`world_size` is the number of ranks the engine brings to the update group
(its TP size times its DP size; with attention data parallelism, its TP
size); the group is the trainer (rank 0) plus every registered engine's
ranks. A sync uses `WeightSender`: two HTTP calls per engine (three with
`atomic`), buckets of `buffer_size_mb`. The group is built on the first sync and kept while the
endpoints and `master_port` stay the same.

Every route needs `Authorization: Bearer <key>`, the `api_key` argument or
else $RLSYNC_TRAINER_API_KEY; without a key `create_trainer_app` refuses to
build the app. A registered engine receives the engines' admin key and joins
the update group, so a host must be a hostname or an IP address literal
(nothing else: no scheme, port, path, user or query), and one of
`allowed_hosts` when that is given. No answer and no log line carries a key.
Embed it in the training process:

    app = create_trainer_app(lambda: model, backend="nccl", master_address="10.0.0.5",
                             allowed_hosts=["10.0.0.7", "10.0.0.8"])
    uvicorn.run(app, host="10.0.0.5", port=8990)   # needs `pip install 'rlsync[router]'`
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import re
from contextlib import asynccontextmanager
from typing import Any, Callable, Iterable, Optional

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Receive, Scope, Send

from rlsync.auth import bearer_ok, check_key
from rlsync.request_body import BodyTooLarge, read_json_object
from rlsync.sender import Engine, SyncError, SyncResult, Weights, WeightSender

logger = logging.getLogger(__name__)

API_KEY_ENV = "RLSYNC_TRAINER_API_KEY"
MIN_KEY_LENGTH = 16
MAX_WORLD_SIZE = 256  # ranks of one engine
MAX_ENDPOINTS = 256
MAX_BUFFER_MB = 1 << 20  # 1 TiB buckets
MAX_BODY_BYTES = 64 << 10  # every request is a few fields
_LABEL = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")


class _BadRequest(ValueError):
    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def _shown(value: Any) -> str:
    """A caller's value in a message, capped."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _field(body: Any, name: str, kind: type, *, required: bool = True, check=None):
    if not isinstance(body, dict):
        raise _BadRequest("body: expected a JSON object")
    if name not in body or body[name] is None:
        if required:
            raise _BadRequest(f"{name}: required")
        return None
    value = body[name]
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise _BadRequest(f"{name}: expected an integer, got {_shown(value)}")
    if kind is not int and not isinstance(value, kind):
        raise _BadRequest(f"{name}: expected {kind.__name__}, got {_shown(value)}")
    if check is not None and not check(value):
        raise _BadRequest(f"{name}: out of range: {_shown(value)}")
    return value


def url_host(host: str) -> Optional[str]:
    """`host` as it goes into a URL (an IPv6 literal in brackets, a hostname
    in lower case), or None when it is not a hostname or an IP literal alone."""
    if not isinstance(host, str) or not host.isascii():
        return None
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        ip = ipaddress.ip_address(bare)
    except ValueError:
        ip = None
    if ip is not None:
        if ip.version == 4:
            return None if bare != host else str(ip)
        return None if getattr(ip, "scope_id", None) else f"[{ip.compressed}]"
    name = host.lower()
    labels = name.split(".")
    if len(name) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        return None
    if labels[-1].isdigit():  # "1.2.3", "300.1.1.1": a malformed IPv4 address
        return None
    return name


def _host(body: Any, allowed: Optional[frozenset[str]]) -> str:
    value = _field(body, "host", str)
    host = url_host(value)
    if host is None:
        raise _BadRequest(
            f"host: expected a hostname or an IP address literal alone (no scheme, "
            f"port, path, user or query), got {_shown(value)}"
        )
    if allowed is not None and host not in allowed:
        raise _BadRequest(f"host: {_shown(value)} is not an allowed host", 403)
    return host


def _port(body: Any) -> int:
    return _field(body, "port", int, check=lambda p: 0 < p < 65536)


def _api_key_bytes(key: str, what: str) -> bytes:
    """The key as bytes; ValueError (naming `what`, never the key) unless it
    is at least MIN_KEY_LENGTH visible ASCII characters."""
    raw = check_key(what, key)
    if len(raw) < MIN_KEY_LENGTH:
        raise ValueError(f"{what}: a key must be at least {MIN_KEY_LENGTH} characters")
    return raw


class RequireKey:
    """ASGI middleware: every HTTP request needs the API key, 401 otherwise
    (unknown paths included, so an unauthenticated caller learns nothing)."""

    def __init__(self, app: ASGIApp, key: bytes):
        self.app = app
        self.key = key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not bearer_ok(scope["headers"], self.key):
            client = scope.get("client") or ("?", 0)
            logger.warning(
                "rlsync trainer API: refused %s %s from %s: missing or wrong API key",
                scope.get("method"),
                scope.get("path"),
                client[0],
            )
            answer = JSONResponse(
                {"success": False, "message": "missing or wrong API key"},
                status_code=401,
                headers={"WWW-Authenticate": "Bearer"},
            )
            await answer(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _public(engine: Engine) -> dict[str, Any]:
    """What an answer may show of an engine: never its keys."""
    return {"url": engine.url, "tp_size": engine.tp_size}


async def _json(request: Request) -> Any:
    try:
        return await read_json_object(request.stream(), MAX_BODY_BYTES, False)
    except BodyTooLarge as e:
        raise _BadRequest(str(e), status=413) from e
    except ValueError as e:
        raise _BadRequest(str(e)) from e


def _resolve_key(api_key: Optional[str]) -> bytes:
    key = api_key if api_key is not None else os.environ.get(API_KEY_ENV)
    if not key:
        raise ValueError(
            f"the trainer API needs a key: pass api_key= or set ${API_KEY_ENV}; "
            "a registered engine receives the engines' admin key, so an open "
            "trainer API would hand it to anyone who can reach it"
        )
    return _api_key_bytes(key, "api_key" if api_key is not None else API_KEY_ENV)


def create_trainer_app(
    weights: Callable[[], Weights],
    *,
    master_address: str = "127.0.0.1",
    backend: str = "nccl",
    group_name: str = "rlsync",
    admin_key: Optional[str] = None,
    engine_api_key: Optional[str] = None,
    api_key: Optional[str] = None,
    allowed_hosts: Optional[Iterable[str]] = None,
    max_world_size: int = MAX_WORLD_SIZE,
    max_endpoints: int = MAX_ENDPOINTS,
    timeout: float = 300.0,
) -> FastAPI:
    """`weights()` returns what to send now (a module, a state dict or
    (name, tensor) pairs); it is called once per sync. `admin_key` is the
    engines' admin key, `engine_api_key` their `--api-key`; `api_key` (else $RLSYNC_TRAINER_API_KEY) guards this
    API and is required. `allowed_hosts`: hostnames or IP literals an engine
    may register from (any well-formed host when None)."""
    key = _resolve_key(api_key)
    for name, value in (("admin_key", admin_key), ("engine_api_key", engine_api_key)):
        if value:
            check_key(name, value)
    allowed = None
    if allowed_hosts is not None:
        hosts = list(allowed_hosts)
        bad = [h for h in hosts if url_host(h) is None]
        if bad:
            raise ValueError(f"allowed_hosts: not a hostname or IP literal: {bad}")
        allowed = frozenset(url_host(h) for h in hosts)
    if max_world_size < 1:
        raise ValueError(f"max_world_size must be >= 1, got {max_world_size}")
    engines: dict[str, Engine] = {}
    state: dict[str, Any] = {"sender": None, "key": None}
    lock = asyncio.Lock()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        close_sender()

    # No schema pages: the API is for the engines, not for browsing.
    app = FastAPI(lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(RequireKey, key=key)

    def bad(e: _BadRequest) -> JSONResponse:
        return JSONResponse({"success": False, "message": str(e)}, status_code=e.status)

    def listing() -> JSONResponse:
        return JSONResponse(
            {"success": True, "endpoints": [_public(e) for e in engines.values()]}
        )

    def close_sender() -> None:
        sender = state["sender"]
        state["sender"] = state["key"] = None
        if sender is not None:
            try:
                sender.close()
            except Exception:  # engines may be gone; the group goes anyway
                pass

    @app.post("/add_inference_endpoint")
    async def add_inference_endpoint(request: Request) -> JSONResponse:
        try:
            body = await _json(request)
            host, port = _host(body, allowed), _port(body)
            world_size = _field(
                body, "world_size", int, check=lambda w: 1 <= w <= max_world_size
            )
        except _BadRequest as e:
            return bad(e)
        url = f"http://{host}:{port}"
        async with lock:
            if url not in engines and len(engines) >= max_endpoints:
                return bad(_BadRequest(f"host: {max_endpoints} endpoints already", 409))
            engines[url] = Engine(
                url, world_size, admin_key=admin_key, api_key=engine_api_key
            )
        logger.info("rlsync trainer API: endpoint %s (%d ranks)", url, world_size)
        return listing()

    @app.post("/remove_inference_endpoint")
    async def remove_inference_endpoint(request: Request) -> JSONResponse:
        try:
            body = await _json(request)
            url = f"http://{_host(body, None)}:{_port(body)}"
        except _BadRequest as e:
            return bad(e)
        async with lock:
            if engines.pop(url, None) is None:
                return bad(_BadRequest(f"host/port: no endpoint {url}", 404))
            await run_in_threadpool(close_sender)
        logger.info("rlsync trainer API: endpoint %s removed", url)
        return listing()

    @app.get("/inference_endpoints")
    async def inference_endpoints() -> JSONResponse:
        return JSONResponse([_public(e) for e in engines.values()])

    @app.post("/sync_inference_weights")
    async def sync_inference_weights(request: Request) -> JSONResponse:
        try:
            body = await _json(request)
            port = _field(body, "master_port", int, check=lambda p: 0 < p < 65536)
            mb = _field(
                body, "buffer_size_mb", int, check=lambda m: 1 <= m <= MAX_BUFFER_MB
            )
            version = _field(body, "weight_version", str, required=False)
            atomic = bool(_field(body, "atomic", bool, required=False))
        except _BadRequest as e:
            return bad(e)
        async with lock:
            if not engines:
                return bad(
                    _BadRequest(
                        "no inference endpoint: POST /add_inference_endpoint first"
                    )
                )
            return await run_sync(port, mb, version, atomic)

    async def run_sync(
        port: int, mb: int, version: Optional[str], atomic: bool
    ) -> JSONResponse:
        key = (port, tuple((e.url, e.tp_size) for e in engines.values()))
        try:
            if state["key"] != key:
                await run_in_threadpool(close_sender)
                sender = WeightSender(
                    list(engines.values()),
                    master_address=master_address,
                    master_port=port,
                    group_name=group_name,
                    backend=backend,
                    bucket_bytes=mb << 20,
                    timeout=timeout,
                )
                await run_in_threadpool(sender.connect)
                state["sender"], state["key"] = sender, key
            sender = state["sender"]
            sender.bucket_bytes = mb << 20
            result = await run_in_threadpool(
                sender.sync, weights(), weight_version=version, atomic=atomic
            )
        except SyncError as e:
            if e.step in ("connect", "broadcast") or "re-initialised" in str(e):
                await run_in_threadpool(close_sender)  # rebuilt on the next sync
            body = {"success": False, "step": e.step, "message": str(e)}
            if e.result is not None:
                body["engines"] = _engine_outcomes(e.result)
            return JSONResponse(body, status_code=502)
        except Exception as e:  # the trainer's own weights or state
            logger.exception("rlsync trainer API: sync failed")
            await run_in_threadpool(close_sender)
            return JSONResponse(
                {
                    "success": False,
                    "step": "sync",
                    "message": f"{type(e).__name__}: {e}",
                },
                status_code=500,
            )
        return JSONResponse(
            {
                "success": result.success,
                "bytes": result.bytes,
                "buckets": result.buckets,
                "seconds": result.seconds,
                "gbps": result.gbps,
                "http_calls": result.http_calls,
                "weight_version": result.weight_version,
                "engines": _engine_outcomes(result),
            },
            status_code=200 if result.success else 502,
        )

    return app


def _engine_outcomes(result: SyncResult) -> list[dict]:
    """Each engine's outcome of a sync, as the API answers it."""
    return [
        {
            "url": o.url,
            "success": o.answered,
            "applied": o.applied,
            "message": o.message,
            "weight_version": o.weight_version,
        }
        for o in result.engines
    ]
