"""Joining a weight-update process group from the trainer, without SGLang.

SGLang's engines join with `init_custom_process_group`: a TCP rendezvous, a
store prefixed with the group name, and a new (non-default) process group.
The trainer must join the same way, as rank 0.
"""

from __future__ import annotations

import inspect
from datetime import timedelta

import torch.distributed as dist
from torch.distributed.distributed_c10d import (
    Backend,
    PrefixStore,
    _new_process_group_helper,
    _world,
    rendezvous,
)

# Renamed from pg_options in torch 2.6.
_OPTIONS_ARG = (
    "backend_options"
    if "backend_options" in inspect.signature(_new_process_group_helper).parameters
    else "pg_options"
)


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
    """Join (as `rank`, the trainer is 0) the group the engines join."""
    assert master_address, "master_address cannot be empty"
    assert 0 < master_port < 65536, f"master_port out of range: {master_port}"
    assert world_size >= 2, f"world_size must be >= 2, got {world_size}"
    assert 0 <= rank < world_size, f"rank {rank} not in [0, {world_size})"
    assert group_name, "group_name cannot be empty"
    td = timedelta(seconds=timeout)
    init_method = f"tcp://{master_address}:{master_port}"
    store, rank, world_size = next(
        rendezvous(init_method, rank, world_size, timeout=td)
    )
    store.set_timeout(td)
    pg, _ = _new_process_group_helper(
        world_size,
        rank,
        [],
        Backend(backend),
        PrefixStore(group_name, store),
        group_name=group_name,
        timeout=td,
        **{_OPTIONS_ARG: None},
    )
    _world.pg_group_ranks[pg] = {i: i for i in range(world_size)}
    return pg


def leave_update_group(group: dist.ProcessGroup) -> None:
    dist.destroy_process_group(group)
