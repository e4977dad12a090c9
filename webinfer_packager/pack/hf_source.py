"""Reading a Hugging Face folder (config.json, *.safetensors [+ model.safetensors.index.json], tokenizer.json,
tokenizer_config.json) as a pack source.

Safetensors headers are validated here before any data is touched (header length, JSON, dtype known, shape,
offsets in bounds, sized right and non-overlapping), then tensor rows are read in chunks with pread. We read
the file ourselves rather than through `safe_open(framework="numpy")` because numpy has no bfloat16 (safe_open
refuses BF16 tensors) and because mmap'd pages count towards resident memory; BF16 is widened by a 16-bit shift.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

from webinfer.errors import FormatError, UnsupportedArchitectureError
from webinfer.package import SUPPORTED_ARCHITECTURES

ST_DTYPES = {"F32": ("<f4", 4), "F16": ("<f2", 2), "BF16": ("<u2", 2)}
MAX_HEADER = 100 << 20  # the safetensors library's own limit
_ARCH = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "Qwen2ForCausalLM": "qwen2"}


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

    def __init__(self, name, dt, shape, path: Path, begin: int):
        self.name, self.type_name, self.shape, self._path, self._begin = name, dt, shape, path, begin
        k = shape[1] if len(shape) == 2 else 1
        self._np, item = ST_DTYPES[dt]
        self._row = k * item

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
            return (a.astype(np.uint32) << np.uint32(16)).view(np.float32)
        return a.astype(np.float32)

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
        arch = c.get("model_type")
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
        # transformers >= 5 writes RoPE settings as rope_parameters {rope_theta, rope_type, ...}
        rope = c.get("rope_parameters") if isinstance(c.get("rope_parameters"), dict) else {}
        scaling = c.get("rope_scaling")
        if scaling is None and rope.get("rope_type") not in (None, "default"):
            scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
        return {
            "architecture": arch, "vocab_size": req("vocab_size"), "hidden_size": hidden,
            "intermediate_size": req("intermediate_size"), "num_hidden_layers": req("num_hidden_layers"),
            "num_attention_heads": heads, "num_key_value_heads": c.get("num_key_value_heads") or heads,
            "head_dim": c.get("head_dim") or hidden // heads,
            "rms_norm_eps": req("rms_norm_eps"), "rope_theta": c.get("rope_theta", rope.get("rope_theta", 10000.0)),
            "rope_scaling": scaling,
            "max_position_embeddings": req("max_position_embeddings"),
            "tie_word_embeddings": bool(c.get("tie_word_embeddings", False)),
            "attention_bias": bool(c.get("attention_bias", arch == "qwen2")),
            "bos_token_id": c.get("bos_token_id"), "eos_token_ids": eos, "pad_token_id": c.get("pad_token_id"),
        }

    def _hf_name(self, canonical: str) -> str:
        if canonical == "embed":
            return "model.embed_tokens.weight"
        if canonical == "norm":
            return "model.norm.weight"
        if canonical == "lm_head":
            return "lm_head.weight"
        _, i, part = canonical.split(".", 2)
        p = f"model.layers.{i}."
        return p + {"attn_norm": "input_layernorm.weight", "ffn_norm": "post_attention_layernorm.weight",
                    "q": "self_attn.q_proj.weight", "k": "self_attn.k_proj.weight", "v": "self_attn.v_proj.weight",
                    "o": "self_attn.o_proj.weight", "q_bias": "self_attn.q_proj.bias",
                    "k_bias": "self_attn.k_proj.bias", "v_bias": "self_attn.v_proj.bias",
                    "gate": "mlp.gate_proj.weight", "up": "mlp.up_proj.weight", "down": "mlp.down_proj.weight"}[part]

    def tensor(self, canonical: str, shape: list[int]):
        hn = self._hf_name(canonical)
        if hn not in self.index:
            raise FormatError(self.path, f"tensor {hn}", "missing", f"the tensor {canonical}")
        f, dt, got, b, e = self.index[hn]
        if got != shape:
            raise FormatError(f, f"{hn}.shape", f"is {got}", f"{shape} from config.json")
        return _HFTensor(hn, dt, shape, f, b)

    def tokenizer(self):
        from webinfer_packager.pack.tokenizer_convert import tokenizer_from_hf

        return tokenizer_from_hf(self.path)
