"""Quantized linear layers on the GPU: y[t, :] = W x[t, :] for every weight format of webinfer/formats.py.

Two kernels share one per-output arithmetic (shaders/linear_common.wgsl): gemv.wgsl (decode rows: each invocation
loads and unpacks 4 weight rows' chunk once and applies it to a tile of up to 8 activation rows) and gemm.wgsl
(prefill rows: 4 or 8 weight rows (gemm_rows) x TT activation rows that the whole workgroup shares, their chunks
broadcast in the subgroup). Batch invariance rule: every y[t, n] is a sequential sum over 32-element chunks in a fixed order,
whatever T is and whichever other rows share the dispatch. The two kernels may differ in the last bits, so the
model picks per sequence from the sequence's own chunk: one-token chunks -> gemv over rows [0, step[count_index]);
multi-token chunks -> gemm over rows [step[start_index], + step[count_index]).

Decide, then bind (ggml-webgpu's get_X_pipeline pattern):
    key = LinearKey("gemv", "q4k", tile=8, norm=True)    # what varies between pipelines (typed, hashable)
    v = linear_variant(key)                              # its decisions: defines, binding slots, rows per invocation
    Linear(lib, weight, io, ...)                          # builds the variants' pipelines, parameters, bind groups
`encode(cmds, rows)` per step only records dispatches whose grid depends on the row count; the kernel reads the
row count itself from the per-step buffer, so the same bind groups serve every step.

A weight on the device (`QuantWeight`) is split by rows into storage bindings (`WeightPart`s, the package's
bindings), each holding qweight, qhigh (q5/q6/q3k formats) and one `meta` buffer: its scales, then mins, then
super-block words (`pack_meta`; each row padded to whole vec4s), so a q5k GEMV with a folded norm and a bias stays within 8 storage bindings.

Pure Python (it runs in Pyodide): parameters are packed with `struct`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, Mapping

from ..formats import FORMATS, row_bytes
from .common import WG, ParamsFn, ceil_div, standalone_params
from .library import LazyPipeline

ROWS_PER_INVOCATION = 4
AUTO_TILES = (1, 4, 8)  # gemv TILE variants: the dispatch picks the smallest that holds the rows
KSPLITS = (1, 2, 4, 8, 16, 32)  # gemv lanes per row group: divisors of WG
# (lavapipe: a tile of 8 costs ~2x a tile of 1 for a single row, the skipped slots still cost registers)
GEMM_TOKENS = 8  # gemm TT: activation rows per invocation (all lanes of a workgroup share them)
GEMM_ROWS = (8, 4)  # gemm weight rows per invocation, by preference (see gemm_rows)
_PARAMS = "<10If5I"  # Params in linear_common.wgsl (64 bytes)
META = ("scales", "mins", "super")  # the components packed into one meta buffer, in this order


def tiles_for(max_rows: int) -> tuple[int, ...]:
    """The decode tiles a model whose steps hold at most max_rows decode rows can use: larger ones would never be
    picked, and each is one more pipeline to compile at load (seconds each in a software-GPU browser)."""
    return tuple(t for t in AUTO_TILES if t < max_rows) + tuple(t for t in AUTO_TILES if t >= max_rows)[:1]


def default_ksplit(device) -> int:
    """Lanes per row group for a model's decode GEMVs on this device (gemv.wgsl KSPLIT). A GPU runs thousands of
    lanes: with one lane per 4 rows SmolLM2's 576-row matrices would occupy 144 of them, each walking a whole row
    with uncoalesced 16-byte loads, so a GPU gets 8 lanes per row group (consecutive lanes reading consecutive
    vec4s of a row). A CPU adapter (lavapipe; SwiftShader is the browser's fallback adapter) runs 8 lanes as one
    SIMD batch on one core and only pays for the extra loads and the reduction there: 1."""
    return 1 if device.info.is_fallback else 8


def format_defines(dtype: str) -> dict[str, object]:
    """The WGSL defines that select a weight format in quant_unpack.wgsl (shared by the linear and embed keys)."""
    if dtype not in FORMATS or dtype == "f32":
        raise ValueError(f"unsupported weight dtype {dtype!r} (one of {', '.join(n for n in FORMATS if n != 'f32')})")
    comps = FORMATS[dtype].components
    d: dict[str, object] = {"DTYPE": dtype}
    if "qhigh" in comps:
        d["QHIGH"] = 1
    if "mins" in comps:
        d["MINS"] = 1
    if "super" in comps:
        d["KQUANT"] = 1
    if FORMATS[dtype].sub_block == 16:
        d["SUB16"] = 1  # two scales per 32-element chunk
    if dtype in ("q6k", "q3k", "iq4xs"):
        d["D2"] = 1  # two f16 d per super-block word, no dmin
    if dtype in ("q2k", "q3k"):
        d["BITS2"] = 1  # 2-bit qweight
    if dtype in ("iq4nl", "iq4xs"):
        d["IQ4"] = 1  # codes index the codebook formats.IQ4_KV
    return d


@dataclass(frozen=True)
class WeightLayout:
    """Per-row strides of one [*, k] weight in a format (all from webinfer/formats.py)."""

    dtype: str
    k: int
    group_size: int

    def words(self, component: str) -> int:
        """u32 words per row of `component` (0 when the format has none)."""
        if component not in FORMATS[self.dtype].components:
            return 0
        return row_bytes(self.dtype, component, self.k, self.group_size) // 4

    def meta_words(self, component: str) -> int:
        """u32 words per row of a meta component inside a meta buffer: `words` rounded up to whole vec4s (the
        kernels load a row's scale words 4 at a time; quant_unpack.wgsl meta_words)."""
        return -(-self.words(component) // 4) * 4

    @property
    def w_stride4(self) -> int:
        return self.words("qweight") // 4

    def meta_offsets(self, rows: int) -> tuple[int, int]:
        """(mins, super) word offsets inside a meta buffer of `rows` rows."""
        m_off = rows * self.meta_words("scales")
        return m_off, m_off + rows * self.meta_words("mins")


def pack_meta(dtype: str, components: Mapping[str, bytes], rows: int) -> bytes:
    """One meta buffer's bytes from the per-row components of `rows` rows: scales, then mins, then super, every
    row of each padded with zero words to a multiple of 4 words (16 bytes: WeightLayout.meta_words)."""
    out = []
    for c in META:
        if c not in FORMATS[dtype].components:
            continue
        data = bytes(components[c])
        if rows <= 0 or len(data) % rows or (len(data) // rows) % 4:
            raise ValueError(f"pack_meta: {len(data)} bytes of {dtype} {c} do not split into {rows} rows of words")
        rb = len(data) // rows
        pad = b"\0" * (-rb % 16)
        out += [data[i * rb : (i + 1) * rb] + pad for i in range(rows)] if pad else [data]
    return b"".join(out)


@dataclass(frozen=True)
class WeightPart:
    """One storage binding of a weight: rows [row0, row0 + rows), its qweight, meta (pack_meta) and qhigh."""

    row0: int
    rows: int
    qweight: Any  # BufferBinding or buffer
    meta: Any
    qhigh: Any = None  # q5_0, q5_1, q5k, q6k, q3k


@dataclass(frozen=True)
class QuantWeight:
    """A quantized [n, k] matrix on the device, split by rows into storage bindings."""

    dtype: str
    n: int
    k: int
    group_size: int
    parts: tuple[WeightPart, ...]

    def __post_init__(self):
        format_defines(self.dtype)  # validates the dtype
        if self.group_size % 32:
            raise ValueError(f"weight group size {self.group_size} must be a multiple of 32")
        fixed = FORMATS[self.dtype].fixed_group
        if fixed is not None and self.group_size != fixed:
            raise ValueError(f"{self.dtype} weights have group size {fixed}, not {self.group_size}")
        need_high = "qhigh" in FORMATS[self.dtype].components
        for p in self.parts:
            if (p.qhigh is not None) != need_high:
                raise ValueError(f"{self.dtype} weights {'need' if need_high else 'have no'} a qhigh binding")

    @property
    def layout(self) -> WeightLayout:
        return WeightLayout(self.dtype, self.k, self.group_size)


@dataclass(frozen=True)
class LinearKey:
    """What distinguishes one linear pipeline from another."""

    kernel: str  # "gemv" (decode rows) | "gemm" (prefill rows)
    dtype: str
    tile: int  # gemv: TILE (1, 4, 8); gemm: TT (4, 8)
    bias: bool = False
    accumulate: bool = False  # y += W x (the residual epilogue)
    swiglu: bool = False  # gate/up interleaved in blocks of 4; y = silu(gate) * up
    norm: bool = False  # gemv only: RMSNorm of x folded in
    rows: int = ROWS_PER_INVOCATION  # gemm: weight rows per invocation (4 or 8; swiglu is always 4 gate + 4 up)
    ksplit: int = 1  # gemv: lanes per row group, each summing every ksplit-th chunk (gemv.wgsl KSPLIT)


@dataclass(frozen=True)
class LinearVariant:
    """A key's decisions: preprocessor defines, what each @binding holds, weight rows per invocation."""

    key: LinearKey
    defines: tuple[tuple[str, object], ...]
    bindings: tuple[str, ...]  # names, in @binding order
    rows_per_invocation: int

    def grid_x(self, rows: int) -> int:
        return ceil_div(ceil_div(rows, self.rows_per_invocation) * self.key.ksplit, WG)


def linear_variant(key: LinearKey) -> LinearVariant:
    """The one place that turns a LinearKey into shader defines and a binding layout (linear_common.wgsl)."""
    if key.kernel not in ("gemv", "gemm"):
        raise ValueError(f"Linear: kernel must be 'gemv' or 'gemm', not {key.kernel!r}")
    if key.kernel == "gemv" and key.tile not in AUTO_TILES:
        raise ValueError(f"Linear: the decode tile must be one of {AUTO_TILES}, not {key.tile!r}")
    if key.kernel == "gemm" and key.tile not in (4, 8):
        raise ValueError(f"Linear: gemm tokens per invocation must be 4 or 8, not {key.tile}")
    if key.norm and key.kernel != "gemv":
        raise ValueError("Linear: a folded RMSNorm (norm=...) is implemented in the gemv kernel only")
    if key.swiglu and (key.bias or key.accumulate):
        raise ValueError("Linear: the swiglu epilogue takes no bias and no accumulate")
    if key.ksplit not in KSPLITS or (key.ksplit != 1 and key.kernel != "gemv"):
        raise ValueError(f"Linear: ksplit (lanes per row group) is a gemv layout, one of {KSPLITS}; got {key.ksplit} "
                         f"for {key.kernel}")
    if key.rows not in (4, 8) or (key.rows == 8 and key.kernel != "gemm"):
        raise ValueError(f"Linear: 8 weight rows per invocation is a gemm layout; got {key.rows} for {key.kernel}")
    d = {**format_defines(key.dtype), "WG": WG, "TILE" if key.kernel == "gemv" else "TT": key.tile}
    names = ["qweight", "meta", "x", "y", "params", "step"]
    for flag, name, define in ((True, "qhigh", "QHIGH"), (key.norm, "norm", "NORM"), (key.bias, "bias", "BIAS")):
        if flag and (name != "qhigh" or "QHIGH" in d):
            d[f"{define}_SLOT"] = len(names)
            d[define] = 1
            names.append(name)
    if key.ksplit != 1:
        d["KSPLIT"] = key.ksplit
    if key.accumulate:
        d["ACCUMULATE"] = 1
    if key.swiglu:
        d["SWIGLU"] = 1
    if key.swiglu or key.rows == 8:
        d["PAIR"] = 1  # gemm.wgsl: two blocks of 4 weight rows per invocation
    return LinearVariant(key, tuple(sorted(d.items())), tuple(names), 2 * ROWS_PER_INVOCATION if key.swiglu
                         else key.rows)


@dataclass(frozen=True)
class LinearIO:
    """Where a Linear reads and writes: row-major f32 matrices x [*, x_stride] and y [*, y_stride] (floats;
    x_stride a multiple of 4), and which step[] entries hold the row count and (gemm) the first row."""

    x: Any
    y: Any
    x_stride: int
    y_stride: int
    step: Any
    count_index: int = 0
    start_index: int = 0
    n_offset: int = 0  # column of y where W's row 0 goes


@dataclass(frozen=True)
class Epilogue:
    """What happens to W x before it is stored. norm=(weight binding, eps): x is the un-normalised residual and
    the RMSNorm is folded into the GEMV (the binding holds K floats rounded up to a multiple of 4)."""

    bias: Any = None
    accumulate: bool = False
    swiglu: bool = False
    norm: tuple[Any, float] | None = None


@dataclass
class _Bound:
    variant: LinearVariant
    device: Any
    source: Any  # the pipeline, or a LazyPipeline
    bindings: list[tuple[list, int]]  # (bindings, grid x) per weight part
    pipeline: Any = None  # with groups: None until first use (`resolve`)
    groups: list[tuple[Any, int]] | None = None  # (bind group, grid x) per weight part

    def resolve(self) -> "_Bound":
        if self.groups is None:
            self.pipeline = self.source.get() if isinstance(self.source, LazyPipeline) else self.source
            self.groups = [(self.device.create_bind_group(self.pipeline, b), gx) for b, gx in self.bindings]
        return self


class Linear:
    """y[:, n_offset : n_offset + N] (=, +=, or + bias) W x for every row t < step[count_index] (gemm: from
    step[start_index]). swiglu: W holds gate and up rows interleaved in blocks of 4 (`interleave_gate_up`) and y
    receives silu(gate) * up (N/2 columns). tiles (gemv): the decode tiles to build, default all of AUTO_TILES,
    one picked per dispatch by the row count; a row's result does not depend on the tile or the other rows. Only
    the smallest tile (a single chat's decode) is compiled here, the others at first use or ahead of it by
    KernelLibrary.create_deferred.
    rows (gemm): weight rows per invocation, 4 or 8 (default gemm_rows(weight); the output bits are the same).
    ksplit (gemv): lanes per group of 4 weight rows, each summing every ksplit-th chunk (gemv.wgsl KSPLIT): for a
    GPU with thousands of lanes; a row's bits depend on it (not on the tile), so one model uses one value."""

    def __init__(self, lib, weight: QuantWeight, io: LinearIO, *, kernel: str = "gemv",
                 epilogue: Epilogue = Epilogue(), tiles: tuple[int, ...] | None = None,
                 params: ParamsFn | None = None, label: str = "linear", rows: int | None = None, ksplit: int = 1):
        ep = epilogue
        if io.x_stride % 4:
            raise ValueError(f"Linear: x row stride {io.x_stride} must be a multiple of 4 floats (vec4 loads)")
        if ep.swiglu and (weight.n % 8 or len(weight.parts) != 1):
            raise ValueError("Linear: swiglu needs one binding with 2*F rows, F a multiple of 4")
        if ep.bias is not None and len(weight.parts) != 1:
            raise ValueError("Linear: a bias is supported on single-binding weights only")
        tiles = tiles or (AUTO_TILES if kernel == "gemv" else (GEMM_TOKENS,))
        if rows is None:
            rows = gemm_rows(weight) if kernel == "gemm" and not ep.swiglu else ROWS_PER_INVOCATION
        keys = [LinearKey(kernel, weight.dtype, t, ep.bias is not None, ep.accumulate, ep.swiglu, ep.norm is not None,
                          rows, ksplit) for t in sorted(tiles)]
        variants = [linear_variant(k) for k in keys]  # decide (validates the key)
        self.n, self.k, self.label, self.dtype, self.kernel = weight.n, weight.k, label, weight.dtype, kernel
        params = params or standalone_params(lib.device)
        lay = weight.layout
        eps = float(ep.norm[1]) if ep.norm is not None else 0.0
        uniforms = []
        for p in weight.parts:
            m_off, sup_off = lay.meta_offsets(p.rows)
            uniforms.append(params(struct.pack(
                _PARAMS, p.rows, weight.k, weight.group_size, lay.w_stride4, lay.meta_words("scales"),
                io.x_stride // 4, io.y_stride, io.n_offset + p.row0, io.count_index, io.start_index, eps,
                lay.words("qhigh"), m_off, sup_off, lay.meta_words("super"), 0)))
        self._variants: list[_Bound] = []
        for i, v in enumerate(variants):  # bind: the smallest tile now, the larger ones at first use
            bindings = []
            for p, u in zip(weight.parts, uniforms):
                have = {"qweight": p.qweight, "meta": p.meta, "x": io.x, "y": io.y, "params": u, "step": io.step,
                        "qhigh": p.qhigh, "norm": ep.norm[0] if ep.norm is not None else None, "bias": ep.bias}
                bindings.append(([have[b] for b in v.bindings], v.grid_x(p.rows)))
            b = _Bound(v, lib.device, lib.variant_pipeline(kernel, v.defines, lazy=i > 0), bindings)
            self._variants.append(b if i else b.resolve())

    @property
    def tiles(self) -> tuple[int, ...]:
        return tuple(b.variant.key.tile for b in self._variants)

    def restrict_tiles(self, tiles: tuple[int, ...]) -> None:
        """Keep only these decode tiles (benchmarks: A/B against one tile)."""
        self._variants = [b for b in self._variants if b.variant.key.tile in tiles]

    def pick(self, rows: int) -> _Bound:
        """The smallest tile that holds `rows` in one workgroup row (the largest beyond that); a tile other than
        the smallest is compiled and bound here at its first use unless KernelLibrary.create_deferred did it."""
        return next((b for b in self._variants if rows <= b.variant.key.tile), self._variants[-1]).resolve()

    def encode(self, cmds, rows: int) -> None:
        """Record the dispatches for `rows` activation rows (at least step[count_index]; extra rows exit early)."""
        if rows <= 0:
            return
        b = self.pick(rows)
        gy = ceil_div(rows, b.variant.key.tile)
        for bg, gx in b.groups:
            cmds.dispatch(b.pipeline, bg, gx, gy, 1, self.label)


def gemm_rows(weight: QuantWeight) -> int:
    """Weight rows per gemm invocation: 8 (each activation load serves 8 rows: up to 2x faster on llvmpipe at
    960 rows) unless its workgroups of WG * 8 rows would leave more lanes idle than 4 rows do (576 rows: 2
    workgroups of 512 rows, 44 % idle, vs 3 of 256, 25 %): every lane computes, in bounds or not. The choice depends
    on the weight alone and does not change any output bit."""
    def used(r: int) -> float:
        return sum(p.rows for p in weight.parts) / sum(ceil_div(p.rows, r * WG) * r * WG for p in weight.parts)

    return max(GEMM_ROWS, key=lambda r: (used(r), r))


def interleave_gate_up(gate_rows: list[bytes], up_rows: list[bytes]) -> bytes:
    """Rows of gate and up (same length F, F % 4 == 0) -> the fused order the SWIGLU kernel expects:
    4 gate rows, then the same 4 up rows, repeated. Works on any per-row component (qweight, qhigh, scales...)."""
    if len(gate_rows) != len(up_rows) or len(gate_rows) % 4:
        raise ValueError("interleave_gate_up: gate and up need the same row count, a multiple of 4")
    out = []
    for j in range(0, len(gate_rows), 4):
        out += gate_rows[j : j + 4] + up_rows[j : j + 4]
    return b"".join(out)


def split_rows(data: bytes, rows: int) -> list[bytes]:
    if rows <= 0 or len(data) % rows:
        raise ValueError(f"split_rows: {len(data)} bytes do not divide into {rows} rows")
    rb = len(data) // rows
    return [data[i * rb : (i + 1) * rb] for i in range(rows)]
