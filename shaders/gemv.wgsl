// Quantized matrix x decode rows: y[t, n] = sum_k W[n, k] * x[t, k] for the weight dtypes of
// docs/package-format.md (q4, q4a, q8). Used for the decode rows of a step (one token per sequence, 1-16 rows)
// and for the LM head's sampled rows.
//
// Layout: one invocation owns 4 consecutive weight rows (8 with ROWS8) and a TILE of up to TILE activation rows
// (workgroup_id.y selects the tile; every lane of a workgroup shares it). Per 32-wide k chunk, the invocation
// loads and unpacks its weight words ONCE and applies them to every activation row of the tile: on llvmpipe the
// cost is the number of per-lane storage loads and the unpacking, so the weights' share of it is paid once per
// tile instead of once per sequence (the decode step used to cost ~linear in the number of sequences).
//
// Batch invariance, bit for bit: every activation row has its own accumulators and is computed by the same code
// in the same order whatever the tile holds: y[t, n] = sum over chunks c in order of chunk(n, c, x[t]) (formula
// below), then the tail k by k, then the epilogue. The tile only shares the loaded/unpacked weights and scales;
// tile slots past the row count are skipped by a uniform branch (no work, nothing stored), so one row alone costs
// about what the old one-row-per-invocation kernel cost. TILE=1 is that old layout (A/B benchmarks).
//
// SUBGROUPS (+SG_SIZE): the 8 activation vectors of a row's chunk are loaded once per subgroup and broadcast
// (subgroup sizes 4 and >= 8 handled; without SUBGROUPS every lane loads them itself).
// Defines: TILE (1, 4 or 8 activation rows per invocation), ROWS8 (8 weight rows per invocation instead of 4;
// always on with SWIGLU), DTYPE (q4 | q4a | q8), BIAS (y = Wx + bias), ACCUMULATE (y += Wx: residual epilogue of
// o and down), SWIGLU (the weight rows are gate/up interleaved in blocks of 4: rows 8j..8j+3 gate, 8j+4..8j+7 up;
// y[t, 4j + r] = silu(gate) * up), BIAS_SLOT (binding of the bias: 6, or 7 with q4a, +1 with NORM),
// NORM (+NORM_SLOT): x is the un-normalised residual and y = W (rmsnorm(x) * wn): the RMSNorm is folded in, saving
// its dispatch. Each subgroup recomputes its rows' inverse RMS (each lane sums 1/8 of the row, the partial sums
// are combined in lane order: fixed per row), multiplies x by wn before the dot, and scales the sums by inv at the
// end: y = inv * sum(W (x wn)). The wn binding must hold ceil(K/4)*4 floats (vec4 loads).
// The row count T of a dispatch is read from the per-step buffer `step[params.count_index]`, so one bind group
// and one set of parameters serve every step; only the grid changes (grid y = ceil(T / TILE)).
#define WG 64
#define TILE 8
#define DTYPE q4
#define BIAS_SLOT 6

struct Params {
    n: u32,            // output rows of this weight binding
    k: u32,            // logical reduction length (only k < K contributes)
    gs: u32,           // group size (multiple of 32)
    w_stride4: u32,    // vec4<u32> per weight row
    s_stride: u32,     // u32 words per scale row
    x_stride4: u32,    // vec4<f32> per activation row
    y_stride: u32,     // f32 per output row
    n_offset: u32,     // column of y where this binding's rows start
    count_index: u32,  // which step[] entry holds the number of activation rows
    _p0: u32,
    eps: f32,          // NORM: RMSNorm epsilon
    _p2: u32,
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
#ifdef NORM
@group(0) @binding(NORM_SLOT) var<storage, read> wn: array<vec4<f32>>;
#endif

alias W8 = array<vec4<f32>, 8>;

// the unpacked weights of one chunk of 4 rows (32 values each, as floats: integers, exact) and their
// scales / offsets (q4a mins) of the chunk's group
struct Block {
    a: W8, b: W8, c: W8, d: W8,
    s: vec4<f32>,
    m: vec4<f32>,
}

#include "quant_unpack.wgsl"

#if DTYPE == q8
// the 32 int8 weights of chunk c of a row (2 vec4<u32>)
fn unpack_row(row: u32, c: u32) -> W8 {
    let base = row * params.w_stride4 + 2u * c;
    let a = w[base];
    let b = w[base + 1u];
    return W8(i8x4(a.x), i8x4(a.y), i8x4(a.z), i8x4(a.w), i8x4(b.x), i8x4(b.y), i8x4(b.z), i8x4(b.w));
}
#else
// the 32 unsigned nibbles of chunk c of a row (one vec4<u32>)
fn unpack_row(row: u32, c: u32) -> W8 {
    let a = w[row * params.w_stride4 + c];
    return W8(lo4(a.x), hi4(a.x), lo4(a.y), hi4(a.y), lo4(a.z), hi4(a.z), lo4(a.w), hi4(a.w));
}
#endif

// dot of 32 unpacked weights with 32 activations, always in this association
fn dot32(q: W8, xs: W8) -> f32 {
    return dot(q[0], xs[0]) + dot(q[1], xs[1]) + dot(q[2], xs[2]) + dot(q[3], xs[3])
         + dot(q[4], xs[4]) + dot(q[5], xs[5]) + dot(q[6], xs[6]) + dot(q[7], xs[7]);
}

// one weight element (tail chunk only): the dequantized value of W[row, k]
fn w_at(row: u32, k: u32) -> f32 {
    let g = k / params.gs;
#if DTYPE == q8
    let word = w[row * params.w_stride4 + k / 16u][(k / 4u) % 4u];
    let q = f32(bitcast<i32>(word << (24u - 8u * (k % 4u))) >> 24u);
    return q * scale_of(row, g);
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

// the u32 words holding the f16 scales (or q4a mins) of groups g and g ^ 1 of rows r: one load per two groups
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

// the 4 rows' contributions of one chunk for one activation row: per row
// q4: s * (dot(q, x) - 8 * sum(x)) (the -8 offset folded into one product per chunk), q4a: s * dot(q, x) + m * sum(x),
// q8: s * dot(q, x)
fn apply(bl: Block, xs: W8, sx: f32) -> vec4<f32> {
    let d = vec4<f32>(dot32(bl.a, xs), dot32(bl.b, xs), dot32(bl.c, xs), dot32(bl.d, xs));
#if DTYPE == q4a
    return bl.s * d + bl.m * sx;
#else
#if DTYPE == q8
    return bl.s * d;
#else
    return bl.s * (d - 8.0 * sx);
#endif
#endif
}

fn sum32(xs: W8) -> f32 {
    let s4 = (xs[0] + xs[1]) + (xs[2] + xs[3]) + (xs[4] + xs[5]) + (xs[6] + xs[7]);
    return (s4.x + s4.y) + (s4.z + s4.w);
}

#ifdef NORM
// 1 / sqrt(mean(x^2) + eps) of the activation row at vec4 index xrow; every lane of the subgroup gets the same value
fn inv_rms(xrow: u32, lane: u32) -> f32 {
    let k4 = params.k / 4u;
    var ss = 0.0;
#ifdef SUBGROUPS
#if SG_SIZE == 4
    for (var v = lane % 4u; v < k4; v += 4u) {
        ss += dot(x[xrow + v], x[xrow + v]);
    }
    ss = ((subgroupBroadcast(ss, 0u) + subgroupBroadcast(ss, 1u)) + subgroupBroadcast(ss, 2u)) + subgroupBroadcast(ss, 3u);
#else
    for (var v = lane % 8u; v < k4; v += 8u) {
        ss += dot(x[xrow + v], x[xrow + v]);
    }
    ss = ((((((subgroupBroadcast(ss, 0u) + subgroupBroadcast(ss, 1u)) + subgroupBroadcast(ss, 2u))
         + subgroupBroadcast(ss, 3u)) + subgroupBroadcast(ss, 4u)) + subgroupBroadcast(ss, 5u))
         + subgroupBroadcast(ss, 6u)) + subgroupBroadcast(ss, 7u);
#endif
#else
    for (var v = 0u; v < k4; v++) {
        ss += dot(x[xrow + v], x[xrow + v]);
    }
#endif
    for (var k = k4 * 4u; k < params.k; k++) {
        let xv = x[xrow + k / 4u][k % 4u];
        ss += xv * xv;
    }
    return inverseSqrt(ss / f32(params.k) + params.eps);
}
#endif

// The norm weight's vectors of chunk xb that this lane multiplies into x (loaded once per chunk, shared by the
// tile's rows): with subgroups the lane's own one or two vectors, without all 8.
struct NormChunk {
    a: vec4<f32>, c: vec4<f32>,
    all: W8,
}

fn norm_chunk(xb: u32, lane: u32) -> NormChunk {
    var nc: NormChunk;
#ifdef NORM
#ifdef SUBGROUPS
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

// the 8 activation vectors of one row's chunk (vec4 index xrow + xb), times the norm weight under NORM; all
// lanes read the same row
fn load_x(xrow: u32, xb: u32, nc: NormChunk, lane: u32) -> W8 {
#ifdef SUBGROUPS
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

// one activation row's accumulators: lo = weight rows n0..n0+3, up = n0+4..n0+7 (ROWS8; the up rows under SWIGLU)
struct Acc {
    lo: vec4<f32>,
    up: vec4<f32>,
}

// one chunk for one activation row: its x loaded (and broadcast), both weight blocks applied
fn chunk_row(acc: Acc, xrow: u32, xb: u32, nc: NormChunk, lane: u32, bl: Block, bu: Block) -> Acc {
    let xs = load_x(xrow, xb, nc, lane);
    let sx = sum32(xs);
    var r = acc;
    r.lo += apply(bl, xs, sx);
#ifdef ROWS8
    r.up += apply(bu, xs, sx);
#endif
    return r;
}

// the partial last chunk of one activation row, element by element (only k < K)
fn tail_row(acc: Acc, xrow: u32, rl: vec4<u32>, ru: vec4<u32>) -> Acc {
    var r = acc;
    for (var k = (params.k / 32u) * 32u; k < params.k; k++) {
#ifdef NORM
        let xv = x[xrow + k / 4u][k % 4u] * wn[k / 4u][k % 4u];
#else
        let xv = x[xrow + k / 4u][k % 4u];
#endif
        r.lo += xv * vec4<f32>(w_at(rl.x, k), w_at(rl.y, k), w_at(rl.z, k), w_at(rl.w, k));
#ifdef ROWS8
        r.up += xv * vec4<f32>(w_at(ru.x, k), w_at(ru.y, k), w_at(ru.z, k), w_at(ru.w, k));
#endif
    }
    return r;
}

// the epilogue of activation row t (inv: its inverse RMS under NORM)
fn store(t: u32, acc: Acc, inv: f32, gx: u32) {
    var lo = acc.lo;
    var up = acc.up;
#ifdef NORM
    lo *= inv;
    up *= inv;
#endif
#ifdef SWIGLU
    let out0 = gx * 4u;
    let h = lo / (vec4<f32>(1.0) + exp(-lo)) * up;
    let ybase = t * params.y_stride + params.n_offset + out0;
    let nout = params.n / 2u;
    for (var r = 0u; r < 4u; r++) {
        if (out0 + r < nout) {
            y[ybase + r] = h[r];
        }
    }
#else
#ifdef ROWS8
    let n0 = gx * 8u;
    let nr = 8u;
#else
    let n0 = gx * 4u;
    let nr = 4u;
#endif
    let ybase = t * params.y_stride + params.n_offset + n0;
    for (var r = 0u; r < nr; r++) {
        if (n0 + r < params.n) {
            var v = select(up[r % 4u], lo[r % 4u], r < 4u);
#ifdef BIAS
            v += bias[n0 + r];
#endif
#ifdef ACCUMULATE
            v += y[ybase + r];
#endif
            y[ybase + r] = v;
        }
    }
#endif
}

fn load_block(r: vec4<u32>, c: u32, s: vec4<f32>, m: vec4<f32>) -> Block {
    return Block(unpack_row(r.x, c), unpack_row(r.y, c), unpack_row(r.z, c), unpack_row(r.w, c), s, m);
}

fn inv_of(xrow: u32, lane: u32) -> f32 {
#ifdef NORM
    return inv_rms(xrow, lane);
#else
    return 1.0;
#endif
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>
#ifdef SUBGROUPS
        , @builtin(subgroup_invocation_id) lane: u32
#endif
        ) {
#ifndef SUBGROUPS
    let lane = 0u;
#endif
    let count = step[params.count_index];
    let t0 = wid.y * TILE;  // the tile's first activation row: the same for every lane of the workgroup
    if (t0 >= count) {
        return;  // uniform
    }
    let nt = min(count - t0, TILE);  // active rows of this tile: slots >= nt are skipped (uniform branches)
#ifdef ROWS8
    // 8 rows per invocation (SWIGLU: block j of 8 = 4 gate rows then 4 up rows of the fused weight)
    let n0 = gid.x * 8u;
#else
    let n0 = gid.x * 4u;
#endif
#ifndef SUBGROUPS
    if (n0 >= params.n) {
        return;  // with subgroups, every lane must reach the broadcasts: rows are clamped instead
    }
#endif
    let last = params.n - 1u;
    // rows past N re-read the last row (in bounds) and are not stored
    let rl = min(vec4<u32>(n0) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(last));
    let ru = min(vec4<u32>(n0) + vec4<u32>(4u, 5u, 6u, 7u), vec4<u32>(last));
    let xs4 = params.x_stride4;
    let x0 = t0 * xs4;
    let x1 = (t0 + 1u) * xs4;
    let x2 = (t0 + 2u) * xs4;
    let x3 = (t0 + 3u) * xs4;
    let x4 = (t0 + 4u) * xs4;
    let x5 = (t0 + 5u) * xs4;
    let x6 = (t0 + 6u) * xs4;
    let x7 = (t0 + 7u) * xs4;
    // per-row inverse RMS (NORM): each slot's own, computed only for active slots
    var i0 = inv_of(x0, lane);
    var i1 = 0.0; var i2 = 0.0; var i3 = 0.0; var i4 = 0.0; var i5 = 0.0; var i6 = 0.0; var i7 = 0.0;
#if TILE != 1
    if (nt > 1u) { i1 = inv_of(x1, lane); }
    if (nt > 2u) { i2 = inv_of(x2, lane); }
    if (nt > 3u) { i3 = inv_of(x3, lane); }
#if TILE == 8
    if (nt > 4u) { i4 = inv_of(x4, lane); }
    if (nt > 5u) { i5 = inv_of(x5, lane); }
    if (nt > 6u) { i6 = inv_of(x6, lane); }
    if (nt > 7u) { i7 = inv_of(x7, lane); }
#endif
#endif
    var a0 = Acc(); var a1 = Acc(); var a2 = Acc(); var a3 = Acc();
    var a4 = Acc(); var a5 = Acc(); var a6 = Acc(); var a7 = Acc();
    let full = params.k / 32u;
    // scale/min words of the current pair of groups, reloaded every other group (a u32 holds two f16)
    var pair = 0xffffffffu;
    var sw = vec4<u32>(0u); var mw = vec4<u32>(0u);
    var sw8 = vec4<u32>(0u); var mw8 = vec4<u32>(0u);
    for (var c = 0u; c < full; c++) {
        let g = c * 32u / params.gs;
        if (g / 2u != pair) {  // uniform branch
            pair = g / 2u;
            sw = words(false, rl, g);
#if DTYPE == q4a
            mw = words(true, rl, g);
#endif
#ifdef ROWS8
            sw8 = words(false, ru, g);
#if DTYPE == q4a
            mw8 = words(true, ru, g);
#endif
#endif
        }
        // this chunk's weights, loaded and unpacked once for the whole tile
        let bl = load_block(rl, c, halves(sw, g), halves(mw, g));
#ifdef ROWS8
        let bu = load_block(ru, c, halves(sw8, g), halves(mw8, g));
#else
        let bu = bl;  // unused
#endif
        let xb = 8u * c;  // vec4 index of the chunk within a row
        let nc = norm_chunk(xb, lane);
        a0 = chunk_row(a0, x0, xb, nc, lane, bl, bu);
#if TILE != 1
        if (nt > 1u) { a1 = chunk_row(a1, x1, xb, nc, lane, bl, bu); }
        if (nt > 2u) { a2 = chunk_row(a2, x2, xb, nc, lane, bl, bu); }
        if (nt > 3u) { a3 = chunk_row(a3, x3, xb, nc, lane, bl, bu); }
#if TILE == 8
        if (nt > 4u) { a4 = chunk_row(a4, x4, xb, nc, lane, bl, bu); }
        if (nt > 5u) { a5 = chunk_row(a5, x5, xb, nc, lane, bl, bu); }
        if (nt > 6u) { a6 = chunk_row(a6, x6, xb, nc, lane, bl, bu); }
        if (nt > 7u) { a7 = chunk_row(a7, x7, xb, nc, lane, bl, bu); }
#endif
#endif
    }
    if (full * 32u < params.k) {
        a0 = tail_row(a0, x0, rl, ru);
        if (nt > 1u) { a1 = tail_row(a1, x1, rl, ru); }
        if (nt > 2u) { a2 = tail_row(a2, x2, rl, ru); }
        if (nt > 3u) { a3 = tail_row(a3, x3, rl, ru); }
        if (nt > 4u) { a4 = tail_row(a4, x4, rl, ru); }
        if (nt > 5u) { a5 = tail_row(a5, x5, rl, ru); }
        if (nt > 6u) { a6 = tail_row(a6, x6, rl, ru); }
        if (nt > 7u) { a7 = tail_row(a7, x7, rl, ru); }
    }
    store(t0, a0, i0, gid.x);
    if (nt > 1u) { store(t0 + 1u, a1, i1, gid.x); }
    if (nt > 2u) { store(t0 + 2u, a2, i2, gid.x); }
    if (nt > 3u) { store(t0 + 3u, a3, i3, gid.x); }
    if (nt > 4u) { store(t0 + 4u, a4, i4, gid.x); }
    if (nt > 5u) { store(t0 + 5u, a5, i5, gid.x); }
    if (nt > 6u) { store(t0 + 6u, a6, i6, gid.x); }
    if (nt > 7u) { store(t0 + 7u, a7, i7, gid.x); }
}
