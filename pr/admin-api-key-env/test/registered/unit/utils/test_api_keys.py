"""Unit tests for the keys a server refuses to start with — no server."""

import unittest

from sglang.srt.utils.api_keys import refuse_blank_key
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase

register_cpu_ci(est_time=1, suite="base-a-test-cpu")


class TestRefuseBlankKey(CustomTestCase):
    def test_no_key_and_real_keys_pass(self):
        for key in (None, "s3cret", "a b", "$", "${", "None-of-your-business", "-x"):
            with self.subTest(key=key):
                refuse_blank_key(key, "--api-key")

    def test_blank_placeholder_and_unexpanded_keys_are_refused(self):
        for key in (
            "",
            "   ",
            "\u200b",  # zero-width space
            "\t\n",
            "None",
            "null",
            "NIL",
            "~",
            '""',
            "''",
            "$API_KEY",
            "${ADMIN_KEY}",
        ):
            with self.subTest(key=key):
                with self.assertRaises(ValueError):
                    refuse_blank_key(key, "--admin-api-key")

    def test_the_refusal_names_the_source_and_never_the_key(self):
        with self.assertRaises(ValueError) as caught:
            refuse_blank_key("$SECRET_VARIABLE", "SGLANG_ADMIN_API_KEY")
        message = str(caught.exception)
        self.assertIn("SGLANG_ADMIN_API_KEY", message)
        self.assertNotIn("SECRET_VARIABLE", message)


if __name__ == "__main__":
    unittest.main()
