"""Unit tests for the bucket headers of a framed two-phase weight update —
no server, no process group."""

import unittest

from sglang.srt.weight_sync.bucket_header import (
    ABORT,
    DATA,
    make_header,
    read_header,
    session_tag,
)
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase

register_cpu_ci(est_time=1, suite="base-a-test-cpu")


class TestBucketHeader(CustomTestCase):
    def test_a_data_header_for_the_expected_bucket_reads_clean(self):
        header = make_header("s1", 3, DATA, "cpu")
        self.assertEqual(read_header(header, "s1", 3), (False, None))

    def test_an_abort_header_says_the_sender_aborted(self):
        header = make_header("s1", 0, ABORT, "cpu")
        self.assertEqual(read_header(header, "s1", 5), (True, None))

    def test_another_session_or_bucket_is_named(self):
        aborted, problem = read_header(make_header("s2", 0, DATA, "cpu"), "s1", 0)
        self.assertFalse(aborted)
        self.assertIn("another session", problem)
        aborted, problem = read_header(make_header("s1", 4, DATA, "cpu"), "s1", 3)
        self.assertFalse(aborted)
        self.assertIn("out of step", problem)

    def test_bucket_bytes_in_place_of_a_header_are_named(self):
        header = make_header("s1", 0, DATA, "cpu")
        header.fill_(7)
        aborted, problem = read_header(header, "s1", 0)
        self.assertFalse(aborted)
        self.assertIn("no bucket header", problem)

    def test_session_tags_are_stable_non_negative_int64(self):
        self.assertEqual(session_tag("abc"), session_tag("abc"))
        self.assertNotEqual(session_tag("abc"), session_tag("abd"))
        self.assertTrue(0 <= session_tag("abc") < 2**63)


if __name__ == "__main__":
    unittest.main()
