"""`make soak`: fault-injection soak of the weight-update promises.

Starts a TP 1 and a TP 2 patched server on the CPU (one of them token-in,
token-out: `--skip-tokenizer-init`), keeps streaming and non-streaming
generation and a health poller running on each, and pushes weights into both
from a trainer in a subprocess, one sync after another, each with a fault drawn
at random (seeded). After every sync it checks the promises:

- nothing lost: every generation request completed or got a clean HTTP error
  (no hang past its deadline, no dropped connection, no truncated answer);
- all-or-nothing: each server serves exactly the old or exactly the new weight
  set by `/weights_checker` checksum (every set's checksum is measured on both
  servers before the soak), and what the answers claimed matches it;
- healthy and serving: both servers alive, `/health` 200 throughout, a request
  after the sync completes; each server's RSS (its whole process tree) within
  10 % of its level after its first sync.

After a fault it recovers as a trainer would, through rlsync's public API only
(abort, re-initialise the group when an answer says `group_usable: false`, a
new trainer process after a kill); a server that fails its checks is restarted
so the soak goes on. Writes bench/results/soak-<date>.json and exits non-zero
naming every check that failed.

    python -m harness.soak [--syncs N] [--seed S] [--out PATH] [--faults a,b]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import dataclasses
import datetime
import hashlib
import itertools
import json
import multiprocessing as mp
import os
import platform
import random
import re
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from importlib import metadata
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Callable, Optional

import psutil
import requests
import torch
import torch.distributed as dist
from safetensors.torch import load_file

from harness.cpu_sglang import BUILD, ROOT, Server, free_port, launch
from harness.tiny_model import make_tiny_model
from harness.weights import randomized
from rlsync import client
from rlsync.digest import digest_tensors
from rlsync.planner import Bucket, plan_buckets
from rlsync.sender import Engine, SyncError, WeightSender

FAULTS = (
    "none",
    "trainer_killed",
    "abort",
    "short_transfer",
    "corrupted_bucket",
    "wrong_shape",
    "destroy_during_session",
    "engine_restart",
)
# Syncs that must apply everywhere; every other fault must leave the old weights.
MUST_APPLY = ("none", "engine_restart")
GROUP = "soak"
# Replicated on every TP rank: the head read back is the whole tensor's head.
SAMPLED = "model.norm.weight"
WEIGHT_SETS = 4  # set 0 is the checkpoint, sets 1.. are random (seeded)
RSS_TOLERANCE_PCT = 10.0
TRAINER_TIMEOUT = 60.0  # every weight-update HTTP call and collective
TRAINER_DEADLINE = 300.0  # the parent's wait for one trainer command
SHORT_WAIT = 5.0  # complete's server-side wait on a short transfer
LOG_PATTERN = re.compile(r"Traceback|\w+Error\b|Exception|[Ww]atchdog|[Ff]ailed")
# Start-up lines of every CPU server that match LOG_PATTERN and say nothing.
LOG_NOISE = re.compile(
    r"server_args=|Failed to load NCCL|Custom allreduce failed|yes/no token IDs"
)
Named = list[tuple[str, torch.Tensor]]


def weight_set(original: Named, index: int) -> Named:
    return original if index == 0 else randomized(original, index)


def brief(text: Any, limit: int = 400) -> str:
    text = str(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --- the trainer (its own process) --------------------------------------------


def _pack(bucket: Bucket) -> torch.Tensor:
    """A bucket's bytes back to back, in a buffer of their own."""
    return torch.cat(
        [t.detach().contiguous().reshape(-1).view(torch.uint8) for t in bucket.tensors]
    )


def _misshape(tensor: torch.Tensor, how: str) -> torch.Tensor:
    """The trainer's tensor under a shape the served model does not have."""
    if how == "transposed":
        return tensor.t().contiguous()
    assert how == "one_row_short", how
    return tensor[:-1].contiguous()


def _answer_fields(answer: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(answer) and not isinstance(answer, type):
        body = dataclasses.asdict(answer)
    elif isinstance(answer, dict):
        body = dict(answer)
    else:
        return {"answer": brief(answer)}
    keep = (
        "status",
        "success",
        "applied",
        "ready_to_apply",
        "group_usable",
        "num_buckets_received",
        "rank_results",
    )
    return {k: body[k] for k in keep if k in body}


def _benign(entry: dict[str, Any]) -> bool:
    """A recovery call that found nothing to undo."""
    message = entry.get("message", "")
    return not entry["ok"] and (
        "no weight update session is open" in message
        or "group_name: no update group" in message
    )


class SoakTrainer:
    """Rank 0 of the update group, in its own process: every weight-update
    call goes through rlsync, and the faults are injected on this side."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        self.engines = [Engine(url, tp) for url, tp in cfg["engines"]]
        self.bucket_bytes: int = cfg["bucket_bytes"]
        self.original: Named = list(load_file(cfg["weights"]).items())
        self.sender: Optional[WeightSender] = None
        self.pool = cf.ThreadPoolExecutor(max_workers=4 * len(self.engines))

    def _record(self, step: str, engine: Engine, fn: Callable[[Engine], Any]) -> dict:
        """fn(engine)'s answer or error, as one entry of a sync's steps."""
        t0 = time.monotonic()
        entry: dict[str, Any] = {"step": step, "engine": engine.url, "ok": False}
        try:
            answer = fn(engine)
            entry.update(ok=True, status=200, body=_answer_fields(answer))
            message = (
                answer.get("message")
                if isinstance(answer, dict)
                else getattr(answer, "message", "")
            )
            entry["message"] = brief(message or "")
        except client.EngineError as e:
            entry.update(status=e.status, message=brief(e.message))
        except Exception as e:
            entry.update(status=None, message=brief(f"{type(e).__name__}: {e}"))
        entry["seconds"] = round(time.monotonic() - t0, 3)
        return entry

    def _submit(
        self, step: str, fn: Callable[[Engine], Any], engines: Optional[list] = None
    ) -> list[cf.Future]:
        """fn on every engine at once, each recorded."""
        engines = self.engines if engines is None else engines
        return [self.pool.submit(self._record, step, e, fn) for e in engines]

    def _each(
        self, step: str, fn: Callable[[Engine], Any], engines: Optional[list] = None
    ) -> list[dict]:
        return [f.result() for f in self._submit(step, fn, engines)]

    def _abort_all(self, engines: Optional[list] = None) -> list[dict]:
        return self._each(
            "abort",
            lambda e: client.abort_weights_update(
                e.url, group_name=GROUP, timeout=TRAINER_TIMEOUT
            ),
            engines,
        )

    def connect(self) -> dict[str, Any]:
        port = free_port()
        sender = WeightSender(
            self.engines,
            master_port=port,
            group_name=GROUP,
            backend="gloo",
            bucket_bytes=self.bucket_bytes,
            timeout=TRAINER_TIMEOUT,
        )
        t0 = time.monotonic()
        try:
            sender.connect()
        except SyncError as e:
            return {"ok": False, "message": brief(str(e), 2000)}
        self.sender = sender
        return {"ok": True, "port": port, "seconds": round(time.monotonic() - t0, 3)}

    def recover(self, reconnect: bool) -> dict[str, Any]:
        """What a trainer does after a failed sync: abort every session, and
        re-initialise the group where an answer says it is unusable (or the
        caller knows it is: a new trainer, a restarted engine)."""
        steps = self._abort_all()
        unusable = [
            s["engine"] for s in steps if s["ok"] and not s["body"].get("group_usable")
        ]
        need = reconnect or bool(unusable) or self.sender is None
        out: dict[str, Any] = {"steps": steps, "reconnected": need}
        ok = all(s["ok"] or _benign(s) for s in steps)
        if need:
            if self.sender is not None:
                self.sender.close()  # destroys the group everywhere, leaves ours
                self.sender = None
            else:  # a new trainer: the engines may still hold the dead one's group
                steps += self._each(
                    "destroy",
                    lambda e: client.destroy_weights_update_group(
                        e.url, group_name=GROUP, timeout=TRAINER_TIMEOUT
                    ),
                )
                ok = ok and all(s["ok"] or _benign(s) for s in steps)
            out["connect"] = self.connect()
            ok = ok and out["connect"]["ok"]
        out["ok"] = ok
        return out

    def sync(self, spec: dict[str, Any]) -> dict[str, Any]:
        if self.sender is None:
            return {
                "via": "none",
                "steps": [],
                "applied": {},
                "outcome": "no update group",
                "needs_reconnect": True,
            }
        named = list(weight_set(self.original, spec["set"]))
        if spec["fault"] in MUST_APPLY and not spec["flush_cache"]:
            return self._sync_with_sender(named, spec)
        return self._sync_by_steps(named, spec)

    def _sync_with_sender(self, named: Named, spec: dict[str, Any]) -> dict:
        """The library's own atomic sync (it cannot ask for flush_cache)."""
        assert self.sender is not None
        t0 = time.monotonic()
        try:
            result = self.sender.sync(
                named, weight_version=spec["version"], atomic=True
            )
        except SyncError as e:
            return {
                "via": "WeightSender.sync",
                "applied": {},
                "outcome": f"failed at {e.step}",
                "steps": [
                    {
                        "step": e.step,
                        "engine": "*",
                        "ok": False,
                        "message": brief(str(e), 2000),
                    }
                ],
                "needs_reconnect": "re-initialised" in str(e),
                "seconds": round(time.monotonic() - t0, 3),
            }
        steps = [
            {
                "step": "complete",
                "engine": o.url,
                "ok": o.answered and o.applied,
                "message": brief(o.message),
                "body": {"applied": o.applied},
            }
            for o in result.engines
        ]
        return {
            "via": "WeightSender.sync",
            "steps": steps,
            "applied": {o.url: o.applied for o in result.engines},
            "outcome": "applied" if result.success else "not applied everywhere",
            "needs_reconnect": False,
            "seconds": round(time.monotonic() - t0, 3),
        }

    def _wait_in_flight(self, operation: str, deadline_s: float) -> bool:
        """Until every engine's /health names `operation` as in flight."""
        deadline = time.monotonic() + deadline_s
        pending = {e.url for e in self.engines}
        idle = threading.Event()
        while pending and time.monotonic() < deadline:
            for url in list(pending):
                if operation in client.health_detail(url, timeout=10)[1]:
                    pending.discard(url)
            idle.wait(0.02)
        return not pending

    def _sync_by_steps(self, named: Named, spec: dict[str, Any]) -> dict:
        """prepare, broadcast, verify (complete apply=false), apply, with the
        fault injected where `spec` says."""
        assert self.sender is not None
        t0 = time.monotonic()
        fault, p = spec["fault"], spec["params"]
        if fault == "wrong_shape":
            named = [
                (n, _misshape(t, p["how"]) if n == p["name"] else t) for n, t in named
            ]
        buckets = plan_buckets(named, self.bucket_bytes)
        meta = [b.meta(digest_tensors(b.tensors)) for b in buckets]
        flats = [_pack(b) for b in buckets]
        if fault == "corrupted_bucket":  # after the digest was computed
            flats[p["bucket"]][p["offset"]] ^= p["xor"]
        steps: list[dict] = []
        out: dict[str, Any] = {
            "via": "steps",
            "steps": steps,
            "applied": {},
            "needs_reconnect": False,
        }

        def done(outcome: str) -> dict[str, Any]:
            out["outcome"] = outcome
            out["needs_reconnect"] = out["needs_reconnect"] or any(
                s["step"] == "abort" and s["ok"] and not s["body"].get("group_usable")
                for s in steps
            )
            out["seconds"] = round(time.monotonic() - t0, 3)
            return out

        prepared = self._each(
            "prepare",
            lambda e: client.prepare_weights_update(
                e.url,
                meta,
                group_name=GROUP,
                load_format="flattened_bucket",
                weight_version=spec["version"],
                timeout=TRAINER_TIMEOUT,
            ),
        )
        steps += prepared
        if not all(s["ok"] for s in prepared):
            ok = [e for e, s in zip(self.engines, prepared) if s["ok"]]
            steps += self._abort_all(ok) if ok else []
            return done("failed at prepare")

        stop_at = len(flats)
        if fault == "trainer_killed":
            stop_at = p["bucket"]
        elif fault == "short_transfer":
            stop_at = p["sent"]
        elif fault == "destroy_during_session" or (
            fault == "abort" and p["moment"] != "verified"
        ):
            stop_at = p["after_buckets"]
        group = self.sender.group
        for flat in flats[:stop_at]:
            dist.broadcast(flat, src=0, group=group)
        out["buckets_sent"] = stop_at
        if fault == "trainer_killed":
            # The bucket holding the drawn byte goes on the wire, and the
            # trainer dies at once, without a goodbye.
            dist.broadcast(flats[stop_at], src=0, group=group, async_op=True)
            os.kill(os.getpid(), signal.SIGKILL)
        if fault == "destroy_during_session":
            steps += self._each(
                "destroy",
                lambda e: client.destroy_weights_update_group(
                    e.url, group_name=GROUP, timeout=TRAINER_TIMEOUT
                ),
            )
            out["needs_reconnect"] = True
            return done("group destroyed during the session")
        if fault == "abort" and p["moment"] == "transfer":
            steps += self._abort_all()
            return done(f"aborted after {stop_at} of {len(flats)} buckets")
        if fault == "abort" and p["moment"] == "complete_waiting":

            def verify(e: Engine) -> Any:
                return client.complete_weights_update(
                    e.url,
                    group_name=GROUP,
                    apply=False,
                    wait_timeout=TRAINER_TIMEOUT,
                    timeout=TRAINER_TIMEOUT + 30,
                )

            waiting = self._submit("verify", verify)
            seen = self._wait_in_flight("complete_weights_update", 30.0)
            steps.append({"step": "complete seen in flight", "engine": "*", "ok": seen})
            steps += self._abort_all()
            steps += [f.result() for f in waiting]
            return done(f"aborted while complete waited ({stop_at} buckets sent)")

        wait = SHORT_WAIT if fault == "short_transfer" else TRAINER_TIMEOUT
        verified = self._each(
            "verify",
            lambda e: client.complete_weights_update(
                e.url,
                group_name=GROUP,
                apply=False,
                wait_timeout=wait,
                timeout=TRAINER_TIMEOUT + 30,
            ),
        )
        steps += verified
        if not all(s["ok"] for s in verified):
            # A timed-out complete keeps its session; a trainer aborts every engine.
            steps += self._abort_all()
            return done("failed at verify")
        if fault == "abort":  # after every engine verified, before any applies
            steps += self._abort_all()
            return done("aborted after verify")
        applied = self._each(
            "apply",
            lambda e: client.complete_weights_update(
                e.url,
                group_name=GROUP,
                flush_cache=spec["flush_cache"],
                weight_version=spec["version"],
                timeout=TRAINER_TIMEOUT + 30,
            ),
        )
        steps += applied
        out["applied"] = {
            s["engine"]: bool(s["ok"] and s["body"].get("applied")) for s in applied
        }
        return done("applied" if all(out["applied"].values()) else "failed at apply")

    def close(self) -> dict[str, Any]:
        if self.sender is not None:
            self.sender.close()
            self.sender = None
        return {"ok": True}


def trainer_main(conn: Connection, cfg: dict[str, Any]) -> None:
    """The trainer process: runs the parent's commands until told to exit."""
    torch.set_num_threads(1)
    with open(cfg["log"], "ab") as log:  # gloo's chatter, our tracebacks
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    trainer = SoakTrainer(cfg)
    for _ in range(100_000):
        try:
            msg = conn.recv()
        except EOFError:
            break
        if msg["cmd"] == "exit":
            break
        try:
            answer = getattr(trainer, msg["cmd"])(**msg["args"])
        except Exception as e:
            answer = {
                "ok": False,
                "error": f"{type(e).__name__}: {e}",
                "traceback": traceback.format_exc()[-3000:],
            }
        conn.send(answer)
    trainer.close()


class TrainerProcess:
    """The parent's handle on the trainer subprocess."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=trainer_main, args=(child, cfg), daemon=True)
        self.proc.start()
        child.close()

    def call(self, cmd: str, deadline_s: float = TRAINER_DEADLINE, **args: Any) -> dict:
        """The trainer's answer; {"died": exit code} when it died, {"hung": ...}
        (and it is killed) when it did not answer in time."""
        try:
            self.conn.send({"cmd": cmd, "args": args})
        except (BrokenPipeError, OSError):
            self.proc.join(10)
            return {"died": self.proc.exitcode}
        if not self.conn.poll(deadline_s):
            self.kill()
            return {"hung": f"the trainer did not finish {cmd} in {deadline_s:.0f}s"}
        try:
            return self.conn.recv()
        except EOFError:
            self.proc.join(10)
            return {"died": self.proc.exitcode}

    def kill(self) -> None:
        if self.proc.is_alive() and self.proc.pid is not None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.join(10)

    def close(self) -> None:
        if self.proc.is_alive():
            try:
                self.conn.send({"cmd": "exit", "args": {}})
            except (BrokenPipeError, OSError):
                pass
            self.proc.join(90)
        self.kill()
        self.conn.close()


# --- generation load and health polling ---------------------------------------


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


def _judge(body: Any, token_ids: bool, max_new: int) -> tuple[str, str]:
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
                return _judge(resp.json(), token_ids, max_new)
            last: Any = None
            for raw in resp.iter_lines():
                if time.monotonic() > until:
                    return "lost", f"stream still open after {deadline_s:.0f}s"
                if raw == b"data: [DONE]":
                    return _judge(last, token_ids, max_new)
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


# --- servers ------------------------------------------------------------------


@dataclass
class Slot:
    """One of the two servers, across restarts (same port)."""

    name: str
    tp: int
    token_ids: bool
    model: Path
    server: Optional[Server] = None
    served: int = 0  # the weight set it must serve
    version: str = ""  # the weight version it must report
    rss_base: Optional[int] = None
    launches: int = 0
    log_seen: int = 0

    @property
    def url(self) -> str:
        assert self.server is not None
        return self.server.url

    def start(self, port: Optional[int] = None) -> None:
        self.launches += 1
        log = BUILD / "logs" / f"soak-{self.name}-{self.launches}.log"
        extra = ["--skip-tokenizer-init"] if self.token_ids else []
        self.server = launch(self.model, log, tp=self.tp, extra_args=extra, port=port)
        self.served, self.rss_base, self.log_seen = 0, None, 0
        self.version = client.get_weight_version(self.url)

    def rss(self) -> int:
        """RSS summed over the server's process tree."""
        assert self.server is not None
        try:
            root = psutil.Process(self.server.proc.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return 0
        total = 0
        for p in procs:
            try:
                total += p.memory_info().rss
            except psutil.NoSuchProcess:
                pass
        return total

    def new_log_lines(self, limit: int = 15) -> list[str]:
        assert self.server is not None
        try:
            text = self.server.log_path.read_text(errors="replace")
        except OSError:
            return []
        fresh, self.log_seen = text[self.log_seen :], len(text)
        hits = [
            line.strip()
            for line in fresh.splitlines()
            if LOG_PATTERN.search(line) and not LOG_NOISE.search(line)
        ]
        return [brief(h, 300) for h in dict.fromkeys(hits)][:limit]


# --- the soak -------------------------------------------------------------------


@dataclass
class SoakConfig:
    syncs: int = 30
    seed: int = 1
    faults: tuple[str, ...] = FAULTS
    flush_cache: str = "random"  # "random", "true" or "false"
    token_ids_on: str = "tp2"  # the server started with --skip-tokenizer-init
    streaming_clients: int = 2
    plain_clients: int = 2
    max_new_tokens: int = 8
    pause: float = 0.1  # seconds between one client's requests
    request_deadline: float = 60.0
    bucket_bytes: int = 32 << 10
    max_seconds: float = 3600.0
    max_requests_per_client: int = 100_000
    out: Optional[Path] = None
    dry_run: bool = False


@dataclass
class SyncPlan:
    index: int
    kind: str
    flush_cache: bool
    params: dict[str, Any]
    pick: float  # which of the weight sets that neither server serves


class Soak:
    def __init__(self, cfg: SoakConfig) -> None:
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self.cycles: dict[str, list[str]] = {}
        self.t0 = time.monotonic()
        self.machine = machine()  # the install the servers start from
        self.model = make_tiny_model(BUILD / "models", "test")
        self.weights_file = self.model / "model.safetensors"
        self.original: Named = list(load_file(str(self.weights_file)).items())
        self.bucket_sizes = [
            b.nbytes for b in plan_buckets(self.original, cfg.bucket_bytes)
        ]
        self.slots = [
            Slot(f"tp{tp}", tp, cfg.token_ids_on == f"tp{tp}", self.model)
            for tp in (1, 2)
        ]
        self.load = Load([s.name for s in self.slots])
        self.threads: list[threading.Thread] = []
        self.trainer: Optional[TrainerProcess] = None
        self.checksums: dict[str, list[str]] = {}
        self.records: list[dict[str, Any]] = []
        self.failures: list[str] = []
        self.setup: dict[str, Any] = {}
        # Outcomes and health checks after this (count, time) belong to no
        # sync (the load winding down); None until the syncs begin.
        self.end_mark: Optional[tuple[int, float]] = None

    # --- setup and teardown

    def _trainer_cfg(self) -> dict[str, Any]:
        return {
            "engines": [[s.url, s.tp] for s in self.slots],
            "weights": str(self.weights_file),
            "bucket_bytes": self.cfg.bucket_bytes,
            "log": str(BUILD / "logs" / "soak-trainer.log"),
        }

    def start(self) -> bool:
        """Servers, trainer, calibration, load; False (failures recorded) when
        the soak cannot begin."""
        with cf.ThreadPoolExecutor(2) as pool:
            futures = [pool.submit(s.start) for s in self.slots]
            for s, f in zip(self.slots, futures):
                try:
                    f.result()
                except Exception as e:
                    self.failures.append(
                        f"setup: {s.name} did not start: {brief(e, 3000)}"
                    )
        if self.failures:
            return False
        self.setup["servers_up_s"] = round(time.monotonic() - self.t0, 1)
        self.setup["rlsync_info"] = {
            s.name: client.rlsync_info(s.url) for s in self.slots
        }
        self.trainer = TrainerProcess(self._trainer_cfg())
        answer = self.trainer.call("connect")
        if not answer.get("ok"):
            self.failures.append(f"setup: the trainer could not connect: {answer}")
            self._collect_setup_logs()
            return False
        if not self.calibrate():
            self._collect_setup_logs()
            return False
        for slot in self.slots:
            streams = [True] * self.cfg.streaming_clients
            for stream in streams + [False] * self.cfg.plain_clients:
                self.threads.append(
                    threading.Thread(
                        target=generation_loop,
                        args=(self.load, slot, stream, self.cfg),
                        daemon=True,
                    )
                )
            self.threads.append(
                threading.Thread(
                    target=health_loop, args=(self.load, slot, self.cfg), daemon=True
                )
            )
        for t in self.threads:
            t.start()
        # The load flows on both servers before the first sync.
        with self.load.cond:
            flowing = self.load.cond.wait_for(
                lambda: all(
                    any(
                        o.slot == s.name and o.result == "ok"
                        for o in self.load.outcomes
                    )
                    for s in self.slots
                ),
                self.cfg.request_deadline * 2,
            )
        if not flowing:
            outcomes = self.load.since(0)[-8:]
            self.failures.append(
                f"setup: generation did not flow on both servers: {outcomes}"
            )
            self._collect_setup_logs()
            return False
        self.setup["ready_s"] = round(time.monotonic() - self.t0, 1)
        return True

    def _collect_setup_logs(self) -> None:
        """The servers' state and log lines, as the evidence of a failed setup."""
        self.setup["log_lines"] = {s.name: s.new_log_lines(40) for s in self.slots}
        self.setup["alive"] = {
            s.name: s.server is not None and s.server.alive() for s in self.slots
        }
        for slot in self.slots:
            lines = self.setup["log_lines"][slot.name]
            alive = "alive" if self.setup["alive"][slot.name] else "exited"
            self.failures.append(
                f"setup: {slot.name} ({alive}) logged: {' | '.join(lines) or 'nothing'}"
            )

    def calibrate(self) -> bool:
        """Every weight set's checksum on each server, measured by syncing it
        (atomic, no load, no fault) and checked against a sampled parameter;
        the checkpoint's must come back to its start-up value."""
        try:
            for slot in self.slots:
                self.checksums[slot.name] = [""] * WEIGHT_SETS
                self.checksums[slot.name][0] = client.weights_checksum(
                    slot.url, timeout=60
                )["checksum"]
            assert self.trainer is not None
            for k in [*range(1, WEIGHT_SETS), 0]:
                report = self.trainer.call(
                    "sync",
                    spec={
                        "set": k,
                        "fault": "none",
                        "params": {},
                        "flush_cache": False,
                        "version": f"calibrate-{k}",
                    },
                )
                if report.get("outcome") != "applied":
                    self.failures.append(
                        f"calibration: the sync of weight set {k} failed: "
                        f"{brief(report, 3000)}"
                    )
                    return False
                want = dict(weight_set(self.original, k))[SAMPLED].float()[:8].tolist()
                for slot in self.slots:
                    got = client.get_weights_by_name(slot.url, SAMPLED, truncate_size=8)
                    if torch.tensor(got).flatten().tolist() != want:
                        self.failures.append(
                            f"calibration: {slot.name}: {SAMPLED} is "
                            f"not weight set {k}'s"
                        )
                        return False
                    checksum = client.weights_checksum(slot.url, timeout=60)["checksum"]
                    if k == 0 and checksum != self.checksums[slot.name][0]:
                        self.failures.append(
                            f"calibration: {slot.name}: the checkpoint's "
                            "checksum did not come back after a round trip"
                        )
                        return False
                    self.checksums[slot.name][k] = checksum
            for slot in self.slots:
                if len(set(self.checksums[slot.name])) != WEIGHT_SETS:
                    self.failures.append(
                        f"calibration: {slot.name}: two weight sets share a checksum"
                    )
                    return False
                slot.served, slot.version = 0, "calibrate-0"
        except Exception as e:
            self.failures.append(f"calibration: {type(e).__name__}: {brief(e, 2000)}")
            return False
        return True

    def teardown(self) -> None:
        self.load.shutdown()
        for t in self.threads:
            t.join(self.cfg.request_deadline + 15)
        if self.trainer is not None:
            self.trainer.close()
        for s in self.slots:
            if s.server is not None:
                s.server.stop()

    # --- one sync

    def cycle(self, key: str, options: list[str]) -> str:
        """The next of `options` in seeded shuffled cycles (each once per
        cycle), so that a variant of a fault is not left out by chance."""
        if not self.cycles.get(key):
            self.cycles[key] = self.rng.sample(options, len(options))
        return self.cycles[key].pop()

    def draw(self, kind: str) -> dict[str, Any]:
        """The fault's parameters, from the seeded generator."""
        rng, sizes = self.rng, self.bucket_sizes
        n = len(sizes)
        if kind == "trainer_killed":
            byte = rng.randrange(sum(sizes))
            starts = list(itertools.accumulate([0, *sizes]))
            j = max(i for i in range(n) if starts[i] <= byte)
            return {"byte": byte, "bucket": j, "bucket_offset": byte - starts[j]}
        if kind == "abort":
            moment = self.cycle(kind, ["transfer", "complete_waiting", "verified"])
            if moment == "transfer":
                return {"moment": moment, "after_buckets": rng.randint(0, n)}
            if moment == "complete_waiting":
                return {"moment": moment, "after_buckets": rng.randrange(n)}
            return {"moment": moment}
        if kind == "short_transfer":
            return {"sent": rng.randrange(n), "of": n}
        if kind == "corrupted_bucket":
            j = rng.randrange(n)
            return {
                "bucket": j,
                "offset": rng.randrange(sizes[j]),
                "xor": rng.randrange(1, 256),
            }
        if kind == "wrong_shape":
            how = self.cycle(kind, ["one_row_short", "transposed"])
            # Transposing a square matrix would not change its shape.
            matrices = [
                (k, t)
                for k, t in self.original
                if t.dim() == 2 and (how != "transposed" or t.shape[0] != t.shape[1])
            ]
            name, t = rng.choice(matrices)
            shape = list(_misshape(t, how).shape)
            return {
                "name": name,
                "how": how,
                "model_shape": list(t.shape),
                "sent_shape": shape,
            }
        if kind == "destroy_during_session":
            return {"after_buckets": rng.randint(0, n)}
        if kind == "engine_restart":
            return {"server": self.cycle(kind, [s.name for s in self.slots])}
        return {}

    def restart(self, slot: Slot, why: str) -> dict[str, Any]:
        """Stop and start one server on its port, as an operator would: no new
        request is routed to it meanwhile, those in flight finish first."""
        assert slot.server is not None
        t0 = time.monotonic()
        drained = self.load.close_gate(slot.name, self.cfg.request_deadline + 15)
        port = slot.server.port
        out: dict[str, Any] = {"server": slot.name, "why": why, "drained": drained}
        try:
            slot.server.stop()
            out["stop_s"] = round(time.monotonic() - t0, 1)
            slot.start(port)
            out["ok"] = True
        except Exception as e:
            out.update(ok=False, error=brief(e, 3000))
        finally:
            self.load.open_gate(slot.name)
        out["seconds"] = round(time.monotonic() - t0, 1)
        return out

    def trainer_command(self, rec: dict, key: str, cmd: str, **args: Any) -> dict:
        """Run a trainer command; a trainer that died or hung is replaced and
        reconnects, as a restarted trainer would."""
        assert self.trainer is not None
        answer = self.trainer.call(cmd, **args)
        rec[key] = answer
        if "died" in answer or "hung" in answer:
            self.trainer.kill()
            self.trainer = TrainerProcess(self._trainer_cfg())
            rec.setdefault("trainer_restarts", 0)
            rec["trainer_restarts"] += 1
        return answer

    def run_sync(self, plan: SyncPlan) -> dict[str, Any]:
        cfg = self.cfg
        index, kind, flush, params = (
            plan.index,
            plan.kind,
            plan.flush_cache,
            plan.params,
        )
        old = {s.name: s.served for s in self.slots}
        if kind == "engine_restart":
            old[params["server"]] = 0  # a restarted server loads the checkpoint
        # A set neither server serves, so that old and new always differ.
        fresh_sets = [k for k in range(WEIGHT_SETS) if k not in old.values()]
        target = fresh_sets[int(plan.pick * len(fresh_sets))]
        version = f"soak-{index}-set{target}"
        rec: dict[str, Any] = {
            "sync": index,
            "fault": kind,
            "params": params,
            "flush_cache": flush,
            "set": target,
            "old_sets": old,
            "version": version,
        }
        failures: list[str] = []
        t_start = time.monotonic()
        mark = self.load.snapshot()
        slots = {s.name: s for s in self.slots}

        if kind == "engine_restart":
            restarted = self.restart(slots[params["server"]], "the fault")
            rec["restart"] = restarted
            if not restarted["ok"]:
                failures.append(
                    f"{params['server']}: did not come back: {restarted.get('error')}"
                )
            recovered = self.trainer_command(
                rec, "reconnect", "recover", reconnect=True
            )
            if not recovered.get("ok"):
                failures.append(
                    f"trainer: could not reconnect after the restart: "
                    f"{brief(recovered, 1500)}"
                )

        spec = {
            "set": target,
            "fault": kind,
            "params": params,
            "flush_cache": flush,
            "version": version,
        }
        report = self.trainer_command(rec, "trainer", "sync", spec=spec)
        fresh = "died" in report or "hung" in report
        if kind == "trainer_killed" and report.get("died") != -signal.SIGKILL:
            failures.append(
                f"trainer: expected to die by SIGKILL mid-broadcast, got {report}"
            )
        elif kind != "trainer_killed" and fresh:
            failures.append(f"trainer: {report}")
        elif "error" in report:
            failures.append(f"trainer: {report['error']}")
        claimed = {
            s.name: bool(report.get("applied", {}).get(s.url)) for s in self.slots
        }
        rec["claimed_applied"] = claimed
        if fresh or report.get("outcome") != "applied":
            recovered = self.trainer_command(
                rec,
                "recovery",
                "recover",
                reconnect=fresh or bool(report.get("needs_reconnect")),
            )
            if not recovered.get("ok"):
                failures.append(f"trainer: recovery failed: {brief(recovered, 1500)}")

        rec["checks"] = {}
        broken: list[Slot] = []
        for slot in self.slots:
            slot_failures, is_broken = self.check_server(
                slot, kind, old[slot.name], target, version, claimed[slot.name], rec
            )
            failures += slot_failures
            if is_broken:
                broken.append(slot)

        settled = self.load.settle(time.monotonic(), cfg.request_deadline + 15)
        if not settled:
            failures.append("requests still in flight past their deadline")
        window = self.load.since(mark)
        t_end = time.monotonic()
        rec["requests"] = self.tally(window)
        for o in window:
            if o.result == "lost":
                failures.append(f"{o.slot}: {o.kind} request lost: {o.detail}")
        health = self.load.health_between(t_start, t_end)
        rec["health"] = {
            s.name: self.load.health_200(s.name, t_start, t_end) for s in self.slots
        }
        for name, _, code, body in health:
            if code != 200:
                failures.append(
                    f"{name}: /health answered {code} during the sync: {body}"
                )

        for slot in self.slots:
            self.check_rss(slot, rec, failures)
        rec["log_lines"] = {s.name: s.new_log_lines() for s in self.slots}
        if broken:
            # An operator restarts a server that fails its checks; the soak goes on.
            with cf.ThreadPoolExecutor(len(broken)) as pool:
                rec["repairs"] = list(
                    pool.map(lambda s: self.restart(s, "failed its checks"), broken)
                )
            recovered = self.trainer_command(
                rec, "repair_reconnect", "recover", reconnect=True
            )
            if not recovered.get("ok"):
                failures.append(
                    f"trainer: could not reconnect after the repair: "
                    f"{brief(recovered, 1500)}"
                )
        rec["failures"] = list(dict.fromkeys(failures))
        rec["seconds"] = round(time.monotonic() - t_start, 2)
        return rec

    def check_server(
        self,
        slot: Slot,
        kind: str,
        old: int,
        target: int,
        version: str,
        claimed: bool,
        rec: dict[str, Any],
    ) -> tuple[list[str], bool]:
        """The failures of one server after a sync, and whether it must be
        restarted (dead, unhealthy, not serving, or weights unknown)."""
        name, failures, broken = slot.name, [], False
        out: dict[str, Any] = {}
        rec["checks"][name] = out
        assert slot.server is not None
        if not slot.server.alive():
            failures.append(
                f"{name}: the server exited ({slot.server.proc.returncode})"
            )
            return failures, True
        code, body = client.health_detail(slot.url, timeout=20)
        out["health"] = code
        if code != 200:
            failures.append(
                f"{name}: /health answered {code} after the sync: {brief(body)}"
            )
            broken = True
        t0 = time.monotonic()
        result, detail = generate(
            requests.Session(),
            slot.url,
            token_ids=slot.token_ids,
            stream=False,
            index=0,
            max_new=2,
            deadline_s=self.cfg.request_deadline,
        )
        out["probe"] = {
            "result": result,
            "detail": detail,
            "seconds": round(time.monotonic() - t0, 2),
        }
        if result != "ok":
            failures.append(
                f"{name}: a request after the sync did not complete: {detail}"
            )
            broken = True
        try:
            checksum = client.weights_checksum(slot.url, timeout=60)["checksum"]
        except client.EngineError as e:
            failures.append(f"{name}: /weights_checker failed: {brief(e)}")
            return failures, True
        sums = self.checksums[name]
        label = {sums[old]: "old", sums[target]: "new"}.get(checksum, "mixed")
        out["weights"] = label
        if label == "mixed":
            failures.append(
                f"{name}: serves neither the old (set {old}) nor the new "
                f"(set {target}) weights ({checksum}); the answers said "
                f"{'applied' if claimed else 'not applied'}: {self._why(rec, slot)}"
            )
            broken = True
        elif claimed and label == "old":
            failures.append(
                f"{name}: the answers say applied, but the old weights serve"
            )
        elif not claimed and label == "new":
            failures.append(
                f"{name}: the answers say not applied, but the new weights serve"
            )
        if kind in MUST_APPLY and label != "new":
            failures.append(f"{name}: the sync did not apply ({self._why(rec, slot)})")
        elif kind not in MUST_APPLY and label == "new":
            failures.append(
                f"{name}: the {kind} fault was not caught: the new weights serve"
            )
        try:
            served_version = client.get_weight_version(slot.url)
        except client.EngineError as e:
            served_version = f"unreadable: {e}"
        want = version if label == "new" else slot.version
        out["weight_version"] = served_version
        if label != "mixed" and served_version != want:
            failures.append(
                f"{name}: weight_version is {served_version!r}, serving {label} "
                f"weights whose version is {want!r}"
            )
        if label == "new":
            slot.served, slot.version = target, version
        return failures, broken

    @staticmethod
    def _why(rec: dict[str, Any], slot: Slot) -> str:
        """The trainer's answers from `slot`: the failed ones, else the last."""
        trainer = rec.get("trainer") or {}
        mine = [s for s in trainer.get("steps", []) if s["engine"] in (slot.url, "*")]
        bad = [s for s in mine if not s["ok"]] or mine[-1:]
        if not bad:
            return f"trainer: {brief(trainer, 300)}"
        return "; ".join(
            f"{s['step']}: HTTP {s.get('status')}: {s.get('message')}" for s in bad
        )

    def check_rss(self, slot: Slot, rec: dict[str, Any], failures: list[str]) -> None:
        rss = slot.rss()
        rec.setdefault("rss_mb", {})[slot.name] = round(rss / 2**20, 1)
        if slot.rss_base is None:
            slot.rss_base = rss  # its level after its first sync
            return
        growth = (rss - slot.rss_base) / slot.rss_base * 100
        rec.setdefault("rss_growth_pct", {})[slot.name] = round(growth, 2)
        if abs(growth) > RSS_TOLERANCE_PCT:
            failures.append(
                f"{slot.name}: RSS {rss / 2**20:.0f} MiB is {growth:+.1f} % from "
                f"{slot.rss_base / 2**20:.0f} MiB after its first sync"
            )

    @staticmethod
    def tally(window: list[Outcome]) -> dict[str, Any]:
        out: dict[str, Any] = {
            r: sum(o.result == r for o in window) for r in ("ok", "error", "lost")
        }
        errors = [
            f"{o.slot} {o.kind}: {o.detail}" for o in window if o.result == "error"
        ]
        out["errors"] = list(dict.fromkeys(errors))[:10]
        return out

    # --- the run

    def plan(self) -> list[SyncPlan]:
        """Every sync's fault, drawn before the first one runs, so that a seed
        gives the same faults whatever the servers do: the kinds in seeded
        rounds (each kind once per round, in a random order), then each one's
        parameters and flush_cache."""
        kinds: list[str] = []
        while len(kinds) < self.cfg.syncs:
            round_ = list(self.cfg.faults)
            self.rng.shuffle(round_)
            kinds += round_
        plans = []
        for index, kind in enumerate(kinds[: self.cfg.syncs], start=1):
            flush = {"true": True, "false": False}.get(self.cfg.flush_cache)
            if flush is None:
                flush = self.rng.random() < 0.5
            params = self.draw(kind)
            plans.append(SyncPlan(index, kind, flush, params, self.rng.random()))
        return plans

    def run(self) -> None:
        plans = self.plan()
        if not self.start():
            return
        warmup = self.load.since(0)
        self.end_mark = (len(warmup), time.monotonic())
        self.failures += [
            f"setup: {o.slot}: {o.kind} request lost before the first sync: {o.detail}"
            for o in warmup
            if o.result == "lost"
        ]
        for plan in plans:
            index, kind = plan.index, plan.kind
            if time.monotonic() - self.t0 > self.cfg.max_seconds:
                self.failures.append(
                    f"stopped before sync {index}: past --max-seconds "
                    f"{self.cfg.max_seconds:.0f}"
                )
                break
            rec = self.run_sync(plan)
            self.records.append(rec)
            self.end_mark = (self.load.snapshot(), time.monotonic())
            self.failures += [f"sync {index} ({kind}): {f}" for f in rec["failures"]]
            print_row(rec)
            if any(s.server is None or not s.server.alive() for s in self.slots):
                self.failures.append(f"stopped after sync {index}: a server is down")
                self.load.shutdown()
                break

    def report(self) -> dict[str, Any]:
        outcomes, t_end = self.load.since(0), float("inf")
        if self.end_mark is not None:
            outcomes, t_end = outcomes[: self.end_mark[0]], self.end_mark[1]
        growth: dict[str, Optional[float]] = {}
        for slot in self.slots:
            values = [
                r["rss_growth_pct"][slot.name]
                for r in self.records
                if slot.name in r.get("rss_growth_pct", {})
            ]
            growth[slot.name] = max(values, key=abs) if values else None
        faults = {
            k: sum(r["fault"] == k for r in self.records) for k in self.cfg.faults
        }
        failed_kinds = {
            k: sum(r["fault"] == k and bool(r["failures"]) for r in self.records)
            for k in self.cfg.faults
        }
        return {
            "syncs": len(self.records),
            "syncs_asked": self.cfg.syncs,
            "seed": self.cfg.seed,
            "faults": faults,
            "failed_syncs_by_fault": failed_kinds,
            "flush_cache": {
                "true": sum(r["flush_cache"] for r in self.records),
                "false": sum(not r["flush_cache"] for r in self.records),
            },
            "lost_requests": sum(o.result == "lost" for o in outcomes),
            "clean_errors": sum(o.result == "error" for o in outcomes),
            "completed_requests": sum(o.result == "ok" for o in outcomes),
            "mixed_weights": sum(
                c.get("weights") == "mixed"
                for r in self.records
                for c in r["checks"].values()
            ),
            "health_checks": {
                s.name: self.load.health_200(s.name, 0.0, t_end) for s in self.slots
            },
            "rss_growth_pct": growth,
            "server_restarts": {s.name: max(s.launches - 1, 0) for s in self.slots},
            "seconds": round(time.monotonic() - self.t0, 1),
            "machine": self.machine,
            "servers": [
                {"name": s.name, "tp": s.tp, "skip_tokenizer_init": s.token_ids}
                for s in self.slots
            ],
            "config": dataclasses.asdict(self.cfg),
            "setup": self.setup,
            "checksums": self.checksums,
            "failures": self.failures,
            "log": self.records,
        }


def machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gb": round(psutil.virtual_memory().total / 1e9, 1),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "sglang": metadata.version("sglang"),
        # The version names a series; this names the files installed under it.
        "sglang_record_sha256": hashlib.sha256(
            (metadata.distribution("sglang").read_text("RECORD") or "").encode()
        ).hexdigest()[:16],
        "platform": platform.platform(),
    }


def print_row(rec: dict[str, Any]) -> None:
    if rec["sync"] == 1:
        print(
            f"{'sync':<5} {'fault':<23} {'flush':<6} {'set':<4} {'seconds':<8} "
            f"{'requests ok/err/lost':<21} {'tp1':<6} {'tp2':<6} result",
            flush=True,
        )
    req = rec["requests"]
    weights = [rec["checks"].get(n, {}).get("weights", "?") for n in ("tp1", "tp2")]
    result = "ok" if not rec["failures"] else f"FAILED ({len(rec['failures'])})"
    print(
        f"{rec['sync']:<5} {rec['fault']:<23} {str(rec['flush_cache']).lower():<6} "
        f"{rec['set']:<4} {rec['seconds']:<8.1f} "
        f"{str(req['ok']) + '/' + str(req['error']) + '/' + str(req['lost']):<21} "
        f"{weights[0]:<6} {weights[1]:<6} {result}",
        flush=True,
    )


def print_summary(report: dict[str, Any]) -> None:
    m = report["machine"]
    print(
        f"\nsoak: {report['syncs']}/{report['syncs_asked']} syncs, seed {report['seed']}, "
        f"{report['seconds']:.0f} s on {m['cpu']} ({m['cores']} cores)"
    )
    print(
        "faults: "
        + ", ".join(f"{k} {v}" for k, v in report["faults"].items())
        + f"; flush_cache true {report['flush_cache']['true']}, "
        f"false {report['flush_cache']['false']}"
    )
    print(
        f"requests: {report['completed_requests']} completed, {report['clean_errors']} "
        f"clean errors, {report['lost_requests']} lost; health 200: "
        + ", ".join(f"{k} {v}" for k, v in report["health_checks"].items())
    )
    growth = ", ".join(
        f"{k} {'n/a' if v is None else f'{v:+.1f} %'}"
        for k, v in report["rss_growth_pct"].items()
    )
    print(
        f"weights: {report['mixed_weights']} mixed; RSS growth: {growth}; server "
        f"restarts: {report['server_restarts']}"
    )
    print(
        "failed syncs by fault: "
        + ", ".join(
            f"{k} {report['failed_syncs_by_fault'][k]}/{v}"
            for k, v in report["faults"].items()
        )
    )


def parse_args(argv: Optional[list[str]]) -> SoakConfig:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--syncs", type=int, default=30)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="results file (default bench/results/soak-<date>.json)",
    )
    parser.add_argument(
        "--faults",
        default=",".join(FAULTS),
        help=f"comma-separated fault kinds to draw from: {','.join(FAULTS)}",
    )
    parser.add_argument(
        "--flush-cache", choices=("random", "true", "false"), default="random"
    )
    parser.add_argument(
        "--skip-tokenizer-init",
        choices=("tp1", "tp2", "none"),
        default="tp2",
        help="the server started token-in/token-out",
    )
    parser.add_argument("--streaming-clients", type=int, default=2)
    parser.add_argument("--plain-clients", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument(
        "--pause-ms", type=int, default=100, help="pause between a client's requests"
    )
    parser.add_argument("--request-deadline", type=float, default=60.0)
    parser.add_argument("--bucket-kb", type=int, default=32)
    parser.add_argument("--max-seconds", type=float, default=3600.0)
    parser.add_argument(
        "--dry-run", action="store_true", help="print the faults a seed draws, run none"
    )
    args = parser.parse_args(argv)
    faults = tuple(f.strip() for f in args.faults.split(",") if f.strip())
    unknown = [f for f in faults if f not in FAULTS]
    if unknown or not faults:
        parser.error(f"--faults: unknown {unknown}; choose from {','.join(FAULTS)}")
    if args.syncs < 1:
        parser.error("--syncs must be >= 1")
    return SoakConfig(
        syncs=args.syncs,
        seed=args.seed,
        faults=faults,
        flush_cache=args.flush_cache,
        token_ids_on=args.skip_tokenizer_init,
        streaming_clients=args.streaming_clients,
        plain_clients=args.plain_clients,
        max_new_tokens=args.max_new_tokens,
        pause=args.pause_ms / 1000,
        request_deadline=args.request_deadline,
        bucket_bytes=args.bucket_kb << 10,
        max_seconds=args.max_seconds,
        dry_run=args.dry_run,
        out=args.out,
    )


def main(argv: Optional[list[str]] = None) -> int:
    cfg = parse_args(argv)
    torch.set_num_threads(1)  # the servers need the cores more than we do
    soak = Soak(cfg)
    if cfg.dry_run:
        for plan in soak.plan():
            print(json.dumps(dataclasses.asdict(plan)))
        return 0
    try:
        soak.run()
    except BaseException as e:
        soak.failures.append(f"soak: {type(e).__name__}: {brief(e, 2000)}")
        if not isinstance(e, Exception):
            raise
    finally:
        soak.teardown()
    report = soak.report()
    out = cfg.out or ROOT / "bench" / "results" / f"soak-{datetime.date.today()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1, default=str) + "\n")
    print_summary(report)
    print(f"results: {out}")
    if soak.failures:
        print(
            f"\nFAILED checks ({len(soak.failures)}):\n  " + "\n  ".join(soak.failures)
        )
        evidence = [
            f"sync {r['sync']} ({r['fault']}) {name}: {line}"
            for r in soak.records
            if r["failures"]
            for name, lines in r["log_lines"].items()
            for line in lines[:6]
        ]
        if evidence:
            print("\nserver log lines at the failed syncs:\n  " + "\n  ".join(evidence))
        return 1
    print("\nall checks held")
    return 0


if __name__ == "__main__":
    sys.exit(main())
