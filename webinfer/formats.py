"""The weight encodings of a package: the one table every reader and writer of the format uses (packer, manifest
validator, kernel wrappers, CPU engine). Pure Python: it runs in Pyodide too.

Every component is a row-major [N, row_bytes] array whose rows are whole u32 words, so WGSL reads it as
array<u32> with no byte helpers. Element k of a row lives at the same place in every format family:

    qweight   4 low bits of element k = nibble k%8 of u32 word k/8 (natural order, also for GGUF K-quants,
              whose interleaved 64-element chunks the packer re-lays)                       [N, Kp/8]  u32
    qweight   (q8 only) byte k%4 of word k/4, a signed int8                                  [N, Kp/4]  u32
    qhigh     q5_0/q5_1/q5k: bit 4 of element k = bit k%32 of word k/32                      [N, Kp/32] u32
              q6k: bits 4-5 of element k = bits 2*(k%16)..+1 of word k/16                    [N, Kp/16] u32
    scales    q4/q4a/q8/q5_0/q5_1: f16 per group, two per word (group 2j low half of word j)  [N, ceil(G/2)]
              q4k/q5k: u8 6-bit sub-block scale, sub-block s = byte s%4 of word s/4           [N, Kp/128]
              q6k: int8 sub-block (16 elements) scale, byte s%4 of word s/4                   [N, Kp/64]
    mins      q4a/q5_1: f16 per group like scales; q4k/q5k: u8 6-bit sub-block min like their scales
    super     q4k/q5k: per 256-element super-block one word: f16 d (low half), f16 dmin (high half) [N, Kp/256]
              q6k: f16 d per super-block, two per word                                       [N, ceil(Kp/512)]

Values (f32 arithmetic, operation for operation as gguf.quants.dequantize, so repacked GGUF tensors decode
bit-identically; q = the element's unsigned code, s = sub-block index, b = super-block index):

    q4    (q - 8) * scale[g]                 q4a   q * scale[g] + min[g]           q8    q * scale[g]  (q signed)
    q5_0  (q - 16) * scale[g]                q5_1  q * scale[g] + min[g]           (q = 5 bits, group 32)
    q4k   (d[b] * scales[s]) * q - (dmin[b] * mins[s])      4-bit q, sub-blocks of 32, super-blocks of 256
    q5k   as q4k with 5-bit q
    q6k   (d[b] * scales[s]) * (q - 32)                     6-bit q, sub-blocks of 16, super-blocks of 256
    f32   data

`group_size` in the manifest is the scale group for q4/q4a/q8 (32, 64 or 128), 32 for q5_0/q5_1 and 256 (the
super-block) for the K-quants; k_padded = K rounded up to a multiple of it. Padding elements hold the code nearest 0
(exactly 0 for q4/q8/q5_0/q6k, not always for the formats with a min); kernels ignore k >= K in every format.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class QuantFormat:
    name: str
    components: tuple[str, ...]
    fixed_group: int | None   # the only allowed group_size, or None when the packer chooses (32/64/128)
    sub_block: int | None     # K-quants: elements per scale; else the group itself
    gguf: str | None          # the GGUF type it repacks losslessly

    def row_bytes(self, component: str, k: int, group_size: int | None) -> int:
        """Bytes one row of `component` takes (always a whole number of u32 words)."""
        if self.name == "f32":
            return 4 * k
        if component not in self.components:
            raise KeyError(f"{self.name} has no component {component!r} (has {', '.join(self.components)})")
        kp = k_padded(k, group_size)
        n = self.name
        if component == "qweight":
            return kp if n == "q8" else kp // 2
        if component == "qhigh":
            return kp // 4 if n == "q6k" else kp // 8
        if n in ("q4k", "q5k"):
            return kp // 256 * 4 if component == "super" else kp // 32  # u8 per 32-element sub-block
        if n == "q6k":
            return 4 * (-(-(kp // 256) // 2)) if component == "super" else kp // 16  # int8 per 16
        return 4 * (-(-(kp // group_size) // 2))  # f16 per group, two per word


FORMATS: dict[str, QuantFormat] = {f.name: f for f in (
    QuantFormat("q4", ("qweight", "scales"), None, None, "Q4_0"),
    QuantFormat("q4a", ("qweight", "scales", "mins"), None, None, "Q4_1"),
    QuantFormat("q8", ("qweight", "scales"), None, None, "Q8_0"),
    QuantFormat("q5_0", ("qweight", "qhigh", "scales"), 32, None, "Q5_0"),
    QuantFormat("q5_1", ("qweight", "qhigh", "scales", "mins"), 32, None, "Q5_1"),
    QuantFormat("q4k", ("qweight", "scales", "mins", "super"), 256, 32, "Q4_K"),
    QuantFormat("q5k", ("qweight", "qhigh", "scales", "mins", "super"), 256, 32, "Q5_K"),
    QuantFormat("q6k", ("qweight", "qhigh", "scales", "super"), 256, 16, "Q6_K"),
    QuantFormat("f32", ("data",), None, None, "F32"),
)}
QUANT_DTYPES = tuple(n for n in FORMATS if n != "f32")
GROUP_SIZES = (32, 64, 128)  # choices for the formats without a fixed group


def k_padded(k: int, group_size: int) -> int:
    return -(-k // group_size) * group_size


def components(dtype: str) -> tuple[str, ...]:
    return FORMATS[dtype].components


def row_bytes(dtype: str, component: str, k: int, group_size: int | None) -> int:
    return FORMATS[dtype].row_bytes(component, k, group_size)
