"""Fixtures: the real SGLang server (patched wheel or pristine sdist) on the CPU."""

from __future__ import annotations

import functools
import inspect
import itertools
import json
import os
import re
import warnings
from pathlib import Path

import pytest

from harness import cpu_sglang
from harness.tiny_model import make_tiny_model
from rlsync import client

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "build"
LOGS = BUILD / "logs"
_counter = itertools.count()
# The pin under test: the SGLang release this interpreter's environment has.
ACTIVE_PIN = cpu_sglang.sglang_version()


def active_pin():
    """The pin under test; in a release's smoke (`make smoke RELEASE=...`),
    that release as its series' pin (what its /rlsync_info reports)."""
    from devtools import series

    release = os.environ.get("RLSYNC_SMOKE_RELEASE", "")
    return series.Layout(ROOT, ACTIVE_PIN, release).pin()


# --- markers: `make test-fast` runs the tests with neither `server` nor `build`

# Fixtures that start a real SGLang server; a test that uses one, directly or
# through another fixture, is marked `server`.
SERVER_FIXTURES = {
    "server_tp1",
    "server_tp2",
    "server_tp1_replica",
    "server_pristine",
    "keyed_server",
    "start_server",
}
# Code that starts a server itself: a fixture, a test, or a helper of a test
# module whose source matches makes those tests `server` tests.
STARTS_A_SERVER = re.compile(
    r"\blaunch\(|cpu_sglang\.launch\b|\b_start\(|sglang\.launch_server"
    r"|sglang\.Engine\b|harness\.(demo|soak|engine_two_phase|serve_cpu)\b"
)


# A test whose source matches builds the wheels (`make wheel`, in this tree) or
# a fresh virtual environment: marked `build`, as slow as a server test.
BUILDS = re.compile(r'"wheel"|\bfresh_venv\(|"-m", "venv"')


def _source_matches(pattern: re.Pattern, obj) -> bool:
    try:
        return bool(pattern.search(inspect.getsource(obj)))
    except (OSError, TypeError):
        return False


def _starts_a_server(obj) -> bool:
    return _source_matches(STARTS_A_SERVER, obj)


@functools.cache
def _module_helpers_start_servers(module) -> bool:
    """A module whose plain functions (neither tests nor fixtures) start a
    server: every test in it may, through them."""
    return any(
        _starts_a_server(obj)
        for name, obj in vars(module).items()
        if inspect.isfunction(obj)
        and obj.__module__ == module.__name__
        and not name.startswith("test")
    )


def _needs_a_server(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    for name in item.fixturenames:
        if name in SERVER_FIXTURES:
            return True
        for fixturedef in info.name2fixturedefs.get(name, ()) if info else ():
            if fixturedef.baseid != "" and _starts_a_server(fixturedef.func):
                return True
    function = getattr(item, "function", None)
    module = getattr(item, "module", None)
    return (function is not None and _starts_a_server(function)) or (
        module is not None and _module_helpers_start_servers(module)
    )


@functools.cache
def active_features() -> frozenset[str]:
    """The features of the pin under test's series (its patches' `Feature:`
    lines), the ones its servers report at /rlsync_info."""
    from devtools import series

    layout = series.Layout(ROOT, ACTIVE_PIN)
    return frozenset(series.series_features(layout.patches()))


def _missing_features(item: pytest.Item) -> list[str]:
    needed = [f for mark in item.iter_markers("needs") for f in mark.args]
    return [f for f in needed if f not in active_features()]


@functools.cache
def pin_test_gaps() -> tuple[tuple[str, str], ...]:
    """(node-id prefix, reason) of the server tests the pin under test does
    not pass yet (pins/<version>/test-gaps): an unfinished port says so."""
    path = ROOT / "pins" / ACTIVE_PIN / "test-gaps"
    gaps = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        prefix, _, reason = line.partition("#")
        if prefix.strip():
            gaps.append((prefix.strip(), reason.strip()))
    return tuple(gaps)


def _known_gap(item: pytest.Item) -> str | None:
    if os.environ.get("RLSYNC_RUN_TEST_GAPS") == "1":  # triage: run them anyway
        return None
    for prefix, reason in pin_test_gaps():
        if item.nodeid.startswith(prefix):
            return f"pins/{ACTIVE_PIN}/test-gaps: {reason}"
    return None


def pytest_collection_modifyitems(config, items):
    for item in items:
        if _needs_a_server(item):
            item.add_marker(pytest.mark.server)
            gap = _known_gap(item)
            if gap:
                item.add_marker(pytest.mark.skip(reason=gap))
                continue
            missing = _missing_features(item)
            if missing:
                item.add_marker(
                    pytest.mark.skip(
                        reason=f"the {ACTIVE_PIN} series has no "
                        f"{', '.join(missing)} (docs/support-matrix.md)"
                    )
                )
        function = getattr(item, "function", None)
        if function is not None and _source_matches(BUILDS, function):
            item.add_marker(pytest.mark.build)


# --- fixtures ----------------------------------------------------------------


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    return make_tiny_model(BUILD / "models", "test")


@pytest.fixture(scope="session")
def upstream_tree() -> Path:
    """build/<pin>/upstream (the pin's pristine archive as python/), fetched
    once."""
    from devtools.series import Layout, ensure_upstream

    return ensure_upstream(Layout(ROOT, ACTIVE_PIN))


def _start(request, tiny_model, tp, pristine, extra_args, env=None, name=None, **kw):
    tag = name or re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name)
    flavour = "pristine" if pristine else "patched"
    log = LOGS / f"{tag}-{flavour}-tp{tp}-{next(_counter)}.log"
    return cpu_sglang.launch(
        tiny_model,
        log,
        tp=tp,
        pristine=pristine,
        extra_args=extra_args,
        env_overrides=env,
        **kw,
    )


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


@pytest.fixture(scope="module")
def start_module_server(request, tiny_model):
    """Factory like start_server, for a server that the tests of one module
    share (one start instead of one per test); stopped after the module."""
    started: list[cpu_sglang.Server] = []

    def start(tp: int = 1, extra_args=None, env=None, **kw):
        name = request.module.__name__.rsplit(".", 1)[-1] + f"-{len(started)}"
        server = _start(request, tiny_model, tp, False, extra_args, env, name, **kw)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


# A short soft watchdog on the shared servers: any false stall shows in the log.
# Metrics on: test_sync_metrics reads them, and every other test runs with them.
SESSION_ARGS = [
    "--enable-metrics",
    "--soft-watchdog-timeout",
    "2",
    "--weight-update-staging-budget-mb",
    "64",
]


def _session_server(request, tiny_model, tp, name=None):
    server = _start(
        request, tiny_model, tp, False, SESSION_ARGS, name=name or f"session-tp{tp}"
    )
    request.addfinalizer(server.stop)
    # What shared_server_guard compares against after each test.
    _BASELINE[server.url] = _checksum(server)
    return server


@pytest.fixture(scope="session")
def server_tp1(request, tiny_model):
    """A patched TP 1 server shared by tests that leave its weights as found."""
    return _session_server(request, tiny_model, 1)


@pytest.fixture(scope="session")
def server_tp2(request, tiny_model):
    return _session_server(request, tiny_model, 2)


@pytest.fixture(scope="session")
def server_tp1_replica(request, tiny_model):
    """A second shared TP 1 server: the other replica where a test needs two."""
    return _session_server(request, tiny_model, 1, "session-tp1-replica")


@pytest.fixture(scope="session")
def server_pristine(request, tiny_model):
    """Pristine upstream at TP 1 (no series), shared by the tests that show
    what upstream does without it: they change no weights."""
    args = ["--soft-watchdog-timeout", "2"]  # upstream's flag, as on the others
    server = _start(request, tiny_model, 1, True, args, name="session-pristine")
    request.addfinalizer(server.stop)
    return server


# Keys of keyed_server: its admin key and its ordinary --api-key, and the
# admin key in its environment, which the flag overrides.
KEYED_ADMIN_KEY, KEYED_API_KEY = "admin-k3y", "api-k3y"
KEYED_ENV_ADMIN_KEY = "env-admin-k3y-overridden"


@pytest.fixture(scope="session")
def keyed_server(request, tiny_model):
    """A patched TP 1 server with an admin key and an ordinary API key (and
    another admin key in SGLANG_ADMIN_API_KEY, which the flag overrides),
    logging requests with the Authorization header asked for, shared by the
    modules that need keys set (one start instead of one per module)."""
    # One key abbreviated (argparse takes an unambiguous prefix), one after
    # `=`: neither form may reach an answer or a log line.
    keys = ["--admin-api", KEYED_ADMIN_KEY, f"--api-key={KEYED_API_KEY}"]
    # Request logs asked to carry the Authorization header: it never appears.
    keys += ["--log-requests", "--weight-update-max-tensor-request-mb", "1"]
    env = {
        "SGLANG_ADMIN_API_KEY": KEYED_ENV_ADMIN_KEY,
        "SGLANG_LOG_REQUEST_HEADERS": "authorization,x-rlsync-trace",
        # /server_info then shows the environment (from 0.5.19): no key in it
        "SGLANG_EXPOSE_OWN_ENV_VARS": "1",
    }
    server = _start(request, tiny_model, 1, False, keys, env, name="session-keyed")
    request.addfinalizer(server.stop)
    return server


SHARED_SERVERS = ("server_tp1", "server_tp2", "server_tp1_replica")
# The checksum each shared server had when it started, by URL.
_BASELINE: dict[str, str] = {}
# An update group no test uses: an abort for it names the open session's group.
_PROBE_GROUP = "shared-server-guard-probe"


def _checksum(server: cpu_sglang.Server) -> str:
    return client.weights_checksum(server.url, timeout=60)["checksum"]


def _abort_open_session(server: cpu_sglang.Server) -> str | None:
    """Abort the weight update session left open on `server`, if any; the
    name of its group, or None when none was open. The shared servers have no
    admin key: none is sent."""
    try:
        client.abort_weights_update(server.url, group_name=_PROBE_GROUP, timeout=60)
    except client.EngineError as e:
        if e.status == 409:  # no weight update session is open
            return None
        group = e.body.get("open_session_group") if isinstance(e.body, dict) else None
        if e.status != 400 or group is None:
            raise
        client.abort_weights_update(server.url, group_name=group, timeout=60)
        return group
    raise AssertionError(f"an abort for {_PROBE_GROUP!r} succeeded on {server.url}")


def _repair(server: cpu_sglang.Server, tiny_model: Path) -> list[str]:
    """Put a shared server back as the suite expects it; what was wrong."""
    if not server.alive():
        return [f"{server.url} is no longer running (log: {server.log_path})"]
    problems = []
    group = _abort_open_session(server)
    if group is not None:
        problems.append(f"a weight update session for group {group!r} was open")
    if _checksum(server) != _BASELINE[server.url]:
        problems.append("its weights were not the checkpoint's")
        client.update_weights_from_disk(server.url, str(tiny_model), timeout=120)
        if _checksum(server) != _BASELINE[server.url]:
            problems.append("reloading the checkpoint did not restore its checksum")
    return [f"{server.url}: {p}" for p in problems]


# What each test of the last run took (setup, call and teardown), slowest
# first, for trimming the suite: build/durations/<pin>.json.
_DURATIONS: dict[str, float] = {}


def pytest_runtest_logreport(report):
    _DURATIONS[report.nodeid] = _DURATIONS.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session):
    if _DURATIONS:
        out = BUILD / "durations" / f"{ACTIVE_PIN}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        slowest = sorted(_DURATIONS.items(), key=lambda item: -item[1])
        out.write_text(json.dumps({k: round(v, 2) for k, v in slowest}, indent=1))


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    """Each phase's report on the item, for shared_server_guard."""
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


@pytest.fixture(autouse=True)
def shared_server_guard(request):
    """After a test that used a shared server: abort any weight update session
    it left open and reload the checkpoint if the served weights changed, so
    one failing test does not fail the tests after it. A test that passed but
    left such a mess errors in its teardown, naming what was repaired."""
    yield
    used = [name for name in SHARED_SERVERS if name in request.fixturenames]
    problems = []
    for name in used:
        server = request.getfixturevalue(name)
        problems += _repair(server, request.getfixturevalue("tiny_model"))
    call = getattr(request.node, "rep_call", None)
    if problems and call is not None and call.passed:
        pytest.fail(
            "the test left a shared server changed (repaired for the next "
            "tests): " + "; ".join(problems),
            pytrace=False,
        )
    if problems:  # the test's own failure is the report; say what was repaired
        warnings.warn(f"shared_server_guard repaired: {'; '.join(problems)}")


@pytest.fixture(scope="session", autouse=True)
def no_process_left_behind():
    """Every server (scheduler, detokenizer, TP ranks) is gone after the run."""
    import psutil

    yield
    left = [
        p
        for p in psutil.Process().children(recursive=True)
        if p.is_running()
        and p.status() != psutil.STATUS_ZOMBIE
        and "sglang" in " ".join(p.cmdline())
    ]
    for p in left:
        p.kill()
    assert not left, f"processes left behind: {[p.cmdline() for p in left]}"


@pytest.fixture(scope="session")
def model_weights(tiny_model):
    """The served model's tensors, in checkpoint (HF) names and order."""
    from safetensors.torch import load_file

    return list(load_file(str(tiny_model / "model.safetensors")).items())
