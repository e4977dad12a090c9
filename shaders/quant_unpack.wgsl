// Shared by gemv.wgsl and gemm.wgsl (#include): reading the package's quantized layout (docs/package-format.md).
// The includer declares `scales`, `mins` (q4a) and `params.s_stride` (u32 words per row of scales).

// f16 scale/min g of a row: two halves per u32 word, element 2j in the low half
fn half_at(word: u32, g: u32) -> f32 {
    return unpack2x16float(word)[g & 1u];
}

fn scale_of(row: u32, g: u32) -> f32 {
    return half_at(scales[row * params.s_stride + g / 2u], g);
}

#if DTYPE == q4a
fn min_of(row: u32, g: u32) -> f32 {
    return half_at(mins[row * params.s_stride + g / 2u], g);
}
#endif

#if DTYPE == q8
// the 4 signed bytes of a word as floats
fn i8x4(u: u32) -> vec4<f32> {
    return vec4<f32>(bitcast<vec4<i32>>(vec4<u32>(u << 24u, u << 16u, u << 8u, u)) >> vec4<u32>(24u));
}
#else
// the 8 nibbles of a word as unsigned values (low nibble = element 0)
fn lo4(u: u32) -> vec4<f32> {
    return vec4<f32>(vec4<u32>(u, u >> 4u, u >> 8u, u >> 12u) & vec4<u32>(15u));
}
fn hi4(u: u32) -> vec4<f32> {
    return vec4<f32>(vec4<u32>(u >> 16u, u >> 20u, u >> 24u, u >> 28u) & vec4<u32>(15u));
}
#endif
