// RMSNorm, optionally fused with the residual add:
//   ADD:     h = x + res; res = h (the new residual); y = h / sqrt(mean(h^2) + eps) * w
//   default: y = x / sqrt(mean(x^2) + eps) * w
//   ROW_MAP: input row = row_map[t] (gathers e.g. the last token of each sampled sequence before the LM head)
//   ACC:     y += x / sqrt(mean(x^2) + eps) * w (Gemma's post-attention / post-FFN norm added to the residual)
//   HEADS:   in place over every head_dim-long q and k head of the qkv rows (Qwen3 / Gemma 3 q/k norm): workgroup
//            (head, token), k = head_dim, x_stride = the qkv row stride, y_stride = the number of q heads (heads
//            below it use weights [0, k), the k heads weights [k, 2k))
// One workgroup per row; each invocation sums a fixed strided subset, then a fixed-shape tree in workgroup
// memory: the reduction order depends only on K, never on the number of rows.
#define WG 64

struct Params {
    k: u32,
    x_stride: u32,
    y_stride: u32,
    count_index: u32,
    eps: f32,
    _p0: u32, _p1: u32, _p2: u32,
}

#ifdef HEADS
@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<storage, read> wn: array<f32>;
@group(0) @binding(2) var<uniform> params: Params;
@group(0) @binding(3) var<storage, read> step: array<u32>;
#else
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> wn: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> params: Params;
@group(0) @binding(4) var<storage, read> step: array<u32>;
#endif
#ifdef ADD
@group(0) @binding(5) var<storage, read_write> res: array<f32>;
#endif
#ifdef ROW_MAP
@group(0) @binding(5) var<storage, read> row_map: array<u32>;
#endif

var<workgroup> partial: array<f32, WG>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = wid.y;
    if (t >= step[params.count_index]) {
        return;  // uniform per workgroup: no barrier is skipped by part of a group
    }
#ifdef ROW_MAP
    let xb = row_map[t] * params.x_stride;
#else
#ifdef HEADS
    let xb = t * params.x_stride + wid.x * params.k;
    let wb = select(0u, params.k, wid.x >= params.y_stride);
#else
    let xb = t * params.x_stride;
#endif
#endif
    var ss = 0.0;
    for (var k = lid; k < params.k; k += WG) {
#ifdef ADD
        let h = x[xb + k] + res[xb + k];
        res[xb + k] = h;
#else
        let h = x[xb + k];
#endif
        ss += h * h;
    }
    partial[lid] = ss;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            partial[lid] += partial[lid + s];
        }
        workgroupBarrier();
    }
    let inv = inverseSqrt(partial[0] / f32(params.k) + params.eps);
#ifdef HEADS
    // each invocation rewrites only the elements it read above
    for (var k = lid; k < params.k; k += WG) {
        x[xb + k] = x[xb + k] * inv * wn[wb + k];
    }
#else
    let yb = t * params.y_stride;
    for (var k = lid; k < params.k; k += WG) {
#ifdef ADD
        let h = res[xb + k];
#else
        let h = x[xb + k];
#endif
#ifdef ACC
        y[yb + k] += h * inv * wn[k];
#else
        y[yb + k] = h * inv * wn[k];
#endif
    }
#endif
}
