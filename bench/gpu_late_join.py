"""A late join over NCCL, on two GPUs: does the side that waited keep the
group's whole timeout for its collectives, or only what its init had left?

Two cases, each run with the group made as before (`old`: what is left of the
init is the group's timeout) and as now (`new`):

- `engine_waited`: an engine rank (SGLang's `init_custom_process_group` as the
  0.5.23 series has it, behind `init_group_on_route`) starts its init with a
  timeout of INIT_S; the trainer joins LATE_S later, then broadcasts its first
  bucket SEND_S after the group formed. The engine's first receive sets up
  NCCL's communicator, which reads the unique id from the store, then waits.
- `trainer_waited`: the trainer library's `GroupJoin` (timeout INIT_S) waits
  for an engine that joins LATE_S later; after a first broadcast both take,
  the engine posts its second receive (a bucket larger than NCCL's buffers)
  SEND_S later than the trainer sends it.

Needs torch with CUDA and two GPUs; no SGLang (the function is read from the
series' overlay). Writes JSON to argv[1] (default stdout).

    python bench/gpu_late_join.py bench/results/gpu-late-join-<date>.json
"""

from __future__ import annotations

import ast
import json
import multiprocessing as mp
import socket
import sys
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "python")]
OVERLAY = ROOT / "pins/0.5.23/overlay/python/sglang/srt/utils/common.py"
INIT_S, LATE_S, SEND_S = 12.0, 8.0, 8.0
BUCKET_BYTES = 1 << 30
# How long a side may take after the other has ended (a side whose peer
# failed can wait for it for good: NCCL's communicator setup).
STRAGGLER_S = 60.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def series_init_custom_process_group():
    """The series' `init_custom_process_group`, read from the overlay."""
    import torch

    tree = ast.parse(OVERLAY.read_text())
    (node,) = [
        n
        for n in tree.body
        if isinstance(n, ast.FunctionDef) and n.name == "init_custom_process_group"
    ]
    scope = {"torch_release": tuple(int(x) for x in torch.__version__.split(".")[:2])}
    exec(compile(ast.Module([node], []), str(OVERLAY), "exec"), scope)
    return scope["init_custom_process_group"]


def engine(mode: str, case: str, port: int, group: str, ready, go, out) -> None:
    import torch
    import torch.distributed as dist

    from rlsync.group import join_update_group
    from rlsync.update_group_net import init_group_on_route

    torch.cuda.set_device(1)
    torch.zeros(1, device="cuda")
    ready.set()
    go.wait(120)
    t0 = time.monotonic()
    try:
        if case == "engine_waited":
            create_group = series_init_custom_process_group()

            def create(left):
                if mode == "old":  # what was left is the group's timeout
                    kw = dict(timeout=timedelta(seconds=left))
                else:
                    kw = dict(
                        timeout=timedelta(seconds=INIT_S),
                        init_timeout=timedelta(seconds=left),
                    )
                return create_group(
                    backend="nccl",
                    init_method=f"tcp://127.0.0.1:{port}",
                    world_size=2,
                    rank=1,
                    group_name=group,
                    **kw,
                )

            pg = init_group_on_route(
                create,
                backend="nccl",
                master_address="127.0.0.1",
                master_port=port,
                timeout=INIT_S,
                hosts_rendezvous=False,
            )
            joined = time.monotonic() - t0
            got = torch.zeros(4, device="cuda")
            dist.broadcast(got, src=0, group=pg)  # sets up NCCL, then waits
        else:
            pg = join_update_group(
                "127.0.0.1",
                port,
                2,
                rank=1,
                group_name=group,
                backend="nccl",
                timeout=60,
            )
            joined = time.monotonic() - t0
            got = torch.zeros(4, device="cuda")
            dist.broadcast(got, src=0, group=pg)
            time.sleep(SEND_S)  # the lateness under test
            bucket = torch.empty(BUCKET_BYTES // 4, device="cuda")
            dist.broadcast(bucket, src=0, group=pg)
            torch.cuda.synchronize()
            got = torch.tensor([bool(bucket.eq(1).all())])
        torch.cuda.synchronize()
        out.put(
            ("engine", {"ok": True, "joined_s": round(joined, 1), "got": got.tolist()})
        )
    except Exception as e:
        out.put(("engine", {"ok": False, "error": f"{type(e).__name__}: {e}"[:300]}))


def trainer(mode: str, case: str, port: int, group: str, ready, go, out) -> None:
    import torch
    import torch.distributed as dist

    import rlsync.group as rg

    torch.cuda.set_device(0)
    torch.zeros(1, device="cuda")
    ready.set()
    go.wait(120)
    if mode == "old":  # the trainer library as before: what was left is the timeout
        made = rg.new_update_group

        def as_before(*args, timeout, init_timeout=None, **kwargs):
            return made(*args, timeout=init_timeout or timeout, **kwargs)

        rg.new_update_group = as_before
    try:
        if case == "engine_waited":
            join = rg.GroupJoin(
                "127.0.0.1", port, 2, group_name=group, backend="nccl", timeout=60
            )
            pg = join.start().future.result(120)
            time.sleep(SEND_S)  # the lateness under test
            sent = torch.arange(4, device="cuda", dtype=torch.float32) + 1
            dist.broadcast(sent, src=0, group=pg)
        else:
            join = rg.GroupJoin(
                "127.0.0.1", port, 2, group_name=group, backend="nccl", timeout=INIT_S
            )
            pg = join.start().future.result(120)
            sent = torch.arange(4, device="cuda", dtype=torch.float32) + 1
            dist.broadcast(sent, src=0, group=pg)
            # More than NCCL buffers: the send ends only once the engine,
            # late, receives it.
            bucket = torch.ones(BUCKET_BYTES // 4, device="cuda")
            torch.cuda.synchronize()
            t0 = time.monotonic()
            dist.broadcast(bucket, src=0, group=pg)
            torch.cuda.synchronize()
            took = round(time.monotonic() - t0, 1)
            out.put(("trainer", {"ok": True, "bucket_s": took}))
            return
        torch.cuda.synchronize()
        out.put(("trainer", {"ok": True}))
    except Exception as e:
        out.put(("trainer", {"ok": False, "error": f"{type(e).__name__}: {e}"[:300]}))


def run_case(mode: str, case: str) -> dict:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    ready = {side: ctx.Event() for side in ("trainer", "engine")}
    go = {side: ctx.Event() for side in ("trainer", "engine")}
    port, group = free_port(), f"late_{case}_{mode}"
    t = ctx.Process(
        target=trainer,
        args=(mode, case, port, group, ready["trainer"], go["trainer"], out),
    )
    e = ctx.Process(
        target=engine,
        args=(mode, case, port, group, ready["engine"], go["engine"], out),
    )
    t.start()
    e.start()
    for side in ready.values():
        side.wait(120)
    early, late = (
        ("engine", "trainer") if case == "engine_waited" else ("trainer", "engine")
    )
    go[early].set()
    time.sleep(LATE_S)  # the late side is late by this much
    go[late].set()
    end = time.monotonic() + 120
    while t.is_alive() and e.is_alive() and time.monotonic() < end:
        time.sleep(0.5)
    hung = []
    for name, p in (("trainer", t), ("engine", e)):
        p.join(max(1.0, min(STRAGGLER_S, end + STRAGGLER_S - time.monotonic())))
        if p.is_alive():
            hung.append(name)
            p.kill()
            p.join()
    results = {}
    while not out.empty():
        key, value = out.get()
        results[key] = value
    return {
        "mode": mode,
        "case": case,
        "trainer": results.get("trainer"),
        "engine": results.get("engine"),
        "exit_codes": {"trainer": t.exitcode, "engine": e.exitcode},
        "killed_after_waiting": hung,
    }


def main() -> None:
    import torch

    rows = [
        run_case(m, c)
        for c in ("engine_waited", "trainer_waited")
        for m in ("old", "new")
    ]
    report = {
        "what": __doc__.split("\n\n")[0],
        "init_s": INIT_S,
        "late_s": LATE_S,
        "send_s": SEND_S,
        "torch": torch.__version__,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())),
        "gpus": [
            torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())
        ],
        "rows": rows,
    }
    text = json.dumps(report, indent=1)
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
