"""Helpers the tests, demo and benchmarks share to look at a served model."""

from __future__ import annotations

import requests
import torch


def greedy(url: str, prompt: str, n: int = 12, timeout: float = 60.0) -> list[int]:
    """Token ids of a greedy completion: equal ids mean equal weights here."""
    resp = requests.post(
        url + "/generate",
        json={
            "text": prompt,
            "sampling_params": {"max_new_tokens": n, "temperature": 0},
        },
        timeout=timeout,
    )
    resp.raise_for_status()
    return resp.json()["output_ids"]


def randomized(
    weights: list[tuple[str, torch.Tensor]], seed: int, scale: float = 0.05
) -> list[tuple[str, torch.Tensor]]:
    """New random values for every tensor, same names, shapes and dtypes."""
    gen = torch.Generator().manual_seed(seed)
    return [
        (n, (torch.randn(t.shape, generator=gen) * scale).to(t.dtype))
        for n, t in weights
    ]
