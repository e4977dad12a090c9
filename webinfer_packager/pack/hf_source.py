"""Reading a Hugging Face folder (config.json, *.safetensors [+ model.safetensors.index.json], tokenizer.json,
tokenizer_config.json) as a pack source.

Safetensors headers are validated here before any data is touched (header length, JSON, dtype known, shape,
offsets in bounds, sized right and non-overlapping), then tensor rows are read in chunks with pread. We read
the file ourselves rather than through `safe_open(framework="numpy")` because numpy has no bfloat16 (safe_open
refuses BF16 tensors) and because mmap'd pages count towards resident memory; BF16 is widened by a 16-bit shift.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import numpy as np

from webinfer.errors import FormatError, UnsupportedArchitectureError
from webinfer.package import SUPPORTED_ARCHITECTURES

ST_DTYPES = {"F32": ("<f4", 4), "F16": ("<f2", 2), "BF16": ("<u2", 2)}
MAX_HEADER = 100 << 20  # the safetensors library's own limit
_ARCH = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "Qwen2ForCausalLM": "qwen2",
         "Qwen3ForCausalLM": "qwen3", "Gemma2ForCausalLM": "gemma2", "Gemma3ForCausalLM": "gemma3",
         "Phi3ForCausalLM": "phi3"}
_MODEL_TYPES = {"gemma3_text": "gemma3"}
_ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh"}
GEMMA = ("gemma2", "gemma3")

# canonical per-layer name -> the Hugging Face name (after "model.layers.{i}."); Gemma's norms sit differently
_HF_LAYER = {"attn_norm": "input_layernorm.weight", "ffn_norm": "post_attention_layernorm.weight",
             "q": "self_attn.q_proj.weight", "k": "self_attn.k_proj.weight", "v": "self_attn.v_proj.weight",
             "o": "self_attn.o_proj.weight", "q_bias": "self_attn.q_proj.bias", "k_bias": "self_attn.k_proj.bias",
             "v_bias": "self_attn.v_proj.bias", "q_norm": "self_attn.q_norm.weight", "k_norm": "self_attn.k_norm.weight",
             "gate": "mlp.gate_proj.weight", "up": "mlp.up_proj.weight", "down": "mlp.down_proj.weight"}
_HF_LAYER_GEMMA = {**_HF_LAYER, "post_attn_norm": "post_attention_layernorm.weight",
                   "ffn_norm": "pre_feedforward_layernorm.weight", "post_ffn_norm": "post_feedforward_layernorm.weight"}


def hf_tensor_name(arch: str, cfg: dict, canonical: str) -> tuple[str, tuple[int, int] | None, float]:
    """(Hugging Face tensor name, row range inside it or None, offset added to the values) of a canonical tensor.

    Phi-3 stores q/k/v as one qkv_proj and gate/up as one gate_up_proj (gate first): each canonical tensor is a
    row range of those. Gemma's RMSNorm multiplies by (1 + w): the package stores 1 + w (as llama.cpp's GGUFs do),
    so the runtime has one norm."""
    if canonical in ("embed", "norm", "lm_head"):
        name = {"embed": "model.embed_tokens.weight", "norm": "model.norm.weight", "lm_head": "lm_head.weight"}[canonical]
        return name, None, 1.0 if canonical == "norm" and arch in GEMMA else 0.0
    _, i, part = canonical.split(".", 2)
    p = f"model.layers.{i}."
    if arch == "phi3" and part in ("q", "k", "v"):
        q, kv = cfg["num_attention_heads"] * cfg["head_dim"], cfg["num_key_value_heads"] * cfg["head_dim"]
        r0 = {"q": 0, "k": q, "v": q + kv}[part]
        return p + "self_attn.qkv_proj.weight", (r0, r0 + (q if part == "q" else kv)), 0.0
    if arch == "phi3" and part in ("gate", "up"):
        f = cfg["intermediate_size"]
        return p + "mlp.gate_up_proj.weight", (0, f) if part == "gate" else (f, 2 * f), 0.0
    name = (_HF_LAYER_GEMMA if arch in GEMMA else _HF_LAYER)[part]
    return p + name, None, 1.0 if arch in GEMMA and part.endswith("norm") else 0.0


def validate_safetensors_header(path: Path | str, head: bytes, file_size: int) -> tuple[int, dict]:
    """(data_start, {name: (dtype, shape, begin, end)}) from a file's first bytes. Raises only FormatError."""
    path = str(path)
    if len(head) < 8 or file_size < 8:
        raise FormatError(path, "header length", f"the file has only {file_size} bytes", "an 8-byte header length")
    (n,) = struct.unpack_from("<Q", head, 0)
    if n < 2 or n > MAX_HEADER or 8 + n > file_size:
        raise FormatError(path, "header length", f"is {n} for a file of {file_size} bytes",
                          f"2..{min(MAX_HEADER, file_size - 8)}")
    if len(head) < 8 + n:
        raise FormatError(path, "header", "is truncated")
    try:
        header = json.loads(bytes(head[8:8 + n]).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise FormatError(path, "header", f"is not valid JSON: {e}") from None
    if not isinstance(header, dict):
        raise FormatError(path, "header", f"is a {type(header).__name__}", "a JSON object")
    data_size = file_size - 8 - n
    out, spans = {}, []
    for name, e in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(e, dict):
            raise FormatError(path, name, "entry is not an object", "{dtype, shape, data_offsets}")
        dt = e.get("dtype")
        if dt not in ST_DTYPES:
            raise FormatError(path, f"{name}.dtype", f"is {dt!r}", "one of " + ", ".join(ST_DTYPES))
        shape = e.get("shape")
        if not isinstance(shape, list) or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0
                                                  for s in shape) or len(shape) > 4:
            raise FormatError(path, f"{name}.shape", f"is {shape!r}", "a list of non-negative integers")
        offs = e.get("data_offsets")
        if not (isinstance(offs, list) and len(offs) == 2 and all(isinstance(o, int) and not isinstance(o, bool)
                                                                 for o in offs)):
            raise FormatError(path, f"{name}.data_offsets", f"is {offs!r}", "[begin, end]")
        b, en = offs
        numel = 1
        for s in shape:
            numel *= s
        if not 0 <= b <= en <= data_size:
            raise FormatError(path, f"{name}.data_offsets", f"{offs} lie outside the data ({data_size} bytes)",
                              "offsets inside the file (truncated?)")
        if en - b != numel * ST_DTYPES[dt][1]:
            raise FormatError(path, f"{name}.data_offsets", f"span {en - b} bytes",
                              f"{numel * ST_DTYPES[dt][1]} bytes for {dt} {shape}")
        out[name] = (dt, shape, b, en)
        spans.append((b, en, name))
    spans.sort()
    for (b0, e0, n0), (b1, e1, n1) in zip(spans, spans[1:]):
        if b1 < e0:
            raise FormatError(path, f"{n1}.data_offsets", f"overlaps {n0}", "non-overlapping tensors")
    return 8 + n, out


class _HFTensor:
    """Rows read with pread into small buffers: file-backed mmap pages would count towards (and pile up in)
    the packer's resident memory, reads keep it bounded by one chunk."""

    def __init__(self, name, dt, shape, path: Path, begin: int, row0: int = 0, offset: float = 0.0):
        self.name, self.type_name, self.shape, self._path = name, dt, shape, path
        k = shape[1] if len(shape) == 2 else 1
        self._np, item = ST_DTYPES[dt]
        self._row = k * item
        self._begin = begin + row0 * self._row  # a row range of a fused tensor (Phi-3) starts further in
        self._offset = offset

    def _read(self, r0, r1):
        import os

        n = (r1 - r0) * self._row
        fd = os.open(self._path, os.O_RDONLY)
        try:
            data = os.pread(fd, n, self._begin + r0 * self._row)
        finally:
            os.close(fd)
        if len(data) != n:
            raise FormatError(self._path, self.name, "is truncated", f"{n} bytes at {self._begin + r0 * self._row}")
        return np.frombuffer(data, self._np).reshape(r1 - r0, -1)

    def float_rows(self, r0, r1):
        a = self._read(r0, r1)
        if self.type_name == "BF16":
            a = (a.astype(np.uint32) << np.uint32(16)).view(np.float32)
        a = a.astype(np.float32)
        # Gemma's (1 + w) computed in f32, as its RMSNorm does
        return a + np.float32(self._offset) if self._offset else a

    def raw_rows(self, r0, r1):
        raise NotImplementedError("HF tensors are never repacked")


class HFSource:
    kind = "hf"

    def __init__(self, folder: Path):
        self.path = Path(folder)
        self.name = self.default_name = self.path.name
        cfg_path = self.path / "config.json"
        from webinfer_packager.pack.tokenizer_convert import _read_json

        self.hf_config = _read_json(cfg_path)
        self.config = self._config(cfg_path)
        self.index: dict[str, tuple[Path, str, list, int, int, int]] = {}
        files = sorted(self.path.glob("*.safetensors"))
        idx_path = self.path / "model.safetensors.index.json"
        if idx_path.exists():
            wm = _read_json(idx_path).get("weight_map")
            if not isinstance(wm, dict) or not all(isinstance(v, str) for v in wm.values()):
                raise FormatError(idx_path, "weight_map", "missing or malformed", "{tensor: file}")
            files = sorted({self.path / v for v in wm.values()})
            for f in files:
                if not f.is_file() or f.parent != self.path:
                    raise FormatError(idx_path, "weight_map", f"names {f.name}, which does not exist in the folder")
        if not files:
            raise FormatError(self.path, "*.safetensors", "no safetensors files", "model.safetensors")
        for f in files:
            size = f.stat().st_size
            with open(f, "rb") as fh:
                head = fh.read(8)
                if len(head) == 8:
                    (n,) = struct.unpack("<Q", head)
                    if n <= MAX_HEADER:
                        head += fh.read(n)
            start, entries = validate_safetensors_header(f, head, size)
            for name, (dt, shape, b, e) in entries.items():
                if name in self.index:
                    raise FormatError(f, name, f"also in {self.index[name][0].name}", "each tensor in one file")
                self.index[name] = (f, dt, shape, start + b, start + e)

    def _config(self, f: Path) -> dict:
        c = self.hf_config
        archs = c.get("architectures") or []
        arch = _MODEL_TYPES.get(c.get("model_type"), c.get("model_type"))
        if arch not in SUPPORTED_ARCHITECTURES:
            arch = next((_ARCH[a] for a in archs if a in _ARCH), arch)
        if arch not in SUPPORTED_ARCHITECTURES:
            raise UnsupportedArchitectureError(f, "model_type", f"{c.get('model_type')!r} ({archs}) is not supported",
                                               "one of " + ", ".join(SUPPORTED_ARCHITECTURES))

        def req(key):
            if key not in c:
                raise FormatError(f, key, "missing", f"the {arch} config field {key}")
            return c[key]

        heads = req("num_attention_heads")
        hidden = req("hidden_size")
        if not isinstance(heads, int) or not isinstance(hidden, int) or heads <= 0:
            raise FormatError(f, "num_attention_heads", f"is {heads!r} (hidden_size {hidden!r})", "positive integers")
        eos = c.get("eos_token_id")
        eos = [eos] if isinstance(eos, int) else list(eos or [])
        gen = self.path / "generation_config.json"
        if gen.exists():
            from webinfer_packager.pack.tokenizer_convert import _read_json

            g = _read_json(gen).get("eos_token_id")
            for e in [g] if isinstance(g, int) else list(g or []):
                if e not in eos:
                    eos.append(e)
        head_dim = c.get("head_dim") or hidden // heads
        params = c.get("rope_parameters") if isinstance(c.get("rope_parameters"), dict) else {}
        for key, holder in [("partial_rotary_factor", c), ("rope_parameters.partial_rotary_factor", params)] + [
                (f"rope_parameters.{k}.partial_rotary_factor", v) for k, v in params.items() if isinstance(v, dict)]:
            partial = holder.get("partial_rotary_factor")
            if partial is not None and partial != 1.0:  # Phi-4-mini: 0.75 (transformers 5 writes it in both places)
                raise UnsupportedArchitectureError(
                    f, key, f"is {partial!r}: RoPE on part of each head, which webinfer does not implement",
                    "1.0 (RoPE on the whole head)")
        n_layers = req("num_hidden_layers")
        max_pos = req("max_position_embeddings")
        gemma = arch in GEMMA
        act_key = "hidden_activation" if gemma and c.get("hidden_activation") else "hidden_act"
        act = _ACTIVATIONS.get(c.get(act_key) or ("gelu_pytorch_tanh" if gemma else "silu"))
        if act is None:
            raise FormatError(f, act_key, f"is {c.get(act_key)!r}", "one of " + ", ".join(_ACTIVATIONS))
        theta, scaling, local_theta = self._rope(f, arch, head_dim, max_pos)
        if scaling and scaling["rope_type"] == "longrope":
            # the runtime uses LongRoPE's short factors only: positions up to the original context
            max_pos = min(max_pos, scaling["original_max_position_embeddings"])
        window, layer_types = self._sliding(f, arch, n_layers)
        return {
            "architecture": arch, "vocab_size": req("vocab_size"), "hidden_size": hidden,
            "intermediate_size": req("intermediate_size"), "num_hidden_layers": n_layers,
            "num_attention_heads": heads, "num_key_value_heads": c.get("num_key_value_heads") or heads,
            "head_dim": head_dim,
            "rms_norm_eps": req("rms_norm_eps"), "rope_theta": theta, "rope_scaling": scaling,
            "max_position_embeddings": max_pos,
            "tie_word_embeddings": bool(c.get("tie_word_embeddings", gemma)),
            "attention_bias": bool(c.get("attention_bias", arch == "qwen2")),
            "bos_token_id": c.get("bos_token_id"), "eos_token_ids": eos, "pad_token_id": c.get("pad_token_id"),
            "activation": act, "qk_norm": arch in ("qwen3", "gemma3"), "post_norms": gemma,
            "embedding_multiplier": hidden ** 0.5 if gemma else 1.0,
            "query_pre_attn_scalar": float(c.get("query_pre_attn_scalar") or head_dim) if gemma else None,
            "attn_logit_softcapping": c.get("attn_logit_softcapping") if arch == "gemma2" else None,
            "final_logit_softcapping": c.get("final_logit_softcapping") if arch == "gemma2" else None,
            "sliding_window": window, "layer_types": layer_types, "rope_local_theta": local_theta,
        }

    def _rope(self, f: Path, arch: str, head_dim: int, max_pos: int) -> tuple[float, dict | None, float | None]:
        """(rope_theta, normalised rope_scaling, local theta) from either config layout: transformers >= 5 writes
        `rope_parameters` (per layer type for Gemma 3), older configs `rope_theta` + `rope_scaling`
        (+ `rope_local_base_freq`)."""
        c = self.hf_config
        params = c.get("rope_parameters")
        local = None
        if isinstance(params, dict) and "full_attention" in params:  # nested by layer type
            sl = params.get("sliding_attention") or {}
            if sl.get("rope_type", "default") != "default":
                raise FormatError(f, "rope_parameters.sliding_attention.rope_type", f"is {sl.get('rope_type')!r}",
                                  "default (unscaled RoPE on sliding layers)")
            local = float(sl["rope_theta"]) if "rope_theta" in sl else None
            params = params["full_attention"]
        if isinstance(params, dict):
            theta, raw = params.get("rope_theta", c.get("rope_theta", 10000.0)), params
        else:
            theta, raw = c.get("rope_theta", 10000.0), c.get("rope_scaling")
        if arch == "gemma3" and local is None:
            local = float(c.get("rope_local_base_freq", 10000.0))
        field = "rope_parameters" if c.get("rope_parameters") else "rope_scaling"
        kind = (raw or {}).get("rope_type", (raw or {}).get("type", "default"))
        if kind == "default":
            return float(theta), None, local
        if kind == "linear":
            return float(theta), {"rope_type": "linear", "factor": float(raw["factor"])}, local
        if kind == "llama3":
            keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
            missing = [k for k in keys if k not in raw]
            if missing:
                raise FormatError(f, field, f"llama3 scaling lacks {missing}", "the four llama3 keys")
            return float(theta), {"rope_type": "llama3", **{k: raw[k] for k in keys}}, local
        if kind == "longrope":
            orig = c.get("original_max_position_embeddings") or raw.get("original_max_position_embeddings") or max_pos
            factor = raw.get("factor") or max_pos / orig
            att = raw.get("attention_factor")
            if att is None:  # transformers' default (the LongRoPE paper's)
                att = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(orig))
            return float(theta), {"rope_type": "longrope", "short_factor": list(raw["short_factor"]),
                                  "long_factor": list(raw["long_factor"]), "original_max_position_embeddings": orig,
                                  "attention_factor": float(att)}, local
        raise FormatError(f, f"{field}.rope_type", f"is {kind!r}", "default, linear, llama3 or longrope")

    def _sliding(self, f: Path, arch: str, n_layers: int) -> tuple[int | None, list[str] | None]:
        """(sliding_window, layer_types): Gemma interleaves local and global layers, Mistral and Phi-3 slide
        everywhere, Qwen only with use_sliding_window."""
        c = self.hf_config
        window = c.get("sliding_window")
        if arch in ("qwen2", "qwen3") and not c.get("use_sliding_window"):
            window = None
        if arch == "llama" or window is None:
            return None, None
        types = c.get("layer_types")
        if types is None:
            if arch == "gemma2":
                types = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n_layers)]
            elif arch == "gemma3":
                pattern = c.get("sliding_window_pattern") or c.get("_sliding_window_pattern") or 6
                types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n_layers)]
            elif arch in ("qwen2", "qwen3"):
                first = c.get("max_window_layers", n_layers)
                types = ["sliding_attention" if i >= first else "full_attention" for i in range(n_layers)]
            else:
                types = ["sliding_attention"] * n_layers
        if not isinstance(types, list) or len(types) != n_layers:
            raise FormatError(f, "layer_types", f"is {types!r}", f"a list of {n_layers} layer types")
        if "sliding_attention" not in types:
            return None, None
        return int(window), list(types)

    def tensor(self, canonical: str, shape: list[int]):
        hn, rows, offset = hf_tensor_name(self.config["architecture"], self.config, canonical)
        if hn not in self.index:
            raise FormatError(self.path, f"tensor {hn}", "missing", f"the tensor {canonical}")
        f, dt, got, b, e = self.index[hn]
        if rows is not None:  # a fused tensor: its rows must hold this range, its width must match
            if len(got) != 2 or got[1] != shape[1] or got[0] < rows[1]:
                raise FormatError(f, f"{hn}.shape", f"is {got}", f"[>= {rows[1]}, {shape[1]}] from config.json")
        elif got != shape:
            raise FormatError(f, f"{hn}.shape", f"is {got}", f"{shape} from config.json")
        return _HFTensor(hn, dt, shape, f, b, row0=rows[0] if rows else 0, offset=offset)

    def tokenizer(self):
        from webinfer_packager.pack.tokenizer_convert import tokenizer_from_hf

        return tokenizer_from_hf(self.path)
