"""Strict checksums of the weights a worker serves (`/weights_checker`
action "checksum").

Each tensor's digest is SHA256 over its name, dtype, shape and raw bytes; a
rank's checksum is SHA256 over its tensor digests sorted by name, so two
workers agree exactly when every tensor of theirs is bit-identical. Ranks
hold shards, so checksums compare across workers of the same TP size.
"""

from __future__ import annotations

import hashlib
from typing import Any, Dict, Iterable, List, Tuple

import torch

CHECKSUM_PREFIX = "sha256:"


def tensor_digest(name: str, tensor: torch.Tensor) -> str:
    tensor = tensor.detach()
    h = hashlib.sha256()
    h.update(f"{name}\0{str(tensor.dtype)}\0{list(tensor.shape)}\0".encode())
    data = tensor.contiguous().reshape(-1).view(torch.uint8).cpu()
    h.update(memoryview(data.numpy()))
    return h.hexdigest()


def weights_checksum(
    named_tensors: Iterable[Tuple[str, torch.Tensor]]
) -> Dict[str, Any]:
    """Checksum of one rank's tensors, with the count and bytes hashed."""
    digests: Dict[str, str] = {}
    num_bytes = 0
    for name, tensor in named_tensors:
        if name in digests:
            raise ValueError(f"duplicate tensor name {name!r}")
        digests[name] = tensor_digest(name, tensor)
        num_bytes += tensor.numel() * tensor.element_size()
    h = hashlib.sha256()
    for name in sorted(digests):
        h.update(f"{name}\0{digests[name]}\n".encode())
    return {
        "checksum": CHECKSUM_PREFIX + h.hexdigest(),
        "num_tensors": len(digests),
        "num_bytes": num_bytes,
    }


def merge_rank_checksums(rank_results: List[Dict[str, Any]]) -> Dict[str, Any]:
    """The worker's answer: every rank's checksum and one over them all, in
    rank order, to compare whole workers of the same TP size at a glance."""
    ranks = sorted(rank_results, key=lambda r: r["rank"])
    h = hashlib.sha256()
    for r in ranks:
        h.update(f"{r['rank']}\0{r['checksum']}\n".encode())
    return {
        "checksum": CHECKSUM_PREFIX + h.hexdigest(),
        "num_tensors": sum(r["num_tensors"] for r in ranks),
        "num_bytes": sum(r["num_bytes"] for r in ranks),
        "rank_results": ranks,
    }
