"""Tiny models and a tokenizer generated locally with a fixed seed (no download).

`family` picks the architecture: "llama" (the default; "llama_tied" with the
output head tied to the embeddings, one tensor for both), "qwen2" (attention
biases, untied embeddings), and the mixtures of experts "qwen2_moe" (experts,
a gated shared expert and attention biases), "qwen3_moe" (experts, q/k norms)
and "mixtral" (experts). Checkpoints hold one tensor per expert, as published
checkpoints do; SGLang stacks them into its fused expert weights at load.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import string
from pathlib import Path
from typing import Any

# Sizes by purpose: tests want fast start-up, the demo and the benchmark want
# a transfer that takes visible time.
SIZES = {
    "test": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2),
    "demo": dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=8),
    "bench": dict(hidden_size=1536, intermediate_size=4608, num_hidden_layers=12),
}
VOCAB = ["<unk>", "<s>", "</s>"] + list(string.printable[:95])
FAMILIES = ("llama", "llama_tied", "qwen2", "qwen2_moe", "qwen3_moe", "mixtral")
MOE_FAMILIES = ("qwen2_moe", "qwen3_moe", "mixtral")
NUM_EXPERTS = 4
EXPERTS_PER_TOKEN = 2


def _family_fields(family: str, dims: dict[str, int], heads: int) -> dict[str, Any]:
    """What a family adds to (or changes in) the common configuration."""
    hidden, inter = dims["hidden_size"], dims["intermediate_size"]
    if family == "llama_tied":
        return dict(tie_word_embeddings=True)
    if family == "qwen2":
        # Qwen2 always has q/k/v biases; its embeddings stay untied here.
        return dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2")
    if family == "qwen2_moe":
        return dict(
            architectures=["Qwen2MoeForCausalLM"],
            model_type="qwen2_moe",
            num_experts=NUM_EXPERTS,
            num_experts_per_tok=EXPERTS_PER_TOKEN,
            moe_intermediate_size=inter // 4,
            shared_expert_intermediate_size=inter // 2,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            norm_topk_prob=False,
        )
    if family == "qwen3_moe":
        return dict(
            architectures=["Qwen3MoeForCausalLM"],
            model_type="qwen3_moe",
            head_dim=hidden // heads,
            num_experts=NUM_EXPERTS,
            num_experts_per_tok=EXPERTS_PER_TOKEN,
            moe_intermediate_size=inter // 4,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            norm_topk_prob=True,
        )
    if family == "mixtral":
        return dict(
            architectures=["MixtralForCausalLM"],
            model_type="mixtral",
            num_local_experts=NUM_EXPERTS,
            num_experts_per_tok=EXPERTS_PER_TOKEN,
        )
    raise ValueError(f"unknown family {family!r}; known: {', '.join(FAMILIES)}")


def model_config(size: str, family: str = "llama") -> dict[str, Any]:
    dims = SIZES[size]
    hidden = dims["hidden_size"]
    heads = max(4, hidden // 64)
    config: dict[str, Any] = dict(
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
    if family != "llama":
        config.update(_family_fields(family, dims, heads))
    return config


def _build_model(config: dict[str, Any], family: str) -> Any:
    import transformers

    if family in ("llama", "llama_tied"):
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**config))
    fields = {k: v for k, v in config.items() if k != "model_type"}
    hf_config = transformers.AutoConfig.for_model(config["model_type"], **fields)
    return getattr(transformers, config["architectures"][0])(hf_config)


def make_tiny_model(
    dest_root: Path, size: str = "test", seed: int = 0, family: str = "llama"
) -> Path:
    """Write the model once per (family, size, seed, config); return its directory."""
    config = model_config(size, family)
    key = hashlib.sha256(json.dumps([config, seed, VOCAB], sort_keys=True).encode())
    dest = dest_root / f"tiny-{family}-{size}-{key.hexdigest()[:12]}"
    if (dest / ".complete").exists():
        return dest
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    torch.manual_seed(seed)
    model = _build_model(config, family).to(torch.bfloat16)
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
