"""Single-GPU checks of the psum61 digest and of an in-place apply (no SGLang).

In one run on one GPU:

  correctness   the digest module's fused Triton path (what the receiver
                and WeightSender run on CUDA) against its torch path
                for random buckets of many sizes (0 B .. 1 GiB,
                odd byte counts, chunk boundaries, unaligned views, extreme
                words), a flipped byte, and digest_tensors' layout
  speed         1 GiB bucket: GB/s of the receiver's digest (digest_bytes,
                fused), of the sender's (digest_tensors over 16, 64 and 256
                tensors: planned once per layout and replayed as a CUDA
                graph, a plan launched without a graph, and the table built
                on every call as before plans), of the torch path and of a
                plain int64 sum of the same bytes; median after warm-up of
                single calls timed with CUDA events and with the wall clock,
                and of kernels launched back to back (GPU throughput without
                host gaps); host microseconds of a plan's layout check
  interference  decode-like work (batch-8 GEMVs through a 7B layer's MLP) on
                the default stream, alone and while a receive stand-in runs on
                a second stream: 1 GiB buckets copied into a staging buffer
                (from pinned host memory, device to device back to back, or
                device to device paced at an NVLink-like rate), each then
                verified with no digest, the torch digest or the Triton one
                (also finished with a bare .tolist(), "triton_tolist")
  cuda_graph    a captured forward replayed after param.data.copy_(staged)
                equals an eager forward on the new weights

Writes JSON to --out (after every section, so a cut-off run keeps what it
has) and prints a short table.

    PYTHONPATH=python python bench/gpu_single.py --out /tmp/gpu-single.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Callable

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "bench"))

from rlsync import digest as lib  # noqa: E402
from rlsync.digest import digest_bytes, digest_tensors  # noqa: E402

GIB = 1 << 30
# Llama-7B MLP: hidden 4096, intermediate 11008.
HIDDEN, INTER = 4096, 11008
CHUNK_BYTES = 4 * lib.CHUNK_WORDS
SMALL = [*range(9), 63, 64, 65, 1023, 4097, 8193, 10**6 + 3, (1 << 24) + 1]
AROUND_CHUNKS = [CHUNK_BYTES + d for d in (-1, 0, 1, 3)] + [3 * CHUNK_BYTES + 2]
SIZES = SMALL + AROUND_CHUNKS + [123_456_789, GIB - 1, GIB, GIB + 3]
# (chunk words, tile words, warps): the default first
CONFIGS = [
    (1 << 16, 2048, 8),
    (1 << 16, 4096, 8),
    (1 << 16, 1024, 4),
    (1 << 16, 2048, 4),
    (1 << 15, 2048, 8),
    (1 << 16, 4096, 16),
]
med = statistics.median


def cuda_times(
    fns: dict[str, Callable[[], object]], repeats: int, warmup: int = 5
) -> dict[str, float]:
    """Median seconds of each fn() between CUDA events on the current stream,
    from an idle GPU, the fns taking turns (in reverse order every other
    round) so that clock drift and what ran just before hit all alike."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for round_ in range(repeats):
        order = list(fns.items())
        for name, fn in order if round_ % 2 == 0 else reversed(order):
            torch.cuda.synchronize()
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end) / 1e3)
    return {name: med(t) for name, t in times.items()}


def wall_times(
    fns: dict[str, Callable[[], object]], repeats: int, warmup: int = 5
) -> dict[str, float]:
    """Median wall seconds of each fn() from an idle GPU to an idle GPU
    (synchronised before and after), the fns taking turns."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for round_ in range(repeats):
        order = list(fns.items())
        for name, fn in order if round_ % 2 == 0 else reversed(order):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            times[name].append(time.perf_counter() - t0)
    return {name: med(t) for name, t in times.items()}


def back_to_back(fn: Callable[[], object], n: int = 10) -> Callable[[], None]:
    """n launches of fn between the events: GPU time, launch gaps hidden."""

    def run() -> None:
        for _ in range(n):
            fn()

    return run


def random_bytes(n: int, seed: int) -> torch.Tensor:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda", generator=gen)


def pattern_bytes(pattern: bytes, n: int) -> torch.Tensor:
    unit = torch.tensor(list(pattern), dtype=torch.uint8, device="cuda")
    return unit.repeat(n // len(pattern) + 1)[:n].contiguous()


def psum61_partials(data: torch.Tensor, **config: int) -> torch.Tensor:
    """The fused kernel's four counters, still on the GPU (no host sync)."""
    out = torch.zeros(4, dtype=torch.int64, device=data.device)
    lib.fused_partials(data, out, **config)
    return out


def finish(counters: torch.Tensor) -> str:
    s_lo, s_hi, t_lo, t_hi = counters.tolist()
    return lib._psum_format((s_hi << 31) + s_lo, (t_hi << 31) + t_lo)


def psum61_digest_cuda(data: torch.Tensor, **config: int) -> str:
    """The library's digest (fused on CUDA); with a config, the fused kernel
    launched with that tiling."""
    if not config:
        return digest_bytes(data)
    return finish(psum61_partials(data, **config))


def torch_digest(data: torch.Tensor) -> str:
    """The digest module's torch path (the reference)."""
    return lib._psum_format(*lib._torch_totals([data])[0][:2])


def tolist_digest(data: torch.Tensor) -> str:
    """The fused digest finished with a plain .tolist() (pageable copy)."""
    return finish(psum61_partials(data))


def config_kwargs(config: tuple[int, int, int]) -> dict[str, int]:
    chunk, tile, warps = config
    return dict(chunk_words=chunk, tile_words=tile, num_warps=warps)


# --- a. correctness ----------------------------------------------------------


def check_correctness() -> dict:
    cases: list[dict] = []

    def check(name: str, data: torch.Tensor, **config: int) -> None:
        ref = torch_digest(data)
        got = psum61_digest_cuda(data, **config)
        cases.append(dict(case=name, bytes=data.numel(), equal=got == ref))
        if got != ref:
            print(f"MISMATCH {name}: triton {got} torch {ref}", flush=True)

    for i, n in enumerate(SIZES):
        check(f"random {n}", random_bytes(n, seed=i))
    big = {
        "min words (-2**31)": b"\x00\x00\x00\x80",
        "max words (2**31-1)": b"\xff\xff\xff\x7f",
        "all 0xff (-1)": b"\xff",
    }
    for name, pattern in big.items():
        check(f"{name} 1 GiB + 2", pattern_bytes(pattern, GIB + 2))
    base = random_bytes(3 * CHUNK_BYTES + 11, seed=99)
    for off in (1, 2, 3, 4):
        view = base[off : off + 2 * CHUNK_BYTES + 5]
        check(f"view at offset {off}", view)
    for config in CONFIGS[1:]:
        for n in (CHUNK_BYTES * 5 + 7, 10**7 + 1):
            check(
                f"config {config} {n}", random_bytes(n, seed=n), **config_kwargs(config)
            )

    # digest_tensors (what the sender attaches) of a bucket's tensors equals
    # the Triton digest of the packed bytes
    gen = torch.Generator(device="cuda").manual_seed(5)
    tensors = [
        torch.randn(s, device="cuda", generator=gen, dtype=torch.bfloat16)
        for s in [(4096, 4096), (4096,), (11008, 4096), (7,)]
    ]
    packed = torch.cat([t.reshape(-1).view(torch.uint8) for t in tensors])
    tensors_equal = digest_tensors(tensors) == psum61_digest_cuda(packed)
    # the sender's plan (a CUDA graph from the second call on) reads the
    # bytes there at each call
    planned, last = [], digest_tensors(tensors)
    for k in (0, 2, 3, None):
        if k is not None:
            tensors[k].view(-1).view(torch.uint8)[k] ^= 0x21
            packed = torch.cat([t.reshape(-1).view(torch.uint8) for t in tensors])
        got = digest_tensors(tensors)
        planned.append(
            got == psum61_digest_cuda(packed) and (got != last) == (k is not None)
        )
        last = got
    plan = lib._plans().get(
        (len(tensors), tensors[0].data_ptr(), tensors[-1].data_ptr())
    )
    plan_graph = plan is not None and plan.graph is not None

    flips = []
    data = random_bytes(GIB, seed=1234)
    before = psum61_digest_cuda(data)
    for pos in (0, 12_345_679, GIB - 1):
        data[pos] ^= 0x10
        after = psum61_digest_cuda(data)
        flips.append(
            dict(
                position=pos,
                detected=after != before,
                equals_torch=after == torch_digest(data),
            )
        )
        data[pos] ^= 0x10
    restored = psum61_digest_cuda(data) == before
    del data
    all_ok = (
        all(c["equal"] for c in cases)
        and tensors_equal
        and all(planned)
        and plan_graph
        and all(f["detected"] and f["equals_torch"] for f in flips)
        and restored
    )
    return dict(
        all_ok=all_ok,
        cases=cases,
        digest_tensors_equal=tensors_equal,
        planned_digest_tensors_equal=planned,
        plan_replays_a_cuda_graph=plan_graph,
        flipped_byte=flips,
        restored_equal=restored,
    )


# --- b. speed ----------------------------------------------------------------


def measure_speed(repeats: int) -> dict:
    buf = random_bytes(GIB, seed=42)
    as_int64 = buf.view(torch.int64)
    mat = buf.view(torch.int32).view(-1, 64)
    # a sender's bucket: 64 tensors of 16 MiB (16 of 64 MiB, 256 of 4 MiB),
    # digested without packing: digest_tensors (its plan for the layout,
    # replayed as a CUDA graph), a plan launched without a graph, and the
    # launch table built on every call (before plans)
    layouts = {n: list(buf.view(n, -1).view(torch.bfloat16)) for n in (16, 64, 256)}
    eager = {n: lib.DigestPlan(ts, graph=False) for n, ts in layouts.items()}
    senders: dict[str, Callable[[], object]] = {}
    for n, ts in layouts.items():
        assert digest_tensors(ts) == digest_bytes(buf) == eager[n].digest(ts)
        sizes = [t.numel() * t.element_size() for t in ts]
        name = "sender_digest_tensors" + ("" if n == 64 else f"_{n}x{1024 // n}MiB")
        senders[name] = lambda ts=ts: digest_tensors(ts)
        senders[f"{name}_plan_no_graph"] = lambda n=n: eager[n].digest(layouts[n])
        senders[f"{name}_unplanned"] = lambda ts=ts, sizes=sizes: lib._psum_format(
            *lib._fused_packed_totals(ts, sizes)
        )
    tensors = layouts[64]
    # and per-tensor launches (series 7 before the one-launch path)
    per_tensor = lambda: lib.psum_totals(tensors)  # noqa: E731
    runs = {
        "triton_digest": lambda: psum61_digest_cuda(buf),
        **senders,
        "sender_one_launch_per_tensor": per_tensor,
        "torch_digest": lambda: torch_digest(buf),
        "plain_int64_sum": lambda: as_int64.sum(),
        "plain_int64_sum_to_host": lambda: as_int64.sum().item(),
        "triton_digest_tolist": lambda: tolist_digest(buf),
        "triton_kernel_only": lambda: psum61_partials(buf),
        "sender_kernel_only": eager[64]._launch,
        # the torch digest's two big reductions, on its [R, 64] int32 view
        "torch_part_row_sums": lambda: mat.sum(1, dtype=torch.int64),
        "torch_part_column_sums": lambda: mat.sum(0, dtype=torch.int64),
    }
    seconds = cuda_times(runs, repeats)
    wall = wall_times(runs, repeats)
    per_launch = 10
    gpu_only = cuda_times(
        {
            "triton_kernel": back_to_back(lambda: psum61_partials(buf), per_launch),
            "sender_kernel": back_to_back(eager[64]._launch, per_launch),
            "plain_int64_sum": back_to_back(lambda: as_int64.sum(), per_launch),
        },
        max(3, repeats // 4),
    )
    gbps = {name: GIB / sec / 1e9 for name, sec in seconds.items()}
    wall_gbps = {name: GIB / sec / 1e9 for name, sec in wall.items()}
    for name, sec in gpu_only.items():
        gbps[f"{name}_back_to_back"] = GIB * per_launch / sec / 1e9

    torch.cuda.synchronize()  # host time to launch the Triton digest
    t0 = time.perf_counter()
    for _ in range(100):
        psum61_partials(buf)
    launch_us = (time.perf_counter() - t0) / 100 * 1e6
    torch.cuda.synchronize()
    host_us = sender_host_us(layouts, eager)

    configs = {str(c): config_kwargs(c) for c in CONFIGS}
    sweep_s = cuda_times(
        {c: (lambda kw=kw: psum61_digest_cuda(buf, **kw)) for c, kw in configs.items()},
        repeats,
    )
    sweep = [dict(**configs[c], GBps=GIB / sec / 1e9) for c, sec in sweep_s.items()]
    return dict(
        bucket_bytes=GIB,
        repeats=repeats,
        timing="GBps: one call between CUDA events (start recorded before the "
        "call, end after it returns; the digests wait for their result on the "
        "host); wall_GBps: one call, perf_counter from a synchronised idle GPU "
        "to the next; *_back_to_back: 10 launches between CUDA events, no "
        "host sync (GPU throughput)",
        GBps=gbps,
        wall_GBps=wall_gbps,
        seconds=seconds,
        wall_seconds=wall,
        triton_launch_host_us=launch_us,
        sender_host_us=host_us,
        ratio_triton_to_plain_sum=gbps["triton_digest"] / gbps["plain_int64_sum"],
        **{
            f"ratio_{name.replace('_digest_tensors', '')}_to_plain_sum": gbps[name]
            / gbps["plain_int64_sum"]
            for name in senders
        },
        ratio_sender_to_plain_sum_wall=wall_gbps["sender_digest_tensors"]
        / wall_gbps["plain_int64_sum"],
        ratio_sender_kernels_back_to_back=gbps["sender_kernel_back_to_back"]
        / gbps["plain_int64_sum_back_to_back"],
        ratio_triton_to_plain_sum_to_host=gbps["triton_digest"]
        / gbps["plain_int64_sum_to_host"],
        ratio_triton_to_plain_sum_wall=wall_gbps["triton_digest"]
        / wall_gbps["plain_int64_sum"],
        ratio_triton_to_plain_sum_to_host_wall=wall_gbps["triton_digest"]
        / wall_gbps["plain_int64_sum_to_host"],
        ratio_torch_to_plain_sum_wall=wall_gbps["torch_digest"]
        / wall_gbps["plain_int64_sum"],
        ratio_torch_to_plain_sum=gbps["torch_digest"] / gbps["plain_int64_sum"],
        ratio_triton_to_torch=gbps["triton_digest"] / gbps["torch_digest"],
        ratio_kernels_back_to_back=gbps["triton_kernel_back_to_back"]
        / gbps["plain_int64_sum_back_to_back"],
        config_sweep=sweep,
    )


def sender_host_us(
    layouts: dict[int, list[torch.Tensor]], eager: dict[int, "lib.DigestPlan"]
) -> dict[str, float]:
    """Host microseconds per call (median of 5 rounds of 200): a plan's
    layout check, digest_tensors' look-up of its plan (the check included),
    enqueueing a plan's graph replay and a plan's launch without a graph."""

    def per_call(fn: Callable[[], object], n: int = 200) -> float:
        rounds = []
        for _ in range(5):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            rounds.append((time.perf_counter() - t0) / n * 1e6)
            torch.cuda.synchronize()
        return med(rounds)

    out: dict[str, float] = {}
    for n, ts in layouts.items():
        out[f"plan_matches_{n}"] = per_call(lambda: eager[n].matches(ts))
        out[f"cached_plan_lookup_{n}"] = per_call(lambda: lib._cached_plan(ts))
    plan = lib._cached_plan(layouts[64])
    if plan is not None and plan.graph is not None:
        out["graph_replay_enqueue"] = per_call(plan.graph.replay, 20)
    out["plan_launch_enqueue"] = per_call(eager[64]._launch, 20)
    return out


# --- c. decode-like interference ---------------------------------------------


class DecodeLike:
    """Batch-8 GEMVs through one 7B layer's MLP: memory-bound like decoding."""

    def __init__(self) -> None:
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

    def run_until(self, done: Callable[[], bool]) -> float:
        """Steps per second until done()."""
        torch.cuda.synchronize()
        t0, n = time.perf_counter(), 0
        while not done():
            self.step()
            torch.cuda.current_stream().synchronize()
            n += 10
        return n / (time.perf_counter() - t0)


class ReceiveStandIn:
    """On its own thread and CUDA stream: copy 1 GiB buckets into a staging
    buffer and verify each against its expected digest, for `seconds`."""

    def __init__(
        self,
        source: torch.Tensor,
        staging: torch.Tensor,
        digest: Callable[[torch.Tensor], str] | None,
        expected: str,
        seconds: float,
        pace_GBps: float | None = None,
    ) -> None:
        self.source, self.staging, self.digest = source, staging, digest
        self.expected, self.seconds, self.pace = expected, seconds, pace_GBps
        self.stream = torch.cuda.Stream()
        self.done = threading.Event()
        self.buckets = 0
        self.elapsed = 0.0
        self.failed = 0
        self.error: str | None = None

    def _work(self) -> None:
        try:
            with torch.cuda.stream(self.stream):
                t0 = time.perf_counter()
                while time.perf_counter() - t0 < self.seconds:
                    self.staging.copy_(self.source, non_blocking=True)
                    if self.digest is not None:
                        self.failed += self.digest(self.staging) != self.expected
                    else:
                        self.stream.synchronize()
                    self.buckets += 1
                    if self.pace:
                        due = t0 + self.buckets * self.staging.numel() / self.pace / 1e9
                        time.sleep(max(0.0, due - time.perf_counter()))
                self.stream.synchronize()
                self.elapsed = time.perf_counter() - t0
        except Exception:  # reported, not raised, from the thread
            self.error = traceback.format_exc()
        finally:
            self.done.set()

    def start(self) -> "ReceiveStandIn":
        threading.Thread(target=self._work, daemon=True).start()
        return self

    def GBps(self) -> float:
        return self.buckets * self.staging.numel() / self.elapsed / 1e9


def window(seconds: float) -> Callable[[], bool]:
    """A done() that turns true `seconds` from now."""
    t0 = time.perf_counter()
    return lambda: time.perf_counter() - t0 > seconds


def measure_interference(seconds: float, repeats: int, pace_GBps: float) -> dict:
    decode = DecodeLike()
    decode.run_until(window(2.0))  # warm-up
    alone_before = decode.run_until(window(2.0))

    staging = torch.empty(GIB, dtype=torch.uint8, device="cuda")
    device_src = random_bytes(GIB, seed=77)
    host_src = torch.empty(GIB, dtype=torch.uint8, pin_memory=True)
    host_src.copy_(device_src)
    expected = torch_digest(device_src)
    assert psum61_digest_cuda(device_src) == expected
    sources = {
        "pinned_h2d": (host_src, None),
        "d2d": (device_src, None),
        "d2d_paced": (device_src, pace_GBps),
    }
    digests = {
        "none": None,
        "torch": torch_digest,
        "triton": psum61_digest_cuda,
        "triton_tolist": tolist_digest,
    }
    runs = []
    for source_name, (source, pace) in sources.items():
        for digest_name, digest in digests.items():
            alone = ReceiveStandIn(source, staging, digest, expected, seconds, pace)
            alone.start().done.wait()
            # decode alone right before, against drift in clocks
            decode_alone = decode.run_until(window(seconds))
            kept, rx_gbps, failed, errors = [], [], 0, []
            for _ in range(repeats):
                rx = ReceiveStandIn(source, staging, digest, expected, seconds, pace)
                steps_per_s = decode.run_until(rx.start().done.is_set)
                kept.append(steps_per_s / decode_alone)
                rx_gbps.append(rx.GBps())
                failed += rx.failed + alone.failed
                if rx.error or alone.error:
                    errors.append(rx.error or alone.error)
            runs.append(
                dict(
                    source=source_name,
                    digest=digest_name,
                    pace_GBps=pace,
                    decode_steps_per_s_alone=decode_alone,
                    receive_GBps_alone=alone.GBps(),
                    receive_GBps_with_decode=med(rx_gbps),
                    decode_kept=med(kept),
                    decode_kept_all=kept,
                    digest_failures=failed,
                    errors=errors,
                )
            )
            print(
                f"  {source_name:11s} {digest_name:13s} decode kept {med(kept):.3f} "
                f"receive {med(rx_gbps):7.1f} GB/s (alone {alone.GBps():7.1f})",
                flush=True,
            )
    alone_after = decode.run_until(window(2.0))
    return dict(
        decode=f"batch-8 GEMVs, bf16 [{INTER},{HIDDEN}] x2 + [{HIDDEN},{INTER}]",
        decode_steps_per_s_alone=alone_before,
        decode_steps_per_s_alone_after=alone_after,
        decode_GBps_alone=alone_before * decode.bytes_per_step() / 1e9,
        window_s=seconds,
        repeats=repeats,
        decode_kept="decode steps/s while receiving over decode alone, measured "
        "just before (same window length); median over repeats",
        receive="1 GiB buckets copied on a second stream into one 1 GiB staging "
        "buffer, then verified on that stream (receiver thread waits for the "
        "digest); pinned_h2d: from pinned host memory; d2d: device to device "
        "back to back; d2d_paced: device to device at pace_GBps",
        runs=runs,
    )


# --- d. CUDA graph and in-place apply ----------------------------------------


def check_cuda_graph() -> dict:
    torch.manual_seed(3)
    model = torch.nn.Sequential(
        torch.nn.Linear(512, 1024),
        torch.nn.GELU(),
        torch.nn.Linear(1024, 1024),
        torch.nn.GELU(),
        torch.nn.Linear(1024, 256),
    ).to(device="cuda", dtype=torch.bfloat16)
    x = torch.randn(16, 512, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                model(x)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = model(x)
        graph.replay()
        old = y.clone()
        staged = [torch.randn_like(p) * 0.05 for p in model.parameters()]
        for p, s in zip(model.parameters(), staged):
            p.data.copy_(s)  # as the receiver's apply does
        graph.replay()
        torch.cuda.synchronize()
        eager = model(x)
    return dict(
        replay_equals_eager=bool(torch.equal(y, eager)),
        output_changed=not torch.equal(old, y),
        params=sum(p.numel() for p in model.parameters()),
    )


# --- main ----------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    day = datetime.date.today().isoformat()
    parser.add_argument(
        "--out", default=str(ROOT / f"bench/results/gpu-single-{day}.json")
    )
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--window-s", type=float, default=1.0)
    parser.add_argument("--window-repeats", type=int, default=2)
    # rate of the NVLink receive measured in gpu-2026-11-23.json (15.2 GB in 45 ms)
    parser.add_argument("--pace-gbps", type=float, default=340.0)
    parser.add_argument("--only", default="correctness,speed,interference,cuda_graph")
    args = parser.parse_args()
    import triton

    result: dict = dict(
        date=day,
        gpu=torch.cuda.get_device_name(),
        torch=torch.__version__,
        cuda=torch.version.cuda,
        triton=triton.__version__,
        digest_config=dict(
            chunk_words=lib.CHUNK_WORDS,
            tile_words=lib.TILE_WORDS,
            num_warps=lib.NUM_WARPS,
        ),
        section_seconds={},
    )
    sections = {
        "correctness": check_correctness,
        "speed": lambda: measure_speed(args.repeats),
        "interference": lambda: measure_interference(
            args.window_s, args.window_repeats, args.pace_gbps
        ),
        "cuda_graph": check_cuda_graph,
    }
    for name in args.only.split(","):
        print(f"[{name}]", flush=True)
        t0 = time.perf_counter()
        try:
            result[name] = sections[name]()
        except Exception:
            result[name] = dict(error=traceback.format_exc())
            print(result[name]["error"], flush=True)
        result["section_seconds"][name] = time.perf_counter() - t0
        torch.cuda.empty_cache()
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print_table(result)


def print_table(r: dict) -> None:
    print(f"\n{r['gpu']}  torch {r['torch']}  triton {r['triton']}")
    c = r.get("correctness", {})
    if "all_ok" in c:
        flips = all(f["detected"] for f in c["flipped_byte"])
        print(
            f"correctness: {len(c['cases'])} cases, all equal: {c['all_ok']}, "
            f"flipped byte detected: {flips}"
        )
    s = r.get("speed", {})
    if "GBps" in s:
        print(f"  {'GB/s':34s} {'events':>8s} {'wall':>8s}")
        for name, v in s["GBps"].items():
            w = s["wall_GBps"].get(name)
            print(f"  {name:34s} {v:8.1f} " + (f"{w:8.1f}" if w else ""))
        for name, v in s.items():
            if name.startswith("ratio"):
                print(f"  {name:34s} {v:8.3f}")
        for name, v in s.get("sender_host_us", {}).items():
            print(f"  host us {name:26s} {v:8.1f}")
    i = r.get("interference", {})
    if "runs" in i:
        print(f"decode alone {i['decode_steps_per_s_alone']:.0f} steps/s")
        for run in i["runs"]:
            print(
                f"  {run['source']:11s} digest {run['digest']:13s} "
                f"decode kept {run['decode_kept']:.3f}  "
                f"receive {run['receive_GBps_with_decode']:7.1f} GB/s"
            )
    g = r.get("cuda_graph", {})
    if "replay_equals_eager" in g:
        print(
            f"cuda graph replay == eager after in-place copy: "
            f"{g['replay_equals_eager']}"
        )


if __name__ == "__main__":
    main()
