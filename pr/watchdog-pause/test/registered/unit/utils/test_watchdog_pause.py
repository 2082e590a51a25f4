"""Unit tests for pausing a watchdog while a blocking weight operation runs
— no server; the real watchdog thread, in soft mode, with a short timeout."""

import logging
import threading
import time
import unittest
from unittest import mock

from sglang.srt.utils import watchdog as watchdog_module
from sglang.srt.utils.watchdog import WatchdogRaw
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase

register_cpu_ci(est_time=25, suite="base-a-test-cpu")

TIMEOUT = 0.2
# How long a watchdog that must not fire is watched: many timeouts.
QUIET_S = 10 * TIMEOUT
# How long a watchdog that must fire may take, however loaded the machine.
FIRES_WITHIN_S = 30.0


class Firings(logging.Handler):
    """When the watchdog named `name` reports a timeout (soft mode logs it)."""

    def __init__(self, name):
        super().__init__()
        self.name = name
        self.times = []
        self.messages = []
        self.fired = threading.Event()

    def emit(self, record):
        if record.getMessage().startswith(f"{self.name} watchdog timeout"):
            self.times.append(time.perf_counter())
            self.messages.append(record.getMessage())
            self.fired.set()


class TestWatchdogPause(CustomTestCase):
    def setUp(self):
        name = self.id()
        self.firings = Firings(name)
        logger = logging.getLogger(watchdog_module.__name__)
        logger.addHandler(self.firings)
        self.addCleanup(logger.removeHandler, self.firings)
        # Soft mode dumps the schedulers' stacks with py-spy: not here.
        patcher = mock.patch.object(watchdog_module, "pyspy_dump_schedulers")
        patcher.start()
        self.addCleanup(patcher.stop)
        # A starved loop: the counter never moves. It counts only once a test
        # has paused it as it needs (a slow start must not fire it first).
        # The thread outlives the test (soft mode watches again after a
        # timeout): inactive again, it stops.
        self.active = False
        self.addCleanup(setattr, self, "active", False)
        self.watchdog = WatchdogRaw(
            debug_name=name,
            get_counter=lambda: 0,
            is_active=lambda: self.active,
            watchdog_timeout=TIMEOUT,
            soft=True,
        )

    def assertQuiet(self):
        self.assertFalse(self.firings.fired.wait(QUIET_S), "the watchdog fired")

    def assertFires(self):
        self.assertTrue(self.firings.fired.wait(FIRES_WITHIN_S), "it never fired")

    def test_a_paused_watchdog_does_not_fire_and_a_resumed_one_does(self):
        pause = self.watchdog.pause(QUIET_S * 10)
        self.active = True
        self.assertTrue(self.watchdog.paused)
        self.assertQuiet()
        resumed = time.perf_counter()
        self.watchdog.resume(pause)
        self.assertFalse(self.watchdog.paused)
        self.assertFires()
        # The timeout restarts at the resume: it does not fire at once for
        # the time spent paused.
        self.assertGreaterEqual(self.firings.times[0] - resumed, TIMEOUT)

    def test_pauses_overlap_and_each_resume_ends_its_own(self):
        first = self.watchdog.pause(QUIET_S * 10)
        second = self.watchdog.pause(QUIET_S * 10)
        self.active = True
        # Ending the first (not the latest) pause leaves the second running.
        self.watchdog.resume(first)
        self.assertTrue(self.watchdog.paused)
        self.assertQuiet()
        self.watchdog.resume(second)
        self.assertFires()

    def test_a_stray_or_repeated_resume_ends_no_other_pause(self):
        stale = self.watchdog.pause(QUIET_S * 10)
        self.watchdog.resume(stale)
        live = self.watchdog.pause(QUIET_S * 10)
        self.active = True
        self.watchdog.resume(stale)
        self.assertTrue(self.watchdog.paused)
        self.assertQuiet()
        self.watchdog.resume(live)
        self.assertFalse(self.watchdog.paused)

    def test_a_later_pause_does_not_extend_an_earlier_ones_limit(self):
        # The first pause's limit counts from its own start: a short pause
        # begun later neither restarts nor stretches it.
        paused = time.perf_counter()
        self.watchdog.pause(3 * TIMEOUT)
        self.watchdog.resume(self.watchdog.pause(TIMEOUT / 10))
        self.active = True
        self.assertFires()
        self.assertGreaterEqual(self.firings.times[0] - paused, 3 * TIMEOUT + TIMEOUT)

    def test_a_pause_needs_a_finite_limit(self):
        for limit in (float("inf"), float("nan"), -1.0):
            with self.subTest(limit=limit):
                with self.assertRaises(ValueError):
                    self.watchdog.pause(limit)
        with self.assertRaises(TypeError):
            self.watchdog.pause()
        self.assertFalse(self.watchdog.paused)

    def assertFiresAfterPausing(self, limit):
        paused = time.perf_counter()
        self.watchdog.pause(limit)
        self.active = True
        # A blocking operation that never returns ends the process after all
        # (hard mode), and the report says why.
        self.assertFires()
        # The timeout counts after the limit: an operation that ends by its
        # limit never trips the watchdog.
        self.assertGreaterEqual(self.firings.times[0] - paused, limit + TIMEOUT)
        self.assertIn(
            f"paused by a blocking operation that outlived its limit of {limit}s",
            self.firings.messages[0],
        )

    def test_a_pause_with_a_limit_fires_a_timeout_after_the_limit(self):
        self.assertFiresAfterPausing(3 * TIMEOUT)

    def test_a_limit_shorter_than_the_timeout_still_adds_to_it(self):
        self.assertFiresAfterPausing(TIMEOUT / 10)

    def test_a_watchdog_never_paused_still_fires(self):
        self.active = True
        self.assertFires()


if __name__ == "__main__":
    unittest.main()
