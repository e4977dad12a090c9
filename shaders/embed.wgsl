// Embedding gather: out[t, k] = dequantized E[ids[t], k] for q8 or q4 (q4a) rows, t < step[count_index].
// One invocation writes 8 consecutive elements of one row (one q4 word, two q8 words); grid y = token.
#define WG 64
#define DTYPE q8

struct Params {
    k: u32,          // hidden size
    gs: u32,         // group size
    w_stride: u32,   // u32 words per qweight row
    s_stride: u32,   // u32 words per scale row
    out_stride: u32, // f32 per output row
    vocab: u32,      // ids >= vocab read row 0 (an out-of-range id must not read another buffer's memory)
    count_index: u32,
    scale: f32,      // every element times this (Gemma: sqrt(hidden)); 1 otherwise
}

@group(0) @binding(0) var<storage, read> w: array<u32>;
@group(0) @binding(1) var<storage, read> scales: array<u32>;
@group(0) @binding(2) var<storage, read> ids: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<uniform> params: Params;
@group(0) @binding(5) var<storage, read> step: array<u32>;
#if DTYPE == q4a
@group(0) @binding(6) var<storage, read> mins: array<u32>;
#endif

fn group_half(buf_word: u32, g: u32) -> f32 {
    return unpack2x16float(buf_word)[g & 1u];
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let t = gid.y;
    let k0 = gid.x * 8u;
    if (t >= step[params.count_index] || k0 >= params.k) {
        return;
    }
    var id = ids[t];
    if (id >= params.vocab) {
        id = 0u;
    }
    let g = k0 / params.gs;  // 8 | gs: the 8 elements share one group
    let s = group_half(scales[id * params.s_stride + g / 2u], g);
    var v: array<f32, 8>;
#if DTYPE == q8
    let a = w[id * params.w_stride + k0 / 4u];
    let b = w[id * params.w_stride + k0 / 4u + 1u];
    for (var j = 0u; j < 4u; j++) {
        v[j] = f32(bitcast<i32>(a << (24u - 8u * j)) >> 24u) * s;
        v[j + 4u] = f32(bitcast<i32>(b << (24u - 8u * j)) >> 24u) * s;
    }
#else
    let a = w[id * params.w_stride + k0 / 8u];
#if DTYPE == q4a
    let m = group_half(mins[id * params.s_stride + g / 2u], g);
    for (var j = 0u; j < 8u; j++) {
        v[j] = f32((a >> (4u * j)) & 15u) * s + m;
    }
#else
    for (var j = 0u; j < 8u; j++) {
        v[j] = (f32((a >> (4u * j)) & 15u) - 8.0) * s;
    }
#endif
#endif
    let base = t * params.out_stride + k0;
    for (var j = 0u; j < 8u; j++) {
        if (k0 + j < params.k) {
            out[base + j] = v[j] * params.scale;
        }
    }
}
