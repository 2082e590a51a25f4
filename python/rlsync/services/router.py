"""`rlsync router`: one URL in front of several SGLang workers (an admin
router for SGLang 0.5.10 with the rlsync series).

- Generation (`/generate`, `/v1/completions`, `/v1/chat/completions`, streamed
  or not) goes to a routable worker: alive, enabled, not inside an update or
  pause broadcast, and serving the fleet's weight version. When none is, the
  request waits (up to `--route-wait`) instead of failing.
- Admin requests are broadcast to every worker that is not dead and their
  answers merged. Pause, group lifecycle and weight-update broadcasts are
  serialised behind one admin lock; a caller that waited past `--admin-wait`
  gets a 503 naming the operation that holds it. While an update or pause
  broadcast is in flight its workers leave generation routing, and each
  returns to its previous state afterwards.
- `init_weights_update_group` gives each worker its own `rank_offset`
  (workers in order, each taking its TP size); a worker whose group init
  failed or timed out stays disabled until `POST /workers/enable`.
- A worker that stops answering is marked dead; one that comes back (or
  restarts) stays out of routing until it reports the fleet's weight version.
- `--admin-api-key` (or SGLANG_ADMIN_API_KEY) protects admin routes with
  `Authorization: Bearer <key>`; the header is forwarded to the workers. A
  malformed Authorization header (not visible ASCII, or two of them) is a 401
  on every route. `--worker-api-key` (or RLSYNC_WORKER_API_KEY) is the
  workers' `--api-key`, for what the router reads itself (`/server_info`,
  `/model_info`, `/rlsync_info`); a field it cannot read is logged, naming
  the worker and the field.
- Bad input is a 400 naming the field, never a 5xx.
- `GET /metrics`: Prometheus metrics (worker states, admin-lock waits,
  broadcasts by outcome; `router_metrics`), behind the admin key as
  `/workers` is.

Built on FastAPI, httpx, uvicorn and prometheus_client: the `[router]` extra.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import logging
import math
import os
import secrets
import time
from dataclasses import asdict, dataclass, fields, replace
from types import FrameType
from typing import Any, Optional, Union

import httpx
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from rlsync.auth import (
    authorization,
    bearer_headers,
    bearer_ok,
    check_key,
    visible_ascii,
)
from rlsync.client import error_message, require_scheme, update_group_dp
from rlsync.engine import Engine
from rlsync.request_body import DEFAULT_MAX_BODY_BYTES, BodyTooLarge, read_json_object
from rlsync.services import router_metrics

logger = logging.getLogger(__name__)

GENERATION_ROUTES = ("/generate", "/v1/completions", "/v1/chat/completions")
# Broadcast behind the admin lock; the first group also leaves routing meanwhile.
UPDATE_ROUTES = (
    "/update_weights_from_distributed",
    "/update_weights_from_disk",
    "/update_weights_from_tensor",
    "/complete_weights_update",
    "/pause_generation",
)
LOCKED_ROUTES = UPDATE_ROUTES + (
    "/init_weights_update_group",
    "/destroy_weights_update_group",
    "/prepare_weights_update",
    "/abort_weights_update",
    "/continue_generation",
)
# Broadcast without the lock: they change no weights.
# /workers/enable and /workers/disable take a URL and a reason.
MAX_CONTROL_BODY_BYTES = 64 << 10
OTHER_ADMIN_ROUTES = ("/weights_checker", "/flush_cache", "/get_weights_by_name")
# Answers that carry a weight version the fleet moves to.
VERSIONED_ROUTES = (
    "/update_weights_from_distributed",
    "/update_weights_from_disk",
    "/update_weights_from_tensor",
    "/complete_weights_update",
)


@dataclass
class Worker:
    """An engine the router serves from (its shape as read from its
    `/server_info`), and what the router knows of it now."""

    engine: Engine
    dead: bool = False
    disabled: bool = False
    reason: str = ""
    in_update: bool = False
    # A worker that came back must show the fleet's version before it serves.
    rejoining: bool = False
    weight_version: Optional[str] = None
    in_flight: int = 0
    routed: int = 0

    @property
    def url(self) -> str:
        return self.engine.url

    @property
    def ranks(self) -> int:
        """Its ranks in an update group: every DP replica's TP ranks."""
        return self.engine.ranks

    def describe(self) -> dict[str, Any]:
        """What `GET /workers` shows of it (no key)."""
        return {
            "url": self.url,
            "tp_size": self.engine.tp_size,
            "dp_size": self.engine.dp_size,
            **{
                f.name: getattr(self, f.name)
                for f in fields(self)
                if f.name != "engine"
            },
            "routable": self.routable,
        }

    @property
    def routable(self) -> bool:
        return not (self.dead or self.disabled or self.in_update or self.rejoining)

    @property
    def state(self) -> str:
        """dead, disabled, updating, rejoining or ready: the first that holds."""
        if self.dead:
            return "dead"
        if self.disabled:
            return "disabled"
        if self.in_update:
            return "updating"
        return "rejoining" if self.rejoining else "ready"


@dataclass
class RouterConfig:
    workers: list[str]
    admin_api_key: Optional[str] = None
    worker_api_key: Optional[str] = None  # the workers' --api-key
    admin_wait: float = 30.0  # seconds a caller may wait for the admin lock
    route_wait: float = 60.0  # seconds a generation may wait for a worker
    request_timeout: float = 600.0
    health_interval: float = 2.0
    # seconds each worker's /health probe may take; the probes run at once,
    # so a worker that vanished delays no other worker's
    health_timeout: float = 5.0
    # admin bodies (prepare's grows with the model); past it a 413
    max_request_bytes: int = DEFAULT_MAX_BODY_BYTES

    def __post_init__(self) -> None:
        for name in ("admin_wait", "route_wait", "request_timeout"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: seconds must be >= 0")
        for name in ("health_interval", "health_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}: seconds must be > 0")


@dataclass
class _Event:
    t: float
    kind: str  # "route", "admin_start", "admin_end", "dead", "alive", ...
    worker: Optional[str] = None
    detail: str = ""


class Router:
    def __init__(self, config: RouterConfig):
        if not config.workers:
            raise ValueError("the router needs at least one worker")
        if len(set(config.workers)) != len(config.workers):
            raise ValueError("duplicate worker URL")
        self.config = config
        self.admin_key = (
            check_key("admin_api_key", config.admin_api_key)
            if config.admin_api_key
            else None
        )
        self.worker_headers = bearer_headers(api_key=config.worker_api_key)
        self._unread: set[tuple[str, str]] = set()  # (worker, field) warned about
        self.workers = [Worker(Engine(u.rstrip("/"))) for u in config.workers]
        self.fleet_version: Optional[str] = None
        self.admin_lock = asyncio.Lock()
        self.admin_holder = ""
        self.admin_since = 0.0
        self.events: collections.deque[_Event] = collections.deque(maxlen=10000)
        self.routable = asyncio.Condition()
        self._next = 0
        # Set on SIGTERM/SIGINT: generations waiting for a worker get a 503.
        self.closing = False
        # Generations waiting for a routable worker now.
        self.waiting = 0
        self.http = httpx.AsyncClient(timeout=config.request_timeout)
        self.metrics = router_metrics.RouterMetrics(
            self.workers, LOCKED_ROUTES + OTHER_ADMIN_ROUTES, LOCKED_ROUTES
        )

    # --- state ---------------------------------------------------------------

    def log(self, kind: str, worker: Optional[str] = None, detail: str = "") -> None:
        self.events.append(_Event(time.monotonic(), kind, worker, detail))

    async def _changed(self) -> None:
        async with self.routable:
            self.routable.notify_all()

    async def read_answer(self, w: Worker, path: str) -> dict:
        """The worker's GET `path` answer (sent the workers' API key). Raises
        httpx.HTTPError when the worker is unreachable and LookupError, saying
        why, when it answers anything but a 200 with a JSON object."""
        resp = await self.http.get(
            w.url + path, headers=self.worker_headers, timeout=10
        )
        try:
            body = resp.json()
        except ValueError:
            body = resp.text
        if resp.status_code != 200:
            raise LookupError(f"HTTP {resp.status_code}: {_message(body)}")
        if not isinstance(body, dict):
            raise LookupError("the answer is not a JSON object")
        return body

    async def read_field(self, w: Worker, path: str, field: str) -> Any:
        """`field` of the worker's GET `path` answer; errors as read_answer."""
        body = await self.read_answer(w, path)
        if field not in body:
            raise LookupError(f"no {field} in the answer")
        self._unread.discard((w.url, field))
        return body[field]

    def unreadable(self, w: Worker, path: str, field: str, why: str, using: str):
        """Say (once until it reads again) which field of which worker the
        router could not read, and what it uses instead."""
        if (w.url, field) in self._unread:
            return
        self._unread.add((w.url, field))
        detail = f"could not read {field} from {path}: {why}; using {using}"
        logger.warning("rlsync router: worker %s: %s", w.url, detail)
        self.log("unreadable", w.url, f"{field}: {detail}")

    async def read_tp_size(self, w: Worker) -> None:
        """The worker's TP and DP sizes (rank offsets need them); 1 when
        unreadable."""
        try:
            info = await self.read_answer(w, "/server_info")
        except LookupError as e:
            using = f"{w.engine.tp_size}"
            self.unreadable(w, "/server_info", "tp_size", str(e), using)
            return
        shape = {}
        for field in ("tp_size", "dp_size"):
            value = info.get(field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                why = f"{field} is {value!r}, not an integer >= 1"
                self.unreadable(w, "/server_info", field, why, "1")
                value = 1
            else:
                self._unread.discard((w.url, field))
            shape[field] = value
        shape["dp_size"] = update_group_dp(info, shape["dp_size"])
        w.engine = replace(w.engine, **shape)

    async def _version(self, w: Worker) -> tuple[bool, Optional[str]]:
        """(True, the worker's weight version) or (False, None), warned."""
        try:
            version = await self.read_field(w, "/model_info", "weight_version")
        except LookupError as e:
            self.unreadable(w, "/model_info", "weight_version", str(e), "None")
            return False, None
        return True, None if version is None else str(version)

    async def discover(self) -> None:
        """Each worker's TP size and weight version (rank offsets need them)."""
        for w in self.workers:
            try:
                await self.read_tp_size(w)
                _, w.weight_version = await self._version(w)
            except httpx.HTTPError as e:
                self._mark_dead(w, f"unreachable at start: {type(e).__name__}: {e}")
        versions = {w.weight_version for w in self.workers if not w.dead}
        self.fleet_version = versions.pop() if len(versions) == 1 else None

    def _mark_dead(self, w: Worker, why: str) -> None:
        if not w.dead:
            self.log("dead", w.url, why)
        w.dead, w.reason = True, why

    async def health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.health_interval)
            await self.check_health()

    async def check_health(self) -> None:
        """Probe every worker at once, each within `health_timeout`: a worker
        that stopped answering (a vanished host) holds up no other's check."""
        await asyncio.gather(*(self._check_worker(w) for w in self.workers))
        await self._changed()

    async def _probe(self, w: Worker) -> Optional[str]:
        """Why `w` is not healthy, or None."""
        deadline = self.config.health_timeout
        try:
            resp = await asyncio.wait_for(
                self.http.get(w.url + "/health", timeout=deadline), deadline
            )
        except (asyncio.TimeoutError, httpx.TimeoutException):
            return f"health check timed out after {deadline:g} s"
        except httpx.HTTPError as e:
            return f"health check failed: {type(e).__name__}"
        if resp.status_code != 200:
            return f"health check failed: HTTP {resp.status_code}"
        return None

    async def _check_worker(self, w: Worker) -> None:
        why = await self._probe(w)
        if why is not None:
            if not w.dead and not w.in_update:
                self._mark_dead(w, why)
            return
        if w.dead:  # back, maybe restarted: serve only at the fleet's version
            w.dead, w.rejoining, w.reason = False, True, "rejoined"
            w.weight_version = None  # unknown until read again
            self.log("alive", w.url)
            try:
                await self.read_tp_size(w)  # it may have restarted otherwise
            except httpx.HTTPError:
                return
        if w.rejoining:
            try:
                read, version = await self._version(w)
            except httpx.HTTPError:
                return
            if not read:
                return
            w.weight_version = version
            if self.fleet_version is None or w.weight_version == self.fleet_version:
                w.rejoining, w.reason = False, ""
                self.log("rejoined", w.url, f"weight_version={w.weight_version}")

    # --- generation ------------------------------------------------------------

    async def pick(self) -> Worker:
        self.waiting += 1
        try:
            return await self._pick()
        finally:
            self.waiting -= 1

    async def _pick(self) -> Worker:
        deadline = time.monotonic() + self.config.route_wait
        async with self.routable:
            while True:
                n = len(self.workers)
                order = [self.workers[(self._next + i) % n] for i in range(n)]
                ready = [w for w in order if w.routable]
                if ready:  # least loaded, round robin among equals
                    w = min(ready, key=lambda w: w.in_flight)
                    self._next = self.workers.index(w) + 1
                    w.in_flight += 1
                    w.routed += 1
                    self.log("route", w.url)
                    return w
                if self.closing:
                    raise LookupError("the router is shutting down")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise LookupError(
                        "no worker can take generation: "
                        + "; ".join(f"{w.url}: {self._state(w)}" for w in self.workers)
                    )
                try:
                    await asyncio.wait_for(self.routable.wait(), timeout=min(left, 0.5))
                except asyncio.TimeoutError:
                    pass

    @staticmethod
    def _state(w: Worker) -> str:
        state = w.state
        if state in ("dead", "disabled"):
            return f"{state} ({w.reason})"
        if state == "rejoining":
            return f"rejoining (weight_version={w.weight_version})"
        return state

    async def release(self, w: Worker) -> None:
        w.in_flight -= 1
        await self._changed()

    # --- admin -------------------------------------------------------------------

    @staticmethod
    def check_header(request: Request) -> Optional[Response]:
        """401 for an Authorization header no key can match: not visible
        ASCII (spaces aside), or more than one."""
        values = authorization(request.headers.raw)
        if len(values) > 1 or any(
            not visible_ascii(v.replace(b" ", b"")) for v in values
        ):
            return JSONResponse(
                {"success": False, "error": "malformed Authorization header"}, 401
            )
        return None

    def check_admin(self, request: Request) -> Optional[Response]:
        denied = self.check_header(request)
        if denied is not None or self.admin_key is None:
            return denied
        if not bearer_ok(request.headers.raw, self.admin_key):
            return JSONResponse(
                {"success": False, "error": "admin route: missing or wrong admin key"},
                401,
            )
        return None

    async def broadcast(
        self, path: str, body: dict, headers: dict[str, bytes]
    ) -> JSONResponse:
        if path == "/init_weights_update_group":
            try:  # checked before anything else, before the lock
                _check_init_body(body)
            except ValueError as e:
                self.metrics.broadcast(path, "refused")
                return _bad(str(e))
        if path in LOCKED_ROUTES:
            t0 = time.monotonic()
            try:
                await asyncio.wait_for(
                    self.admin_lock.acquire(), self.config.admin_wait
                )
            except asyncio.TimeoutError:
                self.metrics.waited(path, time.monotonic() - t0, timed_out=True)
                self.metrics.broadcast(path, "refused")
                return JSONResponse(
                    {
                        "success": False,
                        "message": f"admin lock held by {self.admin_holder} for "
                        f"{time.monotonic() - self.admin_since:.1f}s; waited "
                        f"{self.config.admin_wait:g}s",
                    },
                    status_code=503,
                )
            self.admin_holder, self.admin_since = path, time.monotonic()
            self.metrics.waited(path, self.admin_since - t0, timed_out=False)
        try:
            return await self._broadcast(path, body, headers)
        finally:
            if path in LOCKED_ROUTES:
                self.admin_holder = ""
                self.admin_lock.release()

    def _bodies(self, path: str, body: Any, targets: list[Worker]) -> list[Any]:
        if path == "/prepare_weights_update" and "session_id" not in body:
            # One session id on every worker: the caller completes or aborts
            # it with the id the merged answer carries.
            return [{**body, "session_id": secrets.token_urlsafe(18)}] * len(targets)
        if path != "/init_weights_update_group":
            return [body] * len(targets)
        # The group spans the trainer and the live workers, in worker order.
        base = _int_field(body, "rank_offset", 1)
        want = base + sum(w.ranks for w in targets)
        world_size = _int_field(body, "world_size", want)
        if world_size != want:
            raise ValueError(
                f"world_size: {world_size} but the trainer's {base} "
                f"rank(s) and the live workers' ranks (DP x TP) make {want}"
            )
        out, offset = [], base
        for w in targets:
            out.append({**body, "rank_offset": offset})
            offset += w.ranks
        return out

    async def _broadcast(
        self, path: str, body: dict, headers: dict[str, bytes]
    ) -> JSONResponse:
        targets = [w for w in self.workers if not w.dead]
        if not targets:
            self.metrics.broadcast(path, "refused")
            return JSONResponse(
                {
                    "success": False,
                    "message": "no live worker",
                    "workers": [],
                    "dead": [w.url for w in self.workers],
                },
                status_code=503,
            )
        try:
            bodies = self._bodies(path, body, targets)
        except ValueError as e:
            self.metrics.broadcast(path, "refused")
            return JSONResponse({"success": False, "message": str(e)}, status_code=400)
        leaves_routing = path in UPDATE_ROUTES
        previous = {w.url: w.in_update for w in targets}
        if leaves_routing:
            # No new request goes to them; those in flight go on (the server
            # applies between two batches, never during a forward pass).
            for w in targets:
                w.in_update = True
        for w in targets:
            self.log("admin_start", w.url, path)
        try:
            answers = await asyncio.gather(
                *(self._one(w, path, b, headers) for w, b in zip(targets, bodies))
            )
        finally:
            for w in targets:
                self.log("admin_end", w.url, path)
                if leaves_routing:
                    w.in_update = previous[w.url]
            await self._changed()
        outcome = router_metrics.outcome([a["success"] for a in answers])
        self.metrics.broadcast(path, outcome)
        return self._merge(path, body, targets, answers)

    async def _one(
        self, w: Worker, path: str, body: dict, headers: dict[str, bytes]
    ) -> dict:
        try:
            resp = await self.http.post(w.url + path, json=body, headers=headers)
        except httpx.HTTPError as e:
            self._mark_dead(w, f"{path}: {type(e).__name__}: {e}")
            return {
                "url": w.url,
                "status_code": 0,
                "success": False,
                "message": f"worker dead: {type(e).__name__}: {e}",
            }
        try:
            answer = resp.json()
        except ValueError:
            answer = resp.text
        ok = resp.status_code < 400 and not (
            isinstance(answer, dict) and answer.get("success") is False
        )
        out = {
            "url": w.url,
            "status_code": resp.status_code,
            "success": ok,
            "answer": answer,
        }
        # A worker that refused the caller (key, body) changed nothing; one
        # whose init failed is out of the fleet's group until enabled.
        if path == "/init_weights_update_group" and not ok and not refused(resp):
            w.disabled, w.reason = (
                True,
                f"init_weights_update_group failed: {_message(answer)}",
            )
            self.log("disabled", w.url, w.reason)
        return out

    def _merge(self, path, body, targets, answers) -> JSONResponse:
        """One answer in the shape the workers give (so rlsync's client and
        trainers read it as they read a worker's), plus `workers` and `dead`.
        It succeeds when every live worker did; a worker that died during the
        broadcast fails it; workers dead before it are listed, not waited for
        (they rejoin only at the fleet's weight version)."""
        dead = [w.url for w in self.workers if w.dead]
        ok = all(a["success"] for a in answers)
        dicts = [a["answer"] for a in answers if isinstance(a.get("answer"), dict)]
        merged: dict[str, Any] = dict(dicts[0]) if dicts else {}
        for key in ("applied", "ready_to_apply", "group_usable"):
            if any(key in d for d in dicts):
                merged[key] = ok and all(d.get(key, False) for d in dicts)
        if any("num_buckets_received" in d for d in dicts):
            counts = [d.get("num_buckets_received") for d in dicts]
            merged["num_buckets_received"] = min(
                c if isinstance(c, int) else 0 for c in counts
            )
        if any("rank_results" in d for d in dicts):
            merged["rank_results"] = [
                {**r, "worker": a["url"]}
                for a in answers
                if isinstance(a.get("answer"), dict)
                and isinstance(a["answer"].get("rank_results"), list)
                for r in a["answer"]["rank_results"]
                if isinstance(r, dict)
            ]
        if "status" in merged:
            merged["status"] = "ready" if ok else "error"
        if any("awaits_abort_header" in d for d in dicts):
            # The trainer may broadcast the abort header only if every
            # worker's ranks wait for it: ready, or refused and waiting.
            merged["awaits_abort_header"] = len(dicts) == len(answers) and all(
                d.get("status") == "ready" or d.get("awaits_abort_header") is True
                for d in dicts
            )
        failures = [
            f"{a['url']}: {_message(a.get('answer', a.get('message')))}"
            for a in answers
            if not a["success"]
        ]
        skipped = [u for u in dead if u not in {a["url"] for a in answers}]
        if skipped:
            failures.append(f"not sent to dead workers: {', '.join(skipped)}")
        merged.update(success=ok, workers=answers, dead=dead)
        if failures:
            merged["message"] = "; ".join(failures)
        if ok and path in VERSIONED_ROUTES and isinstance(body, dict):
            version = body.get("weight_version")
            if version is not None and merged.get("applied", True):
                self.fleet_version = version
                for w in targets:
                    w.weight_version = version
        status = 200 if ok else max([a["status_code"] for a in answers] + [0])
        return JSONResponse(
            merged, status_code=status if status >= 400 else (200 if ok else 502)
        )

    async def rlsync_info(self) -> JSONResponse:
        """The features every live worker has."""
        infos = []
        for w in self.workers:
            if w.dead:
                continue
            try:
                info = await self.read_answer(w, "/rlsync_info")
            except httpx.HTTPError as e:
                return _error(502, f"{w.url}: /rlsync_info: {type(e).__name__}: {e}")
            except LookupError as e:
                self.unreadable(w, "/rlsync_info", "features", str(e), "nothing")
                if str(e).startswith("HTTP 404"):
                    return _error(404, f"{w.url} is not patched with rlsync")
                return _error(502, f"{w.url}: /rlsync_info: {e}")
            if not isinstance(info.get("features"), list):
                return _error(502, f"{w.url}: /rlsync_info: no list of features")
            self._unread.discard((w.url, "features"))
            infos.append(info)
        if not infos:
            return _error(503, "no live worker")
        features = [
            f for f in infos[0]["features"] if all(f in i["features"] for i in infos)
        ]
        return JSONResponse({**infos[0], "features": features})

    def describe(self) -> dict:
        return {
            "fleet_weight_version": self.fleet_version,
            "admin_lock": self.admin_holder or None,
            "waiting_generations": self.waiting,
            "workers": [
                {**w.describe(), "state": self._state(w)} for w in self.workers
            ],
        }


def _message(answer: Any) -> str:
    """A worker's message, as rlsync's client reads it, capped for summaries."""
    return error_message(answer)[:500]


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"success": False, "error": message}, status_code=status)


def _bad(error: Union[str, ValueError]) -> JSONResponse:
    """400 naming the field, or 413 for a body past its bound."""
    status = 413 if isinstance(error, BodyTooLarge) else 400
    return JSONResponse({"success": False, "message": str(error)}, status_code=status)


def refused(resp: httpx.Response) -> bool:
    """The worker refused the request itself (authentication, a body it
    could not take) rather than failing at the operation."""
    return resp.status_code in (401, 403, 413, 422)


def _check_init_body(body: dict) -> None:
    """The fields a worker's group init needs, checked before any worker is
    asked: a malformed init must not take the fleet out of routing."""
    address = body.get("master_address")
    if not isinstance(address, str) or not address:
        raise ValueError(
            f"master_address: expected a host name or address, got {address!r:.80}"
        )
    port = body.get("master_port")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise ValueError(f"master_port: expected an integer 1..65535, got {port!r:.80}")
    for name in ("group_name", "backend"):
        if name in body and not isinstance(body[name], str):
            raise ValueError(f"{name}: expected a string, got {body[name]!r:.80}")
    timeout = body.get("timeout")
    if timeout is not None and (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or not math.isfinite(timeout)
        or timeout <= 0
    ):
        raise ValueError(
            f"timeout: expected a finite number of seconds > 0, got {timeout!r:.80}"
        )
    _int_field(body, "rank_offset", 1)
    _int_field(body, "world_size", 2)


def _int_field(body: dict, name: str, default: int) -> int:
    """An integer >= 1 of a request body; ValueError naming the field."""
    value = body.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}: expected an integer >= 1, got {value!r:.80}")
    return value


async def read_json(request: Request, max_bytes: int) -> dict:
    """The body as a JSON object ({} when empty); ValueError naming `body`
    (BodyTooLarge past `max_bytes`)."""
    return await read_json_object(request.stream(), max_bytes)


def create_app(config: RouterConfig) -> FastAPI:
    router = Router(config)
    tasks: list[asyncio.Task] = []

    async def lifespan(app: FastAPI):
        await router.discover()
        tasks.append(asyncio.create_task(router.health_loop()))
        yield
        for t in tasks:
            t.cancel()
        await router.http.aclose()

    app = FastAPI(lifespan=lifespan)
    app.state.router = router

    def forwarded(request: Request) -> dict[str, bytes]:
        """The caller's Authorization header, as the bytes that came."""
        values = authorization(request.headers.raw)
        return {"Authorization": values[0]} if values else {}

    for path in GENERATION_ROUTES:

        async def generate(request: Request, path: str = path) -> Response:
            denied = router.check_header(request)
            if denied is not None:
                return denied
            body = await request.body()
            try:
                w = await router.pick()
            except LookupError as e:
                return JSONResponse({"error": str(e)}, status_code=503)
            req = router.http.build_request(
                "POST",
                w.url + path,
                content=body,
                headers={**forwarded(request), "content-type": "application/json"},
            )
            try:
                resp = await router.http.send(req, stream=True)
            except httpx.HTTPError as e:
                router._mark_dead(w, f"{path}: {type(e).__name__}: {e}")
                await router.release(w)
                return JSONResponse({"error": f"{w.url}: {e}"}, status_code=502)

            async def relay():
                try:
                    async for chunk in resp.aiter_raw():
                        yield chunk
                finally:
                    await resp.aclose()
                    await router.release(w)

            return StreamingResponse(
                relay(),
                status_code=resp.status_code,
                media_type=resp.headers.get("content-type"),
            )

        app.add_api_route(path, generate, methods=["POST"])

    for path in LOCKED_ROUTES + OTHER_ADMIN_ROUTES:

        async def admin(request: Request, path: str = path) -> Response:
            denied = router.check_admin(request)
            if denied is not None:
                return denied
            try:
                body = await read_json(request, config.max_request_bytes)
            except ValueError as e:
                router.metrics.broadcast(path, "refused")
                return _bad(e)
            return await router.broadcast(path, body, forwarded(request))

        app.add_api_route(path, admin, methods=["POST"])

    @app.get("/health")
    async def health() -> Response:
        ok = any(w.routable or w.in_update for w in router.workers)
        return Response(status_code=200 if ok else 503)

    @app.get("/rlsync_info")
    async def rlsync_info(request: Request) -> Response:
        return router.check_header(request) or await router.rlsync_info()

    @app.get("/model_info")
    async def model_info(request: Request) -> Response:
        denied = router.check_header(request)
        return denied or JSONResponse({"weight_version": router.fleet_version})

    @app.get("/server_info")
    async def server_info(request: Request) -> Response:
        """The fleet as one engine: its ranks in an update group are the live
        workers' (trainers size their group from this); no secret."""
        denied = router.check_header(request)
        ranks = sum(w.ranks for w in router.workers if not w.dead)
        return denied or JSONResponse({"tp_size": ranks, "dp_size": 1})

    @app.get("/workers")
    async def workers(request: Request) -> Response:
        return router.check_admin(request) or JSONResponse(router.describe())

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        """Prometheus metrics (router_metrics); with an admin key they need
        it, as /workers does: they name every worker's URL and state."""
        return router.check_admin(request) or Response(
            router.metrics.render(), media_type=router.metrics.content_type
        )

    @app.get("/events")
    async def events(request: Request) -> Response:
        denied = router.check_admin(request)
        if denied is not None:
            return denied
        raw = request.query_params.get("since", "0")
        try:
            since = float(raw)
        except ValueError:
            since = math.nan
        if not math.isfinite(since):
            return _bad(f"since: expected a number of seconds, got {raw!r:.80}")
        return JSONResponse([asdict(e) for e in router.events if e.t > since])

    async def set_enabled(request: Request, enabled: bool) -> Response:
        denied = router.check_admin(request)
        if denied is not None:
            return denied
        try:
            body = await read_json(request, MAX_CONTROL_BODY_BYTES)
        except ValueError as e:
            return _bad(e)
        url, reason = body.get("url"), body.get("reason", "disabled by an operator")
        if not isinstance(url, str):
            return _bad(f"url: expected a worker URL (a string), got {url!r:.80}")
        if not isinstance(reason, str):
            return _bad(f"reason: expected a string, got {reason!r:.80}")
        match = [w for w in router.workers if w.url == url.rstrip("/")]
        if not match:
            return _bad(
                f"url: no worker {url!r:.200}; workers: "
                f"{[w.url for w in router.workers]}"
            )
        w = match[0]
        w.disabled = not enabled
        w.reason = "" if enabled else reason[:500]
        router.log("enabled" if enabled else "disabled", w.url, w.reason)
        await router._changed()
        return JSONResponse(
            {
                "success": True,
                "worker": router.describe()["workers"][router.workers.index(w)],
            }
        )

    @app.post("/workers/enable")
    async def enable(request: Request) -> Response:
        return await set_enabled(request, True)

    @app.post("/workers/disable")
    async def disable(request: Request) -> Response:
        return await set_enabled(request, False)

    return app


def build_parser() -> argparse.ArgumentParser:
    """`rlsync router`'s options."""
    ap = argparse.ArgumentParser(
        prog="rlsync router", description=__doc__.split("\n\n", 1)[0]
    )
    ap.add_argument("workers", nargs="+", metavar="WORKER_URL")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=30080)
    ap.add_argument("--admin-api-key", help="default: $SGLANG_ADMIN_API_KEY")
    ap.add_argument(
        "--worker-api-key",
        help="the workers' --api-key, for what the router reads from them "
        "(default: $RLSYNC_WORKER_API_KEY)",
    )
    ap.add_argument(
        "--admin-wait",
        type=float,
        default=30.0,
        help="seconds an admin caller may wait for the admin lock, then 503",
    )
    ap.add_argument(
        "--route-wait",
        type=float,
        default=60.0,
        help="seconds a generation may wait for a routable worker, then 503",
    )
    ap.add_argument("--health-interval", type=float, default=2.0)
    ap.add_argument(
        "--health-timeout",
        type=float,
        default=5.0,
        help="seconds each worker's /health probe may take (probes run at once)",
    )
    ap.add_argument("--request-timeout", type=float, default=600.0)
    ap.add_argument(
        "--max-request-mb",
        type=int,
        default=DEFAULT_MAX_BODY_BYTES >> 20,
        help="largest admin request body in MiB, then 413",
    )
    return ap


def parse_args(
    argv: Optional[list[str]], ap: Optional[argparse.ArgumentParser] = None
) -> argparse.Namespace:
    """`rlsync router`'s arguments, read by `ap` (default: `build_parser()`):
    a flag the router lacks or a worker URL without a scheme exits 2, naming
    it."""
    ap = ap or build_parser()
    # URLs are checked after parsing: a flag the router lacks is reported as
    # such, not as a URL without a scheme (the value after it).
    args, unknown = ap.parse_known_args(argv)
    if unknown:
        ap.error(f"unrecognized arguments: {' '.join(unknown)}")
    for url in args.workers:
        try:
            require_scheme(url)
        except ValueError as e:
            ap.error(f"argument WORKER_URL: {e}")
    return args


def main(argv: Optional[list[str]] = None) -> int:
    ap = build_parser()
    args = parse_args(argv, ap)
    logging.basicConfig(
        level=logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        config = RouterConfig(
            workers=args.workers,
            admin_api_key=args.admin_api_key
            or os.environ.get("SGLANG_ADMIN_API_KEY")
            or None,
            worker_api_key=args.worker_api_key
            or os.environ.get("RLSYNC_WORKER_API_KEY")
            or None,
            admin_wait=args.admin_wait,
            route_wait=args.route_wait,
            request_timeout=args.request_timeout,
            health_interval=args.health_interval,
            health_timeout=args.health_timeout,
            max_request_bytes=args.max_request_mb << 20,
        )
        app = create_app(config)
    except ValueError as e:  # names the flag's field or the key, not its value
        ap.error(str(e))
    server = _RouterServer(
        uvicorn.Config(
            app,
            host=args.host,
            port=args.port,
            log_level="warning",
            timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
        ),
        app.state.router,
    )
    server.run()
    return 0


# On SIGTERM or SIGINT: how long relayed generations may go on before the
# router exits; generations still waiting for a worker get a 503 at once.
SHUTDOWN_GRACE_S = 3


class _RouterServer(uvicorn.Server):
    """uvicorn's server, telling the router when a signal asks it to exit."""

    def __init__(self, config: uvicorn.Config, router: Router):
        super().__init__(config)
        self.router = router

    def handle_exit(self, sig: int, frame: Optional[FrameType]) -> None:
        self.router.closing = True
        super().handle_exit(sig, frame)
