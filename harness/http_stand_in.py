"""A local HTTP stand-in for an engine, for tests where only its answers
matter: each (method, path) gets a fixed JSON answer, 404 elsewhere."""

from __future__ import annotations

import http.server
import json
import threading
from typing import Any, Optional

# (method, path) -> (HTTP status, JSON body)
Answers = dict[tuple[str, str], tuple[int, Any]]
# Routes a server of the series answers without a key.
OPEN_ROUTES = ("/health", "/rlsync_info")


class HttpStandIn:
    """Answers from `answers` (which a test may change while it serves);
    with `key`, every route but OPEN_ROUTES needs `Authorization: Bearer
    <key>` and is a 401 otherwise (a server run with --api-key alone).
    `requests` records (method, path, Authorization)."""

    def __init__(self, answers: Answers, key: Optional[str] = None) -> None:
        self.answers = answers
        self.key = key
        self.requests: list[tuple[str, str, Optional[str]]] = []
        # Notified after each request is recorded (wait for one on it).
        self.received = threading.Condition()
        stand_in = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def answer(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                authorization = self.headers.get("Authorization")
                with stand_in.received:
                    stand_in.requests.append((method, self.path, authorization))
                    stand_in.received.notify_all()
                status, body = stand_in.answer(method, self.path, authorization)
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self.answer("GET")

            def do_POST(self) -> None:
                self.answer("POST")

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def answer(
        self, method: str, path: str, authorization: Optional[str]
    ) -> tuple[int, Any]:
        if self.key and path not in OPEN_ROUTES:
            if authorization != f"Bearer {self.key}":
                return 401, {"error": "Unauthorized"}
        return self.answers.get((method, path), (404, {"detail": "Not Found"}))

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> "HttpStandIn":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
