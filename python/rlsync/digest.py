# Generated from common/python/sglang/srt/weight_sync/digest.py by `make overlay`; do not edit.
"""Bucket digests: the sender attaches one to each bucket of a two-phase
weight update, and the receiver checks it before anything is applied.

"psum61:<s1>:<s2>": two position-weighted sums of the bucket's 32-bit words
modulo the Mersenne prime p = 2**61 - 1. The bytes, zero-padded to a multiple
of 4, are read as little-endian int32 words w_0 .. w_{N-1} (two's complement,
so -2**31 <= w_i < 2**31), and

    s1 = sum(w_i)           mod p
    s2 = sum((i + 1) * w_i) mod p

each written as 16 lowercase hex digits (both are below p < 2**61). Buckets
must be shorter than MAX_DIGEST_BYTES = 2**38 bytes (256 GiB): longer ones
are refused with ValueError rather than digested wrongly.

What it detects, for two byte strings of the same length (the receiver knows
the length from the metadata):

* Every change confined to at most two words, which includes any swap of two
  differing words. Proof: let the words at positions i < j change by d_i and
  d_j (integers with |d| < 2**32, as both old and new value are int32). Equal
  digests need d_i + d_j = 0 and (i + 1) d_i + (j + 1) d_j = 0 (mod p);
  subtracting (i + 1) times the first from the second leaves
  (j - i) d_j = 0 (mod p). p is prime and 0 < j - i < N <= 2**36 < p, so
  d_j = 0 (mod p), hence d_j = 0 as |d_j| < 2**32 < p; then d_i = 0 the
  same way. A one-word change is the case d_j = 0.
* A bucket delivered in the place of another of the same length: caught
  whenever the two differ in at most two words (above); otherwise unless
  their digests happen to collide.
* Random damage: if at least two words of what arrived are uniformly random
  and independent of the rest, a miss has probability at most 2**-64 (by the
  proof above, (w_i, w_j) -> (s1, s2) is one-to-one with the rest fixed, so
  at most one of the 2**64 pairs matches); one random word: at most 2**-32.

Not guaranteed: changes to three or more words whose differences satisfy
both congruences, e.g. +1, -2, +1 added to three consecutive words. It is an
integrity check against transport and bookkeeping errors, not
authentication: anyone who can send bytes can compute it.

Computed with plain int64 torch ops, so CPU and CUDA give identical strings:
no floats, and every integer a device holds is an exact sum of at most 2**30
words (see `_psum_pieces`), so |x| <= 2**61 and nothing overflows. Only the
last few hundred partial sums go to the host, where Python's integers finish
the job. The sums over the bytes are chunk-local: a chunk of words starting
at word a with S_c = sum(w) and T_c = sum(k * w_k) (k counted from the
chunk's start) adds S_c to S and T_c + a * S_c to T = sum(i * w_i), and
s2 = T + S. `digest_tensors` combines tensors that way without packing them;
a fused GPU kernel can do the same per thread block in one read pass.

On CUDA, where Triton is installed, one fused kernel computes the same
strings in a single read pass over the bytes (`_psum61_chunk_kernel`), close
to the GPU's memory bandwidth, instead of the torch path's several
reductions. Each program owns CHUNK_WORDS consecutive words starting at word
`base` and reads them in tiles of TILE_WORDS. Per lane j it keeps, in int64,
acc_s[j] = sum over tiles t of w[t, j] and acc_p[j] = sum over tiles t of
(acc_s[j] before tile t), so that sum_t t * w[t, j] = (n_tiles - 1) *
acc_s[j] - acc_p[j] without a multiplication per word; from these follow the
chunk's S_b and T_b, and it adds S_b and T_b + base * S_b, reduced mod p, to
four int64 counters (31- and 30-bit halves) with integer atomics, which are
exact whatever order the programs finish in. The host reads the counters once
(through pinned memory, waiting on the current stream only). A sender's
bucket of many tensors is one launch of `_psum61_parts_kernel` over a table
of the tensors' addresses and sizes; `DigestPlan` builds that table once per
bucket layout, and on CUDA captures the launch in a CUDA graph, so that a
repeated digest costs the host one check of the layout (each tensor's
address, byte count and contiguity) and one graph replay. Bound: with
|w| <= 2**31 and k < CHUNK_WORDS = 2**16, |T_b| < 2**62 and every partial sum
on the way is a sum of some |k * w_k| terms, so nothing overflows int64.

Imports torch, and Triton where it is installed (it is optional: without it,
or off CUDA, the torch path serves), so a trainer can carry a copy of this
module to compute the digests it sends.
"""

from __future__ import annotations

import logging
import os
import threading

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the torch path serves every device
    triton = None
    tl = None

DIGEST_ALGORITHM = "psum61"

PSUM_PRIME = (1 << 61) - 1
MAX_DIGEST_BYTES = 1 << 38  # exclusive: fewer than 2**36 words
_PSUM_COLS = 64
# CPU only: rows widened from int32 to int64 at a time. 480 * 64 words are
# below torch's 32768-element grain, so each op runs on the calling thread:
# intra-op threads would add a fork-join per op, which costs more than it
# saves here and stalls badly when other processes share the cores.
_PSUM_BLOCK_ROWS = 480
# (values, counts in S, base, step): see _psum_pieces
PsumPiece = tuple[torch.Tensor, bool, int, int]


def _psum_rows_cols(mat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact int64 row and column sums of an [R, 64] int32 or int64 matrix."""
    if mat.dtype == torch.int64 or mat.device.type != "cpu" or mat.shape[0] < 64:
        return mat.sum(1, dtype=torch.int64), mat.sum(0, dtype=torch.int64)
    # torch's CPU sum of int32 into int64 runs at about 1 GB/s; widening a
    # cache-sized block first and summing that is several times faster, and
    # the bytes are still read from memory once.
    starts = range(0, mat.shape[0], _PSUM_BLOCK_ROWS)
    rows = torch.empty(mat.shape[0], dtype=torch.int64)
    cols = torch.empty(len(starts), _PSUM_COLS, dtype=torch.int64)
    block = torch.empty(
        min(mat.shape[0], _PSUM_BLOCK_ROWS), _PSUM_COLS, dtype=torch.int64
    )
    for b, start in enumerate(starts):
        part = mat[start : start + _PSUM_BLOCK_ROWS]
        wide = block[: part.shape[0]]
        wide.copy_(part)
        torch.sum(wide, 1, out=rows[start : start + part.shape[0]])
        torch.sum(wide, 0, out=cols[b])
    return rows, cols.sum(0)


def _psum_pieces(data: torch.Tensor) -> tuple[list[PsumPiece], torch.Tensor]:
    """Partial sums of 1-D uint8 bytes, still on their device: pieces
    (values, counts_in_S, base, step) such that, over the int32 words w_i,
    S = sum(w_i) = sum of the values of the pieces that count in S and
    T = sum(i * w_i) = sum over pieces of sum_k (base + step * k) * values[k];
    plus the trailing 0-3 bytes (the last word, zero-padded).

    With the words as an [R, 64] matrix (i = 64 r + c) and tail words m.. apart,
    T = 64 * sum(r * rowsum_r) + sum(c * colsum_c) + sum(i * w_i for the tail):
    the row sums are a vector 64 times shorter, treated the same way until
    fewer than 64 remain. Level k's entries are sums of 64**k words; rows
    are formed only from 64 or more entries, so with fewer than 2**36 words
    there are at most 5 levels (row sums of at most 64**5 = 2**30 words), and
    a column sum adds at most N / 64 < 2**30 words' worth: every value is a
    sum of at most 2**30 words, |value| <= 2**61 < 2**63."""
    n = data.numel()
    if n >= MAX_DIGEST_BYTES:
        raise ValueError(
            f"{DIGEST_ALGORITHM} digests cover buckets below {MAX_DIGEST_BYTES} "
            f"bytes (256 GiB); this one has {n}"
        )
    if data.storage_offset() % 4:
        data = data.clone()  # int32 views need 4-byte aligned bytes
    whole = n - n % 4
    words = data[:whole].view(torch.int32)
    pieces: list[PsumPiece] = []
    step = 1
    while words.numel() >= _PSUM_COLS:
        m = words.numel() - words.numel() % _PSUM_COLS
        rows, cols = _psum_rows_cols(words[:m].view(-1, _PSUM_COLS))
        pieces.append((cols, step == 1, 0, step))
        if m < words.numel():
            pieces.append((words[m:], step == 1, m * step, step))
        words, step = rows, step * _PSUM_COLS
    if words.numel():
        pieces.append((words, step == 1, 0, step))
    return pieces, data[whole:]


def psum_totals(parts: list[torch.Tensor]) -> list[tuple[int, int, int]]:
    """(S, T, N) of each 1-D uint8 part, S and T exact or reduced mod p:
    S = sum(w_i) and T = sum(i * w_i) over its N int32 words (i from 0, the
    last word zero-padded). One device-to-host copy for all parts together;
    on CUDA with Triton, one read pass over each part's bytes."""
    for part in parts:
        if part.numel() >= MAX_DIGEST_BYTES:
            raise ValueError(
                f"{DIGEST_ALGORITHM} digests cover buckets below "
                f"{MAX_DIGEST_BYTES} bytes (256 GiB); this one has {part.numel()}"
            )
    if fused_digest_available(parts):
        try:
            return _fused_totals(parts)
        except Exception as e:
            _fused_path_failed(parts[0].device, e)
    return _torch_totals(parts)


def _torch_totals(parts: list[torch.Tensor]) -> list[tuple[int, int, int]]:
    """Exact (S, T, N) of each part with plain int64 torch ops."""
    plans = [_psum_pieces(part) for part in parts]
    tensors: list[torch.Tensor] = []
    for pieces, tail in plans:
        tensors += [piece[0] for piece in pieces] + [tail]
    values = torch.cat(tensors).tolist()
    totals: list[tuple[int, int, int]] = []
    at = 0
    for part, (pieces, tail) in zip(parts, plans):
        s = t = 0
        for v, counts_in_s, base, step in pieces:
            chunk = values[at : at + v.numel()]
            at += v.numel()
            total = sum(chunk)
            t += base * total + step * sum(k * x for k, x in enumerate(chunk))
            if counts_in_s:
                s += total
        words = part.numel() // 4
        if tail.numel():
            raw = bytes(values[at : at + tail.numel()]).ljust(4, b"\0")
            at += tail.numel()
            last = int.from_bytes(raw, "little", signed=True)
            s, t, words = s + last, t + words * last, words + 1
        totals.append((s, t, words))
    return totals


def _psum_format(s: int, t: int) -> str:
    """The digest string of S = sum(w_i), T = sum(i * w_i)."""
    s1, s2 = s % PSUM_PRIME, (t + s) % PSUM_PRIME
    return f"{DIGEST_ALGORITHM}:{s1:016x}:{s2:016x}"


def digest_bytes(data: torch.Tensor) -> str:
    """Digest of a 1-D contiguous uint8 tensor on any device (a bucket's
    bytes, as the receiver holds them)."""
    if data.dtype != torch.uint8 or data.dim() != 1 or not data.is_contiguous():
        raise ValueError("need 1-D contiguous uint8 bytes")
    s, t, _ = psum_totals([data])[0]
    return _psum_format(s, t)


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def digest_tensors(tensors: list[torch.Tensor]) -> str:
    """Digest of tensors packed back to back (the flattened-bucket layout),
    without packing them: word i of tensor k is word off_k + i of the bucket,
    so S = sum(S_k) and T = sum(T_k + off_k * S_k). Falls back to packing
    when a tensor other than the last ends mid-word (its byte count is not a
    multiple of 4). On CUDA with Triton, one launch over all of them, planned
    once per layout (`DigestPlan`, kept per thread): a sender that digests
    the same parameters in the same buckets every sync builds each bucket's
    launch once and then only checks that the layout still holds."""
    if not tensors:
        raise ValueError("need at least one tensor")
    plan = _cached_plan(tensors)
    if plan is not None:
        try:
            return _psum_format(*plan.totals())
        except Exception as e:
            _fused_path_failed(plan.device, e)
    sizes = [t.numel() * t.element_size() for t in tensors]
    if any(n % 4 for n in sizes[:-1]):
        return digest_bytes(torch.cat([_as_bytes(t) for t in tensors]))
    if len(tensors) > 1 and fused_digest_available(tensors):
        try:
            return _psum_format(*_fused_packed_totals(tensors, sizes))
        except Exception as e:
            _fused_path_failed(tensors[0].device, e)
    s = t = offset = 0
    for part_s, part_t, words in psum_totals([_as_bytes(t) for t in tensors]):
        s, t = s + part_s, t + part_t + offset * part_s
        offset += words
    return _psum_format(s, t)


# --- one fused pass on CUDA (Triton) ------------------------------------------

# Words per program: at most 2**16 keeps every partial sum below 2**62 (see
# the module docstring); a 1 GiB bucket is 4096 programs.
CHUNK_WORDS = 1 << 16
TILE_WORDS = 2048
NUM_WARPS = 8
_host = threading.local()
# Devices whose fused kernel failed (a Triton that cannot compile it for this
# GPU, say), with the reason: they take the torch path from then on.
_fused_failures: dict[torch.device, str] = {}
logger = logging.getLogger(__name__)


def fused_digest_available(parts: list[torch.Tensor]) -> bool:
    """Whether `psum_totals` takes the fused Triton path for these parts:
    Triton is installed, every part is on one CUDA device (or Triton's
    interpreter runs, TRITON_INTERPRET=1, which tests use on CPU) and the
    kernel has not failed on that device before."""
    if triton is None or not parts:
        return False
    device = parts[0].device
    if _fused_failures and device in _fused_failures:
        return False
    if os.environ.get("TRITON_INTERPRET") == "1":
        return True
    return device.type == "cuda" and all(p.device == device for p in parts)


def _fused_path_failed(device: torch.device, error: Exception) -> None:
    """The fused kernel raised on `device` (it would not compile or launch
    there): the torch path, which gives the same digest, serves that device
    from now on. A real fault of the device fails the torch path too, so
    nothing wrong is ever accepted; only the speed is lost."""
    reason = f"{type(error).__name__}: {error}"
    _fused_failures[device] = reason
    _plans().clear()
    logger.warning(
        "the fused digest kernel failed on %s (%s); digests there use the "
        "torch path from now on",
        device,
        reason[:500],
    )


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
        """a * b mod p for 0 <= a, b < p, in int64 without overflow: with
        a = a1 * 2**31 + a0 and b = b1 * 2**31 + b0, a * b = a1 b1 2**62 +
        (a1 b0 + a0 b1) 2**31 + a0 b0, 2**62 = 2 (mod p) and mid * 2**31 =
        (mid >> 30) + (mid mod 2**30) * 2**31 (mod p); each term stays below
        2**63 and is reduced before the sum of the three."""
        a0 = a & _LOW31
        a1 = a >> 31
        b0 = b & _LOW31
        b1 = b >> 31
        hh = a1 * b1
        mid = a1 * b0 + a0 * b1
        ll = a0 * b0
        r = _mod_p(2 * hh + (mid >> 30))
        r += _mod_p((mid & _LOW30) << 31)
        r += _mod_p(ll)
        return _mod_p(r)

    @triton.jit
    def _add_chunk(
        bytes_ptr,
        n_words,
        n_bytes,
        base,
        global_base,
        out_ptr,
        CHUNK: tl.constexpr,
        TILE: tl.constexpr,
    ):
        """Words base .. base + CHUNK - 1 of one byte string of n_words whole
        words (its trailing n_bytes - 4 * n_words bytes, zero-padded, are
        word n_words): adds their (S mod p) and (T mod p), the words counted
        from global_base, to out_ptr[0:4] as (s low 31 bits, s high 30 bits,
        t low 31 bits, t high 30 bits)."""
        n_tiles: tl.constexpr = CHUNK // TILE
        words_ptr = bytes_ptr.to(tl.pointer_type(tl.int32))
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
        t_b = TILE * tl.sum((n_tiles - 1) * acc_s - acc_p, axis=0)
        t_b += tl.sum(lanes.to(tl.int64) * acc_s, axis=0)
        n_tail = n_bytes - 4 * n_words
        if (n_tail > 0) & (n_words < base + CHUNK):
            k = tl.arange(0, 4)
            tail = tl.load(bytes_ptr + 4 * n_words + k, mask=k < n_tail, other=0)
            last = tl.sum(tail.to(tl.int64) << (8 * k).to(tl.int64), axis=0)
            s_b += last
            t_b += (n_words - base) * last
        s_mod = _mod_p(s_b + _PRIME)
        t_mod = _mod_p(t_b + 2 * _PRIME)
        t_mod = _mod_p(t_mod + _mul_mod_p(global_base, s_mod))
        tl.atomic_add(out_ptr + 0, s_mod & _LOW31, sem="relaxed")
        tl.atomic_add(out_ptr + 1, s_mod >> 31, sem="relaxed")
        tl.atomic_add(out_ptr + 2, t_mod & _LOW31, sem="relaxed")
        tl.atomic_add(out_ptr + 3, t_mod >> 31, sem="relaxed")

    @triton.jit(do_not_specialize=["n_words", "n_bytes"])
    def _psum61_chunk_kernel(
        bytes_ptr,
        out_ptr,
        n_words,
        n_bytes,
        CHUNK: tl.constexpr,
        TILE: tl.constexpr,
    ):
        """Program k digests words k * CHUNK .. (k + 1) * CHUNK - 1."""
        n_words = n_words.to(tl.int64)
        base = tl.program_id(0).to(tl.int64) * CHUNK
        _add_chunk(bytes_ptr, n_words, n_bytes, base, base, out_ptr, CHUNK, TILE)

    @triton.jit(do_not_specialize=["n_parts"])
    def _psum61_parts_kernel(
        table_ptr,
        n_parts,
        out_ptr,
        CHUNK: tl.constexpr,
        TILE: tl.constexpr,
        ALIGNED: tl.constexpr = False,
    ):
        """Several byte strings digested as if packed back to back, in one
        launch. table_ptr holds one int64 row per part: (address, whole
        words, bytes, its first program, its first word in the packing);
        program k digests a chunk of the last part whose first program is
        at most k (found by binary search). ALIGNED: every address is a
        multiple of 16 bytes, which the compiler cannot see in a table, so
        the words are read 16 bytes a load, as the one-part kernel reads
        its argument's."""
        pid = tl.program_id(0).to(tl.int64)
        lo = pid * 0
        hi = lo + n_parts - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            starts_by = tl.load(table_ptr + mid * 5 + 3) <= pid
            lo = tl.where(starts_by, mid, lo)
            hi = tl.where(starts_by, hi, mid - 1)
        row = table_ptr + lo * 5
        bytes_ptr = tl.load(row).to(tl.pointer_type(tl.uint8))
        if ALIGNED:
            bytes_ptr = tl.multiple_of(bytes_ptr, 16)
        n_words = tl.load(row + 1)
        n_bytes = tl.load(row + 2)
        base = (pid - tl.load(row + 3)) * CHUNK
        global_base = tl.load(row + 4) + base
        _add_chunk(bytes_ptr, n_words, n_bytes, base, global_base, out_ptr, CHUNK, TILE)


def fused_partials(
    data: torch.Tensor,
    out: torch.Tensor,
    chunk_words: int = CHUNK_WORDS,
    tile_words: int = TILE_WORDS,
    num_warps: int = NUM_WARPS,
) -> None:
    """Launches the fused digest of 1-D contiguous uint8 bytes on the current
    stream, adding into `out` (four int64 counters, zeroed by the caller):
    (S mod p) = out[1] * 2**31 + out[0], (T mod p) = out[3] * 2**31 + out[2]."""
    if not (0 < chunk_words <= CHUNK_WORDS and chunk_words % tile_words == 0):
        raise ValueError(
            f"chunk_words: {chunk_words} is not a multiple of {tile_words} up to {CHUNK_WORDS}"
        )
    n = data.numel()
    if n == 0:
        return
    if data.storage_offset() % 4:
        data = data.clone()  # the kernel reads 4-byte aligned int32 words
    n_words = n // 4
    grid = (triton.cdiv(n_words + (n % 4 > 0), chunk_words),)
    _psum61_chunk_kernel[grid](
        data,
        out,
        n_words,
        n,
        CHUNK=chunk_words,
        TILE=tile_words,
        num_warps=num_warps,
    )


def _host_buffer(name: str, n: int) -> torch.Tensor:
    """This thread's pinned host buffer `name` of at least n int64 (reused:
    each digest waits for its copies before it returns)."""
    buf = getattr(_host, name, None)
    if buf is None or buf.numel() < n:
        buf = torch.empty(max(n, 64), dtype=torch.int64, pin_memory=True)
        setattr(_host, name, buf)
    return buf[:n]


def _finish(counters: torch.Tensor) -> list[int]:
    """The counters on the host: through pinned memory, waiting for the
    current stream only. A plain `.tolist()` issued while the stream still
    has a bucket's copy queued waits inside a pageable copy, and on a
    receiver thread that stalled the decode kernels other threads launched
    meanwhile."""
    if not counters.is_cuda:
        return counters.view(-1).tolist()
    host = _host_buffer("counters", counters.numel())
    host.copy_(counters.view(-1), non_blocking=True)
    torch.cuda.current_stream(counters.device).synchronize()
    return host.tolist()


def _fused_packed_totals(
    tensors: list[torch.Tensor], sizes: list[int]
) -> tuple[int, int]:
    """(S mod p, T mod p) of the tensors' bytes packed back to back (every
    tensor but the last a whole number of words), in one launch over all of
    them. Per tensor only its address and size are read: no views made."""
    rows, chunks, words, by16 = [], 0, 0, True
    aligned = []  # alive until the kernel has read them
    for tensor, n in zip(tensors, sizes):
        if n == 0:
            continue
        if not tensor.is_contiguous():
            tensor = tensor.contiguous()
        if tensor.data_ptr() % 4:
            tensor = tensor.clone()  # the kernel reads 4-byte aligned int32 words
        aligned.append(tensor)
        rows += [tensor.data_ptr(), n // 4, n, chunks, words]
        by16 = by16 and rows[-5] % 16 == 0
        chunks += triton.cdiv(n // 4 + (n % 4 > 0), CHUNK_WORDS)
        words += n // 4
    counters = torch.zeros(4, dtype=torch.int64, device=tensors[0].device)
    if rows:
        table = torch.tensor(rows, dtype=torch.int64)
        if counters.is_cuda:  # through pinned memory: no pageable copy
            table = _host_buffer("table", len(rows)).copy_(table)
            table = table.to(counters.device, non_blocking=True)
        _psum61_parts_kernel[(chunks,)](
            table,
            len(rows) // 5,
            counters,
            CHUNK=CHUNK_WORDS,
            TILE=TILE_WORDS,
            ALIGNED=by16,
            num_warps=NUM_WARPS,
        )
    s_lo, s_hi, t_lo, t_hi = _finish(counters)
    return (s_hi << 31) + s_lo, (t_hi << 31) + t_lo


def _fused_totals(parts: list[torch.Tensor]) -> list[tuple[int, int, int]]:
    """(S mod p, T mod p, N) of each part, one kernel per part and one copy
    of all their counters to the host."""
    counters = torch.zeros(len(parts), 4, dtype=torch.int64, device=parts[0].device)
    for part, out in zip(parts, counters):
        fused_partials(part, out)
    values = _finish(counters)
    totals = []
    for i, part in enumerate(parts):
        s_lo, s_hi, t_lo, t_hi = values[4 * i : 4 * i + 4]
        n = part.numel()
        totals.append(((s_hi << 31) + s_lo, (t_hi << 31) + t_lo, n // 4 + (n % 4 > 0)))
    return totals


# --- a bucket's launch, planned once (the sender) ------------------------------

_data_ptr = torch.Tensor.data_ptr
_nbytes = torch.Tensor.nbytes.__get__
_is_contiguous = torch.Tensor.is_contiguous
# Plans kept per thread by digest_tensors; past this many, the oldest goes.
MAX_PLANS = 4096


class DigestPlan:
    """The fused digest of one bucket layout, planned once: the launch table
    of `_psum61_parts_kernel` (per tensor: address, whole words, bytes, first
    program, first word in the packing) on the device, the four counters
    and, on CUDA, from the second use on, the whole launch (zero the
    counters, the kernel, copy them to pinned host memory) captured in a
    CUDA graph and replayed. Its digest is the same as the unplanned path's.

    A plan holds addresses, never the tensors: it fits tensors with the
    layout it was built for (the same addresses and byte counts, in order,
    each contiguous; `matches`), whatever bytes they hold now, and a plan
    digest reads whatever is at those addresses when it runs, so use it only
    on tensors it matches (`digest` checks). Layouts that need copies (a
    tensor not contiguous or not 4-byte aligned, or one other than the last
    ending mid-word) and tensors off CUDA (save under Triton's interpreter)
    have no plan. Not for use by two threads at once (digest_tensors keeps
    one set of plans per thread)."""

    def __init__(self, tensors: list[torch.Tensor], graph: bool = True) -> None:
        """Builds the table (ValueError where the layout has none, see
        `plannable`); `graph=False` launches the kernel on every use."""
        if not self.plannable(tensors):
            raise ValueError("these tensors' layout has no digest plan")
        self.ptrs = list(map(_data_ptr, tensors))
        self.sizes = list(map(_nbytes, tensors))
        rows, chunks, words = [], 0, 0
        for ptr, n in zip(self.ptrs, self.sizes):
            if n:
                rows += [ptr, n // 4, n, chunks, words]
                chunks += triton.cdiv(n // 4 + (n % 4 > 0), CHUNK_WORDS)
                words += n // 4
        self.device = tensors[0].device
        self.chunks, self.rows = chunks, len(rows) // 5
        self.aligned = all(ptr % 16 == 0 for ptr in rows[::5])
        self.table = torch.tensor(rows, dtype=torch.int64, device=self.device)
        self.counters = torch.zeros(4, dtype=torch.int64, device=self.device)
        cuda = self.device.type == "cuda"
        self.host = torch.empty(4, dtype=torch.int64, pin_memory=True) if cuda else None
        self.use_graph = graph and cuda
        self.graph: "torch.cuda.CUDAGraph | None" = None
        self.uses = 0

    @staticmethod
    def plannable(tensors: list[torch.Tensor]) -> bool:
        """Whether the fused path reads these tensors where they lie: Triton
        runs them (`fused_digest_available`), each is contiguous and 4-byte
        aligned, every one but the last is whole words, and they hold some
        bytes and fewer than MAX_DIGEST_BYTES."""
        if triton is None or not tensors or not fused_digest_available(tensors):
            return False
        sizes = list(map(_nbytes, tensors))
        return (
            0 < sum(sizes) < MAX_DIGEST_BYTES
            and all(map(_is_contiguous, tensors))
            and not any(n % 4 for n in sizes[:-1])
            and not any(t.data_ptr() % 4 for t, n in zip(tensors, sizes) if n)
        )

    def matches(self, tensors: list[torch.Tensor]) -> bool:
        """Whether the tensors have the planned layout: per tensor its
        address, byte count and contiguity (no views made). Addresses of
        different CUDA devices and of host memory never coincide (one
        virtual address space), so equal addresses mean the same device."""
        return (
            list(map(_data_ptr, tensors)) == self.ptrs
            and list(map(_nbytes, tensors)) == self.sizes
            and all(map(_is_contiguous, tensors))
            and (self.host is not None or os.environ.get("TRITON_INTERPRET") == "1")
        )

    def digest(self, tensors: list[torch.Tensor]) -> str:
        """The digest of these tensors, which must match the plan."""
        if not self.matches(tensors):
            raise ValueError("these tensors do not have the planned layout")
        return _psum_format(*self.totals())

    def totals(self) -> tuple[int, int]:
        """(S mod p, T mod p) of the bytes now at the planned addresses,
        packed back to back: the caller has checked `matches`."""
        if self.host is None:  # Triton's interpreter, on the host
            self._launch()
            s_lo, s_hi, t_lo, t_hi = self.counters.tolist()
            return (s_hi << 31) + s_lo, (t_hi << 31) + t_lo
        index = self.device.index
        if torch.cuda.current_device() != index:
            with torch.cuda.device(index):
                return self.totals()
        if self.graph is None and self.use_graph and self.uses:
            self.graph = self._capture()  # the kernel is compiled by now
            self.use_graph = self.graph is not None
        self.uses += 1
        if self.graph is not None:
            self.graph.replay()
        else:
            self._launch()
        torch.cuda.current_stream(index).synchronize()
        s_lo, s_hi, t_lo, t_hi = self.host.tolist()
        return (s_hi << 31) + s_lo, (t_hi << 31) + t_lo

    def _launch(self) -> None:
        """Zero the counters, run the kernel, copy the counters to the host
        buffer (on CUDA), all on the current stream."""
        self.counters.zero_()
        _psum61_parts_kernel[(self.chunks,)](
            self.table,
            self.rows,
            self.counters,
            CHUNK=CHUNK_WORDS,
            TILE=TILE_WORDS,
            ALIGNED=self.aligned,
            num_warps=NUM_WARPS,
        )
        if self.host is not None:
            self.host.copy_(self.counters, non_blocking=True)

    def _capture(self) -> "torch.cuda.CUDAGraph | None":
        """The launch captured in a CUDA graph on this thread's capture
        stream (nothing runs now); None where capture fails, and the plan
        launches as it did."""
        streams = getattr(_host, "capture_streams", None)
        if streams is None:
            streams = _host.capture_streams = {}
        try:
            stream = streams.get(self.device.index)
            if stream is None:
                stream = streams[self.device.index] = torch.cuda.Stream(self.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.stream(stream):
                graph.capture_begin(capture_error_mode="thread_local")
                try:
                    self._launch()
                finally:
                    graph.capture_end()
            return graph
        except Exception:  # a torch or driver that cannot capture it
            return None


def _plans() -> dict:
    """This thread's plans by (count, first address, last address)."""
    plans = getattr(_host, "plans", None)
    if plans is None:
        plans = _host.plans = {}
    return plans


def _cached_plan(tensors: list[torch.Tensor]) -> "DigestPlan | None":
    """The plan digest_tensors uses for these tensors: this thread's plan
    for their layout, built now where there is none or the layout at its
    key changed (a tensor moved, grew or shrank); None without a plan."""
    if triton is None or (_fused_failures and tensors[0].device in _fused_failures):
        return None
    plans = _plans()
    key = (len(tensors), _data_ptr(tensors[0]), _data_ptr(tensors[-1]))
    plan = plans.get(key)
    if plan is not None and plan.matches(tensors):
        return plan
    plans.pop(key, None)
    if not DigestPlan.plannable(tensors):
        return None
    while len(plans) >= MAX_PLANS:
        del plans[next(iter(plans))]
    plan = plans[key] = DigestPlan(tensors)
    return plan
