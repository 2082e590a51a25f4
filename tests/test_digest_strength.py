"""What the psum61 bucket digest promises, checked against its definition:
every change confined to one or two 32-bit words is caught (the two-word
flips of bit 63 that the previous digest missed among them), swapped words
and swapped buckets are caught, the documented three-word blind spot is
real, and the largest accepted bucket cannot overflow int64."""

from __future__ import annotations

import random

import pytest
import torch

from rlsync import digest
from rlsync.digest import digest_bytes, digest_tensors

P = (1 << 61) - 1
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1


def reference(data: bytes) -> str:
    """The definition, one word at a time in Python integers."""
    data = data + b"\0" * (-len(data) % 4)
    s1 = s2 = 0
    for i in range(len(data) // 4):
        w = int.from_bytes(data[4 * i : 4 * i + 4], "little", signed=True)
        s1 += w
        s2 += (i + 1) * w
    return f"psum61:{s1 % P:016x}:{s2 % P:016x}"


def random_words(n: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(
        INT32_MIN, INT32_MAX + 1, (n,), dtype=torch.int64, generator=gen
    ).to(torch.int32)


def of_words(words: torch.Tensor) -> str:
    return digest_bytes(words.view(torch.uint8))


def changed(words: torch.Tensor, new: dict[int, int]) -> torch.Tensor:
    out = words.clone()
    for i, value in new.items():
        out[i] = value
    return out


# 64**3 * 4 + 13 bytes: three levels of partial sums and a ragged end
@pytest.mark.parametrize(
    "n", [0, 1, 2, 3, 4, 5, 252, 256, 257, 4099, 16_387, 1_048_589]
)
def test_digest_is_its_definition(n):
    gen = torch.Generator().manual_seed(n)
    data = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=gen)
    assert digest_bytes(data) == reference(bytes(data.tolist()))


N_DEEP = 64**4 + 64**3 + 65  # four levels of row sums and ragged ends


@pytest.mark.parametrize("fill", [INT32_MIN, INT32_MAX])
def test_extreme_words_through_every_level_are_summed_exactly(fill):
    """68 MB of the most negative or most positive word, four levels of row
    sums: equal to the closed forms S = N w, T = N (N - 1) / 2 w."""
    n = N_DEEP
    s, t = n * fill, n * (n - 1) // 2 * fill
    words = torch.full((n,), fill, dtype=torch.int32)
    assert of_words(words) == f"psum61:{s % P:016x}:{(t + s) % P:016x}"


def test_extreme_words_of_both_signs_are_summed_exactly():
    n, h = N_DEEP, N_DEEP // 2
    words = torch.full((n,), INT32_MAX, dtype=torch.int32)
    words[:h] = INT32_MIN
    s = h * INT32_MIN + (n - h) * INT32_MAX
    t = INT32_MIN * h * (h - 1) // 2 + INT32_MAX * (n * (n - 1) // 2 - h * (h - 1) // 2)
    assert of_words(words) == f"psum61:{s % P:016x}:{(t + s) % P:016x}"


def test_bit63_flips_of_two_64bit_words_an_even_distance_apart_are_caught():
    """The previous digest (sums mod 2**64 over 64-bit words) missed every one
    of these: (j - i) * 2**63 = 0 mod 2**64 when j - i is even."""
    rng = random.Random(63)
    data = torch.randint(
        0, 256, (8192,), dtype=torch.uint8, generator=torch.Generator().manual_seed(63)
    )
    ref = digest_bytes(data)
    for _ in range(1000):
        i = rng.randrange(0, 1024 - 2)
        j = rng.randrange(i + 2, 1024, 2)
        bad = data.clone()
        bad[8 * i + 7] ^= 0x80
        bad[8 * j + 7] ^= 0x80
        assert digest_bytes(bad) != ref, (i, j)


def test_every_one_word_change_is_caught():
    words = random_words(300, 1)
    ref = of_words(words)
    rng = random.Random(1)
    for i in range(words.numel()):
        w = int(words[i])
        candidates = {INT32_MIN, INT32_MAX, 0, -1, w ^ 1, w ^ INT32_MIN}
        candidates |= {rng.randint(INT32_MIN, INT32_MAX) for _ in range(3)}
        for value in candidates - {w}:
            assert of_words(changed(words, {i: value})) != ref, (i, w, value)


def _sum_keeping(w_i: int, w_j: int, rng: random.Random) -> int:
    """A nonzero d with w_i + d and w_j - d both int32: the first sum stays."""
    low = max(INT32_MIN - w_i, w_j - INT32_MAX)
    high = min(INT32_MAX - w_i, w_j - INT32_MIN)
    d = 0
    while d == 0:
        d = rng.choice([low, high, rng.randint(low, high)])
    return d


def test_every_two_word_change_is_caught_at_every_pair_of_positions():
    """All 2415 position pairs of a 70-word bucket (a row of 64 and a ragged
    end), each with a change that keeps sum(w) (the hard case), one that
    flips the sign bit of both words, and one with two random new values."""
    words = random_words(70, 2)
    ref = of_words(words)
    rng = random.Random(2)
    for i in range(70):
        for j in range(i + 1, 70):
            w_i, w_j = int(words[i]), int(words[j])
            d = _sum_keeping(w_i, w_j, rng)
            tries = [
                {i: w_i + d, j: w_j - d},
                {i: w_i ^ INT32_MIN, j: w_j ^ INT32_MIN},
                {
                    i: rng.randint(INT32_MIN, INT32_MAX),
                    j: rng.randint(INT32_MIN, INT32_MAX),
                },
            ]
            for new in tries:
                if new == {i: w_i, j: w_j}:
                    continue
                assert of_words(changed(words, new)) != ref, (i, j, new)


def test_two_word_changes_anywhere_in_a_large_bucket_are_caught():
    """Sum-keeping two-word changes at random and extreme distances in a
    bucket three levels of partial sums deep."""
    n = 64**3 + 1001
    words = random_words(n, 3)
    ref = of_words(words)
    rng = random.Random(3)
    pairs = [(0, n - 1), (0, 1), (n - 2, n - 1), (0, 64), (63, 64), (64**3 - 1, 64**3)]
    pairs += [tuple(sorted(rng.sample(range(n), 2))) for _ in range(100)]
    for i, j in pairs:
        w_i, w_j = int(words[i]), int(words[j])
        d = _sum_keeping(w_i, w_j, rng)
        assert of_words(changed(words, {i: w_i + d, j: w_j - d})) != ref, (i, j, d)


def test_swaps_of_two_differing_words_are_caught():
    words = random_words(4096, 4)
    ref = of_words(words)
    rng = random.Random(4)
    for _ in range(1000):
        i, j = rng.sample(range(4096), 2)
        if int(words[i]) == int(words[j]):
            continue
        assert of_words(changed(words, {i: int(words[j]), j: int(words[i])})) != ref
    # two differing words in an otherwise constant bucket, at any distance
    flat = torch.zeros(5000, dtype=torch.int32)
    flat[10], flat[4000] = 7, INT32_MIN
    for i, j in [(10, 4000), (10, 11), (4000, 4999), (0, 10), (0, 4000)]:
        swapped = changed(flat, {i: int(flat[j]), j: int(flat[i])})
        assert of_words(swapped) != of_words(flat), (i, j)


def test_swapped_and_reordered_buckets_are_caught():
    """Each bucket is checked against its own digest: delivering any bucket
    in another's place fails when the digests differ, guaranteed when the
    two differ in at most two words."""
    gen = torch.Generator().manual_seed(5)
    layer = [torch.randn(256, 64, generator=gen).to(torch.bfloat16) for _ in range(6)]
    buckets = [[t, torch.randn(64, generator=gen)] for t in layer]
    digests = [digest_tensors(b) for b in buckets]
    assert len(set(digests)) == len(digests)
    # the same tensors, packed in the other order
    assert digest_tensors(buckets[0][::-1]) != digests[0]
    # two buckets that differ in exactly two words
    twin = buckets[0][0].clone().view(torch.int32).reshape(-1)
    twin[5] += 1
    twin[6000] -= 1
    assert digest_tensors([twin.view(torch.bfloat16), buckets[0][1]]) != digests[0]


def test_three_word_blind_spot_is_as_documented():
    """Not guaranteed beyond two words: +1, -2, +1 on three consecutive words
    keeps both sums (documented, so that nobody relies on more)."""
    words = random_words(100, 6)
    words[10:13] = torch.tensor([5, 5, 5], dtype=torch.int32)
    bad = changed(words, {10: 6, 11: 3, 12: 6})
    assert of_words(bad) == of_words(words)


def test_largest_bucket_cannot_overflow_int64():
    """Walk the real code over the largest buckets it accepts on the meta
    device (shapes only, nothing allocated) and bound every partial sum it
    holds: an entry of level `step` is a sum of `step` words, a column sum of
    its level's rows times `step` words; with |w| <= 2**31 and at most 2**30
    words per sum, |sum| <= 2**61 < 2**63. (The CPU's blocks and CUDA's
    reductions only sum subsets of these.)"""
    limit = digest.MAX_DIGEST_BYTES
    assert limit == 1 << 38  # 256 GiB, more than the 64 GiB promised
    for n in (limit - 1, limit - 4, 64 << 30, 63 * 64**5 * 4 + 1, 64**5 * 4):
        pieces, tail = digest._psum_pieces(
            torch.empty(n, dtype=torch.uint8, device="meta")
        )
        words = n // 4
        most = 0
        for values, _, _, step in pieces:
            assert values.dtype in (torch.int32, torch.int64)
            if values.numel() == digest._PSUM_COLS and values.dtype == torch.int64:
                rows = words // step // digest._PSUM_COLS
                most = max(most, step * rows)  # a column sum
            most = max(most, step)  # an entry of that level
        assert tail.numel() == n % 4
        assert most <= 1 << 30, (n, most)
        assert most * (1 << 31) <= 1 << 61 < 1 << 63
    with pytest.raises(ValueError, match="below 274877906944 bytes"):
        digest._psum_pieces(torch.empty(limit, dtype=torch.uint8, device="meta"))
    with pytest.raises(ValueError, match="256 GiB"):
        digest_bytes(torch.empty(limit, dtype=torch.uint8, device="meta"))


def test_digest_string_is_two_residues_below_p():
    for seed in range(20):
        d = of_words(random_words(1000 + seed, seed))
        name, s1, s2 = d.split(":")
        assert name == "psum61" and len(s1) == len(s2) == 16
        assert int(s1, 16) < P and int(s2, 16) < P
        assert s1 == s1.lower() and s2 == s2.lower()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_and_cpu_digests_are_identical():
    gen = torch.Generator().manual_seed(7)
    for n in (0, 3, 4099, 1_048_589, (64 << 20) + 5):
        data = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=gen)
        assert digest_bytes(data) == digest_bytes(data.cuda()), n
    big = torch.full((64 << 20,), 0x80, dtype=torch.uint8)
    assert digest_bytes(big) == digest_bytes(big.cuda())
    ts = [torch.randn(1000, 333).to(torch.bfloat16), torch.randn(4097)]
    assert digest_tensors(ts) == digest_tensors([t.cuda() for t in ts])


def test_off_cuda_digest_tensors_keeps_no_plans():
    """Plans are for the fused path: on the CPU (no Triton interpreter) the
    torch path serves and digest_tensors keeps nothing."""
    if digest.fused_digest_available([torch.zeros(1)]):
        pytest.skip("Triton's interpreter runs the fused path on the CPU here")
    before = dict(digest._plans()) if digest.triton is not None else {}
    ts = [random_words(1000, 1), random_words(7, 2)]
    assert digest_tensors(ts) == of_words(torch.cat(ts))
    assert (dict(digest._plans()) if digest.triton is not None else {}) == before


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_planned_bucket_catches_every_sampled_change_on_cuda():
    """A bucket digested again and again through its plan (a CUDA graph
    replayed from the second call on) reads the bytes as they are at each
    call: one- and two-word changes in any of its tensors are caught, and
    every digest is the definition's (the CPU's) for those bytes."""
    sizes = [4099, 1 << 16, 3, 70_001, 1]
    words = [random_words(n, 40 + i).cuda() for i, n in enumerate(sizes)]
    clean = digest_tensors(words)
    assert clean == digest_tensors([w.cpu() for w in words])
    assert digest_tensors(words) == clean  # the second use captures the graph
    rng = random.Random(5)
    for _ in range(40):
        k, j = rng.randrange(len(words)), rng.randrange(len(words))
        i1, i2 = rng.randrange(sizes[k]), rng.randrange(sizes[j])
        old1, old2 = int(words[k][i1]), int(words[j][i2])
        words[k][i1] = old1 ^ (1 << rng.randrange(31))
        if rng.random() < 0.5:
            words[j][i2] = INT32_MIN if old2 != INT32_MIN else INT32_MAX
        got = digest_tensors(words)
        assert got != clean and got == digest_tensors([w.cpu() for w in words])
        words[j][i2], words[k][i1] = old2, old1
        assert digest_tensors(words) == clean
