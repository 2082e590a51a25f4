"""Unit tests for the HTTP server's answer to a malformed body — no server:
the app's own handler, called with the errors FastAPI would raise."""

import asyncio
import json
import unittest

from fastapi.exceptions import RequestValidationError
from starlette.requests import Request

from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase, maybe_stub_sgl_kernel

maybe_stub_sgl_kernel()  # must precede the server, which pulls in sgl_kernel

from sglang.srt.entrypoints import http_server

register_cpu_ci(est_time=15, suite="base-a-test-cpu")


def answer(errors, path="/destroy_weights_update_group"):
    handler = http_server.app.exception_handlers[RequestValidationError]
    request = Request({"type": "http", "path": path, "headers": [], "root_path": ""})
    response = asyncio.run(handler(request, RequestValidationError(errors)))
    return response.status_code, json.loads(response.body)["message"], response.body


def wrong_type(value):
    return {
        "type": "string_type",
        "loc": ("body", "group_name"),
        "msg": "Input should be a valid string",
        "input": value,
    }


class TestValidationErrors(CustomTestCase):
    def test_a_malformed_field_is_a_400_naming_it_and_its_value(self):
        status, message, _ = answer([wrong_type(5)])
        self.assertEqual(status, 400)
        self.assertTrue(message.startswith("1 validation error:"), message)
        self.assertIn("'group_name'", message)
        self.assertIn("'input': 5", message)
        for leak in ('File "', "http_server", ".py"):
            self.assertNotIn(leak, message)

    def test_a_long_value_is_shown_cut_short_not_echoed_back(self):
        status, message, body = answer([wrong_type(list(range(300_000)))])
        self.assertEqual(status, 400)
        # The message alone (not the value) if this fails: it may be huge.
        self.assertLess(len(body), 5_000, message[:500])
        self.assertIn("'group_name'", message)
        self.assertIn("[0, 1, 2, 3", message)
        self.assertIn("more characters)", message)


if __name__ == "__main__":
    unittest.main()
