"""The soak's trainer: rank 0 of the update group, in a process of its own,
driving `WeightSender` itself. Each sync's fault goes in through the
sender's seams (`harness.soak.faults`); every answer is recorded as the
parent checks it."""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing as mp
import os
import signal
import threading
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any, Callable, Iterator, Optional

import torch
from safetensors.torch import load_file

from harness.cpu_sglang import free_port
from harness.soak.common import GROUP, Named, brief, weight_set
from harness.soak.faults import FaultInjected, FaultyWire, misshape
from rlsync import client
from rlsync.planner import TensorSpec, plan_spec_buckets
from rlsync.sender import Engine, SyncError, SyncResult, WeightSender

TRAINER_TIMEOUT = 60.0  # every weight-update HTTP call and collective
TRAINER_DEADLINE = 300.0  # the parent's wait for one trainer command
# The sender's timeout during a short transfer: how long complete waits for
# the buckets that never come.
SHORT_WAIT = 5.0


def _benign(entry: dict[str, Any]) -> bool:
    """A recovery call that found nothing to undo."""
    message = entry.get("message", "")
    return not entry["ok"] and (
        "no weight update session is open" in message
        or "group_name: no update group" in message
    )


def _outcomes(result: Optional[SyncResult]) -> list[dict[str, Any]]:
    """One step per engine from a sync's result."""
    if result is None:
        return []
    return [
        {
            "step": "complete",
            "engine": o.url,
            "ok": o.answered,
            "message": brief(o.message),
            "body": {"applied": o.applied, "ready_to_apply": o.ready_to_apply},
        }
        for o in result.engines
    ]


class SoakTrainer:
    def __init__(self, cfg: dict[str, Any]) -> None:
        self.engines = [Engine(url, tp) for url, tp in cfg["engines"]]
        self.bucket_bytes: int = cfg["bucket_bytes"]
        self.original: Named = list(load_file(cfg["weights"]).items())
        self.sender: Optional[WeightSender] = None
        self.wire = FaultyWire()
        self.pool = cf.ThreadPoolExecutor(max_workers=4 * len(self.engines))

    # --- calls another party makes (the operator, a watchdog thread)

    def _record(self, step: str, engine: Engine, fn: Callable[[Engine], Any]) -> dict:
        """fn(engine)'s answer or error, as one entry of a sync's steps."""
        t0 = time.monotonic()
        entry: dict[str, Any] = {"step": step, "engine": engine.url, "ok": False}
        try:
            answer = fn(engine)
            body = answer if isinstance(answer, dict) else vars(answer)
            entry.update(ok=True, status=200, message=brief(body.get("message") or ""))
            entry["body"] = {"group_usable": body.get("group_usable")}
        except client.EngineError as e:
            entry.update(status=e.status, message=brief(e.message))
            if isinstance(e.body, dict) and "group_usable" in e.body:
                entry["body"] = {"group_usable": e.body["group_usable"]}
        except Exception as e:
            entry.update(status=None, message=brief(f"{type(e).__name__}: {e}"))
        entry["seconds"] = round(time.monotonic() - t0, 3)
        return entry

    def _each(self, step: str, fn: Callable[[Engine], Any]) -> list[dict]:
        futures = [self.pool.submit(self._record, step, e, fn) for e in self.engines]
        return [f.result() for f in futures]

    def _abort_all(self, session_id: Optional[str]) -> list[dict]:
        """Abort on every engine: the session named, or (None) whatever is
        open, as an operator fences a trainer that is gone."""
        named = {} if session_id is None else {"session_id": session_id}
        return self._each(
            "abort",
            lambda e: client.abort_weights_update(
                e.url, group_name=GROUP, timeout=TRAINER_TIMEOUT, **named
            ),
        )

    def _destroy_all(self) -> list[dict]:
        return self._each(
            "destroy",
            lambda e: client.destroy_weights_update_group(
                e.url, group_name=GROUP, timeout=TRAINER_TIMEOUT
            ),
        )

    # --- commands from the parent

    def connect(self) -> dict[str, Any]:
        port = free_port()
        sender = WeightSender(
            self.engines,
            master_port=port,
            group_name=GROUP,
            backend="gloo",
            bucket_bytes=self.bucket_bytes,
            timeout=TRAINER_TIMEOUT,
            wire=self.wire,
        )
        t0 = time.monotonic()
        try:
            sender.connect()
        except SyncError as e:
            return {"ok": False, "message": brief(str(e), 2000)}
        self.sender = sender
        return {"ok": True, "port": port, "seconds": round(time.monotonic() - t0, 3)}

    def recover(self, reconnect: bool) -> dict[str, Any]:
        """What a trainer does after a failed sync: the sender closed its own
        sessions; a new trainer (`reconnect` and no sender) first fences the
        dead one's (abort and destroy, no session id); the group is
        re-initialised where the sync said it must be (or the caller knows
        it must: a new trainer, a restarted engine)."""
        out: dict[str, Any] = {"reconnected": reconnect or self.sender is None}
        steps: list[dict] = []
        if not out["reconnected"]:
            out.update(ok=True, steps=steps)
            return out
        if self.sender is not None:
            self.sender.close()  # destroys the group everywhere, leaves ours
            self.sender = None
        else:  # a new trainer: the engines may still hold the dead one's
            steps += self._abort_all(None)
            steps += self._destroy_all()
        out["steps"] = steps
        out["connect"] = self.connect()
        out["ok"] = all(s["ok"] or _benign(s) for s in steps) and out["connect"]["ok"]
        return out

    def sync(self, spec: dict[str, Any]) -> dict[str, Any]:
        if self.sender is None:
            return {
                "steps": [],
                "applied": {},
                "outcome": "no update group",
                "needs_reconnect": True,
            }
        t0 = time.monotonic()
        steps: list[dict] = []
        self.wire.disarm()
        try:
            result = self._sync_with_fault(spec, steps)
        except SyncError as e:
            steps += _outcomes(e.result)
            steps.append(
                {
                    "step": e.step,
                    "engine": "*",
                    "ok": False,
                    "message": brief(str(e), 2000),
                }
            )
            applied = {o.url: o.applied for o in (e.result.engines if e.result else [])}
            return {
                "steps": steps,
                "applied": applied,
                "outcome": f"failed at {e.step}",
                "group_usable": e.group_usable,
                "needs_reconnect": not e.group_usable
                or any(s.get("body", {}).get("group_usable") is False for s in steps),
                "dropped_broadcasts": self.wire.dropped,
                "seconds": round(time.monotonic() - t0, 3),
            }
        finally:
            self.wire.disarm()
            if self.sender is not None:
                self.sender.timeout = TRAINER_TIMEOUT
        steps += _outcomes(result)
        applied = {o.url: o.applied for o in result.engines}
        unusable = any(s.get("body", {}).get("group_usable") is False for s in steps)
        return {
            "steps": steps,
            "applied": applied,
            "outcome": "applied" if all(applied.values()) else "not applied",
            "group_usable": not unusable,
            "needs_reconnect": unusable,
            "seconds": round(time.monotonic() - t0, 3),
        }

    def _sync_with_fault(self, spec: dict[str, Any], steps: list[dict]) -> SyncResult:
        """One `WeightSender` sync carrying `spec`'s fault. A SyncError is
        the sender's own answer; the steps another party took meanwhile
        are appended to `steps`."""
        sender, wire = self.sender, self.wire
        assert sender is not None
        named = list(weight_set(self.original, spec["set"]))
        kind, p, version = spec["fault"], spec["params"], spec["version"]
        if kind == "trainer_killed":

            def die_with_bucket_on_the_wire(sent: int, total: int, nbytes: int) -> None:
                if sent == p["bucket"] + 1:  # its broadcast was just posted
                    os.kill(os.getpid(), signal.SIGKILL)

            return sender.sync(
                named, version, atomic=True, progress=die_with_bucket_on_the_wire
            )
        if kind == "abort" and p["moment"] == "transfer":
            return sender.sync_stream(
                [TensorSpec.of(n, t) for n, t in named],
                self._failing_at_bucket(named, p["bucket"]),
                version,
                atomic=True,
            )
        if kind == "abort" and p["moment"] == "verified":
            result = sender.sync(named, version, apply=False)
            steps += _outcomes(result)
            steps += self._abort_all(result.session_id)
            raise SyncError("verify", "aborted after every engine verified")
        if kind == "abort" and p["moment"] == "complete_waiting":
            wire.drop_from = p["bucket"]
            watcher = self.pool.submit(self._abort_once_complete_waits)
            try:
                return sender.sync(named, version, atomic=True)
            finally:
                steps += watcher.result()
        if kind == "short_transfer":
            wire.drop_from = p["bucket"]
            sender.timeout = SHORT_WAIT  # restored by sync()
            return sender.sync(named, version, atomic=True)
        if kind == "corrupted_bucket":
            wire.corrupt = (p["bucket"], p["offset"], p["xor"])
            return sender.sync(named, version, atomic=True)
        if kind == "wrong_shape":
            named = [
                (n, misshape(t, p["how"]) if n == p["name"] else t) for n, t in named
            ]
            return sender.sync(named, version, atomic=True)
        if kind == "destroy_during_session":

            def operator_destroys() -> None:
                steps.extend(self._destroy_all())

            wire.fail_before = (p["bucket"], operator_destroys)
            return sender.sync(named, version, atomic=True)
        return sender.sync(named, version, atomic=True, flush_cache=spec["flush_cache"])

    def _failing_at_bucket(self, named: Named, bucket: int) -> Iterator[torch.Tensor]:
        """The tensors, until the first of `bucket` is asked for: then the
        trainer's own code fails (an exception the sender did not raise)."""
        plans = plan_spec_buckets(
            [TensorSpec.of(n, t) for n, t in named], self.bucket_bytes
        )
        first = sum(len(plan.specs) for plan in plans[:bucket])
        for index, (_, tensor) in enumerate(named):
            if index == first:
                raise FaultInjected(f"the trainer failed before bucket {bucket}")
            yield tensor

    def _abort_once_complete_waits(self) -> list[dict]:
        """Another thread of the trainer (a watchdog): once every engine's
        complete waits for the buckets that never come, abort the session."""
        deadline = time.monotonic() + 30.0
        pending = {e.url for e in self.engines}
        tick = threading.Event()
        while pending and time.monotonic() < deadline:
            for url in list(pending):
                if (
                    "complete_weights_update"
                    in client.health_detail(url, timeout=10)[1]
                ):
                    pending.discard(url)
            tick.wait(0.02)
        steps = [{"step": "complete seen waiting", "engine": "*", "ok": not pending}]
        assert self.sender is not None
        return steps + self._abort_all(self.sender.session_id)

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
