"""The staged weight update's shadow on one GPU: begin, load, apply (no SGLang).

A model of ~15 GB of bf16 parameters (N Linear layers of 8192x8192, 128 MiB
each, with the default loader `params[name].data.copy_(t)`) is updated
through `ShadowParameters` (common/python/sglang/srt/weight_sync/
shadow_params.py), its buckets of 1 GiB landing in the receiver's ring of 2
reusable bucket buffers (`StagingPool` from staged_receiver.py, both modules
loaded by file path as tests/test_digest_and_planner.py does). Each bucket is
filled untimed (new random bf16 values every update), then only the load
through the model's loader is timed.

In one run on one GPU, each measurement 1 warm-up + --reps timed, with
torch.cuda.synchronize before and after every timing:

  baselines     raw copy_ per parameter into torch.empty_like storage:
                device to device, pinned host to device, device to pinned
                host; and today's path, every bucket loaded straight into the
                live parameters with load_weights
  device        placement="device": begin() (live -> shadow), load of every
                bucket into the shadow, check_appliable(), apply() (shadow ->
                live: the serving stall)
  host          placement="host" (pinned host memory): the same

After every update: live data_ptrs unchanged (CUDA graphs stay valid; a
captured graph is replayed against the new weights too), live untouched
until apply, and live bit-exact with what was sent (torch.equal on every
layer and a weighted checksum over all). Peak GPU memory per section.

Writes JSON to --out after every section and prints a short table.

    python3 bench/gpu_shadow_apply.py --out /tmp/gpu-shadow-apply.json
"""

from __future__ import annotations

import argparse
import datetime
import gc
import hashlib
import importlib.util
import json
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Callable, Dict, List, Sequence, Tuple

import torch

ROOT = Path(__file__).resolve().parents[1]
WEIGHT_SYNC = ROOT / "common" / "python" / "sglang" / "srt" / "weight_sync"
DIGEST_MODULE = "sglang.srt.weight_sync.digest"

GIB = 1 << 30
MIB = 1 << 20
CHECK_PRIME = (1 << 61) - 1


def load_module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_weight_sync(directory: Path):
    """shadow_params and staged_receiver (with the modules it imports
    registered under their names), by file path: the device has no SGLang."""
    load_module(DIGEST_MODULE, directory / "digest.py")
    load_module("sglang.srt.weight_sync.bucket_header", directory / "bucket_header.py")
    receiver = load_module("staged_receiver", directory / "staged_receiver.py")
    shadow = load_module("shadow_params", directory / "shadow_params.py")
    return receiver, shadow


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


# --- the model ----------------------------------------------------------------


class Model(torch.nn.Module):
    """N Linear layers; the default loader, as SGLang's for unnamed params."""

    def __init__(self, layers: int, dim: int):
        super().__init__()
        self.layers = torch.nn.ModuleList(
            torch.nn.Linear(dim, dim, bias=False, device="cuda", dtype=torch.bfloat16)
            for _ in range(layers)
        )

    def load_weights(self, weights) -> None:
        params = dict(self.named_parameters())
        for name, tensor in weights:
            params[name].data.copy_(tensor)


def layer_name(i: int) -> str:
    return f"layers.{i}.weight"


def fill(out: torch.Tensor, version: int, layer: int) -> torch.Tensor:
    """Layer `layer`'s values in update `version`, deterministic."""
    gen = torch.Generator(device="cuda").manual_seed(version * 1_000_003 + layer)
    return out.normal_(generator=gen)


def checksum(t: torch.Tensor) -> int:
    return int(t.view(torch.int32).sum(dtype=torch.int64))


class Checker:
    """Live against what update `version` sent."""

    def __init__(self, model: Model, dim: int):
        self.params = [layer.weight for layer in model.layers]
        self.ptrs = [p.data_ptr() for p in self.params]
        self.scratch = torch.empty(dim, dim, dtype=torch.bfloat16, device="cuda")

    def addresses_kept(self) -> bool:
        return [p.data_ptr() for p in self.params] == self.ptrs

    def layer_equal(self, i: int, version: int) -> bool:
        return torch.equal(self.params[i].data, fill(self.scratch, version, i))

    def untouched(self, version: int) -> bool:
        """A few layers still hold `version` (spot check before apply)."""
        n = len(self.params)
        return all(self.layer_equal(i, version) for i in sorted({0, n // 2, n - 1}))

    def verify(self, version: int, sent: Dict[int, int]) -> Dict:
        """Every layer torch.equal to its regenerated values, and a weighted
        checksum over all layers against one over the bucket bytes as sent."""
        equal, live_sum, sent_sum = 0, 0, 0
        for i, p in enumerate(self.params):
            expected = fill(self.scratch, version, i)
            equal += bool(torch.equal(p.data, expected))
            live_sum = (live_sum + (i + 1) * checksum(p.data)) % CHECK_PRIME
            sent_sum = (sent_sum + (i + 1) * sent[i]) % CHECK_PRIME
        return dict(
            layers_equal=equal,
            layers=len(self.params),
            checksum_live=live_sum,
            checksum_sent=sent_sum,
            bit_exact=equal == len(self.params) and live_sum == sent_sum,
            addresses_kept=self.addresses_kept(),
        )


# --- timing ---------------------------------------------------------------------


def timed(fn: Callable[[], object]) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def summary(times: Sequence[float], nbytes: int) -> Dict:
    median = statistics.median(times)
    return dict(
        seconds=[round(t, 6) for t in times],
        median_s=round(median, 6),
        min_s=round(min(times), 6),
        mean_s=round(statistics.mean(times), 6),
        gbps_median=round(nbytes / median / 1e9, 3),
        gbps_best=round(nbytes / min(times) / 1e9, 3),
    )


def repeat(fn: Callable[[], object], reps: int) -> List[float]:
    fn()  # warm-up
    return [timed(fn) for _ in range(reps)]


class Sender:
    """Buckets of the update through the ring of bucket buffers."""

    def __init__(self, receiver, layers: int, dim: int, bucket_bytes: int):
        layer_bytes = dim * dim * 2
        per_bucket = max(1, bucket_bytes // layer_bytes)
        raw = []
        for start in range(0, layers, per_bucket):
            names = [
                layer_name(i) for i in range(start, min(layers, start + per_bucket))
            ]
            raw.append(
                dict(
                    names=names,
                    dtypes=["bfloat16"] * len(names),
                    shapes=[[dim, dim]] * len(names),
                )
            )
        self.receiver = receiver
        self.buckets = receiver.parse_buckets(len(raw), raw, "flattened_bucket")
        self.pool = receiver.StagingPool(torch.device("cuda"))
        nbytes = max(b.nbytes for b in self.buckets)
        self.ring, _ = self.pool.acquire(nbytes, receiver.RING_BUCKETS)
        self.ring_bytes = self.pool.nbytes
        # Checksum of every layer's bytes in its bucket, as last sent.
        self.sent: Dict[int, int] = {}

    def send(self, version: int, sink) -> Tuple[float, List[float]]:
        """Every bucket filled into its ring buffer (untimed), then handed to
        the sink (timed). Seconds summed over buckets, and per bucket."""
        per_bucket = []
        for spec in self.buckets:
            buffer = self.ring[spec.index % len(self.ring)]
            views = []
            for t in spec.tensors:
                view = self.receiver._typed_view(buffer, t)
                layer = int(t.name.split(".")[1])
                fill(view, version, layer)
                self.sent[layer] = checksum(view)
                views.append((t.name, view))
            per_bucket.append(timed(lambda: sink(iter(views))))
        return sum(per_bucket), per_bucket


# --- sections -------------------------------------------------------------------


def section_peak(result: Dict, name: str) -> None:
    result.setdefault("peak_memory", {})[name] = dict(
        max_allocated_gib=round(torch.cuda.max_memory_allocated() / GIB, 3),
        max_reserved_gib=round(torch.cuda.max_memory_reserved() / GIB, 3),
    )
    torch.cuda.reset_peak_memory_stats()


def baselines(model: Model, sender: Sender, checker: Checker, state: Dict, reps: int):
    params = [p.data for p in model.parameters()]
    nbytes = sum(p.numel() * p.element_size() for p in params)
    out: Dict = {}
    dst = [torch.empty_like(p) for p in params]
    out["raw_d2d"] = summary(
        repeat(lambda: [d.copy_(p) for d, p in zip(dst, params)], reps), nbytes
    )
    t0 = time.perf_counter()
    host = [torch.empty(p.shape, dtype=p.dtype, pin_memory=True) for p in params]
    out["pinned_alloc_s"] = round(time.perf_counter() - t0, 3)
    for h, p in zip(host, params):
        h.copy_(p)
    out["raw_h2d"] = summary(
        repeat(
            lambda: [d.copy_(h, non_blocking=True) for d, h in zip(dst, host)], reps
        ),
        nbytes,
    )
    out["raw_d2h"] = summary(
        repeat(
            lambda: [h.copy_(d, non_blocking=True) for h, d in zip(host, dst)], reps
        ),
        nbytes,
    )
    del dst, host
    gc.collect()
    torch.cuda.empty_cache()

    # Today's path: every bucket straight into live with the model's loader.
    totals, checks = [], []
    for rep in range(reps + 1):
        state["version"] += 1
        total, _ = sender.send(state["version"], model.load_weights)
        if rep:
            totals.append(total)
        checks.append(checker.verify(state["version"], sender.sent))
    out["direct_load_into_live"] = summary(totals, nbytes)
    out["direct_load_into_live"]["bit_exact"] = all(c["bit_exact"] for c in checks)
    out["direct_load_into_live"]["addresses_kept"] = all(
        c["addresses_kept"] for c in checks
    )
    return out


def shadow_section(
    shadow_mod,
    placement: str,
    model: Model,
    sender: Sender,
    checker: Checker,
    state: Dict,
    reps: int,
    graph,
) -> Dict:
    nbytes = shadow_mod.parameter_bytes([model])
    t0 = time.perf_counter()
    shadow = shadow_mod.ShadowParameters([model], placement=placement)
    torch.cuda.synchronize()
    out: Dict = dict(
        placement=placement, construct_s=round(time.perf_counter() - t0, 3)
    )
    out["shadow_nbytes"] = shadow.nbytes
    times: Dict[str, List[float]] = {
        "begin": [],
        "load": [],
        "check_appliable": [],
        "apply": [],
    }
    checks, untouched, per_bucket, graph_ok = [], [], [], []
    for rep in range(reps + 1):
        before = state["version"]
        state["version"] += 1
        t_begin = timed(shadow.begin)
        t_load, buckets = sender.send(state["version"], shadow.load)
        untouched.append(checker.untouched(before))
        why = []
        t_check = timed(lambda: why.append(shadow.check_appliable()))
        assert why[0] is None, why[0]
        t_apply = timed(shadow.apply)
        checks.append(checker.verify(state["version"], sender.sent))
        if graph is not None:
            graph_ok.append(graph(state["version"]))
        if rep:  # the first is the warm-up
            for key, t in zip(times, (t_begin, t_load, t_check, t_apply)):
                times[key].append(t)
            per_bucket.append(buckets)
    for key in ("begin", "load", "apply"):
        out[key] = summary(times[key], nbytes)
    out["check_appliable_median_s"] = round(
        statistics.median(times["check_appliable"]), 6
    )
    out["update_total_median_s"] = round(
        statistics.median(
            b + l + c + a for b, l, c, a in zip(*(times[k] for k in times))
        ),
        6,
    )
    out["load_per_bucket_median_s"] = [
        round(statistics.median(col), 6) for col in zip(*per_bucket)
    ]
    out["addresses_kept"] = all(c["addresses_kept"] for c in checks)
    out["bit_exact"] = all(c["bit_exact"] for c in checks)
    out["live_untouched_until_apply"] = all(untouched)
    out["last_check"] = checks[-1]
    if graph is not None:
        out["cuda_graph_replay_matches"] = all(
            g["close"] and g["differs_from_previous"] for g in graph_ok
        )
        out["cuda_graph_replay_exact"] = all(g["exact"] for g in graph_ok)
    del shadow
    gc.collect()
    torch.cuda.empty_cache()
    return out


def make_graph_check(model: Model, dim: int):
    """A CUDA graph of layers[0](x), captured before any update: after every
    apply its replay must equal an eager matmul with the weights sent."""
    layer = model.layers[0]
    x = torch.randn(8, dim, dtype=torch.bfloat16, device="cuda")
    y = torch.empty(8, dim, dtype=torch.bfloat16, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.no_grad():
        for _ in range(2):
            y.copy_(layer(x))
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        y.copy_(layer(x))
    scratch = torch.empty(dim, dim, dtype=torch.bfloat16, device="cuda")

    def check(version: int) -> Dict:
        graph.replay()
        with torch.no_grad():
            expected = torch.nn.functional.linear(x, fill(scratch, version, 0))
            old = torch.nn.functional.linear(x, fill(scratch, version - 1, 0))
        # Outputs are ~N(0, 90); another version's differ by ~130.
        return dict(
            exact=bool(torch.equal(y, expected)),
            close=bool(torch.allclose(y, expected, rtol=2e-2, atol=1.0)),
            differs_from_previous=not bool(torch.allclose(y, old, rtol=2e-2, atol=1.0)),
        )

    return check


# --- main -----------------------------------------------------------------------


def machine() -> Dict:
    info = dict(
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        gpu=torch.cuda.get_device_name(),
        capability=".".join(map(str, torch.cuda.get_device_capability())),
        gpu_memory_gib=round(torch.cuda.get_device_properties(0).total_memory / GIB, 2),
        torch=torch.__version__,
        cuda=torch.version.cuda,
        python=sys.version.split()[0],
    )
    try:
        info["driver"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.strip()
    except Exception as exc:  # noqa: BLE001
        info["driver"] = f"unknown ({exc})"
    try:
        meminfo = dict(
            line.split(":", 1)
            for line in Path("/proc/meminfo").read_text().splitlines()
        )
        info["host_mem_available_gib"] = round(
            int(meminfo["MemAvailable"].split()[0]) * 1024 / GIB, 1
        )
    except Exception:  # noqa: BLE001
        pass
    return info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--layers", type=int, default=112)
    parser.add_argument("--dim", type=int, default=8192)
    parser.add_argument("--bucket-gib", type=float, default=1.0)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--weight-sync-dir", default=str(WEIGHT_SYNC))
    parser.add_argument("--skip-host", action="store_true")
    args = parser.parse_args()

    directory = Path(args.weight_sync_dir)
    receiver, shadow_mod = load_weight_sync(directory)
    result: Dict = dict(machine=machine())
    result["modules"] = {
        name: dict(
            path=str((directory / name).relative_to(ROOT)),
            sha256_16=file_sha256(directory / name),
        )
        for name in ("shadow_params.py", "staged_receiver.py", "digest.py")
    }
    out_path = Path(args.out)

    def save() -> None:
        out_path.write_text(json.dumps(result, indent=1) + "\n")

    layer_bytes = args.dim * args.dim * 2
    bucket_bytes = int(args.bucket_gib * GIB)
    free, total = torch.cuda.mem_get_info()
    # Peak: live + (baseline copy or device shadow) + ring + ~1 GiB of checks.
    ring = 2 * bucket_bytes
    fit = int((free - ring - GIB) // (2 * layer_bytes))
    layers = min(args.layers, fit)
    per_bucket = max(1, bucket_bytes // layer_bytes)
    if layers < args.layers:
        layers = max(per_bucket, layers // per_bucket * per_bucket)
    result["config"] = dict(
        layers_requested=args.layers,
        layers=layers,
        scaled_down=layers < args.layers,
        dim=args.dim,
        dtype="bfloat16",
        layer_mib=layer_bytes / MIB,
        param_bytes=layers * layer_bytes,
        param_gb=round(layers * layer_bytes / 1e9, 3),
        param_gib=round(layers * layer_bytes / GIB, 3),
        bucket_bytes=bucket_bytes,
        reps=args.reps,
        warmup=1,
        gpu_free_at_start_gib=round(free / GIB, 2),
        gpu_total_gib=round(total / GIB, 2),
    )
    print(json.dumps(result["config"]), flush=True)
    save()

    section_seconds: Dict[str, float] = {}
    result["section_seconds"] = section_seconds
    t0 = time.perf_counter()
    torch.cuda.reset_peak_memory_stats()
    model = Model(layers, args.dim)
    state = {"version": 0}
    for i, layer in enumerate(model.layers):
        fill(layer.weight.data, 0, i)
    sender = Sender(receiver, layers, args.dim, bucket_bytes)
    checker = Checker(model, args.dim)
    graph = make_graph_check(model, args.dim)
    result["config"]["buckets"] = len(sender.buckets)
    result["config"]["ring_bytes"] = sender.ring_bytes
    torch.cuda.synchronize()
    section_seconds["setup"] = round(time.perf_counter() - t0, 2)
    section_peak(result, "setup")
    nbytes = layers * layer_bytes

    sections = [
        ("baselines", lambda: baselines(model, sender, checker, state, args.reps)),
        (
            "device",
            lambda: shadow_section(
                shadow_mod, "device", model, sender, checker, state, args.reps, graph
            ),
        ),
    ]
    if not args.skip_host:
        sections.append(
            (
                "host",
                lambda: shadow_section(
                    shadow_mod, "host", model, sender, checker, state, args.reps, graph
                ),
            )
        )
    for name, run in sections:
        t0 = time.perf_counter()
        try:
            result[name] = run()
        except Exception:  # noqa: BLE001
            result[name] = dict(error=traceback.format_exc())
            print(result[name]["error"], flush=True)
        section_seconds[name] = round(time.perf_counter() - t0, 2)
        section_peak(result, name)
        save()
        print(f"{name}: {section_seconds[name]} s", flush=True)

    # Key numbers in one place.
    base, dev, host = (result.get(k, {}) for k in ("baselines", "device", "host"))

    def med(section: Dict, key: str):
        return section.get(key, {}).get("median_s")

    def ratio(a, b):
        return round(a / b, 3) if a and b else None

    key: Dict = dict(param_gb=round(nbytes / 1e9, 3))
    for label, section in (("device", dev), ("host", host)):
        for step in ("begin", "load", "apply"):
            if step in section:
                key[f"{label}_{step}_s"] = section[step]["median_s"]
                key[f"{label}_{step}_gbps"] = section[step]["gbps_median"]
        for flag in (
            "addresses_kept",
            "bit_exact",
            "live_untouched_until_apply",
            "cuda_graph_replay_matches",
        ):
            if flag in section:
                key[f"{label}_{flag}"] = section[flag]
    for b in ("raw_d2d", "raw_h2d", "raw_d2h", "direct_load_into_live"):
        if b in base:
            key[f"{b}_s"] = base[b]["median_s"]
            key[f"{b}_gbps"] = base[b]["gbps_median"]
    key["apply_device_over_raw_d2d"] = ratio(med(dev, "apply"), med(base, "raw_d2d"))
    key["apply_host_over_raw_h2d"] = ratio(med(host, "apply"), med(base, "raw_h2d"))
    key["apply_device_over_direct_load"] = ratio(
        med(dev, "apply"), med(base, "direct_load_into_live")
    )
    key["apply_host_over_direct_load"] = ratio(
        med(host, "apply"), med(base, "direct_load_into_live")
    )
    key["peak_allocated_gib"] = {
        k: v["max_allocated_gib"] for k, v in result["peak_memory"].items()
    }
    result["key"] = key
    save()
    width = max(map(len, key))
    for k, v in key.items():
        print(f"{k:<{width}}  {v}")


if __name__ == "__main__":
    main()
