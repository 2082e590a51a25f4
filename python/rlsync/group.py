"""Joining a weight-update process group from the trainer, without SGLang.

SGLang's engines join with `init_custom_process_group`: a TCP rendezvous, a
store prefixed with the group name, and a new (non-default) process group.
The trainer must join the same way, as rank 0, hosting the rendezvous store.

`GroupJoin` runs that join in a thread, so the trainer can watch the engines
meanwhile, and tears it down when one of them refuses: a join left blocked
inside the rendezvous would otherwise outlive the failure and abort the
process at exit when it finally returns.
"""

from __future__ import annotations

import concurrent.futures as cf
import inspect
import logging
import threading
import time
import weakref
from datetime import timedelta
from typing import Optional

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import (
    Backend,
    PrefixStore,
    _new_process_group_helper,
    _world,
)

from rlsync.update_group_net import (
    LONGEST_COLLECTIVE_TIMEOUT_S,
    UpdateGroupInitError,
    collective_timeout_seconds,
    init_group_on_route,
)

logger = logging.getLogger(__name__)

# Renamed from pg_options in torch 2.6.
_OPTIONS_ARG = (
    "backend_options"
    if "backend_options" in inspect.signature(_new_process_group_helper).parameters
    else "pg_options"
)
# How long a client that releases an abandoned rendezvous may take to connect.
_RELEASE_TIMEOUT = timedelta(seconds=10)
# Seconds the interpreter's shutdown waits for each torn-down join.
_SHUTDOWN_GRACE = 10.0


def nccl_without_gpu(backend: str) -> Optional[str]:
    """Why `backend` cannot work on this host: NCCL asked for where torch
    sees no CUDA GPU (the group would form, then fail at its first
    collective). None where nothing is wrong that this can tell."""
    if str(backend).lower() != "nccl" or torch.cuda.is_available():
        return None
    return (
        "backend='nccl': NCCL needs a CUDA GPU on the trainer, and this host has "
        "none (torch.cuda.is_available() is False); use backend='gloo' (CPU "
        "engines, tests), or run the trainer on a GPU host"
    )


def check_group_timeout(timeout: float) -> None:
    """A group's timeout bounds its join and each of its collectives: above
    0 s and at most a week (longer overflows the backends' clocks)."""
    if not 0 < timeout <= LONGEST_COLLECTIVE_TIMEOUT_S:  # NaN fails too
        raise ValueError(
            f"timeout must be above 0 s and at most a week "
            f"({LONGEST_COLLECTIVE_TIMEOUT_S:g} s), got {timeout!r}"
        )


def _check_join_args(
    master_address: str,
    master_port: int,
    world_size: int,
    rank: int,
    group_name: str,
    backend: str,
    timeout: float,
) -> None:
    problem = nccl_without_gpu(backend)
    if problem:
        raise ValueError(problem)
    check_group_timeout(timeout)
    if not master_address:
        raise ValueError("master_address cannot be empty")
    if not (0 < master_port < 65536):
        raise ValueError(f"master_port out of range: {master_port}")
    if world_size < 2:
        raise ValueError(f"world_size must be >= 2, got {world_size}")
    if not (0 <= rank < world_size):
        raise ValueError(f"rank {rank} not in [0, {world_size})")
    if not group_name:
        raise ValueError("group_name cannot be empty")


def rendezvous_store(
    master_address: str, master_port: int, world_size: int, rank: int, timeout: float
) -> dist.TCPStore:
    """The TCP store of the engines' `tcp://` rendezvous: rank 0 hosts it and
    returns once every rank has connected; other ranks connect to it. Rank 0
    always hosts, also under torchrun, whose agent store the engines never
    use."""
    store = dist.TCPStore(
        master_address,
        master_port,
        world_size,
        rank == 0,
        timedelta(seconds=timeout),
        multi_tenant=True,
    )
    store.set_timeout(timedelta(seconds=timeout))
    return store


def new_update_group(
    store: dist.Store,
    world_size: int,
    rank: int,
    *,
    group_name: str,
    backend: str,
    timeout: float,
    init_timeout: Optional[float] = None,
) -> dist.ProcessGroup:
    """The process group over a rendezvous store, named as the engines name
    it: created within `init_timeout` (default: `timeout`); afterwards its
    collectives, and the store (NCCL's lazy communicator setup reads it),
    wait `timeout` (from a second up to a week), however little of the init
    was left; gloo's send and recv keep the creation's."""
    created_within = timedelta(
        seconds=timeout if init_timeout is None else init_timeout
    )
    pg, _ = _new_process_group_helper(
        world_size,
        rank,
        [],
        Backend(backend),
        PrefixStore(group_name, store),
        group_name=group_name,
        timeout=created_within,
        **{_OPTIONS_ARG: None},
    )
    _world.pg_group_ranks[pg] = {i: i for i in range(world_size)}
    collective = timedelta(seconds=collective_timeout_seconds(timeout))
    if collective != created_within:
        store.set_timeout(collective)
        _set_group_timeout(collective, pg)
    return pg


def _set_group_timeout(timeout: timedelta, group: dist.ProcessGroup) -> None:
    """The default timeout of `group`'s later operations (through torch's
    public set_timeout where it has one)."""
    set_timeout = getattr(dist, "set_timeout", None)
    if set_timeout is None:
        from torch.distributed.distributed_c10d import _set_pg_timeout

        set_timeout = _set_pg_timeout
    set_timeout(timeout, group)


def join_update_group(
    master_address: str,
    master_port: int,
    world_size: int,
    *,
    rank: int = 0,
    group_name: str = "weight_update_group",
    backend: str = "gloo",
    timeout: float = 300.0,
) -> dist.ProcessGroup:
    """Join (as `rank`, the trainer is 0) the group the engines join, a gloo
    group bound to the interface that routes to the master address unless
    GLOO_SOCKET_IFNAME is set (NCCL: set NCCL_SOCKET_IFNAME at launch); the
    whole join within
    `timeout`, an UpdateGroupInitError naming the addresses otherwise. Every
    collective of the group then waits up to `timeout`."""
    _check_join_args(
        master_address, master_port, world_size, rank, group_name, backend, timeout
    )

    def join(left: Optional[float]) -> dist.ProcessGroup:
        deadline = time.monotonic() + (timeout if left is None else left)
        store = rendezvous_store(
            master_address, master_port, world_size, rank, _left(deadline)
        )
        return new_update_group(
            store,
            world_size,
            rank,
            group_name=group_name,
            backend=backend,
            timeout=timeout,
            init_timeout=_left(deadline),
        )

    return init_group_on_route(
        join,
        backend=backend,
        master_address=master_address,
        master_port=master_port,
        timeout=timeout,
        hosts_rendezvous=rank == 0,
    )


def _left(deadline: float) -> float:
    return max(1.0, deadline - time.monotonic())


def leave_update_group(group: dist.ProcessGroup) -> None:
    dist.destroy_process_group(group)


def _without_frames(error: BaseException) -> BaseException:
    """`error` with no traceback on it or on any exception it chains to."""
    seen: set[int] = set()
    pending = [error]
    while pending:
        link = pending.pop()
        if id(link) in seen:
            continue
        seen.add(id(link))
        link.with_traceback(None)
        pending += [c for c in (link.__cause__, link.__context__) if c is not None]
    return error


class JoinCancelled(RuntimeError):
    """The join was torn down before the group formed."""


class GroupJoin:
    """`join_update_group` as rank 0 in a thread of its own, which `cancel()`
    tears down: a rendezvous still waiting for ranks that will never come is
    released, no group is created after it, and a group that formed anyway
    is left. The thread is not a daemon, so the interpreter never finalises
    while it still runs torch code."""

    def __init__(
        self,
        master_address: str,
        master_port: int,
        world_size: int,
        *,
        group_name: str = "weight_update_group",
        backend: str = "gloo",
        timeout: float = 300.0,
    ):
        _check_join_args(
            master_address, master_port, world_size, 0, group_name, backend, timeout
        )
        self.master_address, self.master_port = master_address, master_port
        self.world_size, self.group_name = world_size, group_name
        self.backend, self.timeout = backend, timeout
        # Set when the join ends: the group, or why there is none.
        self.future: cf.Future = cf.Future()
        self._lock = threading.Lock()
        self._cancelled = False
        self._in_rendezvous = False
        self._store: Optional[dist.TCPStore] = None
        self._thread = threading.Thread(target=self._run, name="rlsync-join")

    def start(self) -> "GroupJoin":
        _running.add(self)
        self._thread.start()
        return self

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def result(self) -> dist.ProcessGroup:
        """The group, once `future` is done; the join's exception otherwise."""
        if not self.future.done():
            raise RuntimeError("the join has not finished")
        return self.future.result()

    def _enter(self, stage: str) -> None:
        with self._lock:
            if self._cancelled:
                raise JoinCancelled(f"cancelled before {stage}")
            self._in_rendezvous = stage == "the rendezvous"

    def _run(self) -> None:
        try:
            try:
                group = init_group_on_route(
                    self._join,
                    backend=self.backend,
                    master_address=self.master_address,
                    master_port=self.master_port,
                    timeout=self.timeout,
                    hosts_rendezvous=True,
                )
            except UpdateGroupInitError as e:
                if isinstance(e.__cause__, JoinCancelled):
                    raise e.__cause__ from None
                raise
            self.future.set_result(group)
        except BaseException as e:  # reported by result()
            with self._lock:
                self._in_rendezvous = False
                if not self._cancelled:  # else cancel() drops it once released
                    self._store = None
            # Without tracebacks: their frames would keep the rendezvous
            # store, and so its port, alive as long as the exception lives.
            self.future.set_exception(_without_frames(e))

    def _join(self, left: Optional[float]) -> dist.ProcessGroup:
        deadline = time.monotonic() + (self.timeout if left is None else left)
        self._enter("the rendezvous")
        store = rendezvous_store(
            self.master_address, self.master_port, self.world_size, 0, _left(deadline)
        )
        self._store = store  # kept until cancel() is done releasing it
        self._enter("the process group")
        group = new_update_group(
            store,
            self.world_size,
            0,
            group_name=self.group_name,
            backend=self.backend,
            timeout=self.timeout,
            init_timeout=_left(deadline),
        )
        with self._lock:
            if self._cancelled:
                leave_update_group(group)
                raise JoinCancelled("cancelled while the process group formed")
            self._in_rendezvous = False
        return group

    def _release_rendezvous(self) -> None:
        """The rendezvous host waits until `world_size` ranks have connected;
        connecting the ranks that never came lets it return."""
        for _ in range(self.world_size - 1):
            try:
                dist.TCPStore(
                    self.master_address,
                    self.master_port,
                    self.world_size,
                    False,
                    _RELEASE_TIMEOUT,
                )
            except Exception as e:  # the store is already gone: nothing waits
                logger.debug("rlsync: releasing the rendezvous: %s", e)
                return

    def cancel(self, grace: float = 10.0) -> bool:
        """Tear the join down and wait up to `grace` seconds for its thread.
        True when the thread has ended."""
        with self._lock:
            self._cancelled = True
            release = self._in_rendezvous
        if release:
            self._release_rendezvous()
        self._thread.join(grace)
        self._store = None  # the rendezvous server stops with its last reference
        if self._thread.is_alive():
            logger.warning(
                "rlsync: the trainer's join of group %r is still creating its "
                "process group after %.0f s; it ends within its timeout (%.0f s)",
                self.group_name,
                grace,
                self.timeout,
            )
        return not self._thread.is_alive()


_running: "weakref.WeakSet[GroupJoin]" = weakref.WeakSet()


def _cancel_running() -> None:
    """At interpreter shutdown, before it waits for non-daemon threads: a
    join still waiting for its ranks would hold the exit until its timeout."""
    for join in list(_running):
        if join.alive:
            join.cancel(_SHUTDOWN_GRACE)


# Runs where concurrent.futures runs its own shutdown hook: before the
# interpreter joins non-daemon threads (atexit would run after).
getattr(threading, "_register_atexit", lambda fn: None)(_cancel_running)
