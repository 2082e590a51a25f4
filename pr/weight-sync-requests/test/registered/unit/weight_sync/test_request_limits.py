"""Unit tests for the body limits of the weight-update routes — no server;
the middleware is driven as an ASGI app."""

import asyncio
import json
import types
import unittest

from sglang.srt.weight_sync.request_limits import (
    TENSOR_BODY_ROUTES,
    WEIGHT_UPDATE_ROUTES,
    WeightUpdateBodyLimit,
    WorkerWeightUpdateBodyLimit,
)
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase

register_cpu_ci(est_time=2, suite="base-a-test-cpu")

LIMIT = 1000
TENSOR_LIMIT = 3000


class Route:
    """The route behind the middleware: reads its whole body, then once more
    (as a route that watches for the client going away), and answers 200."""

    def __init__(self):
        self.received = None

    async def __call__(self, scope, receive, send):
        self.receive = receive
        self.received = []
        while True:
            self.received.append(await receive())
            if not self.received[-1].get("more_body"):
                break
        self.received.append(await receive())
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    @property
    def body(self):
        return b"".join(m.get("body", b"") for m in self.received[:-1])


def post(
    path,
    chunks,
    headers=(),
    tensor_limit=TENSOR_LIMIT,
    scope_type="http",
    middleware_of=None,
    root_path="",
):
    """One request through the middleware (`middleware_of(route)`, by default
    WeightUpdateBodyLimit's), its body sent in `chunks`."""
    route = Route()
    if middleware_of is None:
        middleware = WeightUpdateBodyLimit(route, LIMIT, tensor_limit)
    else:
        middleware = middleware_of(route)
    incoming = [
        {"type": "http.request", "body": chunk, "more_body": i < len(chunks) - 1}
        for i, chunk in enumerate(chunks)
    ]
    client = types.SimpleNamespace(reads=0, sent=[])

    async def receive():
        client.reads += 1
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message):
        client.sent.append(message)

    scope = {"type": scope_type, "path": path, "headers": list(headers)}
    if root_path:  # the server puts --fastapi-root-path in front of the path
        scope.update(root_path=root_path, path=root_path + path)
    asyncio.run(middleware(scope, receive, send))
    start, body = client.sent
    client.status = start["status"]
    client.headers = dict(start["headers"])
    client.body = body["body"]
    client.route, client.client_receive = route, receive
    return client


def sized(n):
    """A JSON object of exactly `n` bytes."""
    return b"{}" + b" " * (n - 2)


class TestRequestLimits(CustomTestCase):
    def assertRefused(self, client, status, message):
        self.assertEqual(client.status, status)
        self.assertIsNone(client.route.received)
        self.assertEqual(
            json.loads(client.body),
            {"success": False, "status": "error", "message": message},
        )
        self.assertEqual(client.headers[b"content-type"], b"application/json")
        self.assertEqual(client.headers[b"content-length"], b"%d" % len(client.body))

    def test_a_body_at_the_limit_reaches_the_route_whole_in_one_message(self):
        body = sized(LIMIT)
        client = post("/prepare_weights_update", [body[:10], body[10:500], body[500:]])
        self.assertEqual(client.status, 200)
        self.assertEqual(client.route.body, body)
        self.assertFalse(client.route.received[0]["more_body"])

    def test_one_byte_past_the_limit_is_refused_413_naming_the_flag(self):
        body = sized(LIMIT + 1)
        client = post("/prepare_weights_update", [body[:600], body[600:]])
        self.assertRefused(
            client,
            413,
            f"body: larger than the {LIMIT / 2**20:g} MiB "
            f"--weight-update-max-request-mb allows",
        )

    def test_a_content_length_past_the_limit_is_refused_before_reading(self):
        length = [(b"content-length", b"%d" % (LIMIT + 1))]
        client = post("/complete_weights_update", [sized(LIMIT + 1)], length)
        self.assertEqual((client.status, client.reads), (413, 0))
        length = [(b"content-length", b"%d" % LIMIT)]
        client = post("/complete_weights_update", [sized(LIMIT)], length)
        self.assertEqual(client.status, 200)

    def test_a_content_length_that_understates_the_body_does_not_pass(self):
        for length in (b"10", b"-1", b"x"):
            with self.subTest(length=length):
                headers = [(b"content-length", length)]
                client = post("/prepare_weights_update", [sized(LIMIT + 1)], headers)
                self.assertEqual(client.status, 413)

    def test_every_weight_update_route_is_bounded_at_its_limit(self):
        for routes, limit, flag in (
            (WEIGHT_UPDATE_ROUTES, LIMIT, "--weight-update-max-request-mb"),
            (TENSOR_BODY_ROUTES, TENSOR_LIMIT, "--weight-update-max-tensor-request-mb"),
        ):
            for path in sorted(routes):
                with self.subTest(path=path):
                    self.assertEqual(post(path, [sized(limit)]).status, 200)
                    client = post(path, [sized(limit + 1)])
                    self.assertEqual(client.status, 413)
                    self.assertIn(flag, json.loads(client.body)["message"])

    def test_routes_under_a_root_path_are_bounded_too(self):
        for path, limit in (
            ("/prepare_weights_update", LIMIT),
            ("/update_weights_from_tensor", TENSOR_LIMIT),
        ):
            with self.subTest(path=path):
                client = post(path, [sized(limit)], root_path="/api")
                self.assertEqual(client.status, 200)
                client = post(path, [sized(limit + 1)], root_path="/api")
                self.assertEqual(client.status, 413)
        client = post("/generate", [sized(10 * LIMIT)], root_path="/api")
        self.assertEqual(client.status, 200)

    def test_without_a_tensor_limit_the_tensor_routes_are_not_bounded(self):
        body = sized(10 * TENSOR_LIMIT)
        client = post("/update_weights_from_tensor", [body], tensor_limit=None)
        self.assertEqual(client.status, 200)
        self.assertIs(client.route.receive, client.client_receive)
        self.assertEqual(client.route.body, body)

    def test_other_routes_and_scopes_pass_through_untouched(self):
        body = b'{"x": "\\ud800"}' + sized(10 * LIMIT)
        for path, scope_type in (
            ("/generate", "http"),
            ("/prepare_weights_update", "websocket"),
        ):
            with self.subTest(path=path, scope_type=scope_type):
                client = post(path, [body], scope_type=scope_type)
                self.assertEqual(client.status, 200)
                self.assertIs(client.route.receive, client.client_receive)
                self.assertEqual(client.route.body, body)

    def test_a_lone_surrogate_is_refused_400_naming_where_it_is(self):
        cases = {
            "weight_version": {"weight_version": "v\ud800"},
            "buckets[0].names[1]": {"buckets": [{"names": ["a", "\udfff"]}]},
            "body (a key)": {"\ud800": 1},
            "buckets[0] (a key)": {"buckets": [{"\udc00": 1}]},
            "body": "\ud800",
        }
        for where, payload in cases.items():
            with self.subTest(where=where):
                client = post("/update_weight_version", [json.dumps(payload).encode()])
                self.assertRefused(
                    client, 400, f"{where}: holds a lone UTF-16 surrogate, not Unicode"
                )

    def test_surrogate_pairs_escaped_backslashes_and_non_json_reach_the_route(self):
        for body in (
            json.dumps({"weight_version": "\U0001f600"}).encode(),
            json.dumps({"weight_version": "\\ud800"}).encode(),
            b'{"weight_version": "\\ud800"',
        ):
            with self.subTest(body=body):
                client = post("/update_weight_version", [body])
                self.assertEqual(client.status, 200)
                self.assertEqual(client.route.body, body)

    def test_after_the_body_the_route_hears_from_the_client(self):
        client = post("/prepare_weights_update", [b"{}"])
        self.assertEqual(client.route.received[-1], {"type": "http.disconnect"})
        self.assertEqual(client.reads, 2)

    def test_a_client_gone_mid_body_is_passed_to_the_route(self):
        route = Route()
        middleware = WeightUpdateBodyLimit(route, LIMIT, TENSOR_LIMIT)
        incoming = [
            {"type": "http.request", "body": b"{", "more_body": True},
            {"type": "http.disconnect"},
        ]
        sent = []

        async def receive():
            return incoming.pop(0)

        async def send(message):
            sent.append(message)

        scope = {"type": "http", "path": "/prepare_weights_update", "headers": []}
        asyncio.run(middleware(scope, receive, send))
        self.assertEqual(route.received[0], {"type": "http.disconnect"})
        self.assertEqual(sent[0]["status"], 200)

    def test_a_tokenizer_worker_bounds_bodies_once_it_has_its_server_args(self):
        """A tokenizer worker registers its limit when it imports the HTTP
        server, before it has read the server arguments: until it has them
        (and in the single-tokenizer server, which adds its own) bodies pass
        through untouched; then they are bounded by the arguments' limits."""
        worker_args = []

        def worker(route):
            args = worker_args[0] if worker_args else None
            return WorkerWeightUpdateBodyLimit(route, lambda: args)

        body = sized(10 * TENSOR_LIMIT)
        client = post("/prepare_weights_update", [body], middleware_of=worker)
        self.assertEqual(client.status, 200)
        self.assertIs(client.route.receive, client.client_receive)
        self.assertEqual(client.route.body, body)

        worker_args.append(
            types.SimpleNamespace(
                weight_update_max_request_mb=LIMIT / 2**20,
                weight_update_max_tensor_request_mb=TENSOR_LIMIT / 2**20,
            )
        )
        for path, limit, flag in (
            ("/prepare_weights_update", LIMIT, "--weight-update-max-request-mb"),
            (
                "/update_weights_from_tensor",
                TENSOR_LIMIT,
                "--weight-update-max-tensor-request-mb",
            ),
        ):
            with self.subTest(path=path):
                client = post(path, [sized(limit)], middleware_of=worker)
                self.assertEqual(client.status, 200)
                client = post(path, [sized(limit + 1)], middleware_of=worker)
                self.assertEqual(client.status, 413)
                self.assertIn(flag, json.loads(client.body)["message"])


if __name__ == "__main__":
    unittest.main()
