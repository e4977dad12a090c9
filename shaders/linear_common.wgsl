// Shared by gemv.wgsl and gemm.wgsl (#include): parameters, bindings, and the chunk formula.
//
// Per output y[t, n] both kernels compute the same sequence: for each full 32-element chunk c in order,
// acc += chunk(n, c, x[t]) with
//     q4    s * (dot(q, x) - 8 * sum(x))          q5_0  s * (dot(q, x) - 16 * sum(x))
//     q4a   s * dot(q, x) + m * sum(x)            q5_1  the same
//     q8    s * dot(q, x)                         q4k, q5k   s * dot(q, x) - m * sum(x)
//     q6k   s * (dot16(q, x) - 32 * sum16(x)) + s2 * (dot16'(q, x) - 32 * sum16'(x))   (the chunk's two halves)
//     q3k   as q6k with 4 for 32                  iq4nl, iq4xs   s * dot(KV[q], x)
//     q2k   (s * dot16(q, x) - m * sum16(x)) + (s2 * dot16'(q, x) - m2 * sum16'(x))
// (q = the codes of quant_unpack.wgsl, s/s2/m its Scales), then the elements of a partial last chunk one by one
// (value_at * x), then the epilogue. The order depends only on the row, never on the tile or the other rows.
//
// The includer defines XBROADCAST where every lane of a subgroup reads the same activation chunk (load_x).
//
// Bindings: 0 qweight, 1 meta (scales | mins | super), 2 x, 3 y, 4 params, 5 step, then QHIGH_SLOT (qhigh),
// NORM_SLOT (gemv's folded RMSNorm weight), BIAS_SLOT: the wrapper's variant function numbers them.

struct Params {
    n: u32,            // output rows of this weight binding
    k: u32,            // logical reduction length (only k < K contributes)
    gs: u32,           // scale group (q4 q4a q8 q5_0 q5_1 iq4nl)
    w_stride4: u32,    // vec4<u32> per qweight row
    s_stride: u32,     // u32 words per scales (and mins) row
    x_stride4: u32,    // vec4<f32> per activation row
    y_stride: u32,     // f32 per output row
    n_offset: u32,     // column of y where this binding's rows start
    count_index: u32,  // which step[] entry holds the number of activation rows
    start_index: u32,  // gemm: which step[] entry holds the first activation row
    eps: f32,          // gemv NORM: RMSNorm epsilon
    h_stride: u32,     // u32 words per qhigh row
    m_off: u32,        // word offset of the mins in meta
    sup_off: u32,      // word offset of the super-block words in meta
    sup_stride: u32,   // super words per row
    _p0: u32,
}

@group(0) @binding(0) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read> sm: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<uniform> params: Params;
@group(0) @binding(5) var<storage, read> step: array<u32>;
#ifdef QHIGH
@group(0) @binding(QHIGH_SLOT) var<storage, read> qhigh: array<u32>;
#endif
#ifdef NORM
@group(0) @binding(NORM_SLOT) var<storage, read> wn: array<vec4<f32>>;
#endif
#ifdef BIAS
@group(0) @binding(BIAS_SLOT) var<storage, read> bias: array<f32>;
#endif

#include "quant_unpack.wgsl"

// the codes of one chunk of 4 rows and their factors: loaded and unpacked once, applied to every activation row
struct Block {
    a: W8, b: W8, c: W8, d: W8,
    sc: Scales,
}

fn load_block(r: vec4<u32>, c: u32, mw: MetaW) -> Block {
    return Block(codes(r.x, c), codes(r.y, c), codes(r.z, c), codes(r.w, c), chunk_scales(mw, c));
}

// dot of 32 codes with 32 activations, always in this association
fn dot32(q: W8, xs: W8) -> f32 {
    return dot(q[0], xs[0]) + dot(q[1], xs[1]) + dot(q[2], xs[2]) + dot(q[3], xs[3])
         + dot(q[4], xs[4]) + dot(q[5], xs[5]) + dot(q[6], xs[6]) + dot(q[7], xs[7]);
}

// the activation sums a chunk formula needs, computed once per activation row and chunk: (sum of the 32, 0), or
// for SUB16 (sum of the first 16, sum of the last 16)
fn xsum(xs: W8) -> vec2<f32> {
#ifdef SUB16
    let a = (xs[0] + xs[1]) + (xs[2] + xs[3]);
    let b = (xs[4] + xs[5]) + (xs[6] + xs[7]);
    return vec2<f32>((a.x + a.y) + (a.z + a.w), (b.x + b.y) + (b.z + b.w));
#else
    let s4 = (xs[0] + xs[1]) + (xs[2] + xs[3]) + (xs[4] + xs[5]) + (xs[6] + xs[7]);
    return vec2<f32>((s4.x + s4.y) + (s4.z + s4.w), 0.0);
#endif
}

#ifdef SUB16
fn dot16(q: W8, xs: W8, h: u32) -> f32 {
    return dot(q[h], xs[h]) + dot(q[h + 1u], xs[h + 1u]) + dot(q[h + 2u], xs[h + 2u]) + dot(q[h + 3u], xs[h + 3u]);
}
#endif

// the chunk formula for the block's 4 rows and one activation row (sx = xsum(xs))
fn apply(bl: Block, xs: W8, sx: vec2<f32>) -> vec4<f32> {
#ifdef SUB16
    let lo = vec4<f32>(dot16(bl.a, xs, 0u), dot16(bl.b, xs, 0u), dot16(bl.c, xs, 0u), dot16(bl.d, xs, 0u));
    let hi = vec4<f32>(dot16(bl.a, xs, 4u), dot16(bl.b, xs, 4u), dot16(bl.c, xs, 4u), dot16(bl.d, xs, 4u));
#if DTYPE == q6k
    return bl.sc.s * (lo - 32.0 * sx.x) + bl.sc.s2 * (hi - 32.0 * sx.y);
#else
#if DTYPE == q3k
    return bl.sc.s * (lo - 4.0 * sx.x) + bl.sc.s2 * (hi - 4.0 * sx.y);
#else
    return (bl.sc.s * lo - bl.sc.m * sx.x) + (bl.sc.s2 * hi - bl.sc.m2 * sx.y);  // q2k
#endif
#endif
#else
    let d = vec4<f32>(dot32(bl.a, xs), dot32(bl.b, xs), dot32(bl.c, xs), dot32(bl.d, xs));
#ifdef IQ4
    return bl.sc.s * d;
#else
#ifdef KQUANT
    return bl.sc.s * d - bl.sc.m * sx.x;
#else
#ifdef MINS
    return bl.sc.s * d + bl.sc.m * sx.x;
#else
#if DTYPE == q8
    return bl.sc.s * d;
#else
#if DTYPE == q5_0
    return bl.sc.s * (d - 16.0 * sx.x);
#else
    return bl.sc.s * (d - 8.0 * sx.x);
#endif
#endif
#endif
#endif
#endif
#endif
}

// the partial last chunk of 4 rows for the activation row at vec4 index xrow, element by element (only k < K)
fn tail4(r: vec4<u32>, xrow: u32) -> vec4<f32> {
    var acc = vec4<f32>(0.0);
    for (var k = (params.k / 32u) * 32u; k < params.k; k++) {
#ifdef NORM
        let xv = x[xrow + k / 4u][k % 4u] * wn[k / 4u][k % 4u];
#else
        let xv = x[xrow + k / 4u][k % 4u];
#endif
        acc += xv * vec4<f32>(value_at(r.x, k), value_at(r.y, k), value_at(r.z, k), value_at(r.w, k));
    }
    return acc;
}

// The norm weight's vectors of chunk xb that this lane multiplies into x (NORM; loaded once per chunk, shared by
// the tile's rows): with XBROADCAST the lane's own one or two vectors, without all 8.
struct NormChunk {
    a: vec4<f32>, c: vec4<f32>,
    all: W8,
}

fn norm_chunk(xb: u32, lane: u32) -> NormChunk {
    var nc: NormChunk;
#ifdef NORM
#ifdef XBROADCAST
#if SG_SIZE == 4
    nc.a = wn[xb + lane % 4u];
    nc.c = wn[xb + 4u + lane % 4u];
#else
    nc.a = wn[xb + lane % 8u];
#endif
#else
    nc.all = W8(wn[xb], wn[xb + 1u], wn[xb + 2u], wn[xb + 3u], wn[xb + 4u], wn[xb + 5u], wn[xb + 6u], wn[xb + 7u]);
#endif
#endif
    return nc;
}

// The 8 activation vectors of one row's chunk (vec4 index xrow + xb), times the norm weight under NORM. Every
// lane of the workgroup reads the same row: with XBROADCAST (the includer defines it where the lanes of a subgroup
// work on the same chunk: SUBGROUPS, and not gemv's KSPLIT) each lane loads one (SG_SIZE 4: two) of the 8 and the
// subgroup broadcasts them, instead of every lane loading all 8.
fn load_x(xrow: u32, xb: u32, nc: NormChunk, lane: u32) -> W8 {
#ifdef XBROADCAST
#if SG_SIZE == 4
    var xa = x[xrow + xb + lane % 4u];
    var xc = x[xrow + xb + 4u + lane % 4u];
#ifdef NORM
    xa *= nc.a;
    xc *= nc.c;
#endif
    return W8(subgroupBroadcast(xa, 0u), subgroupBroadcast(xa, 1u), subgroupBroadcast(xa, 2u),
              subgroupBroadcast(xa, 3u), subgroupBroadcast(xc, 0u), subgroupBroadcast(xc, 1u),
              subgroupBroadcast(xc, 2u), subgroupBroadcast(xc, 3u));
#else
    var xa = x[xrow + xb + lane % 8u];
#ifdef NORM
    xa *= nc.a;
#endif
    return W8(subgroupBroadcast(xa, 0u), subgroupBroadcast(xa, 1u), subgroupBroadcast(xa, 2u),
              subgroupBroadcast(xa, 3u), subgroupBroadcast(xa, 4u), subgroupBroadcast(xa, 5u),
              subgroupBroadcast(xa, 6u), subgroupBroadcast(xa, 7u));
#endif
#else
    let b = xrow + xb;
#ifdef NORM
    return W8(x[b] * nc.all[0], x[b + 1u] * nc.all[1], x[b + 2u] * nc.all[2], x[b + 3u] * nc.all[3],
              x[b + 4u] * nc.all[4], x[b + 5u] * nc.all[5], x[b + 6u] * nc.all[6], x[b + 7u] * nc.all[7]);
#else
    return W8(x[b], x[b + 1u], x[b + 2u], x[b + 3u], x[b + 4u], x[b + 5u], x[b + 6u], x[b + 7u]);
#endif
#endif
}

// the epilogue of one output element (not SWIGLU): bias, then the residual add
fn finish(v0: f32, n: u32, yi: u32) -> f32 {
    var v = v0;
#ifdef BIAS
    v += bias[n];
#endif
#ifdef ACCUMULATE
    v += y[yi];
#endif
    return v;
}
