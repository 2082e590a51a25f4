"""Sender and receiver agree on bucket digests; the digest catches what it
must; the planner keeps its promises; the receive module imports only torch."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
import torch

from rlsync.digest import digest_bytes, digest_tensors
from rlsync.planner import bucket_budget, plan_buckets
from sglang.srt.weight_sync.staged_receiver import bucket_digest


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 4096, 1_000_003])
def test_trainer_and_server_digests_agree(n):
    data = torch.randint(
        0, 256, (n,), dtype=torch.uint8, generator=torch.Generator().manual_seed(n)
    )
    assert digest_bytes(data) == bucket_digest(data)


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
    swapped = a.clone()
    swapped[:8], swapped[8:16] = a[8:16].clone(), a[:8].clone()
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
    """Word-aligned tensors are summed in place; a tensor ending mid-word
    (anywhere but last) falls back to packing. Both give the packed digest."""
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
    with pytest.raises(AssertionError, match="duplicate"):
        plan_buckets([("a", torch.empty(1)), ("a", torch.empty(1))], 10)
    with pytest.raises(AssertionError, match="bucket_bytes"):
        plan_buckets([], 0)


def test_receive_module_imports_only_torch():
    """Loaded by file path with sglang unimportable: the GPU benchmark does this."""
    spec = importlib.util.find_spec("sglang.srt.weight_sync.staged_receiver")
    code = (
        "import sys, importlib.util\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'sglang': raise ImportError('sglang blocked')\n"
        "sys.meta_path.insert(0, Block())\n"
        f"s = importlib.util.spec_from_file_location('staged_receiver', {spec.origin!r})\n"
        "m = importlib.util.module_from_spec(s); sys.modules['staged_receiver'] = m\n"
        "s.loader.exec_module(m)\n"
        "print(m.StagedWeightReceiver.__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "StagedWeightReceiver"
