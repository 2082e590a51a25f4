"""Stateless calls to an SGLang server's weight-update endpoints.

One function per endpoint: preconditions asserted, no hidden state, explicit
timeouts, and every failure raised as `EngineError` carrying the engine URL,
the endpoint, the HTTP status and the server's own message.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import httpx


class EngineError(RuntimeError):
    def __init__(self, url: str, endpoint: str, status: Optional[int], message: str):
        self.url = url
        self.endpoint = endpoint
        self.status = status
        self.message = message
        where = f"{url}{endpoint}"
        super().__init__(
            f"{where}: HTTP {status}: {message}" if status else f"{where}: {message}"
        )


def _headers(admin_key: Optional[str]) -> dict[str, str]:
    return {"Authorization": f"Bearer {admin_key}"} if admin_key else {}


def call(
    url: str,
    endpoint: str,
    payload: Optional[dict[str, Any]] = None,
    *,
    method: str = "POST",
    timeout: float = 60.0,
    admin_key: Optional[str] = None,
) -> Any:
    """One HTTP call; the decoded JSON answer, or EngineError."""
    assert url.startswith(("http://", "https://")), f"url needs a scheme: {url!r}"
    assert endpoint.startswith("/"), f"endpoint must start with '/': {endpoint!r}"
    assert timeout > 0, f"timeout must be > 0, got {timeout}"
    url = url.rstrip("/")
    try:
        resp = httpx.request(
            method, url + endpoint, json=payload, timeout=timeout,
            headers=_headers(admin_key),
        )  # fmt: skip
    except httpx.HTTPError as e:
        raise EngineError(url, endpoint, None, f"{type(e).__name__}: {e}") from e
    try:
        body = resp.json()
    except ValueError:
        body = resp.text
    if resp.status_code >= 400:
        raise EngineError(url, endpoint, resp.status_code, _message(body))
    return body


def _message(body: Any) -> str:
    if isinstance(body, dict):
        for key in ("message", "detail", "error"):
            if body.get(key):
                return str(body[key])
    return str(body)


def _ok(url: str, endpoint: str, body: Any) -> dict[str, Any]:
    if not isinstance(body, dict) or not body.get("success", False):
        raise EngineError(url, endpoint, 200, _message(body))
    return body


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
) -> dict[str, Any]:
    assert rank_offset >= 1, "rank 0 is the trainer; engines start at 1"
    assert (
        world_size > rank_offset
    ), f"world_size {world_size} <= rank_offset {rank_offset}"
    payload = dict(
        master_address=master_address, master_port=master_port, rank_offset=rank_offset,
        world_size=world_size, group_name=group_name, backend=backend,
    )  # fmt: skip
    endpoint = "/init_weights_update_group"
    body = call(url, endpoint, payload, timeout=timeout, admin_key=admin_key)
    return _ok(url, endpoint, body)


def destroy_weights_update_group(
    url: str,
    *,
    group_name: str = "weight_update_group",
    timeout: float = 60.0,
    admin_key: Optional[str] = None,
) -> dict[str, Any]:
    endpoint = "/destroy_weights_update_group"
    body = call(
        url, endpoint, {"group_name": group_name}, timeout=timeout, admin_key=admin_key
    )
    return _ok(url, endpoint, body)


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
) -> dict[str, Any]:
    """Upstream's single-phase update (for unpatched servers)."""
    assert (
        len(names) == len(dtypes) == len(shapes)
    ), "names/dtypes/shapes lengths differ"
    payload: dict[str, Any] = dict(
        names=list(names), dtypes=list(dtypes), shapes=[list(s) for s in shapes],
        group_name=group_name, flush_cache=flush_cache,
    )  # fmt: skip
    if load_format is not None:
        payload["load_format"] = load_format
    if weight_version is not None:
        payload["weight_version"] = weight_version
    endpoint = "/update_weights_from_distributed"
    body = call(url, endpoint, payload, timeout=timeout, admin_key=admin_key)
    return _ok(url, endpoint, body)


def update_weights_from_disk(
    url: str,
    model_path: str,
    *,
    weight_version: Optional[str] = None,
    timeout: float = 300.0,
    admin_key: Optional[str] = None,
) -> dict[str, Any]:
    assert model_path, "model_path cannot be empty"
    payload: dict[str, Any] = {"model_path": model_path}
    if weight_version is not None:
        payload["weight_version"] = weight_version
    endpoint = "/update_weights_from_disk"
    body = call(url, endpoint, payload, timeout=timeout, admin_key=admin_key)
    return _ok(url, endpoint, body)


def get_weights_by_name(
    url: str, name: str, *, truncate_size: int = 100, timeout: float = 60.0
) -> list:
    assert name, "name cannot be empty"
    payload = {"name": name, "truncate_size": truncate_size}
    body = call(url, "/get_weights_by_name", payload, timeout=timeout)
    if body is None:
        raise EngineError(url, "/get_weights_by_name", 200, f"no parameter {name!r}")
    return body


def get_weight_version(url: str, *, timeout: float = 10.0) -> str:
    body = call(url, "/model_info", method="GET", timeout=timeout)
    if not isinstance(body, dict) or "weight_version" not in body:
        raise EngineError(url, "/model_info", 200, f"no weight_version in {body!r}")
    return str(body["weight_version"])


def health(url: str, *, generate: bool = False, timeout: float = 10.0) -> int:
    """HTTP status of /health (or /health_generate); 0 when unreachable."""
    try:
        endpoint = "/health_generate" if generate else "/health"
        return httpx.get(url.rstrip("/") + endpoint, timeout=timeout).status_code
    except httpx.HTTPError:
        return 0


# --- two-phase update (rlsync series) --------------------------------------


def prepare_weights_update(
    url: str,
    buckets: Sequence[dict[str, Any]],
    *,
    group_name: str = "weight_update_group",
    load_format: Optional[str] = None,
    weight_version: Optional[str] = None,
    timeout: float = 120.0,
    admin_key: Optional[str] = None,
) -> dict[str, Any]:
    """Answers once the server's receiver runs: broadcast right after."""
    assert buckets, "an update needs at least one bucket"
    payload: dict[str, Any] = dict(
        num_buckets=len(buckets), buckets=list(buckets), group_name=group_name,
        load_format=load_format,
    )  # fmt: skip
    if weight_version is not None:
        payload["weight_version"] = weight_version
    endpoint = "/prepare_weights_update"
    body = call(url, endpoint, payload, timeout=timeout, admin_key=admin_key)
    if not isinstance(body, dict) or body.get("status") != "ready":
        raise EngineError(url, endpoint, 200, _message(body))
    return body


def complete_weights_update(
    url: str,
    *,
    group_name: str = "weight_update_group",
    flush_cache: bool = False,
    weight_version: Optional[str] = None,
    apply: bool = True,
    wait_timeout: Optional[float] = None,
    drain: bool = False,
    timeout: float = 600.0,
    admin_key: Optional[str] = None,
) -> dict[str, Any]:
    payload: dict[str, Any] = dict(
        group_name=group_name, flush_cache=flush_cache, apply=apply, drain=drain
    )
    if weight_version is not None:
        payload["weight_version"] = weight_version
    if wait_timeout is not None:
        payload["timeout"] = wait_timeout
    endpoint = "/complete_weights_update"
    body = call(url, endpoint, payload, timeout=timeout, admin_key=admin_key)
    return _ok(url, endpoint, body)


def abort_weights_update(
    url: str,
    *,
    group_name: str = "weight_update_group",
    timeout: float = 60.0,
    admin_key: Optional[str] = None,
) -> dict[str, Any]:
    endpoint = "/abort_weights_update"
    body = call(
        url, endpoint, {"group_name": group_name}, timeout=timeout, admin_key=admin_key
    )
    return _ok(url, endpoint, body)
