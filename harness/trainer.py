"""Trainer-side helpers for tests: join a server's update group over gloo; push
tensors with upstream's single-phase path, as a well-written trainer would
(each HTTP call in a thread, the broadcast beside it), or with the library's
own `WeightSender` over the same group (`update_two_phase`)."""

from __future__ import annotations

import concurrent.futures as cf
from typing import Iterable

import torch
import torch.distributed as dist

from harness.cpu_sglang import free_port
from rlsync import client
from rlsync.group import join_update_group
from rlsync.planner import dtype_name
from rlsync.protocol import CompleteWeightsUpdateResponse
from rlsync.sender import FLATTENED, Engine, WeightSender

_pool = cf.ThreadPoolExecutor(max_workers=8)


def gloo_sender(
    url: str, tp: int, bucket_bytes: int, prefix: str, timeout: float = 120.0
) -> WeightSender:
    """A connected `WeightSender` over gloo into one server, in a group of
    its own (`prefix` and a free port name it)."""
    sender = WeightSender(
        [Engine(url, tp_size=tp)],
        master_port=free_port(),
        group_name=f"{prefix}_{free_port()}",
        backend="gloo",
        bucket_bytes=bucket_bytes,
        timeout=timeout,
    )
    sender.connect()
    return sender


class GlooTrainer:
    """Rank 0 of one update group with the given servers (ranks by offset).

    It joins with upstream's calls alone, so it works against a pristine
    server too; `sender` is a `WeightSender` over the same group."""

    def __init__(
        self,
        urls: list[str],
        tps: list[int],
        group_name: str = "rlsync_test",
        timeout: float = 120.0,
        admin_key: str | None = None,
    ):
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
            )
            for url, off in zip(urls, offsets)
        ]
        self.group = join_update_group(
            "127.0.0.1", port, self.world_size, group_name=group_name, timeout=timeout
        )
        for f in futures:
            f.result()
        self.sender = WeightSender(
            [Engine(url, tp, admin_key=admin_key) for url, tp in zip(urls, tps)],
            master_port=port,
            group_name=group_name,
            backend="gloo",
            timeout=timeout,
        )
        self.sender.group = self.group

    def update_single_phase(self, named: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Upstream's path; inside upstream's weight-update session where the
        release has one (0.5.23)."""
        named = list(named)
        opened = [
            url
            for url in self.urls
            if client.begin_weight_update(url, admin_key=self.admin_key)
        ]
        try:
            self._broadcast_single_phase(named)
        finally:
            for url in opened:
                client.end_weight_update(url, admin_key=self.admin_key)

    def _broadcast_single_phase(self, named: list[tuple[str, torch.Tensor]]) -> None:
        futures = [
            _pool.submit(
                client.update_weights_from_distributed,
                url,
                names=[n for n, _ in named],
                dtypes=[dtype_name(t.dtype) for _, t in named],
                shapes=[list(t.shape) for _, t in named],
                group_name=self.group_name,
                admin_key=self.admin_key,
            )
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
    load_format: str | None = FLATTENED,
    bucket_bytes: int = 1 << 20,
    digests: bool = True,
    weight_version: str | None = None,
    apply: bool = True,
    between_buckets=None,
    flush_cache: bool | None = None,
) -> list[CompleteWeightsUpdateResponse]:
    """One `WeightSender.sync` over the trainer's group: prepare on every
    server, broadcast every bucket right after "ready" (no sleep), complete on
    every server. Each server's own answer to its complete, in order;
    `between_buckets(i)` runs after bucket i is sent."""
    sender = trainer.sender
    sender.load_format, sender.bucket_bytes, sender.digests = (
        load_format,
        bucket_bytes,
        digests,
    )
    progress = None
    if between_buckets is not None:

        def progress(sent: int, total: int, nbytes: int) -> None:
            between_buckets(sent - 1)

    result = sender.sync(
        named,
        weight_version=weight_version,
        apply=apply,
        progress=progress,
        flush_cache=flush_cache,
    )
    failed = [e for e in result.engines if not e.answered]
    if failed:
        raise client.EngineError(
            failed[0].url, "/complete_weights_update", None, failed[0].message
        )
    return [e.answer for e in result.engines]
