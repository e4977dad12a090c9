// Quantized matrix x many activation rows (prefill): y[t, n] = sum_k W[n, k] * x[t, k] for every weight format
// of webinfer/formats.py, with gemv.wgsl's per-output arithmetic (linear_common.wgsl).
//
// What bounds these kernels on llvmpipe (8 invocations run as one SIMD batch) is the number of storage loads
// per lane: every load whose address differs per lane becomes one scalar load per lane and component, and the
// unpacking and FMAs are cheap beside it. So the layout minimises loads per multiply-add:
//   - one invocation owns 4 weight rows, or 8 under PAIR (two blocks of 4: SWIGLU's 4 gate + 4 up rows, or
//     ROWS8's rows 8i .. 8i + 7), and TT activation rows (4 or 8): every x load serves 8 rows under PAIR;
//   - the weight words of a 32-wide chunk are loaded and unpacked once and used for all TT activation rows;
//   - all lanes of a workgroup share the same TT activation rows (workgroup_id.y), so with SUBGROUPS each lane
//     loads one vec4 of a row's chunk and the subgroup broadcasts the 8; without subgroups every lane loads them.
// No workgroup memory and no barriers (a workgroup-memory tile was far slower on llvmpipe).
//
// Batch invariance: y[t, n] is the chunk sum of linear_common.wgsl, whichever rows share the tile. The model sends
// multi-token chunks (prefill) here and one-token chunks (decode) to gemv.wgsl: the choice depends only on the
// sequence's own chunk. Rows processed: [step[params.start_index], + step[params.count_index]).
// Defines as in gemv.wgsl (no NORM); TT: activation rows per invocation (4 or 8).
#define WG 64
#define TT 4
#define DTYPE q4
#ifdef SUBGROUPS
#define XBROADCAST 1
#endif

#include "linear_common.wgsl"

// one chunk of the block for the activation row at vec4 index xrow
fn chunk_x(bl: Block, xrow: u32, xb: u32, nc: NormChunk, lane: u32) -> vec4<f32> {
    let xs = load_x(xrow, xb, nc, lane);
    return apply(bl, xs, xsum(xs));
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
#ifdef PAIR
    let rows = min(vec4<u32>(8u * i) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(last));
    let rows_up = min(vec4<u32>(8u * i) + vec4<u32>(4u, 5u, 6u, 7u), vec4<u32>(last));
    var up = Acc();
#else
    let rows = min(vec4<u32>(4u * i) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(last));
#endif
    var a = Acc();
    let full = params.k / 32u;
    let nc = NormChunk();  // gemm reads normalised rows: no folded norm
    // scale words shared by consecutive chunks, reloaded when the epoch changes (uniform branch)
    var epoch = 0xffffffffu;
    var ml = MetaW();
#ifdef PAIR
    var mu = MetaW();
#endif
    for (var c = 0u; c < full; c++) {
        let o = 8u * c;
        if (meta_epoch(c) != epoch) {
            epoch = meta_epoch(c);
            ml = meta_words(rows, c);
#ifdef PAIR
            mu = meta_words(rows_up, c);
#endif
        }
        let bl = load_block(rows, c, ml);
#ifdef PAIR
        let bu = load_block(rows_up, c, mu);
        var xs = load_x(xb0, o, nc, lane); var sx = xsum(xs); a.t0 += apply(bl, xs, sx); up.t0 += apply(bu, xs, sx);
        xs = load_x(xb1, o, nc, lane); sx = xsum(xs); a.t1 += apply(bl, xs, sx); up.t1 += apply(bu, xs, sx);
        xs = load_x(xb2, o, nc, lane); sx = xsum(xs); a.t2 += apply(bl, xs, sx); up.t2 += apply(bu, xs, sx);
        xs = load_x(xb3, o, nc, lane); sx = xsum(xs); a.t3 += apply(bl, xs, sx); up.t3 += apply(bu, xs, sx);
#if TT == 8
        xs = load_x(xb4, o, nc, lane); sx = xsum(xs); a.t4 += apply(bl, xs, sx); up.t4 += apply(bu, xs, sx);
        xs = load_x(xb5, o, nc, lane); sx = xsum(xs); a.t5 += apply(bl, xs, sx); up.t5 += apply(bu, xs, sx);
        xs = load_x(xb6, o, nc, lane); sx = xsum(xs); a.t6 += apply(bl, xs, sx); up.t6 += apply(bu, xs, sx);
        xs = load_x(xb7, o, nc, lane); sx = xsum(xs); a.t7 += apply(bl, xs, sx); up.t7 += apply(bu, xs, sx);
#endif
#else
        a.t0 += chunk_x(bl, xb0, o, nc, lane);
        a.t1 += chunk_x(bl, xb1, o, nc, lane);
        a.t2 += chunk_x(bl, xb2, o, nc, lane);
        a.t3 += chunk_x(bl, xb3, o, nc, lane);
#if TT == 8
        a.t4 += chunk_x(bl, xb4, o, nc, lane);
        a.t5 += chunk_x(bl, xb5, o, nc, lane);
        a.t6 += chunk_x(bl, xb6, o, nc, lane);
        a.t7 += chunk_x(bl, xb7, o, nc, lane);
#endif
#endif
    }
    if (full * 32u < params.k) {
        a.t0 += tail4(rows, xb0); a.t1 += tail4(rows, xb1); a.t2 += tail4(rows, xb2); a.t3 += tail4(rows, xb3);
#if TT == 8
        a.t4 += tail4(rows, xb4); a.t5 += tail4(rows, xb5); a.t6 += tail4(rows, xb6); a.t7 += tail4(rows, xb7);
#endif
#ifdef PAIR
        up.t0 += tail4(rows_up, xb0); up.t1 += tail4(rows_up, xb1); up.t2 += tail4(rows_up, xb2);
        up.t3 += tail4(rows_up, xb3);
#if TT == 8
        up.t4 += tail4(rows_up, xb4); up.t5 += tail4(rows_up, xb5); up.t6 += tail4(rows_up, xb6);
        up.t7 += tail4(rows_up, xb7);
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
#ifdef PAIR
    let n0 = 8u * i;
#else
    let n0 = 4u * i;
#endif
    for (var j = 0u; j < nt; j++) {
        let v4 = acc_at(a, j);
        let yb = (start + t0 + j) * params.y_stride + params.n_offset + n0;
        for (var r = 0u; r < 4u; r++) {
            if (n0 + r < params.n) {
                y[yb + r] = finish(v4[r], n0 + r, yb + r);
            }
        }
#ifdef PAIR
        let u4 = acc_at(up, j);
        for (var r = 4u; r < 8u; r++) {
            if (n0 + r < params.n) {
                y[yb + r] = finish(u4[r - 4u], n0 + r, yb + r);
            }
        }
#endif
    }
#endif
}
