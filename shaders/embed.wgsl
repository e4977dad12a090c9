// Embedding gather: out[t, k] = E[ids[t], k] dequantized exactly as formats.py says (quant_unpack.wgsl
// value_at), for every weight format, t < step[count_index].
// A table larger than one storage binding is split by rows (the package's bindings): one dispatch per binding,
// each writing the tokens whose id falls in its rows [row0, row0 + rows). One invocation writes 8 consecutive
// elements of one row; grid y = token.
#define WG 64
#define DTYPE q8

struct Params {
    k: u32,           // hidden size
    gs: u32,          // scale group (q4 q4a q8 q5_0 q5_1 iq4nl)
    w_stride4: u32,   // vec4<u32> per qweight row
    s_stride: u32,    // u32 words per scales (and mins) row
    out_stride: u32,  // f32 per output row
    vocab: u32,       // ids >= vocab read row 0 (an out-of-range id must not read another buffer's memory)
    count_index: u32,
    row0: u32,        // this binding's first row
    rows: u32,        // and its row count
    h_stride: u32,    // u32 words per qhigh row
    m_off: u32,       // word offset of the mins in meta
    sup_off: u32,     // word offset of the super-block words in meta
    sup_stride: u32,  // super words per row
    _p0: u32, _p1: u32,
    scale: f32,       // every element times this (Gemma: sqrt(hidden)); 1 otherwise
}

@group(0) @binding(0) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read> sm: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> ids: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<uniform> params: Params;
@group(0) @binding(5) var<storage, read> step: array<u32>;
#ifdef QHIGH
@group(0) @binding(6) var<storage, read> qhigh: array<u32>;
#endif

#include "quant_unpack.wgsl"

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
    if (id < params.row0 || id - params.row0 >= params.rows) {
        return;  // another binding's row
    }
    let row = id - params.row0;
    let base = t * params.out_stride + k0;
    for (var j = 0u; j < 8u; j++) {
        if (k0 + j < params.k) {
            out[base + j] = value_at(row, k0 + j) * params.scale;
        }
    }
}
