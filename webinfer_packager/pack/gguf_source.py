"""Reading a GGUF file (v2/v3) as a pack source.

`read_gguf_header` walks the header with explicit bounds checks (magic, version, counts, string/array lengths,
tensor infos, data offsets in bounds and non-overlapping), raising FormatError naming the field, and returns the
metadata values and tensor infos; tensor data is then memory-mapped (gguf.GGUFReader is not used: it trusts every
length it reads and is slow on large vocabularies).

Metadata is never parsed by GGUFReader: it builds a numpy object per array element (~200 bytes each, so an 8 MB
array of bytes needed 1.6 GB). `GGUFFields` instead decodes a key only when it is asked for, from the offsets the
validating walk recorded, so memory stays proportional to the values actually used (the tokenizer's).

Conventions are normalised here: llama.cpp permutes the Q/K rows of `llama`/`mistral` GGUFs for adjacent-pair
RoPE; `unpermute_rows` gives the row order of the half-split (Hugging Face) convention the runtime uses. Gemma
GGUFs already hold 1 + w in their norm weights (llama.cpp's converter adds it), which is the package's convention.
A Llama 3.1+ `rope_freqs` tensor (per-frequency divisors) becomes `rope_scaling: {"rope_type": "freq_factors"}`.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from webinfer.errors import FormatError, UnsupportedArchitectureError

# what llama.cpp names the architectures we read
GGUF_ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "phi3")

GGUF_MAGIC = b"GGUF"
GGUF_VERSIONS = (2, 3)
# scalar value types: id -> (struct format, size)
_SCALARS = {0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4), 5: ("<i", 4), 6: ("<f", 4),
            7: ("<?", 1), 10: ("<Q", 8), 11: ("<q", 8), 12: ("<d", 8)}
_STRING, _ARRAY = 8, 9
MAX_DIMS = 4


@dataclass(frozen=True)
class HeaderTensor:
    name: str
    dims: tuple[int, ...]  # GGUF order: ne0 (K, the contiguous axis) first
    type_id: int
    offset: int  # relative to the data section
    nbytes: int


def validate_gguf_header(path: Path | str, data: bytes | memoryview | None = None,
                         layout: dict | None = None) -> list[HeaderTensor]:
    """Walk a GGUF header with bounds checks; return the tensor infos. Raises only FormatError.
    `layout`, when given, receives "kv" ({key: (value type, offset of the value)}), "kv_end", "alignment" and
    "data_start" (the absolute offset of the tensor data section)."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    path = str(path)
    if data is None:
        import mmap

        with open(path, "rb") as fh:
            size = fh.seek(0, 2)
            if size == 0:
                raise FormatError(path, "magic", "the file is empty", "a GGUF file")
            data = memoryview(mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ))
    buf = memoryview(data)
    size = len(buf)
    pos = 0

    def need(n: int, field: str) -> None:
        if n < 0 or pos + n > size:
            raise FormatError(path, field, f"needs {n} bytes at offset {pos} but the file has {size} bytes",
                              "a complete GGUF file (truncated?)")

    def scalar(fmt: str, n: int, field: str):
        nonlocal pos
        need(n, field)
        (v,) = struct.unpack_from(fmt, buf, pos)
        pos += n
        return v

    def string(field: str) -> str:
        nonlocal pos
        n = scalar("<Q", 8, f"{field} (string length)")
        need(n, field)
        raw = bytes(buf[pos:pos + n])
        pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise FormatError(path, field, "is not valid UTF-8") from None

    def value(type_id: int, field: str, depth: int = 0):
        nonlocal pos
        if type_id in _SCALARS:
            fmt, n = _SCALARS[type_id]
            return scalar(fmt, n, field)
        if type_id == _STRING:
            return string(field)
        if type_id == _ARRAY and depth == 0:
            item = scalar("<I", 4, f"{field} (array type)")
            count = scalar("<Q", 8, f"{field} (array length)")
            min_item = _SCALARS[item][1] if item in _SCALARS else 8 if item in (_STRING, _ARRAY) else None
            if min_item is None:
                raise FormatError(path, field, f"array of unknown value type {item}", "a GGUF value type 0-12")
            if count * min_item > size - pos:  # checked before any loop or allocation
                raise FormatError(path, field, f"array length {count} exceeds the {size - pos} bytes left")
            if item in _SCALARS:
                pos += count * min_item
                return None
            if item == _STRING:  # lengths only: the text is decoded (and its UTF-8 checked) if the key is used
                for i in range(count):
                    n = scalar("<Q", 8, f"{field}[{i}] (string length)")
                    need(n, f"{field}[{i}]")
                    pos += n
                return None
            for i in range(count):
                value(item, f"{field}[{i}]", depth + 1)
            return None
        raise FormatError(path, field, f"unknown value type {type_id}", "a GGUF value type 0-12 (arrays not nested)")

    magic = bytes(buf[:4]) if size >= 4 else bytes(buf)
    if magic != GGUF_MAGIC:
        raise FormatError(path, "magic", f"is {magic!r}", "b'GGUF'")
    pos = 4
    version = scalar("<I", 4, "version")
    if version not in GGUF_VERSIONS:
        raise FormatError(path, "version", f"is {version}", "GGUF version 2 or 3")
    n_tensors = scalar("<Q", 8, "tensor_count")
    n_kv = scalar("<Q", 8, "kv_count")
    if n_tensors * 28 > size - pos:
        raise FormatError(path, "tensor_count", f"{n_tensors} tensors cannot fit in {size} bytes")
    if n_kv * 13 > size - pos:
        raise FormatError(path, "kv_count", f"{n_kv} key-value pairs cannot fit in {size} bytes")
    alignment = 32
    kv: dict[str, tuple[int, int]] = {}
    for i in range(n_kv):
        key = string(f"kv[{i}].key")
        if key in kv:
            raise FormatError(path, key, "duplicate metadata key")
        type_id = scalar("<I", 4, f"{key} (type)")
        kv[key] = (type_id, pos)
        v = value(type_id, key)
        if key == "general.alignment":
            if not isinstance(v, int) or v <= 0 or v & (v - 1) or v % 8:
                raise FormatError(path, key, f"is {v!r}", "a power of two >= 8")
            alignment = v
    if layout is not None:
        layout.update(kv=kv, kv_end=pos, alignment=alignment)
    infos = []
    names = set()
    for i in range(n_tensors):
        name = string(f"tensor_info[{i}].name")
        if name in names:
            raise FormatError(path, f"tensor_info[{name}]", "duplicate tensor name")
        names.add(name)
        n_dims = scalar("<I", 4, f"tensor_info[{name}].n_dims")
        if not 1 <= n_dims <= MAX_DIMS:
            raise FormatError(path, f"tensor_info[{name}].n_dims", f"is {n_dims}", f"1..{MAX_DIMS}")
        dims = tuple(scalar("<Q", 8, f"tensor_info[{name}].dims") for _ in range(n_dims))
        type_id = scalar("<I", 4, f"tensor_info[{name}].type")
        offset = scalar("<Q", 8, f"tensor_info[{name}].offset")
        try:
            qtype = GGMLQuantizationType(type_id)
            block, type_size = GGML_QUANT_SIZES[qtype]
        except (ValueError, KeyError):
            raise FormatError(path, f"tensor_info[{name}].type", f"unknown ggml type {type_id}") from None
        if any(d == 0 for d in dims) or dims[0] % block:
            raise FormatError(path, f"tensor_info[{name}].dims", f"is {list(dims)}",
                              f"non-zero dims with ne0 a multiple of {block} for {qtype.name}")
        n = 1
        for d in dims:
            n *= d
        nbytes = n // block * type_size
        if offset % alignment:
            raise FormatError(path, f"tensor_info[{name}].offset", f"is {offset}", f"a multiple of {alignment}")
        infos.append(HeaderTensor(name, dims, type_id, offset, nbytes))
    data_start = -(-pos // alignment) * alignment
    data_size = size - data_start
    end = 0
    for t in sorted(infos, key=lambda t: t.offset):
        if t.offset < end:
            raise FormatError(path, f"tensor_info[{t.name}].offset", f"{t.offset} overlaps the previous tensor",
                              f">= {end}")
        end = t.offset + t.nbytes
        if end > data_size:
            raise FormatError(path, f"tensor_info[{t.name}].offset",
                              f"data [{t.offset}, {end}) lies outside the data section ({data_size} bytes)",
                              "tensor data inside the file (truncated?)")
    if layout is not None:
        layout["data_start"] = data_start
    return infos


class GGUFFields(Mapping):
    """A GGUF's metadata as {key: value}, each value decoded from the mapped file when first asked for (arrays
    as lists). Built from a validated layout, so every offset and length is already known to be in bounds."""

    _NP = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8", 11: "<i8",
           12: "<f8"}

    def __init__(self, buf, kv: dict[str, tuple[int, int]], path: str = "(gguf)"):
        self._buf, self._kv, self._cache, self._path = memoryview(buf).cast("B"), kv, {}, path

    def __len__(self):
        return len(self._kv)

    def __iter__(self):
        return iter(self._kv)

    def __getitem__(self, key):
        if key not in self._cache:
            type_id, pos = self._kv[key]
            try:
                self._cache[key] = self._decode(type_id, pos)[0]
            except UnicodeDecodeError:
                raise FormatError(self._path, key, "holds a string that is not valid UTF-8") from None
        return self._cache[key]

    def _decode(self, type_id: int, pos: int):
        buf = self._buf
        if type_id in _SCALARS:
            fmt, n = _SCALARS[type_id]
            return struct.unpack_from(fmt, buf, pos)[0], pos + n
        if type_id == _STRING:
            (n,) = struct.unpack_from("<Q", buf, pos)
            return bytes(buf[pos + 8:pos + 8 + n]).decode("utf-8"), pos + 8 + n
        item, count = struct.unpack_from("<IQ", buf, pos)
        pos += 12
        if item in self._NP:
            return np.frombuffer(buf, self._NP[item], count, pos).tolist(), pos + count * _SCALARS[item][1]
        out = []
        for _ in range(count):
            v, pos = self._decode(item, pos)
            out.append(v)
        return out, pos


def read_gguf_fields(path: Path | str) -> GGUFFields:
    """The validated metadata of a GGUF file (no tensors needed: a vocab-only GGUF works)."""
    import mmap

    layout: dict = {}
    validate_gguf_header(path, layout=layout)
    with open(path, "rb") as fh:
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    return GGUFFields(mm, layout["kv"], str(path))


def read_gguf_header(path: Path | str) -> tuple[list[HeaderTensor], int, GGUFFields]:
    """(tensor infos, absolute offset of the data section, metadata decoded on demand); raises only FormatError."""
    layout: dict = {}
    infos = validate_gguf_header(path, layout=layout)
    import mmap

    with open(path, "rb") as fh:
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    return infos, layout["data_start"], GGUFFields(mm, layout["kv"], str(path))


def gguf_tensor_blocks(path: Path | str) -> dict[str, tuple[HeaderTensor, np.ndarray]]:
    """Every tensor of a GGUF as (info, its raw bytes memory-mapped: uint8 [rows, row_bytes]), after the bounds-checked
    header walk (GGUFReader's per-element parsing of metadata takes minutes on a 262k-token vocabulary)."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    infos, data_start, _ = read_gguf_header(path)
    mm = np.memmap(path, np.uint8, mode="r")
    out = {}
    for t in infos:
        block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(t.type_id)]
        row = t.dims[0] // block * type_size
        out[t.name] = (t, mm[data_start + t.offset: data_start + t.offset + t.nbytes].reshape(-1, row))
    return out


# ----------------------------------------------------------------------------------------------------------


def unpermute_rows(n_rows: int, n_head: int) -> np.ndarray:
    """Row index r_gguf[i] for each half-split row i: llama.cpp stored row h*d + 2j + t from HF row h*d + t*d/2 + j."""
    d = n_rows // n_head
    idx = np.arange(n_rows).reshape(n_head, d // 2, 2)  # GGUF rows grouped as (head, j, t)
    return idx.transpose(0, 2, 1).reshape(-1)  # HF row (head, t, j) comes from GGUF row (head, j, t)


class SourceTensor:
    """One canonical tensor of a source: float rows on demand, plus raw GGUF block rows for lossless repacking."""

    def __init__(self, name: str, type_name: str, shape: list[int], data: np.ndarray, rows: np.ndarray | None,
                 qtype=None):
        self.name, self.type_name, self.shape, self._data, self._rows, self._qtype = name, type_name, shape, data, rows, qtype

    def raw_rows(self, r0: int, r1: int) -> np.ndarray:
        return self._data[self._rows[r0:r1]] if self._rows is not None else self._data[r0:r1]

    def float_rows(self, r0: int, r1: int) -> np.ndarray:
        from gguf.quants import dequantize

        raw = self.raw_rows(r0, r1)
        if self.type_name == "F32":
            return np.asarray(raw, np.float32)
        if self.type_name == "F16":
            return np.asarray(raw).astype(np.float32)
        return dequantize(np.asarray(raw), self._qtype).reshape(r1 - r0, -1).astype(np.float32, copy=False)

    def float_all(self) -> np.ndarray:
        return self.float_rows(0, self.shape[0]).reshape(self.shape)


_GGUF_NAMES = {"attn_norm": "attn_norm", "q": "attn_q", "k": "attn_k", "v": "attn_v", "o": "attn_output",
               "q_bias": "attn_q.bias", "k_bias": "attn_k.bias", "v_bias": "attn_v.bias",
               "q_norm": "attn_q_norm", "k_norm": "attn_k_norm", "post_attn_norm": "post_attention_norm",
               "ffn_norm": "ffn_norm", "gate": "ffn_gate", "up": "ffn_up", "down": "ffn_down",
               "post_ffn_norm": "post_ffw_norm"}


def gguf_tensor_name(canonical: str) -> str:
    if canonical == "embed":
        return "token_embd.weight"
    if canonical == "norm":
        return "output_norm.weight"
    if canonical == "lm_head":
        return "output.weight"
    _, i, part = canonical.split(".", 2)
    n = _GGUF_NAMES[part]
    return f"blk.{i}.{n}" if n.endswith(".bias") else f"blk.{i}.{n}.weight"


@dataclass(frozen=True, eq=False)
class GGUFTensor:
    """One tensor of a GGUFSource, with the attributes of gguf.ReaderTensor that the packer uses."""

    name: str
    tensor_type: Any          # gguf GGMLQuantizationType
    shape: np.ndarray         # GGUF order: ne0 (K, the contiguous axis) first
    n_bytes: int
    data: np.ndarray          # memory-mapped: F32/F16 typed [.., K]; other types raw block bytes [rows, row_bytes]

    @classmethod
    def of(cls, t: HeaderTensor, mm: np.ndarray, data_start: int) -> "GGUFTensor":
        from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

        qtype = GGMLQuantizationType(t.type_id)
        raw = mm[data_start + t.offset: data_start + t.offset + t.nbytes]
        if qtype.name in ("F32", "F16"):
            data = raw.view("<f4" if qtype.name == "F32" else "<f2").reshape(tuple(reversed(t.dims)))
        else:
            block, type_size = GGML_QUANT_SIZES[qtype]
            data = raw.reshape(-1, t.dims[0] // block * type_size)
        return cls(t.name, qtype, np.array(t.dims, np.uint64), t.nbytes, data)


class GGUFSource:
    """A GGUF file as a pack source: metadata from the bounds-checked header walk, tensors memory-mapped.
    (gguf.GGUFReader is not used: it parses every element of the metadata arrays into its own numpy view, which
    takes minutes for a 150k-262k-token vocabulary.)"""

    kind = "gguf"

    def __init__(self, path: Path):
        self.path = Path(path)
        self.name = self.path.name
        self.default_name = self.path.name.split(".")[0]
        infos, data_start, self.fields = read_gguf_header(self.path)
        self._mm = np.memmap(self.path, np.uint8, mode="r")
        self.tensors = {t.name: GGUFTensor.of(t, self._mm, data_start) for t in infos}
        self.config = self._config()

    def _get(self, key: str, default=None, *, required=False):
        v = self.fields.get(key)
        if v is None:
            if required:
                raise FormatError(self.path, key, "missing", "this metadata key")
            return default
        return v

    def _config(self) -> dict:
        arch = self._get("general.architecture", required=True)
        if arch not in GGUF_ARCHITECTURES:
            raise UnsupportedArchitectureError(self.path, "general.architecture", f"{arch!r} is not supported",
                                               "one of " + ", ".join(GGUF_ARCHITECTURES))
        self.arch = arch

        def num(key, default=None, kind=int):
            v = self._get(f"{arch}.{key}", default, required=default is None)
            if isinstance(v, list) or not isinstance(v, (int, float)):
                raise FormatError(self.path, f"{arch}.{key}", f"is {v!r}", "a number (per-layer lists unsupported)")
            return kind(v)

        hidden = num("embedding_length")
        heads = num("attention.head_count")
        head_dim = num("attention.key_length", hidden // heads if heads else 0)
        rope_dims = self._get(f"{arch}.rope.dimension_count")
        if rope_dims is not None and rope_dims != head_dim:  # Phi-4-mini: RoPE on 96 of 128 dims
            raise UnsupportedArchitectureError(
                self.path, f"{arch}.rope.dimension_count", f"is {rope_dims!r}: RoPE on part of each head (head_dim "
                f"{head_dim}), which webinfer does not implement", f"{head_dim} (RoPE on the whole head)")
        n_layers = num("block_count")
        if n_layers > len(self.tensors) // 6:  # 6 tensors per layer at least (fused Phi-3): checked before sizing
            raise FormatError(self.path, f"{arch}.block_count", f"is {n_layers} but the file holds "
                              f"{len(self.tensors)} tensors", "at most (tensors // 6) layers")
        tokens = self._get("tokenizer.ggml.tokens")
        vocab = num("vocab_size", len(tokens) if tokens else None)
        eos = self._get("tokenizer.ggml.eos_token_id")
        gemma = arch in ("gemma2", "gemma3")
        cfg = {
            "architecture": arch, "vocab_size": vocab, "hidden_size": hidden,
            "intermediate_size": num("feed_forward_length"), "num_hidden_layers": n_layers,
            "num_attention_heads": heads, "num_key_value_heads": num("attention.head_count_kv", heads),
            "head_dim": head_dim,
            "rms_norm_eps": num("attention.layer_norm_rms_epsilon", kind=float),
            "rope_theta": num("rope.freq_base", 10000.0, kind=float),
            "rope_scaling": self._rope_scaling(arch, head_dim),
            "max_position_embeddings": num("context_length", 2048),
            "tie_word_embeddings": "output.weight" not in self.tensors,
            "attention_bias": "blk.0.attn_q.bias" in self.tensors,
            "bos_token_id": self._get("tokenizer.ggml.bos_token_id"),
            "eos_token_ids": [int(eos)] if eos is not None else [],
            "pad_token_id": self._get("tokenizer.ggml.padding_token_id"),
            "qk_norm": "blk.0.attn_q_norm.weight" in self.tensors,
        }
        if gemma:
            window = num("attention.sliding_window")
            # llama.cpp's rules (llama-model.cpp): every 2nd (Gemma 2) / 6th (Gemma 3) layer is global; the 27B
            # models (46 / 62 layers) scale queries by hidden/heads, the others by head_dim; Gemma 3's local
            # layers use RoPE base 10000, unscaled
            period = 2 if arch == "gemma2" else 6
            big = n_layers == (46 if arch == "gemma2" else 62)
            cfg.update(activation="gelu_tanh", post_norms=True, embedding_multiplier=hidden ** 0.5,
                       query_pre_attn_scalar=float(hidden // heads if big else head_dim), sliding_window=window,
                       layer_types=["sliding_attention" if (i + 1) % period else "full_attention"
                                    for i in range(n_layers)])
            if arch == "gemma2":
                cfg.update(attn_logit_softcapping=num("attn_logit_softcapping", 50.0, kind=float),
                           final_logit_softcapping=num("final_logit_softcapping", 30.0, kind=float))
            else:
                cfg["rope_local_theta"] = 10000.0
        if arch == "phi3":
            self._phi3_rope(cfg)
        if not gemma and self._get(f"{arch}.attention.sliding_window") is not None:  # Mistral / Phi-3: every layer
            cfg.update(sliding_window=num("attention.sliding_window"), layer_types=["sliding_attention"] * n_layers)
        return cfg

    def _phi3_rope(self, cfg: dict) -> None:
        """Phi-3 LongRoPE: llama.cpp stores the factors as tensors and the original context as metadata; the
        runtime uses the short factors, so the context is capped at the original one (as from config.json)."""
        if "rope_factors_short.weight" not in self.tensors:
            return
        hd2 = cfg["head_dim"] // 2
        fac = {}
        for kind in ("short", "long"):
            t = self.tensors.get(f"rope_factors_{kind}.weight")
            if t is None or int(np.prod(t.shape)) != hd2:
                raise FormatError(self.path, f"tensor rope_factors_{kind}.weight",
                                  "missing" if t is None else f"has {int(np.prod(t.shape))} values", f"{hd2} factors")
            fac[kind] = [float(x) for x in np.asarray(t.data, np.float32).ravel()]
        orig = int(self._get("phi3.rope.scaling.original_context_length", cfg["max_position_embeddings"]))
        att = self._get("phi3.rope.scaling.attn_factor")
        if att is None:  # transformers' default (the LongRoPE paper's)
            import math

            factor = cfg["max_position_embeddings"] / orig
            att = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(orig))
        cfg["rope_scaling"] = {"rope_type": "longrope", "short_factor": fac["short"], "long_factor": fac["long"],
                               "original_max_position_embeddings": orig, "attention_factor": float(att)}
        cfg["max_position_embeddings"] = min(cfg["max_position_embeddings"], orig)

    def _rope_scaling(self, arch: str, head_dim: int) -> dict | None:
        """llama.cpp stores Llama 3.1's scaling as precomputed per-frequency divisors (the rope_freqs tensor):
        inv_freq[i] / rope_freqs[i] equals the llama3 rule. Linear scaling is a metadata pair."""
        kind = self._get(f"{arch}.rope.scaling.type")
        if "rope_freqs.weight" in self.tensors:
            t = self.tensors["rope_freqs.weight"]
            if t.tensor_type.name != "F32" or int(np.prod(t.shape)) != head_dim // 2:
                raise FormatError(self.path, "tensor rope_freqs.weight",
                                  f"is {t.tensor_type.name} {[int(d) for d in t.shape]}", f"F32 [{head_dim // 2}]")
            factors = [float(x) for x in np.asarray(t.data, np.float32).ravel()]
            if not all(np.isfinite(f) and f > 0 for f in factors):
                raise FormatError(self.path, "tensor rope_freqs.weight", "holds non-positive or non-finite values",
                                  "positive per-frequency divisors")
            return {"rope_type": "freq_factors", "factors": factors}
        if kind in (None, "none"):
            return None
        if kind == "linear":
            factor = self._get(f"{arch}.rope.scaling.factor")
            if not isinstance(factor, (int, float)) or factor <= 0:
                raise FormatError(self.path, f"{arch}.rope.scaling.factor", f"is {factor!r}", "a positive number")
            return {"rope_type": "linear", "factor": float(factor)}
        raise FormatError(self.path, f"{arch}.rope.scaling.type", f"is {kind!r}", "none or linear (or a rope_freqs tensor)")

    def _fused(self, canonical: str) -> tuple[str, int] | None:
        """(GGUF name, first row) when a canonical tensor is a row range of a fused one: Phi-3's attn_qkv
        (q, k, v) and ffn_up holding gate then up (whole GGUF rows: the slice stays lossless)."""
        part = canonical.rsplit(".", 1)[-1]
        i = canonical.split(".")[1] if canonical.startswith("layers.") else None
        c = self.config
        if part in ("q", "k", "v") and f"blk.{i}.attn_qkv.weight" in self.tensors:
            q, kv = c["num_attention_heads"] * c["head_dim"], c["num_key_value_heads"] * c["head_dim"]
            return f"blk.{i}.attn_qkv.weight", {"q": 0, "k": q, "v": q + kv}[part]
        if part in ("gate", "up") and f"blk.{i}.ffn_gate.weight" not in self.tensors \
                and f"blk.{i}.ffn_up.weight" in self.tensors and self.arch == "phi3":
            return f"blk.{i}.ffn_up.weight", 0 if part == "gate" else c["intermediate_size"]
        return None

    def tensor(self, canonical: str, shape: list[int]) -> SourceTensor:
        fused = self._fused(canonical)
        gname = fused[0] if fused else gguf_tensor_name(canonical)
        t = self.tensors.get(gname)
        if t is None:
            raise FormatError(self.path, f"tensor {gname}", "missing", f"the tensor {canonical} of a {self.arch} model")
        got = [int(d) for d in reversed(t.shape.tolist())]
        rows = None
        if fused:
            if len(got) != 2 or got[1] != shape[1] or got[0] < fused[1] + shape[0]:
                raise FormatError(self.path, f"tensor {gname}", f"has shape {got}",
                                  f"rows {fused[1]}..{fused[1] + shape[0]} of width {shape[1]} ({canonical})")
            rows = np.arange(fused[1], fused[1] + shape[0])
        elif got != shape:
            raise FormatError(self.path, f"tensor {gname}", f"has shape {got}", f"{shape} from the model config")
        part = canonical.rsplit(".", 1)[-1]
        if self.arch in ("llama", "mistral") and part in ("q", "k"):
            n_head = self.config["num_attention_heads" if part == "q" else "num_key_value_heads"]
            rows = unpermute_rows(shape[0], n_head)
        type_name = t.tensor_type.name
        if type_name not in ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K",
                             "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS"):
            raise FormatError(self.path, f"tensor {gname}.type", f"{type_name} is not supported",
                              "F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, a K-quant (Q2_K..Q6_K), IQ4_NL or IQ4_XS")
        data = t.data if len(shape) == 2 else t.data.reshape(shape[0], -1)
        return SourceTensor(gname, type_name, shape, data, rows, t.tensor_type)

    def release(self) -> None:
        """Drop the mapped pages read so far: file-backed pages count towards resident memory otherwise."""
        import mmap

        mm = getattr(self._mm, "_mmap", None)
        if mm is not None and hasattr(mmap, "MADV_DONTNEED"):
            mm.madvise(mmap.MADV_DONTNEED)

    # -- tokenizer side

    def tokenizer(self) -> tuple[dict, str | None, dict]:
        from webinfer_packager.pack.tokenizer_convert import tokenizer_from_gguf

        return tokenizer_from_gguf(self.fields, str(self.path))
