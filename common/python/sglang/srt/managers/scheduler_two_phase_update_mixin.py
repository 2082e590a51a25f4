"""Two-phase weight update on the scheduler: prepare, complete, abort.

`prepare` validates the whole update, reserves staging and starts the
receiver (`StagedWeightReceiver`, its own thread) before it answers, so the
trainer can broadcast at once: the race of the single-phase path is gone.
Serving goes on during the transfer. Each rank stages what it keeps: every
bucket passes through a small ring of bucket buffers into the model's own
loader, which writes a shadow of the rank's parameters (`ShadowParameters`,
in device or pinned host memory). `complete` waits for the receiver, verifies
every bucket on every TP rank, and only then applies, copying shadow into
live in one step between two batches: a failed, short or corrupted update
leaves the old weights serving.

What reads the scheduler's internals is asked of
`SchedulerTwoPhaseUpdateHooks` (scheduler_two_phase_update_hooks.py):
where the update groups live, its request sockets, its own weight-update
session, which models the update loads into.
So is whether this rank records the sync's metrics
(weight_sync/sync_metrics.py, with --enable-metrics).
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

import torch
import zmq

from sglang.srt.managers.io_struct import (
    AbortWeightsUpdateReqInput,
    AbortWeightsUpdateReqOutput,
    CompleteWeightsUpdateReqInput,
    CompleteWeightsUpdateReqOutput,
    PrepareWeightsUpdateReqInput,
    PrepareWeightsUpdateReqOutput,
)
from sglang.srt.managers.scheduler_two_phase_update_hooks import (
    SchedulerTwoPhaseUpdateHooks,
)
from sglang.srt.managers.weight_op_results import gather_from_tp_ranks
from sglang.srt.managers.weight_update_health import (
    pause_watchdogs_during_weight_update,
)
from sglang.srt.weight_sync.load_check import (
    LoadCheckError,
    check_declared_shapes,
    check_loadable,
)
from sglang.srt.weight_sync.session_shares import (
    SerialSink,
    SharedSessionReceiver,
    check_one_owner,
    parse_shares,
)
from sglang.srt.weight_sync.shadow_params import (
    ShadowParameters,
    staged_copy_bytes,
    unsupported_post_processing,
)
from sglang.srt.weight_sync.staged_receiver import (
    RING_BUCKETS,
    GroupReceiver,
    RefusedSessionReceiver,
    StagedWeightReceiver,
    StagingPool,
    WeightsUpdateError,
    check_digest_format,
    ring_bytes,
)
from sglang.srt.weight_sync.sync_metrics import (
    ABORTED,
    APPLIED,
    APPLY_ERROR,
    CACHE_FLUSH_ERROR,
    DIGEST_MISMATCH,
    FAILED,
    RECEIVE_ERROR,
    REJECTED,
    WeightSyncMetrics,
    weight_sync_metrics,
)

if TYPE_CHECKING:
    from sglang.srt.managers.scheduler import Scheduler

logger = logging.getLogger(__name__)

DEFAULT_COMPLETE_TIMEOUT = 300.0
# How long an idle scheduler waits on its sockets while a receive runs; a
# request wakes it at once.
_IDLE_POLL_MS = 50
# Ended sessions remembered (id -> how it ended): a late call naming one is
# told so, and a prepare may not reuse its id.
_ENDED_SESSIONS_KEPT = 1024
# How long an abort waits for a receiver to see the sender's abort header.
_ABORT_HEADER_GRACE_S = 5.0


@dataclass
class _Session:
    group_name: str
    # One receiver, or (a session of several groups) a SharedSessionReceiver
    receiver: Any
    # Chosen by the tokenizer manager (or the caller) at prepare; complete,
    # abort and destroy that name another session change nothing.
    session_id: Optional[str] = None
    # A framed prepare that was refused (why): the session only waits for
    # the sender's abort header, then for an abort
    refused: Optional[str] = None
    weight_version: Optional[str] = None
    verified: bool = False
    shadow: Optional[ShadowParameters] = None
    # Seconds the scheduler spent in this session's complete calls.
    serving_stall_seconds: float = 0.0
    # The other groups that send a share of the update (prepare's `shares`)
    other_groups: Tuple[str, ...] = ()

    @property
    def group_names(self) -> Tuple[str, ...]:
        return (self.group_name, *self.other_groups)

    def groups_text(self) -> str:
        return ", ".join(f"'{name}'" for name in self.group_names)


@dataclass
class _EndedSession:
    outcome: str
    group_name: str
    group_names: Tuple[str, ...] = ()
    # Its groups destroyed since (a group of that name now is another one),
    # and those a later session used since (it was not their last session)
    groups_gone: set = field(default_factory=set)
    groups_reused: set = field(default_factory=set)


def _parameter_part_of(model) -> Callable[[str], Tuple[str, Any]]:
    """A checkpoint name's parameter and the shard of it the name fills
    (None: the whole), as the model's `stacked_params_mapping` says."""
    mapping = getattr(model, "stacked_params_mapping", None) or []

    def part_of(name: str) -> Tuple[str, Any]:
        for entry in mapping:
            param_name, weight_name, shard = entry[0], entry[1], entry[2]
            if weight_name in name:
                return name.replace(weight_name, param_name), shard
        return name, None

    return part_of


def _known_name_checker(model) -> Optional[Callable[[str], bool]]:
    """Names the model's loader accepts, where the model can tell: models that
    declare `stacked_params_mapping` (Llama and its kin). Others accept any
    name here and their loader decides."""
    mapping = getattr(model, "stacked_params_mapping", None)
    if mapping is None:
        return None
    # Tied aliases too: a trainer's state_dict names lm_head.weight
    # beside embed_tokens.weight, and the loader skips it.
    params = {name for name, _ in model.named_parameters(remove_duplicate=False)}

    def is_known(name: str) -> bool:
        if name in params:
            return True
        for entry in mapping:
            param_name, weight_name = entry[0], entry[1]
            if weight_name in name and name.replace(weight_name, param_name) in params:
                return True
        return False

    return is_known


class SchedulerTwoPhaseUpdateMixin(SchedulerTwoPhaseUpdateHooks):
    """Handlers for PrepareWeightsUpdateReqInput, CompleteWeightsUpdateReqInput
    and AbortWeightsUpdateReqInput; every TP rank runs them in the same loop
    iteration, and answers are gathered over the TP CPU group."""

    _two_phase_session: Optional[_Session] = None
    _two_phase_pool: Optional[StagingPool] = None
    # Bucket buffers of a session's other shares, by group (kept for reuse)
    _two_phase_share_pools: Optional[Dict[str, StagingPool]] = None
    _two_phase_shadow: Optional[ShadowParameters] = None
    # Groups dropped with a receive still posted: freeing one joins its
    # worker threads, which block until the peer sends or goes away.
    _abandoned_update_groups: Optional[List] = None
    _receive_idle_poller: Optional[zmq.Poller] = None
    _ended_sessions: Optional[OrderedDict] = None
    # The served weights' memory is released (/release_memory_occupation):
    # prepare is refused until it is resumed.
    _two_phase_weights_released: bool = False

    def _end_two_phase_session(
        self: Scheduler, release: bool, outcome: str = APPLIED
    ) -> None:
        """Close the session (every TP rank calls this at the same point)."""
        session = self._two_phase_session
        if session is not None and session.session_id is not None:
            if self._ended_sessions is None:
                self._ended_sessions = OrderedDict()
            self._ended_sessions[session.session_id] = _EndedSession(
                outcome, session.group_name, group_names=session.group_names
            )
            while len(self._ended_sessions) > _ENDED_SESSIONS_KEPT:
                self._ended_sessions.popitem(last=False)
        self._two_phase_session = None
        if release:
            if self._two_phase_pool is not None:
                self._two_phase_pool.release()
            self._two_phase_share_pools = None
            self._two_phase_shadow = None
        metrics = self._sync_metrics()
        if metrics is not None:
            metrics.session_open(False)

    def _sync_metrics(self: Scheduler) -> Optional[WeightSyncMetrics]:
        """This rank's weight-sync metrics; None where it records none."""
        return weight_sync_metrics(self._weight_sync_metrics_labels())

    def _record_sync_end(
        self: Scheduler, session: _Session, outcome: str, reason: str = ""
    ) -> None:
        metrics = self._sync_metrics()
        if metrics is None:
            return
        stats = session.receiver.stats
        metrics.received(
            stats.bytes_received,
            stats.receive_seconds if session.receiver.complete else None,
            stats.verify_seconds,
        )
        metrics.sync_ended(outcome, reason)

    def _open_session_group(self: Scheduler) -> Optional[str]:
        session = self._two_phase_session
        return None if session is None else session.group_name

    def two_phase_session_fence(
        self: Scheduler, session_id: Optional[str], operation: str
    ) -> Optional[str]:
        """Why a call naming `session_id` may not run `operation`: it names a
        session that is not the open one (a late or stale caller). None when
        it names the open one, or names none (the caller's own risk)."""
        if session_id is None:
            return None
        session = self._two_phase_session
        if session is not None and session.session_id == session_id:
            return None
        ended = (self._ended_sessions or {}).get(session_id)
        what = (
            f"session '{session_id}' has ended ({ended.outcome})"
            if ended is not None
            else f"no session '{session_id}' was opened on this server"
        )
        if session is None:
            return f"session_id: {what}; no session is open, nothing to {operation}"
        return (
            f"session_id: {what}; the open session is '{session.session_id}' on "
            f"group '{session.group_name}' and stays as it is: did not {operation}"
        )

    def two_phase_destroy_fence(
        self: Scheduler, group_name: str, session_id: Optional[str]
    ) -> Optional[str]:
        """Why a destroy of `group_name` naming `session_id` may not run. It
        may when the session is the open one (the destroy aborts it), or when
        it was the group's and the group is still the one it used, with no
        other session open on it; not when the group was destroyed and
        created again since (another trainer's, maybe), nor for an id this
        server does not know. None without an id."""
        if session_id is None:
            return None
        session = self._two_phase_session
        if session is not None and session.session_id == session_id:
            return None
        other_open = session is not None and group_name in session.group_names
        ended = (self._ended_sessions or {}).get(session_id)
        if ended is None or other_open:
            return self.two_phase_session_fence(
                session_id, f"destroy group '{group_name}'"
            )
        if group_name not in (ended.group_names or (ended.group_name,)):
            return (
                f"session_id: session '{session_id}' was on group "
                f"'{ended.group_name}', not '{group_name}': not destroyed"
            )
        if group_name in ended.groups_gone:
            return (
                f"session_id: session '{session_id}' has ended ({ended.outcome}) "
                f"and group '{group_name}' was destroyed since; the group of "
                f"that name now is another one: not destroyed"
            )
        if group_name in ended.groups_reused:
            return (
                f"session_id: session '{session_id}' has ended ({ended.outcome}) "
                f"and a later session used group '{group_name}' since: not "
                f"destroyed"
            )
        return None

    def _forget_group(self: Scheduler, group_name: str) -> None:
        """The group is destroyed: sessions that used it are stale for it."""
        for ended in (self._ended_sessions or {}).values():
            if group_name in (ended.group_names or (ended.group_name,)):
                ended.groups_gone.add(group_name)

    def maybe_yield_to_weight_receiver(self: Scheduler) -> None:
        """Without --sleep-on-idle an idle scheduler polls its sockets in a
        busy loop, taking a core and the GIL from the receiver thread (+38 %
        receive time on CPU). While a receive runs, wait on them instead."""
        session = self._two_phase_session
        if session is None or session.receiver.done:
            return
        if self._receive_idle_poller is None:
            sockets = self._request_sockets()
            if not sockets:  # ranks that get requests by broadcast block there
                return
            self._receive_idle_poller = zmq.Poller()
            for socket in sockets:
                self._receive_idle_poller.register(socket, zmq.POLLIN)
        self._receive_idle_poller.poll(_IDLE_POLL_MS)

    def _staging_placement(self: Scheduler) -> str:
        return getattr(self.server_args, "weight_update_staging", "device")

    def _check_staging_budget(
        self: Scheduler, copy_bytes: int, shares: List[List]
    ) -> None:
        """413 naming this rank and the bytes it needs: past
        --weight-update-staging-budget-mb, or by default past the memory free
        where each part lives (plus what is already held for reuse): the copy
        of the rank's parameters (device or host memory) and the bucket
        buffers (device memory), a ring for each share's buckets."""
        largest = max(
            (bucket for buckets in shares for bucket in buckets),
            key=lambda bucket: bucket.nbytes,
        )
        buffer_bytes = sum(ring_bytes(buckets) for buckets in shares)
        need = copy_bytes + buffer_bytes
        budget_mb = self.server_args.weight_update_staging_budget_mb
        placement = self._staging_placement()
        device = self.tp_worker.model_runner.device
        held_copy = self._two_phase_shadow.nbytes if self._two_phase_shadow else 0
        held_buffers = sum(pool.nbytes for pool in self._staging_pools())
        if budget_mb is not None:
            budget = f"the --weight-update-staging-budget-mb of {budget_mb} MiB"
            parts = [(need, budget_mb * 2**20, budget)]
        elif placement == "host":
            parts = [
                (copy_bytes, _free_memory("cpu") + held_copy, "host memory free"),
                (
                    buffer_bytes,
                    _free_memory(device) + held_buffers,
                    "device memory free",
                ),
            ]
        else:
            free = _free_memory(device) + held_copy + held_buffers
            parts = [(need, free, "device memory free")]
        for wanted, limit, what in parts:
            if wanted > limit:
                if not what.startswith("the "):
                    what = f"the {limit:.0f} bytes of {what}"
                raise WeightsUpdateError(
                    f"buckets[{largest.index}]: staging needs {need} bytes "
                    f"({need / 2**20:.1f} MiB) on TP rank {self.tp_rank}: a copy "
                    f"of its parameters ({copy_bytes} bytes, {placement} memory) "
                    f"and {RING_BUCKETS} buffers of the largest bucket, this one "
                    f"({largest.nbytes} bytes each); {wanted} bytes is more than "
                    f"{what}",
                    status_code=413,
                )

    def _staging_pools(self: Scheduler) -> List[StagingPool]:
        pools = list((self._two_phase_share_pools or {}).values())
        return pools if self._two_phase_pool is None else [self._two_phase_pool, *pools]

    def _share_pool(self: Scheduler, group_name: str) -> StagingPool:
        """The bucket buffers of another share's receiver, kept per group."""
        if self._two_phase_share_pools is None:
            self._two_phase_share_pools = {}
        pool = self._two_phase_share_pools.get(group_name)
        if pool is None:
            pool = StagingPool(self.tp_worker.model_runner.device)
            self._two_phase_share_pools[group_name] = pool
        return pool

    def _shadow_for_update(self: Scheduler) -> ShadowParameters:
        """The shadow of this rank's parameters, kept between updates."""
        models = self._staged_models()
        shadow = self._two_phase_shadow
        if (
            shadow is None
            or shadow.placement != self._staging_placement()
            or not shadow.matches(models)
        ):
            self._two_phase_shadow = None  # free the old one first
            shadow = ShadowParameters(models, self._staging_placement())
            self._two_phase_shadow = shadow
        return shadow

    def prepare_weights_update(
        self: Scheduler, recv_req: PrepareWeightsUpdateReqInput
    ) -> PrepareWeightsUpdateReqOutput:
        model_runner = self.tp_worker.model_runner
        receiver = None
        try:
            if self._two_phase_session is not None:
                raise WeightsUpdateError(
                    f"a weight update session is already open for group "
                    f"'{self._two_phase_session.group_name}'; complete or abort it first",
                    status_code=409,
                )
            self._refuse_beside_release_session()
            if self._two_phase_weights_released:
                raise WeightsUpdateError(
                    "the served weights' memory is released "
                    "(/release_memory_occupation); resume it first",
                    status_code=409,
                )
            if recv_req.session_id in (self._ended_sessions or {}):
                raise WeightsUpdateError(
                    f"session_id: '{recv_req.session_id}' named an earlier "
                    f"session; prepare with a new one (or none: the server "
                    f"chooses)",
                    status_code=409,
                )
            shares = parse_shares(
                recv_req.group_name,
                recv_req.num_buckets,
                recv_req.buckets,
                recv_req.shares,
                recv_req.load_format,
                _known_name_checker(model_runner.model),
            )
            for k, share in enumerate(shares):
                if share.group_name not in self._update_groups:
                    field = "group_name" if k == 0 else f"shares[{k - 1}].group_name"
                    raise WeightsUpdateError(
                        f"{field}: no update group '{share.group_name}' on this "
                        f"server; call /init_weights_update_group first"
                    )
            if len(shares) > 1:
                check_one_owner(shares, _parameter_part_of(model_runner.model))
            buckets = [bucket for share in shares for bucket in share.buckets]
            unsupported = unsupported_post_processing(self._staged_models())
            if unsupported:
                raise WeightsUpdateError(f"buckets: {unsupported}")
            copy_bytes = staged_copy_bytes(self._staged_models())
            self._check_staging_budget(copy_bytes, [s.buckets for s in shares])
            staging_bytes = copy_bytes + sum(ring_bytes(s.buckets) for s in shares)
            for k, share in enumerate(shares):
                _check_loadable(
                    model_runner.model,
                    self.server_args.model_path,
                    self.tp_size,
                    share.buckets,
                    field="buckets" if k == 0 else f"shares[{k - 1}].buckets",
                )
            if self._two_phase_pool is None:
                self._two_phase_pool = StagingPool(model_runner.device)
            shadow = self._shadow_for_update()
            sink = SerialSink(shadow.begin, shadow.load) if len(shares) > 1 else shadow
            receivers = [
                StagedWeightReceiver(
                    share.buckets,
                    self._update_groups[share.group_name],
                    (
                        self._two_phase_pool
                        if k == 0
                        else self._share_pool(share.group_name)
                    ),
                    recv_req.load_format,
                    sink=sink.load,
                    before_first_bucket=sink.begin,
                    defer_digests=recv_req.defer_digests,
                    session_id=recv_req.session_id if recv_req.framed else None,
                )
                for k, share in enumerate(shares)
            ]
            receiver = (
                receivers[0]
                if len(shares) == 1
                else SharedSessionReceiver(
                    [(share.group_name, r) for share, r in zip(shares, receivers)]
                )
            )
            local = {
                "success": True,
                "message": "",
                "status_code": 200,
                "staging_bytes": staging_bytes,
            }
        except WeightsUpdateError as e:
            local = {"success": False, "message": str(e), "status_code": e.status_code}
        except Exception as e:
            logger.exception("prepare_weights_update failed")
            local = {"success": False, "message": str(e), "status_code": 500}

        results = gather_from_tp_ranks(self, local)
        failed = [r for r in results if not r["success"]]
        if failed:
            # Nothing has moved yet: the trainer broadcasts only after "ready".
            if receiver is not None and self._two_phase_session is None:
                self._two_phase_pool.release()
                self._two_phase_share_pools = None
                self._two_phase_shadow = None
            metrics = self._sync_metrics()
            if metrics is not None:
                metrics.sync_ended(FAILED, REJECTED)
            message = _join_messages(failed, self.tp_size)
            open_group = self._open_session_group()
            awaits_abort_header = self._open_refused_session(recv_req, message)
            return PrepareWeightsUpdateReqOutput(
                status="error",
                message=message,
                status_code=failed[0]["status_code"],
                open_session_group=open_group,
                awaits_abort_header=awaits_abort_header,
                session_id=recv_req.session_id if awaits_abort_header else None,
            )
        # Every rank accepted. The live model keeps its serving layout until
        # the apply.
        # An ended session was not the last one of these groups any more.
        opened_on = set(getattr(receiver, "group_names", [recv_req.group_name]))
        for ended in (self._ended_sessions or {}).values():
            ended.groups_reused.update(set(ended.group_names) & opened_on)
        receiver.start()
        self._two_phase_session = _Session(
            recv_req.group_name,
            receiver,
            session_id=recv_req.session_id,
            weight_version=recv_req.weight_version,
            shadow=shadow,
            other_groups=tuple(getattr(receiver, "group_names", ())[1:]),
        )
        if self.tp_rank == 0:
            logger.info(
                f"Weight update session {recv_req.session_id} opened on group(s) "
                f"{self._two_phase_session.groups_text()}: "
                f"{len(receiver.buckets)} buckets"
            )
        metrics = self._sync_metrics()
        if metrics is not None:
            metrics.session_open(True)
            metrics.staging(staging_bytes)
        return PrepareWeightsUpdateReqOutput(
            status="ready",
            message="",
            num_bytes=receiver.total_bytes,
            staging_reused=receiver.stats.staging_reused,
            session_id=recv_req.session_id,
            staging_bytes=max(r["staging_bytes"] for r in results),
            rank_staging_bytes=[
                {k: r[k] for k in ("dp_rank", "rank", "staging_bytes") if k in r}
                for r in results
            ],
        )

    def _open_refused_session(
        self: Scheduler, recv_req: PrepareWeightsUpdateReqInput, why: str
    ) -> bool:
        """After a framed prepare that a rank refused: wait, as the other
        engines of the group do, for the abort header the sender broadcasts
        in place of bucket 0, so that the group stays usable everywhere. The
        session then waits for an abort. A session of several groups waits on
        each (every share's sender aborts in band). False where nothing can be
        posted: a group it names is not here, a session already holds this
        server, or the id is an earlier session's (a late duplicate of its
        prepare: nothing waits)."""
        names = _share_group_names(recv_req)
        reused_id = recv_req.session_id in (self._ended_sessions or {})
        if (
            not recv_req.framed
            or names is None
            or any(name not in self._update_groups for name in names)
            or self._two_phase_session
            or reused_id
        ):
            return False
        device = torch.device(self.tp_worker.model_runner.device)
        receivers = [
            RefusedSessionReceiver(
                self._update_groups[name], device, session_id=recv_req.session_id
            )
            for name in names
        ]
        receiver = (
            receivers[0]
            if len(names) == 1
            else SharedSessionReceiver(list(zip(names, receivers)))
        )
        receiver.start()
        for ended in (self._ended_sessions or {}).values():
            ended.groups_reused.update(set(ended.group_names) & set(names))
        self._two_phase_session = _Session(
            recv_req.group_name,
            receiver,
            recv_req.session_id,
            refused=why,
            other_groups=tuple(names[1:]),
        )
        metrics = self._sync_metrics()
        if metrics is not None:
            metrics.session_open(True)
        return True

    @pause_watchdogs_during_weight_update
    def complete_weights_update(
        self: Scheduler, recv_req: CompleteWeightsUpdateReqInput
    ) -> CompleteWeightsUpdateReqOutput:
        session = self._two_phase_session
        started = time.perf_counter()
        output = self._complete_weights_update(recv_req)
        if session is not None:
            # No batch ran meanwhile: the apply's cost to serving.
            session.serving_stall_seconds += time.perf_counter() - started
        if output.applied:
            metrics = self._sync_metrics()
            if metrics is not None:
                metrics.applied(
                    output.stats.get("apply_seconds", 0.0),
                    session.serving_stall_seconds,
                )
        output.session_open = self._two_phase_session is not None
        if session is not None and recv_req.session_id in (None, session.session_id):
            output.session_id = session.session_id
        return output

    def _complete_weights_update(
        self: Scheduler, recv_req: CompleteWeightsUpdateReqInput
    ) -> CompleteWeightsUpdateReqOutput:
        session = self._two_phase_session
        fenced = self.two_phase_session_fence(recv_req.session_id, "complete")
        if fenced:
            return CompleteWeightsUpdateReqOutput(
                success=False,
                message=fenced,
                status_code=409,
                open_session_group=self._open_session_group(),
            )
        ended = self._last_session_ended_on(recv_req.group_name)
        if ended is not None:
            return CompleteWeightsUpdateReqOutput(
                success=False,
                message=f"no weight update session is open ({ended}); call "
                "/prepare_weights_update first",
                status_code=409,
            )
        if session is None:
            return CompleteWeightsUpdateReqOutput(
                success=False,
                message="no weight update session is open; call "
                "/prepare_weights_update first",
                status_code=409,
            )
        if recv_req.group_name not in session.group_names:
            return CompleteWeightsUpdateReqOutput(
                success=False,
                message=f"group_name: the open session is for group(s) "
                f"{session.groups_text()}, not '{recv_req.group_name}'",
                status_code=400,
                open_session_group=session.group_name,
            )
        if session.refused is not None:
            return CompleteWeightsUpdateReqOutput(
                success=False,
                message=f"the prepare of this session was refused "
                f"({session.refused}); nothing to complete: send the abort "
                f"header, then abort it",
                status_code=409,
            )
        receiver = session.receiver
        stats: Dict[str, Any] = {}

        # 1. Wait for every bucket and verify it, on every rank.
        t0 = time.perf_counter()
        timeout = recv_req.timeout
        if timeout is None:
            timeout = DEFAULT_COMPLETE_TIMEOUT
        local = {"success": True, "message": "", "timed_out": False}
        digests_error = None
        if not session.verified:
            digests_error = _check_complete_digests(
                recv_req.digests, receiver.buckets, receiver.defer_digests
            )
        elif recv_req.digests is not None:
            # Verified already: digests sent again must be the same ones.
            digests_error = _check_complete_digests(
                recv_req.digests, receiver.buckets, receiver.defer_digests
            ) or _digests_disagree(recv_req.digests, receiver)
        if digests_error is not None:
            # A malformed request: the session stays open for a good one.
            local = {"success": False, "timed_out": True, "message": digests_error}
        elif not session.verified:
            polling = recv_req.scheduler_wait_s is not None
            done = receiver.wait(recv_req.scheduler_wait_s if polling else timeout)
            if not done and polling:
                # Let batches run meanwhile; the tokenizer manager asks again.
                local = {"success": False, "pending": True, "message": ""}
            elif not done:
                local = {
                    "success": False,
                    "timed_out": True,
                    "message": f"timed out after {timeout:.0f}s with "
                    f"{receiver.stats.buckets_received} of {len(receiver.buckets)} "
                    f"buckets received; complete again or abort",
                }
            elif not receiver.complete:
                local = {
                    "success": False,
                    "timed_out": False,
                    "reason": RECEIVE_ERROR,
                    "message": f"receive failed after {receiver.stats.buckets_received} "
                    f"of {len(receiver.buckets)} buckets: {receiver.error}",
                }
            else:
                receiver.synchronize()
                errors = receiver.verify(recv_req.digests)
                if errors:
                    local = {
                        "success": False,
                        "timed_out": False,
                        "reason": DIGEST_MISMATCH,
                        "mismatched_buckets": len(errors),
                        "message": "verification failed, nothing applied: "
                        + "; ".join(errors),
                    }
                elif session.shadow.check_appliable() is not None:
                    local = {
                        "success": False,
                        "timed_out": False,
                        "reason": APPLY_ERROR,
                        "message": "nothing applied: "
                        + session.shadow.check_appliable(),
                    }
        stats["wait_seconds"] = time.perf_counter() - t0
        stats.update(
            bytes_received=receiver.stats.bytes_received,
            receive_seconds=receiver.stats.receive_seconds,
            verify_seconds=receiver.stats.verify_seconds,
            load_seconds=receiver.stats.load_seconds,
            staging_reused=receiver.stats.staging_reused,
        )
        local["buckets"] = receiver.stats.buckets_received
        results = gather_from_tp_ranks(self, local)
        num_received = min(r["buckets"] for r in results)
        failed = [r for r in results if not r["success"] and not r.get("pending")]
        if not failed and any(r.get("pending") for r in results):
            return CompleteWeightsUpdateReqOutput(
                success=False, num_buckets_received=num_received, pending=True
            )
        if failed:
            if not all(r.get("timed_out") for r in failed):
                # A broken or corrupted transfer: discard it, old weights stay.
                metrics = self._sync_metrics()
                if metrics is not None:
                    metrics.mismatched(
                        sum(r.get("mismatched_buckets", 0) for r in failed)
                    )
                reasons = [r["reason"] for r in failed if r.get("reason")]
                self._discard_two_phase_session(
                    session, FAILED, reasons[0] if reasons else RECEIVE_ERROR
                )
            return CompleteWeightsUpdateReqOutput(
                success=False,
                num_buckets_received=num_received,
                message=_join_messages(failed, self.tp_size),
                status_code=400,
                stats=stats,
                rank_results=_rank_summary(results),
            )
        session.verified = True
        # 2. A cache flush needs an idle scheduler: check before applying. By
        # default (None) flush only if no request is in flight on any rank.
        flush = recv_req.flush_cache
        if flush or recv_req.drain or (flush is None and recv_req.apply):
            busy = gather_from_tp_ranks(self, {"busy": not self.is_fully_idle()})
            if recv_req.drain and any(r["busy"] for r in busy):
                # New requests wait (in this tokenizer manager; another
                # worker's may come); let the in-flight ones finish, then
                # try again.
                return CompleteWeightsUpdateReqOutput(
                    success=False,
                    num_buckets_received=num_received,
                    message="drain: requests are in flight; "
                    "the apply waits for them (nothing applied here)",
                    status_code=409,
                    ready_to_apply=True,
                    pending=True,
                )
            if flush is None:
                flush = not any(r["busy"] for r in busy)
            elif flush and any(r["busy"] for r in busy):
                return CompleteWeightsUpdateReqOutput(
                    success=False,
                    num_buckets_received=num_received,
                    message="flush_cache: requests are in flight (generation is "
                    "paused in place), and a cache flush needs them finished; "
                    "nothing applied: continue generation and complete again, "
                    "or complete without flush_cache",
                    status_code=409,
                    ready_to_apply=True,
                    stats=stats,
                )

        if not recv_req.apply:
            return CompleteWeightsUpdateReqOutput(
                success=True,
                num_buckets_received=num_received,
                message="received and verified; not applied (apply=false)",
                ready_to_apply=True,
                stats=stats,
                rank_results=_rank_summary(results),
            )

        # 3. Apply, in one step between two batches, on every rank.
        t2 = time.perf_counter()
        try:
            receiver.synchronize()
            problem = session.shadow.check_appliable()
            if problem is not None:
                raise WeightsUpdateError(f"nothing applied: {problem}")
            session.shadow.apply()
            local = {"success": True, "message": "", "applied": True}
        except Exception as e:
            logger.exception("complete_weights_update: apply failed")
            local = {
                "success": False,
                "applied": False,
                "reason": APPLY_ERROR,
                "message": f"apply failed: {e}; the weights may be partially "
                f"updated, reload them",
            }
        stats["apply_seconds"] = time.perf_counter() - t2
        # What every rank did, the same answer on every rank: the weights
        # changed only if every rank applied, whatever this rank saw.
        results = gather_from_tp_ranks(self, local)
        applied = all(r["applied"] for r in results)
        if flush and applied:
            # Only once every rank applied, so that the ranks' caches agree.
            if not self.flush_cache():
                local.update(
                    success=False,
                    reason=CACHE_FLUSH_ERROR,
                    message="applied, but the cache flush failed: cached "
                    "prefixes may still hold the old weights' KV; call "
                    "/flush_cache",
                )
            results = gather_from_tp_ranks(self, local)
        failed = [r for r in results if not r["success"]]
        if applied:
            self._record_applied_version(
                recv_req.weight_version or session.weight_version
            )
        if failed:
            self._record_sync_end(session, FAILED, failed[0]["reason"])
        else:
            self._record_sync_end(session, APPLIED)
        ended = APPLIED if applied else f"{FAILED}: {failed[0]['reason']}"
        self._end_two_phase_session(recv_req.release_staging, ended)
        return CompleteWeightsUpdateReqOutput(
            success=not failed,
            num_buckets_received=num_received,
            message=(
                _apply_failure_message(results, self.tp_size)
                if failed
                else f"applied {num_received} buckets"
                + (" and flushed the cache" if flush else "")
            ),
            status_code=500 if failed else 200,
            ready_to_apply=False,
            applied=applied,
            cache_flushed=bool(flush) and not failed,
            weight_version=(
                (recv_req.weight_version or session.weight_version) if applied else None
            ),
            stats=stats,
            rank_results=_rank_summary(results),
        )

    def _discard_two_phase_session(
        self: Scheduler,
        session: _Session,
        outcome: str,
        reason: str = "",
        abort_header_sent: bool = False,
        abort_header_sent_groups: Optional[List[str]] = None,
    ) -> List[str]:
        """Stop the receiver, drop a group left mid-collective, free staging;
        the groups dropped. `abort_header_sent`: the sender says it aborted
        in band, so the receiver ends by itself (it is given a few seconds
        to); `abort_header_sent_groups`: the groups of a session of several
        groups whose sender did so."""
        if abort_header_sent_groups is not None and session.other_groups:
            usable = session.receiver.abort(
                sender_grace=_ABORT_HEADER_GRACE_S,
                graced_groups=abort_header_sent_groups,
            )
        else:
            graced = abort_header_sent or session.group_name in (
                abort_header_sent_groups or ()
            )
            usable = session.receiver.abort(
                sender_grace=_ABORT_HEADER_GRACE_S if graced else 0.0
            )
        # Each group's own state (a session of several groups may lose some)
        usable_groups = getattr(
            session.receiver, "usable", {session.group_name: usable}
        )
        if not usable_groups:
            usable_groups = {session.group_name: usable}
        if session.refused is None:  # a refused prepare was counted then
            self._record_sync_end(session, outcome, reason)
        abandoned = [
            (g, works)
            for g, works in self._abandoned_update_groups or []
            if not all(w.is_completed() for w in works)
        ]
        lost = [name for name, ok in usable_groups.items() if not ok]
        for name, receiver in _receivers_by_group(session):
            group = self._update_groups.pop(name, None) if name in lost else None
            if group is not None:
                # Unregister the name so the group can be initialised again,
                # but keep the object alive until its receive ends.
                torch.distributed.destroy_process_group(group)
                abandoned.append((group, list(receiver.pending_works)))
        self._abandoned_update_groups = abandoned
        self._end_two_phase_session(
            True, f"{outcome}: {reason}" if outcome == FAILED else outcome
        )
        for name in lost:
            self._forget_group(name)
        return lost

    def two_phase_session_conflict(
        self: Scheduler, group_name: str, operation: str
    ) -> Optional[str]:
        """Why `operation` may not touch `group_name` now: an open session
        owns its group until it completes or aborts."""
        session = self._two_phase_session
        if session is None or group_name not in session.group_names:
            return None
        return (
            f"group_name: a weight update session is open on group "
            f"'{group_name}'; complete or abort it before {operation}"
        )

    def two_phase_session_holds_weights(
        self: Scheduler, operation: str
    ) -> Optional[str]:
        """Why `operation`, which writes the served weights, may not run now:
        an open session's apply copies the weights as they were at its
        prepare, with the update written in, so a write in between would be
        undone."""
        session = self._two_phase_session
        if session is None or session.refused is not None:
            return None
        return (
            f"a weight update session is open on group '{session.group_name}' and "
            f"its apply would undo {operation}; complete or abort it first"
        )

    def two_phase_before_memory_release(self: Scheduler, weights: bool) -> None:
        """Before /release_memory_occupation frees GPU memory: give back the
        staging kept for the next update and, where the served weights'
        memory goes (`weights`), abort an open session, whose staged copy
        and apply read and write them; prepare is then refused until they
        are resumed."""
        session = self._two_phase_session
        if weights and session is not None:
            self._discard_two_phase_session(session, ABORTED)
            ended = (self._ended_sessions or {}).get(session.session_id)
            if ended is not None:  # a later call naming the session is told why
                ended.outcome = (
                    f"{ABORTED}: the served weights' memory was released "
                    f"(/release_memory_occupation)"
                )
            if self.tp_rank == 0:
                logger.warning(
                    f"Weight update session {session.session_id} on group(s) "
                    f"{session.groups_text()} aborted: the served weights' "
                    f"memory is being released; they are unchanged"
                )
        elif session is None:
            self._end_two_phase_session(release=True)  # frees kept staging
        self._two_phase_weights_released |= weights

    def _last_session_ended_on(self: Scheduler, group_name: str) -> Optional[str]:
        """How the last session on `group_name` ended, for a call that finds
        none open: a trainer whose session a release or another caller ended
        learns it there (None while a session is open, or where this server
        recorded none)."""
        if self._two_phase_session is not None:
            return None
        for session_id, ended in reversed((self._ended_sessions or {}).items()):
            if group_name in (ended.group_names or (ended.group_name,)):
                return (
                    f"the last on group '{group_name}', '{session_id}', has "
                    f"ended: {ended.outcome}"
                )
        return None

    def two_phase_weights_resumed(self: Scheduler) -> None:
        """After /resume_memory_occupation gave the served weights back."""
        self._two_phase_weights_released = False

    def abort_two_phase_session_on_group(
        self: Scheduler, group_name: str
    ) -> Optional[str]:
        """Before the group is destroyed: discard a session open on it, so
        that nothing frees the group under a posted receive."""
        session = self._two_phase_session
        aborted = None
        if session is not None and group_name in session.group_names:
            self._discard_two_phase_session(session, ABORTED)
            aborted = "the weight update session open on it was aborted (the served weights are unchanged)"
        self._forget_group(group_name)
        return aborted

    def abort_weights_update(
        self: Scheduler, recv_req: AbortWeightsUpdateReqInput
    ) -> AbortWeightsUpdateReqOutput:
        session = self._two_phase_session
        fenced = self.two_phase_session_fence(recv_req.session_id, "abort")
        if fenced:
            return AbortWeightsUpdateReqOutput(
                success=False,
                message=fenced,
                status_code=409,
                group_usable=recv_req.group_name in self._update_groups,
                open_session_group=self._open_session_group(),
            )
        ended = self._last_session_ended_on(recv_req.group_name)
        if ended is not None:
            return AbortWeightsUpdateReqOutput(
                success=False,
                message=f"no weight update session is open ({ended}); nothing "
                "to abort",
                status_code=409,
                group_usable=recv_req.group_name in self._update_groups,
            )
        if session is None:
            groups = self._update_groups
            return AbortWeightsUpdateReqOutput(
                success=False,
                message="no weight update session is open; nothing to abort",
                status_code=409,
                group_usable=recv_req.group_name in groups,
            )
        if recv_req.group_name not in session.group_names:
            return AbortWeightsUpdateReqOutput(
                success=False,
                message=f"group_name: the open session is for group(s) "
                f"{session.groups_text()}, not '{recv_req.group_name}'",
                status_code=400,
                open_session_group=session.group_name,
            )
        strangers = [
            name
            for name in recv_req.abort_header_sent_groups or []
            if name not in session.group_names
        ]
        if strangers:
            return AbortWeightsUpdateReqOutput(
                success=False,
                message=f"abort_header_sent_groups: {strangers} are not groups of "
                f"the open session ({session.groups_text()}); nothing was aborted",
                status_code=400,
                open_session_group=session.group_name,
            )
        lost = self._discard_two_phase_session(
            session,
            ABORTED,
            abort_header_sent=recv_req.abort_header_sent,
            abort_header_sent_groups=recv_req.abort_header_sent_groups,
        )
        results = gather_from_tp_ranks(self, {"success": True, "lost": lost})
        lost = [n for n in session.group_names if any(n in r["lost"] for r in results)]
        usable = not lost
        message = "aborted; the served weights are unchanged"
        if len(lost) == 1:
            message += (
                f"; group '{lost[0]}' was left mid-transfer and was "
                f"destroyed: call /init_weights_update_group again"
            )
        elif lost:
            message += (
                f"; groups {', '.join(repr(n) for n in lost)} were left "
                f"mid-transfer and were destroyed: call "
                f"/init_weights_update_group again for each"
            )
        return AbortWeightsUpdateReqOutput(
            success=True,
            message=message,
            group_usable=usable,
            session_id=session.session_id,
        )


def _receivers_by_group(session: _Session) -> List[Tuple[str, GroupReceiver]]:
    shares = getattr(session.receiver, "shares", None)
    return shares if shares is not None else [(session.group_name, session.receiver)]


def _share_group_names(recv_req: PrepareWeightsUpdateReqInput) -> Optional[List[str]]:
    """The groups a prepare names (group_name's, then each share's), or
    None where a share is malformed or names a group twice."""
    names = [recv_req.group_name]
    for share in recv_req.shares or []:
        name = share.get("group_name") if isinstance(share, dict) else None
        if not isinstance(name, str) or name in names:
            return None
        names.append(name)
    return names


def _free_memory(device) -> int:
    """Bytes free where staging is allocated."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    import psutil

    return psutil.virtual_memory().available


def _check_loadable(
    model, model_path: str, tp_size: int, buckets: List, field: str = "buckets"
) -> None:
    """Fail prepare, naming the field, for anything the apply would reject
    or would load wrongly."""
    specs = [(b.index, i, t) for b in buckets for i, t in enumerate(b.tensors)]
    tensors = [(t.name, t.dtype, t.shape) for _, _, t in specs]
    try:
        check_declared_shapes(model, model_path, tp_size, tensors)
        check_loadable(model, tensors)
    except LoadCheckError as e:
        bucket, position, _ = specs[e.index]
        raise WeightsUpdateError(f"{field}[{bucket}].{e.field}[{position}]: {e}")


def _check_complete_digests(
    digests: Optional[List[str]], buckets: List, deferred: bool
) -> Optional[str]:
    """Why complete's `digests` cannot be checked against the session, or None."""
    if digests is None:
        if deferred:
            return (
                f"digests: the session was prepared with defer_digests; send "
                f"one digest per bucket ({len(buckets)}) with complete"
            )
        return None
    if len(digests) != len(buckets):
        return (
            f"digests: {len(digests)} digests for {len(buckets)} buckets; "
            f"send one per bucket"
        )
    if not deferred and any(b.digest is None for b in buckets):
        return (
            "digests: the session was prepared without defer_digests, so the "
            "buckets' digests were not recorded as they landed; send them "
            "with prepare, or prepare with defer_digests"
        )
    try:
        for i, digest in enumerate(digests):
            check_digest_format(digest, f"digests[{i}]")
    except WeightsUpdateError as e:
        return str(e)
    return None


def _digests_disagree(
    digests: List[str], receiver: StagedWeightReceiver
) -> Optional[str]:
    for bucket, digest in zip(receiver.buckets, digests):
        landed = receiver.landed_digests.get(bucket.index)
        if landed is not None and landed != digest:
            return (
                f"digests[{bucket.index}]: {digest} is not the digest bucket "
                f"{bucket.index} was verified with ({landed}); nothing applied"
            )
    return None


def _join_messages(failed: List[Dict], tp_size: int) -> str:
    messages = sorted({r["message"] for r in failed})
    if tp_size == 1:
        return messages[0]
    ranks = ",".join(str(r["rank"]) for r in failed)
    return f"rank(s) {ranks}: " + " | ".join(messages)


def _apply_failure_message(results: List[Dict], tp_size: int) -> str:
    """Why an apply failed, and whether the weights changed: on every rank,
    on none, or (an apply that failed on some ranks only) on some."""
    failed = [r for r in results if not r["success"]]
    message = _join_messages(failed, tp_size)
    applied = [r for r in results if r["applied"]]
    if applied and len(applied) < len(results):
        ranks = ",".join(str(r["rank"]) for r in applied)
        message = (
            f"the weights are mixed: rank(s) {ranks} applied the update and "
            f"the others did not; reload the weights. {message}"
        )
    return message


def _rank_summary(results: List[Dict]) -> List[Dict[str, Any]]:
    keys = ("dp_rank", "rank", "success", "applied", "message")
    return [{k: r[k] for k in keys if k in r} for r in results]
