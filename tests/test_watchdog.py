"""Watchdog pause/resume (patch `watchdog-pause`) with the real watchdog thread."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from sglang.srt.utils.watchdog import Watchdog

TIMEOUT = 0.4
# A limit no test outlives.
QUIET_FOR_GOOD = 1e9


class FireLog(logging.Handler):
    """Collects the times at which a named watchdog reports a timeout."""

    def __init__(self, name: str):
        super().__init__(logging.ERROR)
        self.name_ = name
        self.times: list[float] = []
        self.messages: list[str] = []
        self.fired = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if msg.startswith(f"{self.name_} watchdog timeout"):
            self.times.append(time.monotonic())
            self.messages.append(msg)
            self.fired.set()


@pytest.fixture
def watchdog(request):
    name = f"T{request.node.name}"
    log = FireLog(name)
    logger = logging.getLogger("sglang.srt.utils.watchdog")
    logger.addHandler(log)
    wd = Watchdog.create(debug_name=name, watchdog_timeout=TIMEOUT, soft=True)
    yield wd, log
    logger.removeHandler(log)
    wd.pause(QUIET_FOR_GOOD)  # the daemon thread stays; keep it quiet


def starve_past_timeout() -> None:
    # Not synchronisation: the behaviour under test is what happens when the
    # watched loop makes no progress for longer than the timeout.
    time.sleep(TIMEOUT * 4)


def test_unfed_watchdog_fires(watchdog):
    wd, log = watchdog
    assert log.fired.wait(TIMEOUT * 10), "control: an unfed soft watchdog must fire"


def test_paused_past_timeout_does_not_fire(watchdog):
    wd, log = watchdog
    wd.pause(QUIET_FOR_GOOD)
    starve_past_timeout()
    assert log.times == []


def test_resumed_and_starved_fires_but_not_at_once(watchdog):
    wd, log = watchdog
    pause = wd.pause(QUIET_FOR_GOOD)
    starve_past_timeout()
    resumed = time.monotonic()
    wd.resume(pause)
    assert log.fired.wait(TIMEOUT * 10), "resumed and starved: must fire"
    assert log.times[0] - resumed >= TIMEOUT * 0.9, "fired as soon as it resumed"


def test_a_resume_ends_only_its_own_pause(watchdog):
    """Overlapping operations each end their own pause: ending the first
    (or ending one twice) leaves the other's running."""
    wd, log = watchdog
    first = wd.pause(QUIET_FOR_GOOD)
    second = wd.pause(QUIET_FOR_GOOD)
    wd.resume(first)
    wd.resume(first)
    starve_past_timeout()
    assert log.times == [], "the second pause must still hold"
    wd.resume(second)
    assert log.fired.wait(TIMEOUT * 10)


@pytest.mark.parametrize("limit", [TIMEOUT * 3, TIMEOUT / 10])
def test_a_pause_with_a_limit_fires_once_the_limit_and_the_timeout_have_passed(
    watchdog, limit
):
    """A blocking operation that never returns ends the process after all:
    paused up to `limit`, the watchdog counts its timeout after the limit
    (so an operation that ends by its limit never trips it), and its report
    says a blocking operation outlived that."""
    wd, log = watchdog
    paused = time.monotonic()
    wd.pause(limit)
    assert log.fired.wait(TIMEOUT * 30), "a pause past its limit must fire"
    assert log.times[0] - paused >= (limit + TIMEOUT) * 0.9, "fired early"
    assert f"outlived its limit of {limit}s" in log.messages[0]


@pytest.mark.parametrize("limit", [float("inf"), float("nan"), -1.0, None])
def test_a_pause_has_a_finite_limit(watchdog, limit):
    wd, log = watchdog
    with pytest.raises((ValueError, TypeError)):
        wd.pause(limit)
    assert log.fired.wait(TIMEOUT * 10), "a refused pause must not pause"


def test_noop_watchdog_has_pause_and_resume():
    wd = Watchdog.create(debug_name="noop", watchdog_timeout=None)
    wd.resume(wd.pause(1.0))
