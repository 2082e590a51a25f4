"""Bucket digests the server checks before it applies anything.

"wsum64:<s1>:<s2>" over a bucket's bytes read as little-endian int64 words,
zero-padded: s1 = sum(w_i) and s2 = sum((i + 1) * w_i), both mod 2**64. It is
one multiply and two sums per 8 bytes, memory-bound on GPU and CPU alike; a
flipped byte always changes s1, reordered words or swapped buckets change s2.
Must agree bit for bit with the server's `staged_receiver.bucket_digest`
(tests/test_digest.py checks both on the same bytes).
"""

from __future__ import annotations

import torch

ALGORITHM = "wsum64"
_COLS = 64  # words are summed as a [rows, 64] matrix: two plain reductions


def _sums(data: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(s1, s2, words) of 1-D uint8 bytes, the tail zero-padded to a word;
    s1 and s2 stay on the device (no sync)."""
    dev = data.device
    n = data.numel()
    full = n // 8 * 8
    words = data[:full].view(torch.int64)
    # Word i = r * 64 + c: sum((i + 1) * w_i) = 64 * sum(r * R_r) + sum((c + 1) * C_c)
    # with R and C the row and column sums, so the big array is only summed.
    m = words.numel() // _COLS * _COLS
    mat = words[:m].view(-1, _COLS)
    rows, cols = mat.sum(dim=1), mat.sum(dim=0)
    r = torch.arange(rows.numel(), dtype=torch.int64, device=dev)
    c = torch.arange(1, _COLS + 1, dtype=torch.int64, device=dev)
    s1 = rows.sum()
    s2 = (rows * r).sum() * _COLS + (cols * c).sum()
    rest = words[m:]
    if full < n:
        padded = torch.zeros(8, dtype=torch.uint8, device=dev)
        padded[: n - full] = data[full:]
        rest = torch.cat([rest, padded.view(torch.int64)])
    if rest.numel():
        pos = torch.arange(m + 1, m + 1 + rest.numel(), dtype=torch.int64, device=dev)
        s1 = s1 + rest.sum()
        s2 = s2 + (rest * pos).sum()
    return s1, s2, m + rest.numel()


def _format(s1: torch.Tensor, s2: torch.Tensor) -> str:
    mask = (1 << 64) - 1
    return f"{ALGORITHM}:{s1.item() & mask:016x}:{s2.item() & mask:016x}"


def digest_bytes(data: torch.Tensor) -> str:
    """Digest of a 1-D contiguous uint8 tensor on any device."""
    assert data.dtype == torch.uint8 and data.dim() == 1, "need 1-D uint8 bytes"
    assert data.is_contiguous(), "bytes must be contiguous"
    s1, s2, _ = _sums(data)
    return _format(s1, s2)


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def digest_tensors(tensors: list[torch.Tensor]) -> str:
    """Digest of tensors packed back to back (the flattened-bucket layout),
    without packing them: word i of tensor k is word off_k + i of the bucket,
    so s2 = sum(s2_k + off_k * s1_k). Falls back to packing when a tensor
    other than the last ends mid-word."""
    assert tensors, "need at least one tensor"
    parts = [_as_bytes(t) for t in tensors]
    if any(p.numel() % 8 for p in parts[:-1]):
        return digest_bytes(torch.cat(parts))
    s1 = s2 = None
    offset = 0
    for part in parts:
        a, b, words = _sums(part)
        b = b + a * offset
        s1, s2 = (a, b) if s1 is None else (s1 + a, s2 + b)
        offset += words
    return _format(s1, s2)
