"""`rlsync doctor`: before a sync fails, what the trainer and each engine
run, and whether they can update weights together.

The trainer's side is this process's torch (its CUDA and NCCL); each
engine's is what it reports in `/rlsync_info` and `/server_info` (its
torch, CUDA and NCCL: in the latter's "rlsync" block). Per engine
three checks: the two-phase update (what `WeightSender.connect()` requires),
NCCL (the same major version on both sides; gloo has no such constraint)
and the keys (what the engine expects against what was given). A check that
fails makes the command exit 1; one that cannot be made (the engine does
not report its NCCL version) is shown as such and fails nothing.
"""

from __future__ import annotations

import concurrent.futures as cf
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from rlsync import SERIES, client
from rlsync.sender import REQUIRED_FEATURES

BACKENDS = ("nccl", "gloo")
NCCL_CHECK_BY_HAND = (
    "compare by hand: python -c 'import torch; print(torch.cuda.nccl.version())' "
    "in the engine's environment (README: NCCL version mismatch)"
)

NcclVersion = tuple[int, ...]


@dataclass(frozen=True)
class TrainerSide:
    torch_version: str
    cuda_version: Optional[str]  # None: torch sees no CUDA GPU
    nccl_version: Optional[NcclVersion]


@dataclass(frozen=True)
class EngineSide:
    """What an engine answered; `*_error` says why an answer is missing."""

    url: str
    rlsync_info: Optional[dict[str, Any]]
    rlsync_error: Optional[client.EngineError]
    server_info: Optional[dict[str, Any]]
    server_error: Optional[client.EngineError]

    @property
    def reachable(self) -> bool:
        return not all(
            e is not None and e.status is None
            for e in (self.rlsync_error, self.server_error)
        )

    def reported(self, key: str) -> Any:
        """`key` of /rlsync_info, else of /server_info's "rlsync" block (where
        series 7 on report the engine's torch, CUDA and NCCL: it needs the
        API key, the open route leaves them out); None where neither has
        it."""
        rlsync_block = (self.server_info or {}).get("rlsync")
        for info in (self.rlsync_info, rlsync_block):
            if isinstance(info, dict) and info.get(key) is not None:
                return info[key]
        return None


@dataclass(frozen=True)
class Check:
    name: str
    passed: Optional[bool]  # None: could not be checked
    detail: str

    @property
    def mark(self) -> str:
        return {True: "ok", False: "FAIL", None: "?"}[self.passed]


def trainer_side() -> TrainerSide:
    import torch

    if not torch.cuda.is_available():
        return TrainerSide(torch.__version__, None, None)
    try:
        nccl = nccl_version(torch.cuda.nccl.version())
    except Exception:  # torch built without NCCL
        nccl = None
    return TrainerSide(torch.__version__, torch.version.cuda, nccl)


def nccl_version(value: Any) -> Optional[NcclVersion]:
    """(major, minor, patch) from torch's tuple, NCCL's version code (2.9 on:
    major*10000 + minor*100 + patch; before: major*1000 + minor*100 +
    patch) or a "2.27.5" string; None from anything else."""
    if isinstance(value, (tuple, list)) and 0 < len(value) <= 4:
        if all(_small_int(v) for v in value):
            return tuple(value)
        return None
    if _small_int(value) and value > 0:
        if value >= 10000:
            return (value // 10000, value // 100 % 100, value % 100)
        return (value // 1000, value // 100 % 10, value % 100)
    if isinstance(value, str) and len(value) <= 32:
        parts = value.split("+")[0].split(".")
        if all(p.isascii() and p.isdigit() for p in parts):
            return tuple(int(p) for p in parts)
    return None


def _small_int(value: Any) -> bool:
    """An int a version is made of (an engine's answer may hold anything)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 10**9


def reported_features(engine: "EngineSide") -> Optional[list[str]]:
    """The features /rlsync_info lists; None where it lists something else."""
    features = (engine.rlsync_info or {}).get("features")
    if isinstance(features, list) and all(isinstance(f, str) for f in features):
        return features
    return None


def default_backend(trainer: TrainerSide) -> str:
    """What this trainer can use: NCCL with a GPU, gloo without."""
    return "nccl" if trainer.cuda_version is not None else "gloo"


def engine_side(url: str, *, api_key: Optional[str], timeout: float) -> EngineSide:
    rlsync_info = rlsync_error = server_info = server_error = None
    try:
        rlsync_info = client.rlsync_info(url, timeout=timeout, api_key=api_key)
    except client.EngineError as e:
        rlsync_error = e
    try:
        server_info = client.server_info(url, timeout=timeout, api_key=api_key)
    except client.EngineError as e:
        server_error = e
    return EngineSide(url, rlsync_info, rlsync_error, server_info, server_error)


def trainer_check(trainer: TrainerSide, backend: str) -> Check:
    name = f"backend={backend!r}"
    if backend == "gloo":
        return Check(name, True, "no GPU needed, no NCCL version to match")
    if trainer.cuda_version is None:
        return Check(
            name,
            False,
            "NCCL needs a CUDA GPU on the trainer and torch sees none: use "
            "backend='gloo' (--backend gloo here)",
        )
    if trainer.nccl_version is None:
        return Check(name, False, "this torch has no NCCL: use backend='gloo'")
    return Check(name, True, "the trainer has a GPU and NCCL")


def two_phase_check(engine: EngineSide) -> Check:
    """What WeightSender.connect() requires of every engine."""
    name = "two-phase update"
    if engine.rlsync_info is None:
        return Check(name, False, str(engine.rlsync_error))
    features = reported_features(engine)
    if features is None:
        return Check(
            name, False, "its /rlsync_info lists no features as a list of names"
        )
    missing = [f for f in REQUIRED_FEATURES if f not in features]
    if missing:
        return Check(
            name,
            False,
            f"the engine's series ({engine.rlsync_info.get('version')}) has no "
            f"{', '.join(missing)}: install the forked wheel of a current series",
        )
    return Check(name, True, ", ".join(REQUIRED_FEATURES))


def nccl_check(trainer: TrainerSide, engine: EngineSide, backend: str) -> Check:
    if backend == "gloo":
        return Check("NCCL", True, "backend='gloo': no NCCL version to match")
    if trainer.nccl_version is None:
        return Check("NCCL", None, "nothing to compare: the trainer cannot use NCCL")
    theirs = nccl_version(engine.reported("nccl_version"))
    if theirs is None:
        return Check(
            "NCCL", None, f"the engine does not report its NCCL; {NCCL_CHECK_BY_HAND}"
        )
    ours = trainer.nccl_version
    both = f"trainer {_dotted(ours)}, engine {_dotted(theirs)}"
    if ours[0] != theirs[0]:
        return Check("NCCL", False, f"major versions differ: {both}")
    return Check("NCCL", True, both)


def keys_check(
    engine: EngineSide, admin_key: Optional[str], api_key: Optional[str]
) -> Check:
    """The keys given against those the engine has (`/server_info` says
    whether each is set, never what it is). A key given is not proven right:
    only an admin call could tell, and the doctor makes none."""
    if engine.server_info is None:
        error = engine.server_error
        passed = False if error is not None and error.status == 401 else None
        return Check("keys", passed, str(error))
    if "admin_api_key" not in engine.server_info:
        return Check(
            "keys", None, "/server_info does not say which keys it takes (a router?)"
        )
    has_admin_key = bool(engine.server_info.get("admin_api_key"))
    has_api_key = bool(engine.server_info.get("api_key"))
    if has_admin_key and not admin_key:
        return Check(
            "keys",
            False,
            "the engine has an admin key (its --admin-api-key or "
            "$SGLANG_ADMIN_API_KEY) and none was given: weight updates would "
            "get 401; give --admin-key or set $SGLANG_ADMIN_API_KEY "
            "(Engine(url, tp_size, admin_key=...))",
        )
    if not has_admin_key and has_api_key and admin_key and admin_key != api_key:
        return Check(
            "keys",
            False,
            "the engine has no admin key, so its admin routes take its --api-key, "
            "but the admin key given is what rlsync sends there: leave the admin "
            "key out (Engine(url, tp_size, api_key=...))",
        )
    expects = (
        "its admin key on admin routes"
        if has_admin_key
        else ("its --api-key on every route" if has_api_key else "no key")
    )
    if has_admin_key and has_api_key:
        expects += ", its --api-key on the others"
    return Check(
        "keys",
        True,
        f"the engine expects {expects}; given: {_given(admin_key, api_key)}",
    )


def engine_checks(
    trainer: TrainerSide,
    engine: EngineSide,
    backend: str,
    admin_key: Optional[str],
    api_key: Optional[str],
) -> list[Check]:
    if not engine.reachable:
        return [Check("reachable", False, str(engine.rlsync_error))]
    return [
        two_phase_check(engine),
        nccl_check(trainer, engine, backend),
        keys_check(engine, admin_key, api_key),
    ]


def describe_trainer(trainer: TrainerSide) -> str:
    if trainer.cuda_version is None:
        return f"trainer: torch {trainer.torch_version}; no CUDA: use backend='gloo'"
    nccl = "no NCCL" if trainer.nccl_version is None else _dotted(trainer.nccl_version)
    return (
        f"trainer: torch {trainer.torch_version}; CUDA {trainer.cuda_version}; "
        f"NCCL {nccl}"
    )


def describe_engine(engine: EngineSide) -> list[str]:
    """What the engine says it runs; nothing where it did not answer."""
    if not engine.reachable:
        return []
    info = engine.rlsync_info or {}
    sglang = (engine.server_info or {}).get("version")
    series = (
        f"rlsync series {info.get('series')} ({info.get('version')})"
        if info.get("series") is not None
        else "no rlsync series"
    )
    lines = [f"  SGLang {sglang or '?'}; {series}; this rlsync: series {SERIES}"]
    if reported_features(engine):
        lines.append(f"  features: {', '.join(reported_features(engine))}")
    torch_version = engine.reported("torch_version")
    nccl = nccl_version(engine.reported("nccl_version"))
    lines.append(
        f"  torch {torch_version or 'not reported'}; "
        f"NCCL {_dotted(nccl) if nccl else 'not reported'}"
    )
    return lines


def doctor(
    urls: Sequence[str],
    *,
    backend: Optional[str] = None,
    admin_key: Optional[str] = None,
    api_key: Optional[str] = None,
    timeout: float = 10.0,
    out: Callable[[str], None] = print,
) -> int:
    """Print what the trainer and each engine run and every check; 1 when a
    check failed, else 0. `backend`: the one the trainer will use (default:
    nccl where torch sees a GPU, else gloo)."""
    trainer = trainer_side()
    backend = backend or default_backend(trainer)
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    with cf.ThreadPoolExecutor(max_workers=min(8, len(urls)) or 1) as pool:
        engines = list(
            pool.map(lambda u: engine_side(u, api_key=api_key, timeout=timeout), urls)
        )
    backend_check = trainer_check(trainer, backend)
    out(describe_trainer(trainer))
    out(_line(backend_check))
    failed = backend_check.passed is False
    for engine in engines:
        out(engine.url)
        for line in describe_engine(engine):
            out(line)
        checks = engine_checks(trainer, engine, backend, admin_key, api_key)
        for check in checks:
            out(_line(check))
        out(f"  => {verdict([backend_check, *checks])}")
        failed |= any(c.passed is False for c in checks)
    return 1 if failed else 0


def verdict(checks: Sequence[Check]) -> str:
    failing = [c.name for c in checks if c.passed is False]
    if failing:
        return f"cannot sync: {', '.join(failing)}"
    unchecked = [c.name for c in checks if c.passed is None]
    return f"can sync (unchecked: {', '.join(unchecked)})" if unchecked else "can sync"


def _line(check: Check) -> str:
    return f"  {check.mark:<4}  {check.name}: {check.detail}"


def _dotted(version: NcclVersion) -> str:
    return ".".join(str(v) for v in version)


def _given(admin_key: Optional[str], api_key: Optional[str]) -> str:
    given = [n for n, k in (("admin key", admin_key), ("API key", api_key)) if k]
    return " and ".join(given) or "none"
