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


def config(family: str, **overrides):
    import transformers as tf

    c = {**COMMON, **overrides}
    if family == "llama3":
        return tf.LlamaConfig(rope_parameters=LLAMA3, tie_word_embeddings=False, **c)
    if family == "qwen3":
        return tf.Qwen3Config(rope_parameters={"rope_type": "default", "rope_theta": 1e6}, tie_word_embeddings=True, **c)
    if family == "gemma2":
        return tf.Gemma2Config(**{"sliding_window": WINDOW, "query_pre_attn_scalar": 24, "attn_logit_softcapping": 2.0,
                                  "final_logit_softcapping": 5.0, **c})
    if family == "gemma3":
        return tf.Gemma3TextConfig(
            **{"sliding_window": WINDOW, "query_pre_attn_scalar": 20,
               "layer_types": ["sliding_attention", "sliding_attention", "full_attention"], **c},
            rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                             "full_attention": {"rope_type": "default", "rope_theta": 1e6}})
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


def build(family: str, seed: int = 0, **overrides):
    """A float32 transformers model of the family with random weights; norms perturbed (their init is constant)."""
    import torch
    import transformers as tf

    torch.manual_seed(seed)
    cfg = config(family, **overrides)
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


# ----------------------------------------------------------------------------------------------------------
# GGUF, written the way llama.cpp's convert_hf_to_gguf.py does (F32 tensors; the packer quantizes the linears)

GGUF_ARCH = {"llama3": "llama", "qwen3": "qwen3", "gemma2": "gemma2", "gemma3": "gemma3", "phi3": "phi3"}
# Gemma in a GGUF: llama.cpp fixes the layer pattern (every 2nd / 6th layer global) and scales queries by head_dim
GGUF_OVERRIDES = {"gemma2": dict(query_pre_attn_scalar=16),
                  "gemma3": dict(num_hidden_layers=6, query_pre_attn_scalar=16, layer_types=None)}


def llama3_rope_freqs(rp: dict, head_dim: int) -> list[float]:
    """llama.cpp's LlamaModel.generate_extra_tensors: the llama3 rule as per-frequency divisors of inv_freq."""
    import math

    out = []
    for i in range(0, head_dim, 2):
        freq = 1.0 / rp["rope_theta"] ** (i / head_dim)
        wavelen = 2 * math.pi / freq
        old = rp["original_max_position_embeddings"]
        lo, hi, factor = rp["low_freq_factor"], rp["high_freq_factor"], rp["factor"]
        if wavelen < old / hi:
            out.append(1.0)
        elif wavelen > old / lo:
            out.append(factor)
        else:
            smooth = (old / wavelen - lo) / (hi - lo)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return out


def write_gguf_from_hf(model, family: str, path: Path) -> Path:
    import gguf
    import numpy as np

    from tests.synthetic import CHATML, SPECIALS, llamacpp_permute, tiny_vocab

    arch = GGUF_ARCH[family]
    c = model.config
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    wr = gguf.GGUFWriter(str(path), arch)
    wr.add_name(f"tiny-{family}")
    wr.add_block_count(c.num_hidden_layers)
    wr.add_context_length(c.max_position_embeddings)
    wr.add_embedding_length(c.hidden_size)
    wr.add_feed_forward_length(c.intermediate_size)
    wr.add_head_count(c.num_attention_heads)
    wr.add_head_count_kv(c.num_key_value_heads)
    wr.add_key_length(c.head_dim)
    wr.add_value_length(c.head_dim)
    rp = c.rope_parameters.get("full_attention", c.rope_parameters)
    wr.add_rope_freq_base(rp["rope_theta"])
    wr.add_layer_norm_rms_eps(c.rms_norm_eps)
    wr.add_vocab_size(c.vocab_size)
    if family.startswith("gemma"):
        wr.add_sliding_window(c.sliding_window)
    if family == "phi3":  # LongRoPE: factors as tensors (below), the original context as metadata
        wr.add_rope_scaling_orig_ctx_len(c.original_max_position_embeddings)
    if family == "gemma2":
        wr.add_attn_logit_softcapping(c.attn_logit_softcapping)
        wr.add_final_logit_softcapping(c.final_logit_softcapping)
    tokens, merges = tiny_vocab(c.vocab_size)
    wr.add_tokenizer_model("gpt2")
    wr.add_tokenizer_pre("gpt2")
    wr.add_token_list(tokens)
    wr.add_token_merges([f"{a} {b}" for a, b in merges])
    wr.add_token_types([3 if t in SPECIALS else 1 for t in tokens])
    wr.add_bos_token_id(len(tokens) - 2)
    wr.add_eos_token_id(len(tokens) - 1)
    wr.add_add_bos_token(False)
    wr.add_chat_template(CHATML)
    norm_shift = 1.0 if family.startswith("gemma") else 0.0  # llama.cpp stores Gemma's 1 + w

    def put(name, hf_name, permute_heads=None):
        w = sd[hf_name]
        if permute_heads:
            w = llamacpp_permute(w, permute_heads)
        if hf_name.endswith("norm.weight"):
            w = w + np.float32(norm_shift)
        wr.add_tensor(name, np.ascontiguousarray(w, np.float32))

    put("token_embd.weight", "model.embed_tokens.weight")
    names = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
    if family.startswith("gemma"):
        names = {"attn_norm": "input_layernorm", "post_attention_norm": "post_attention_layernorm",
                 "ffn_norm": "pre_feedforward_layernorm", "post_ffw_norm": "post_feedforward_layernorm"}
    for i in range(c.num_hidden_layers):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        for g, h in names.items():
            put(b + g + ".weight", p + h + ".weight")
        perm = family == "llama3"
        if family == "phi3":  # fused as in the HF checkpoint
            put(b + "attn_qkv.weight", p + "self_attn.qkv_proj.weight")
        else:
            put(b + "attn_q.weight", p + "self_attn.q_proj.weight", c.num_attention_heads if perm else None)
            put(b + "attn_k.weight", p + "self_attn.k_proj.weight", c.num_key_value_heads if perm else None)
            put(b + "attn_v.weight", p + "self_attn.v_proj.weight")
        if family in ("qwen3", "gemma3"):
            put(b + "attn_q_norm.weight", p + "self_attn.q_norm.weight")
            put(b + "attn_k_norm.weight", p + "self_attn.k_norm.weight")
        put(b + "attn_output.weight", p + "self_attn.o_proj.weight")
        if family == "phi3":
            put(b + "ffn_up.weight", p + "mlp.gate_up_proj.weight")
        else:
            put(b + "ffn_gate.weight", p + "mlp.gate_proj.weight")
            put(b + "ffn_up.weight", p + "mlp.up_proj.weight")
        put(b + "ffn_down.weight", p + "mlp.down_proj.weight")
    put("output_norm.weight", "model.norm.weight")
    if "lm_head.weight" in sd and not c.tie_word_embeddings:
        put("output.weight", "lm_head.weight")
    if family == "llama3":
        wr.add_tensor("rope_freqs.weight", np.asarray(llama3_rope_freqs(rp, c.head_dim), np.float32))
    if family == "phi3":
        wr.add_tensor("rope_factors_long.weight", np.asarray(rp["long_factor"], np.float32))
        wr.add_tensor("rope_factors_short.weight", np.asarray(rp["short_factor"], np.float32))
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    return Path(path)
