// Quantized matrix x activations: y[t, n] = sum_k W[n, k] * x[t, k] for the weight dtypes of
// docs/package-format.md (q4, q4a, q8), used for decode (1-16 rows) and, row by row, for prefill.
//
// Layout: one invocation computes 4 consecutive output rows n for ONE activation row t (grid y = t), so the
// reduction order of y[t, n] is the same sequential walk over k whatever T is: a sequence's output never depends
// on what else is in the batch (the scheduler relies on it). The 4 rows share each vec4 of x they load.
//
// SUBGROUPS (+SG_SIZE): the 8 activation vectors of a chunk are loaded once per subgroup and broadcast
// (subgroup sizes 4 and >= 8 handled; without SUBGROUPS every lane loads them itself).
// Defines: ROWS8 (8 rows per invocation instead of 4; always on with SWIGLU), DTYPE (q4 | q4a | q8), BIAS (y = Wx + bias), ACCUMULATE (y += Wx: residual epilogue of o and down),
// SWIGLU (the weight rows are gate/up interleaved in blocks of 4: rows 8j..8j+3 gate, 8j+4..8j+7 up;
// y[t, 4j + r] = silu(gate) * up), BIAS_SLOT (binding of the bias: 6, or 7 with q4a, +1 with NORM),
// NORM (+NORM_SLOT): x is the un-normalised residual and y = W (rmsnorm(x) * wn): the RMSNorm is folded in, saving
// its dispatch. Each subgroup recomputes its row's inverse RMS (each lane sums 1/8 of the row, the partial sums
// are combined in lane order: fixed per row), multiplies x by wn before the dot, and scales the sums by inv at the
// end: y = inv * sum(W (x wn)). The wn binding must hold ceil(K/4)*4 floats (vec4 loads).
// The row count T of a dispatch is read from the per-step buffer `step[params.count_index]`, so one bind group
// and one set of parameters serve every step; only the grid changes.
#define WG 64
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

fn half_at(buf_word: u32, g: u32) -> f32 {
    return unpack2x16float(buf_word)[g & 1u];
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
    let v = bitcast<vec4<i32>>(vec4<u32>(u << 24u, u << 16u, u << 8u, u)) >> vec4<u32>(24u);
    return vec4<f32>(v);
}
// dot of 32 int8 weights (2 vec4<u32>) with 32 activations
fn dot32(a: vec4<u32>, b: vec4<u32>, xs: array<vec4<f32>, 8>) -> f32 {
    return dot(i8x4(a.x), xs[0]) + dot(i8x4(a.y), xs[1]) + dot(i8x4(a.z), xs[2]) + dot(i8x4(a.w), xs[3])
         + dot(i8x4(b.x), xs[4]) + dot(i8x4(b.y), xs[5]) + dot(i8x4(b.z), xs[6]) + dot(i8x4(b.w), xs[7]);
}
#else
// the 8 nibbles of a word as unsigned values (low nibble = element 0)
fn lo4(u: u32) -> vec4<f32> {
    return vec4<f32>(vec4<u32>(u, u >> 4u, u >> 8u, u >> 12u) & vec4<u32>(15u));
}
fn hi4(u: u32) -> vec4<f32> {
    return vec4<f32>(vec4<u32>(u >> 16u, u >> 20u, u >> 24u, u >> 28u) & vec4<u32>(15u));
}
// dot of 32 unsigned nibbles (one vec4<u32>) with 32 activations
fn dot32(a: vec4<u32>, xs: array<vec4<f32>, 8>) -> f32 {
    return dot(lo4(a.x), xs[0]) + dot(hi4(a.x), xs[1]) + dot(lo4(a.y), xs[2]) + dot(hi4(a.y), xs[3])
         + dot(lo4(a.z), xs[4]) + dot(hi4(a.z), xs[5]) + dot(lo4(a.w), xs[6]) + dot(hi4(a.w), xs[7]);
}
#endif

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

// contribution of one full 32-element chunk c of `row`, given the chunk's activations and their sum, and the
// row's scale s and offset m (q4a min) of the chunk's group
fn chunk(row: u32, c: u32, xs: array<vec4<f32>, 8>, sx: f32, s: f32, m: f32) -> f32 {
#if DTYPE == q8
    let base = row * params.w_stride4 + 2u * c;
    return s * dot32(w[base], w[base + 1u], xs);
#else
    let q = dot32(w[row * params.w_stride4 + c], xs);
#if DTYPE == q4a
    return s * q + m * sx;
#else
    return s * (q - 8.0 * sx);  // (q - 8) * s summed: the -8 offset folded into one product per chunk
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

// activation vector v of row xrow (times the norm weight under NORM)
fn xv4(xrow: u32, v: u32) -> vec4<f32> {
#ifdef NORM
    return x[xrow + v] * wn[v];
#else
    return x[xrow + v];
#endif
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>
#ifdef SUBGROUPS
        , @builtin(subgroup_invocation_id) lane: u32
#endif
        ) {
    let t = gid.y;
    if (t >= step[params.count_index]) {
        return;
    }
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
    let r0 = min(n0, last); let r1 = min(n0 + 1u, last); let r2 = min(n0 + 2u, last); let r3 = min(n0 + 3u, last);
#ifdef ROWS8
    let r4 = min(n0 + 4u, last); let r5 = min(n0 + 5u, last); let r6 = min(n0 + 6u, last); let r7 = min(n0 + 7u, last);
#endif
    let xrow = t * params.x_stride4;
#ifdef NORM
#ifdef SUBGROUPS
    let inv = inv_rms(xrow, lane);
#else
    let inv = inv_rms(xrow, 0u);
#endif
#endif
    var acc = vec4<f32>(0.0);
#ifdef ROWS8
    var acc_up = vec4<f32>(0.0);  // rows n0+4 .. n0+7 (the up rows under SWIGLU)
#endif
    let full = params.k / 32u;
    // scale/min words of the current pair of groups, reloaded every other group (a u32 holds two f16)
    var pair = 0xffffffffu;
    var sw = vec4<u32>(0u); var mw = vec4<u32>(0u);
#ifdef ROWS8
    var sw8 = vec4<u32>(0u); var mw8 = vec4<u32>(0u);
#endif
    for (var c = 0u; c < full; c++) {
        let g = c * 32u / params.gs;
        if (g / 2u != pair) {  // uniform branch
            pair = g / 2u;
            sw = words(false, vec4<u32>(r0, r1, r2, r3), g);
#if DTYPE == q4a
            mw = words(true, vec4<u32>(r0, r1, r2, r3), g);
#endif
#ifdef ROWS8
            sw8 = words(false, vec4<u32>(r4, r5, r6, r7), g);
#if DTYPE == q4a
            mw8 = words(true, vec4<u32>(r4, r5, r6, r7), g);
#endif
#endif
        }
        let s = halves(sw, g);
        let m = halves(mw, g);
        let xb = 8u * c;  // vec4 index of the chunk within the row
#ifdef SUBGROUPS
        // all lanes share the same activation row: each lane loads 8 / SG_SIZE vectors (or one, when the subgroup
        // has 8 or more lanes) and the subgroup broadcasts them, instead of every lane loading all 8
#if SG_SIZE == 4
        let xa = xv4(xrow, xb + lane % 4u);
        let xc = xv4(xrow, xb + 4u + lane % 4u);
        let xs = array<vec4<f32>, 8>(subgroupBroadcast(xa, 0u), subgroupBroadcast(xa, 1u), subgroupBroadcast(xa, 2u),
                                     subgroupBroadcast(xa, 3u), subgroupBroadcast(xc, 0u), subgroupBroadcast(xc, 1u),
                                     subgroupBroadcast(xc, 2u), subgroupBroadcast(xc, 3u));
#else
        let xa = xv4(xrow, xb + lane % 8u);
        let xs = array<vec4<f32>, 8>(subgroupBroadcast(xa, 0u), subgroupBroadcast(xa, 1u), subgroupBroadcast(xa, 2u),
                                     subgroupBroadcast(xa, 3u), subgroupBroadcast(xa, 4u), subgroupBroadcast(xa, 5u),
                                     subgroupBroadcast(xa, 6u), subgroupBroadcast(xa, 7u));
#endif
#else
        let xs = array<vec4<f32>, 8>(xv4(xrow, xb), xv4(xrow, xb + 1u), xv4(xrow, xb + 2u), xv4(xrow, xb + 3u),
                                     xv4(xrow, xb + 4u), xv4(xrow, xb + 5u), xv4(xrow, xb + 6u), xv4(xrow, xb + 7u));
#endif
        let s4 = (xs[0] + xs[1]) + (xs[2] + xs[3]) + (xs[4] + xs[5]) + (xs[6] + xs[7]);
        let sx = (s4.x + s4.y) + (s4.z + s4.w);
        acc += vec4<f32>(chunk(r0, c, xs, sx, s.x, m.x), chunk(r1, c, xs, sx, s.y, m.y),
                         chunk(r2, c, xs, sx, s.z, m.z), chunk(r3, c, xs, sx, s.w, m.w));
#ifdef ROWS8
        let s8 = halves(sw8, g);
        let m8 = halves(mw8, g);
        acc_up += vec4<f32>(chunk(r4, c, xs, sx, s8.x, m8.x), chunk(r5, c, xs, sx, s8.y, m8.y),
                            chunk(r6, c, xs, sx, s8.z, m8.z), chunk(r7, c, xs, sx, s8.w, m8.w));
#endif
    }
    // tail: the last partial chunk, element by element, only k < K
    for (var k = full * 32u; k < params.k; k++) {
        let xv = xv4(xrow, k / 4u)[k % 4u];
        acc += xv * vec4<f32>(w_at(r0, k), w_at(r1, k), w_at(r2, k), w_at(r3, k));
#ifdef ROWS8
        acc_up += xv * vec4<f32>(w_at(r4, k), w_at(r5, k), w_at(r6, k), w_at(r7, k));
#endif
    }
#ifdef NORM
    acc *= inv;
#ifdef ROWS8
    acc_up *= inv;
#endif
#endif
#ifdef SWIGLU
    let out0 = gid.x * 4u;
    let h = acc / (vec4<f32>(1.0) + exp(-acc)) * acc_up;
    let ybase = t * params.y_stride + params.n_offset + out0;
    let nout = params.n / 2u;
    for (var r = 0u; r < 4u; r++) {
        if (out0 + r < nout) {
            y[ybase + r] = h[r];
        }
    }
#else
    let ybase = t * params.y_stride + params.n_offset + n0;
#ifdef ROWS8
    let nr = 8u;
#else
    let nr = 4u;
#endif
    for (var r = 0u; r < nr; r++) {
        if (n0 + r < params.n) {
#ifdef ROWS8
            var v = select(acc_up[r % 4u], acc[r % 4u], r < 4u);
#else
            var v = acc[r];
#endif
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
