"""The numpy reference model: the oracle every GPU kernel is tested against.

Readable top to bottom: Config -> Weights (dequantized from a package) -> neural net blocks -> the model with its
KV cache -> Sampler -> generate. Everything is float32 and explicit; nothing here is tuned for speed beyond using
matrix products. Supports the architectures the package format knows: llama, mistral (same math), qwen2
(q/k/v biases), qwen3 (per-head q/k RMSNorm), phi3 (LongRoPE), gemma2 / gemma3 (GeGLU, sandwich norms, embedding
scale, query pre-attention scalar, sliding-window layers, logit soft-capping, a second RoPE base for local layers).
RoPE is half-split (Hugging Face `rotate_half`), as the package format normalises it; norm weights are
multiplicative (Gemma's `1 + w` is folded in at pack time).

    from webinfer_packager.reference.model import ReferenceModel, Sampler, generate
    model = ReferenceModel.from_package("path/to/package")
    ids = generate(model, prompt_ids, max_tokens=32, sampler=Sampler(temperature=0.0))

CPython tooling only (numpy): never import this from webinfer/ (it runs in Pyodide, without numpy).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from webinfer.errors import ContextOverflowError, FormatError, UnsupportedArchitectureError

SUPPORTED_ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "phi3")


# ----------------------------------------------------------------------------------------------------------------
# Config: the blueprint of the model (from the package's ModelConfig, or a plain dict with the manifest's keys)


@dataclass
class Config:
    architecture: str
    vocab_size: int
    hidden_size: int            # D
    intermediate_size: int      # F
    num_hidden_layers: int      # L
    num_attention_heads: int    # H
    num_key_value_heads: int    # Hkv (GQA: H % Hkv == 0)
    head_dim: int               # hd
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None = None   # linear | llama3 | longrope | freq_factors (docs/package-format.md)
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = True
    attention_bias: bool = False
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    activation: str = "silu"                   # silu (SwiGLU) | gelu_tanh (GeGLU)
    qk_norm: bool = False                      # RMSNorm over each q and k head before RoPE
    post_norms: bool = False                   # RMSNorm of the attention / MLP output before the residual add
    embedding_multiplier: float = 1.0          # x = embed[ids] * this
    query_pre_attn_scalar: float | None = None  # scores scaled by 1/sqrt(this) (default head_dim)
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None
    sliding_window: int | None = None          # W: a sliding layer's query at p sees keys k with p - k < W
    layer_types: list[str] | None = None       # per layer "full_attention" | "sliding_attention"
    rope_local_theta: float | None = None      # sliding layers' RoPE base, unscaled (Gemma 3)

    def is_sliding(self, layer: int) -> bool:
        return self.layer_types is not None and self.layer_types[layer] == "sliding_attention"

    @classmethod
    def from_any(cls, c: Any) -> "Config":
        """From the package's ModelConfig (attributes) or the manifest's config dict (keys)."""
        get = (lambda k, d=None: c.get(k, d)) if isinstance(c, dict) else (lambda k, d=None: getattr(c, k, d))
        # a missing or null optional field keeps its default; a missing required one is a FormatError below
        kw = {name: get(name) for name in cls.__dataclass_fields__ if get(name) is not None}
        try:
            cfg = cls(**kw)
        except TypeError as e:
            raise FormatError("manifest.json", "config", str(e), "every field of docs/package-format.md") from None
        cfg.eos_token_ids = list(cfg.eos_token_ids or [])
        if cfg.architecture not in SUPPORTED_ARCHITECTURES:
            raise UnsupportedArchitectureError("manifest.json", "config.architecture", repr(cfg.architecture),
                                               " / ".join(SUPPORTED_ARCHITECTURES))
        if cfg.num_attention_heads % cfg.num_key_value_heads:
            raise FormatError("manifest.json", "config.num_key_value_heads",
                              f"{cfg.num_key_value_heads} does not divide num_attention_heads={cfg.num_attention_heads}")
        return cfg


# ----------------------------------------------------------------------------------------------------------------
# Weights: every tensor dequantized to float32 once (SmolLM2-135M is ~540 MB as f32: fine for an oracle)


@dataclass
class LayerWeights:
    attn_norm: np.ndarray        # [D]
    q: np.ndarray                # [H*hd, D]
    k: np.ndarray                # [Hkv*hd, D]
    v: np.ndarray                # [Hkv*hd, D]
    o: np.ndarray                # [D, H*hd]
    ffn_norm: np.ndarray         # [D]
    gate: np.ndarray             # [F, D]
    up: np.ndarray               # [F, D]
    down: np.ndarray             # [D, F]
    q_bias: np.ndarray | None = None   # [H*hd]   (qwen2)
    k_bias: np.ndarray | None = None   # [Hkv*hd] (qwen2)
    v_bias: np.ndarray | None = None   # [Hkv*hd] (qwen2)
    q_norm: np.ndarray | None = None   # [hd]     (qk_norm)
    k_norm: np.ndarray | None = None   # [hd]     (qk_norm)
    post_attn_norm: np.ndarray | None = None   # [D] (post_norms)
    post_ffn_norm: np.ndarray | None = None    # [D] (post_norms)


@dataclass
class Weights:
    embed: np.ndarray            # [V, D]
    layers: list[LayerWeights]
    norm: np.ndarray             # [D]
    lm_head: np.ndarray | None   # [V, D], None when tied to embed

    @property
    def output(self) -> np.ndarray:  # [V, D]
        return self.embed if self.lm_head is None else self.lm_head


def read_tensor(package: Any, name: str) -> np.ndarray:
    """One tensor of a package as float32 in its logical shape ([N] or [N, K]); every binding's rows, in order."""
    from webinfer_packager.pack.quant import dequantize

    info = package.tensors[name]
    components = {c: b"".join(package.read_component(name, c, b) for b in range(len(info.bindings)))
                  for c in info.components}
    out = dequantize(info.dtype, components, list(info.shape), info.group_size, info.k_padded)
    return np.ascontiguousarray(out, dtype=np.float32)


def load_weights(package: Any, cfg: Config) -> Weights:
    get = lambda name: read_tensor(package, name)  # noqa: E731
    layers = []
    for i in range(cfg.num_hidden_layers):
        p = f"layers.{i}."
        lw = LayerWeights(attn_norm=get(p + "attn_norm"), q=get(p + "q"), k=get(p + "k"), v=get(p + "v"), o=get(p + "o"),
                          ffn_norm=get(p + "ffn_norm"), gate=get(p + "gate"), up=get(p + "up"), down=get(p + "down"))
        if cfg.attention_bias:
            lw.q_bias, lw.k_bias, lw.v_bias = get(p + "q_bias"), get(p + "k_bias"), get(p + "v_bias")
        if cfg.qk_norm:
            lw.q_norm, lw.k_norm = get(p + "q_norm"), get(p + "k_norm")
        if cfg.post_norms:
            lw.post_attn_norm, lw.post_ffn_norm = get(p + "post_attn_norm"), get(p + "post_ffn_norm")
        layers.append(lw)
    lm_head = None if cfg.tie_word_embeddings else get("lm_head")
    return Weights(embed=get("embed"), layers=layers, norm=get("norm"), lm_head=lm_head)


# ----------------------------------------------------------------------------------------------------------------
# neural net blocks: small pure functions that kernel tests call directly


def rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """x [..., D], w [D] -> [..., D]: x / sqrt(mean(x^2) + eps) * w."""
    x = x.astype(np.float32)
    ms = np.mean(x * x, axis=-1, keepdims=True)           # [..., 1]
    return (x / np.sqrt(ms + np.float32(eps))) * w


def rope_inv_freq(theta: float, head_dim: int, scaling: dict | None = None) -> np.ndarray:
    """Rotation frequency of each pair [hd/2]; llama3 scaling slows the low frequencies down (long context);
    freq_factors (a GGUF's rope_freqs tensor) and longrope (short_factor, within the original context) divide
    each frequency by its own factor."""
    inv_freq = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))   # [hd/2]
    if not scaling:
        return inv_freq.astype(np.float32)
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "linear":
        return (inv_freq / scaling["factor"]).astype(np.float32)
    if kind == "freq_factors":
        return (inv_freq / np.asarray(scaling["factors"], np.float64)).astype(np.float32)
    if kind == "longrope":
        return (inv_freq / np.asarray(scaling["short_factor"], np.float64)).astype(np.float32)
    if kind != "llama3":
        raise FormatError("manifest.json", "config.rope_scaling.rope_type", repr(kind),
                          "null, linear, llama3, longrope or freq_factors")
    factor, lo, hi = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_ctx = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq                                     # [hd/2]
    # long wavelengths (beyond old_ctx / lo) are slowed by `factor`, short ones (below old_ctx / hi) kept as they
    # are, and the band between interpolates linearly in old_ctx / wavelen.
    smooth = np.clip((old_ctx / wavelen - lo) / (hi - lo), 0.0, 1.0)   # [hd/2], 0 = fully scaled, 1 = untouched
    return ((1 - smooth) * inv_freq / factor + smooth * inv_freq).astype(np.float32)


def rope_attention_factor(scaling: dict | None) -> float:
    """LongRoPE multiplies cos and sin by this (so every score by its square); 1 for the other kinds."""
    return float(scaling["attention_factor"]) if scaling and scaling.get("rope_type") == "longrope" else 1.0


def rope(x: np.ndarray, positions: np.ndarray, theta: float, head_dim: int, scaling: dict | None = None) -> np.ndarray:
    """Half-split rotary embedding. x [T, nh, hd], positions [T] -> [T, nh, hd].

    Element i pairs with element i + hd/2 (Hugging Face rotate_half), rotated by angle pos * inv_freq[i].
    """
    half = head_dim // 2
    angles = np.asarray(positions, dtype=np.float32)[:, None] * rope_inv_freq(theta, head_dim, scaling)[None, :]  # [T, hd/2]
    m = np.float32(rope_attention_factor(scaling))
    cos, sin = np.cos(angles)[:, None, :] * m, np.sin(angles)[:, None, :] * m   # [T, 1, hd/2]
    x1, x2 = x[..., :half], x[..., half:]                                # [T, nh, hd/2] each
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(np.float32)


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Numerically safe softmax: subtract the max first so exp never overflows."""
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def softcap(x: np.ndarray, cap: float | None) -> np.ndarray:
    """cap * tanh(x / cap): squashes logits smoothly into (-cap, cap) (Gemma 2); identity when cap is None."""
    return x if cap is None else (np.float32(cap) * np.tanh(x / np.float32(cap))).astype(np.float32)


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, q_positions: np.ndarray, *, scale: float | None = None,
              window: int | None = None, cap: float | None = None) -> np.ndarray:
    """Causal grouped-query attention.

    q [T, H, hd] at absolute positions q_positions [T]; k, v [S, Hkv, hd] for positions 0..S-1 -> out [T, H, hd].
    Query head h reads kv head h // (H / Hkv). A query at position p sees keys at positions k <= p, and with a
    sliding window W only those with p - k < W. Scores are q.k * scale (default 1/sqrt(hd)), soft-capped by cap.
    """
    T, H, hd = q.shape
    S, Hkv, _ = k.shape
    group = H // Hkv
    kk = np.repeat(k, group, axis=1).transpose(1, 2, 0)                 # [H, hd, S]
    vv = np.repeat(v, group, axis=1).transpose(1, 0, 2)                 # [H, S, hd]
    scale = np.float32(1.0 / math.sqrt(hd) if scale is None else scale)
    scores = softcap((q.transpose(1, 0, 2) @ kk) * scale, cap)         # [H, T, S]
    qp = np.asarray(q_positions)[:, None]                               # [T, 1]
    visible = np.arange(S)[None, :] <= qp                               # [T, S]
    if window is not None:
        visible &= qp - np.arange(S)[None, :] < window
    scores = np.where(visible[None], scores, -np.inf)
    return (softmax(scores, axis=-1) @ vv).transpose(1, 0, 2).astype(np.float32)  # [T, H, hd]


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def swiglu(g: np.ndarray, u: np.ndarray) -> np.ndarray:
    """g, u [..., F] -> silu(g) * u [..., F]."""
    return (silu(g) * u).astype(np.float32)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU, tanh approximation (PyTorch gelu(approximate='tanh'), Gemma's gelu_pytorch_tanh)."""
    return 0.5 * x * (1.0 + np.tanh(np.float32(math.sqrt(2.0 / math.pi)) * (x + np.float32(0.044715) * x ** 3)))


def geglu(g: np.ndarray, u: np.ndarray) -> np.ndarray:
    """g, u [..., F] -> gelu_tanh(g) * u [..., F]."""
    return (gelu_tanh(g) * u).astype(np.float32)


# ----------------------------------------------------------------------------------------------------------------
# the model: embed -> L x (attention block, MLP block) -> norm -> logits, with a KV cache kept inside


class ReferenceModel:
    def __init__(self, cfg: Config, weights: Weights, max_seq_len: int | None = None):
        self.cfg, self.w = cfg, weights
        self.max_seq_len = max_seq_len or cfg.max_position_embeddings
        self.reset()

    @classmethod
    def from_package(cls, package: Any, max_seq_len: int | None = None) -> "ReferenceModel":
        """From a package folder (path) or an opened webinfer.package.Package."""
        if isinstance(package, (str, Path)):
            from webinfer.package import Package

            package = Package.open(package)
        cfg = Config.from_any(package.config)
        return cls(cfg, load_weights(package, cfg), max_seq_len)

    def reset(self) -> None:
        """Forget the conversation: the next forward must start at position 0."""
        self.k_cache: list[np.ndarray] = [np.zeros((0, self.cfg.num_key_value_heads, self.cfg.head_dim), np.float32)
                                          for _ in range(self.cfg.num_hidden_layers)]   # L x [S, Hkv, hd]
        self.v_cache: list[np.ndarray] = [c.copy() for c in self.k_cache]             # L x [S, Hkv, hd]

    @property
    def n_cached(self) -> int:
        return self.k_cache[0].shape[0]

    def hidden(self, token_ids: list[int], start_pos: int) -> np.ndarray:
        """Final-normed hidden states [T, D] for token_ids at positions start_pos.. (appends to the KV cache)."""
        c, T = self.cfg, len(token_ids)
        if start_pos != self.n_cached:
            # the cache holds positions 0..n_cached-1; anything else would silently mix two conversations
            raise ValueError(f"start_pos={start_pos} but the KV cache holds {self.n_cached} positions; call reset()")
        if start_pos + T > self.max_seq_len:
            raise ContextOverflowError(start_pos + T, self.max_seq_len)
        H, Hkv, hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        eps = c.rms_norm_eps
        positions = np.arange(start_pos, start_pos + T)                   # [T]
        x = self.w.embed[np.asarray(token_ids, dtype=np.int64)]           # [T, D]
        if c.embedding_multiplier != 1.0:
            x = x * np.float32(c.embedding_multiplier)                    # Gemma: sqrt(D), rounded to f32 as HF does
        act = geglu if c.activation == "gelu_tanh" else swiglu
        scale = None if c.query_pre_attn_scalar is None else c.query_pre_attn_scalar ** -0.5
        for i, lw in enumerate(self.w.layers):
            sliding = c.is_sliding(i)
            theta, scaling = c.rope_theta, c.rope_scaling
            if sliding and c.rope_local_theta is not None:
                theta, scaling = c.rope_local_theta, None                 # Gemma 3 local layers
            # attention block
            h = rmsnorm(x, lw.attn_norm, eps)                             # [T, D]
            q, k, v = h @ lw.q.T, h @ lw.k.T, h @ lw.v.T                  # [T, H*hd], [T, Hkv*hd] x2
            if lw.q_bias is not None:
                q, k, v = q + lw.q_bias, k + lw.k_bias, v + lw.v_bias
            q, k = q.reshape(T, H, hd), k.reshape(T, Hkv, hd)
            if lw.q_norm is not None:                                     # per head, over hd
                q, k = rmsnorm(q, lw.q_norm, eps), rmsnorm(k, lw.k_norm, eps)
            q = rope(q, positions, theta, hd, scaling)                    # [T, H, hd]
            k = rope(k, positions, theta, hd, scaling)                    # [T, Hkv, hd]
            self.k_cache[i] = np.concatenate([self.k_cache[i], k])        # [S, Hkv, hd]
            self.v_cache[i] = np.concatenate([self.v_cache[i], v.reshape(T, Hkv, hd)])
            att = attention(q, self.k_cache[i], self.v_cache[i], positions, scale=scale,
                            window=c.sliding_window if sliding else None, cap=c.attn_logit_softcapping)  # [T, H, hd]
            out = att.reshape(T, H * hd) @ lw.o.T                         # [T, D]
            if lw.post_attn_norm is not None:
                out = rmsnorm(out, lw.post_attn_norm, eps)
            x = x + out                                                   # [T, D]
            # MLP block
            h = rmsnorm(x, lw.ffn_norm, eps)                              # [T, D]
            out = act(h @ lw.gate.T, h @ lw.up.T) @ lw.down.T             # [T, D]
            if lw.post_ffn_norm is not None:
                out = rmsnorm(out, lw.post_ffn_norm, eps)
            x = x + out                                                   # [T, D]
        return rmsnorm(x, self.w.norm, eps)                               # [T, D]

    def logits(self, h: np.ndarray) -> np.ndarray:
        """h [T, D] -> logits [T, V] (soft-capped where the model asks for it)."""
        return softcap((h @ self.w.output.T).astype(np.float32), self.cfg.final_logit_softcapping)

    def forward(self, token_ids: list[int], start_pos: int) -> np.ndarray:
        """Logits [T, V] for every token (T > 1 is a causal prefill). The KV cache grows by T."""
        return self.logits(self.hidden(token_ids, start_pos))


# ----------------------------------------------------------------------------------------------------------------
# the Sampler: temperature -> top-k -> top-p -> sample (temperature 0 = argmax, lowest id on ties)


class Sampler:
    """The reference sampler: the GPU sampler (shaders/sample.wgsl) draws from exactly this distribution.

    process(): repetition_penalty (tokens of the prompt or the output: l / rep if l > 0 else l * rep), then
    frequency / presence penalties (l - freq * count - pres * [count > 0], output counts only), then logit_bias,
    then the allowed-token mask (-inf elsewhere). probs(): temperature, min_p (keep p >= min_p * p_max), top-k,
    top-p, on processed logits. logprobs(): log-softmax of processed logits (no temperature) and the top n.
    """

    def __init__(self, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0, *,
                 min_p: float = 0.0, frequency_penalty: float = 0.0, presence_penalty: float = 0.0,
                 repetition_penalty: float = 1.0, logit_bias: dict[int, float] | None = None):
        if temperature < 0 or top_k < 0 or not (0.0 < top_p <= 1.0):
            raise ValueError(f"need temperature >= 0, top_k >= 0, 0 < top_p <= 1; got {temperature}, {top_k}, {top_p}")
        if not 0.0 <= min_p <= 1.0 or repetition_penalty <= 0:
            raise ValueError(f"need 0 <= min_p <= 1 and repetition_penalty > 0; got {min_p}, {repetition_penalty}")
        self.temperature, self.top_k, self.top_p, self.min_p = temperature, top_k, top_p, min_p
        self.frequency_penalty, self.presence_penalty = frequency_penalty, presence_penalty
        self.repetition_penalty, self.logit_bias = repetition_penalty, dict(logit_bias or {})
        self.rng = np.random.default_rng(seed)

    def process(self, logits: np.ndarray, output_counts: np.ndarray | None = None, prompt_ids=(),
                allowed: np.ndarray | None = None) -> np.ndarray:
        """Logits [V] after penalties, bias and the mask (float64). output_counts [V]: times each token was sampled;
        allowed [V] bool (None: all)."""
        z = logits.astype(np.float64).copy()                              # [V]
        counts = np.zeros(z.size) if output_counts is None else np.asarray(output_counts, np.float64)
        if self.repetition_penalty != 1.0:
            seen = counts > 0
            seen[[t for t in prompt_ids if 0 <= t < z.size]] = True
            z[seen] = np.where(z[seen] > 0, z[seen] / self.repetition_penalty, z[seen] * self.repetition_penalty)
        z -= counts * self.frequency_penalty + (counts > 0) * self.presence_penalty
        for t, b in self.logit_bias.items():
            z[t] += b
        if allowed is not None:
            z[~np.asarray(allowed, bool)] = -np.inf
        return z

    def probs(self, logits: np.ndarray) -> np.ndarray:
        """The distribution sample() draws from [V] (after temperature, min_p, top-k and top-p); temperature > 0 only.
        `logits` are processed ones (process())."""
        z = logits.astype(np.float64) / self.temperature                  # [V]
        if self.min_p > 0.0:
            z = np.where(z >= z.max() + np.log(self.min_p), z, -np.inf)
        # order by descending logit, ties by ascending id, so the kept set never depends on sort instability
        order = np.lexsort((np.arange(z.size), -z))                       # [V]
        if self.top_k:
            order = order[: self.top_k]
        p = softmax(z[order])                                             # [k], descending
        if self.top_p < 1.0:
            # keep the smallest prefix whose mass reaches top_p (at least one token)
            keep = int(np.searchsorted(np.cumsum(p), self.top_p)) + 1
            order, p = order[:keep], p[:keep] / p[:keep].sum()
        out = np.zeros_like(z)
        out[order] = p
        return out

    def sample(self, logits: np.ndarray, **context) -> int:
        """logits [V] -> one token id; context: process()'s output_counts, prompt_ids, allowed."""
        z = self.process(logits, **context)
        if self.temperature == 0.0:
            return int(np.argmax(z))        # np.argmax returns the first (lowest) id among equal maxima
        p = self.probs(z)
        cdf = np.cumsum(p)
        return int(min(np.searchsorted(cdf, self.rng.random() * cdf[-1], side="right"), p.size - 1))

    @staticmethod
    def logprobs(processed: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(log-softmax [V] of processed logits, the n best ids: logit descending, id ascending)."""
        z = processed.astype(np.float64)
        m = z.max()
        lsm = z - (m + np.log(np.exp(z - m).sum()))
        return lsm, np.lexsort((np.arange(z.size), -z))[:n]

    @staticmethod
    def rank(processed: np.ndarray, t: int) -> int:
        """Token t's 1-based place in the order of logprobs(): logit descending, id ascending."""
        z = processed
        return int(1 + (z > z[t]).sum() + (z[:t] == z[t]).sum())


# ----------------------------------------------------------------------------------------------------------------
# utilities: BLAS threads


def limit_blas_threads(n: int = 1) -> int | None:
    """Set numpy's OpenBLAS thread count; returns the previous count, or None when it cannot be changed.

    Why: decoding is one matrix-vector product after another, and on a small shared machine OpenBLAS threads spin
    waiting for each other: measured 0.5 tok/s with the default threads vs 5 tok/s with one thread on 2 busy cores.
    Best effort through ctypes (numpy wheels bundle scipy-openblas); OPENBLAS_NUM_THREADS=1 does the same at start.
    """
    import ctypes
    import glob
    import os

    libs = glob.glob(os.path.join(os.path.dirname(np.__file__), os.pardir, "numpy.libs", "libscipy_openblas*"))
    for path in libs:
        lib = ctypes.CDLL(path)
        for prefix in ("scipy_openblas", "openblas"):
            get, set_ = getattr(lib, prefix + "_get_num_threads64_", None), getattr(lib, prefix + "_set_num_threads64_", None)
            if get is not None and set_ is not None:
                old = int(get())
                set_(ctypes.c_int(n))
                return old
    return None


# ----------------------------------------------------------------------------------------------------------------
# generation loop


def generate(model: ReferenceModel, prompt_ids: list[int], max_tokens: int, sampler: Sampler,
             eos_ids: list[int] | tuple[int, ...] = (), on_token: Callable[[int], None] | None = None) -> list[int]:
    """Prefill the prompt, then decode one token at a time until an EOS id (included) or max_tokens."""
    if not prompt_ids:
        raise ValueError("the prompt is empty: give at least one token (e.g. BOS)")
    model.reset()
    out: list[int] = []
    logits = model.forward(list(prompt_ids), 0)[-1]                       # [V]
    while len(out) < max_tokens:
        tok = sampler.sample(logits)
        out.append(tok)
        if on_token:
            on_token(tok)
        if tok in eos_ids or len(out) == max_tokens:
            break
        logits = model.forward([tok], len(prompt_ids) + len(out) - 1)[-1]
    return out
