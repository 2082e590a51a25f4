"""CPU benchmark of one full weight sync into a real SGLang server over gloo.

In one run, on one >= 500 MB model:
  (a) raw gloo broadcast of the same bucket bytes to a bare receiver process;
  (b) upstream 0.5.10's single-phase path as a well-written trainer drives it
      (per bucket: the HTTP call in a thread, then the broadcast);
  (c) ours: prepare, broadcast every bucket, complete (2 HTTP calls),
      without and with sender digests.
Each is timed end to end on an idle server, first sync and steady state
apart, the four taking turns round by round; then (b) and (c) run under a
serving load to measure the stall they cause: the larger of the
longest gap between tokens of streams in flight and the extra time to first
token of requests issued during the update, each against the same load with
no update. Results: bench/results/cpu-<date>.json.

    .venv/bin/python bench/cpu_sync.py [--steady 7] [--bucket-mb 64]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import datetime
import json
import multiprocessing as mp
import os
import platform
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "python")]

import requests  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from harness.cpu_sglang import free_port, launch, sglang_version  # noqa: E402
from harness.tiny_model import make_tiny_model  # noqa: E402
from rlsync import client  # noqa: E402
from rlsync.digest import digest_bytes  # noqa: E402
from rlsync.group import join_update_group, leave_update_group  # noqa: E402
from rlsync.planner import plan_buckets  # noqa: E402

pool = cf.ThreadPoolExecutor(8)


# --- raw receiver (a) --------------------------------------------------------


def _raw_receiver(port: int, sizes: list[int], rounds: int, cpus) -> None:
    if cpus:  # the cores the engine's scheduler has
        os.sched_setaffinity(0, cpus)
    pg = join_update_group("127.0.0.1", port, 2, rank=1, group_name="raw")
    bufs = [torch.empty(n, dtype=torch.uint8) for n in sizes]
    for _ in range(rounds):
        for buf in bufs:
            dist.broadcast(buf, src=0, group=pg)
    leave_update_group(pg)


class RawPeer:
    """A bare receiver process, up for the whole run, so that raw rounds take
    turns with the others and see the same machine (raw alone varied by 40 %
    from run to run)."""

    def __init__(self, flats: list[torch.Tensor], rounds: int, cpus):
        port = free_port()
        self.proc = mp.get_context("spawn").Process(
            target=_raw_receiver, args=(port, [f.numel() for f in flats], rounds, cpus)
        )
        self.proc.start()
        self.pg = join_update_group("127.0.0.1", port, 2, group_name="raw")

    def round(self, flats: list[torch.Tensor]) -> int:
        for flat in flats:
            dist.broadcast(flat, src=0, group=self.pg)
        return 0

    def close(self) -> None:
        self.proc.join(60)
        leave_update_group(self.pg)


# --- serving load --------------------------------------------------------------


class Load:
    """Two streams always in flight plus a new short request every 0.25 s."""

    def __init__(self, url: str):
        self.url = url
        self.stop = threading.Event()
        self.tokens: list[list[float]] = []  # per stream: token arrival times
        self.ttft: list[tuple[float, float]] = []  # (issued, seconds to first token)
        self.errors: list[str] = []
        self.threads = [threading.Thread(target=self._streams) for _ in range(2)]
        self.threads.append(threading.Thread(target=self._probes))

    def _stream(self, max_new: int, record: bool = False) -> tuple[float, list[float]]:
        t0 = time.monotonic()
        times: list[float] = []
        if record:  # visible while in flight, not only once finished
            self.tokens.append(times)
        params = {"max_new_tokens": max_new, "temperature": 0, "ignore_eos": True}
        with requests.post(
            self.url + "/generate",
            json={"text": "load", "stream": True, "sampling_params": params},
            stream=True,
            timeout=600,
        ) as resp:
            for line in resp.iter_lines():
                if line.startswith(b"data:") and line != b"data: [DONE]":
                    times.append(time.monotonic())
        return t0, times

    def _streams(self) -> None:
        try:
            while not self.stop.is_set():
                self._stream(24, record=True)
        except Exception as e:  # a dropped request is a finding, not noise
            self.errors.append(repr(e))

    def _probes(self) -> None:
        try:
            while not self.stop.is_set():
                t0, times = self._stream(2)
                if times:
                    self.ttft.append((t0, times[0] - t0))
                self.stop.wait(0.25)
        except Exception as e:
            self.errors.append(repr(e))

    def __enter__(self):
        for t in self.threads:
            t.start()
        time.sleep(2.0)  # let the load reach its steady state
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(600)

    def stall_in(self, start: float, end: float) -> dict:
        gaps = [
            b - a
            for times in self.tokens
            for a, b in zip(times, times[1:])
            if b >= start and a <= end
        ]
        ttfts = [s for t0, s in self.ttft if start <= t0 <= end]
        return {"max_gap": max(gaps, default=0.0), "max_ttft": max(ttfts, default=0.0)}


def stall_of(load_result: dict, baseline: dict) -> dict:
    gap = max(0.0, load_result["max_gap"] - baseline["max_gap"])
    ttft = max(0.0, load_result["max_ttft"] - baseline["max_ttft"])
    return {
        "stall_s": max(gap, ttft),
        "extra_gap_s": gap,
        "extra_ttft_s": ttft,
        **load_result,
    }


# --- trainer paths (b) and (c) ---------------------------------------------------


class Trainer:
    def __init__(self, url: str):
        self.url = url
        port = free_port()
        self.group_name = f"bench_{port}"
        fut = pool.submit(
            client.init_weights_update_group,
            url,
            master_address="127.0.0.1",
            master_port=port,
            rank_offset=1,
            world_size=2,
            group_name=self.group_name,
            backend="gloo",
        )
        self.pg = join_update_group("127.0.0.1", port, 2, group_name=self.group_name)
        fut.result()
        self.phases: dict[str, list[dict]] = {}

    def upstream(self, buckets, flats) -> int:
        # 0.5.23: upstream's updates run inside its weight-update session.
        opened = client.begin_weight_update(self.url)
        calls = 2 if opened else 0
        try:
            return calls + self._upstream_buckets(buckets, flats)
        finally:
            if opened:
                client.end_weight_update(self.url)

    def _upstream_buckets(self, buckets, flats) -> int:
        calls = 0
        for bucket, flat in zip(buckets, flats):
            meta = bucket.meta()
            fut = pool.submit(
                client.update_weights_from_distributed,
                self.url,
                names=meta["names"],
                dtypes=meta["dtypes"],
                shapes=meta["shapes"],
                group_name=self.group_name,
                load_format="flattened_bucket",
                flush_cache=False,
            )
            dist.broadcast(flat, src=0, group=self.pg)
            fut.result()
            calls += 1
        return calls

    def ours(self, buckets, flats, digests: bool) -> int:
        t0 = time.perf_counter()
        meta = [
            b.meta(digest_bytes(f) if digests else None) for b, f in zip(buckets, flats)
        ]
        t1 = time.perf_counter()
        client.prepare_weights_update(
            self.url, meta, group_name=self.group_name, load_format="flattened_bucket"
        )
        t2 = time.perf_counter()
        for flat in flats:
            dist.broadcast(flat, src=0, group=self.pg)
        t3 = time.perf_counter()
        done = client.complete_weights_update(self.url, group_name=self.group_name)
        t4 = time.perf_counter()
        # Where the trainer's and the server's time went
        self.phases.setdefault("ours_digest" if digests else "ours", []).append(
            {
                "digests_s": t1 - t0,
                "prepare_s": t2 - t1,
                "broadcast_s": t3 - t2,
                "complete_s": t4 - t3,
                **done.stats,
            }
        )
        return 2

    def close(self):
        client.destroy_weights_update_group(self.url, group_name=self.group_name)
        leave_update_group(self.pg)


def summary(times: list[float]) -> dict:
    return {
        "first_s": times[0],
        "steady_s": statistics.median(times[1:]),
        "all_s": times,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--steady", type=int, default=7, help="steady-state rounds after the first"
    )
    ap.add_argument("--bucket-mb", type=int, default=64)
    ap.add_argument("--size", default="bench", help="harness model size")
    args = ap.parse_args()
    rounds = 1 + args.steady

    model = make_tiny_model(ROOT / "build" / "models", args.size)
    from safetensors.torch import load_file

    weights = list(load_file(str(model / "model.safetensors")).items())
    model_bytes = sum(t.numel() * t.element_size() for _, t in weights)
    buckets = plan_buckets(weights, args.bucket_mb << 20)
    flats = [
        torch.cat([t.reshape(-1).view(torch.uint8) for t in b.tensors]) for b in buckets
    ]
    print(
        f"model {model_bytes / 2**20:.0f} MiB, {len(weights)} tensors, {len(buckets)} buckets"
    )

    t0 = time.perf_counter()
    for flat in flats:
        digest_bytes(flat)
    digest_cost = time.perf_counter() - t0

    # The all-or-nothing floor: the apply copies the whole model once, after
    # the last byte, on the rank's one core.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    dst = [torch.empty_like(f) for f in flats]
    copies = []
    for _ in range(3):
        t0 = time.perf_counter()
        for d, f in zip(dst, flats):
            d.copy_(f)
        copies.append(time.perf_counter() - t0)
    memcpy_model = min(copies)
    del dst
    torch.set_num_threads(threads)

    server = launch(
        model, ROOT / "build" / "logs" / "bench-cpu.log", tp=1, ready_timeout=600
    )
    # The raw receiver gets the cores the engine's scheduler really has.
    sched = server.schedulers()
    sched_cpus = sorted(sched[0].cpu_affinity()) if sched else []
    print(f"engine scheduler cpus {sched_cpus}")
    try:
        raw_peer = RawPeer(flats, rounds, set(sched_cpus) or None)
        trainer = Trainer(server.url)
        paths = {
            "raw": lambda: raw_peer.round(flats),
            "upstream": lambda: trainer.upstream(buckets, flats),
            "ours": lambda: trainer.ours(buckets, flats, digests=False),
            "ours_digest": lambda: trainer.ours(buckets, flats, digests=True),
        }
        # Idle server, the transfer cost alone; the paths take turns each round.
        times: dict = {label: [] for label in paths}
        calls: dict = {}
        for _ in range(rounds):
            for label, fn in paths.items():
                t0 = time.perf_counter()
                calls[label] = fn()
                times[label].append(time.perf_counter() - t0)
        raw_peer.close()
        for label in paths:
            print(
                f"{label}: {times[label][0]:.3f}s first, "
                f"{statistics.median(times[label][1:]):.3f}s steady"
            )

        # Serving baseline: the same load, no update. Windows are read after
        # the load ends, so streams in flight at the end are complete.
        with Load(server.url) as load:
            start = time.monotonic()
            time.sleep(3.0)
            window = (start, time.monotonic())
        baseline = load.stall_in(*window)
        errors = list(load.errors)
        print(f"baseline under load: {baseline}")
        results: dict = {"raw": summary(times["raw"])}
        for label in ("upstream", "ours", "ours_digest"):
            windows = []
            with Load(server.url) as load:  # under load: the serving stall
                for _ in range(rounds):
                    start = time.monotonic()
                    paths[label]()
                    windows.append((start, time.monotonic()))
                    time.sleep(1.0)  # let the load settle between updates
            stalls = [stall_of(load.stall_in(*w), baseline) for w in windows]
            stall = sorted(stalls, key=lambda x: x["stall_s"])[
                len(stalls) // 2
            ]  # median
            stall["all_stall_s"] = [x["stall_s"] for x in stalls]
            errors += load.errors
            results[label] = {
                **summary(times[label]),
                "http_calls": calls[label],
                "stall": stall,
            }
            print(f"{label}: stall {stall['stall_s']:.3f}s")
            if label in trainer.phases:
                steady = trainer.phases[label][1:rounds]  # idle rounds only
                phases = {
                    k: statistics.median(p[k] for p in steady)
                    for k in steady[0]
                    if isinstance(steady[0][k], float)
                }
                results[label]["phases_steady"] = phases
                print(
                    "  steady phases: "
                    + ", ".join(f"{k} {v:.3f}" for k, v in phases.items())
                )
        trainer.close()
    finally:
        server.stop()

    raw, up = results["raw"], results["upstream"]
    ours, ours_d = results["ours"], results["ours_digest"]
    raw_steady = raw["steady_s"]
    out = {
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "torch": torch.__version__,
        },
        "date": datetime.date.today().isoformat(),
        "sglang": sglang_version(),
        "model_bytes": model_bytes,
        "num_buckets": len(buckets),
        "bucket_bytes": args.bucket_mb << 20,
        "raw": raw,
        "engine_scheduler_cpus": sched_cpus,
        "upstream": up,
        "ours": ours,
        "ours_with_digest": ours_d,
        "digest_seconds_sender": digest_cost,
        "memcpy_model_seconds_one_thread": memcpy_model,
        "e2e_ratio_vs_raw": ours["steady_s"] / raw_steady,
        # raw + one copy of the model: no all-or-nothing update can beat it
        "e2e_floor_ratio_vs_raw": (raw_steady + memcpy_model) / raw_steady,
        "e2e_ratio_vs_raw_first": ours["first_s"] / raw["first_s"],
        "e2e_ratio_vs_raw_with_digest": ours_d["steady_s"] / raw_steady,
        "upstream_ratio_vs_raw": up["steady_s"] / raw_steady,
        "stall_ratio_vs_upstream": ours["stall"]["stall_s"]
        / max(up["stall"]["stall_s"], 1e-9),
        "http_calls_ours": ours["http_calls"],
        "requests_failed_under_load": errors,
        "http_calls_upstream": up["http_calls"],
    }
    # One results file per pin: the same benchmark, each pin's server.
    dest = ROOT / "bench" / "results" / f"cpu-{out['sglang']}-{out['date']}.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(out, indent=2) + "\n")
    print(
        json.dumps(
            {k: v for k, v in out.items() if "ratio" in k or "http" in k}, indent=2
        )
    )
    print(f"wrote {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
