"""What a posted NCCL receive does when its sender goes silent or dies
(2 GPUs, no SGLang): a check, not a timing.

Each case runs in a fresh pair of processes. Rank 1 (the engine) receives a
broadcast from rank 0 on an NCCL group whose timeout is --timeout seconds;
rank 0 (the trainer) never sends: it stays silent, or exits.

  raw cases       rank 1 posts the broadcast itself, then only waits (what a
                  prepared session whose trainer is gone did), or gives the
                  group up before the timeout: destroy_process_group, the
                  group's abort(), or its abort() then destroy
  receiver cases  rank 1 receives with the server's StagedWeightReceiver
                  (loaded by path): it must end by itself before the timeout
                  (silent, exited), when aborted while blocked, or when its
                  sink fails with the next bucket posted; then the group is
                  destroyed as the scheduler destroys a lost group

Afterwards rank 1 runs an all-reduce on a fresh NCCL group and stays up past
the timeout. Records for each case what rank 1 saw, whether it survived, and
the exit codes (-6: NCCL's watchdog ended it; None: it hung and was killed).

    NCCL_NVLS_ENABLE=0 python bench/gpu_silent_sender.py [--timeout 8]
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing as mp
import os
import platform
import sys
import time
from pathlib import Path

CASES = {
    "silent_wait": ("silent", "wait"),
    "silent_destroy": ("silent", "destroy"),
    "silent_abort": ("silent", "abort"),
    "silent_abort_destroy": ("silent", "abort_destroy"),
    "exited_wait": ("exit", "wait"),
    "exited_destroy": ("exit", "destroy"),
    "exited_abort": ("exit", "abort"),
    "receiver_silent": ("silent", "receiver"),
    "receiver_exited": ("exit", "receiver"),
    "receiver_aborted_while_blocked": ("silent", "receiver_abort"),
    "receiver_sink_fails_with_a_bucket_posted": ("one_bucket", "receiver_sink_fails"),
}
ROOT = Path(__file__).resolve().parents[1]


def give_up(group, how: str) -> str:
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    if how == "destroy":
        dist.destroy_process_group(group)
        return "destroy_process_group"
    if how == "abort_destroy":
        group.abort()
        dist.destroy_process_group(group)
        return "ProcessGroup.abort, then destroy_process_group"
    abort = getattr(c10d, "_abort_process_group", None)
    if abort is not None:
        abort(group)
        return "_abort_process_group"
    group.abort()
    return "ProcessGroup.abort"


def failing_sink(named) -> None:
    raise RuntimeError("the loader refused the bucket")


def receive_with_the_server_receiver(
    group, timeout: float, abort: bool, t0: float, sink_fails: bool = False
):
    """The server's receiver, as a prepared session runs it; then the
    scheduler's destroy of a group the receive left unusable."""
    import importlib.util

    import torch
    import torch.distributed as dist

    spec = importlib.util.spec_from_file_location(
        "gpu_sync", ROOT / "bench" / "gpu_sync.py"
    )
    gpu_sync = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_sync)
    sr = gpu_sync.load_receiver_module()
    meta = [
        {"names": [f"w{i}"], "dtypes": ["uint8"], "shapes": [[1 << 20]]}
        for i in range(2)
    ]
    buckets = sr.parse_buckets(2, meta, "flattened_bucket")
    pool = sr.StagingPool(torch.device("cuda", 1))
    rx = sr.StagedWeightReceiver(
        buckets,
        group,
        pool,
        "flattened_bucket",
        sink=failing_sink if sink_fails else (lambda named: None),
    )
    events = [("gives up after (s)", rx._give_up_after)]
    rx.start()
    if abort:
        time.sleep(timeout / 4)
        usable = rx.abort(10)
        events.append((f"abort() -> usable={usable}", round(time.monotonic() - t0, 2)))
    ended = rx.wait(timeout * 2)
    events.append((f"ended={ended} error={rx.error}", round(time.monotonic() - t0, 2)))
    t1 = time.monotonic()
    dist.destroy_process_group(group)
    events.append(
        (f"destroyed in {time.monotonic() - t1:.2f}s", round(time.monotonic() - t0, 2))
    )
    return events


def rank_main(rank: int, case: str, timeout: float, port: int, report) -> None:
    import torch
    import torch.distributed as dist

    sender, engine = CASES[case]
    torch.cuda.set_device(rank)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group(
        "gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=120)
    )
    group = dist.new_group(
        [0, 1], backend="nccl", timeout=datetime.timedelta(seconds=timeout)
    )
    spare = dist.new_group([0, 1], backend="nccl")
    # Both sides set up the communicator with one collective that completes.
    warm = torch.ones(4, device="cuda")
    dist.all_reduce(warm, group=group)
    dist.all_reduce(warm, group=spare)
    torch.cuda.synchronize()
    dist.barrier()
    events = []
    t0 = time.monotonic()
    if rank == 0:
        if sender == "exit":
            time.sleep(1.0)
            os._exit(0)
        if sender == "one_bucket":  # bucket 0 of 2, then silence
            time.sleep(1.0)
            dist.broadcast(
                torch.zeros(1 << 20, dtype=torch.uint8, device="cuda"),
                src=0,
                group=group,
            )
            torch.cuda.synchronize()
        time.sleep(timeout * 3)
        os._exit(0)
    if engine.startswith("receiver"):
        events = receive_with_the_server_receiver(
            group,
            timeout,
            engine == "receiver_abort",
            t0,
            sink_fails=engine == "receiver_sink_fails",
        )
        work = None
    else:
        data = torch.empty(1 << 20, device="cuda")
        work = dist.broadcast(data, src=0, group=group, async_op=True)
        events.append(("posted", round(time.monotonic() - t0, 2)))
    gave_up = None
    while work is not None and time.monotonic() - t0 < timeout * 2.5:
        if engine != "wait" and gave_up is None and time.monotonic() - t0 > timeout / 3:
            try:
                gave_up = give_up(group, engine)
                events.append((f"gave up: {gave_up}", round(time.monotonic() - t0, 2)))
            except Exception as e:
                events.append(
                    (
                        f"give up raised {type(e).__name__}: {e}"[:300],
                        round(time.monotonic() - t0, 2),
                    )
                )
                gave_up = "raised"
        try:
            done = work.is_completed()
        except Exception as e:
            events.append(
                (
                    f"is_completed raised {type(e).__name__}: {e}"[:300],
                    round(time.monotonic() - t0, 2),
                )
            )
            break
        if done:
            events.append(("completed", round(time.monotonic() - t0, 2)))
            break
        time.sleep(0.1)
    report.put({"events": events, "survived_s": round(time.monotonic() - t0, 2)})
    # Can this process still run NCCL work on another group? (the peer may
    # be gone, so use a fresh single-rank group)
    try:
        solo = dist.new_group([1], backend="nccl")
        x = torch.ones(4, device="cuda")
        dist.all_reduce(x, group=solo)
        torch.cuda.synchronize()
        report.put({"after": f"single-rank all_reduce ok: {x.tolist()}"})
    except Exception as e:
        report.put({"after": f"{type(e).__name__}: {e}"[:300]})
    time.sleep(timeout * 1.5)  # a watchdog that fires late still kills us here
    report.put({"alive_at_end_s": round(time.monotonic() - t0, 2)})
    report.close()
    report.join_thread()
    os._exit(0)


def run_case(case: str, timeout: float, port: int) -> dict:
    ctx = mp.get_context("spawn")
    report = ctx.Queue()
    procs = [
        ctx.Process(target=rank_main, args=(r, case, timeout, port, report))
        for r in range(2)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout * 6 + 60)
    out: dict = {"case": case}
    while not report.empty():
        out.update(report.get())
    out["exitcodes"] = [p.exitcode for p in procs]
    for p in procs:
        if p.is_alive():
            p.kill()
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--timeout", type=float, default=8.0)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--name", default="gpu-silent-sender")
    args = parser.parse_args()
    import torch

    results = {
        "machine": {
            "gpus": [
                torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())
            ],
            "torch": torch.__version__,
            "nccl": ".".join(map(str, torch.cuda.nccl.version())),
            "python": platform.python_version(),
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": os.environ.get(
                "TORCH_NCCL_ASYNC_ERROR_HANDLING"
            ),
        },
        "timeout_s": args.timeout,
        "cases": [],
    }
    for i, case in enumerate(args.cases.split(",")):
        res = run_case(case, args.timeout, 29700 + i)
        print(json.dumps(res), flush=True)
        results["cases"].append(res)
    out = Path(os.environ.get("OUT") or Path(__file__).parent / "results")
    day = datetime.date.today().isoformat()
    (out / f"{args.name}-{day}.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
