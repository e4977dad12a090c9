// Quantized matrix x decode rows: y[t, n] = sum_k W[n, k] * x[t, k] for every weight format of
// webinfer/formats.py. Used for the decode rows of a step (one token per sequence, 1-16 rows) and the LM head's
// sampled rows. The per-output arithmetic (the chunk formula) is linear_common.wgsl's, shared with gemm.wgsl.
//
// Layout: one invocation owns 4 consecutive weight rows (8 under SWIGLU) and a TILE of up to TILE activation
// rows (workgroup_id.y selects the tile; every lane of a workgroup shares it). Per 32-wide chunk the invocation
// loads and unpacks its weight words once and applies them to every activation row of the tile: on llvmpipe the
// cost is the number of per-lane storage loads and the unpacking, so the weights' share is paid once per tile.
// Tile slots past the row count are skipped by uniform branches (no work, nothing stored).
//
// Batch invariance, bit for bit: every activation row has its own accumulators and runs the same code in the
// same order whatever the tile holds (linear_common.wgsl); the tile shares only the loaded weights and scales.
//
// Defines: TILE (1, 4 or 8), DTYPE (+ its quant_unpack.wgsl flags), BIAS, ACCUMULATE (y += Wx: the residual epilogue),
// SWIGLU (weight rows gate/up interleaved in blocks of 4: rows 8j..8j+3 gate, 8j+4..8j+7 up; y[t, 4j + r] =
// silu(gate) * up), NORM: x is the un-normalised residual and y = W (rmsnorm(x) * wn), the RMSNorm folded in:
// each subgroup recomputes its rows' inverse RMS (each lane sums 1/8 of the row, partial sums combined in lane
// order: fixed per row), multiplies x by wn before the dot and scales the sums by it at the end. The wn binding
// must hold ceil(K/4)*4 floats (vec4 loads).
// The row count T is read from `step[params.count_index]`, so one bind group serves every step; only the grid
// changes (grid y = ceil(T / TILE)).
//
// KSPLIT (1, or a divisor of WG up to 32): lanes per row group. With KSPLIT = S the S consecutive lanes of a row
// group split its chunks (lane j takes chunks j, j + S, ...), so a GPU runs S times the invocations and the
// lanes of a group read S consecutive vec4s of each weight row (coalesced), where KSPLIT 1 gives a 576-row
// matrix 144 invocations, each walking a whole row: latency-bound on any GPU with more than a few hundred lanes.
// The S partial sums are added in lane order through workgroup memory by lane 0 of the group (then the tail and
// the epilogue), so a row's bits depend on S but not on the tile or the other rows; KSPLIT 1 keeps the sequential
// chunk order of gemm.wgsl's rows. Each lane loads its own activations (no subgroup broadcast: the lanes of a
// subgroup are on different chunks). On llvmpipe, whose 8 lanes are one SIMD batch on one core, S > 1 only adds
// work: the model asks for it (GPUModel.load(gemv_ksplit=...)), never the device.
#define WG 64
#define TILE 8
#define DTYPE q4
#define KSPLIT 1
#ifdef SUBGROUPS
#if KSPLIT == 1
#define XBROADCAST 1
#endif
#endif

#include "linear_common.wgsl"

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

fn inv_of(xrow: u32, lane: u32) -> f32 {
#ifdef NORM
    return inv_rms(xrow, lane);
#else
    return 1.0;
#endif
}

// one activation row's accumulators: lo = weight rows n0..n0+3, up = n0+4..n0+7 (the up rows under SWIGLU)
struct Acc {
    lo: vec4<f32>,
    up: vec4<f32>,
}

// one chunk for one activation row: its x loaded (and broadcast), both weight blocks applied
fn chunk_row(acc: Acc, xrow: u32, xb: u32, nc: NormChunk, lane: u32, bl: Block, bu: Block) -> Acc {
    let xs = load_x(xrow, xb, nc, lane);
    let sx = xsum(xs);
    var r = acc;
    r.lo += apply(bl, xs, sx);
#ifdef SWIGLU
    r.up += apply(bu, xs, sx);
#endif
    return r;
}

#if KSPLIT != 1
var<workgroup> red: array<vec4<f32>, 2 * WG>;

// the sum of the KSPLIT lanes' partial sums of one activation row, lane 0's first, in lane order (exact in part
// 0 of the group; the other lanes get their own back). Every lane of the workgroup calls it: two barriers.
fn reduce(acc: Acc, lid: u32, part: u32) -> Acc {
    red[2u * lid] = acc.lo;
    red[2u * lid + 1u] = acc.up;
    workgroupBarrier();
    var r = acc;
    if (part == 0u) {
        for (var j = 1u; j < KSPLIT; j++) {
            r.lo += red[2u * (lid + j)];
            r.up += red[2u * (lid + j) + 1u];
        }
    }
    workgroupBarrier();
    return r;
}
#endif

fn tail_row(acc: Acc, xrow: u32, rl: vec4<u32>, ru: vec4<u32>) -> Acc {
    var r = acc;
    r.lo += tail4(rl, xrow);
#ifdef SWIGLU
    r.up += tail4(ru, xrow);
#endif
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
    let out0 = gx * 4u;
    let ybase = t * params.y_stride + params.n_offset + out0;
#ifdef SWIGLU
    let h = lo / (vec4<f32>(1.0) + exp(-lo)) * up;
    let nout = params.n / 2u;
    for (var r = 0u; r < 4u; r++) {
        if (out0 + r < nout) {
            y[ybase + r] = h[r];
        }
    }
#else
    for (var r = 0u; r < 4u; r++) {
        if (out0 + r < params.n) {
            y[ybase + r] = finish(lo[r], out0 + r, ybase + r);
        }
    }
#endif
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(local_invocation_index) lid: u32
#ifdef SUBGROUPS
        , @builtin(subgroup_invocation_id) lane: u32
#endif
        ) {
#ifndef SUBGROUPS
    let lane = 0u;
#endif
    let count = step[params.count_index];
    let t0 = wid.y * TILE;  // the tile's first activation row: the same for every lane of the workgroup
#if KSPLIT == 1
    if (t0 >= count) {
        return;  // uniform
    }
    let g = gid.x;  // the row group
    let part = 0u;
#else
    // no return before the barriers of `reduce`: a tile past the rows does no work and stores nothing
    let g = gid.x / KSPLIT;  // WG % KSPLIT == 0: a group's lanes are consecutive lanes of one workgroup
    let part = gid.x % KSPLIT;
#endif
    let nt = select(0u, min(count - t0, TILE), t0 < count);  // active rows of this tile: slots >= nt are skipped (uniform branches)
#ifdef SWIGLU
    let n0 = g * 8u;  // block j of 8 = 4 gate rows then 4 up rows of the fused weight
#else
    let n0 = g * 4u;
#endif
#ifndef SUBGROUPS
#if KSPLIT == 1
    if (n0 >= params.n) {
        return;  // with subgroups (or the barriers of KSPLIT), every lane must go on: rows are clamped instead
    }
#endif
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
    var i0 = 0.0;
    if (nt > 0u) { i0 = inv_of(x0, lane); }
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
    // scale words shared by consecutive chunks, reloaded when the epoch changes (uniform branch)
    var epoch = 0xffffffffu;
    var ml = MetaW(); var mu = MetaW();
    for (var c = select(full, part, nt > 0u); c < full; c += KSPLIT) {
        if (meta_epoch(c) != epoch) {
            epoch = meta_epoch(c);
            ml = meta_words(rl, c);
#ifdef SWIGLU
            mu = meta_words(ru, c);
#endif
        }
        // this chunk's weights, loaded and unpacked once for the whole tile
        let bl = load_block(rl, c, ml);
#ifdef SWIGLU
        let bu = load_block(ru, c, mu);
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
#if KSPLIT != 1
    a0 = reduce(a0, lid, part);
#if TILE != 1
    a1 = reduce(a1, lid, part); a2 = reduce(a2, lid, part); a3 = reduce(a3, lid, part);
#if TILE == 8
    a4 = reduce(a4, lid, part); a5 = reduce(a5, lid, part); a6 = reduce(a6, lid, part); a7 = reduce(a7, lid, part);
#endif
#endif
    if (part != 0u) {
        return;  // after the last barrier
    }
#endif
    if (full * 32u < params.k) {
        if (nt > 0u) { a0 = tail_row(a0, x0, rl, ru); }
        if (nt > 1u) { a1 = tail_row(a1, x1, rl, ru); }
        if (nt > 2u) { a2 = tail_row(a2, x2, rl, ru); }
        if (nt > 3u) { a3 = tail_row(a3, x3, rl, ru); }
        if (nt > 4u) { a4 = tail_row(a4, x4, rl, ru); }
        if (nt > 5u) { a5 = tail_row(a5, x5, rl, ru); }
        if (nt > 6u) { a6 = tail_row(a6, x6, rl, ru); }
        if (nt > 7u) { a7 = tail_row(a7, x7, rl, ru); }
    }
    if (nt > 0u) { store(t0, a0, i0, g); }
    if (nt > 1u) { store(t0 + 1u, a1, i1, g); }
    if (nt > 2u) { store(t0 + 2u, a2, i2, g); }
    if (nt > 3u) { store(t0 + 3u, a3, i3, g); }
    if (nt > 4u) { store(t0 + 4u, a4, i4, g); }
    if (nt > 5u) { store(t0 + 5u, a5, i5, g); }
    if (nt > 6u) { store(t0 + 6u, a6, i6, g); }
    if (nt > 7u) { store(t0 + 7u, a7, i7, g); }
}
