"""The staged receiver on its side thread while a TP 2 engine serves, over NCCL
(2 GPUs, no SGLang: the receiver and the shadow copy are the common modules).

Rank 1 is an engine's TP rank 1 as the scheduler runs it: its main thread
serves decode-like steps (a GEMV reading a layer of its model, an all-reduce
on the TP group, a host sync) and, between two steps, prepares an update
(`parse_buckets`, a `StagedWeightReceiver` into a `ShadowParameters`, the
receiver started on its own thread and CUDA stream) and, once the receiver
is done, completes it (synchronize, verify every bucket's digest, apply).
Rank 0 is TP rank 0 and, on a side thread, the trainer (NCCL refuses two
ranks of one communicator on one GPU, and this machine has two): it sends
each update's digests through a TCP store, waits for "ready", broadcasts the
flattened buckets with random pauses, and waits for "applied". So on both
GPUs the update group's kernels and the TP all-reduces interleave in
varying orders while the receiver digests each bucket as it lands. With
--trainer-process (3 GPUs) the trainer is a process of its own on GPU 0,
as in a deployment, and TP ranks 1 and 2 both receive.

For each update it records whether every bucket arrived and verified, and
whether every layer of the live model then holds exactly that update's
values (each update writes its own per-layer constant): all-or-nothing
under serving load. A hang is a failure: the parent kills the ranks at the
deadline. Run for the default environment and for
CUDA_DEVICE_MAX_CONNECTIONS=1 (Megatron-based trainers set it).

    NCCL_NVLS_ENABLE=0 python bench/gpu_tp_staged_receiver.py [--updates 6]

Writes gpu-tp-staged-receiver-<date>.json to $OUT (or bench/results/).
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

import torch
import torch.distributed as dist
from gpu_ranks import free_port, progress, run_ranks

ROOT = Path(__file__).resolve().parents[1]


def layer_value(update: int, layer: int) -> float:
    """What update `update` writes into every element of layer `layer`."""
    return float((update * 31 + layer) % 251 + 1)


class Layers(torch.nn.Module):
    """A stack of linear layers that loads by name, as SGLang's models do."""

    def __init__(self, layers: int, dim: int, device: torch.device):
        super().__init__()
        self.layers = torch.nn.ModuleList(
            torch.nn.Linear(dim, dim, bias=False, device=device) for _ in range(layers)
        )
        for layer in self.layers:
            layer.weight.requires_grad_(False).zero_()

    def load_weights(self, weights) -> None:
        params = dict(self.named_parameters())
        for name, tensor in weights:
            params[name].data.copy_(tensor)


def rank_main(rank: int, args) -> None:
    sys.path.insert(0, str(ROOT / "common/python"))
    from sglang.srt.weight_sync.digest import digest_bytes
    from sglang.srt.weight_sync.shadow_params import ShadowParameters
    from sglang.srt.weight_sync.staged_receiver import (
        StagedWeightReceiver,
        StagingPool,
        parse_buckets,
    )

    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    # Rank 0 sends: a trainer process of its own (3 GPUs), or on a side
    # thread of TP rank 0 (2 GPUs). The TP ranks serve; all but rank 0 receive.
    world = 3 if args.trainer_process else 2
    tp_ranks = [1, 2] if args.trainer_process else [0, 1]
    receivers = list(range(1, world))
    timeout = datetime.timedelta(seconds=args.limit)
    dist.init_process_group(
        "nccl",
        init_method=f"tcp://127.0.0.1:{args.port}",
        rank=rank,
        world_size=world,
        timeout=timeout,
        # Bound to a device, torch makes each group's communicator at once.
        device_id=device if args.warm_update_group else None,
    )
    tp = dist.new_group(tp_ranks, backend="nccl", timeout=timeout)
    update_group = dist.new_group(list(range(world)), backend="nccl", timeout=timeout)
    store = dist.TCPStore("127.0.0.1", args.store_port, world, rank == 0, timeout)
    warm = torch.ones(1, device=device)
    if rank in tp_ranks:
        dist.all_reduce(warm, group=tp)
    if args.warm_update_group:
        dist.broadcast(warm, src=0, group=update_group)
    torch.cuda.synchronize()
    progress(rank, "warm")

    layers, dim, per_bucket = args.layers, args.dim, args.layers_per_bucket
    model = Layers(layers, dim, device)
    names = [f"layers.{i}.weight" for i in range(layers)]
    layout = [
        list(range(k, min(k + per_bucket, layers)))
        for k in range(0, layers, per_bucket)
    ]
    rng = random.Random(rank * 7919 + 1)

    def bucket_bytes(update: int, members) -> torch.Tensor:
        return torch.cat(
            [
                torch.full((dim * dim,), layer_value(update, i), device=device)
                for i in members
            ]
        ).view(torch.uint8)

    sender = {"updates": 0, "error": None}

    def send_updates() -> None:
        torch.cuda.set_device(rank)  # per thread, as the staged receiver does
        stream = torch.cuda.Stream()
        try:
            with torch.cuda.stream(stream):
                for update in range(args.updates):
                    meta = [
                        {
                            "names": [names[i] for i in members],
                            "dtypes": ["float32"] * len(members),
                            "shapes": [[dim, dim]] * len(members),
                            **(
                                {"digest": digest_bytes(bucket_bytes(update, members))}
                                if args.digests
                                else {}
                            ),
                        }
                        for members in layout
                    ]
                    store.set(f"meta{update}", json.dumps(meta))
                    store.wait([f"ready{update}-{r}" for r in receivers])
                    progress(rank, f"update {update}: engine ready")
                    for k, members in enumerate(layout):
                        time.sleep(rng.random() * 0.004)
                        progress(rank, f"update {update}: bucket {k} sending")
                        data = bucket_bytes(update, members)
                        work = dist.broadcast(
                            data, src=0, group=update_group, async_op=True
                        )
                        work.wait()
                        stream.synchronize()
                    store.wait([f"applied{update}-{r}" for r in receivers])
                    sender["updates"] += 1
                    progress(rank, f"sent update {update}")
        except Exception as e:  # reported
            sender["error"] = repr(e)

    def host_sync() -> None:
        # The scheduler waits for its own stream (a forward's tokens to the
        # host); `device` waits for every stream, the receiver's too.
        if args.sync == "device":
            torch.cuda.synchronize()
        else:
            torch.cuda.current_stream().synchronize()

    if rank not in tp_ranks:  # a trainer process: it only sends
        send_updates()
        print(json.dumps({"rank": rank, "sender": sender, "updates": []}), flush=True)
        dist.destroy_process_group()
        return

    hidden = torch.randn(8, dim, device=device)
    steps_alone, started = 1000, time.perf_counter()
    for step in range(steps_alone):
        out = hidden @ model.layers[step % layers].weight
        dist.all_reduce(out, group=tp)
        host_sync()
    rate_alone = steps_alone / (time.perf_counter() - started)
    progress(rank, "alone done")

    thread = threading.Thread(target=send_updates) if rank == 0 else None
    if thread is not None:
        thread.start()
    shadow = ShadowParameters([model], "device") if rank in receivers else None
    pool = StagingPool(device)
    receiver, update, updates = None, 0, []
    steps, started = 0, time.perf_counter()
    stop = torch.zeros(1, device=device)
    while True:
        out = hidden @ model.layers[steps % layers].weight
        dist.all_reduce(out, group=tp)
        host_sync()
        steps += 1
        if rng.random() < 0.1:
            time.sleep(rng.random() * 0.003)
        if rank in receivers and update < args.updates:
            if receiver is None and store.check([f"meta{update}"]):
                # prepare, between two steps
                meta = json.loads(store.get(f"meta{update}"))
                specs = parse_buckets(len(meta), meta, "flattened_bucket")
                receiver = StagedWeightReceiver(
                    specs,
                    update_group,
                    pool,
                    "flattened_bucket",
                    sink=shadow.load,
                    before_first_bucket=shadow.begin,
                )
                receiver.start()
                prepared_at = steps
                seen = -1
                progress(rank, f"update {update}: prepared")
                store.set(f"ready{update}-{rank}", "1")
            elif receiver is not None and receiver.stats.buckets_received != seen:
                seen = receiver.stats.buckets_received
                progress(rank, f"update {update}: {seen} buckets received")
            if receiver is not None and receiver.done:
                # complete, between two steps
                received = receiver.complete
                receiver.synchronize()
                errors = receiver.verify() if received else [str(receiver.error)]
                applied = received and not errors and shadow.check_appliable() is None
                if applied:
                    shadow.apply()
                wrong = [
                    i
                    for i, layer in enumerate(model.layers)
                    if not bool((layer.weight == layer_value(update, i)).all())
                ]
                updates.append(
                    {
                        "update": update,
                        "buckets": receiver.stats.buckets_received,
                        "errors": errors,
                        "applied": applied,
                        "layers_not_this_update": wrong,
                        "serving_steps_during": steps - prepared_at,
                    }
                )
                progress(rank, f"applied update {update}: {updates[-1]}")
                store.set(f"applied{update}-{rank}", "1")
                # A failed update ends the run here: its group is gone.
                receiver = None
                update = update + 1 if applied else args.updates
        if steps % 16 == 0:  # stop together once the updates are over
            done = (
                not thread.is_alive() if thread is not None else update == args.updates
            )
            stop.fill_(1.0 if done else 0.0)
            dist.all_reduce(stop, op=dist.ReduceOp.MIN, group=tp)
            if stop.item() == 1.0:
                break
    seconds = time.perf_counter() - started
    if thread is not None:
        thread.join()
    print(
        json.dumps(
            {
                "rank": rank,
                "sender": sender if rank == 0 else None,
                "updates": updates,
                "serving_steps": steps,
                "seconds": round(seconds, 3),
                "steps_per_s_alone": round(rate_alone, 1),
                "steps_per_s_during": round(steps / seconds, 1),
            }
        ),
        flush=True,
    )
    dist.destroy_process_group()


def run_case(case: dict, args) -> dict:
    env_extra, sync, digests = case["env"], case["sync"], case["digests"]
    env = {**os.environ, **env_extra}
    common = ["--port", str(free_port()), "--store-port", str(free_port())]
    for flag in ("updates", "layers", "dim", "layers_per_bucket", "limit", "grace"):
        common += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    common += ["--sync", sync] + ([] if digests else ["--no-digests"])
    if not args.warm_update_group:
        common.append("--lazy-update-group")
    world = 3 if args.trainer_process else 2
    if args.trainer_process:
        common.append("--trainer-process")
    hung, runs = run_ranks(
        lambda rank: [sys.executable, __file__, "--rank", str(rank), *common],
        env,
        args.limit + args.grace,
        world,
    )
    outcome = {**case, "hung": hung, "ranks": [], "stderr_tail": []}
    for run in runs:
        if run.last_json_line():
            outcome["ranks"].append(json.loads(run.last_json_line()))
        outcome["stderr_tail"].append(run.progress_lines()[-12:])
        outcome.setdefault("exitcodes", []).append(run.returncode)
    engines = [r for r in outcome["ranks"] if r["rank"] > 0]
    trainer = [r for r in outcome["ranks"] if r["rank"] == 0]
    outcome["ok"] = (
        not outcome["hung"]
        and len(engines) == world - 1
        and len(trainer) == 1
        and trainer[0]["sender"]["error"] is None
        and all(len(engine["updates"]) == args.updates for engine in engines)
        and all(
            u["applied"] and not u["errors"] and not u["layers_not_this_update"]
            for engine in engines
            for u in engine["updates"]
        )
    )
    return outcome


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int)
    parser.add_argument("--port", type=int)
    parser.add_argument("--store-port", type=int)
    parser.add_argument("--updates", type=int, default=6)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--dim", type=int, default=4096)
    parser.add_argument("--layers-per-bucket", type=int, default=2)
    parser.add_argument("--limit", type=float, default=60.0)
    parser.add_argument(
        "--grace",
        type=float,
        default=15.0,
        help="seconds past --limit before the ranks count as hung and are killed",
    )
    parser.add_argument("--sync", choices=["device", "stream"], default="stream")
    parser.add_argument("--no-digests", dest="digests", action="store_false")
    parser.add_argument("--cases", default="all")
    parser.add_argument(
        "--lazy-update-group",
        dest="warm_update_group",
        action="store_false",
        help="no warm-up broadcast: the update group's communicator is made by "
        "its first broadcast, on the receiver's thread, while the TP ranks serve",
    )
    parser.add_argument(
        "--trainer-process",
        action="store_true",
        help="3 GPUs: the trainer is a process of its own, TP ranks 1 and 2 receive",
    )
    args = parser.parse_args()
    if args.rank is not None:
        rank_main(args.rank, args)
        return

    every = [
        {"env": env, "sync": sync, "digests": digests}
        for sync in ("stream", "device")
        for digests in (True, False)
        for env in ({}, {"CUDA_DEVICE_MAX_CONNECTIONS": "1"})
    ]
    cases = (
        every if args.cases == "all" else [every[int(i)] for i in args.cases.split(",")]
    )
    results = {
        "what": "the staged receiver (common module) on its side thread and "
        "stream on TP rank 1 of a TP 2 engine serving all-reduce steps; "
        "prepare and complete between steps, as the scheduler runs them",
        "machine": {
            "gpus": [
                torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())
            ],
            "torch": torch.__version__,
            "nccl": ".".join(str(v) for v in torch.cuda.nccl.version()),
        },
        "updates": args.updates,
        "layers": args.layers,
        "dim": args.dim,
        "layers_per_bucket": args.layers_per_bucket,
        "trainer": (
            "its own process" if args.trainer_process else "TP rank 0's side thread"
        ),
        "update_group_communicator": (
            "made by a warm-up broadcast before serving"
            if args.warm_update_group
            else "made by its first broadcast, on the receiver's thread"
        ),
        "bucket_mb": args.layers_per_bucket * args.dim * args.dim * 4 / 2**20,
        "cases": [run_case(case, args) for case in cases],
    }
    out_dir = Path(os.environ.get("OUT") or Path(__file__).parent / "results")
    out_dir.mkdir(parents=True, exist_ok=True)
    name = "gpu-tp-staged-receiver" + (
        "-trainer-process" if args.trainer_process else ""
    )
    name += "" if args.warm_update_group else "-lazy-update-group"
    path = out_dir / f"{name}-{datetime.date.today().isoformat()}.json"
    path.write_text(json.dumps(results, indent=1))
    for case in results["cases"]:
        print(
            case["env"], case["sync"], case["digests"], "ok" if case["ok"] else "FAILED"
        )
        if not case["ok"]:
            for tail in case["stderr_tail"]:
                print("   ", "\n    ".join(tail))
        for rank in case["ranks"]:
            print(" ", {k: v for k, v in rank.items() if k != "updates"})
            for u in rank["updates"]:
                print("   ", u)
    print(path)


if __name__ == "__main__":
    main()
