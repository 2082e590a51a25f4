"""The psum61 bucket digest as one fused Triton pass over the bytes.

Gives exactly the string of `rlsync.digest.digest_bytes` (and of the server's
`sglang.srt.weight_sync.digest.digest_bytes`): the bytes, zero-padded to a multiple of 4,
are little-endian int32 words w_0 .. w_{N-1} and, with p = 2**61 - 1,

    s1 = sum(w_i) mod p,    s2 = sum((i + 1) * w_i) mod p = (T + S) mod p

where S = sum(w_i) and T = sum(i * w_i). The torch version makes two
reductions over the data; here every word is read once.

Each program of `_psum61_block_kernel` owns a chunk of CHUNK consecutive
words starting at word `base` and reads it in tiles of TILE words. Per lane j
of the tile it keeps, in int64,

    acc_s[j] = sum over tiles t of w[t, j]
    acc_p[j] = sum over tiles t of (acc_s[j] before tile t)

so that sum_t t * w[t, j] = (n_tiles - 1) * acc_s[j] - acc_p[j] without a
multiplication per word. From these the chunk's exact sums

    S_b = sum_k w_k,    T_b = sum_k k * w_k    (k = 0 .. CHUNK - 1, chunk-local)

follow. The chunk adds S_b to S and T_b + base * S_b to T; the program reduces
both mod p (61-bit products split so that nothing overflows int64) and adds
them, split into 31-bit and 30-bit halves, to four int64 counters with
atomics. Integer atomics are exact, so the result does not depend on the order
in which programs finish. The host reads the four counters and finishes with
Python integers.

Importable without Triton (for example on CPU-only machines);
`psum61_digest_cuda` then raises.
"""

from __future__ import annotations

import os
import threading

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only machines
    triton = None
    tl = None

DIGEST_ALGORITHM = "psum61"
PSUM_PRIME = (1 << 61) - 1
MAX_DIGEST_BYTES = 1 << 38  # exclusive, as in rlsync.digest: N < 2**36 words

# Words per program. Bound: |w| <= 2**31 and k < CHUNK, so
#   |T_b| <= 2**31 * sum_{k < 2**16} k = 2**31 * (2**31 - 2**15) < 2**62
# and every partial sum formed on the way to T_b (per-lane prefix sums, the
# tile-level and lane-level parts) is a sum of some of those |k * w_k| terms,
# hence also below 2**62; |S_b| <= 2**47. Adding 2 * p = 2**62 - 2 to T_b
# before reducing keeps it positive and below 2**63. So CHUNK may not exceed
# 2**16 words (256 KiB); a 1 GiB bucket is 4096 programs.
MAX_CHUNK_WORDS = 1 << 16
CHUNK_WORDS = 1 << 16
TILE_WORDS = 2048
NUM_WARPS = 8
_host = threading.local()

if triton is not None:
    _PRIME = tl.constexpr(PSUM_PRIME)
    _LOW31 = tl.constexpr((1 << 31) - 1)
    _LOW30 = tl.constexpr((1 << 30) - 1)

    @triton.jit
    def _mod_p(x):
        """x mod p for 0 <= x < 2**63: 2**61 = 1 (mod p), so fold the top
        bits (at most 3) onto the low 61; the result is below 2 * p."""
        r = (x & _PRIME) + (x >> 61)
        return tl.where(r >= _PRIME, r - _PRIME, r)

    @triton.jit
    def _mul_mod_p(a, b):
        """a * b mod p for 0 <= a, b < p, in int64 without overflow.

        With a = a1 * 2**31 + a0 and b = b1 * 2**31 + b0 (a0, b0 < 2**31;
        a1, b1 < 2**30): a * b = a1 b1 2**62 + (a1 b0 + a0 b1) 2**31 + a0 b0,
        2**62 = 2 (mod p), and mid * 2**31 = (mid >> 30) * 2**61
        + (mid mod 2**30) * 2**31 = (mid >> 30) + (mid mod 2**30) * 2**31.
        Each of the three terms below is under 2**63 and reduced before the
        sum of the three (< 3 p < 2**63) is."""
        a0 = a & _LOW31
        a1 = a >> 31
        b0 = b & _LOW31
        b1 = b >> 31
        hh = a1 * b1  # < 2**60
        mid = a1 * b0 + a0 * b1  # < 2**62
        ll = a0 * b0  # < 2**62
        r = _mod_p(2 * hh + (mid >> 30))
        r += _mod_p((mid & _LOW30) << 31)
        r += _mod_p(ll)
        return _mod_p(r)

    @triton.jit(do_not_specialize=["n_words", "n_bytes"])
    def _psum61_block_kernel(
        bytes_ptr,
        out_ptr,
        n_words,
        n_bytes,
        CHUNK: tl.constexpr,
        TILE: tl.constexpr,
    ):
        """One chunk of CHUNK words: adds its (S mod p) and (T mod p)
        contributions to out_ptr[0:4] as (s low 31 bits, s high 30 bits,
        t low 31 bits, t high 30 bits). n_words counts the whole words; the
        trailing n_bytes - 4 * n_words (0-3) bytes form word n_words."""
        n_tiles: tl.constexpr = CHUNK // TILE
        words_ptr = bytes_ptr.to(tl.pointer_type(tl.int32))
        n_words = n_words.to(tl.int64)  # i32 when small: keep 4 * n_words exact
        base = tl.program_id(0).to(tl.int64) * CHUNK
        lanes = tl.arange(0, TILE)
        acc_s = tl.zeros([TILE], dtype=tl.int64)
        acc_p = tl.zeros([TILE], dtype=tl.int64)
        if base + CHUNK <= n_words:
            for i in range(n_tiles):
                offs = base + i * TILE + lanes
                w = tl.load(words_ptr + offs, eviction_policy="evict_first")
                acc_p += acc_s
                acc_s += w.to(tl.int64)
        else:
            for i in range(n_tiles):
                offs = base + i * TILE + lanes
                w = tl.load(words_ptr + offs, mask=offs < n_words, other=0)
                acc_p += acc_s
                acc_s += w.to(tl.int64)
        s_b = tl.sum(acc_s, axis=0)
        # sum_t (t * TILE + j) * w[t, j] over tiles t and lanes j
        t_b = TILE * tl.sum((n_tiles - 1) * acc_s - acc_p, axis=0)
        t_b += tl.sum(lanes.to(tl.int64) * acc_s, axis=0)

        # The 1-3 trailing bytes, zero-padded, are one more word (below
        # 2**24, so non-negative) at chunk-local index n_words - base; only
        # the last program can hold that index.
        n_tail = n_bytes - 4 * n_words
        if (n_tail > 0) & (n_words < base + CHUNK):
            k = tl.arange(0, 4)
            tail = tl.load(bytes_ptr + 4 * n_words + k, mask=k < n_tail, other=0)
            last = tl.sum(tail.to(tl.int64) << (8 * k).to(tl.int64), axis=0)
            s_b += last
            t_b += (n_words - base) * last

        s_mod = _mod_p(s_b + _PRIME)  # |s_b| <= 2**47
        t_mod = _mod_p(t_b + 2 * _PRIME)  # |t_b| < 2**62, see CHUNK_WORDS
        # base < 2**36 < p: already reduced
        t_mod = _mod_p(t_mod + _mul_mod_p(base, s_mod))
        # Halves below 2**31: sums over fewer than 2**20 chunks stay < 2**51.
        tl.atomic_add(out_ptr + 0, s_mod & _LOW31, sem="relaxed")
        tl.atomic_add(out_ptr + 1, s_mod >> 31, sem="relaxed")
        tl.atomic_add(out_ptr + 2, t_mod & _LOW31, sem="relaxed")
        tl.atomic_add(out_ptr + 3, t_mod >> 31, sem="relaxed")


def _psum_format(s: int, t: int) -> str:
    """The digest string of S = sum(w_i), T = sum(i * w_i) (or their
    residues mod p)."""
    s1, s2 = s % PSUM_PRIME, (t + s) % PSUM_PRIME
    return f"{DIGEST_ALGORITHM}:{s1:016x}:{s2:016x}"


def psum61_partials(
    flat_uint8: torch.Tensor,
    chunk_words: int = CHUNK_WORDS,
    tile_words: int = TILE_WORDS,
    num_warps: int = NUM_WARPS,
) -> torch.Tensor:
    """Launches the digest of 1-D contiguous uint8 bytes on their device and
    returns the four int64 counters, still on that device (no host sync):
    (S mod p) = c[1] * 2**31 + c[0] and (T mod p) = c[3] * 2**31 + c[2],
    each congruence mod p. Runs on the current CUDA stream."""
    if triton is None:
        raise RuntimeError("the Triton psum61 digest needs triton")
    data = flat_uint8
    assert data.dtype == torch.uint8 and data.dim() == 1, "need 1-D uint8 bytes"
    assert data.is_contiguous(), "bytes must be contiguous"
    if not data.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError("the Triton psum61 digest needs a CUDA tensor")
    assert 0 < chunk_words <= MAX_CHUNK_WORDS, "chunk too long for exact int64"
    assert chunk_words % tile_words == 0, "chunk must be whole tiles"
    n = data.numel()
    if n >= MAX_DIGEST_BYTES:
        raise ValueError(
            f"{DIGEST_ALGORITHM} digests cover buckets below {MAX_DIGEST_BYTES} "
            f"bytes (256 GiB); this one has {n}"
        )
    out = torch.zeros(4, dtype=torch.int64, device=data.device)
    if n == 0:
        return out
    if data.storage_offset() % 4:
        data = data.clone()  # the kernel reads 4-byte aligned int32 words
    n_words = n // 4
    grid = (triton.cdiv(n_words + (n % 4 > 0), chunk_words),)
    _psum61_block_kernel[grid](
        data,
        out,
        n_words,
        n,
        CHUNK=chunk_words,
        TILE=tile_words,
        num_warps=num_warps,
    )
    return out


def _pinned_counters() -> torch.Tensor:
    """This thread's pinned host buffer for the four counters: reused, as
    each digest waits for its copy before it returns."""
    counters = getattr(_host, "counters", None)
    if counters is None:
        counters = _host.counters = torch.empty(4, dtype=torch.int64, pin_memory=True)
    return counters


def psum61_finish(counters: torch.Tensor) -> str:
    """The digest string from `psum61_partials`' counters. Copies them to
    pinned memory on the stream and waits once, on the stream: a plain
    `.tolist()` issued while the stream still has the bucket's copy and this
    kernel queued waits inside a pageable device-to-host copy, and on a
    receiver thread that stalled the decode kernels other threads launched
    meanwhile (bench/gpu_single.py, "triton_tolist")."""
    if counters.is_cuda:
        host = _pinned_counters()
        host.copy_(counters, non_blocking=True)
        torch.cuda.current_stream(counters.device).synchronize()
        counters = host
    s_lo, s_hi, t_lo, t_hi = counters.tolist()
    return _psum_format((s_hi << 31) + s_lo, (t_hi << 31) + t_lo)


def psum61_digest_cuda(flat_uint8: torch.Tensor, **config: int) -> str:
    """Digest of 1-D contiguous uint8 bytes on a CUDA device: the same string
    as `rlsync.digest.digest_bytes`. Runs on the current stream and waits for
    it; 32 bytes come back to the host."""
    return psum61_finish(psum61_partials(flat_uint8, **config))
