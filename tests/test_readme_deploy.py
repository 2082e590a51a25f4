"""README "Deploy" steps 4 and 5 as a deployer runs them, against two real
servers: the trainer's loop pushes a trained model to both engines, then
`rlsync status` and `rlsync checksum` print what the README shows. Only what
a CPU host must change is changed (the engines' URLs and TP size, gloo for
NCCL, this host's address and a free port), and each of those must be in
the README as this test expects, so a README that drifts fails here."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cpu_sglang import free_port
from harness.doc_blocks import Chunk, all_chunks, command_lines, reader_env
from rlsync import client

pytestmark = pytest.mark.release_independent

ROOT = Path(__file__).resolve().parents[1]
STEPS = 2  # the loop's num_steps: the engines end at weight_version=step-1

# What the README's trainer defines elsewhere: its key, its model, its step.
PRELUDE = """
import torch
from transformers import AutoModelForCausalLM

ADMIN_KEY = None  # the test servers have no admin key
num_steps = {steps}
model = AutoModelForCausalLM.from_pretrained({model!r}, torch_dtype=torch.bfloat16)


def train_step(model):
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01)
"""
EPILOGUE = """
assert result.verified and [e.applied for e in result.engines] == [True, True], result
print("synced", result.bytes, "bytes")
"""


def deploy_chunk(step: str, needle: str) -> Chunk:
    """The README chunk under the Deploy heading `step` that holds `needle`."""
    readme = (ROOT / "README.md").read_text().splitlines()
    start = readme.index(f"### {step}") + 1
    end = next(i for i in range(start, len(readme)) if readme[i].startswith("#"))
    chunks = [
        c
        for c in all_chunks()
        if c.page == "README.md" and start < c.line <= end and needle in c.text
    ]
    assert len(chunks) == 1, f"README.md, {step}: {len(chunks)} chunks with {needle!r}"
    return chunks[0]


def for_this_host(text: str, substitutions: dict[str, str]) -> str:
    for readme, here in substitutions.items():
        assert readme in text, f"README.md no longer has {readme!r}:\n{text}"
        text = text.replace(readme, here)
    return text


def masked(line: str) -> str:
    """A line with its checksums and numbers as placeholders, `rank` as
    `ranks` (the README shows TP 2 engines; these are TP 1)."""
    line = re.sub(r"sha256:[0-9a-f]+(\.\.\.)?", "sha256:H", line.strip())
    line = re.sub(r"\b(\d+) ranks?\b", r"\1 ranks", line)
    return re.sub(r"(?<![\w.:])\d+(\.\d+)?\b", "N", line)


def test_deploy_steps_4_and_5_run_as_written(
    server_tp1, server_tp1_replica, tiny_model, tmp_path
):
    a, b = server_tp1.url, server_tp1_replica.url
    urls = {"http://engine-a:30000": a, "http://engine-b:30000": b}
    before = client.weights_checksum(a)["checksum"]
    env = {**reader_env(tmp_path), "SGLANG_ADMIN_API_KEY": "no-key-is-checked"}
    try:
        push = deploy_chunk("4. Push weights from the trainer", "WeightSender(")
        program = for_this_host(
            push.text,
            {
                **urls,
                "tp_size=2": "tp_size=1",
                'backend="nccl"': 'backend="gloo"',
                'master_address="10.0.0.5"': 'master_address="127.0.0.1"',
                "master_port=29600": f"master_port={free_port()}",
            },
        )
        prelude = PRELUDE.format(steps=STEPS, model=str(tiny_model))
        ran = subprocess.run(
            [sys.executable, "-c", prelude + program + EPILOGUE],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert ran.returncode == 0, ran.stderr[-4000:]
        assert "synced" in ran.stdout

        for needle in ("rlsync status", "rlsync checksum"):
            chunk = deploy_chunk("5. Check", needle)
            text = for_this_host(chunk.text, urls)
            (command,) = command_lines(text)
            shown = [l for l in text.splitlines() if not l.startswith("$ ")]
            out = subprocess.run(
                ["bash", "-c", command],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert out.returncode == 0, f"{command}\n{out.stdout}{out.stderr}"
            printed = {masked(l) for l in out.stdout.splitlines()}
            missing = [l for l in shown if masked(l) not in printed]
            assert missing == [], f"{command} printed:\n{out.stdout}"
            if needle == "rlsync status":
                assert out.stdout.count(f"weight_version=step-{STEPS - 1} ") == 2
        after = client.weights_checksum(a)["checksum"]
        assert after == client.weights_checksum(b)["checksum"] != before
    finally:
        for url in urls.values():
            client.update_weights_from_disk(url, str(tiny_model), timeout=120)
