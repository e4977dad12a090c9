// Quantized matrix x many activation rows (prefill): y[t, n] = sum_k W[n, k] * x[t, k] for q4, q4a, q8.
//
// A workgroup owns a tile of 64 weight rows x 16 activation rows. Per 32-wide k chunk it dequantizes the 64x32
// weight tile into workgroup memory once (each invocation unpacks 8 values) and stages the 16x32 activations,
// then every invocation accumulates 1 weight row x 4 activation rows. The weight unpacking, which bounds GEMV on
// lavapipe, is thus shared by 16 rows instead of repeated per row.
//
// Batch invariance: y[t, n] is a sequential sum over chunks of dot(weights, x) in a fixed order; which other rows
// share the tile never changes it. The model sends the rows of multi-token chunks (prefill) here and single-token
// rows (decode) to gemv.wgsl: the choice depends only on the sequence's own chunk length.
// Rows processed: [step[params.start_index], + step[params.count_index]).
//
// Defines as in gemv.wgsl: DTYPE, BIAS (+BIAS_SLOT), ACCUMULATE, SWIGLU (gate/up interleaved in blocks of 4).
#define DTYPE q4
#define BIAS_SLOT 6
#define BN 64
#define BT 16

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

var<workgroup> wt: array<vec4<f32>, BN * 8>;  // [row][8 vec4] = 64 x 32 dequantized weights
var<workgroup> xt: array<vec4<f32>, BT * 8>;  // [token][8 vec4] = 16 x 32 activations

fn half_at(word: u32, g: u32) -> f32 {
    return unpack2x16float(word)[g & 1u];
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let count = step[params.count_index];
    let start = step[params.start_index];
    let tile_t = wid.y * BT;
    if (tile_t >= count) {
        return;  // uniform per workgroup
    }
    let n_base = wid.x * BN;
    // loader roles: weight row lr (0..63), 8-element piece j (0..3); activation token lt (0..15), vec4 pair lp
    let lr = lid / 4u;
    let j = lid % 4u;
    let wrow = min(n_base + lr, params.n - 1u);
    let lt = lid / 8u;
    let lq = lid % 8u;  // x: 16 tokens x 8 vec4 = 128 vec4; invocations 0..127 load one each
    // compute roles: weight row cr, tokens 4 * ct .. 4 * ct + 3
    let cr = lid % BN;
    let ct = lid / BN;
    var acc = vec4<f32>(0.0);
#ifdef SWIGLU
    var acc_up = vec4<f32>(0.0);
#endif
    let chunks = (params.k + 31u) / 32u;
    for (var c = 0u; c < chunks; c++) {
        // ---- dequantize 8 weights: row wrow, k = 32c + 8j .. + 7 (zero where k >= K)
        let k0 = c * 32u + 8u * j;
        let g = k0 / params.gs;
        let s = half_at(scales[wrow * params.s_stride + g / 2u], g);
        var lo: vec4<f32>;
        var hi: vec4<f32>;
#if DTYPE == q8
        let base = wrow * params.w_stride4 + 2u * c + j / 2u;
        let v = w[base];
        let a = select(v.x, v.z, (j & 1u) == 1u);
        let b = select(v.y, v.w, (j & 1u) == 1u);
        lo = vec4<f32>(bitcast<vec4<i32>>(vec4<u32>(a << 24u, a << 16u, a << 8u, a)) >> vec4<u32>(24u)) * s;
        hi = vec4<f32>(bitcast<vec4<i32>>(vec4<u32>(b << 24u, b << 16u, b << 8u, b)) >> vec4<u32>(24u)) * s;
#else
        let word = w[wrow * params.w_stride4 + c][j];
        let ql = vec4<f32>(vec4<u32>(word, word >> 4u, word >> 8u, word >> 12u) & vec4<u32>(15u));
        let qh = vec4<f32>(vec4<u32>(word >> 16u, word >> 20u, word >> 24u, word >> 28u) & vec4<u32>(15u));
#if DTYPE == q4a
        let m = half_at(mins[wrow * params.s_stride + g / 2u], g);
        lo = ql * s + m;
        hi = qh * s + m;
#else
        lo = (ql - 8.0) * s;
        hi = (qh - 8.0) * s;
#endif
#endif
        if (k0 + 8u > params.k) {
            let kk = vec4<u32>(k0) + vec4<u32>(0u, 1u, 2u, 3u);
            lo = select(vec4<f32>(0.0), lo, kk < vec4<u32>(params.k));
            hi = select(vec4<f32>(0.0), hi, kk + vec4<u32>(4u) < vec4<u32>(params.k));
        }
        wt[lr * 8u + 2u * j] = lo;
        wt[lr * 8u + 2u * j + 1u] = hi;
        // ---- stage activations: token lt, vec4 lq (invocations 0..127); zero past K or past the row count
        if (lid < BT * 8u) {
            let t = tile_t + lt;
            let kv = c * 32u + 4u * lq;
            var xv = vec4<f32>(0.0);
            if (t < count && kv < params.k) {
                let idx = (start + t) * params.x_stride4 + c * 8u + lq;
                if (kv + 4u <= params.k) {
                    xv = x[idx];
                } else {
                    let kk = vec4<u32>(kv) + vec4<u32>(0u, 1u, 2u, 3u);
                    xv = select(vec4<f32>(0.0), x[idx], kk < vec4<u32>(params.k));
                }
            }
            xt[lt * 8u + lq] = xv;
        }
        workgroupBarrier();
        // ---- accumulate 1 weight row x 4 tokens over this chunk
#ifdef SWIGLU
        let gr = (cr / 8u) * 8u + cr % 4u;  // gate row of this invocation's output pair (up row = gr + 4)
#else
        let gr = cr;
#endif
        for (var q = 0u; q < 4u; q++) {
            let tb = (ct * 4u + q) * 8u;
            var d = vec4<f32>(0.0);
            var du = vec4<f32>(0.0);
            for (var e = 0u; e < 8u; e++) {
                d += wt[gr * 8u + e] * xt[tb + e];
#ifdef SWIGLU
                du += wt[(gr + 4u) * 8u + e] * xt[tb + e];
#endif
            }
            acc[q] += (d.x + d.y) + (d.z + d.w);
#ifdef SWIGLU
            acc_up[q] += (du.x + du.y) + (du.z + du.w);
#endif
        }
        workgroupBarrier();
    }
#ifdef SWIGLU
    if ((cr % 8u) >= 4u) {
        return;
    }
    let out_n = (n_base + cr) / 8u * 4u + cr % 4u;
    if (out_n >= params.n / 2u) {
        return;
    }
    let h = acc / (vec4<f32>(1.0) + exp(-acc)) * acc_up;
    for (var q = 0u; q < 4u; q++) {
        let t = tile_t + ct * 4u + q;
        if (t < count) {
            y[(start + t) * params.y_stride + params.n_offset + out_n] = h[q];
        }
    }
#else
    let n = n_base + cr;
    if (n >= params.n) {
        return;
    }
    for (var q = 0u; q < 4u; q++) {
        let t = tile_t + ct * 4u + q;
        if (t < count) {
            let yi = (start + t) * params.y_stride + params.n_offset + n;
            var v = acc[q];
#ifdef BIAS
            v += bias[n];
#endif
#ifdef ACCUMULATE
            v += y[yi];
#endif
            y[yi] = v;
        }
    }
#endif
}
