"""Upstream behaviour the series must keep: greedy generation is the same at
TP 1 and TP 2, and upstream's single-phase distributed update works over gloo."""

from __future__ import annotations

import pytest
import requests
import torch

from harness.trainer import GlooTrainer
from rlsync import client

PROMPT = "The quick brown fox"


def greedy(url: str, text: str = PROMPT, n: int = 12) -> list[int]:
    resp = requests.post(
        url + "/generate",
        json={"text": text, "sampling_params": {"max_new_tokens": n, "temperature": 0}},
        timeout=60,
    )
    resp.raise_for_status()
    return resp.json()["output_ids"]


def test_greedy_generation_identical_at_tp1_and_tp2(server_tp1, server_tp2):
    out = greedy(server_tp1.url)
    assert len(out) == 12
    assert greedy(server_tp2.url) == out


@pytest.mark.parametrize("tp", [1, 2])
def test_upstream_single_phase_update_changes_parameter(tp, server_tp1, server_tp2):
    server = server_tp1 if tp == 1 else server_tp2
    name = "model.norm.weight"
    original = torch.tensor(
        client.get_weights_by_name(server.url, name, truncate_size=10**6)
    )
    before = greedy(server.url)
    trainer = GlooTrainer([server.url], [tp], group_name=f"baseline_tp{tp}")
    try:
        new = torch.linspace(-2, 2, original.numel()).to(torch.bfloat16)
        trainer.update_single_phase([(name, new)])
        got = torch.tensor(
            client.get_weights_by_name(server.url, name, truncate_size=10**6)
        )
        assert torch.equal(got, new.float())
        assert greedy(server.url) != before
        trainer.update_single_phase([(name, original.to(torch.bfloat16))])
        got = torch.tensor(
            client.get_weights_by_name(server.url, name, truncate_size=10**6)
        )
        assert torch.equal(got, original)
        assert greedy(server.url) == before
    finally:
        trainer.close()
