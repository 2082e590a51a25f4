"""GPU smoke check of the staged receive path over NCCL (2 GPUs, no SGLang).

Rank 0 (trainer, GPU 0) plans buckets of a model-shaped parameter set and
broadcasts them flattened; rank 1 (engine, GPU 1) receives them with the
overlay's torch-only `StagedWeightReceiver` on its own CUDA stream, verifies
the digests, and copies the staged tensors into its parameters. Checks the
bytes and times the transfer against a raw NCCL broadcast of the same bytes.
Writes JSON to $OUT (or bench/results/) named gpu-smoke-<date>.json.

    python bench/gpu_receiver_smoke.py [--gb 4] [--bucket-mb 512] [--repeats 5]
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
RECEIVER = ROOT / "overlay/python/sglang/srt/weight_sync/staged_receiver.py"


def load_receiver_module():
    spec = importlib.util.spec_from_file_location("staged_receiver", RECEIVER)
    module = importlib.util.module_from_spec(spec)
    sys.modules["staged_receiver"] = module
    spec.loader.exec_module(module)
    return module


def model_shaped(total_bytes: int, device: str, seed: int) -> list:
    """Llama-like layers (bf16) until total_bytes."""
    gen = torch.Generator(device=device).manual_seed(seed)
    h, inter = 3584, 18944
    shapes = [("q_proj", (h, h)), ("k_proj", (512, h)), ("v_proj", (512, h)),
              ("o_proj", (h, h)), ("gate_proj", (inter, h)), ("up_proj", (inter, h)),
              ("down_proj", (h, inter)), ("input_layernorm", (h,))]  # fmt: skip
    out, size, layer = [], 0, 0
    while size < total_bytes:
        for name, shape in shapes:
            t = torch.randn(shape, generator=gen, device=device, dtype=torch.float32)
            out.append((f"model.layers.{layer}.{name}.weight", t.to(torch.bfloat16)))
            size += out[-1][1].numel() * 2
        layer += 1
    return out


def cuda_time(fn) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def run(rank: int, args, result_path: str) -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29555")
    torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl", rank=rank, world_size=2, device_id=torch.device("cuda", rank)
    )
    from rlsync.digest import digest_bytes
    from rlsync.planner import plan_buckets

    sr = load_receiver_module()
    params = model_shaped(
        int(args.gb * 2**30), "cuda", seed=rank
    )  # rank 1: "old" weights
    buckets = plan_buckets(params, args.bucket_mb << 20)
    if rank == 0:
        flats = [
            torch.cat([t.reshape(-1).view(torch.uint8) for t in b.tensors])
            for b in buckets
        ]
        t0 = time.perf_counter()
        digests = [digest_bytes(f) for f in flats]
        digest_s = time.perf_counter() - t0
        meta = [b.meta(d) for b, d in zip(buckets, digests)]
    else:
        flats = [
            torch.empty(b.nbytes, dtype=torch.uint8, device="cuda") for b in buckets
        ]
        meta = None
    box = [meta]
    dist.broadcast_object_list(box, src=0)
    meta = box[0]
    total = sum(f.numel() for f in flats)

    def raw():
        for f in flats:
            dist.broadcast(f, src=0)

    for _ in range(2):
        raw()
    raw_s = [cuda_time(raw) for _ in range(args.repeats)]

    ours_s, apply_s, verify_s, ok = [], [], [], True
    pool = sr.StagingPool(torch.device("cuda", rank)) if rank == 1 else None
    specs = sr.parse_buckets(len(meta), meta, "flattened_bucket") if rank == 1 else None
    target = dict(params)
    for i in range(2 + args.repeats):
        dist.barrier()
        if rank == 0:
            t = cuda_time(raw)  # the sender side is the same broadcasts
        else:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            rx = sr.StagedWeightReceiver(
                specs, dist.group.WORLD, pool, "flattened_bucket"
            )
            rx.start()
            rx.wait(None)
            rx.synchronize()
            t = time.perf_counter() - t0
            ok &= rx.complete and not rx.verify()
            verify_s.append(rx.stats.verify_seconds)

            def apply():
                with torch.no_grad():
                    for name, tensor in rx.named_tensors():
                        target[name].copy_(tensor)

            apply_s.append(cuda_time(apply))
        if i >= 2:
            ours_s.append(t)
    if rank == 1:
        sender = model_shaped(int(args.gb * 2**30), "cuda", seed=0)
        ok &= all(torch.equal(target[n], t) for n, t in sender)
        med = statistics.median
        result = {
            "device": torch.cuda.get_device_name(rank),
            "gpus": torch.cuda.device_count(),
            "torch": torch.__version__,
            "nccl": ".".join(map(str, torch.cuda.nccl.version())),
            "bytes": total,
            "buckets": len(meta),
            "bytes_match": bool(ok),
            "raw_s": raw_s,
            "ours_s": ours_s,
            "apply_s": apply_s,
            "receiver_verify_s": verify_s,
            "raw_GBps": total / med(raw_s) / 1e9,
            "ours_GBps": total / med(ours_s) / 1e9,
            "transfer_ratio_vs_raw": med(raw_s) / med(ours_s),
            "apply_ms_per_15GB": med(apply_s) * 1e3 * 15e9 / total,
        }
        Path(result_path).write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps(result, indent=2))
    if rank == 0:
        print(f"sender digest of {total / 1e9:.1f} GB: {digest_s * 1e3:.1f} ms")
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gb", type=float, default=4)
    ap.add_argument("--bucket-mb", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    out = Path(os.environ.get("OUT") or ROOT / "bench" / "results")
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"gpu-smoke-{datetime.date.today().isoformat()}.json"
    mp.spawn(run, args=(args, str(path)), nprocs=2, join=True)


if __name__ == "__main__":
    main()
