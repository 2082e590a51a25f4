"""Two NCCL communicators driven at once from two threads on every rank, as a
TP 2 engine does while a two-phase update arrives (2 GPUs, no SGLang).

Each rank is a TP rank of one engine: its main thread runs decode-like steps
(a GEMV and an all-reduce on the TP group, then a host sync), and a side
thread on its own CUDA stream runs the update group's broadcasts, as the
staged receiver does. Rank 0's side thread sends (standing in for the
trainer: NCCL refuses two ranks of one communicator on one GPU, and this
machine has two), rank 1's receives. Random pauses on both threads vary the
order in which the two communicators' kernels reach each GPU, which is what
could deadlock two communicators that cannot run side by side.

For each environment (the default, and CUDA_DEVICE_MAX_CONNECTIONS=1, which
trainers built on Megatron set and which serialises kernel launches) it
records whether every bucket arrived and every step finished before the
deadline, and how many serving steps ran meanwhile. A hang is a failure: the
parent kills the ranks at the deadline.

The side thread must make its rank's GPU current (CUDA's current device is
per thread; the staged receiver does this): a first version did not, so
rank 1's thread waited on streams of GPU 0, returned at once with its
broadcasts still queued, and both ranks hung at the group's timeout
(gpu-tp-concurrency-thread-on-device-0-2026-11-28.json).

    NCCL_NVLS_ENABLE=0 python bench/gpu_tp_concurrency.py [--buckets 200]

Writes gpu-tp-concurrency-<date>.json to $OUT (or bench/results/).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import sys
import threading
import time
from pathlib import Path

from gpu_ranks import free_port, progress, run_ranks


def rank_main(rank: int, port: int, buckets: int, bucket_mb: int, limit: float):
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    timeout = datetime.timedelta(seconds=limit)
    dist.init_process_group(
        "nccl",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=2,
        timeout=timeout,
        device_id=torch.device(f"cuda:{rank}"),
    )
    tp = dist.new_group([0, 1], backend="nccl", timeout=timeout)
    update = dist.new_group([0, 1], backend="nccl", timeout=timeout)
    warm = torch.ones(1, device="cuda")
    dist.all_reduce(warm, group=tp)
    dist.broadcast(warm, src=0, group=update)
    torch.cuda.synchronize()
    progress(rank, "warm")

    rng = random.Random(rank * 7919 + 1)
    bucket = torch.empty((bucket_mb << 20) // 2, dtype=torch.bfloat16, device="cuda")
    if rank == 0:
        bucket.fill_(1.0)
    received = {"buckets": 0, "error": None}

    def transfer() -> None:
        torch.cuda.set_device(rank)  # per thread, as the staged receiver does
        stream = torch.cuda.Stream()
        try:
            with torch.cuda.stream(stream):
                for _ in range(buckets):
                    time.sleep(rng.random() * 0.004)
                    work = dist.broadcast(bucket, src=0, group=update, async_op=True)
                    work.wait()
                    stream.synchronize()
                    received["buckets"] += 1
                    if received["buckets"] % 10 == 0:
                        progress(rank, f"bucket {received['buckets']}")
        except Exception as e:  # reported
            received["error"] = repr(e)

    weight = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    hidden = torch.randn(8, 8192, device="cuda", dtype=torch.bfloat16)
    # The same number of steps on both ranks (each is a collective).
    steps_alone, started = 2000, time.perf_counter()
    for _ in range(steps_alone):
        out = hidden @ weight
        dist.all_reduce(out, group=tp)
        torch.cuda.synchronize()
    rate_alone = steps_alone / (time.perf_counter() - started)
    progress(rank, "alone done")

    thread = threading.Thread(target=transfer)
    steps, started = 0, time.perf_counter()
    thread.start()
    stop = torch.zeros(1, device="cuda")
    while True:
        out = hidden @ weight
        dist.all_reduce(out, group=tp)
        torch.cuda.synchronize()
        steps += 1
        if steps % 100 == 0:
            progress(rank, f"step {steps}")
        if rng.random() < 0.1:
            time.sleep(rng.random() * 0.003)
        # Stop together once both ranks' transfers are over.
        if steps % 16 == 0:
            stop.fill_(0.0 if thread.is_alive() else 1.0)
            dist.all_reduce(stop, op=dist.ReduceOp.MIN, group=tp)
            if stop.item() == 1.0:
                break
    seconds = time.perf_counter() - started
    thread.join()
    print(
        json.dumps(
            {
                "rank": rank,
                "buckets": received["buckets"],
                "error": received["error"],
                "serving_steps": steps,
                "seconds": round(seconds, 3),
                "steps_per_s_alone": round(rate_alone, 1),
                "steps_per_s_during": round(steps / seconds, 1),
                "bytes": buckets * (bucket_mb << 20),
            }
        ),
        flush=True,
    )
    dist.destroy_process_group()


def run_case(env_extra: dict, args) -> dict:
    port = free_port()
    flags = ["--port", str(port), "--buckets", str(args.buckets)]
    flags += ["--bucket-mb", str(args.bucket_mb), "--limit", str(args.limit)]
    hung, runs = run_ranks(
        lambda rank: [sys.executable, __file__, "--rank", str(rank), *flags],
        {**os.environ, **env_extra},
        args.limit + 60,
    )
    outcome = {"env": env_extra, "hung": hung, "ranks": [], "stderr_tail": []}
    out_dir = Path(os.environ.get("OUT") or "/tmp")
    for k, run in enumerate(runs, start=1):
        if run.last_json_line():
            outcome["ranks"].append(json.loads(run.last_json_line()))
        outcome["stderr_tail"].append(run.stderr[-800:])
        outcome.setdefault("last_progress", []).append(run.progress_lines()[-3:])
        (out_dir / f"stderr-{port}-{k}.log").write_text(run.stderr)
        outcome.setdefault("exitcodes", []).append(run.returncode)
    outcome["ok"] = (
        not outcome["hung"]
        and len(outcome["ranks"]) == 2
        and all(
            r["buckets"] == args.buckets and r["error"] is None
            for r in outcome["ranks"]
        )
    )
    return outcome


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int)
    parser.add_argument("--port", type=int)
    parser.add_argument("--buckets", type=int, default=200)
    parser.add_argument("--bucket-mb", type=int, default=256)
    parser.add_argument("--limit", type=float, default=120.0)
    args = parser.parse_args()
    if args.rank is not None:
        rank_main(args.rank, args.port, args.buckets, args.bucket_mb, args.limit)
        return

    import torch

    cases = [{}, {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}]
    results = {
        "what": "two NCCL communicators at once from two threads per rank "
        "(TP all-reduce steps on the main thread, update-group broadcasts on "
        "a side thread and stream)",
        "machine": {
            "gpus": [
                torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())
            ],
            "torch": torch.__version__,
            "nccl": ".".join(str(v) for v in torch.cuda.nccl.version()),
        },
        "buckets": args.buckets,
        "bucket_mb": args.bucket_mb,
        "cases": [run_case(env, args) for env in cases],
    }
    out_dir = Path(os.environ.get("OUT") or Path(__file__).parent / "results")
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"gpu-tp-concurrency-{datetime.date.today().isoformat()}.json"
    path.write_text(json.dumps(results, indent=1))
    for case in results["cases"]:
        print(case["env"], "ok" if case["ok"] else "FAILED", case["ranks"])
    print(path)


if __name__ == "__main__":
    main()
