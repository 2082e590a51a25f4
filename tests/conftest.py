"""Fixtures: the real SGLang server (patched wheel or pristine sdist) on the CPU."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

from harness import cpu_sglang
from harness.tiny_model import make_tiny_model

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "build"
LOGS = BUILD / "logs"
_counter = itertools.count()


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    return make_tiny_model(BUILD / "models", "test")


@pytest.fixture(scope="session")
def upstream_tree() -> Path:
    """build/upstream (pristine sdist as python/), fetched once."""
    from devtools.series import Layout, ensure_upstream

    return ensure_upstream(Layout(ROOT))


def _start(request, tiny_model, tp, pristine, extra_args, env=None, name=None, **kw):
    tag = name or re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name)
    flavour = "pristine" if pristine else "patched"
    log = LOGS / f"{tag}-{flavour}-tp{tp}-{next(_counter)}.log"
    return cpu_sglang.launch(
        tiny_model, log, tp=tp, pristine=pristine, extra_args=extra_args,
        env_overrides=env, **kw,
    )  # fmt: skip


@pytest.fixture
def start_server(request, tiny_model, upstream_tree):
    """Factory: start_server(tp=1, pristine=False, extra_args=[...]); all
    servers it started are stopped (whole process group) at teardown."""
    started: list[cpu_sglang.Server] = []

    def start(tp: int = 1, pristine: bool = False, extra_args=None, env=None, **kw):
        server = _start(request, tiny_model, tp, pristine, extra_args, env, **kw)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


# A short soft watchdog on the shared servers: any false stall shows in the log.
SESSION_ARGS = [
    "--soft-watchdog-timeout",
    "2",
    "--weight-update-staging-budget-mb",
    "64",
]


def _session_server(request, tiny_model, tp):
    server = _start(
        request, tiny_model, tp, False, SESSION_ARGS, name=f"session-tp{tp}"
    )
    request.addfinalizer(server.stop)
    return server


@pytest.fixture(scope="session")
def server_tp1(request, tiny_model):
    """A patched TP 1 server shared by tests that leave its weights as found."""
    return _session_server(request, tiny_model, 1)


@pytest.fixture(scope="session")
def server_tp2(request, tiny_model):
    return _session_server(request, tiny_model, 2)


@pytest.fixture(scope="session", autouse=True)
def no_process_left_behind():
    """Every server (scheduler, detokenizer, TP ranks) is gone after the run."""
    import psutil

    yield
    left = [
        p for p in psutil.Process().children(recursive=True)
        if p.is_running() and p.status() != psutil.STATUS_ZOMBIE
        and "sglang" in " ".join(p.cmdline())
    ]  # fmt: skip
    for p in left:
        p.kill()
    assert not left, f"processes left behind: {[p.cmdline() for p in left]}"


@pytest.fixture(scope="session")
def model_weights(tiny_model):
    """The served model's tensors, in checkpoint (HF) names and order."""
    from safetensors.torch import load_file

    return list(load_file(str(tiny_model / "model.safetensors")).items())
