"""Unit tests for redacting secrets from server arguments — no server."""

import unittest
from unittest import mock

from sglang.srt.server_args import ServerArgs
from sglang.srt.utils.redaction import (
    REDACTED,
    SECRET_SERVER_ARGS,
    redact_server_args,
    redacted_value_repr,
)
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase

register_cpu_ci(est_time=1, suite="base-a-test-cpu")


class TestRedaction(CustomTestCase):
    def test_set_secrets_are_replaced_and_unset_ones_stay_none(self):
        args = {"model_path": "m", "api_key": "k1", "admin_api_key": None}
        out = redact_server_args(args)
        self.assertEqual(out["api_key"], REDACTED)
        self.assertIsNone(out["admin_api_key"])
        self.assertEqual(out["model_path"], "m")
        self.assertEqual(args["api_key"], "k1")  # the caller's dict is untouched

    def test_every_secret_field_is_covered(self):
        args = {key: f"secret-{key}" for key in SECRET_SERVER_ARGS}
        out = redact_server_args(args)
        self.assertFalse(any("secret-" in str(v) for v in out.values()))

    def test_the_server_arguments_repr_shows_no_key(self):
        # The start-up log prints it. (A release whose arguments resolve
        # themselves on construction reads the model's config there, which
        # the repr does not need.)
        with mock.patch.object(ServerArgs, "__post_init__", lambda self: None):
            args = ServerArgs(model_path="unused-model", api_key="key-one")
        text = repr(args)
        self.assertNotIn("key-one", text)
        self.assertIn(f"api_key={REDACTED}", text)
        self.assertIn("model_path='unused-model'", text)
        self.assertIn("admin_api_key=None", text)

    def test_a_value_repr_hides_only_a_secret_that_is_set(self):
        self.assertEqual(redacted_value_repr("api_key", "k1"), REDACTED)
        self.assertEqual(redacted_value_repr("api_key", None), "None")
        self.assertEqual(redacted_value_repr("model_path", "m"), "'m'")


if __name__ == "__main__":
    unittest.main()
