// Quantized matrix x many activation rows (prefill): y[t, n] = sum_k W[n, k] * x[t, k] for q4, q4a, q8.
//
// What bounds these kernels on llvmpipe (8 invocations run as one SIMD batch) is the number of storage loads
// per lane: every load whose address differs per lane becomes one scalar load per lane and component, and the
// unpacking and FMAs are cheap beside it. So the layout minimises loads per multiply-add:
//   - one invocation owns 4 weight rows (8 under SWIGLU: 4 gate + 4 up) and TT activation rows (4 or 8);
//   - the weight words of a 32-wide k chunk (one vec4<u32> per q4 row) are loaded ONCE and used for all TT
//     activation rows (GEMV loads them once per activation row);
//   - all lanes of a workgroup share the same TT activation rows (workgroup_id.y), so with SUBGROUPS each lane
//     loads one vec4 of a row's chunk and the subgroup broadcasts the 8 (gemv.wgsl's trick), instead of every
//     lane loading all 8; without subgroups every lane loads them itself.
// No workgroup memory and no barriers (a workgroup-memory tile was far slower on llvmpipe).
// Per output the arithmetic is gemv.wgsl's chunk(): s * (dot32(q, x) - 8 * sum(x)) per chunk (q4), in chunk order.
//
// Batch invariance: y[t, n] = sum over chunks, in order, of that expression; which other rows share the tile
// never changes it. The model sends multi-token chunks (prefill) here and one-token chunks (decode) to gemv.wgsl:
// the choice depends only on the sequence's own chunk.
// Rows processed: [step[params.start_index], + step[params.count_index]).
//
// Defines as in gemv.wgsl: DTYPE, BIAS (+BIAS_SLOT), ACCUMULATE, SWIGLU (gate/up interleaved in blocks of 4);
// TT: activation rows per invocation (4 or 8).
#define WG 64
#define TT 4
#define DTYPE q4
#define BIAS_SLOT 6

struct Params {
    n: u32,
    k: u32,
    gs: u32,
    w_stride4: u32,
    s_stride: u32,
    x_stride4: u32,
    y_stride: u32,
    n_offset: u32,
    count_index: u32,
    start_index: u32,
    _p0: u32, _p1: u32,
}

@group(0) @binding(0) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read> scales: array<u32>;
@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<uniform> params: Params;
@group(0) @binding(5) var<storage, read> step: array<u32>;
#if DTYPE == q4a
@group(0) @binding(6) var<storage, read> mins: array<u32>;
#endif
#ifdef BIAS
@group(0) @binding(BIAS_SLOT) var<storage, read> bias: array<f32>;
#endif

alias W8 = array<vec4<f32>, 8>;

// the weight words of one 32-wide chunk of 4 rows, with their scales and offsets
struct Block {
    a: vec4<u32>, b: vec4<u32>, c: vec4<u32>, d: vec4<u32>,
#if DTYPE == q8
    a2: vec4<u32>, b2: vec4<u32>, c2: vec4<u32>, d2: vec4<u32>,
#endif
    s: vec4<f32>,
    m: vec4<f32>,
}

#include "quant_unpack.wgsl"

#if DTYPE == q8
// dot of 32 int8 weights (2 vec4<u32>) with 32 activations (gemv.wgsl's association)
fn dot32(a: vec4<u32>, b: vec4<u32>, xs: W8) -> f32 {
    return dot(i8x4(a.x), xs[0]) + dot(i8x4(a.y), xs[1]) + dot(i8x4(a.z), xs[2]) + dot(i8x4(a.w), xs[3])
         + dot(i8x4(b.x), xs[4]) + dot(i8x4(b.y), xs[5]) + dot(i8x4(b.z), xs[6]) + dot(i8x4(b.w), xs[7]);
}
#else
// dot of 32 unsigned nibbles (one vec4<u32>) with 32 activations (gemv.wgsl's association)
fn dot32(a: vec4<u32>, xs: W8) -> f32 {
    return dot(lo4(a.x), xs[0]) + dot(hi4(a.x), xs[1]) + dot(lo4(a.y), xs[2]) + dot(hi4(a.y), xs[3])
         + dot(lo4(a.z), xs[4]) + dot(hi4(a.z), xs[5]) + dot(lo4(a.w), xs[6]) + dot(hi4(a.w), xs[7]);
}
#endif

// the f16 scale (or min) words holding groups g and g ^ 1 of rows r: loaded once per two groups
fn words(of_mins: bool, r: vec4<u32>, g: u32) -> vec4<u32> {
    let o = g / 2u;
    let st = params.s_stride;
#if DTYPE == q4a
    if (of_mins) {
        return vec4<u32>(mins[r.x * st + o], mins[r.y * st + o], mins[r.z * st + o], mins[r.w * st + o]);
    }
#endif
    return vec4<u32>(scales[r.x * st + o], scales[r.y * st + o], scales[r.z * st + o], scales[r.w * st + o]);
}

fn halves(wd: vec4<u32>, g: u32) -> vec4<f32> {
    return vec4<f32>(half_at(wd.x, g), half_at(wd.y, g), half_at(wd.z, g), half_at(wd.w, g));
}

// chunk c of rows r (4 rows): the weight words, and group g's scales and offsets from the cached words sw / mw;
// loaded once per chunk, used for every activation row
fn load_block(r: vec4<u32>, c: u32, g: u32, sw: vec4<u32>, mw: vec4<u32>) -> Block {
    var bl: Block;
#if DTYPE == q8
    let o = 2u * c;
    bl.a = w[r.x * params.w_stride4 + o]; bl.a2 = w[r.x * params.w_stride4 + o + 1u];
    bl.b = w[r.y * params.w_stride4 + o]; bl.b2 = w[r.y * params.w_stride4 + o + 1u];
    bl.c = w[r.z * params.w_stride4 + o]; bl.c2 = w[r.z * params.w_stride4 + o + 1u];
    bl.d = w[r.w * params.w_stride4 + o]; bl.d2 = w[r.w * params.w_stride4 + o + 1u];
#else
    bl.a = w[r.x * params.w_stride4 + c];
    bl.b = w[r.y * params.w_stride4 + c];
    bl.c = w[r.z * params.w_stride4 + c];
    bl.d = w[r.w * params.w_stride4 + c];
#endif
    bl.s = halves(sw, g);
#if DTYPE == q4a
    bl.m = halves(mw, g);
#else
    bl.m = vec4<f32>(0.0);
#endif
    return bl;
}

// the 4 rows' contributions of one chunk for one activation row: gemv.wgsl's chunk() formula
fn apply(bl: Block, xs: W8) -> vec4<f32> {
    let s4 = (xs[0] + xs[1]) + (xs[2] + xs[3]) + (xs[4] + xs[5]) + (xs[6] + xs[7]);
    let sx = (s4.x + s4.y) + (s4.z + s4.w);
#if DTYPE == q8
    let d = vec4<f32>(dot32(bl.a, bl.a2, xs), dot32(bl.b, bl.b2, xs), dot32(bl.c, bl.c2, xs), dot32(bl.d, bl.d2, xs));
    return bl.s * d;
#else
    let d = vec4<f32>(dot32(bl.a, xs), dot32(bl.b, xs), dot32(bl.c, xs), dot32(bl.d, xs));
#if DTYPE == q4a
    return bl.s * d + bl.m * sx;
#else
    return bl.s * (d - 8.0 * sx);
#endif
#endif
}

// the 8 activation vectors of chunk c of the activation row starting at vec4 index xb (same for all lanes)
fn load_x(xb: u32, lane: u32) -> W8 {
#ifdef SUBGROUPS
#if SG_SIZE == 4
    let xa = x[xb + lane % 4u];
    let xc = x[xb + 4u + lane % 4u];
    return W8(subgroupBroadcast(xa, 0u), subgroupBroadcast(xa, 1u), subgroupBroadcast(xa, 2u),
              subgroupBroadcast(xa, 3u), subgroupBroadcast(xc, 0u), subgroupBroadcast(xc, 1u),
              subgroupBroadcast(xc, 2u), subgroupBroadcast(xc, 3u));
#else
    let xa = x[xb + lane % 8u];
    return W8(subgroupBroadcast(xa, 0u), subgroupBroadcast(xa, 1u), subgroupBroadcast(xa, 2u),
              subgroupBroadcast(xa, 3u), subgroupBroadcast(xa, 4u), subgroupBroadcast(xa, 5u),
              subgroupBroadcast(xa, 6u), subgroupBroadcast(xa, 7u));
#endif
#else
    return W8(x[xb], x[xb + 1u], x[xb + 2u], x[xb + 3u], x[xb + 4u], x[xb + 5u], x[xb + 6u], x[xb + 7u]);
#endif
}

// one weight element (tail chunk only)
fn w_at(row: u32, k: u32) -> f32 {
    let g = k / params.gs;
#if DTYPE == q8
    let word = w[row * params.w_stride4 + k / 16u][(k / 4u) % 4u];
    return f32(bitcast<i32>(word << (24u - 8u * (k % 4u))) >> 24u) * scale_of(row, g);
#else
    let word = w[row * params.w_stride4 + k / 32u][(k / 8u) % 4u];
    let q = f32((word >> (4u * (k % 8u))) & 15u);
#if DTYPE == q4a
    return q * scale_of(row, g) + min_of(row, g);
#else
    return (q - 8.0) * scale_of(row, g);
#endif
#endif
}

// the partial last chunk, element by element (only k < K), for 4 rows and the activation row at vec4 index xb
fn tail(r: vec4<u32>, xb: u32) -> vec4<f32> {
    var acc = vec4<f32>(0.0);
    for (var k = (params.k / 32u) * 32u; k < params.k; k++) {
        acc += x[xb + k / 4u][k % 4u] * vec4<f32>(w_at(r.x, k), w_at(r.y, k), w_at(r.z, k), w_at(r.w, k));
    }
    return acc;
}

// the TT accumulators of one group of 4 weight rows (component = weight row)
struct Acc {
    t0: vec4<f32>, t1: vec4<f32>, t2: vec4<f32>, t3: vec4<f32>,
#if TT == 8
    t4: vec4<f32>, t5: vec4<f32>, t6: vec4<f32>, t7: vec4<f32>,
#endif
}

fn acc_at(a: Acc, j: u32) -> vec4<f32> {
    switch j {
        case 0u: { return a.t0; }
        case 1u: { return a.t1; }
        case 2u: { return a.t2; }
#if TT == 8
        case 3u: { return a.t3; }
        case 4u: { return a.t4; }
        case 5u: { return a.t5; }
        case 6u: { return a.t6; }
        default: { return a.t7; }
#else
        default: { return a.t3; }
#endif
    }
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32
#ifdef SUBGROUPS
        , @builtin(subgroup_invocation_id) lane: u32
#endif
        ) {
#ifndef SUBGROUPS
    let lane = 0u;
#endif
    let count = step[params.count_index];
    let start = step[params.start_index];
    // the activation tile comes from the workgroup id: the same rows for every lane (subgroup broadcasts need it)
    let t0 = wid.y * TT;
    if (t0 >= count) {
        return;  // uniform for the whole workgroup
    }
    // activation rows past the count re-read the last valid one (in bounds) and are not stored
    let tl = count - 1u;
    let xs4 = params.x_stride4;
    let xb0 = (start + min(t0, tl)) * xs4; let xb1 = (start + min(t0 + 1u, tl)) * xs4;
    let xb2 = (start + min(t0 + 2u, tl)) * xs4; let xb3 = (start + min(t0 + 3u, tl)) * xs4;
#if TT == 8
    let xb4 = (start + min(t0 + 4u, tl)) * xs4; let xb5 = (start + min(t0 + 5u, tl)) * xs4;
    let xb6 = (start + min(t0 + 6u, tl)) * xs4; let xb7 = (start + min(t0 + 7u, tl)) * xs4;
#endif
    let i = wid.x * WG + lid;  // group of 4 output columns
    let last = params.n - 1u;
    // rows past N re-read the last row (in bounds) and are not stored; no early exit: every lane must reach the
    // subgroup broadcasts
#ifdef SWIGLU
    let rows = min(vec4<u32>(8u * i) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(last));
    let rows_up = min(vec4<u32>(8u * i) + vec4<u32>(4u, 5u, 6u, 7u), vec4<u32>(last));
    var up = Acc();
#else
    let rows = min(vec4<u32>(4u * i) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(last));
#endif
    var a = Acc();
    let full = params.k / 32u;
    // scale/min words of the current pair of groups (one u32 holds two f16: reloaded every other group)
    var pair = 0xffffffffu;
    var sw = vec4<u32>(0u); var mw = vec4<u32>(0u);
#ifdef SWIGLU
    var swu = vec4<u32>(0u); var mwu = vec4<u32>(0u);
#endif
    for (var c = 0u; c < full; c++) {
        let o = 8u * c;
        let g = c * 32u / params.gs;
        if (g / 2u != pair) {  // uniform branch
            pair = g / 2u;
            sw = words(false, rows, g);
#if DTYPE == q4a
            mw = words(true, rows, g);
#endif
#ifdef SWIGLU
            swu = words(false, rows_up, g);
#if DTYPE == q4a
            mwu = words(true, rows_up, g);
#endif
#endif
        }
        let bl = load_block(rows, c, g, sw, mw);
#ifdef SWIGLU
        let bu = load_block(rows_up, c, g, swu, mwu);
        var xs = load_x(xb0 + o, lane); a.t0 += apply(bl, xs); up.t0 += apply(bu, xs);
        xs = load_x(xb1 + o, lane); a.t1 += apply(bl, xs); up.t1 += apply(bu, xs);
        xs = load_x(xb2 + o, lane); a.t2 += apply(bl, xs); up.t2 += apply(bu, xs);
        xs = load_x(xb3 + o, lane); a.t3 += apply(bl, xs); up.t3 += apply(bu, xs);
#if TT == 8
        xs = load_x(xb4 + o, lane); a.t4 += apply(bl, xs); up.t4 += apply(bu, xs);
        xs = load_x(xb5 + o, lane); a.t5 += apply(bl, xs); up.t5 += apply(bu, xs);
        xs = load_x(xb6 + o, lane); a.t6 += apply(bl, xs); up.t6 += apply(bu, xs);
        xs = load_x(xb7 + o, lane); a.t7 += apply(bl, xs); up.t7 += apply(bu, xs);
#endif
#else
        a.t0 += apply(bl, load_x(xb0 + o, lane));
        a.t1 += apply(bl, load_x(xb1 + o, lane));
        a.t2 += apply(bl, load_x(xb2 + o, lane));
        a.t3 += apply(bl, load_x(xb3 + o, lane));
#if TT == 8
        a.t4 += apply(bl, load_x(xb4 + o, lane));
        a.t5 += apply(bl, load_x(xb5 + o, lane));
        a.t6 += apply(bl, load_x(xb6 + o, lane));
        a.t7 += apply(bl, load_x(xb7 + o, lane));
#endif
#endif
    }
    if (full * 32u < params.k) {
        a.t0 += tail(rows, xb0); a.t1 += tail(rows, xb1); a.t2 += tail(rows, xb2); a.t3 += tail(rows, xb3);
#if TT == 8
        a.t4 += tail(rows, xb4); a.t5 += tail(rows, xb5); a.t6 += tail(rows, xb6); a.t7 += tail(rows, xb7);
#endif
#ifdef SWIGLU
        up.t0 += tail(rows_up, xb0); up.t1 += tail(rows_up, xb1); up.t2 += tail(rows_up, xb2);
        up.t3 += tail(rows_up, xb3);
#if TT == 8
        up.t4 += tail(rows_up, xb4); up.t5 += tail(rows_up, xb5); up.t6 += tail(rows_up, xb6);
        up.t7 += tail(rows_up, xb7);
#endif
#endif
    }
    let nt = min(count - t0, TT);
#ifdef SWIGLU
    let n0 = 4u * i;  // output columns n0 .. n0 + 3 of silu(gate) * up
    let nout = params.n / 2u;
    for (var j = 0u; j < nt; j++) {
        let g = acc_at(a, j);
        let h = g / (vec4<f32>(1.0) + exp(-g)) * acc_at(up, j);
        let yb = (start + t0 + j) * params.y_stride + params.n_offset + n0;
        for (var r = 0u; r < 4u; r++) {
            if (n0 + r < nout) {
                y[yb + r] = h[r];
            }
        }
    }
#else
    let n0 = 4u * i;
    for (var j = 0u; j < nt; j++) {
        let v4 = acc_at(a, j);
        let yb = (start + t0 + j) * params.y_stride + params.n_offset + n0;
        for (var r = 0u; r < 4u; r++) {
            if (n0 + r < params.n) {
                var v = v4[r];
#ifdef BIAS
                v += bias[n0 + r];
#endif
#ifdef ACCUMULATE
                v += y[yb + r];
#endif
                y[yb + r] = v;
            }
        }
    }
#endif
}
