// Quantized matrix x many activation rows (prefill): y[t, n] = sum_k W[n, k] * x[t, k] for q4, q4a, q8.
//
// Register tiling: one invocation owns 4 weight rows x 4 activation rows. Per 32-wide k chunk it loads and
// unpacks the 4 weight rows once (nibble unpacking is what bounds GEMV on lavapipe) and reuses them for the 4
// activation rows, whose x vectors are loaded once and reused for the 4 weight rows. No workgroup memory and no
// barriers: on llvmpipe a workgroup-memory tile (tried first) was slower, since its loads are per lane too.
//
// Batch invariance: y[t, n] = sum over chunks, in order, of s * (dot32(q, x) - 8 * sum(x)) (q4), the same
// expression as gemv.wgsl; which other rows share the tile never changes it. The model sends multi-token chunks
// (prefill) here and one-token chunks (decode) to gemv.wgsl: the choice depends only on the sequence's own chunk.
// Rows processed: [step[params.start_index], + step[params.count_index]).
//
// Defines as in gemv.wgsl: DTYPE, BIAS (+BIAS_SLOT), ACCUMULATE, SWIGLU (gate/up interleaved in blocks of 4).
#define WG 64
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
fn i8x4(u: u32) -> vec4<f32> {
    return vec4<f32>(bitcast<vec4<i32>>(vec4<u32>(u << 24u, u << 16u, u << 8u, u)) >> vec4<u32>(24u));
}
// the 32 int8 values of chunk c of `row`
fn unpack_row(row: u32, c: u32) -> W8 {
    let a = w[row * params.w_stride4 + 2u * c];
    let b = w[row * params.w_stride4 + 2u * c + 1u];
    return W8(i8x4(a.x), i8x4(a.y), i8x4(a.z), i8x4(a.w), i8x4(b.x), i8x4(b.y), i8x4(b.z), i8x4(b.w));
}
#else
fn lo4(u: u32) -> vec4<f32> {
    return vec4<f32>(vec4<u32>(u, u >> 4u, u >> 8u, u >> 12u) & vec4<u32>(15u));
}
fn hi4(u: u32) -> vec4<f32> {
    return vec4<f32>(vec4<u32>(u >> 16u, u >> 20u, u >> 24u, u >> 28u) & vec4<u32>(15u));
}
// the 32 unsigned nibbles of chunk c of `row`
fn unpack_row(row: u32, c: u32) -> W8 {
    let a = w[row * params.w_stride4 + c];
    return W8(lo4(a.x), hi4(a.x), lo4(a.y), hi4(a.y), lo4(a.z), hi4(a.z), lo4(a.w), hi4(a.w));
}
#endif

// same association as gemv.wgsl's dot32
fn dot8(q: W8, xs: W8) -> f32 {
    return dot(q[0], xs[0]) + dot(q[1], xs[1]) + dot(q[2], xs[2]) + dot(q[3], xs[3])
         + dot(q[4], xs[4]) + dot(q[5], xs[5]) + dot(q[6], xs[6]) + dot(q[7], xs[7]);
}

fn load_x(row: u32, c: u32) -> W8 {
    let b = row * params.x_stride4 + 8u * c;
    return W8(x[b], x[b + 1u], x[b + 2u], x[b + 3u], x[b + 4u], x[b + 5u], x[b + 6u], x[b + 7u]);
}

fn sum8(xs: W8) -> f32 {
    let s4 = (xs[0] + xs[1]) + (xs[2] + xs[3]) + (xs[4] + xs[5]) + (xs[6] + xs[7]);
    return (s4.x + s4.y) + (s4.z + s4.w);
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

// contribution of chunk c to the 4 rows (components) for one activation row: same formula as gemv.wgsl's chunk()
fn chunk4(q0: W8, q1: W8, q2: W8, q3: W8, s: vec4<f32>, m: vec4<f32>, xs: W8) -> vec4<f32> {
    let sx = sum8(xs);
    let d = vec4<f32>(dot8(q0, xs), dot8(q1, xs), dot8(q2, xs), dot8(q3, xs));
#if DTYPE == q8
    return s * d;
#else
#if DTYPE == q4a
    return s * d + m * sx;
#else
    return s * (d - 8.0 * sx);
#endif
#endif
}

fn tail4(rows: vec4<u32>, xrow: u32) -> vec4<f32> {
    var acc = vec4<f32>(0.0);
    for (var k = (params.k / 32u) * 32u; k < params.k; k++) {
        let xv = x[xrow * params.x_stride4 + k / 4u][k % 4u];
        acc += xv * vec4<f32>(w_at(rows.x, k), w_at(rows.y, k), w_at(rows.z, k), w_at(rows.w, k));
    }
    return acc;
}

// acc[j] += chunk contributions of 4 weight rows for 4 activation rows t[j]
fn accumulate(rows: vec4<u32>, t: vec4<u32>, acc: ptr<function, array<vec4<f32>, 4>>) {
    let full = params.k / 32u;
    for (var c = 0u; c < full; c++) {
        let g = c * 32u / params.gs;
        let s = vec4<f32>(scale_of(rows.x, g), scale_of(rows.y, g), scale_of(rows.z, g), scale_of(rows.w, g));
#if DTYPE == q4a
        let m = vec4<f32>(min_of(rows.x, g), min_of(rows.y, g), min_of(rows.z, g), min_of(rows.w, g));
#else
        let m = vec4<f32>(0.0);
#endif
        let q0 = unpack_row(rows.x, c);
        let q1 = unpack_row(rows.y, c);
        let q2 = unpack_row(rows.z, c);
        let q3 = unpack_row(rows.w, c);
        (*acc)[0] += chunk4(q0, q1, q2, q3, s, m, load_x(t.x, c));
        (*acc)[1] += chunk4(q0, q1, q2, q3, s, m, load_x(t.y, c));
        (*acc)[2] += chunk4(q0, q1, q2, q3, s, m, load_x(t.z, c));
        (*acc)[3] += chunk4(q0, q1, q2, q3, s, m, load_x(t.w, c));
    }
    (*acc)[0] += tail4(rows, t.x);
    (*acc)[1] += tail4(rows, t.y);
    (*acc)[2] += tail4(rows, t.z);
    (*acc)[3] += tail4(rows, t.w);
}

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let count = step[params.count_index];
    let start = step[params.start_index];
    let t0 = gid.y * 4u;
    if (t0 >= count) {
        return;
    }
    // activation rows past the count re-read the last valid one (in bounds) and are not stored
    let tl = count - 1u;
    let t = vec4<u32>(start) + min(vec4<u32>(t0) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(tl));
    let last = params.n - 1u;
#ifdef SWIGLU
    let out0 = gid.x * 4u;
    if (out0 >= params.n / 2u) {
        return;
    }
    let n0 = gid.x * 8u;
    let gate_rows = min(vec4<u32>(n0) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(last));
    let up_rows = min(vec4<u32>(n0) + vec4<u32>(4u, 5u, 6u, 7u), vec4<u32>(last));
    var acc = array<vec4<f32>, 4>();
    var acc_up = array<vec4<f32>, 4>();
    accumulate(gate_rows, t, &acc);
    accumulate(up_rows, t, &acc_up);
    for (var j = 0u; j < 4u; j++) {
        if (t0 + j < count) {
            let g = acc[j];
            let h = g / (vec4<f32>(1.0) + exp(-g)) * acc_up[j];
            let yb = (start + t0 + j) * params.y_stride + params.n_offset + out0;
            for (var r = 0u; r < 4u; r++) {
                if (out0 + r < params.n / 2u) {
                    y[yb + r] = h[r];
                }
            }
        }
    }
#else
    let n0 = gid.x * 4u;
    if (n0 >= params.n) {
        return;
    }
    let rows = min(vec4<u32>(n0) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(last));
    var acc = array<vec4<f32>, 4>();
    accumulate(rows, t, &acc);
    for (var j = 0u; j < 4u; j++) {
        if (t0 + j < count) {
            let yb = (start + t0 + j) * params.y_stride + params.n_offset + n0;
            for (var r = 0u; r < 4u; r++) {
                if (n0 + r < params.n) {
                    var v = acc[j][r];
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
    }
#endif
}
