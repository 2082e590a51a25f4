"""Stateless calls to an SGLang server's weight-update endpoints.

One function per endpoint: preconditions asserted, no hidden state but one
HTTP client per process, explicit timeouts, and every failure raised as
`EngineError` carrying the engine URL, the endpoint, the HTTP status and the
server's own message.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import threading
from typing import Any, Optional, Sequence, TypeVar, Union

import httpx

from rlsync.auth import bearer_headers
from rlsync.protocol import (
    AbortWeightsUpdateResponse,
    BucketMetadata,
    CompleteWeightsUpdateRequest,
    CompleteWeightsUpdateResponse,
    PrepareWeightsUpdateRequest,
    PrepareWeightsUpdateResponse,
    ProtocolError,
)

T = TypeVar("T")


class EngineError(RuntimeError):
    """A call that failed: `status` is the HTTP status (None: no answer),
    `body` the decoded answer, whose fields say more than the message (for
    example `open_session_group`, the group of a session that is in the way)."""

    def __init__(
        self,
        url: str,
        endpoint: str,
        status: Optional[int],
        message: str,
        body: Any = None,
    ):
        self.url = url
        self.endpoint = endpoint
        self.status = status
        self.message = message
        self.body = body
        where = f"{url}{endpoint}"
        super().__init__(
            f"{where}: HTTP {status}: {message}" if status else f"{where}: {message}"
        )


# Seconds to open a connection: longer means the host is unreachable (a
# connect to a host behind a partition would otherwise wait out TCP's
# retries, minutes, whatever the call's own timeout).
CONNECT_TIMEOUT = 10.0
# Seconds an HTTP call waits past the server-side timeout it sends, for the
# answer to come back.
HTTP_MARGIN = 30.0
# A complete's margin past its wait for the bytes: after the wait it still
# verifies, applies and (with flush_cache) waits for requests in flight.
COMPLETE_MARGIN = 60.0

_http_clients: dict[int, httpx.Client] = {}
_http_clients_lock = threading.Lock()


def http_client() -> httpx.Client:
    """This process's client. Building an httpx.Client costs ~17 ms (it loads
    the CA bundle), more than a scheduler round trip, and a sync makes two
    calls per engine. Connections are not kept alive: a sync's calls are
    seconds apart, and a pooled connection the server has just closed would
    fail a prepare or complete that cannot safely be retried."""
    pid = os.getpid()  # a forked child builds its own
    with _http_clients_lock:
        client = _http_clients.get(pid)
        if client is None:
            client = httpx.Client(limits=httpx.Limits(max_keepalive_connections=0))
            _http_clients[pid] = client
        return client


def require_scheme(url: str) -> str:
    """`url` when it is http(s)://...; ValueError saying how to write it."""
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"{url!r} needs a scheme: http://{url} or https://{url}")
    return url


def call(
    url: str,
    endpoint: str,
    payload: Optional[dict[str, Any]] = None,
    *,
    method: str = "POST",
    timeout: float = 60.0,
    admin_key: Optional[str] = None,
    api_key: Optional[str] = None,
) -> Any:
    """One HTTP call; the decoded JSON answer, or EngineError. Sends
    `admin_key` (admin routes) or else `api_key` (the server's ordinary
    `--api-key`) as a bearer token."""
    require_scheme(url)
    if not endpoint.startswith("/"):
        raise ValueError(f"endpoint must start with '/': {endpoint!r}")
    if timeout <= 0:
        raise ValueError(f"timeout must be > 0, got {timeout}")
    url = url.rstrip("/")
    try:
        resp = http_client().request(
            method,
            url + endpoint,
            json=payload,
            timeout=httpx.Timeout(timeout, connect=min(timeout, CONNECT_TIMEOUT)),
            headers=bearer_headers(admin_key, api_key),
        )
    except httpx.HTTPError as e:
        raise EngineError(url, endpoint, None, f"{type(e).__name__}: {e}") from e
    try:
        body = resp.json()
    except ValueError:
        body = resp.text
    if resp.status_code >= 400:
        message = error_message(body)
        if resp.status_code == 401:
            message += ": " + key_advice(endpoint, admin_key, api_key)
        raise EngineError(url, endpoint, resp.status_code, message, body)
    return body


# Routes a server of the series guards as admin routes (upstream's
# AuthLevel.ADMIN_OPTIONAL): its admin key where it has one, else its
# --api-key, else none.
ADMIN_ROUTES = frozenset(
    {
        "/abort_weights_update",
        "/begin_weight_update",
        "/complete_weights_update",
        "/continue_generation",
        "/destroy_weights_update_group",
        "/end_weight_update",
        "/flush_cache",
        "/get_weights_by_name",
        "/init_weights_update_group",
        "/pause_generation",
        "/prepare_weights_update",
        "/update_weight_version",
        "/update_weights_from_disk",
        "/update_weights_from_distributed",
        "/update_weights_from_tensor",
        "/weights_checker",
    }
)
# Ordinary routes: the server's --api-key where it has one, never its admin key.
ORDINARY_ROUTES = frozenset(
    {"/get_model_info", "/get_server_info", "/model_info", "/server_info"}
)
# Where a server reads its keys, and where rlsync takes them.
SERVER_ADMIN_KEY = "its --admin-api-key or $SGLANG_ADMIN_API_KEY where it was started"
PASS_ADMIN_KEY = (
    "Engine(url, tp_size, admin_key=...), or rlsync's --admin-key or "
    "$SGLANG_ADMIN_API_KEY"
)
PASS_API_KEY = (
    "Engine(url, tp_size, api_key=...), or rlsync's --api-key or $SGLANG_API_KEY"
)


def key_advice(endpoint: str, admin_key: Optional[str], api_key: Optional[str]) -> str:
    """What a 401 from `endpoint` means for the key the call sent: which key
    the server expects there and where it reads it."""
    if endpoint in ADMIN_ROUTES:
        return _admin_route_advice(endpoint, admin_key, api_key)
    if endpoint in ORDINARY_ROUTES:
        return _ordinary_route_advice(endpoint, admin_key, api_key)
    sent = (
        "the admin key given (admin_key) was refused"
        if admin_key
        else (
            "the API key given (api_key) was refused" if api_key else "no key was sent"
        )
    )
    return (
        f"{sent}. Admin routes take the server's admin key ({SERVER_ADMIN_KEY}) "
        f"if it has one, else its --api-key; other routes take its --api-key: "
        f"{PASS_ADMIN_KEY}; {PASS_API_KEY}"
    )


def _admin_route_advice(
    endpoint: str, admin_key: Optional[str], api_key: Optional[str]
) -> str:
    expected = (
        f"{endpoint} is an admin route: the server takes its admin key there "
        f"({SERVER_ADMIN_KEY}), or its --api-key if it has no admin key"
    )
    if admin_key:
        return (
            f"{expected}; the admin key given (admin_key) was refused: it must "
            f"equal the server's --admin-api-key, or its --api-key where it has "
            f"no admin key"
        )
    if api_key:
        return (
            f"{expected}; the API key given (api_key) was refused: a server with "
            f"an admin key takes only that key on admin routes, so pass the admin "
            f"key ({PASS_ADMIN_KEY})"
        )
    return f"{expected}; no key was sent: pass the admin key ({PASS_ADMIN_KEY})"


def _ordinary_route_advice(
    endpoint: str, admin_key: Optional[str], api_key: Optional[str]
) -> str:
    expected = (
        f"{endpoint} is an ordinary route: the server takes its --api-key there, "
        f"never its admin key"
    )
    if admin_key:
        return (
            f"{expected}; the admin key (admin_key) was sent in its place: pass "
            f"the --api-key alone ({PASS_API_KEY})"
        )
    if api_key:
        return (
            f"{expected}; the API key given (api_key) was refused: it must equal "
            f"the server's --api-key"
        )
    return f"{expected}; no key was sent: pass the API key ({PASS_API_KEY})"


def error_message(body: Any) -> str:
    if isinstance(body, dict):
        for key in ("message", "detail", "error"):
            if body.get(key):
                return str(body[key])
    return str(body)


def _ok(url: str, endpoint: str, body: Any) -> dict[str, Any]:
    if not isinstance(body, dict) or not body.get("success", False):
        raise EngineError(url, endpoint, 200, error_message(body), body)
    return body


def call_ok(
    url: str,
    endpoint: str,
    payload: Optional[dict[str, Any]] = None,
    *,
    timeout: float,
    admin_key: Optional[str] = None,
    api_key: Optional[str] = None,
) -> dict[str, Any]:
    """`call` a route that answers `{"success": ...}`: the answer, or
    EngineError with the server's message where it says no."""
    body = call(
        url, endpoint, payload, timeout=timeout, admin_key=admin_key, api_key=api_key
    )
    return _ok(url, endpoint, body)


def _parse(url: str, endpoint: str, cls: type[T], body: Any) -> T:
    try:
        return cls.from_json(body)  # type: ignore[attr-defined]
    except ProtocolError as e:
        raise EngineError(url, endpoint, 200, str(e)) from e


# --- upstream endpoints ---------------------------------------------------


def init_weights_update_group(
    url: str,
    *,
    master_address: str,
    master_port: int,
    rank_offset: int,
    world_size: int,
    group_name: str = "weight_update_group",
    backend: str = "nccl",
    timeout: float = 300.0,
    admin_key: Optional[str] = None,
    api_key: Optional[str] = None,
) -> dict[str, Any]:
    if rank_offset < 1:
        raise ValueError("rank 0 is the trainer; engines start at 1")
    if world_size <= rank_offset:
        raise ValueError(f"world_size {world_size} <= rank_offset {rank_offset}")
    payload = dict(
        master_address=master_address,
        master_port=master_port,
        rank_offset=rank_offset,
        world_size=world_size,
        group_name=group_name,
        backend=backend,
        # The engine gives up within it (patch
        # `init-weights-update-group-timeout`; older servers ignore it and
        # wait torch's 30 minutes), and answers why.
        timeout=timeout,
    )
    return call_ok(
        url,
        "/init_weights_update_group",
        payload,
        timeout=timeout + HTTP_MARGIN,
        admin_key=admin_key,
        api_key=api_key,
    )


def destroy_weights_update_group(
    url: str,
    *,
    group_name: str = "weight_update_group",
    session_id: Optional[str] = None,
    timeout: float = 60.0,
    admin_key: Optional[str] = None,
    api_key: Optional[str] = None,
) -> dict[str, Any]:
    """`session_id`: while a session is open on the group, destroy it (and
    abort the session) only if it is that one."""
    return call_ok(
        url,
        "/destroy_weights_update_group",
        _with_session({"group_name": group_name}, session_id),
        timeout=timeout,
        admin_key=admin_key,
        api_key=api_key,
    )


def begin_weight_update(
    url: str,
    *,
    timeout: float = 600.0,
    admin_key: Optional[str] = None,
    api_key: Optional[str] = None,
) -> bool:
    """Open upstream's weight-update session (SGLang 0.5.23 and later), which
    its single-phase updates must run inside; False where the server has no
    such session (0.5.10: nothing to open). A two-phase update runs outside
    it, and neither starts while the other is open."""
    try:
        call_ok(
            url,
            "/begin_weight_update",
            {},
            timeout=timeout,
            admin_key=admin_key,
            api_key=api_key,
        )
    except EngineError as e:
        if e.status == 404:
            return False
        raise
    return True


def end_weight_update(
    url: str,
    *,
    timeout: float = 600.0,
    admin_key: Optional[str] = None,
    api_key: Optional[str] = None,
) -> None:
    """Close the session `begin_weight_update` opened."""
    call_ok(
        url,
        "/end_weight_update",
        {},
        timeout=timeout,
        admin_key=admin_key,
        api_key=api_key,
    )


def update_weights_from_distributed(
    url: str,
    *,
    names: Sequence[str],
    dtypes: Sequence[str],
    shapes: Sequence[Sequence[int]],
    group_name: str = "weight_update_group",
    load_format: Optional[str] = None,
    flush_cache: bool = True,
    weight_version: Optional[str] = None,
    timeout: float = 600.0,
    admin_key: Optional[str] = None,
    api_key: Optional[str] = None,
) -> dict[str, Any]:
    """Upstream's single-phase update (for unpatched servers). On SGLang
    0.5.23 and later it must run inside `begin_weight_update` /
    `end_weight_update`."""
    if not (len(names) == len(dtypes) == len(shapes)):
        raise ValueError("names/dtypes/shapes lengths differ")
    payload: dict[str, Any] = dict(
        names=list(names),
        dtypes=list(dtypes),
        shapes=[list(s) for s in shapes],
        group_name=group_name,
        flush_cache=flush_cache,
    )
    if load_format is not None:
        payload["load_format"] = load_format
    if weight_version is not None:
        payload["weight_version"] = weight_version
    return call_ok(
        url,
        "/update_weights_from_distributed",
        payload,
        timeout=timeout,
        admin_key=admin_key,
        api_key=api_key,
    )


def update_weights_from_disk(
    url: str,
    model_path: str,
    *,
    weight_version: Optional[str] = None,
    timeout: float = 300.0,
    admin_key: Optional[str] = None,
    api_key: Optional[str] = None,
) -> dict[str, Any]:
    if not model_path:
        raise ValueError("model_path cannot be empty")
    payload: dict[str, Any] = {"model_path": model_path}
    if weight_version is not None:
        payload["weight_version"] = weight_version
    return call_ok(
        url,
        "/update_weights_from_disk",
        payload,
        timeout=timeout,
        admin_key=admin_key,
        api_key=api_key,
    )


def get_weights_by_name(
    url: str,
    name: str,
    *,
    truncate_size: int = 100,
    timeout: float = 60.0,
    admin_key: Optional[str] = None,
    api_key: Optional[str] = None,
) -> list:
    """An admin route: `admin_key` (or a `--api-key` server's key) needed
    where the server has one."""
    if not name:
        raise ValueError("name cannot be empty")
    payload = {"name": name, "truncate_size": truncate_size}
    body = call(
        url,
        "/get_weights_by_name",
        payload,
        timeout=timeout,
        admin_key=admin_key,
        api_key=api_key,
    )
    if body is None:
        raise EngineError(url, "/get_weights_by_name", 200, f"no parameter {name!r}")
    return body


def get_weight_version(
    url: str, *, timeout: float = 10.0, api_key: Optional[str] = None
) -> str:
    """`/model_info`, an ordinary route: `api_key` where the server has one."""
    body = call(url, "/model_info", method="GET", timeout=timeout, api_key=api_key)
    if not isinstance(body, dict) or "weight_version" not in body:
        raise EngineError(url, "/model_info", 200, f"no weight_version in {body!r}")
    return str(body["weight_version"])


def health(url: str, *, generate: bool = False, timeout: float = 10.0) -> int:
    """HTTP status of /health (or /health_generate); 0 when unreachable."""
    return health_detail(url, generate=generate, timeout=timeout)[0]


def health_detail(
    url: str, *, generate: bool = False, timeout: float = 10.0
) -> tuple[int, str]:
    """(HTTP status, body) of /health or /health_generate; (0, why) when
    unreachable. With the series, a 200 body names the weight operations in
    flight and a 503 body the one past its deadline."""
    endpoint = "/health_generate" if generate else "/health"
    try:
        resp = http_client().get(url.rstrip("/") + endpoint, timeout=timeout)
    except httpx.HTTPError as e:
        return 0, f"{type(e).__name__}: {e}"
    return resp.status_code, resp.text


PAUSE_MODES = ("abort", "retract", "in_place")


def pause_generation(
    url: str,
    *,
    mode: str = "abort",
    timeout: float = 60.0,
    admin_key: Optional[str] = None,
    api_key: Optional[str] = None,
) -> dict[str, Any]:
    """Upstream's /pause_generation: `abort` returns in-flight requests,
    `retract` puts them back in the queue, `in_place` keeps them and their KV
    cache for /continue_generation."""
    if mode not in PAUSE_MODES:
        raise ValueError(f"mode must be one of {PAUSE_MODES}, got {mode!r}")
    return call(
        url,
        "/pause_generation",
        {"mode": mode},
        timeout=timeout,
        admin_key=admin_key,
        api_key=api_key,
    )


def continue_generation(
    url: str,
    *,
    timeout: float = 60.0,
    admin_key: Optional[str] = None,
    api_key: Optional[str] = None,
) -> dict[str, Any]:
    return call(
        url,
        "/continue_generation",
        {},
        timeout=timeout,
        admin_key=admin_key,
        api_key=api_key,
    )


# --- two-phase update (rlsync series) --------------------------------------


def prepare_weights_update(
    url: str,
    buckets: Sequence[Union[BucketMetadata, dict[str, Any]]],
    *,
    group_name: str = "weight_update_group",
    load_format: Optional[str] = None,
    weight_version: Optional[str] = None,
    defer_digests: bool = False,
    session_id: Optional[str] = None,
    framed: bool = False,
    shares: Optional[dict[str, Sequence[Union[BucketMetadata, dict[str, Any]]]]] = None,
    timeout: float = 120.0,
    admin_key: Optional[str] = None,
    api_key: Optional[str] = None,
) -> PrepareWeightsUpdateResponse:
    """Answers once the server's receiver runs: broadcast right after.
    `defer_digests`: the buckets carry no digest; the server records each
    bucket's as it lands and `complete_weights_update(digests=...)` brings
    the sender's. The answer's `session_id` names the session (`session_id`
    here proposes one: `new_session_id()`, fresh for every prepare); pass it
    to complete and abort, which then never touch another caller's session.
    `framed`: a header goes before each bucket (`rlsync.bucket_header`), so
    that the sender can abort in band and keep the group; a refused framed
    prepare (its error body says `awaits_abort_header`) waits for the
    sender's abort header in place of bucket 0. `shares`: the update's
    other shares (group name -> its buckets), each streamed by its own
    sender over its own group; one session, applied once every share has
    arrived (the server's `multi_group_sessions`)."""
    if not buckets:
        raise ValueError("buckets: an update needs at least one bucket")
    metadata = _bucket_metadata(buckets)
    if defer_digests and any(b.digest for b in metadata):
        raise ValueError("defer_digests: the buckets carry no digest")
    request = PrepareWeightsUpdateRequest(
        num_buckets=len(metadata),
        buckets=metadata,
        group_name=group_name,
        load_format=load_format,
        weight_version=weight_version,
        defer_digests=defer_digests,
        session_id=session_id,
        framed=framed,
        shares=(
            None
            if not shares
            else {name: _bucket_metadata(b) for name, b in shares.items()}
        ),
    )
    endpoint = "/prepare_weights_update"
    body = call(
        url,
        endpoint,
        request.to_json(),
        timeout=timeout,
        admin_key=admin_key,
        api_key=api_key,
    )
    answer = _parse(url, endpoint, PrepareWeightsUpdateResponse, body)
    if answer.status != "ready":
        raise EngineError(url, endpoint, 200, answer.message or answer.status)
    return answer


def _bucket_metadata(
    buckets: Sequence[Union[BucketMetadata, dict[str, Any]]],
) -> list[BucketMetadata]:
    return [
        b if isinstance(b, BucketMetadata) else BucketMetadata(**b) for b in buckets
    ]


def complete_weights_update(
    url: str,
    *,
    group_name: str = "weight_update_group",
    flush_cache: Optional[bool] = None,
    weight_version: Optional[str] = None,
    apply: bool = True,
    wait_timeout: Optional[float] = None,
    drain: Optional[bool] = None,
    release_staging: bool = False,
    digests: Optional[Sequence[str]] = None,
    session_id: Optional[str] = None,
    timeout: float = 600.0,
    admin_key: Optional[str] = None,
    api_key: Optional[str] = None,
) -> CompleteWeightsUpdateResponse:
    """Waits (server side, up to `wait_timeout`) for every bucket, verifies,
    applies unless `apply=False`. `digests`: one per bucket, in bucket order,
    after a prepare with `defer_digests` (the server applies nothing unless
    every bucket matches). `session_id`: prepare's; a complete naming a
    session that is not the open one is a 409 that changes nothing.
    `flush_cache`: by default the server flushes its prefix cache after the
    apply if no request is in flight then (the answer's `cache_flushed` says
    whether it did); True lets in-flight requests finish first, then
    flushes; False keeps the cache. A failed complete raises EngineError."""
    request = CompleteWeightsUpdateRequest(
        group_name=group_name,
        flush_cache=flush_cache,
        weight_version=weight_version,
        apply=apply,
        timeout=wait_timeout,
        drain=drain,
        release_staging=release_staging,
        digests=None if digests is None else list(digests),
        session_id=session_id,
    )
    endpoint = "/complete_weights_update"
    body = call_ok(
        url,
        endpoint,
        request.to_json(),
        timeout=timeout,
        admin_key=admin_key,
        api_key=api_key,
    )
    return _parse(url, endpoint, CompleteWeightsUpdateResponse, body)


def abort_weights_update(
    url: str,
    *,
    group_name: str = "weight_update_group",
    session_id: Optional[str] = None,
    abort_header_sent: bool = False,
    abort_header_sent_groups: Optional[Sequence[str]] = None,
    timeout: float = 60.0,
    admin_key: Optional[str] = None,
    api_key: Optional[str] = None,
) -> AbortWeightsUpdateResponse:
    """`session_id`: prepare's; an abort naming a session that is not the
    open one is a 409 that changes nothing. Without it the open session of
    `group_name` is aborted, whoever opened it. `abort_header_sent`: the
    sender of a framed session broadcast the abort header, so the server's
    receive ends by itself and the group stays usable.
    `abort_header_sent_groups`: the same for a session of several groups,
    naming the groups whose sender did so."""
    endpoint = "/abort_weights_update"
    payload = _with_session({"group_name": group_name}, session_id)
    if abort_header_sent:
        payload["abort_header_sent"] = True
    if abort_header_sent_groups is not None:
        payload["abort_header_sent_groups"] = list(abort_header_sent_groups)
    body = call_ok(
        url,
        endpoint,
        payload,
        timeout=timeout,
        admin_key=admin_key,
        api_key=api_key,
    )
    return _parse(url, endpoint, AbortWeightsUpdateResponse, body)


def new_session_id() -> str:
    """A fresh, unguessable session id for `prepare_weights_update`."""
    return secrets.token_urlsafe(18)


def _with_session(body: dict[str, Any], session_id: Optional[str]) -> dict[str, Any]:
    # Sent only when set: servers without session ids see today's body.
    return body if session_id is None else {**body, "session_id": session_id}


# --- capability discovery (rlsync series) ------------------------------------


def rlsync_info(
    url: str, *, timeout: float = 10.0, api_key: Optional[str] = None
) -> dict[str, Any]:
    """`/rlsync_info`: {"series", "version", "pin", "features"}. EngineError
    with a clear message when the server is not patched with rlsync. Open on
    current servers; `api_key` is for servers of older series that keep it
    behind `--api-key`."""
    endpoint = "/rlsync_info"
    try:
        body = call(url, endpoint, method="GET", timeout=timeout, api_key=api_key)
    except EngineError as e:
        if e.status == 404:
            raise EngineError(
                e.url,
                endpoint,
                404,
                "this SGLang server is not patched with rlsync (it has no "
                "/rlsync_info): install the forked sglang==<version>+rlsync.N "
                "wheel, or apply the series to its tree with `make apply "
                "SGLANG_DIR=<tree>` from the rlsync repository",
            ) from e
        raise
    if not isinstance(body, dict) or "features" not in body:
        raise EngineError(url, endpoint, 200, f"no features in {body!r}")
    return body


def server_info(
    url: str, *, timeout: float = 10.0, api_key: Optional[str] = None
) -> dict[str, Any]:
    """`/server_info` (`/get_server_info` where a server has only that): its
    arguments (keys redacted by the series; an unset key stays None), the
    SGLang `version`, and the series' `rlsync` block."""
    try:
        info = call(url, "/server_info", method="GET", timeout=timeout, api_key=api_key)
        endpoint = "/server_info"
    except EngineError as e:
        if e.status != 404:
            raise
        endpoint = "/get_server_info"
        info = call(url, endpoint, method="GET", timeout=timeout, api_key=api_key)
    if not isinstance(info, dict):
        raise EngineError(url, endpoint, 200, f"not a JSON object: {info!r}")
    return info


def update_group_ranks(
    url: str, *, timeout: float = 10.0, api_key: Optional[str] = None
) -> int:
    """The ranks the server brings to an update group, from `/server_info`."""
    info = call(url, "/server_info", method="GET", timeout=timeout, api_key=api_key)
    if not isinstance(info, dict):
        raise EngineError(url, "/server_info", 200, f"not a JSON object: {info!r}")
    return group_ranks(url, info)


def group_ranks(url: str, info: dict[str, Any]) -> int:
    """The ranks in a server's `/server_info` answer: dp_size * tp_size
    (attention data parallelism shares the TP ranks)."""
    tp, dp = update_group_shape(url, info)
    return tp * dp


def update_group_shape(url: str, info: dict[str, Any]) -> tuple[int, int]:
    """(tp_size, dp_size) of a server's `/server_info` answer as the update
    group counts them: every DP replica's TP ranks join, except that
    attention data parallelism shares one TP group (dp_size 1 then)."""
    tp, dp = info.get("tp_size"), info.get("dp_size", 1)
    if not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in (tp, dp)
    ):
        raise EngineError(url, "/server_info", 200, f"tp_size {tp!r}, dp_size {dp!r}")
    return tp, update_group_dp(info, dp)


def update_group_dp(info: dict[str, Any], dp_size: int) -> int:
    """The DP replicas of a server (`/server_info` answer `info`) whose TP
    ranks join the update group: `dp_size`, or 1 with attention data
    parallelism (its replicas share one TP group)."""
    return 1 if info.get("enable_dp_attention") else dp_size


def require_features(
    url: str,
    features: Sequence[str],
    *,
    timeout: float = 10.0,
    api_key: Optional[str] = None,
) -> dict:
    """Fail early, naming what is missing, unless the server has `features`."""
    info = rlsync_info(url, timeout=timeout, api_key=api_key)
    missing = [f for f in features if f not in info["features"]]
    if missing:
        raise EngineError(
            url.rstrip("/"),
            "/rlsync_info",
            200,
            f"server runs rlsync series {info.get('version')} without "
            f"{', '.join(missing)}; upgrade its rlsync series",
        )
    return info


# --- weights checker (rlsync series) ----------------------------------------

# Both answers' checksums carry it, so a checksum says how it was made.
CHECKSUM_PREFIX = "sha256:"


def weights_checksum(
    url: str,
    *,
    timeout: float = 300.0,
    admin_key: Optional[str] = None,
    api_key: Optional[str] = None,
) -> dict[str, Any]:
    """`/weights_checker` action "checksum": {"checksum", "num_tensors",
    "rank_results": [{"rank", "checksum", "num_tensors", ...}], "source"}.
    Inference on the server waits while it runs. Comparable across servers
    of the same release, series and TP size.

    Two answers are understood. The series' own action on 0.5.10 ("source":
    "rlsync"): SHA256 over every tensor's name, dtype, shape and bytes, with
    "num_bytes" per rank and in all. Upstream's action where SGLang has one
    (0.5.23, "source": "upstream"): a hash of every persistent tensor's
    (dequantized) bytes per rank and SHA256 over the ranks'; its per-tensor
    hashes are kept per rank as "tensors"."""
    endpoint = "/weights_checker"
    body = call_ok(
        url,
        endpoint,
        {"action": "checksum"},
        timeout=timeout,
        admin_key=admin_key,
        api_key=api_key,
    )
    if "per_engine_checksum" in body or ("checksum" not in body and "ranks" in body):
        body = _upstream_checksum(body)
    else:
        body.setdefault("source", "rlsync")
    if "checksum" not in body or not body.get("rank_results"):
        raise EngineError(url, endpoint, 200, f"no checksum in {body!r}")
    return body


def _upstream_checksum(body: dict[str, Any]) -> dict[str, Any]:
    """Upstream's checksum answer ({"per_engine_checksum", "ranks": [{
    "checksums", "per_gpu_checksum", "parallelism_info"}]}) in the series'
    shape, so callers read one form. Its first form (SGLang 0.5.12) has the
    per-tensor checksums alone: a rank's checksum is then SHA256 over its
    tensors' (by name), the engine's over the ranks' in order."""
    ranks = []
    for entry in body.get("ranks") or []:
        if not isinstance(entry, dict) or "checksums" not in entry:
            continue
        info = entry.get("parallelism_info") or {}
        if isinstance(info, list):  # one entry per role the rank serves
            info = next((i for i in info if isinstance(i, dict)), {})
        tensors = entry.get("checksums") or {}
        ranks.append(
            {
                "rank": info.get("tp_rank", len(ranks)),
                "dp_rank": info.get("dp_rank", 0),
                "role": info.get("role", "target"),
                "success": True,
                "checksum": CHECKSUM_PREFIX
                + str(entry.get("per_gpu_checksum") or _sha256_of(tensors)),
                "num_tensors": len(tensors),
                "tensors": tensors,
            }
        )
    ranks.sort(key=lambda r: (r["dp_rank"], r["rank"]))
    engine = body.get("per_engine_checksum") or _sha256_of(
        {f"{r['dp_rank']:08d}.{r['rank']:08d}": r["checksum"] for r in ranks}
    )
    return {
        "success": body.get("success", True),
        "message": body.get("message", ""),
        "checksum": CHECKSUM_PREFIX + str(engine),
        "num_tensors": sum(r["num_tensors"] for r in ranks),
        "rank_results": ranks,
        "source": "upstream",
    }


def _sha256_of(checksums: dict[str, Any]) -> str:
    """SHA256 over named checksums, in name order."""
    h = hashlib.sha256()
    for name in sorted(checksums):
        h.update(f"{name}\0{checksums[name]}\n".encode())
    return h.hexdigest()
