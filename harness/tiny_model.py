"""A tiny Llama and tokenizer generated locally with a fixed seed (no download)."""

from __future__ import annotations

import hashlib
import json
import shutil
import string
from pathlib import Path

# Sizes by purpose: tests want fast start-up, the demo and the benchmark want
# a transfer that takes visible time.
SIZES = {
    "test": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2),
    "demo": dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=8),
    "bench": dict(hidden_size=1536, intermediate_size=4608, num_hidden_layers=12),
}
VOCAB = ["<unk>", "<s>", "</s>"] + list(string.printable[:95])


def model_config(size: str) -> dict:
    dims = SIZES[size]
    hidden = dims["hidden_size"]
    heads = max(4, hidden // 64)
    return dict(
        architectures=["LlamaForCausalLM"],
        model_type="llama",
        vocab_size=512,
        num_attention_heads=heads,
        num_key_value_heads=max(2, heads // 2),
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        torch_dtype="bfloat16",
        **dims,
    )


def make_tiny_model(dest_root: Path, size: str = "test", seed: int = 0) -> Path:
    """Write the model once per (size, seed, config); return its directory."""
    config = model_config(size)
    key = hashlib.sha256(json.dumps([config, seed, VOCAB], sort_keys=True).encode())
    dest = dest_root / f"tiny-llama-{size}-{key.hexdigest()[:12]}"
    if (dest / ".complete").exists():
        return dest
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**config)).to(torch.bfloat16)
    model.save_pretrained(tmp, safe_serialization=True)

    vocab = {tok: i for i, tok in enumerate(VOCAB)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    fast.save_pretrained(tmp)
    (tmp / ".complete").write_text("ok\n")
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return dest
