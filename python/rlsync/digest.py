# Generated from overlay/python/sglang/srt/weight_sync/digest.py by `make overlay`; do not edit.
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

Imports only torch, so a trainer can carry a copy of this module to compute
the digests it sends.
"""

from __future__ import annotations

import torch

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
    """Exact (S, T, N) of each 1-D uint8 part: S = sum(w_i) and
    T = sum(i * w_i) over its N int32 words (i from 0, the last word
    zero-padded). One device-to-host copy for all parts together."""
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
    assert data.dtype == torch.uint8 and data.dim() == 1, "need 1-D uint8 bytes"
    assert data.is_contiguous(), "bytes must be contiguous"
    s, t, _ = psum_totals([data])[0]
    return _psum_format(s, t)


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def digest_tensors(tensors: list[torch.Tensor]) -> str:
    """Digest of tensors packed back to back (the flattened-bucket layout),
    without packing them: word i of tensor k is word off_k + i of the bucket,
    so S = sum(S_k) and T = sum(T_k + off_k * S_k). Falls back to packing
    when a tensor other than the last ends mid-word (its byte count is not a
    multiple of 4)."""
    assert tensors, "need at least one tensor"
    parts = [_as_bytes(t) for t in tensors]
    if any(p.numel() % 4 for p in parts[:-1]):
        return digest_bytes(torch.cat(parts))
    s = t = offset = 0
    for part_s, part_t, words in psum_totals(parts):
        s, t = s + part_s, t + part_t + offset * part_s
        offset += words
    return _psum_format(s, t)
