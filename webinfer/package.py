"""Reading a webinfer package (docs/package-format.md): manifest validation, model config, tensor locations.

Pure Python (it also runs in Pyodide, where there is no numpy). The validation works on the manifest dict alone
and fetches file bytes through a `reader(file_name, offset, size) -> bytes` callback, so the browser builds the
same `Package` with `Package.from_manifest(manifest, reader)` over fetch/Cache API; `Package.open(dir)` is the
local convenience.

    pkg = Package.open("~/.cache/webinfer/packages/SmolLM2-135M-Instruct")
    pkg.config.hidden_size, pkg.tensors["layers.0.q"].dtype, pkg.read_component("layers.0.q", "qweight")
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from dataclasses import dataclass
from typing import Any, Callable

from webinfer.errors import FormatError, IntegrityError
from webinfer.formats import FORMATS, GROUP_SIZES, row_bytes as component_row_bytes
from webinfer.gpu.device import BROWSER_DEFAULT_LIMITS

FORMAT = "webinfer-package"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
OFFSET_ALIGN = 256  # minStorageBufferOffsetAlignment: a shard uploaded whole can be bound at any offset we write
MAX_BINDING_BYTES = BROWSER_DEFAULT_LIMITS["max_storage_buffer_binding_size"]  # what every WebGPU device binds
SUPPORTED_ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "phi3")
ACTIVATIONS = ("silu", "gelu_tanh")
LAYER_TYPES = ("full_attention", "sliding_attention")
# rope_scaling.rope_type -> the keys it needs (docs/package-format.md, "RoPE scaling")
ROPE_SCALING_KEYS = {
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "longrope": ("short_factor", "long_factor", "original_max_position_embeddings", "attention_factor"),
    "freq_factors": ("factors",),
}
_SHA_NAME = re.compile(r"^[0-9a-f]{64}\.(bin|json)$")

Reader = Callable[[str, int, int], bytes]


# ----------------------------------------------------------------------------------------------------------
# model config


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    pad_token_id: int | None
    # family features (optional in a manifest: the defaults are the llama block)
    activation: str = "silu"                       # MLP: act(gate) * up; gelu_tanh = GeGLU (Gemma)
    qk_norm: bool = False                          # per-head RMSNorm of q and k before RoPE (Qwen3, Gemma 3)
    post_norms: bool = False                       # RMSNorm of the attention and MLP outputs before the residual add (Gemma 2/3)
    embedding_multiplier: float = 1.0              # the embedding row is scaled by this (Gemma: sqrt(hidden_size))
    query_pre_attn_scalar: float | None = None     # attention scale 1/sqrt(this); None: 1/sqrt(head_dim)
    attn_logit_softcapping: float | None = None    # scores -> cap * tanh(scores / cap) (Gemma 2)
    final_logit_softcapping: float | None = None   # logits -> cap * tanh(logits / cap) (Gemma 2)
    sliding_window: int | None = None              # a sliding layer's query at p sees keys k with p - k < window
    layer_types: tuple[str, ...] | None = None     # per layer full_attention | sliding_attention; None: all full
    rope_local_theta: float | None = None          # RoPE base of sliding layers, unscaled (Gemma 3); None: rope_theta

    def is_sliding(self, layer: int) -> bool:
        return self.layer_types is not None and self.layer_types[layer] == "sliding_attention"

    def layer_rope(self, layer: int) -> tuple[float, dict | None]:
        """(theta, rope_scaling) of one layer: Gemma 3's sliding layers use their own base and no scaling."""
        if self.rope_local_theta is not None and self.is_sliding(layer):
            return self.rope_local_theta, None
        return self.rope_theta, self.rope_scaling

    @property
    def attn_scale(self) -> float:
        return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

    @property
    def q_dim(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @classmethod
    def from_dict(cls, d: Any, file: str = MANIFEST, prefix: str = "config") -> "ModelConfig":
        if not isinstance(d, dict):
            raise FormatError(file, prefix, f"is {type(d).__name__}", "an object")

        def get(key, types, *, optional=False, positive=False):
            f = f"{prefix}.{key}"
            if key not in d:
                raise FormatError(file, f, "missing")
            v = d[key]
            if v is None and optional:
                return None
            if isinstance(v, bool) and bool not in types or not isinstance(v, types):
                raise FormatError(file, f, f"is {v!r}", " or ".join(t.__name__ for t in types))
            if positive and not v > 0:
                raise FormatError(file, f, f"is {v!r}", "a positive number")
            return v

        arch = get("architecture", (str,))
        if arch not in SUPPORTED_ARCHITECTURES:
            from webinfer.errors import UnsupportedArchitectureError
            raise UnsupportedArchitectureError(file, f"{prefix}.architecture", f"{arch!r} is not supported",
                                               "one of " + ", ".join(SUPPORTED_ARCHITECTURES))
        ints = {k: get(k, (int,), positive=True) for k in (
            "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_dim", "max_position_embeddings")}
        if ints["num_attention_heads"] % ints["num_key_value_heads"]:
            raise FormatError(file, f"{prefix}.num_key_value_heads", f"{ints['num_key_value_heads']} does not divide "
                              f"num_attention_heads={ints['num_attention_heads']}", "a divisor of the head count")
        if ints["head_dim"] % 2:
            raise FormatError(file, f"{prefix}.head_dim", f"{ints['head_dim']} is odd", "an even number (RoPE pairs)")
        scaling = get("rope_scaling", (dict,), optional=True)
        eos = get("eos_token_ids", (list,))
        if not all(isinstance(e, int) and not isinstance(e, bool) and 0 <= e < ints["vocab_size"] for e in eos):
            raise FormatError(file, f"{prefix}.eos_token_ids", f"is {eos!r}", "a list of token ids < vocab_size")
        bos = get("bos_token_id", (int,), optional=True)
        pad = get("pad_token_id", (int,), optional=True)
        for key, v in (("bos_token_id", bos), ("pad_token_id", pad)):
            if v is not None and not 0 <= v < ints["vocab_size"]:
                raise FormatError(file, f"{prefix}.{key}", f"{v} is out of range", f"0 <= id < {ints['vocab_size']}")
        check_config_ranges(d, file, prefix)
        _check_rope_scaling(scaling, ints["head_dim"], file, f"{prefix}.rope_scaling")

        def opt(key, types, default=None, *, positive=False):
            # family fields are optional: a manifest of a llama-style model may omit them
            return get(key, types, optional=True, positive=positive) if d.get(key) is not None else default

        activation = opt("activation", (str,), "silu")
        if activation not in ACTIVATIONS:
            raise FormatError(file, f"{prefix}.activation", f"is {activation!r}", "one of " + ", ".join(ACTIVATIONS))
        window = opt("sliding_window", (int,), positive=True)
        layer_types = opt("layer_types", (list,))
        if layer_types is not None:
            if len(layer_types) != ints["num_hidden_layers"] or not all(t in LAYER_TYPES for t in layer_types):
                raise FormatError(file, f"{prefix}.layer_types", f"is {layer_types!r}",
                                  f"{ints['num_hidden_layers']} entries, each one of " + ", ".join(LAYER_TYPES))
            if "sliding_attention" in layer_types and window is None:
                raise FormatError(file, f"{prefix}.sliding_window", "is null but layer_types has sliding layers",
                                  "a positive window size")
            layer_types = tuple(layer_types)
        elif window is not None:
            raise FormatError(file, f"{prefix}.layer_types", "is null but sliding_window is set",
                              "which layers slide (a list of full_attention | sliding_attention)")
        num = lambda key: float(v) if (v := opt(key, (int, float), positive=True)) is not None else None  # noqa: E731
        return cls(architecture=arch, **ints,
                   rms_norm_eps=float(get("rms_norm_eps", (int, float), positive=True)),
                   rope_theta=float(get("rope_theta", (int, float), positive=True)),
                   rope_scaling=scaling,
                   tie_word_embeddings=get("tie_word_embeddings", (bool,)),
                   attention_bias=get("attention_bias", (bool,)),
                   bos_token_id=bos, eos_token_ids=tuple(eos), pad_token_id=pad,
                   activation=activation, qk_norm=opt("qk_norm", (bool,), False),
                   post_norms=opt("post_norms", (bool,), False),
                   embedding_multiplier=float(opt("embedding_multiplier", (int, float), 1.0, positive=True)),
                   query_pre_attn_scalar=num("query_pre_attn_scalar"),
                   attn_logit_softcapping=num("attn_logit_softcapping"),
                   final_logit_softcapping=num("final_logit_softcapping"),
                   sliding_window=window, layer_types=layer_types, rope_local_theta=num("rope_local_theta"))

    def to_dict(self) -> dict:
        d = {f: getattr(self, f) for f in self.__dataclass_fields__}
        d["eos_token_ids"] = list(self.eos_token_ids)
        d["layer_types"] = list(self.layer_types) if self.layer_types is not None else None
        return d


def _check_rope_scaling(scaling: dict | None, head_dim: int, file: str, field: str) -> None:
    """A known rope_type with the keys it needs; per-frequency lists hold head_dim / 2 positive numbers."""
    if scaling is None:
        return
    kind = scaling.get("rope_type")
    if kind not in ROPE_SCALING_KEYS:
        raise FormatError(file, f"{field}.rope_type", f"is {kind!r}", "one of " + ", ".join(ROPE_SCALING_KEYS))
    for key in ROPE_SCALING_KEYS[kind]:
        v = scaling.get(key)
        if isinstance(v, list):
            if len(v) != head_dim // 2 or not all(isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0
                                                  for x in v):
                raise FormatError(file, f"{field}.{key}", f"has {len(v)} entries",
                                  f"{head_dim // 2} positive numbers (one per RoPE frequency)")
        elif key in ("factors", "short_factor", "long_factor") or isinstance(v, bool) \
                or not isinstance(v, (int, float)) or not v > 0:
            raise FormatError(file, f"{field}.{key}", f"is {v!r}", f"a positive number for {kind} scaling"
                              if key not in ("factors", "short_factor", "long_factor") else "a list of numbers")


def _finite_positive(v, file: str, field: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise FormatError(file, field, f"is {v!r}", "a finite number > 0")
    return float(v)


def check_config_ranges(d: dict, file: str, prefix: str = "config") -> None:
    """Values that parse but cannot run: non-finite or non-positive rms_norm_eps / rope_theta, and a rope_scaling
    that divides by zero (factor 0, llama3 with low_freq_factor == high_freq_factor). Raised here, at pack, verify
    and load, rather than as wrong numbers at generation time. (_check_rope_scaling checks the type and keys.)"""
    for key in ("rms_norm_eps", "rope_theta"):
        _finite_positive(d.get(key), file, f"{prefix}.{key}")
    sc = d.get("rope_scaling")
    if sc is None:
        return
    f = f"{prefix}.rope_scaling"
    if not isinstance(sc, dict):
        raise FormatError(file, f, f"is {sc!r}", "null or an object")
    kind = sc.get("rope_type", sc.get("type"))
    if kind in ("linear", "llama3"):
        _finite_positive(sc.get("factor"), file, f"{f}.factor")
    if kind == "llama3":
        lo = _finite_positive(sc.get("low_freq_factor"), file, f"{f}.low_freq_factor")
        hi = _finite_positive(sc.get("high_freq_factor"), file, f"{f}.high_freq_factor")
        if hi <= lo:
            raise FormatError(file, f"{f}.high_freq_factor", f"is {hi}, not above low_freq_factor={lo}",
                              "high_freq_factor > low_freq_factor (llama3 divides by their difference)")
        old = sc.get("original_max_position_embeddings")
        if isinstance(old, bool) or not isinstance(old, int) or old <= 0:
            raise FormatError(file, f"{f}.original_max_position_embeddings", f"is {old!r}", "an integer > 0")


def expected_tensor_count(cfg: ModelConfig) -> int:
    """len(expected_tensors(cfg)), without building the list: checked against what a file holds before anything
    is sized by num_hidden_layers (a manifest or GGUF declaring 10**9 layers must fail at once, not run out of
    memory)."""
    per_layer = 9 + 3 * cfg.attention_bias + 2 * cfg.qk_norm + 2 * cfg.post_norms
    return 2 + cfg.num_hidden_layers * per_layer + (0 if cfg.tie_word_embeddings else 1)


def expected_tensors(cfg: ModelConfig) -> list[tuple[str, list[int]]]:
    """Canonical (name, shape) list in canonical order for a config."""
    h, q, kv, f = cfg.hidden_size, cfg.q_dim, cfg.kv_dim, cfg.intermediate_size
    out: list[tuple[str, list[int]]] = [("embed", [cfg.vocab_size, h])]
    for i in range(cfg.num_hidden_layers):
        p = f"layers.{i}."
        out += [(p + "attn_norm", [h]), (p + "q", [q, h]), (p + "k", [kv, h]), (p + "v", [kv, h])]
        if cfg.attention_bias:
            out += [(p + "q_bias", [q]), (p + "k_bias", [kv]), (p + "v_bias", [kv])]
        if cfg.qk_norm:
            out += [(p + "q_norm", [cfg.head_dim]), (p + "k_norm", [cfg.head_dim])]
        out.append((p + "o", [h, q]))
        if cfg.post_norms:
            out.append((p + "post_attn_norm", [h]))
        out += [(p + "ffn_norm", [h]), (p + "gate", [f, h]), (p + "up", [f, h]), (p + "down", [h, f])]
        if cfg.post_norms:
            out.append((p + "post_ffn_norm", [h]))
    out.append(("norm", [h]))
    if not cfg.tie_word_embeddings:
        out.append(("lm_head", [cfg.vocab_size, h]))
    return out


# ----------------------------------------------------------------------------------------------------------
# tensors


@dataclass(frozen=True)
class ComponentRef:
    file: str
    offset: int
    bytes: int


@dataclass(frozen=True)
class Part:
    rows: tuple[int, int]
    components: dict[str, ComponentRef]


@dataclass(frozen=True)
class Binding:
    rows: tuple[int, int]
    parts: tuple[Part, ...]


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    group_size: int | None
    k_padded: int | None
    source_type: str
    lossless: bool
    error: dict
    bindings: tuple[Binding, ...]

    @property
    def rows(self) -> int:
        return self.shape[0]

    @property
    def k(self) -> int:
        return self.shape[1] if len(self.shape) == 2 else 1

    @property
    def components(self) -> tuple[str, ...]:
        return FORMATS[self.dtype].components

    def row_bytes(self, component: str) -> int:
        if self.dtype == "f32":
            return 4 * self.k
        return component_row_bytes(self.dtype, component, self.k, self.group_size)


def _int(v, file, field, *, lo=0) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise FormatError(file, field, f"is {v!r}", f"an integer >= {lo}")
    return v


def _rows(v, file, field) -> tuple[int, int]:
    if not (isinstance(v, list) and len(v) == 2):
        raise FormatError(file, field, f"is {v!r}", "[first_row, end_row]")
    a, b = _int(v[0], file, field), _int(v[1], file, field)
    if b <= a:
        raise FormatError(file, field, f"is {v!r}", "a non-empty row range")
    return a, b


def _tensor_from_dict(t: Any, idx: int, files: dict[str, int], file: str) -> TensorInfo:
    field = f"tensors[{idx}]"
    if not isinstance(t, dict):
        raise FormatError(file, field, f"is {type(t).__name__}", "an object")
    name = t.get("name")
    if not isinstance(name, str):
        raise FormatError(file, f"{field}.name", f"is {name!r}", "a string")
    field = f"tensors[{name}]"
    dtype = t.get("dtype")
    if dtype not in FORMATS:
        raise FormatError(file, f"{field}.dtype", f"is {dtype!r}", "one of " + ", ".join(FORMATS))
    shape = t.get("shape")
    if not (isinstance(shape, list) and len(shape) in (1, 2)):
        raise FormatError(file, f"{field}.shape", f"is {shape!r}", "[N] or [N, K]")
    shape = tuple(_int(s, file, f"{field}.shape", lo=1) for s in shape)
    gs = kp = None
    if dtype != "f32":
        if len(shape) != 2:
            raise FormatError(file, f"{field}.shape", f"{dtype} tensor has shape {list(shape)}", "[N, K]")
        gs = _int(t.get("group_size"), file, f"{field}.group_size", lo=1)
        fixed = FORMATS[dtype].fixed_group
        if (gs != fixed) if fixed else (gs not in GROUP_SIZES):
            raise FormatError(file, f"{field}.group_size", f"is {gs}",
                              f"{fixed} for {dtype}" if fixed else f"one of {list(GROUP_SIZES)} for {dtype}")
        kp = _int(t.get("k_padded"), file, f"{field}.k_padded", lo=1)
        if kp != -(-shape[1] // gs) * gs:
            raise FormatError(file, f"{field}.k_padded", f"is {kp}", f"K={shape[1]} rounded up to a multiple of {gs}")
    info = TensorInfo(name=name, dtype=dtype, shape=shape, group_size=gs, k_padded=kp,
                      source_type=str(t.get("source_type", "")), lossless=bool(t.get("lossless", False)),
                      error=t.get("error") or {}, bindings=())
    comps = FORMATS[dtype].components
    raw_bindings = t.get("bindings")
    if not isinstance(raw_bindings, list) or not raw_bindings:
        raise FormatError(file, f"{field}.bindings", f"is {raw_bindings!r}", "a non-empty list")
    bindings, next_row = [], 0
    for bi, b in enumerate(raw_bindings):
        bf = f"{field}.bindings[{bi}]"
        if not isinstance(b, dict):
            raise FormatError(file, bf, "is not an object")
        brows = _rows(b.get("rows"), file, f"{bf}.rows")
        if brows[0] != next_row:
            raise FormatError(file, f"{bf}.rows", f"starts at row {brows[0]}", f"row {next_row} (contiguous bindings)")
        raw_parts = b.get("parts")
        if not isinstance(raw_parts, list) or not raw_parts:
            raise FormatError(file, f"{bf}.parts", f"is {raw_parts!r}", "a non-empty list")
        parts, prow = [], brows[0]
        for pi, p in enumerate(raw_parts):
            pf = f"{bf}.parts[{pi}]"
            if not isinstance(p, dict):
                raise FormatError(file, pf, "is not an object")
            prows = _rows(p.get("rows"), file, f"{pf}.rows")
            if prows[0] != prow:
                raise FormatError(file, f"{pf}.rows", f"starts at row {prows[0]}", f"row {prow} (contiguous parts)")
            prow = prows[1]
            raw_c = p.get("components")
            if not isinstance(raw_c, dict) or sorted(raw_c) != sorted(comps):
                got = sorted(raw_c) if isinstance(raw_c, dict) else raw_c
                raise FormatError(file, f"{pf}.components", f"is {got!r}", f"exactly {list(comps)} for {dtype}")
            refs = {}
            for c in comps:
                r, cf = raw_c[c], f"{pf}.components.{c}"
                if not isinstance(r, dict):
                    raise FormatError(file, cf, "is not an object")
                fname = r.get("file")
                if not isinstance(fname, str) or fname not in files:
                    raise FormatError(file, f"{cf}.file", f"{fname!r} is not in the files list")
                off = _int(r.get("offset"), file, f"{cf}.offset")
                if off % OFFSET_ALIGN:
                    raise FormatError(file, f"{cf}.offset", f"is {off}", f"a multiple of {OFFSET_ALIGN}")
                nb = _int(r.get("bytes"), file, f"{cf}.bytes")
                want = (prows[1] - prows[0]) * info.row_bytes(c)
                if nb != want:
                    raise FormatError(file, f"{cf}.bytes", f"is {nb}", f"{want} for rows {list(prows)}")
                if off + nb > files[fname]:
                    raise FormatError(file, cf, f"bytes [{off}, {off + nb}) lie outside {fname} ({files[fname]} bytes)")
                refs[c] = ComponentRef(fname, off, nb)
            parts.append(Part(prows, refs))
        if prow != brows[1]:
            raise FormatError(file, f"{bf}.parts", f"cover rows up to {prow}", f"rows up to {brows[1]}")
        for c in comps:
            if (brows[1] - brows[0]) * info.row_bytes(c) > MAX_BINDING_BYTES:
                raise FormatError(file, f"{bf}.rows", f"component {c} exceeds {MAX_BINDING_BYTES} bytes",
                                  "bindings that fit one storage binding")
        bindings.append(Binding(brows, tuple(parts)))
        next_row = brows[1]
    if next_row != shape[0]:
        raise FormatError(file, f"{field}.bindings", f"cover rows up to {next_row}", f"all {shape[0]} rows")
    return TensorInfo(**{**info.__dict__, "bindings": tuple(bindings)})


# ----------------------------------------------------------------------------------------------------------
# local files, checked against their hashes

_HASH_CHUNK = 8 << 20
# files hashed and found intact in this process: (real path, size, mtime_ns, inode) -> sha256
_INTACT: dict[tuple[str, int, int, int], str] = {}


def sha256_file(fh) -> str:
    h = hashlib.sha256()
    fh.seek(0)
    while block := fh.read(_HASH_CHUNK):
        h.update(block)
    return h.hexdigest()


class VerifiedFiles:
    """The reader of a package folder: a file's bytes are served only once its sha256 matched the manifest.

    Each file is hashed on first use (about 0.1-0.3 s per 100 MB) and remembered for the process, keyed by its
    size, mtime and inode, so it is hashed again only when it changes. Nothing is written into the package. A
    missing, resized or altered file raises IntegrityError naming it."""

    def __init__(self, root: str, files: dict[str, dict] | None = None):
        self.root, self.files = root, files or {}

    def check(self, name: str, fh) -> None:
        """Raise IntegrityError unless the open file `fh` (the package's `name`) is intact."""
        entry = self.files[name]
        path = os.path.join(self.root, name)
        st = os.fstat(fh.fileno())
        key = (os.path.realpath(path), st.st_size, st.st_mtime_ns, st.st_ino)
        if _INTACT.get(key) == entry["sha256"]:
            return
        if st.st_size != entry["bytes"]:
            raise IntegrityError(path, f"{entry['bytes']} bytes", f"{st.st_size} bytes")
        digest = sha256_file(fh)
        if digest != entry["sha256"]:
            raise IntegrityError(path, f"sha256 {entry['sha256']}", f"sha256 {digest}")
        _INTACT[key] = digest

    def check_all(self) -> None:
        """Check every file of the package now (IntegrityError naming the first bad one)."""
        for name in self.files:
            with self.open(name) as fh:
                self.check(name, fh)

    def open(self, name: str):
        path = os.path.join(self.root, name)
        if name not in self.files:
            raise KeyError(f"{name} is not a file of this package")
        try:
            return open(path, "rb")
        except FileNotFoundError:
            e = self.files[name]
            raise IntegrityError(path, f"a file of {e['bytes']} bytes, sha256 {e['sha256']}", "no such file") from None

    def __call__(self, name: str, offset: int, size: int) -> bytes:
        with self.open(name) as fh:
            self.check(name, fh)
            fh.seek(offset)
            data = fh.read(size)
        if len(data) != size:
            raise IntegrityError(os.path.join(self.root, name), f"at least {offset + size} bytes",
                                 f"{offset + len(data)} bytes")
        return data


# ----------------------------------------------------------------------------------------------------------
# checks that need more than the manifest: the tokenizer against the config, the chat template by rendering


def check_token_ids(tok: dict, cfg: ModelConfig, file: str) -> None:
    """Every id in model.vocab and added_tokens is an integer in [0, config.vocab_size): ids past the embedding
    would read outside it. Cheap (one pass, no tokenizer built), so loading runs it too."""
    vocab = tok["model"].get("vocab")
    entries = list(vocab.items()) if isinstance(vocab, dict) else []
    added = tok.get("added_tokens") if isinstance(tok.get("added_tokens"), list) else []
    entries += [(a.get("content"), a.get("id")) for a in added if isinstance(a, dict)]
    for n, (text, i) in enumerate(entries):
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < cfg.vocab_size:
            where = f"model.vocab[{text!r}]" if n < len(entries) - len(added) else f"added_tokens[id={i}]"
            raise FormatError(file, where, f"token id {i!r} is outside the model's vocabulary",
                              f"an integer id in [0, config.vocab_size = {cfg.vocab_size})")


def check_tokenizer(tok: dict, cfg: ModelConfig, file: str) -> None:
    """check_token_ids, then the whole tokenizer built as the runtime builds it: negative or duplicate ids and
    merges naming unknown tokens are refused there; its FormatError is re-raised naming `file`."""
    from webinfer.tokenizer import Tokenizer  # noqa: PLC0415

    check_token_ids(tok, cfg, file)
    try:
        Tokenizer.from_json(tok)
    except FormatError as e:
        raise FormatError(file, e.field, e.problem, e.expected) from None


# f16 components, per format (webinfer/formats.py); f32 tensors hold f32 `data`
_F16_COMPONENTS = {"scales": ("q4", "q4a", "q8", "q5_0", "q5_1", "iq4nl"), "mins": ("q4a", "q5_1"),
                   "super": ("q4k", "q5k", "q6k", "q3k", "q2k", "iq4xs")}
# high byte of a little-endian f16 -> 1 when its exponent bits are all ones (infinity or NaN)
_F16_NONFINITE = bytes(1 if (b & 0x7C) == 0x7C else 0 for b in range(256))


def check_finite(pkg: "Package") -> None:
    """Every f16 scale/min and f32 value of the package is finite: an infinite scale passes every hash (a
    re-hashed edit, an overflow when quantizing huge weights) and makes the model emit token 0 forever."""
    for name, t in pkg.tensors.items():
        for c in t.components:
            half = t.dtype in _F16_COMPONENTS.get(c, ())
            if not half and t.dtype != "f32":
                continue
            for b in range(len(t.bindings)):
                data = pkg.read_component(name, c, b)
                if half:
                    bad = 1 in data[1::2].translate(_F16_NONFINITE)
                else:
                    bad = any(x != x or x in (math.inf, -math.inf) for x in memoryview(data).cast("f"))
                if bad:
                    raise FormatError(pkg.where, f"tensors[{name}].{c}", f"binding {b} holds infinity or NaN",
                                      "finite values")


# a small conversation every chat template must render within the template bounds
STANDARD_CONVERSATION = [{"role": "user", "content": "Hello!"}, {"role": "assistant", "content": "Hi. How can I help?"},
                         {"role": "user", "content": "Tell me a short story."}]


def check_chat_template(template: str | None, special_tokens: dict, file: str) -> None:
    """Render STANDARD_CONVERSATION (with the generation prompt) under the default template bounds; a template
    that does not compile, fails or overruns a bound is refused here, at pack and verify, not at serve time."""
    if template is None:
        return
    from webinfer.chat_template import render  # noqa: PLC0415
    from webinfer.errors import ChatTemplateError  # noqa: PLC0415

    sp = special_tokens if isinstance(special_tokens, dict) else {}
    try:
        render(template, STANDARD_CONVERSATION, add_generation_prompt=True, bos_token=sp.get("bos_token") or "",
               eos_token=sp.get("eos_token") or "")
    except ChatTemplateError as e:
        raise FormatError(file, "chat_template", f"cannot render a three-message conversation: {e}",
                          "a template that renders within the bounds") from None
    except Exception as e:  # noqa: BLE001 - jinja2's SecurityError and the like: the template is unusable
        raise FormatError(file, "chat_template", f"cannot render a three-message conversation: "
                          f"{type(e).__name__}: {e}") from None


# ----------------------------------------------------------------------------------------------------------
# the package


class Package:
    """A validated manifest plus a way to read the package's files."""

    def __init__(self, manifest: dict, reader: Reader, where: str = MANIFEST, root: str | None = None):
        self.manifest, self._reader, self.where, self.root = manifest, reader, where, root
        m, f = manifest, where
        if not isinstance(m, dict):
            raise FormatError(f, "(top level)", f"is {type(m).__name__}", "a JSON object")
        if m.get("format") != FORMAT:
            raise FormatError(f, "format", f"is {m.get('format')!r}", repr(FORMAT))
        if m.get("format_version") != FORMAT_VERSION:
            raise FormatError(f, "format_version", f"package has version {m.get('format_version')!r}, "
                              f"this reader knows version {FORMAT_VERSION}", f"format_version {FORMAT_VERSION}")
        self.name = m.get("name") if isinstance(m.get("name"), str) else ""
        self.config = ModelConfig.from_dict(m.get("config"), f)
        files = m.get("files")
        if not isinstance(files, list):
            raise FormatError(f, "files", f"is {files!r}", "a list")
        self.files: dict[str, dict] = {}
        for i, e in enumerate(files):
            if not (isinstance(e, dict) and isinstance(e.get("name"), str) and _SHA_NAME.match(e["name"])):
                raise FormatError(f, f"files[{i}]", f"is {e!r}", "{name: <sha256>.bin|json, bytes, sha256}")
            _int(e.get("bytes"), f, f"files[{i}].bytes")
            if e.get("sha256") != e["name"].split(".")[0]:
                raise FormatError(f, f"files[{i}].sha256", f"{e.get('sha256')!r} does not match the name {e['name']}")
            if e["name"] in self.files:
                raise FormatError(f, f"files[{i}].name", f"{e['name']} is listed twice")
            self.files[e["name"]] = e
        sizes = {n: e["bytes"] for n, e in self.files.items()}
        tok = m.get("tokenizer")
        if not (isinstance(tok, dict) and tok.get("file") in self.files):
            raise FormatError(f, "tokenizer.file", f"is {tok!r}", "a file listed in files")
        raw_tensors = m.get("tensors")
        if not isinstance(raw_tensors, list):
            raise FormatError(f, "tensors", f"is {raw_tensors!r}", "a list")
        if len(raw_tensors) != expected_tensor_count(self.config):
            raise FormatError(f, "tensors", f"lists {len(raw_tensors)} tensors", f"{expected_tensor_count(self.config)} "
                              f"for num_hidden_layers={self.config.num_hidden_layers}")
        self.tensors: dict[str, TensorInfo] = {}
        for i, t in enumerate(raw_tensors):
            info = _tensor_from_dict(t, i, sizes, f)
            if info.name in self.tensors:
                raise FormatError(f, f"tensors[{info.name}]", "is listed twice")
            self.tensors[info.name] = info
        want = expected_tensors(self.config)
        names = [n for n, _ in want]
        if list(self.tensors) != names:
            missing = [n for n in names if n not in self.tensors]
            extra = [n for n in self.tensors if n not in set(names)]
            raise FormatError(f, "tensors", f"missing {missing[:5]}, unexpected {extra[:5]}" if missing or extra
                              else "are not in canonical order", "the canonical tensors of the config")
        for n, shape in want:
            if list(self.tensors[n].shape) != shape:
                raise FormatError(f, f"tensors[{n}].shape", f"is {list(self.tensors[n].shape)}", f"{shape} from config")
        tpl = m.get("chat_template")
        self.chat_template: str | None = tpl if isinstance(tpl, str) else None
        st = m.get("special_tokens")
        self.special_tokens: dict = st if isinstance(st, dict) else {}
        self.quantization: dict = m.get("quantization") or {}

    # -- construction

    @classmethod
    def from_manifest(cls, manifest: dict, reader: Reader, where: str = MANIFEST) -> "Package":
        return cls(manifest, reader, where)

    @classmethod
    def open(cls, path) -> "Package":
        root = os.fspath(path)
        mpath = os.path.join(root, MANIFEST)
        try:
            with open(mpath, "rb") as fh:
                raw = fh.read()
        except FileNotFoundError:
            raise FormatError(mpath, "(file)", "does not exist", "a webinfer package folder with manifest.json") from None
        try:
            manifest = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise FormatError(mpath, "(json)", f"is not valid JSON: {e}") from None

        files = VerifiedFiles(root)
        pkg = cls(manifest, files, mpath, root)
        files.files = pkg.files  # the validated file list: known only once the manifest passed
        return pkg

    # -- access

    def check_files(self) -> None:
        """Check every listed file against its size and sha256 now (IntegrityError naming the first bad one); a
        package opened from a folder otherwise checks each file on its first read."""
        if isinstance(self._reader, VerifiedFiles):
            return self._reader.check_all()
        for name, e in self.files.items():
            digest = hashlib.sha256(self.read_file(name)).hexdigest()
            if digest != e["sha256"]:
                raise IntegrityError(name, f"sha256 {e['sha256']}", f"sha256 {digest}")

    def read_file(self, name: str) -> bytes:
        return self._reader(name, 0, self.files[name]["bytes"])

    def read_component(self, name: str, component: str, binding: int = 0) -> bytes:
        """The bytes of one component of one binding: its rows, contiguous, as one storage buffer holds them."""
        t = self.tensors[name]
        if component not in t.components:
            raise KeyError(f"{name} ({t.dtype}) has no component {component!r}; it has {list(t.components)}")
        return b"".join(self._reader(p.components[component].file, p.components[component].offset,
                                     p.components[component].bytes) for p in t.bindings[binding].parts)

    def tokenizer_json(self) -> dict:
        tok = self.manifest["tokenizer"]
        data = self.read_file(tok["file"])
        digest = hashlib.sha256(data).hexdigest()
        if digest != tok["file"].split(".")[0]:
            raise IntegrityError(tok["file"], f"sha256 {tok['file'].split('.')[0]}", f"sha256 {digest}")
        try:
            out = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise FormatError(tok["file"], "(json)", f"is not valid JSON: {e}") from None
        if not isinstance(out, dict) or not isinstance(out.get("model"), dict):
            raise FormatError(tok["file"], "model", "missing", "a Hugging Face tokenizer.json")
        check_token_ids(out, self.config, tok["file"])  # the rest is checked when the Tokenizer is built
        return out

    def validate(self) -> None:
        """The checks that read more than the manifest (pack and verify run them; loading runs the tokenizer's):
        tokenizer ids within config.vocab_size, finite scales and f32 values, and a chat template that renders a
        small conversation."""
        check_tokenizer(self.tokenizer_json(), self.config, self.manifest["tokenizer"]["file"])
        check_finite(self)
        check_chat_template(self.chat_template, self.special_tokens, f"{self.where}")
