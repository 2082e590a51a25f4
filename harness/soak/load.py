"""The soak's traffic: streaming and non-streaming generation and a
`/health` poller per server, every outcome recorded with its time, and a
gate per server so that no new request starts on one about to restart."""

from __future__ import annotations

import itertools
import json
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

import requests

from harness.soak.common import brief
from rlsync import client

if TYPE_CHECKING:
    from harness.soak.run import SoakConfig
    from harness.soak.servers import Slot


@dataclass
class Outcome:
    slot: str
    kind: str  # "stream" or "plain"
    start: float
    end: float
    result: str  # "ok", "error" (a clean HTTP error) or "lost"
    detail: str = ""


class Load:
    """Requests in flight and their outcomes, and a gate per server: a closed
    gate lets no new request start (a server about to be restarted)."""

    def __init__(self, slots: list[str]) -> None:
        self.cond = threading.Condition()
        self.open = {name: True for name in slots}
        self.in_flight: dict[int, tuple[str, float]] = {}
        self.outcomes: list[Outcome] = []
        self.health: list[tuple[str, float, int, str]] = []
        self.stop = threading.Event()
        self._ids = itertools.count()

    def begin(self, slot: str, wait_s: float = 1.0) -> Optional[int]:
        with self.cond:
            ready = self.cond.wait_for(
                lambda: self.open[slot] or self.stop.is_set(), wait_s
            )
            if not ready or self.stop.is_set():
                return None
            rid = next(self._ids)
            self.in_flight[rid] = (slot, time.monotonic())
            return rid

    def end(self, rid: int, outcome: Optional[Outcome]) -> None:
        with self.cond:
            del self.in_flight[rid]
            if outcome is not None:
                self.outcomes.append(outcome)
            self.cond.notify_all()

    def record_health(self, slot: str, issued: float, code: int, body: str) -> None:
        with self.cond:
            self.health.append((slot, issued, code, body))

    def close_gate(self, slot: str, timeout: float) -> bool:
        """No new request to `slot`; wait for those in flight to end."""
        with self.cond:
            self.open[slot] = False
            return self.cond.wait_for(
                lambda: all(s != slot for s, _ in self.in_flight.values()), timeout
            )

    def open_gate(self, slot: str) -> None:
        with self.cond:
            self.open[slot] = True
            self.cond.notify_all()

    def settle(self, before: float, timeout: float) -> bool:
        """Wait until every request started before `before` has ended."""
        with self.cond:
            return self.cond.wait_for(
                lambda: all(t >= before for _, t in self.in_flight.values()), timeout
            )

    def health_between(
        self, t0: float = 0.0, t1: float = float("inf")
    ) -> list[tuple[str, float, int, str]]:
        """The health checks issued between t0 and t1: (slot, issued, code, body)."""
        with self.cond:
            return [h for h in self.health if t0 <= h[1] <= t1]

    def health_200(self, slot: str, t0: float = 0.0, t1: float = float("inf")) -> str:
        """ "answered 200/issued" of `slot`'s health checks issued between t0 and t1."""
        codes = [h[2] for h in self.health_between(t0, t1) if h[0] == slot]
        return f"{sum(c == 200 for c in codes)}/{len(codes)}"

    def snapshot(self) -> int:
        with self.cond:
            return len(self.outcomes)

    def since(self, mark: int) -> list[Outcome]:
        with self.cond:
            return self.outcomes[mark:]

    def shutdown(self) -> None:
        self.stop.set()
        with self.cond:
            self.cond.notify_all()


def judge(body: Any, token_ids: bool, max_new: int) -> tuple[str, str]:
    if not isinstance(body, dict):
        return "lost", f"malformed answer: {brief(body, 200)}"
    if "error" in body:
        return "error", f"error in the answer: {brief(body['error'], 200)}"
    meta = body.get("meta_info") or {}
    reason = meta.get("finish_reason")
    kind = reason.get("type") if isinstance(reason, dict) else reason
    if kind == "abort":
        return "error", f"aborted by the server: {brief(reason, 200)}"
    key = "output_ids" if token_ids else "text"
    if kind != "length" or meta.get("completion_tokens") != max_new or key not in body:
        return "lost", (
            f"incomplete answer: finish_reason={reason}, completion_tokens="
            f"{meta.get('completion_tokens')}, {key} {'present' if key in body else 'missing'}"
        )
    return "ok", ""


def generate(
    session: requests.Session,
    url: str,
    *,
    token_ids: bool,
    stream: bool,
    index: int,
    max_new: int,
    deadline_s: float,
) -> tuple[str, str]:
    """One /generate; ("ok" | "error" | "lost", detail). Token-in/token-out
    servers get `input_ids` and answer `output_ids`."""
    params = {"max_new_tokens": max_new, "temperature": 0.8, "ignore_eos": True}
    payload: dict[str, Any] = {"sampling_params": params, "stream": stream}
    if token_ids:
        payload["input_ids"] = [1] + [3 + (index * 7 + k) % 90 for k in range(6)]
    else:
        payload["text"] = f"soak request {index}"
    until = time.monotonic() + deadline_s
    try:
        with session.post(
            url + "/generate", json=payload, stream=stream, timeout=(10, deadline_s)
        ) as resp:
            if resp.status_code >= 400:
                return "error", f"HTTP {resp.status_code}: {brief(resp.text, 200)}"
            if not stream:
                return judge(resp.json(), token_ids, max_new)
            last: Any = None
            for raw in resp.iter_lines():
                if time.monotonic() > until:
                    return "lost", f"stream still open after {deadline_s:.0f}s"
                if raw == b"data: [DONE]":
                    return judge(last, token_ids, max_new)
                if raw.startswith(b"data:"):
                    last = json.loads(raw[5:])
            return "lost", "stream closed without [DONE]"
    except requests.Timeout:
        return "lost", f"no answer within {deadline_s:.0f}s"
    except requests.RequestException as e:
        if "Read timed out" in str(e):  # raised mid-stream as a ConnectionError
            return "lost", f"stream stalled: no data within {deadline_s:.0f}s"
        return "lost", f"connection dropped: {type(e).__name__}: {brief(e, 200)}"
    except ValueError as e:
        return "lost", f"malformed answer: {brief(e, 200)}"


def generation_loop(load: Load, slot: "Slot", stream: bool, cfg: "SoakConfig") -> None:
    session = requests.Session()
    for i in range(cfg.max_requests_per_client):
        rid = load.begin(slot.name)
        if rid is None:
            if load.stop.is_set():
                break
            continue
        start = time.monotonic()
        result, detail = generate(
            session,
            slot.url,
            token_ids=slot.token_ids,
            stream=stream,
            index=i,
            max_new=cfg.max_new_tokens,
            deadline_s=cfg.request_deadline,
        )
        kind = "stream" if stream else "plain"
        load.end(rid, Outcome(slot.name, kind, start, time.monotonic(), result, detail))
        # Paced, so that two cores also start servers and run the trainer;
        # longer after a failure, so that a failing server is not hammered.
        load.stop.wait(cfg.pause if result == "ok" else max(cfg.pause, 0.25))
    session.close()


def health_loop(load: Load, slot: "Slot", cfg: "SoakConfig") -> None:
    """/health half a second after each answer, as an orchestrator polls it,
    each answer recorded at the time the check was issued."""
    for _ in range(cfg.max_requests_per_client):
        rid = load.begin(slot.name)
        if rid is None:
            if load.stop.is_set():
                break
            continue
        issued = time.monotonic()
        code, body = client.health_detail(slot.url, timeout=20)
        load.end(rid, None)
        load.record_health(slot.name, issued, code, brief(body, 200))
        if load.stop.wait(0.5):
            break
