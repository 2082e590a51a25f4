"""What the soak's trainer process and its parent both use."""

from __future__ import annotations

from typing import Any

import torch

from harness.weights import randomized

Named = list[tuple[str, torch.Tensor]]
WEIGHT_SETS = 4  # set 0 is the checkpoint, sets 1.. are random (seeded)
# Replicated on every TP rank: the head read back is the whole tensor's head.
SAMPLED = "model.norm.weight"
GROUP = "soak"


def weight_set(original: Named, index: int) -> Named:
    return original if index == 0 else randomized(original, index)


def brief(text: Any, limit: int = 400) -> str:
    text = str(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."
