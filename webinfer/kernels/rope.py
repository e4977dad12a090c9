"""RoPE + KV cache write on the GPU (shaders/rope.wgsl).

Contract with the attention kernels (webinfer/kernels/attention.py): the qkv projection writes [T, q_dim + 2 kv_dim]
rows (q, k, v); this kernel rotates q in place (half-split pairs, Hugging Face `rotate_half`) and writes rotated k
and plain v of token t into cache slot `slot[t]` of this layer's K and V buffers, laid out
[num_blocks, block_size, n_kv_heads, head_dim], f32 (f16 with kv_f16=True, as attention's kv_f16). The host computes per step, for every fed token,
pos[t] and slot[t] = block_table[pos // block_size] * block_size + pos % block_size.
"""

from __future__ import annotations

import math
import struct

from .common import WG, ParamsFn, standalone_params


def inv_freq(head_dim: int, theta: float, scaling: dict | None = None) -> list[float]:
    """Per-pair inverse frequencies theta^(-2i/d), with llama3 scaling (Meta's llama 3.1 rule) when given;
    freq_factors (a GGUF's rope_freqs) and longrope (short factors: positions within the original context)
    divide each frequency by its own factor."""
    base = [1.0 / theta ** (2 * i / head_dim) for i in range(head_dim // 2)]
    if not scaling or scaling.get("rope_type", scaling.get("type")) in (None, "default"):
        return base
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "linear":
        return [f / float(scaling["factor"]) for f in base]
    if kind in ("freq_factors", "longrope"):
        factors = scaling["factors" if kind == "freq_factors" else "short_factor"]
        return [f / float(x) for f, x in zip(base, factors)]
    if kind != "llama3":
        from ..errors import FormatError

        raise FormatError("manifest.json", "config.rope_scaling.rope_type", f"is {kind!r}",
                          "null, linear, llama3, longrope or freq_factors")
    factor = float(scaling["factor"])
    lo, hi = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    old = float(scaling["original_max_position_embeddings"])
    lo_wave, hi_wave = old / lo, old / hi
    out = []
    for f in base:
        wave = 2 * math.pi / f
        if wave < hi_wave:
            out.append(f)
        elif wave > lo_wave:
            out.append(f / factor)
        else:
            smooth = (old / wave - lo) / (hi - lo)
            out.append((1 - smooth) * f / factor + smooth * f)
    return out


def attention_factor(scaling: dict | None) -> float:
    """LongRoPE scales cos and sin by its attention factor; 1 for every other kind."""
    return float(scaling["attention_factor"]) if scaling and scaling.get("rope_type") == "longrope" else 1.0


def rope_table(head_dim: int, theta: float, scaling: dict | None = None) -> bytes:
    """The table the attention decode kernel reads under rope=True: (mscale, 0, 0, 0), then inv_freq (f32)."""
    return struct.pack(f"<4f{head_dim // 2}f", attention_factor(scaling), 0, 0, 0, *inv_freq(head_dim, theta, scaling))


class Rope:
    """RoPE of q and k in place + the K/V cache write for rows [0, step[count_index]) of the fused qkv rows, or
    with start_index for rows step[start_index] + [0, step[count_index]) (the prefill rows, when the attention
    decode kernel ropes the decode rows itself)."""

    def __init__(self, lib, n_heads: int, n_kv_heads: int, head_dim: int, qkv, qkv_stride: int, k_cache, v_cache,
                 pos, slot, inv_freq_buf, step, count_index: int = 0, params: ParamsFn | None = None,
                 label: str = "rope", kv_f16: bool = False, mscale: float = 1.0, start_index: int | None = None):
        if head_dim % 2:
            raise ValueError(f"Rope: head_dim {head_dim} must be even")
        if kv_f16 and not lib.device.caps.f16:
            raise ValueError("Rope: kv_f16 needs a device with shader-f16")
        self.pairs = (n_heads + n_kv_heads) * head_dim // 2
        self.label = label
        defines: dict[str, object] = {"WG": WG}
        if kv_f16:
            defines["KV_F16"] = 1
        self.pipeline = lib.pipeline("rope", defines=defines, use_f16=kv_f16)
        u = (params or standalone_params(lib.device))(
            struct.pack("<5If2I", n_heads, n_kv_heads, head_dim, qkv_stride, count_index, float(mscale),
                        start_index or 0, start_index is not None))
        self.bind_group = lib.device.create_bind_group(
            self.pipeline, [qkv, k_cache, v_cache, u, step, pos, slot, inv_freq_buf])

    def encode(self, cmds, rows: int) -> None:
        if rows > 0:
            cmds.dispatch(self.pipeline, self.bind_group, -(-self.pairs // WG), rows, 1, self.label)
