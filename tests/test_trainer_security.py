"""The trainer's control API (`rlsync.services.trainer_server`) as a hostile caller
sees it: no key, a wrong or malformed key, hosts that are not hosts (the
trainer would send them the engines' admin key and join them to the update
group), out-of-range sizes. Every refusal is a 4xx naming what is wrong, it
changes nothing, and no answer or log line holds a key. Also the keys that
`rlsync.client` sends."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest
from fastapi.testclient import TestClient

from harness.cpu_sglang import free_port
from rlsync import auth
from rlsync.services.trainer_server import (
    API_KEY_ENV,
    MAX_WORLD_SIZE,
    create_trainer_app,
)

API_KEY = "trainer-api-key-0123456789"
ADMIN_KEY = "engine-admin-key-9876543210"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
ROUTES = [
    ("POST", "/add_inference_endpoint", {"host": "h", "port": 1, "world_size": 1}),
    ("POST", "/remove_inference_endpoint", {"host": "h", "port": 1}),
    ("GET", "/inference_endpoints", None),
    ("POST", "/sync_inference_weights", {"master_port": 29600, "buffer_size_mb": 8}),
]


def make_app(weights=lambda: [], **kw):
    kw.setdefault("api_key", API_KEY)
    return create_trainer_app(
        weights, backend="gloo", group_name=f"trainer_{free_port()}", **kw
    )


@pytest.fixture
def api():
    """The API with no engine behind it, and a client that sends the key."""
    with TestClient(make_app(admin_key=ADMIN_KEY), headers=AUTH) as http:
        yield http


def assert_no_secret(resp) -> None:
    for secret in (API_KEY, ADMIN_KEY):
        assert secret not in resp.text, f"{resp.request.url.path} answers a key"


# --- authentication ------------------------------------------------------------

BAD_AUTH = {
    "none": [],
    "wrong key": [(b"authorization", b"Bearer not-the-trainer-api-key")],
    "key with a suffix": [(b"authorization", f"Bearer {API_KEY}x".encode())],
    "key prefix": [(b"authorization", f"Bearer {API_KEY[:-1]}".encode())],
    "basic scheme": [(b"authorization", f"Basic {API_KEY}".encode())],
    "bare key": [(b"authorization", API_KEY.encode())],
    "scheme alone": [(b"authorization", b"Bearer")],
    "non-ascii": [(b"authorization", b"Bearer \xff\xfe\xc3\xa9t\xc3\xa9")],
    "non-ascii utf-8": [(b"authorization", "Bearer clé-😀".encode())],
    "two headers": [
        (b"authorization", b"Bearer x"),
        (b"authorization", AUTH["Authorization"].encode()),
    ],
    "engine admin key": [(b"authorization", f"Bearer {ADMIN_KEY}".encode())],
}


async def asgi_call(app, method: str, path: str, headers, body: bytes = b""):
    """One raw ASGI request (exact header bytes, repeated headers kept);
    returns (status, body)."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "client": ("203.0.113.9", 40000),
        "server": ("testserver", 80),
        "headers": [(b"content-type", b"application/json"), *headers],
    }
    sent: list[dict] = []
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive():
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    await app(scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    return status, b"".join(m.get("body", b"") for m in sent)


@pytest.mark.parametrize("variant", sorted(BAD_AUTH))
@pytest.mark.parametrize("method,path,body", ROUTES + [("GET", "/docs", None)])
def test_every_route_needs_the_api_key(method, path, body, variant, caplog):
    app = make_app(admin_key=ADMIN_KEY)
    raw = json.dumps(body).encode() if body is not None else b""
    status, answer = asyncio.run(asgi_call(app, method, path, BAD_AUTH[variant], raw))
    assert status == 401, (variant, status, answer)
    assert API_KEY.encode() not in answer and ADMIN_KEY.encode() not in answer
    assert API_KEY not in caplog.text and ADMIN_KEY not in caplog.text


def test_unauthenticated_calls_change_nothing(api):
    """A refused caller registers nothing and syncs nothing."""
    anon = TestClient(api.app)
    for method, path, body in ROUTES:
        assert anon.request(method, path, json=body).status_code == 401, path
    assert api.get("/inference_endpoints").json() == []
    wrong = {"Authorization": "Bearer " + "x" * len(API_KEY)}
    resp = anon.post("/add_inference_endpoint", json=ROUTES[0][2], headers=wrong)
    assert resp.status_code == 401 and resp.headers["www-authenticate"] == "Bearer"
    assert api.get("/inference_endpoints").json() == []


def test_the_key_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv(API_KEY_ENV, API_KEY)
    with TestClient(create_trainer_app(lambda: [], backend="gloo")) as http:
        assert http.get("/inference_endpoints").status_code == 401
        assert http.get("/inference_endpoints", headers=AUTH).status_code == 200


@pytest.mark.parametrize(
    "key",
    [
        None,
        "",
        "short",
        "with space 0123456789",
        "clé-0123456789abcdef",
        "tab\t0123456789abcdef",
    ],
)
def test_no_usable_key_refuses_to_build_the_app(monkeypatch, key):
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    with pytest.raises(ValueError) as err:
        create_trainer_app(lambda: [], api_key=key)
    message = str(err.value)
    assert (API_KEY_ENV in message) if not key else message.startswith("api_key:")
    assert not key or key not in message, "the message shows the key"


# --- hosts ---------------------------------------------------------------------

HOSTILE_HOSTS = [
    "evil.com/x?",
    "a@b",
    "user:pw@evil.com",
    "http://evil.com",
    "evil.com:80",
    "evil.com#x",
    "evil.com?x=1",
    "evil.com/",
    "",
    " evil.com",
    "evil.com ",
    "evil.com\r\nX-Injected: 1",
    "evil..com",
    "-evil.com",
    "evil.com.",
    "1.2.3",
    "300.1.1.1",
    "010.0.0.1",
    "[1.2.3.4]",
    "fe80::1%eth0",
    "[fe80::1%25eth0]",
    "bücher.de",
    "a" * 64 + ".com",
    ("a." * 127) + "com",
    "evil_host",
    5,
    ["evil.com"],
    {"host": "evil.com"},
]


@pytest.mark.parametrize("host", HOSTILE_HOSTS, ids=repr)
def test_hostile_host_is_a_400_naming_the_field(api, host):
    for path in ("/add_inference_endpoint", "/remove_inference_endpoint"):
        resp = api.post(path, json={"host": host, "port": 30000, "world_size": 1})
        assert resp.status_code == 400, (path, resp.text)
        assert resp.json()["message"].startswith("host: "), resp.json()
    assert api.get("/inference_endpoints").json() == []


@pytest.mark.parametrize(
    "host,url",
    [
        ("localhost", "http://localhost:30000"),
        ("Engine-1.Cluster.local", "http://engine-1.cluster.local:30000"),
        ("10.0.0.7", "http://10.0.0.7:30000"),
        ("::1", "http://[::1]:30000"),
        ("[2001:db8::7]", "http://[2001:db8::7]:30000"),
    ],
)
def test_well_formed_hosts_are_registered(api, host, url):
    resp = api.post(
        "/add_inference_endpoint", json={"host": host, "port": 30000, "world_size": 2}
    )
    assert resp.status_code == 200, resp.text
    assert resp.json()["endpoints"] == [{"url": url, "tp_size": 2}]
    assert api.get("/inference_endpoints").json() == [{"url": url, "tp_size": 2}]


def test_allowed_hosts(monkeypatch):
    app = make_app(allowed_hosts=["engine-1.local", "10.0.0.7", "::1"])
    with TestClient(app, headers=AUTH) as http:

        def add(host: str):
            return http.post(
                "/add_inference_endpoint",
                json={"host": host, "port": 30000, "world_size": 1},
            )

        for host in ("ENGINE-1.local", "10.0.0.7", "[::1]"):
            assert add(host).status_code == 200, host
        for host in ("engine-2.local", "10.0.0.8", "localhost", "127.0.0.1"):
            resp = add(host)
            assert resp.status_code == 403, (host, resp.text)
            assert resp.json()["message"].startswith("host: "), resp.json()
        assert len(http.get("/inference_endpoints").json()) == 3
    with pytest.raises(ValueError, match="allowed_hosts"):
        make_app(allowed_hosts=["http://engine-1.local"])


# --- sizes ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "world_size", [0, -1, MAX_WORLD_SIZE + 1, 10**30, True, False, 1.5, "4", None, [4]]
)
def test_world_size_bounds(api, world_size):
    resp = api.post(
        "/add_inference_endpoint",
        json={"host": "engine", "port": 30000, "world_size": world_size},
    )
    assert resp.status_code == 400, resp.text
    assert resp.json()["message"].startswith("world_size: "), resp.json()
    assert api.get("/inference_endpoints").json() == []


@pytest.mark.parametrize("world_size", [1, MAX_WORLD_SIZE])
def test_world_size_in_range_is_accepted(api, world_size):
    resp = api.post(
        "/add_inference_endpoint",
        json={"host": "engine", "port": 30000, "world_size": world_size},
    )
    assert resp.status_code == 200, resp.text


def test_endpoint_count_is_bounded():
    with TestClient(make_app(max_endpoints=2), headers=AUTH) as http:
        codes = [
            http.post(
                "/add_inference_endpoint",
                json={"host": f"engine-{i}", "port": 30000, "world_size": 1},
            ).status_code
            for i in range(3)
        ]
        assert codes == [200, 200, 409]


@pytest.mark.parametrize(
    "path,body,status,message",
    [
        (
            "/sync_inference_weights",
            b'{"master_port": 29600, "weight_version": "v\\ud800"}',
            400,
            "weight_version: holds a lone UTF-16 surrogate",
        ),
        (
            "/add_inference_endpoint",
            b'{"host": "\\udc00", "port": 1, "world_size": 1}',
            400,
            "host: holds a lone UTF-16 surrogate",
        ),
        ("/add_inference_endpoint", b"\xff\xfe", 400, "body: not JSON"),
        ("/add_inference_endpoint", b"[1]", 400, "body: expected a JSON object"),
        (
            "/add_inference_endpoint",
            b'{"host": "' + b"h" * (1 << 20) + b'"}',
            413,
            "body: larger than 64 KiB",
        ),
    ],
)
def test_bodies_that_are_not_json_objects_of_unicode_are_4xx(
    api, path, body, status, message
):
    resp = api.post(path, content=body)
    assert resp.status_code == status, resp.text
    assert resp.json()["message"].startswith(message), resp.json()
    assert api.get("/inference_endpoints").json() == []


# --- secrets -------------------------------------------------------------------


def test_no_answer_or_log_line_holds_a_key(api, caplog):
    """Every route's answer, successes and failures, and every log line the
    API writes: the engines' admin key and the API key are in none. A sync
    whose engine is down fails (502) without echoing them either."""
    caplog.set_level(logging.DEBUG)
    dead = free_port()
    answers = [
        api.post(
            "/add_inference_endpoint",
            json={"host": "127.0.0.1", "port": dead, "world_size": 1},
        ),
        api.post(
            "/add_inference_endpoint",
            json={"host": "localhost", "port": dead, "world_size": 2},
        ),
        api.get("/inference_endpoints"),
        api.post(
            "/sync_inference_weights",
            json={"master_port": free_port(), "buffer_size_mb": 1},
        ),
        api.post(
            "/add_inference_endpoint", json={"host": "a@b", "port": 1, "world_size": 1}
        ),
        api.post(
            "/remove_inference_endpoint", json={"host": "localhost", "port": dead}
        ),
        api.get("/inference_endpoints"),
        TestClient(api.app).get("/inference_endpoints"),
    ]
    assert [a.status_code for a in answers] == [200, 200, 200, 502, 400, 200, 200, 401]
    assert answers[3].json()["step"] == "connect"
    for a in answers:
        assert_no_secret(a)
    assert ADMIN_KEY not in caplog.text and API_KEY not in caplog.text


# --- the keys rlsync.client sends ----------------------------------------------


@pytest.mark.parametrize(
    "key", ["clé-0123456789", "two words", "line\nbreak", "tab\tkey"]
)
def test_client_refuses_a_key_that_cannot_go_into_a_header(key):
    for kwargs in ({"admin_key": key}, {"api_key": key}):
        with pytest.raises(ValueError) as err:
            auth.bearer_headers(**kwargs)
        name = next(iter(kwargs))
        assert str(err.value).startswith(f"{name}: ") and key not in str(err.value)


def test_client_sends_the_admin_key_else_the_api_key():
    assert auth.bearer_headers() == {}
    assert auth.bearer_headers(api_key="a-key") == {"Authorization": "Bearer a-key"}
    both = auth.bearer_headers(admin_key="admin", api_key="a-key")
    assert both == {"Authorization": "Bearer admin"}


@pytest.mark.parametrize(
    "headers,ok",
    [
        ([(b"authorization", b"Bearer k3y")], True),
        ([(b"Authorization", b"bearer k3y")], True),
        ([(b"authorization", b"Bearer k3y"), (b"authorization", b"Bearer k3y")], False),
        ([(b"authorization", b"Bearer k3")], False),
        ([(b"authorization", b"Bearer k3yy")], False),
        ([(b"authorization", b"Basic k3y")], False),
        ([(b"authorization", b"k3y")], False),
        ([(b"authorization", b"Bearer \xff\xfe")], False),
        ([], False),
    ],
)
def test_bearer_ok_on_raw_header_bytes(headers, ok):
    assert auth.bearer_ok(headers, b"k3y") is ok
