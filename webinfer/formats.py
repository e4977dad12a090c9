"""The weight encodings of a package: the one table every reader and writer of the format uses (packer, manifest
validator, kernel wrappers, CPU engine). Pure Python: it runs in Pyodide too.

Every component is a row-major [N, row_bytes] array whose rows are whole u32 words, so WGSL reads it as
array<u32> with no byte helpers. Element k of a row lives at the same place in every format family:

    qweight   4 low bits of element k = nibble k%8 of u32 word k/8 (natural order, also for GGUF K-quants,
              whose interleaved 64-element chunks the packer re-lays)                       [N, Kp/8]  u32
    qweight   (q8 only) byte k%4 of word k/4, a signed int8                                  [N, Kp/4]  u32
    qweight   (q2k, q3k) 2 low bits of element k = bits 2*(k%16)..+1 of word k/16             [N, Kp/16] u32
    qhigh     q5_0/q5_1/q5k: bit 4 of element k = bit k%32 of word k/32                      [N, Kp/32] u32
              q6k: bits 4-5 of element k = bits 2*(k%16)..+1 of word k/16                    [N, Kp/16] u32
              q3k: bit 2 of element k = bit k%32 of word k/32                                 [N, Kp/32] u32
    scales    q4/q4a/q8/q5_0/q5_1/iq4nl: f16 per group, two per word (group 2j low half of word j) [N, ceil(G/2)]
              q4k/q5k: u8 6-bit sub-block scale, sub-block s = byte s%4 of word s/4           [N, Kp/128]
              q6k, q3k: int8 sub-block (16 elements) scale, byte s%4 of word s/4              [N, Kp/64]
              q2k: u8 per 16-element sub-block: scale in the low nibble, min in the high one  [N, Kp/64]
              iq4xs: int8 sub-block (32 elements) scale, byte s%4 of word s/4                 [N, Kp/128]
    mins      q4a/q5_1: f16 per group like scales; q4k/q5k: u8 6-bit sub-block min like their scales
    super     q4k/q5k/q2k: per 256-element super-block one word: f16 d (low half), f16 dmin (high) [N, Kp/256]
              q6k/q3k/iq4xs: f16 d per super-block, two per word                             [N, ceil(Kp/512)]

Values (f32 arithmetic, operation for operation as gguf.quants.dequantize, so repacked GGUF tensors decode
bit-identically; q = the element's unsigned code, s = sub-block index, b = super-block index):

    q4    (q - 8) * scale[g]                 q4a   q * scale[g] + min[g]           q8    q * scale[g]  (q signed)
    q5_0  (q - 16) * scale[g]                q5_1  q * scale[g] + min[g]           (q = 5 bits, group 32)
    q4k   (d[b] * scales[s]) * q - (dmin[b] * mins[s])      4-bit q, sub-blocks of 32, super-blocks of 256
    q5k   as q4k with 5-bit q
    q6k   (d[b] * scales[s]) * (q - 32)                     6-bit q, sub-blocks of 16, super-blocks of 256
    q3k   (d[b] * scales[s]) * (q - 4)                      3-bit q, sub-blocks of 16 (scales -32..31)
    q2k   (d[b] * (scales[s] & 15)) * q - (dmin[b] * (scales[s] >> 4))   2-bit q, sub-blocks of 16
    iq4nl scale[g] * KV[q]                                  4-bit index q into the codebook KV, group 32
    iq4xs (d[b] * scales[s]) * KV[q]                        sub-blocks of 32 (scales -32..31)
    f32   data

KV (llama.cpp's non-linear 4-bit codebook, `IQ4_KV` below) = -127 -104 -83 -65 -49 -35 -22 -10 1 13 25 38 53 69 89
113; KV[q] is an integer, so `scale * KV[q]` is one f32 product as in gguf.quants.

`group_size` in the manifest is the scale group for q4/q4a/q8 (32, 64 or 128), 32 for q5_0/q5_1/iq4nl and 256
(the super-block) for the K-quants and iq4xs; k_padded = K rounded up to a multiple of it. Padding elements hold
the code nearest 0 (exactly 0 for q4/q8/q5_0/q6k/q3k, not always for the others); kernels ignore k >= K in every
format.
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
            return kp if n == "q8" else kp // 4 if n in ("q2k", "q3k") else kp // 2
        if component == "qhigh":
            return kp // 4 if n == "q6k" else kp // 8
        if n in ("q4k", "q5k", "q2k"):  # one d/dmin word per super-block; a byte per sub-block of 32 (q2k: 16)
            return kp // 256 * 4 if component == "super" else kp // FORMATS[n].sub_block
        if n in ("q6k", "q3k", "iq4xs"):  # two f16 d per word; an int8 per sub-block of 16 (iq4xs: 32)
            return 4 * (-(-(kp // 256) // 2)) if component == "super" else kp // FORMATS[n].sub_block
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
    QuantFormat("q3k", ("qweight", "qhigh", "scales", "super"), 256, 16, "Q3_K"),
    QuantFormat("q2k", ("qweight", "scales", "super"), 256, 16, "Q2_K"),
    QuantFormat("iq4nl", ("qweight", "scales"), 32, None, "IQ4_NL"),
    QuantFormat("iq4xs", ("qweight", "scales", "super"), 256, 32, "IQ4_XS"),
    QuantFormat("f32", ("data",), None, None, "F32"),
)}
QUANT_DTYPES = tuple(n for n in FORMATS if n != "f32")
GROUP_SIZES = (32, 64, 128)  # choices for the formats without a fixed group
IQ4_KV = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)  # iq4nl / iq4xs codebook


def k_padded(k: int, group_size: int) -> int:
    return -(-k // group_size) * group_size


def components(dtype: str) -> tuple[str, ...]:
    return FORMATS[dtype].components


def row_bytes(dtype: str, component: str, k: int, group_size: int | None) -> int:
    return FORMATS[dtype].row_bytes(component, k, group_size)
