"""Reload weights from a checkpoint on disk, on SGLang and vLLM engines alike.

One async function per engine kind (each runs `rlsync.client`'s call in a
thread), a minimal `InferenceEngine` protocol, an adapter per kind, and
`sync_weights_to_engines` running every engine at once and returning every
engine's outcome, failures included (one dead engine never hides what the
others did). The weight version belongs to the trainer; it is passed through
where the engine takes it.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Optional, Protocol, Sequence

from rlsync import client


def _check_args(base_url: str, checkpoint_path: str, timeout: float) -> None:
    if not base_url.startswith(("http://", "https://")):
        raise ValueError(f"base_url needs a scheme: {base_url!r}")
    if not checkpoint_path:
        raise ValueError("checkpoint_path cannot be empty")
    if timeout <= 0:
        raise ValueError(f"timeout must be > 0, got {timeout}")


async def update_sglang_weights_from_disk(
    base_url: str,
    checkpoint_path: str,
    *,
    weight_version: Optional[str] = None,
    timeout: float = 300.0,
    admin_key: Optional[str] = None,
) -> dict[str, Any]:
    """SGLang `/update_weights_from_disk`; raises EngineError unless it
    answers success."""
    _check_args(base_url, checkpoint_path, timeout)
    return await asyncio.to_thread(
        client.update_weights_from_disk,
        base_url,
        checkpoint_path,
        weight_version=weight_version,
        timeout=timeout,
        admin_key=admin_key,
    )


def vllm_reload_request(checkpoint_path: str, timeout: float) -> dict[str, Any]:
    """The body vLLM's `/collective_rpc` takes: `method`, string `args`,
    string `kwargs`, `timeout`; it runs `reload_weights(weights_path=...)` on
    every worker."""
    return {
        "method": "reload_weights",
        "args": [],
        "kwargs": {"weights_path": str(checkpoint_path)},
        "timeout": timeout,
    }


async def update_vllm_weights_from_disk(
    base_url: str,
    checkpoint_path: str,
    *,
    timeout: float = 300.0,
    api_key: Optional[str] = None,
) -> dict[str, Any]:
    """vLLM `/collective_rpc` `reload_weights` (the server must run with
    VLLM_SERVER_DEV_MODE=1). Answers {"results": [one per worker]}."""
    _check_args(base_url, checkpoint_path, timeout)
    body = await asyncio.to_thread(
        client.call,
        base_url,
        "/collective_rpc",
        vllm_reload_request(checkpoint_path, timeout),
        timeout=timeout,
        api_key=api_key,
    )
    return body if isinstance(body, dict) else {"results": body}


class InferenceEngine(Protocol):
    """What a disk sync needs of an engine, and nothing more."""

    base_url: str

    async def update_weights_from_checkpoint(
        self, checkpoint_path: str
    ) -> dict[str, Any]: ...


@dataclass
class SGLangEngine:
    base_url: str
    timeout: float = 300.0
    admin_key: Optional[str] = None
    weight_version: Optional[str] = None

    async def update_weights_from_checkpoint(
        self, checkpoint_path: str
    ) -> dict[str, Any]:
        return await update_sglang_weights_from_disk(
            self.base_url,
            checkpoint_path,
            weight_version=self.weight_version,
            timeout=self.timeout,
            admin_key=self.admin_key,
        )


@dataclass
class VLLMEngine:
    base_url: str
    timeout: float = 300.0
    api_key: Optional[str] = None

    async def update_weights_from_checkpoint(
        self, checkpoint_path: str
    ) -> dict[str, Any]:
        return await update_vllm_weights_from_disk(
            self.base_url, checkpoint_path, timeout=self.timeout, api_key=self.api_key
        )


@dataclass
class EngineSyncResult:
    base_url: str
    success: bool
    seconds: float
    response: dict[str, Any] = field(default_factory=dict)
    error: Optional[str] = None


async def sync_weights_to_engines(
    engines: Sequence[InferenceEngine], checkpoint_path: str
) -> list[EngineSyncResult]:
    """Every engine reloads `checkpoint_path` at once; one result per engine,
    in the order given, failures included."""
    if not engines:
        raise ValueError("Must provide at least one engine")
    if not checkpoint_path:
        raise ValueError("checkpoint_path cannot be empty")

    async def one(engine: InferenceEngine) -> EngineSyncResult:
        t0 = time.perf_counter()
        try:
            response = await engine.update_weights_from_checkpoint(checkpoint_path)
        except Exception as e:  # reported, never raised: the others still count
            return EngineSyncResult(
                engine.base_url, False, time.perf_counter() - t0, error=str(e)
            )
        return EngineSyncResult(
            engine.base_url, True, time.perf_counter() - t0, response=response
        )

    return list(await asyncio.gather(*(one(e) for e in engines)))
