"""GPU data plane of one 7B-sized weight sync over NCCL (2 GPUs, no SGLang).

Rank 0 (trainer, GPU 0) holds a Qwen2.5-7B-shaped parameter set (339 bf16
tensors, 15.2 GB) and sends with rlsync's data path
(`rlsync.sender.broadcast_buckets`: flattened buckets, bucket k+1 packed while
k is on the wire). Rank 1 (engine, GPU 1) receives with the overlay's
torch-only `StagedWeightReceiver` (its own thread and CUDA stream, staging
without an extra copy, digests checked as buckets land) and applies into its
own parameters. In one run, CUDA-synchronised, median of --repeats after
warm-up:

  raw        NCCL broadcast of the same bytes, pre-packed, back to back
  ours       prepare-equivalent (staging acquired, receiver started) -> every
             bucket staged (and verified, with digests) ; apply apart
  upstream   per-tensor async broadcasts into fresh tensors, then the copies
             into parameters (0.5.10's update_weights_from_distributed);
             flattened buckets packed then sent one by one, unpacked as views
             and copied (its "flattened_bucket" path)
  serving    decode-like work (batch-8 GEMVs against a 7B layer's MLP
             weights, memory-bound) on GPU 1's compute stream, alone and
             while our receive runs on its own stream; each against itself
  sweep      bucket sizes 64 MB .. 2 GB, raw vs ours

Writes gpu-<date>.json to $OUT (or bench/results/).

    NCCL_NVLS_ENABLE=0 python bench/gpu_sync.py [--repeats 5] [--bucket-mb 1024]
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import importlib.util
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
RECEIVER = ROOT / "common/python/sglang/srt/weight_sync/staged_receiver.py"

# Qwen2.5-7B: hidden 3584, MLP 18944, 28 layers, 4 KV heads of 128, vocab 152064.
HIDDEN, INTER, LAYERS, KV, VOCAB = 3584, 18944, 28, 512, 152064
SWEEP_MB = (64, 256, 512, 1024, 2048)
med = statistics.median


def load_receiver_module():
    """The server's receiver, loaded by path (no SGLang on the GPU machine);
    its digest and header imports are the trainer's generated copies of the
    same modules."""
    for name in ("digest", "bucket_header"):
        sys.modules.setdefault(
            f"sglang.srt.weight_sync.{name}", importlib.import_module(f"rlsync.{name}")
        )
    spec = importlib.util.spec_from_file_location("staged_receiver", RECEIVER)
    module = importlib.util.module_from_spec(spec)
    sys.modules["staged_receiver"] = module
    spec.loader.exec_module(module)
    return module


def qwen7b_shapes() -> list[tuple[str, tuple[int, ...]]]:
    out = [("model.embed_tokens.weight", (VOCAB, HIDDEN))]
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        out += [
            (p + "self_attn.q_proj.weight", (HIDDEN, HIDDEN)),
            (p + "self_attn.q_proj.bias", (HIDDEN,)),
            (p + "self_attn.k_proj.weight", (KV, HIDDEN)),
            (p + "self_attn.k_proj.bias", (KV,)),
            (p + "self_attn.v_proj.weight", (KV, HIDDEN)),
            (p + "self_attn.v_proj.bias", (KV,)),
            (p + "self_attn.o_proj.weight", (HIDDEN, HIDDEN)),
            (p + "mlp.gate_proj.weight", (INTER, HIDDEN)),
            (p + "mlp.up_proj.weight", (INTER, HIDDEN)),
            (p + "mlp.down_proj.weight", (HIDDEN, INTER)),
            (p + "input_layernorm.weight", (HIDDEN,)),
            (p + "post_attention_layernorm.weight", (HIDDEN,)),
        ]
    return out + [("model.norm.weight", (HIDDEN,)), ("lm_head.weight", (VOCAB, HIDDEN))]


def make_params(seed: int) -> list[tuple[str, torch.Tensor]]:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    out = []
    for name, shape in qwen7b_shapes():
        t = torch.empty(shape, dtype=torch.bfloat16, device="cuda")
        t.normal_(generator=gen)
        out.append((name, t))
    return out


def timed(fn) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


class DecodeLike:
    """Batch-8 GEMVs through one 7B layer's MLP: memory-bound like decoding."""

    def __init__(self):
        gen = torch.Generator(device="cuda").manual_seed(7)
        self.w = [
            torch.randn(s, generator=gen, device="cuda", dtype=torch.bfloat16)
            for s in [(INTER, HIDDEN), (INTER, HIDDEN), (HIDDEN, INTER)]
        ]
        self.x = torch.randn(8, HIDDEN, device="cuda", dtype=torch.bfloat16)

    def step(self, n: int = 10) -> None:
        for _ in range(n):
            g = self.x @ self.w[0].t()
            u = self.x @ self.w[1].t()
            self.x = ((g * u) @ self.w[2].t()) * 1e-3

    def bytes_per_step(self) -> int:
        return sum(w.numel() * 2 for w in self.w)

    def run_for(self, seconds: float) -> float:
        """Steps per second over about `seconds`."""
        torch.cuda.synchronize()
        t0, n = time.perf_counter(), 0
        while time.perf_counter() - t0 < seconds:
            self.step()
            torch.cuda.current_stream().synchronize()
            n += 10
        return n / (time.perf_counter() - t0)

    def run_until(self, done) -> tuple[int, float]:
        torch.cuda.synchronize()
        t0, n = time.perf_counter(), 0
        while not done():
            self.step()
            torch.cuda.current_stream().synchronize()
            n += 10
        return n, time.perf_counter() - t0


def run(rank: int, args, result_path: str) -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29556")
    torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl", rank=rank, world_size=2, device_id=torch.device("cuda", rank)
    )
    from rlsync.digest import digest_tensors
    from rlsync.planner import plan_buckets
    from rlsync.sender import broadcast_buckets

    sr = load_receiver_module()
    params = make_params(seed=100 + rank)  # rank 0: new weights; rank 1: old
    total = sum(t.numel() * 2 for _, t in params)
    world = dist.group.WORLD
    # Barriers and metadata on their own (gloo) group: a receiver started
    # ahead of a barrier has broadcasts posted on `world` already, and NCCL
    # ops of one communicator must come in the same order on every rank.
    ctrl = dist.new_group(backend="gloo")
    res: dict = {}
    warm = 2

    def repeat(fn, n=args.repeats, before=None):
        """fn on both ranks after a barrier; `before` runs untimed ahead of the
        barrier (the receiver's start: prepare answers "ready" only then).
        Seconds from the first rank's start to the last rank's end, on the
        host's one monotonic clock, so neither rank's view alone decides."""
        out = []
        for i in range(warm + n):
            if before is not None:
                before()
            dist.barrier(group=ctrl)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            t1 = time.perf_counter()
            spans = [None, None]
            dist.all_gather_object(spans, (t0, t1), group=ctrl)
            if i >= warm:
                out.append(max(e for _, e in spans) - min(s for s, _ in spans))
        return out

    # --- raw: the same bytes, pre-packed, back to back ------------------------
    def plan(mb):
        return plan_buckets(params, mb << 20)

    def raw_for(buckets):
        if rank == 0:
            flats = [
                torch.cat([t.reshape(-1).view(torch.uint8) for t in b.tensors])
                for b in buckets
            ]
        else:
            flats = [
                torch.empty(b.nbytes, dtype=torch.uint8, device="cuda") for b in buckets
            ]

        def raw():
            for f in flats:
                dist.broadcast(f, src=0)

        times = repeat(raw)
        return times

    # --- ours: WeightSender's data path -> StagedWeightReceiver ----------------
    pool = sr.StagingPool(torch.device("cuda", rank)) if rank == 1 else None
    target = dict(params)
    staged_copy = {name: torch.empty_like(t) for name, t in params} if rank == 1 else {}

    def ours_for(
        buckets,
        digests: bool,
        apply_times=None,
        timelines=None,
        sender="pack-copy",
        receiver="staged",
        start_in_timing=False,
    ):
        meta = None
        if rank == 0:
            meta = [
                b.meta(digest_tensors(b.tensors) if digests else None) for b in buckets
            ]
        box = [meta]
        dist.broadcast_object_list(box, src=0, group=ctrl)
        specs = sr.parse_buckets(len(box[0]), box[0], "flattened_bucket")

        prepacked = None
        if (rank == 0 and sender == "prepacked") or (rank == 1 and receiver == "raw"):
            prepacked = [
                torch.cat([t.reshape(-1).view(torch.uint8) for t in b.tensors])
                for b in buckets
            ]

        def once():
            once.t_start = (
                time.perf_counter()
            )  # this rank's; the sender starts within the barrier's skew
            if prepacked is not None:
                for f in prepacked:
                    dist.broadcast(f, src=0)
                return
            if rank == 0:
                broadcast_buckets(buckets, world, pack=sender.removeprefix("pack-"))
                return
            if start_in_timing:
                start()
            rx = once.rx
            rx.wait(None)
            rx.synchronize()
            assert rx.complete and not rx.verify(), (rx.error, rx.verify())

        def stage(named):
            # The shard staging's sink: each bucket into the staged copy.
            with torch.no_grad():
                for name, tensor in named:
                    staged_copy[name].copy_(tensor)

        def start():
            once.rx = sr.StagedWeightReceiver(
                specs, world, pool, "flattened_bucket", sink=stage
            )
            once.rx.start()

        staged = rank == 1 and prepacked is None
        times = repeat(once, before=start if staged and not start_in_timing else None)
        if rank == 1 and receiver == "staged":
            rx = once.rx
            if timelines is not None:
                # From the sender's start (the barrier), not the receiver's.
                skew = once.t_start - rx._t0
                timelines.append([t - skew for t in rx.stats.bucket_done_seconds])

            def apply():
                with torch.no_grad():
                    for name, tensor in staged_copy.items():
                        target[name].copy_(tensor)

            if apply_times is not None:
                apply_times += [timed(apply) for _ in range(args.repeats)]
        return times

    main_buckets = plan(args.bucket_mb)
    res["bytes"], res["tensors"], res["buckets"] = total, len(params), len(main_buckets)
    raw_s = raw_for(main_buckets)
    apply_s, timeline = [], []
    ours_s = ours_for(
        main_buckets, digests=True, apply_times=apply_s, timelines=timeline
    )
    ours_nodigest_s = ours_for(main_buckets, digests=False)
    # The same, timing also the receiver's construction and thread start.
    ours_with_start_s = ours_for(main_buckets, digests=True, start_in_timing=True)
    # Small first buckets (64 MB, 256 MB, then 1 GB) to start the wire sooner.
    ramp_buckets = plan_buckets(
        params, args.bucket_mb << 20, first_bucket_bytes=64 << 20
    )
    ours_ramp_timeline = []
    ours_ramp_s = ours_for(ramp_buckets, digests=True, timelines=ours_ramp_timeline)
    ours_ramp_nodigest_s = ours_for(ramp_buckets, digests=False)
    # A trainer whose parameters live in one flat buffer (Megatron-style):
    # buckets are already packed, the sender sends views of it.
    if rank == 0:
        flat_params = torch.empty(total, dtype=torch.uint8, device="cuda")
        contiguous, off = [], 0
        for name, t in params:
            n = t.numel() * 2
            view = flat_params[off : off + n].view(torch.bfloat16).view(t.shape)
            view.copy_(t)
            contiguous.append((name, view))
            off += n
        contiguous_buckets = plan_buckets(contiguous, args.bucket_mb << 20)
    else:
        contiguous_buckets = main_buckets
    ours_contiguous_s = ours_for(contiguous_buckets, digests=True)
    if rank == 0:
        del flat_params, contiguous, contiguous_buckets
    # Where the time goes: one side ours, the other side raw.
    diagnosis = {
        "sender_pack_cat": ours_for(main_buckets, True, sender="pack-cat"),
        "sender_prepacked_receiver_staged": ours_for(
            main_buckets, True, sender="prepacked"
        ),
        "sender_prepacked_receiver_staged_nodigest": ours_for(
            main_buckets, False, sender="prepacked"
        ),
        "sender_pack_copy_receiver_raw": ours_for(main_buckets, True, receiver="raw"),
        "sender_pack_cat_receiver_raw": ours_for(
            main_buckets, True, sender="pack-cat", receiver="raw"
        ),
    }

    # sender-side digest cost (computed before prepare)
    if rank == 0:
        digest_s = [
            timed(lambda: [digest_tensors(b.tensors) for b in main_buckets])
            for _ in range(args.repeats)
        ]
        res["sender_digest_ms"] = med(digest_s) * 1e3

    # --- upstream 0.5.10 baselines ---------------------------------------------
    def per_tensor():
        if rank == 0:
            works = [dist.broadcast(t, src=0, async_op=True) for _, t in params]
            for w in works:
                w.wait()
            return
        recv = [(n, torch.empty_like(t)) for n, t in params]
        works = [dist.broadcast(t, src=0, async_op=True) for _, t in recv]
        for w in works:
            w.wait()
        with torch.no_grad():
            for name, t in recv:
                target[name].copy_(t)

    def flattened():
        for b in main_buckets:
            if rank == 0:
                flat = torch.cat([t.reshape(-1).view(torch.uint8) for t in b.tensors])
                dist.broadcast(flat, src=0)
                continue
            flat = torch.empty(b.nbytes, dtype=torch.uint8, device="cuda")
            dist.broadcast(flat, src=0)
            off = 0
            with torch.no_grad():
                for name, t in zip(b.names, b.tensors):
                    n = t.numel() * 2
                    target[name].copy_(
                        flat[off : off + n].view(torch.bfloat16).view(t.shape)
                    )
                    off += n

    upstream_per_tensor_s = repeat(per_tensor)
    upstream_flat_s = repeat(flattened)

    # --- serving impact --------------------------------------------------------
    # Decode-like work on GPU 1's compute stream while a receive runs beside it:
    # ours (own thread and stream, with and without digests) and, as the
    # baseline, a raw NCCL receive on a side stream.
    serving = {}
    if rank == 1:
        decode = DecodeLike()
        decode.run_for(1.0)  # warm-up
        serving["decode_steps_per_s_alone"] = decode.run_for(2.0)
        recv_flats = [
            torch.empty(b.nbytes, dtype=torch.uint8, device="cuda")
            for b in main_buckets
        ]
    specs_by_mode = {}
    for mode, digests in (("ours", True), ("ours_nodigest", False)):
        box = [None]
        if rank == 0:
            meta = [
                b.meta(digest_tensors(b.tensors) if digests else None)
                for b in main_buckets
            ]
            box = [meta]
        dist.broadcast_object_list(box, src=0, group=ctrl)
        specs_by_mode[mode] = sr.parse_buckets(len(box[0]), box[0], "flattened_bucket")

    def raw_side_stream_receive():
        side = torch.cuda.Stream()
        done = threading.Event()

        def work():
            with torch.cuda.stream(side):
                for f in recv_flats:
                    dist.broadcast(f, src=0)
            side.synchronize()
            done.set()

        threading.Thread(target=work, daemon=True).start()
        return done

    alone = {"ours": ours_s, "ours_nodigest": ours_nodigest_s, "raw_side_stream": raw_s}
    for mode in ("ours", "ours_nodigest", "raw_side_stream"):
        during, rx_during = [], []
        for _ in range(args.repeats):
            if rank == 1 and mode != "raw_side_stream":
                rx = sr.StagedWeightReceiver(
                    specs_by_mode[mode], world, pool, "flattened_bucket"
                )
                rx.start()  # "ready": only then does the trainer send
            dist.barrier(group=ctrl)
            t0 = time.perf_counter()
            if rank == 0:
                broadcast_buckets(main_buckets, world)  # same bytes for every mode
                torch.cuda.synchronize()
            elif mode == "raw_side_stream":
                done = raw_side_stream_receive()
                steps, secs = decode.run_until(done.is_set)
            else:
                steps, secs = decode.run_until(lambda: rx.done)
                rx.synchronize()
                assert rx.complete and not rx.verify()
            spans = [None, None]
            dist.all_gather_object(spans, (t0, time.perf_counter()), group=ctrl)
            if rank == 1:  # first start to last end, as in repeat()
                rx_during.append(max(e for _, e in spans) - min(s for s, _ in spans))
                during.append(steps / secs if secs else 0.0)
        if rank == 1:
            serving[mode] = dict(
                decode_steps_per_s_during_receive=med(during),
                decode_kept=med(during) / serving["decode_steps_per_s_alone"],
                receive_s_alone=med(alone[mode]),
                receive_s_with_decode=med(rx_during),
                receive_slowdown=med(rx_during) / med(alone[mode]),
            )
    if rank == 1:
        serving["decode_GBps_alone"] = (
            serving["decode_steps_per_s_alone"] * decode.bytes_per_step() / 1e9
        )
        del recv_flats

    # --- bucket sweep ------------------------------------------------------------
    sweep = []
    for mb in SWEEP_MB:
        b = plan(mb)
        r, o = raw_for(b), ours_for(b, digests=True)
        sweep.append(
            dict(
                bucket_mb=mb,
                buckets=len(b),
                raw_ms=med(r) * 1e3,
                ours_ms=med(o) * 1e3,
                ratio=med(r) / med(o),
            )
        )

    # correctness: every apply (ours and the baselines) wrote the sender's weights
    ok = True
    if rank == 1:
        sent = make_params(seed=100)
        ok = all(torch.equal(target[n], t) for n, t in sent)
        del sent

    if rank == 1:
        res.update(
            device=torch.cuda.get_device_name(rank),
            gpus=torch.cuda.device_count(),
            torch=torch.__version__,
            nccl=".".join(map(str, torch.cuda.nccl.version())),
            nvls_enable=os.environ.get("NCCL_NVLS_ENABLE"),
            bucket_mb=args.bucket_mb,
            repeats=args.repeats,
            bytes_match=bool(ok),
            raw_s=raw_s,
            ours_s=ours_s,
            ours_nodigest_s=ours_nodigest_s,
            apply_s=apply_s,
            upstream_per_tensor_s=upstream_per_tensor_s,
            upstream_flattened_s=upstream_flat_s,
            raw_GBps=total / med(raw_s) / 1e9,
            ours_GBps=total / med(ours_s) / 1e9,
            ours_nodigest_GBps=total / med(ours_nodigest_s) / 1e9,
            transfer_ratio_vs_raw=med(raw_s) / med(ours_s),
            transfer_ratio_vs_raw_nodigest=med(raw_s) / med(ours_nodigest_s),
            ours_contiguous_params_s=ours_contiguous_s,
            ours_with_receiver_start_s=ours_with_start_s,
            transfer_ratio_vs_raw_with_receiver_start=med(raw_s)
            / med(ours_with_start_s),
            ramp_buckets=len(ramp_buckets),
            ours_ramp_s=ours_ramp_s,
            ours_ramp_nodigest_s=ours_ramp_nodigest_s,
            transfer_ratio_vs_raw_ramp=med(raw_s) / med(ours_ramp_s),
            transfer_ratio_vs_raw_ramp_nodigest=med(raw_s) / med(ours_ramp_nodigest_s),
            bucket_timeline_ramp_s=ours_ramp_timeline[-1] if ours_ramp_timeline else [],
            transfer_ratio_vs_raw_contiguous_params=med(raw_s) / med(ours_contiguous_s),
            apply_ms_per_15GB=med(apply_s) * 1e3 * 15e9 / total,
            ours_plus_apply_ratio_vs_raw=med(raw_s) / (med(ours_s) + med(apply_s)),
            upstream_per_tensor_ratio_vs_raw=med(raw_s) / med(upstream_per_tensor_s),
            upstream_flattened_ratio_vs_raw=med(raw_s) / med(upstream_flat_s),
            bucket_timeline_s=timeline[-1] if timeline else [],
            diagnosis_ratio_vs_raw={
                k: med(raw_s) / med(v) for k, v in diagnosis.items()
            },
            serving=serving,
            sweep=sweep,
        )
        Path(result_path).write_text(json.dumps(res, indent=2) + "\n")
        print(
            json.dumps({k: v for k, v in res.items() if not k.endswith("_s")}, indent=2)
        )
    else:
        print(
            f"sender digest of {total / 1e9:.1f} GB: {res['sender_digest_ms']:.1f} ms"
        )
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--bucket-mb", type=int, default=1024)
    args = ap.parse_args()
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast off
    out = Path(os.environ.get("OUT") or ROOT / "bench" / "results")
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"gpu-{datetime.date.today().isoformat()}.json"
    mp.spawn(run, args=(args, str(path)), nprocs=2, join=True)


if __name__ == "__main__":
    main()
