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
_CHUNK = 1 << 24  # words per step: bounds the temporary index tensor


def digest_bytes(data: torch.Tensor) -> str:
    """Digest of a 1-D contiguous uint8 tensor on any device."""
    assert data.dtype == torch.uint8 and data.dim() == 1, "need 1-D uint8 bytes"
    assert data.is_contiguous(), "bytes must be contiguous"
    n = data.numel()
    full = n // 8 * 8
    words = data[:full].view(torch.int64)
    s1 = torch.zeros((), dtype=torch.int64, device=data.device)
    s2 = torch.zeros((), dtype=torch.int64, device=data.device)
    for lo in range(0, words.numel(), _CHUNK):
        part = words[lo : lo + _CHUNK]
        pos = torch.arange(lo + 1, lo + 1 + part.numel(), dtype=torch.int64, device=data.device)
        s1 += part.sum()
        s2 += (part * pos).sum()
    if full < n:
        padded = torch.zeros(8, dtype=torch.uint8, device=data.device)
        padded[: n - full] = data[full:]
        last = padded.view(torch.int64)[0]
        s1 += last
        s2 += last * (full // 8 + 1)
    mask = (1 << 64) - 1
    return f"{ALGORITHM}:{s1.item() & mask:016x}:{s2.item() & mask:016x}"


def digest_tensors(tensors: list[torch.Tensor]) -> str:
    """Digest of tensors packed back to back (the flattened-bucket layout)."""
    flat = torch.cat([t.detach().contiguous().reshape(-1).view(torch.uint8) for t in tensors])
    return digest_bytes(flat)
