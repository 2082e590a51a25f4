"""Typed messages of the two-phase protocol (its wire types, plus the
extensions the rlsync series accepts).

Requests serialise with `to_json()`; answers parse with `from_json()`, which
checks the fields the protocol requires and keeps any extra field the server
adds in `extra` instead of failing on it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional, TypeVar

T = TypeVar("T")


class ProtocolError(ValueError):
    """An answer that does not have the shape of the protocol's type."""


def _from_json(cls: type[T], body: Any) -> T:
    if not isinstance(body, dict):
        raise ProtocolError(f"{cls.__name__}: expected a JSON object, got {body!r}")
    known = {f.name: f for f in dataclasses.fields(cls) if f.name != "extra"}
    missing = [
        name
        for name, f in known.items()
        if f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
        and name not in body
    ]
    if missing:
        raise ProtocolError(f"{cls.__name__}: missing {', '.join(missing)} in {body!r}")
    kwargs = {k: v for k, v in body.items() if k in known}
    extra = {k: v for k, v in body.items() if k not in known}
    return cls(**kwargs, extra=extra)  # type: ignore[call-arg]


def _drop_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


@dataclass
class BucketMetadata:
    names: list[str]
    dtypes: list[str]  # e.g. "bfloat16", "float32"
    shapes: list[list[int]]
    digest: Optional[str] = None  # "psum61:<s1>:<s2>", checked before apply

    def __post_init__(self):
        if not (len(self.names) == len(self.dtypes) == len(self.shapes)):
            raise ValueError(
                f"names/dtypes/shapes lengths differ: {len(self.names)}/{len(self.dtypes)}/{len(self.shapes)}"
            )

    def to_json(self) -> dict[str, Any]:
        return _drop_none(dataclasses.asdict(self))


@dataclass
class PrepareWeightsUpdateRequest:
    num_buckets: int
    buckets: list[BucketMetadata]
    group_name: str
    load_format: Optional[str] = None  # None | "flattened_bucket"
    weight_version: Optional[str] = None
    # The buckets carry no digest: the server records each bucket's digest as
    # it lands, and the first complete brings the sender's (`digests`).
    defer_digests: bool = False
    # The session's id; None: the server chooses one (the answer has it)
    session_id: Optional[str] = None
    # A header before each bucket: the sender can abort in band
    framed: bool = False
    # The update's other shares, each sent over its own group: group name ->
    # its buckets (the buckets above are `group_name`'s share)
    shares: Optional[dict[str, list[BucketMetadata]]] = None

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = dict(
            num_buckets=self.num_buckets,
            buckets=[b.to_json() for b in self.buckets],
            group_name=self.group_name,
            load_format=self.load_format,
        )
        if self.weight_version is not None:
            body["weight_version"] = self.weight_version
        if self.defer_digests:  # omitted by default: older servers see today's body
            body["defer_digests"] = True
        if self.session_id is not None:
            body["session_id"] = self.session_id
        if self.framed:
            body["framed"] = True
        if self.shares:
            body["shares"] = [
                {
                    "group_name": name,
                    "num_buckets": len(buckets),
                    "buckets": [b.to_json() for b in buckets],
                }
                for name, buckets in self.shares.items()
            ]
        return body


@dataclass
class PrepareWeightsUpdateResponse:
    status: str  # "ready" or "error"
    message: str = ""
    num_bytes: int = 0
    staging_reused: bool = False
    staging_bytes: Optional[int] = None  # the staging the engine holds for it
    session_id: Optional[str] = None  # the session opened (servers with ids)
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, body: Any) -> "PrepareWeightsUpdateResponse":
        return _from_json(cls, body)


@dataclass
class CompleteWeightsUpdateRequest:
    group_name: str
    # None: the server flushes its prefix cache after the apply if no request
    # is in flight then; True: in-flight requests finish first; False: kept
    flush_cache: Optional[bool] = None
    weight_version: Optional[str] = None
    apply: bool = True  # False: wait and verify only
    timeout: Optional[float] = None  # server-side wait for the last bucket
    # Let in-flight requests finish before applying; None: only with flush_cache
    drain: Optional[bool] = None
    release_staging: bool = False
    # One "psum61:..." per bucket, in bucket order, after a prepare with
    # `defer_digests`: nothing applies unless every bucket matches.
    digests: Optional[list[str]] = None
    # The session to complete (prepare's); another open session is left alone
    session_id: Optional[str] = None

    def to_json(self) -> dict[str, Any]:
        return _drop_none(dataclasses.asdict(self))


@dataclass
class RankResult:
    rank: int  # the TP rank
    success: bool
    message: str = ""
    dp_rank: Optional[int] = None  # with data parallelism
    # Whether this rank applied the update (a complete's apply); None elsewhere
    applied: Optional[bool] = None


@dataclass
class CompleteWeightsUpdateResponse:
    success: bool
    num_buckets_received: int = 0
    message: str = ""
    applied: bool = False
    ready_to_apply: bool = False
    cache_flushed: bool = False  # the prefix cache was flushed after the apply
    weight_version: Optional[str] = None  # the served version, once applied
    session_id: Optional[str] = None  # the session completed or still open
    stats: dict[str, Any] = field(default_factory=dict)
    rank_results: list[RankResult] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, body: Any) -> "CompleteWeightsUpdateResponse":
        out = _from_json(cls, body)
        out.rank_results = [
            r if isinstance(r, RankResult) else _rank_result(r)
            for r in out.rank_results
        ]
        return out


def _rank_result(r: Any) -> RankResult:
    if not isinstance(r, dict) or "rank" not in r or "success" not in r:
        raise ProtocolError(f"rank_results: malformed entry {r!r}")
    dp_rank, applied = r.get("dp_rank"), r.get("applied")
    return RankResult(
        int(r["rank"]),
        bool(r["success"]),
        str(r.get("message", "")),
        None if dp_rank is None else int(dp_rank),
        None if applied is None else bool(applied),
    )


@dataclass
class AbortWeightsUpdateResponse:
    success: bool
    message: str = ""
    group_usable: bool = True  # False: re-initialise the group
    session_id: Optional[str] = None  # the session aborted
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, body: Any) -> "AbortWeightsUpdateResponse":
        return _from_json(cls, body)
