"""Bucket headers over NCCL (2 GPUs, no SGLang): their cost, and an in-band
abort that keeps the group.

Rank 0 (trainer, GPU 0) streams a Qwen2.5-7B-shaped update (339 bf16
tensors, 15.2 GB) with rlsync's data path (`rlsync.sender.stream_buckets`);
rank 1 (engine, GPU 1) receives it with the overlay's torch-only
`StagedWeightReceiver` (its own thread and CUDA stream), each bucket copied
into a staged copy by the sink. In one run, CUDA-synchronised, median of
--repeats after a warm-up, per bucket size:

  unframed   the receiver posts bucket k+1 before bucket k lands (today)
  framed     a 32-byte header before each bucket (`rlsync.framing`), the
             receiver waiting for header k before it posts bucket k

Then the in-band abort, framed, with 1 GiB buckets: the trainer's tensor
stream raises after 3 buckets, the sender broadcasts the abort header, the
receiver ends with nothing posted (`sender_aborted`, no pending work), and a
whole framed sync over the same communicator follows; the engine's staged
copy must then equal what was sent (digest over every tensor, in order).

Writes gpu-framing-<date>.json to $OUT (or bench/results/).

    NCCL_NVLS_ENABLE=0 python bench/gpu_framing.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
SWEEP_MB = (64, 256, 1024)


def load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


class TrainerFailed(RuntimeError):
    pass


def run(rank: int, args, result_path: str) -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29557")
    torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl", rank=rank, world_size=2, device_id=torch.device("cuda", rank)
    )
    from rlsync.digest import digest_tensors
    from rlsync.framing import BucketFraming
    from rlsync.planner import TensorSpec, plan_spec_buckets
    from rlsync.sender import stream_buckets
    from rlsync.stream import TensorStream

    # The 7B-shaped parameters and the receiver loaded by path, as there.
    gpu_sync = load("gpu_sync", ROOT / "bench" / "gpu_sync.py")
    sr = gpu_sync.load_receiver_module()
    params = gpu_sync.make_params(seed=200 + rank)  # rank 0: new; rank 1: old
    specs = [TensorSpec.of(name, t) for name, t in params]
    world = dist.group.WORLD
    ctrl = dist.new_group(backend="gloo")
    pool = sr.StagingPool(torch.device("cuda", rank)) if rank == 1 else None
    staged = {name: torch.empty_like(t) for name, t in params} if rank == 1 else {}
    res: dict = {"bytes": sum(t.numel() * 2 for _, t in params), "sweep": {}}

    def sink(named):
        with torch.no_grad():
            for name, tensor in named:
                staged[name].copy_(tensor)

    def sync(plans, session_id, tensors=None):
        """One sync on both ranks (the receiver started before the barrier,
        as prepare answers "ready" only then); seconds, first start to last
        end. The receiver on rank 1, for its state after."""
        rx = None
        if rank == 1:
            meta = [p.metadata(None).to_json() for p in plans]
            buckets = sr.parse_buckets(len(meta), meta, "flattened_bucket")
            rx = sr.StagedWeightReceiver(
                buckets,
                world,
                pool,
                "flattened_bucket",
                sink=sink,
                session_id=session_id,
            )
            rx.start()
        dist.barrier(group=ctrl)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        failed = None
        if rank == 0:
            framing = (
                None
                if session_id is None
                else BucketFraming(session_id, world, len(plans), "cuda")
            )
            stream = TensorStream(
                specs, tensors if tensors is not None else (t for _, t in params)
            )
            try:
                stream_buckets(plans, stream, world, framing=framing)
            except TrainerFailed as e:
                failed = e
        else:
            rx.wait(None)
            rx.synchronize()
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        spans = [None, None]
        dist.all_gather_object(spans, (t0, t1), group=ctrl)
        return max(e for _, e in spans) - min(s for s, _ in spans), rx, failed

    for mb in SWEEP_MB:
        plans = plan_spec_buckets(specs, mb << 20)
        row = {"buckets": len(plans)}
        for name, session_id in (
            ("unframed", None),
            ("framed", "bench-session-" + "x" * 8),
        ):
            times = []
            for i in range(1 + args.repeats):
                seconds, rx, _ = sync(plans, session_id)
                if rank == 1:
                    assert rx.complete, rx.error
                if i:
                    times.append(seconds)
            row[f"{name}_s"] = statistics.median(times)
            row[f"{name}_GBps"] = res["bytes"] / row[f"{name}_s"] / 1e9
        row["framed_over_unframed"] = row["framed_s"] / row["unframed_s"]
        res["sweep"][mb] = row
        if rank == 0:
            print(mb, "MiB buckets:", row, flush=True)

    # In-band abort, then a whole sync over the same communicator.
    plans = plan_spec_buckets(specs, 1 << 30)
    first_three = sum(len(p.specs) for p in plans[:3])

    def breaks_after_three_buckets():
        for i, (_, tensor) in enumerate(params):
            if i == first_three:
                raise TrainerFailed("the trainer's gather failed")
            yield tensor

    _, rx, failed = sync(plans, "bench-abort-" + "y" * 12, breaks_after_three_buckets())
    abort = {}
    if rank == 0:
        abort["sender_failed"] = repr(failed)
    else:
        abort.update(
            sender_aborted=rx.sender_aborted,
            pending_works=len(rx.pending_works),
            buckets_received=rx.stats.buckets_received,
            group_usable=rx.abort(),
            error=rx.error,
        )
    seconds, rx, _ = sync(plans, "bench-after-" + "z" * 12)
    mine = digest_tensors([staged[n] if rank == 1 else t for n, t in params])
    both = [None, None]
    dist.all_gather_object(both, mine, group=ctrl)
    abort.update(after_sync_s=seconds, after_sync_bit_exact=both[0] == both[1])
    parts = [None, None]
    dist.all_gather_object(parts, abort, group=ctrl)
    res["in_band_abort"] = {**parts[0], **parts[1]}
    if rank == 0:
        res.update(
            date=datetime.date.today().isoformat(),
            device=torch.cuda.get_device_name(0),
            gpus=torch.cuda.device_count(),
            torch=torch.__version__,
            nccl=".".join(map(str, torch.cuda.nccl.version())),
            nvls_enable=os.environ.get("NCCL_NVLS_ENABLE"),
            repeats=args.repeats,
        )
        Path(result_path).write_text(json.dumps(res, indent=2))
        print(json.dumps(res["in_band_abort"], indent=2), flush=True)
    dist.barrier(group=ctrl)
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast off
    out = Path(os.environ.get("OUT") or ROOT / "bench" / "results")
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"gpu-framing-{datetime.date.today().isoformat()}.json"
    mp.spawn(run, args=(args, str(path)), nprocs=2, join=True)


if __name__ == "__main__":
    main()
