"""Tiny random-weight models for tests: a Hugging Face folder (llama or qwen2 flavour), a GGUF file (llama arch,
Q4_0/Q4_1/Q8_0/F32 tensors), and a large f16 HF folder written streamingly for the memory test.

Weights are drawn from a seeded numpy generator, so every writer is deterministic. `hf_weights` returns the
float32 weights in Hugging Face (half-split RoPE) order: the GGUF writer permutes Q/K rows the way llama.cpp
does, so tests can check that packing un-permutes them.

    write_hf(tmp / "tiny-llama", arch="llama");  write_gguf(tmp / "tiny.gguf", types={"linear": "Q4_0"})
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

TINY = dict(vocab_size=300, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=256)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
_MERGE_WORDS = ["the", "and", "ing", "hello", "world", "once", "upon", "time", "er", "on", "in", "at"]


# ----------------------------------------------------------------------------------------------------------
# tokenizer: GPT-2 style byte-level BPE, hand-built


def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (printable bytes map to themselves)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


def tiny_vocab(vocab_size: int = 300) -> tuple[list[str], list[tuple[str, str]]]:
    """Token strings (ids = positions; specials last) and merges, to exactly vocab_size tokens."""
    b2u = byte_to_unicode()
    tokens = [b2u[b] for b in range(256)]
    have, merges = set(tokens), []
    room = vocab_size - 256 - len(SPECIALS)
    for word in _MERGE_WORDS:
        for w in (word, "\u0120" + word):  # Ġ = byte-level space
            cur = w[0]
            for ch in w[1:]:
                if len(merges) >= room:
                    break
                if cur + ch not in have:
                    merges.append((cur, ch))
                    tokens.append(cur + ch)
                    have.add(cur + ch)
                cur += ch
    filler = 0
    while len(tokens) < vocab_size - len(SPECIALS):  # unused filler tokens keep vocab_size exact
        tokens.append(f"<unused{filler}>")
        filler += 1
    return tokens + SPECIALS, merges


def tiny_tokenizer_json(vocab_size: int = 300) -> dict:
    tokens, merges = tiny_vocab(vocab_size)
    first_special = len(tokens) - len(SPECIALS)
    bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    return {"version": "1.0", "truncation": None, "padding": None,
            "added_tokens": [{"id": first_special + i, "content": s, "single_word": False, "lstrip": False,
                              "rstrip": False, "normalized": False, "special": True} for i, s in enumerate(SPECIALS)],
            "normalizer": None, "pre_tokenizer": bl, "post_processor": {**bl, "trim_offsets": False},
            "decoder": bl,
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                      "vocab": {t: i for i, t in enumerate(tokens)}, "merges": [list(m) for m in merges]}}


# ----------------------------------------------------------------------------------------------------------
# weights


def hf_weights(cfg: dict, *, arch: str = "llama", tied: bool = True, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    h, f, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    q, kv = cfg["num_attention_heads"] * cfg["head_dim"], cfg["num_key_value_heads"] * cfg["head_dim"]

    def mat(n, k):
        return (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)

    w = {"model.embed_tokens.weight": mat(v, h)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = (1 + 0.1 * rng.standard_normal(h)).astype(np.float32)
        w[p + "self_attn.q_proj.weight"] = mat(q, h)
        w[p + "self_attn.k_proj.weight"] = mat(kv, h)
        w[p + "self_attn.v_proj.weight"] = mat(kv, h)
        if arch == "qwen2":
            for n, d in (("q", q), ("k", kv), ("v", kv)):
                w[p + f"self_attn.{n}_proj.bias"] = (0.1 * rng.standard_normal(d)).astype(np.float32)
        w[p + "self_attn.o_proj.weight"] = mat(h, q)
        w[p + "post_attention_layernorm.weight"] = (1 + 0.1 * rng.standard_normal(h)).astype(np.float32)
        w[p + "mlp.gate_proj.weight"] = mat(f, h)
        w[p + "mlp.up_proj.weight"] = mat(f, h)
        w[p + "mlp.down_proj.weight"] = mat(h, f)
    w["model.norm.weight"] = (1 + 0.1 * rng.standard_normal(h)).astype(np.float32)
    if not tied:
        w["lm_head.weight"] = mat(v, h)
    return w


def hf_config(cfg: dict, arch: str, tied: bool) -> dict:
    n_tok = cfg["vocab_size"]
    return {**cfg, "architectures": [{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}[arch]],
            "model_type": arch, "tie_word_embeddings": tied, "hidden_act": "silu",
            "attention_bias": arch == "qwen2", "bos_token_id": n_tok - 2, "eos_token_id": n_tok - 1,
            "pad_token_id": None, "rope_scaling": None, "torch_dtype": "float32"}


def write_hf(folder: Path, *, arch: str = "llama", tied: bool = True, seed: int = 0, sharded: bool = False,
             dtype: str = "float32", add_bos: bool = False, **overrides) -> Path:
    """A tiny HF folder; returns it. `sharded` splits the weights over two files with an index. add_bos: a
    Llama-2/Gemma-style tokenizer whose config and post-processor put BOS in front of every encoded text."""
    from safetensors.numpy import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    cfg = {**TINY, **overrides}
    weights = {k: v.astype(dtype) for k, v in hf_weights(cfg, arch=arch, tied=tied, seed=seed).items()}
    (folder / "config.json").write_text(json.dumps(hf_config(cfg, arch, tied), indent=1))
    if sharded:
        names = list(weights)
        halves = [names[: len(names) // 2], names[len(names) // 2:]]
        wm = {}
        for j, part in enumerate(halves):
            fname = f"model-0000{j + 1}-of-00002.safetensors"
            save_file({k: weights[k] for k in part}, str(folder / fname))
            wm.update({k: fname for k in part})
        (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    else:
        save_file(weights, str(folder / "model.safetensors"))
    tok = tiny_tokenizer_json(cfg["vocab_size"])
    if add_bos:
        bos = cfg["vocab_size"] - 2  # <|im_start|> (hf_config's bos_token_id)
        tok["post_processor"] = {"type": "TemplateProcessing",
                                 "single": [{"SpecialToken": {"id": "<|im_start|>", "type_id": 0}},
                                            {"Sequence": {"id": "A", "type_id": 0}}],
                                 "pair": [{"SpecialToken": {"id": "<|im_start|>", "type_id": 0}},
                                          {"Sequence": {"id": "A", "type_id": 0}},
                                          {"Sequence": {"id": "B", "type_id": 1}}],
                                 "special_tokens": {"<|im_start|>": {"id": "<|im_start|>", "ids": [bos],
                                                                     "tokens": ["<|im_start|>"]}}}
    (folder / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "unk_token": "<|endoftext|>", "pad_token": None,
        "add_bos_token": add_bos, "add_eos_token": False, "chat_template": CHATML}))
    return folder


# ----------------------------------------------------------------------------------------------------------
# GGUF


def llamacpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF half-split rows -> llama.cpp adjacent-pair rows (what its converter does to Q and K)."""
    n = w.shape[0]
    return w.reshape(n_head, 2, n // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# GGUF types gguf-py reads but cannot write: blocks laid out here from ggml's block structs (ggml-common.h), with
# the codes and scales of webinfer's own encoder (quant.quantize), so transformers, which dequantizes the file
# with gguf-py, is an independent check of both the layout and the packer's repack
LOW_BIT = {"Q2_K": "q2k", "Q3_K": "q3k", "IQ4_NL": "iq4nl", "IQ4_XS": "iq4xs"}


def gguf_blocks(type_name: str, w: np.ndarray) -> np.ndarray:
    """float [N, K] -> uint8 [N, row bytes] of GGUF `type_name` blocks (one of LOW_BIT)."""
    from webinfer.formats import FORMATS
    from webinfer_packager.pack import quant

    dtype = LOW_BIT[type_name]
    n, k = w.shape
    f = quant._unpack(dtype, quant.quantize(dtype, w), n, k, FORMATS[dtype].fixed_group)
    q = f["q"].reshape(n, -1, 256 if type_name != "IQ4_NL" else 32)
    nb = q.shape[1]

    def f16(x):
        return np.ascontiguousarray(x, "<f2").view(np.uint8).reshape(n, nb, 2)

    def shifted(parts, shifts):  # sum of parts[j] << shifts[j] as one byte
        return sum((p.astype(np.uint8) << np.uint8(s)) for p, s in zip(parts, shifts)).astype(np.uint8)

    if type_name == "IQ4_NL":  # d, qs[16]: element i low nibble of qs[i], element 16 + i its high nibble
        return np.concatenate([f16(f["scale"]), shifted([q[..., :16], q[..., 16:]], [0, 4])], -1).reshape(n, -1)
    if type_name == "IQ4_XS":  # d, scales_h (u16), scales_l[4], qs[128]: 8 sub-blocks of 32 like IQ4_NL's
        ls = (f["scale"].reshape(n, nb, 8).astype(np.int16) + 32).astype(np.uint16)
        sh = ((ls >> 4) << (2 * np.arange(8, dtype=np.uint16))).sum(-1).astype("<u2").view(np.uint8).reshape(n, nb, 2)
        sl = shifted([ls[..., 0::2] & 15, ls[..., 1::2] & 15], [0, 4])
        qs = q.reshape(n, nb, 8, 32)
        qs = shifted([qs[..., :16], qs[..., 16:]], [0, 4]).reshape(n, nb, 128)
        return np.concatenate([f16(f["d"]), sh, sl, qs], -1).reshape(n, -1)
    # Q2_K / Q3_K: the low 2 bits of element 128 h + 32 j + i are bits 2j of qs[32 h + i]
    q4 = q.reshape(n, nb, 2, 4, 32)
    qs = shifted([q4[..., j, :] & 3 for j in range(4)], [0, 2, 4, 6]).reshape(n, nb, 64)
    if type_name == "Q2_K":  # scales[16] (scale | min << 4), qs[64], d, dmin
        sc = shifted([f["scale"].reshape(n, nb, 16), f["min"].reshape(n, nb, 16)], [0, 4])
        return np.concatenate([sc, qs, f16(f["d"]), f16(f["dmin"])], -1).reshape(n, -1)
    # Q3_K: hmask[32] (bit j of hmask[i]: bit 2 of element 32 j + i), qs[64], 12 bytes of 6-bit scales, d
    q8 = q.reshape(n, nb, 8, 32)
    hm = shifted([(q8[..., j, :] >> 2) & 1 for j in range(8)], list(range(8)))
    s6 = (f["scale"].reshape(n, nb, 16).astype(np.int16) + 32).astype(np.uint8)
    lo = shifted([s6[..., :8] & 15, s6[..., 8:] & 15], [0, 4])
    hi = shifted([(s6[..., 4 * t:4 * t + 4] >> 4) & 3 for t in range(4)], [0, 2, 4, 6])
    return np.concatenate([hm, qs, lo, hi, f16(f["d"])], -1).reshape(n, -1)


def write_gguf(path: Path, *, types: dict | None = None, seed: int = 0, tied: bool = True, version: int = 3,
               rope_freqs=False, rope_dims: int | None = None, **overrides) -> Path:
    """A tiny llama GGUF. types: {"linear": "Q4_0"|"Q4_1"|"Q8_0"|"F32"|"F16"|a LOW_BIT type, "embed": ...,
    "norm": "F32"}, and per projection ("q", "k", "v", "o", "gate", "up", "down") to override "linear".
    rope_freqs: add Llama 3.1's per-frequency RoPE factors tensor (True: 1..8 spread over the frequencies, or
    the values to write). rope_dims: write llama.rope.dimension_count."""
    import gguf
    from gguf.quants import quantize

    path = Path(path)
    types = {"linear": "Q4_0", "embed": "Q8_0", "norm": "F32", **(types or {})}
    cfg = {**TINY, **overrides}
    w = hf_weights(cfg, arch="llama", tied=tied, seed=seed)
    tokens, merges = tiny_vocab(cfg["vocab_size"])
    n = len(tokens)
    wr = gguf.GGUFWriter(str(path), "llama")
    wr.add_name("tiny-llama")
    wr.add_block_count(cfg["num_hidden_layers"])
    wr.add_context_length(cfg["max_position_embeddings"])
    wr.add_embedding_length(cfg["hidden_size"])
    wr.add_feed_forward_length(cfg["intermediate_size"])
    wr.add_head_count(cfg["num_attention_heads"])
    wr.add_head_count_kv(cfg["num_key_value_heads"])
    wr.add_rope_freq_base(cfg["rope_theta"])
    if rope_dims is not None:
        wr.add_rope_dimension_count(rope_dims)
    wr.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    wr.add_vocab_size(cfg["vocab_size"])
    wr.add_tokenizer_model("gpt2")
    wr.add_tokenizer_pre("gpt2")
    wr.add_token_list(tokens)
    wr.add_token_merges([f"{a} {b}" for a, b in merges])
    wr.add_token_types([3 if t in SPECIALS else 1 for t in tokens])
    wr.add_bos_token_id(n - 2)
    wr.add_eos_token_id(n - 1)
    wr.add_add_bos_token(False)
    wr.add_chat_template(CHATML)

    def put(name, arr, kind):
        part = name.split(".")[-2].removeprefix("attn_").removeprefix("ffn_").replace("output", "o")
        t = types.get(part, types[kind]) if kind == "linear" else types[kind]
        qt = gguf.GGMLQuantizationType[t]
        if t == "F32":
            wr.add_tensor(name, arr.astype(np.float32))
        elif t == "F16":
            wr.add_tensor(name, arr.astype(np.float16))
        elif t in LOW_BIT:
            wr.add_tensor(name, gguf_blocks(t, arr.astype(np.float32)), raw_dtype=qt)
        else:
            wr.add_tensor(name, quantize(arr, qt), raw_dtype=qt)

    put("token_embd.weight", w["model.embed_tokens.weight"], "embed")
    for i in range(cfg["num_hidden_layers"]):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        put(b + "attn_norm.weight", w[p + "input_layernorm.weight"], "norm")
        put(b + "attn_q.weight", llamacpp_permute(w[p + "self_attn.q_proj.weight"], cfg["num_attention_heads"]), "linear")
        put(b + "attn_k.weight", llamacpp_permute(w[p + "self_attn.k_proj.weight"], cfg["num_key_value_heads"]), "linear")
        put(b + "attn_v.weight", w[p + "self_attn.v_proj.weight"], "linear")
        put(b + "attn_output.weight", w[p + "self_attn.o_proj.weight"], "linear")
        put(b + "ffn_norm.weight", w[p + "post_attention_layernorm.weight"], "norm")
        put(b + "ffn_gate.weight", w[p + "mlp.gate_proj.weight"], "linear")
        put(b + "ffn_up.weight", w[p + "mlp.up_proj.weight"], "linear")
        put(b + "ffn_down.weight", w[p + "mlp.down_proj.weight"], "linear")
    put("output_norm.weight", w["model.norm.weight"], "norm")
    if not tied:
        put("output.weight", w["lm_head.weight"], "embed")
    if rope_freqs is not False:
        hd = cfg["hidden_size"] // cfg["num_attention_heads"]
        factors = np.linspace(1.0, 8.0, hd // 2) if rope_freqs is True else rope_freqs
        wr.add_tensor("rope_freqs.weight", np.asarray(factors, dtype=np.float32))
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    if version != 3:  # GGUF v2 has the same layout for everything we write; only the version field differs
        with open(path, "r+b") as fh:
            fh.seek(4)
            fh.write(struct.pack("<I", version))
    return path


# ----------------------------------------------------------------------------------------------------------
# large model for the memory test


def write_large_synthetic_hf(folder: Path, gigabytes: float = 2.0, *, hidden: int = 2048, ffn: int = 5632,
                             vocab: int = 32000, seed: int = 0) -> Path:
    """An f16 llama HF folder of about `gigabytes`, written tensor by tensor in 16 MiB chunks (never held whole)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    heads = hidden // 64
    layer = 4 * hidden * hidden + 3 * hidden * ffn + 2 * hidden
    layers = max(1, round((gigabytes * 1e9 / 2 - vocab * hidden) / layer))
    cfg = dict(TINY, vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
               num_attention_heads=heads, num_key_value_heads=heads, head_dim=64, max_position_embeddings=2048)
    shapes = {"model.embed_tokens.weight": [vocab, hidden]}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": [hidden], p + "self_attn.q_proj.weight": [hidden, hidden],
                       p + "self_attn.k_proj.weight": [hidden, hidden], p + "self_attn.v_proj.weight": [hidden, hidden],
                       p + "self_attn.o_proj.weight": [hidden, hidden], p + "post_attention_layernorm.weight": [hidden],
                       p + "mlp.gate_proj.weight": [ffn, hidden], p + "mlp.up_proj.weight": [ffn, hidden],
                       p + "mlp.down_proj.weight": [hidden, ffn]})
    shapes["model.norm.weight"] = [hidden]
    header, off = {}, 0
    for k, s in shapes.items():
        nb = 2 * int(np.prod(s))
        header[k] = {"dtype": "F16", "shape": s, "data_offsets": [off, off + nb]}
        off += nb
    hb = json.dumps(header).encode()
    hb += b" " * (-len(hb) % 8)
    rng = np.random.default_rng(seed)
    chunk = 8 << 20  # f16 values per write
    with open(folder / "model.safetensors", "wb") as fh:
        fh.write(struct.pack("<Q", len(hb)) + hb)
        for k, s in shapes.items():
            left = int(np.prod(s))
            while left:
                m = min(chunk, left)
                # random mantissa and sign, exponent fixed near 2^-6: cheap bounded f16 values
                bits = (rng.integers(0, 1 << 16, m, dtype=np.uint16) & np.uint16(0x83FF)) | np.uint16(0x2400)
                fh.write(bits.tobytes())
                left -= m
    (folder / "config.json").write_text(json.dumps(hf_config(cfg, "llama", True)))
    (folder / "tokenizer.json").write_text(json.dumps(tiny_tokenizer_json(300), ensure_ascii=False))
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHATML, "eos_token": "<|im_end|>"}))
    return folder
