"""Tiny random-weight models of each supported family, built with transformers' own classes and saved as a Hugging
Face folder (config.json + model.safetensors + the tiny byte-level BPE tokenizer of tests/synthetic.py).

Each family is small enough to pack and run in a second, yet exercises its features: llama3 RoPE scaling with
frequencies in all three bands, Qwen3's q/k norms, Gemma 2's soft-capping (caps small enough to bite) and
query pre-attention scalar, Gemma 3's local/global layers with two RoPE bases, Phi-3's fused projections and
LongRoPE, Mistral's sliding window. Windows are shorter than a 32-token generation, so they matter.

    hf = build("gemma3"); folder = save(hf, tmp / "gemma3")
"""

from __future__ import annotations

import json
from pathlib import Path

COMMON = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6, max_position_embeddings=256,
              bos_token_id=298, eos_token_id=299, pad_token_id=None)
WINDOW = 6
LLAMA3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
FAMILIES = ("llama3", "qwen3", "gemma2", "gemma3", "phi3", "mistral")


def config(family: str):
    import transformers as tf

    c = dict(COMMON)
    if family == "llama3":
        return tf.LlamaConfig(rope_parameters=LLAMA3, tie_word_embeddings=False, **c)
    if family == "qwen3":
        return tf.Qwen3Config(rope_parameters={"rope_type": "default", "rope_theta": 1e6}, tie_word_embeddings=True, **c)
    if family == "gemma2":
        return tf.Gemma2Config(sliding_window=WINDOW, query_pre_attn_scalar=24, attn_logit_softcapping=2.0,
                               final_logit_softcapping=5.0, **c)
    if family == "gemma3":
        return tf.Gemma3TextConfig(
            sliding_window=WINDOW, query_pre_attn_scalar=20,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"],
            rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                             "full_attention": {"rope_type": "default", "rope_theta": 1e6}}, **c)
    if family == "phi3":
        half = COMMON["head_dim"] // 2
        rope = {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0 + 0.3 * i for i in range(half)],
                "long_factor": [2.0 + i for i in range(half)]}
        return tf.Phi3Config(rope_parameters=rope, **{**c, "max_position_embeddings": 512},
                             original_max_position_embeddings=128, tie_word_embeddings=False)
    if family == "mistral":
        return tf.MistralConfig(sliding_window=WINDOW, tie_word_embeddings=False, **c)
    raise ValueError(family)


MODEL_CLASSES = {"llama3": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM", "gemma2": "Gemma2ForCausalLM",
                 "gemma3": "Gemma3ForCausalLM", "phi3": "Phi3ForCausalLM", "mistral": "MistralForCausalLM"}


def build(family: str, seed: int = 0):
    """A float32 transformers model of the family with random weights; norms perturbed (their init is constant)."""
    import torch
    import transformers as tf

    torch.manual_seed(seed)
    cfg = config(family)
    cfg._attn_implementation = "eager"  # soft-capping needs eager; keep every family on the same path
    model = getattr(tf, MODEL_CLASSES[family])(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(torch.randn_like(p) * 0.3 + (0.0 if family.startswith("gemma") else 1.0))
            elif p.dim() == 2:
                p.copy_(torch.randn_like(p) / p.shape[1] ** 0.5)
    return model


def save(model, folder: Path) -> Path:
    """model.safetensors + config.json + tokenizer files: a folder `webinfer pack` reads."""
    from tests.synthetic import CHATML, tiny_tokenizer_json

    folder = Path(folder)
    model.save_pretrained(str(folder), safe_serialization=True)
    (folder / "tokenizer.json").write_text(json.dumps(tiny_tokenizer_json(COMMON["vocab_size"]), ensure_ascii=False))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "unk_token": "<|endoftext|>", "pad_token": None,
        "add_bos_token": False, "add_eos_token": False, "chat_template": CHATML}))
    return folder


def load_package_weights(model, package) -> None:
    """Overwrite the HF model's weights with the package's dequantized ones (the inverse of hf_source's mapping:
    fused Phi-3 rows put back in place, Gemma's folded norm offset taken off), so both run the same numbers."""
    import torch

    from webinfer_packager.pack.hf_source import hf_tensor_name
    from webinfer_packager.reference.model import read_tensor

    cfg = package.config.to_dict()
    sd = model.state_dict()
    with torch.no_grad():
        for name in package.tensors:
            hn, rows, offset = hf_tensor_name(cfg["architecture"], cfg, name)
            w = torch.from_numpy(read_tensor(package, name) - offset)
            if rows is None:
                sd[hn].copy_(w)
            else:
                sd[hn][rows[0]:rows[1]].copy_(w)
