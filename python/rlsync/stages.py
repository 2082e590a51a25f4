"""One atomic update that several senders stream, each over its own update
group: `StageSender`.

A pipeline-parallel trainer holds each stage's layers on that stage's ranks
only. Instead of gathering every stage onto one rank (memory) or syncing
stage by stage (engines serving a mix of old and new layers in between),
each stage's sending rank creates its own update group to every engine and
streams its own layers, and one session on each engine spans every stage's
group: the engines apply the whole update once, when every share has
arrived and verified, or nothing.

The stage senders coordinate over `coordination`, a torch.distributed
process group (gloo) of the stage senders alone; its rank 0 is the
coordinator, which opens the session on every engine (one prepare naming
every stage's group and buckets), then completes or aborts it. `sync()` is a
collective over `coordination`: every stage calls it with its own tensors,
and every stage returns the same `SyncResult` or raises the same
`SyncError`. A stage that fails while alive aborts in band on its group;
a stage that dies (or never calls `sync()`) leaves the others' collective
on `coordination` to fail at its timeout, as a `SyncError`, and the engines
keep the old weights until the session is aborted.

    coordination = dist.new_group(stage_senders, backend="gloo")
    sender = StageSender(engines, coordination=coordination,
                         group_name=f"rlsync-pp{stage}", master_port=port + stage)
    sender.connect()
    sender.sync(stage_state_dict, weight_version=str(step), atomic=True)
"""

from __future__ import annotations

import time
from typing import Any, Optional, Union

import torch.distributed as dist

from rlsync import client
from rlsync.digest import digest_tensors
from rlsync.framing import BucketFraming, abort_on_failure
from rlsync.planner import TensorSpec, plan_spec_buckets
from rlsync.sender import (
    IN_BAND_ABORT_FEATURE,
    EngineOutcome,
    Progress,
    SyncError,
    SyncResult,
    WeightSender,
    _answered_an_error,
    _awaits_abort_header,
    _never_reached,
    progress_bar,
)
from rlsync.stream import TensorStream, Weights, named_tensors

# Engines with it take one session over several update groups.
MULTI_GROUP_FEATURE = "multi_group_sessions"


class StageSender(WeightSender):
    def __init__(self, engines, *, coordination: dist.ProcessGroup, **kwargs: Any):
        """`coordination`: the process group of every stage's sender (this
        one included); its rank 0 coordinates. Each stage's `group_name`
        and `master_port` must be its own. Other arguments as for
        `WeightSender`."""
        super().__init__(engines, **kwargs)
        self.coordination = coordination
        self.stage = dist.get_rank(coordination)
        self.stages = dist.get_world_size(coordination)
        self._coordinator = dist.get_global_rank(coordination, 0)

    @property
    def is_coordinator(self) -> bool:
        return self.stage == 0

    def sync(
        self,
        weights: Weights,
        weight_version: Optional[str] = None,
        atomic: bool = False,
        progress: Union[bool, Progress] = False,
        flush_cache: Optional[bool] = None,
        apply: bool = True,
    ) -> SyncResult:
        """This stage's share of one update (no tensor in two stages'); a
        collective over `coordination`. Arguments and failures as for
        `WeightSender.sync`, for the whole update: it applies on every
        engine once every stage's share arrived and verified, or nowhere."""
        started = time.perf_counter()
        plans, pairs, share, problem = [], [], None, None
        try:
            if self.group is None:
                raise RuntimeError("call connect() first")
            pairs = list(named_tensors(weights))
            plans = plan_spec_buckets(
                [TensorSpec.of(name, t) for name, t in pairs], self.bucket_bytes
            )
            tensors = iter(t for _, t in pairs)
            share = {
                "group_name": self.group_name,
                "nbytes": sum(plan.nbytes for plan in plans),
                "buckets": [
                    plan.metadata(
                        digest_tensors([next(tensors) for _ in plan.specs])
                        if self.digests
                        else None
                    )
                    for plan in plans
                ],
            }
        except Exception as e:
            problem = f"stage {self.stage}: {type(e).__name__}: {e}"
        try:
            shares = self._gather({"share": share, "problem": problem})
        except Exception as e:  # a stage died, or never called sync
            raise SyncError(
                "prepare",
                f"the stages lost each other before the update "
                f"({type(e).__name__}: {e}); nothing was sent",
            ) from e
        names = [s["share"]["group_name"] for s in shares if s["share"]]
        problems = [s["problem"] for s in shares if s["problem"]]
        if len(set(names)) != len(names):
            problems.append(f"two stages send over one group: {names}")
        if problems:
            raise SyncError("prepare", "; ".join(problems) + "; nothing was sent")
        decision = None
        if self.is_coordinator:
            decision = self._prepare_every_engine(
                [s["share"] for s in shares], weight_version
            )
        try:
            decision = self._from_coordinator(decision)
        except Exception as e:  # the coordinator died while it prepared
            raise SyncError(
                "prepare",
                f"the coordinator was lost while it opened the session "
                f"({type(e).__name__}: {e}); nothing was sent; the engines keep "
                f"the old weights, and a session it opened holds until aborted",
                group_usable=False,
            ) from e
        self.session_id = decision["session_id"]
        framing = None
        if decision["framed"]:
            device = self.device or ("cuda" if self.backend == "nccl" else "cpu")
            framing = BucketFraming(
                self.session_id, self.group, len(plans), device, self.wire
            )

        if decision["state"] == "ready":
            report = progress_bar() if progress is True else (progress or None)
            status: dict[str, Any] = {"ok": True}
            try:
                specs = [spec for plan in plans for spec in plan.specs]
                self._broadcast(
                    plans, TensorStream(specs, pairs), report, False, False, framing
                )
            except BaseException as exc:
                status = {
                    "ok": False,
                    "error": f"stage {self.stage}: {type(exc).__name__}: {exc}",
                }
            status["aborted"] = framing is not None and framing.aborted
        else:
            if decision["state"] == "abort_in_band":
                abort_on_failure(framing, None)
            status = {"ok": False, "aborted": framing is not None and framing.aborted}
        try:
            statuses = self._gather(status)
        except Exception as e:  # a stage is gone: its share never arrives
            aborted = self._abort_all() if self.is_coordinator else "not aborted here"
            raise SyncError(
                "broadcast",
                f"the stages lost each other ({type(e).__name__}: {e}); "
                f"every engine aborted by the coordinator ({aborted or 'ok'})",
                group_usable=False,
            ) from e

        outcome = None
        if self.is_coordinator:
            outcome = self._end_session(
                decision,
                statuses,
                [s["share"] for s in shares],
                started,
                weight_version=weight_version,
                atomic=atomic,
                flush_cache=flush_cache,
                apply=apply,
            )
        try:
            outcome = self._from_coordinator(outcome)
        except Exception as e:  # the coordinator died while it ended the session
            raise SyncError(
                "apply",
                f"the coordinator was lost before it said how the update ended "
                f"({type(e).__name__}: {e}); ask the engines' weight version",
                group_usable=False,
            ) from e
        if "error" in outcome:
            step, message, result, usable = outcome["error"]
            raise SyncError(step, message, result, group_usable=usable)
        return outcome["result"]

    # --- the coordinator -------------------------------------------------------

    def _prepare_every_engine(
        self, shares: list[dict[str, Any]], weight_version: Optional[str]
    ) -> dict[str, Any]:
        """Open the session on every engine: "ready", "abort_in_band" (every
        engine refused a framed prepare and waits for the abort headers) or
        "failed" (the engines that may have opened one aborted)."""
        lacking = [
            e.url
            for e in self.engines
            if MULTI_GROUP_FEATURE not in self.features.get(e.url, ())
        ]
        if lacking and len(shares) > 1:
            return {
                "state": "failed",
                "session_id": None,
                "framed": False,
                "message": f"{', '.join(lacking)}: the server's rlsync series has "
                f"no {MULTI_GROUP_FEATURE} (one session over several groups); "
                f"upgrade it",
            }
        self._abort_stale()
        self.session_id = self._new_session_id()
        framed = (
            self.in_band_abort
            and self.session_id is not None
            and all(
                IN_BAND_ABORT_FEATURE in self.features.get(e.url, ())
                for e in self.engines
            )
        )
        first, others = shares[0], shares[1:]
        session = {} if self.session_id is None else {"session_id": self.session_id}
        prepared = self._each(
            lambda e: client.prepare_weights_update(
                e.url,
                first["buckets"],
                group_name=first["group_name"],
                shares={s["group_name"]: s["buckets"] for s in others} or None,
                load_format=self.load_format,
                weight_version=weight_version,
                framed=framed,
                timeout=self.timeout,
                **session,
                **e.keys,
            )
        )
        decision = {"session_id": self.session_id, "framed": framed}
        failed = [(e, r) for e, r in prepared if isinstance(r, Exception)]
        if not failed:
            return {**decision, "state": "ready"}
        message = "; ".join(f"{e.url}: {r}" for e, r in failed)
        if framed and all(_awaits_abort_header(r) for _, r in failed):
            return {**decision, "state": "abort_in_band", "message": message}
        opened = [
            e
            for e, r in prepared
            if not isinstance(r, Exception)
            or _awaits_abort_header(r)
            or not (_answered_an_error(r) or _never_reached(r))
        ]
        aborted = self._abort_all(opened)
        return {
            **decision,
            "state": "failed",
            "message": f"{message} (others aborted: {aborted or 'ok'})",
            "group_usable": aborted.group_usable,
        }

    def _end_session(
        self,
        decision: dict[str, Any],
        statuses: list[dict[str, Any]],
        shares: list[dict[str, Any]],
        started: float,
        **complete: Any,
    ) -> dict[str, Any]:
        """Complete the session where every stage sent its share; else
        abort it (saying on which groups the sender aborted in band)."""
        if decision["state"] == "failed":
            return {
                "error": (
                    "prepare",
                    decision["message"],
                    None,
                    decision.get("group_usable", True),
                )
            }
        in_band = [
            share["group_name"]
            for share, status in zip(shares, statuses)
            if status["aborted"]
        ]
        headers = {"abort_header_sent_groups": in_band} if decision["framed"] else {}
        if decision["state"] == "abort_in_band":
            aborted = self._abort_all(**headers)
            return {
                "error": (
                    "prepare",
                    f"{decision['message']} (every engine aborted: "
                    f"{aborted or 'groups usable'})",
                    None,
                    aborted.group_usable,
                )
            }
        failed = [s["error"] for s in statuses if not s["ok"]]
        if failed:
            aborted = self._abort_all(**headers)
            return {
                "error": (
                    "broadcast",
                    f"{'; '.join(failed)}; every engine aborted "
                    f"({aborted or 'groups usable'})",
                    None,
                    aborted.group_usable,
                )
            }
        total = sum(share["nbytes"] for share in shares)
        buckets = sum(len(share["buckets"]) for share in shares)

        def result_of(outcomes: list[EngineOutcome], calls: int) -> SyncResult:
            return SyncResult(
                bytes=total,
                buckets=buckets,
                seconds=time.perf_counter() - started,
                http_calls=calls,
                weight_version=complete["weight_version"],
                engines=outcomes,
                digests=self.digests,
                session_id=self.session_id,
            )

        try:
            result = self._complete_sync(result_of, len(self.engines), None, **complete)
        except SyncError as e:
            return {"error": (e.step, e.message, e.result, e.group_usable)}
        return {"result": result}

    # --- over `coordination` ------------------------------------------------------

    def _gather(self, obj: dict[str, Any]) -> list[dict[str, Any]]:
        out: list[Any] = [None] * self.stages
        dist.all_gather_object(out, obj, group=self.coordination)
        return out

    def _from_coordinator(self, obj: Optional[dict[str, Any]]) -> dict[str, Any]:
        box = [obj]
        dist.broadcast_object_list(box, src=self._coordinator, group=self.coordination)
        return box[0]
