"""Trainer-side helpers for tests: join a server's update group over gloo and
push tensors with upstream's single-phase path, as a well-written trainer would
(each HTTP call in a thread, the broadcast beside it)."""

from __future__ import annotations

import concurrent.futures as cf
from typing import Iterable

import torch
import torch.distributed as dist

from harness.cpu_sglang import free_port
from rlsync import client
from rlsync.group import join_update_group
from rlsync.planner import dtype_name

_pool = cf.ThreadPoolExecutor(max_workers=8)


class GlooTrainer:
    """Rank 0 of one update group with the given servers (ranks by offset)."""

    def __init__(self, urls: list[str], tps: list[int], group_name: str = "rlsync_test",
                 timeout: float = 120.0, admin_key: str | None = None):  # fmt: skip
        self.urls, self.tps, self.group_name = urls, tps, group_name
        self.world_size = 1 + sum(tps)
        self.admin_key = admin_key
        port = free_port()
        offsets = [1 + sum(tps[:i]) for i in range(len(tps))]
        futures = [
            _pool.submit(
                client.init_weights_update_group,
                url,
                master_address="127.0.0.1",
                master_port=port,
                rank_offset=off,
                world_size=self.world_size,
                group_name=group_name,
                backend="gloo",
                timeout=timeout,
                admin_key=admin_key,
            )  # fmt: skip
            for url, off in zip(urls, offsets)
        ]
        self.group = join_update_group(
            "127.0.0.1", port, self.world_size, group_name=group_name, timeout=timeout
        )
        for f in futures:
            f.result()

    def update_single_phase(self, named: Iterable[tuple[str, torch.Tensor]]) -> None:
        named = list(named)
        futures = [
            _pool.submit(
                client.update_weights_from_distributed,
                url,
                names=[n for n, _ in named],
                dtypes=[dtype_name(t.dtype) for _, t in named],
                shapes=[list(t.shape) for _, t in named],
                group_name=self.group_name,
                admin_key=self.admin_key,
            )  # fmt: skip
            for url in self.urls
        ]
        for _, tensor in named:
            dist.broadcast(tensor.contiguous(), src=0, group=self.group)
        for f in futures:
            f.result()

    def close(self) -> None:
        for url in self.urls:
            try:
                client.destroy_weights_update_group(
                    url, group_name=self.group_name, admin_key=self.admin_key
                )
            except client.EngineError:
                pass
        dist.destroy_process_group(self.group)


def update_two_phase(
    trainer: "GlooTrainer",
    named: list[tuple[str, torch.Tensor]],
    *,
    load_format: str | None = "flattened_bucket",
    bucket_bytes: int = 1 << 20,
    digests: bool = True,
    weight_version: str | None = None,
    apply: bool = True,
    between_buckets=None,
) -> list[dict]:
    """prepare on every server, broadcast every bucket right after "ready"
    (no sleep), complete on every server: two HTTP calls per server."""
    from rlsync.digest import digest_tensors
    from rlsync.planner import plan_buckets

    buckets = plan_buckets(named, bucket_bytes)
    meta = [b.meta(digest_tensors(b.tensors) if digests else None) for b in buckets]
    for url in trainer.urls:
        client.prepare_weights_update(
            url, meta, group_name=trainer.group_name, load_format=load_format,
            weight_version=weight_version, admin_key=trainer.admin_key,
        )  # fmt: skip
    for i, bucket in enumerate(buckets):
        if load_format == "flattened_bucket":
            flat = torch.cat(
                [t.contiguous().reshape(-1).view(torch.uint8) for t in bucket.tensors]
            )
            dist.broadcast(flat, src=0, group=trainer.group)
        else:
            for t in bucket.tensors:
                dist.broadcast(t.contiguous(), src=0, group=trainer.group)
        if between_buckets is not None:
            between_buckets(i)
    futures = [
        _pool.submit(
            client.complete_weights_update,
            url,
            group_name=trainer.group_name,
            apply=apply,
            admin_key=trainer.admin_key,
        )  # fmt: skip
        for url in trainer.urls
    ]
    return [f.result() for f in futures]
