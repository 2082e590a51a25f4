"""Helpers the tests, demo and benchmarks share to look at a served model."""

from __future__ import annotations

import shutil
from pathlib import Path

import requests
import torch

Weights = list[tuple[str, torch.Tensor]]


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


def perturbed(weights: Weights, seed: int, scale: float = 0.02) -> Weights:
    """Every tensor moved by seeded noise (biases and norms too): same names,
    dtypes and shapes, values different everywhere."""
    gen = torch.Generator().manual_seed(seed)
    return [
        (n, (t.float() + torch.randn(t.shape, generator=gen) * scale).to(t.dtype))
        for n, t in weights
    ]


def save_checkpoint(src: Path, dest: Path, weights: Weights) -> Path:
    """`src`'s config and tokenizer files with `weights` as its safetensors."""
    dest.mkdir(parents=True)
    for f in src.iterdir():
        if f.is_file() and f.suffix != ".safetensors" and not f.name.startswith("."):
            shutil.copy2(f, dest / f.name)
    tensors = {n: t.contiguous() for n, t in weights}
    from safetensors.torch import save_file

    save_file(tensors, str(dest / "model.safetensors"), metadata={"format": "pt"})
    return dest
