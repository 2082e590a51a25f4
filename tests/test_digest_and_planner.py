"""Sender and receiver agree on bucket digests (the trainer's digest module
is a generated copy of the server's); the digest catches what it must; the
planner keeps its promises; the receive module imports only torch and the
digest module. (tests/test_digest_strength.py proves the digest's
guarantees in detail.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness.series_modules import (
    DIGEST,
    DIGEST_MODULE,
    RECEIVER,
    RECEIVER_IMPORTS,
    ROOT,
    load_receiver_source,
    series_source,
)
from rlsync import digest as trainer_digest
from rlsync.digest import digest_bytes, digest_tensors
from rlsync.planner import bucket_budget, plan_buckets

server = load_receiver_source()
server_digest = sys.modules[DIGEST_MODULE + "_source"]
bucket_digest = server_digest.digest_bytes


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 255, 256, 257, 4096, 1_000_003])
def test_trainer_and_server_digests_agree(n):
    data = torch.randint(
        0, 256, (n,), dtype=torch.uint8, generator=torch.Generator().manual_seed(n)
    )
    assert digest_bytes(data) == bucket_digest(data)
    assert digest_bytes(data).startswith(f"{server.DIGEST_ALGORITHM}:")


def test_the_trainer_digest_is_the_generated_copy_of_the_servers():
    """One algorithm, one source: python/rlsync/digest.py is generated from
    the server's weight_sync/digest.py (`make overlay`; `make check` fails on
    drift), and the receiver checks buckets with the server's module."""
    text = Path(trainer_digest.__file__).read_text()
    header, body = text.split("\n", 1)
    assert header.startswith("# Generated from common/" + DIGEST)
    assert body == (ROOT / "common" / DIGEST).read_text()
    assert trainer_digest.DIGEST_ALGORITHM == server.DIGEST_ALGORITHM == "psum61"
    assert server.digest_bytes is server_digest.digest_bytes


def test_server_accepts_its_digests_and_rejects_others_naming_the_field():
    data = torch.arange(1000, dtype=torch.int32).view(torch.uint8)
    server.check_digest_format(digest_bytes(data), "buckets[0].digest", 4000)
    expected = "buckets[3].digest: expected 'psum61:<s1>:<s2>' with s1 and s2"
    old = "wsum64:" + "0" * 15 + "1:" + "f" * 16  # the previous algorithm
    cases = {
        old: "digest algorithm 'wsum64' is not accepted by this server",
        "md5:abc": "digest algorithm 'md5' is not accepted",
        "psum61:" + "0" * 16: "",
        "psum61:" + "A" * 16 + ":" + "0" * 16: "",  # uppercase
        "psum61:" + "0" * 16 + ":" + "1" + "f" * 15: "",  # 2**61 - 1 = p
        "psum61:" + "0" * 17 + ":" + "0" * 16: "",
        "psum61:" + "0" * 16 + ":" + "0" * 16 + "\n": "",
    }
    for digest, hint in cases.items():
        with pytest.raises(server.WeightsUpdateError) as err:
            server.check_digest_format(digest, "buckets[3].digest")
        assert str(err.value).startswith(expected), str(err.value)
        assert hint in str(err.value) and err.value.status_code == 400
    for bad in (None, 7, b"psum61:", ["psum61"]):
        with pytest.raises(server.WeightsUpdateError, match="expected 'psum61:"):
            server.check_digest_format(bad, "buckets[0].digest")
    # the largest value below p is well-formed
    top = f"{server.PSUM_PRIME - 1:016x}"
    server.check_digest_format(f"psum61:{top}:{top}", "buckets[0].digest")
    with pytest.raises(server.WeightsUpdateError, match="below 274877906944 bytes"):
        server.check_digest_format(
            f"psum61:{top}:{top}", "buckets[0].digest", server.MAX_DIGEST_BYTES
        )


def test_digest_catches_every_single_flipped_byte_position_sampled():
    data = torch.randint(
        0, 256, (10_001,), dtype=torch.uint8, generator=torch.Generator().manual_seed(1)
    )
    ref = digest_bytes(data)
    for pos in list(range(0, 10_001, 97)) + [10_000]:
        for bit in (0, 7):
            flipped = data.clone()
            flipped[pos] ^= 1 << bit
            assert digest_bytes(flipped) != ref, (pos, bit)


def test_digest_catches_swapped_words_and_swapped_buckets():
    gen = torch.Generator().manual_seed(2)
    a = torch.randint(0, 256, (4096,), dtype=torch.uint8, generator=gen)
    b = torch.randint(0, 256, (4096,), dtype=torch.uint8, generator=gen)
    assert digest_bytes(a) != digest_bytes(b)
    for width in (4, 8):  # 32-bit words, and 64-bit ones (two words each)
        swapped = a.clone()
        swapped[:width] = a[width : 2 * width]
        swapped[width : 2 * width] = a[:width]
        assert digest_bytes(swapped) != digest_bytes(a)


def test_digest_of_tensors_is_the_flattened_layout():
    ts = [
        torch.randn(3, 5).to(torch.bfloat16),
        torch.randn(7),
        torch.arange(3, dtype=torch.int64),
    ]
    flat = torch.cat([t.reshape(-1).view(torch.uint8) for t in ts])
    assert digest_tensors(ts) == bucket_digest(flat)


@pytest.mark.parametrize("seed", range(10))
def test_digest_of_tensors_without_packing_equals_packed(seed):
    """Tensors whose bytes are whole words are summed in place; a tensor
    ending mid-word (anywhere but last) falls back to packing. Both give the
    packed digest."""
    gen = torch.Generator().manual_seed(seed)
    dtypes = [torch.bfloat16, torch.float32, torch.int64, torch.uint8]
    ts = []
    for _ in range(int(torch.randint(1, 6, (), generator=gen))):
        dtype = dtypes[int(torch.randint(0, 4, (), generator=gen))]
        numel = int(torch.randint(1, 300, (), generator=gen)) * (4 if seed % 2 else 1)
        ts.append(torch.randint(0, 100, (numel,), generator=gen).to(dtype))
    ts.append(torch.randn(2, 3).t())  # non-contiguous
    flat = torch.cat([t.contiguous().reshape(-1).view(torch.uint8) for t in ts])
    assert digest_tensors(ts) == bucket_digest(flat), [t.dtype for t in ts]


def test_digest_of_views_into_one_flat_buffer_at_any_alignment():
    """Parameters as views of one flat buffer (bf16 at odd element offsets
    too), several levels of partial sums deep: the same as packed."""
    flat = torch.randn(700_001).to(torch.bfloat16)
    cuts = [0, 3, 4099, 4100, 300_001, 300_002, 700_001]
    views = [flat[a:b] for a, b in zip(cuts, cuts[1:])]
    assert digest_tensors(views) == bucket_digest(flat.view(torch.uint8))
    raw = flat.view(torch.uint8)
    for start in (1, 2, 3, 6):  # bytes that start off a 4-byte boundary
        assert bucket_digest(raw[start:]) == digest_bytes(raw[start:].clone())


def named(sizes):
    return [(f"t{i}", torch.empty(s, dtype=torch.uint8)) for i, s in enumerate(sizes)]


@pytest.mark.parametrize("seed", range(20))
def test_planner_properties(seed):
    gen = torch.Generator().manual_seed(seed)
    sizes = torch.randint(1, 5000, (50,), generator=gen).tolist()
    budget = int(torch.randint(500, 8000, (1,), generator=gen))
    buckets = plan_buckets(named(sizes), budget)
    flat = [n for b in buckets for n in b.names]
    assert flat == [f"t{i}" for i in range(len(sizes))], "order kept, each once"
    for b in buckets:
        assert b.nbytes == sum(t.numel() for t in b.tensors)
        assert b.nbytes <= budget or len(b.names) == 1, "over budget only alone"
    assert (
        plan_buckets(named(sizes), budget)[0].names == buckets[0].names
    )  # deterministic


@pytest.mark.parametrize("seed", range(10))
def test_planner_ramp_keeps_every_bucket_within_its_budget(seed):
    gen = torch.Generator().manual_seed(seed)
    sizes = torch.randint(1, 3000, (80,), generator=gen).tolist()
    budget, first = 8000, int(torch.randint(100, 2000, (1,), generator=gen))
    buckets = plan_buckets(named(sizes), budget, first_bucket_bytes=first)
    assert [n for b in buckets for n in b.names] == [f"t{i}" for i in range(80)]
    for i, b in enumerate(buckets):
        cap = bucket_budget(i, budget, first)
        assert cap == min(budget, first * 4**i)
        assert b.nbytes <= cap or len(b.names) == 1, (i, b.nbytes, cap)
    assert buckets[0].nbytes <= first or len(buckets[0].names) == 1


def test_planner_gives_an_oversized_tensor_its_own_bucket():
    buckets = plan_buckets(named([10, 10, 1000, 10]), 100)
    assert [b.names for b in buckets] == [["t0", "t1"], ["t2"], ["t3"]]


def test_planner_rejects_duplicates_and_bad_budget():
    with pytest.raises(ValueError, match="duplicate"):
        plan_buckets([("a", torch.empty(1)), ("a", torch.empty(1))], 10)
    with pytest.raises(ValueError, match="bucket_bytes"):
        plan_buckets([], 0)


def test_receive_module_needs_no_sglang():
    """Loaded by file path with sglang unimportable, the modules it imports
    beside it: the GPU benchmarks do this."""
    receiver = str(series_source(RECEIVER))
    code = (
        "import sys, importlib.util\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'sglang': raise ImportError('sglang blocked')\n"
        "sys.meta_path.insert(0, Block())\n"
    )
    for name, rel in RECEIVER_IMPORTS.items():
        path = str(series_source(rel))
        code += (
            f"d = importlib.util.spec_from_file_location({name!r}, {path!r})\n"
            f"dm = importlib.util.module_from_spec(d); sys.modules[{name!r}] = dm\n"
            "d.loader.exec_module(dm)\n"
        )
    code += (
        f"s = importlib.util.spec_from_file_location('staged_receiver', {receiver!r})\n"
        "m = importlib.util.module_from_spec(s); sys.modules['staged_receiver'] = m\n"
        "s.loader.exec_module(m)\n"
        "print(m.StagedWeightReceiver.__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "StagedWeightReceiver"


# Sizes around every boundary of the fused kernel: tails of 0-3 bytes, one
# word short of and past a chunk of 2**16 words, several chunks.
CHUNK_BYTES = 4 * trainer_digest.CHUNK_WORDS
FUSED_SIZES = [*range(9), 63, 64, 65, 1023, 4097]
FUSED_SIZES += [CHUNK_BYTES + d for d in (-4, -1, 0, 1, 3)] + [3 * CHUNK_BYTES + 2]

FUSED_CHECK = """
import sys, torch
from rlsync import digest as d
assert d.fused_digest_available([torch.zeros(1, dtype=torch.uint8, device=DEVICE)])
g = torch.Generator().manual_seed(0)
cases = [torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g) for n in SIZES]
cases += [torch.full((2 * CHUNK + 1,), 255, dtype=torch.uint8)]  # every word -1
cases += [torch.tensor([0, 0, 0, 128] * (CHUNK // 4 + 7), dtype=torch.uint8)]  # -2**31
cases += [torch.tensor([255, 255, 255, 127] * 5000, dtype=torch.uint8)]  # 2**31 - 1
for x in cases:
    x = x.to(DEVICE)
    (s, t, n), = d.psum_totals([x])
    (rs, rt, rn), = d._torch_totals([x])
    assert d._psum_format(s, t) == d._psum_format(rs, rt) and n == rn, x.numel()
def packed_digest(tensors):
    packed = torch.cat([t.reshape(-1).view(torch.uint8) for t in tensors])
    return d._psum_format(*d._torch_totals([packed])[0][:2])
raw = torch.randint(0, 256, (3 * CHUNK + 64,), dtype=torch.uint8, generator=g)
buckets = [  # a bucket's tensors, digested in one launch over all of them
    [torch.randn(5, 7), torch.randn(3, dtype=torch.bfloat16), torch.arange(9.0)],
    [torch.randn(1) for _ in range(40)],
    [raw[: CHUNK + 4], torch.zeros(0), raw[CHUNK + 4 : 3 * CHUNK], raw[-7:]],
    [raw[2 : 2 + CHUNK], raw[: 4 * 17]],  # a part at an unaligned address
    [torch.zeros(0), raw[:9]],
    [torch.randn(8, 6).t(), torch.randn(5)],  # not contiguous
]
for tensors in buckets:
    tensors = [t.to(DEVICE) for t in tensors]
    assert d.digest_tensors(tensors) == packed_digest(tensors), len(tensors)
flat = torch.randint(0, 256, (CHUNK + 11,), dtype=torch.uint8, generator=g).to(DEVICE)
for start in range(4):  # views at every alignment
    view = flat[start:]
    assert d.digest_bytes(view) == d._psum_format(*d._torch_totals([view])[0][:2])
print("fused ok", len(cases))
"""


def run_fused_check(device: str, env: dict[str, str]) -> str:
    code = f"DEVICE = {device!r}\nSIZES = {FUSED_SIZES!r}\nCHUNK = {CHUNK_BYTES}\n"
    proc = subprocess.run(
        [sys.executable, "-c", code + FUSED_CHECK],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "python"), **env},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.skipif(trainer_digest.triton is None, reason="needs triton")
def test_fused_digest_equals_the_torch_path_under_the_triton_interpreter():
    """The one-pass kernel, run by Triton's interpreter on CPU, gives the
    torch path's strings at every boundary (CI has no GPU)."""
    out = run_fused_check("cpu", {"TRITON_INTERPRET": "1"})
    assert out.startswith("fused ok")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fused_digest_equals_the_torch_path_on_cuda():
    assert run_fused_check("cuda", {}).startswith("fused ok")


FALLBACK_CHECK = """
import logging, torch
from rlsync import digest as d
warnings = []
logging.getLogger(d.__name__).addHandler(
    type("H", (logging.Handler,), {"emit": lambda h, r: warnings.append(r.getMessage())})()
)
def packed_digest(tensors):
    packed = torch.cat([t.reshape(-1).view(torch.uint8) for t in tensors])
    return d._psum_format(*d._torch_totals([packed])[0][:2])
class WillNotCompile:  # what Triton raises for a GPU its ptxas does not know
    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            raise RuntimeError("ptxas fatal: Value 'sm_999' is not defined")
        return launch
d._psum61_parts_kernel = d._psum61_chunk_kernel = WillNotCompile()
g = torch.Generator().manual_seed(1)
paths = {  # each reaches the kernel a different way
    "plan": [torch.randn(300, 7), torch.randn(33)],
    "packed": [torch.randn(8, 6).t(), torch.randn(5)],
    "bytes": [torch.randint(0, 256, (4099,), dtype=torch.uint8, generator=g)],
}
for path, tensors in paths.items():
    d._fused_failures.clear()
    assert d.fused_digest_available(tensors), path
    assert d.digest_tensors(tensors) == packed_digest(tensors), path
    assert not d.fused_digest_available(tensors), path
    assert d.digest_tensors(tensors) == packed_digest(tensors), path  # stays off
assert len(warnings) == 3 and all("sm_999" in w for w in warnings), warnings
print("fallback ok")
"""


@pytest.mark.skipif(trainer_digest.triton is None, reason="needs triton")
def test_a_kernel_that_will_not_compile_falls_back_to_the_torch_path():
    """A GPU whose Triton cannot build the fused kernel still verifies: the
    digest comes from the torch path (the same string), the device stays on
    it, and the reason is logged once, on every way into the kernel."""
    code = FALLBACK_CHECK
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "python"), "TRITON_INTERPRET": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("fallback ok")


PLAN_CHECK = """
import threading, torch
from rlsync import digest as d
def packed_digest(tensors):
    packed = torch.cat([t.reshape(-1).view(torch.uint8) for t in tensors])
    return d._psum_format(*d._torch_totals([packed])[0][:2])
def plan_of(tensors):
    return d._plans().get((len(tensors), tensors[0].data_ptr(), tensors[-1].data_ptr()))
g = torch.Generator().manual_seed(1)
raw = torch.randint(0, 256, (3 * CHUNK + 64,), dtype=torch.uint8, generator=g).to(DEVICE)
edge = CHUNK + 4
bucket = [raw[:edge], raw[edge:edge], raw[edge : 3 * CHUNK], raw[3 * CHUNK : 3 * CHUNK + 7]]
# built on the first call, reused after (captured in a CUDA graph on CUDA)
first = d.digest_tensors(bucket)
assert first == packed_digest(bucket)
plan = plan_of(bucket)
assert plan is not None and plan.rows == 3 and plan.sizes[1] == 0
assert not plan.aligned  # raw[edge:] starts 4 bytes past a multiple of 16
by16 = [raw[:CHUNK], raw[CHUNK : 2 * CHUNK + 16], raw[2 * CHUNK + 16 : 3 * CHUNK + 3]]
for _ in range(3):  # the kernel that reads 16 bytes a load
    assert d.digest_tensors(by16) == packed_digest(by16) and plan_of(by16).aligned
for _ in range(3):
    assert d.digest_tensors(bucket) == first and plan_of(bucket) is plan
assert (plan.graph is not None) == (DEVICE == "cuda"), plan.graph
# it reads the bytes there now, also written just before on another stream
for pos in (0, edge + 9, 3 * CHUNK + 6):
    raw[pos] ^= 0x40
    assert d.digest_tensors(bucket) == packed_digest(bucket) != first, pos
    raw[pos] ^= 0x40
if DEVICE == "cuda":
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        raw[edge + 5] ^= 0x01
        assert d.digest_tensors(bucket) == packed_digest(bucket) != first
        raw[edge + 5] ^= 0x01
    torch.cuda.current_stream().wait_stream(side)
assert d.digest_tensors(bucket) == first and plan_of(bucket) is plan
# a tensor moved (first and last addresses kept, so the same key): rebuilt
moved = list(bucket)
moved[2] = raw[edge : 3 * CHUNK].clone()
assert d.digest_tensors(moved) == first and plan_of(moved) not in (None, plan)
assert plan_of(moved).ptrs[2] == moved[2].data_ptr()
# the same addresses, a size changed: rebuilt
shorter = list(bucket)
shorter[-1] = raw[3 * CHUNK : 3 * CHUNK + 5]
assert d.digest_tensors(shorter) == packed_digest(shorter) != first
assert plan_of(shorter).sizes[-1] == 5
assert d.digest_tensors(bucket) == first and plan_of(bucket).sizes[-1] == 7
# the same address and byte count, not contiguous: no plan, still right
m = torch.randint(-99, 99, (64, 32), dtype=torch.int32, generator=g).to(DEVICE)
assert d.digest_tensors([m]) == packed_digest([m]) and plan_of([m]) is not None
assert d.digest_tensors([m.t()]) == packed_digest([m.t().contiguous()])
assert plan_of([m.t()]) is None and d.digest_tensors([m.t()]) != packed_digest([m])
# layouts that need copies have none; an explicit plan checks what it gets
for layout in ([m.t()], [raw[1:9]], [raw[:5], raw[8:12]], [raw[:0]]):
    assert not d.DigestPlan.plannable(layout)
    try:
        d.DigestPlan(layout)
        raise AssertionError("planned a layout that needs copies")
    except ValueError:
        pass
    assert d.digest_tensors(layout) == packed_digest([t.contiguous() for t in layout])
eager = d.DigestPlan(bucket, graph=False)
for _ in range(3):
    assert eager.digest(bucket) == first and eager.graph is None
assert eager.matches(bucket) and not eager.matches(shorter)
try:
    eager.digest(shorter)
    raise AssertionError("digested tensors the plan does not fit")
except ValueError:
    pass
# each thread keeps its own plans; the oldest go past MAX_PLANS
seen = []
worker = threading.Thread(target=lambda: seen.append(d.digest_tensors(bucket)))
worker.start(); worker.join()
assert seen == [first] and plan_of(bucket) is not None
d.MAX_PLANS = 2
for k in range(4):
    part = [raw[4 * k : 4 * k + 8]]
    assert d.digest_tensors(part) == packed_digest(part)
assert len(d._plans()) == 2 and plan_of([raw[12:20]]) is not None
print("plans ok")
"""


def run_plan_check(device: str, env: dict[str, str]) -> str:
    code = f"DEVICE = {device!r}\nCHUNK = {CHUNK_BYTES}\n"
    proc = subprocess.run(
        [sys.executable, "-c", code + PLAN_CHECK],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "python"), **env},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.skipif(trainer_digest.triton is None, reason="needs triton")
def test_digest_plans_are_reused_and_rebuilt_under_the_triton_interpreter():
    """digest_tensors plans a bucket's launch once per layout and reuses it:
    the same strings as packing, the bytes read as they are now, a new plan
    when a tensor moves or changes size, none for layouts that need copies,
    plans per thread and at most MAX_PLANS of them."""
    assert run_plan_check("cpu", {"TRITON_INTERPRET": "1"}).startswith("plans ok")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_digest_plans_are_reused_and_rebuilt_on_cuda():
    """The same on CUDA, where the second use captures a CUDA graph that
    later calls replay, on whichever stream is current."""
    assert run_plan_check("cuda", {}).startswith("plans ok")


def test_without_triton_or_off_cuda_the_torch_path_serves():
    cpu = [torch.zeros(8, dtype=torch.uint8)]
    assert not trainer_digest.fused_digest_available(cpu) or (
        os.environ.get("TRITON_INTERPRET") == "1"
    )


@pytest.mark.parametrize(
    "call",
    [
        lambda d: d.digest_bytes(torch.zeros(4, dtype=torch.float32)),
        lambda d: d.digest_bytes(torch.zeros(2, 4, dtype=torch.uint8)),
        lambda d: d.digest_bytes(torch.zeros(8, dtype=torch.uint8)[::2]),
        lambda d: d.digest_tensors([]),
    ],
    ids=["not bytes", "not 1-D", "not contiguous", "no tensors"],
)
def test_a_bad_argument_is_a_value_error_under_python_O_too(call):
    """Both sides' digests refuse what they cannot digest with a ValueError
    (an assert would vanish under `python -O` and digest garbage)."""
    for module in (trainer_digest, server_digest):
        with pytest.raises(ValueError, match="need"):
            call(module)
