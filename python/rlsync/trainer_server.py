"""The trainer's control API of seed 000 ("Tomni"): engines register with
the trainer, and one call syncs the trainer's current weights into all of them.

    POST /add_inference_endpoint    {"host": "localhost", "port": 30000, "world_size": 4}
    POST /remove_inference_endpoint {"host": "localhost", "port": 30000}
    GET  /inference_endpoints
    POST /sync_inference_weights    {"master_port": 29600, "buffer_size_mb": 1024,
                                     "weight_version": "step-100"?, "atomic": false?}

`world_size` is the engine's number of ranks (its TP size); the update group
is the trainer (rank 0) plus every registered engine's ranks. A sync uses
`WeightSender`: two HTTP calls per engine (three with `atomic`), buckets of
`buffer_size_mb`. The group is built on the first sync and kept while the
endpoints and `master_port` stay the same. Embed it in the training process:

    app = create_trainer_app(lambda: model, backend="nccl", master_address="10.0.0.5")
    uvicorn.run(app, port=8990)   # needs `pip install 'rlsync[router]'`
"""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from dataclasses import asdict
from typing import Any, Callable, Optional

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from rlsync.sender import Engine, SyncError, Weights, WeightSender


class _BadRequest(ValueError):
    pass


def _field(body: Any, name: str, kind: type, *, required: bool = True, check=None):
    if not isinstance(body, dict):
        raise _BadRequest("body: expected a JSON object")
    if name not in body or body[name] is None:
        if required:
            raise _BadRequest(f"{name}: required")
        return None
    value = body[name]
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise _BadRequest(f"{name}: expected an integer, got {value!r}")
    if kind is not int and not isinstance(value, kind):
        raise _BadRequest(f"{name}: expected {kind.__name__}, got {value!r}")
    if check is not None and not check(value):
        raise _BadRequest(f"{name}: out of range: {value!r}")
    return value


def create_trainer_app(
    weights: Callable[[], Weights],
    *,
    master_address: str = "127.0.0.1",
    backend: str = "nccl",
    group_name: str = "rlsync",
    admin_key: Optional[str] = None,
    timeout: float = 300.0,
) -> FastAPI:
    """`weights()` returns what to send now (a module, a state dict or
    (name, tensor) pairs); it is called once per sync."""
    engines: dict[str, Engine] = {}
    state: dict[str, Any] = {"sender": None, "key": None}
    lock = asyncio.Lock()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        close_sender()

    app = FastAPI(lifespan=lifespan)

    def bad(e: Exception, status: int = 400) -> JSONResponse:
        return JSONResponse({"success": False, "message": str(e)}, status_code=status)

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
            body = await request.json()
            host = _field(body, "host", str, check=bool)
            port = _field(body, "port", int, check=lambda p: 0 < p < 65536)
            world_size = _field(body, "world_size", int, check=lambda w: w >= 1)
        except (ValueError, _BadRequest) as e:
            return bad(e)
        url = f"http://{host}:{port}"
        async with lock:
            engines[url] = Engine(url, tp_size=world_size, admin_key=admin_key)
        return JSONResponse(
            {"success": True, "endpoints": [asdict(e) for e in engines.values()]}
        )

    @app.post("/remove_inference_endpoint")
    async def remove_inference_endpoint(request: Request) -> JSONResponse:
        try:
            body = await request.json()
            url = f"http://{_field(body, 'host', str, check=bool)}:{_field(body, 'port', int)}"
        except (ValueError, _BadRequest) as e:
            return bad(e)
        async with lock:
            if engines.pop(url, None) is None:
                return bad(_BadRequest(f"host/port: no endpoint {url}"), 404)
            await run_in_threadpool(close_sender)
        return JSONResponse(
            {"success": True, "endpoints": [asdict(e) for e in engines.values()]}
        )

    @app.get("/inference_endpoints")
    async def inference_endpoints() -> JSONResponse:
        return JSONResponse([asdict(e) for e in engines.values()])

    @app.post("/sync_inference_weights")
    async def sync_inference_weights(request: Request) -> JSONResponse:
        try:
            body = await request.json()
            port = _field(body, "master_port", int, check=lambda p: 0 < p < 65536)
            mb = _field(body, "buffer_size_mb", int, check=lambda m: m >= 1)
            version = _field(body, "weight_version", str, required=False)
            atomic = bool(_field(body, "atomic", bool, required=False))
        except (ValueError, _BadRequest) as e:
            return bad(e)
        async with lock:
            if not engines:
                return bad(
                    _BadRequest(
                        "no inference endpoint: POST /add_inference_endpoint first"
                    )
                )
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
                if e.step in ("connect", "broadcast"):
                    await run_in_threadpool(close_sender)  # rebuilt on the next sync
                return JSONResponse(
                    {"success": False, "step": e.step, "message": str(e)},
                    status_code=502,
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
                "engines": [asdict(e) for e in result.engines],
            },
            status_code=200 if result.success else 502,
        )

    return app
