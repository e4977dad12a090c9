// SwiGLU: out[t, i] = silu(gu[t, i]) * gu[t, F + i] for the fused gate/up output [T, 2F] (gate first).
// GELU_TANH: GeGLU instead, out = gelu_tanh(gate) * up (Gemma's gelu_pytorch_tanh).
// The model normally fuses SwiGLU into the gate/up GEMV (gemv.wgsl SWIGLU); this kernel serves weights whose
// row count does not allow that fusion (F not a multiple of 4, or gate/up split over several bindings) and GeGLU.
// SOFTCAP: a separate kernel, x[t, i] = cap * tanh(x[t, i] / cap) in place over [rows, f] (Gemma 2's final
// logit soft-capping; params.in_stride holds the cap's f32 bits).
#define WG 64

struct Params { f: u32, in_stride: u32, out_stride: u32, count_index: u32 }

// tanh through exp overflows to inf / inf = NaN for large |x|; tanh(15) is 1 in f32 already
fn tanh_safe(x: f32) -> f32 {
    return tanh(clamp(x, -15.0, 15.0));
}

#ifdef SOFTCAP
@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<uniform> params: Params;
@group(0) @binding(2) var<storage, read> step: array<u32>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let t = gid.y;
    let i = gid.x;
    if (t >= step[params.count_index] || i >= params.f) {
        return;
    }
    let cap = bitcast<f32>(params.in_stride);
    let a = t * params.out_stride + i;
    x[a] = cap * tanh_safe(x[a] / cap);
}
#else
@group(0) @binding(0) var<storage, read> gu: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<uniform> params: Params;
@group(0) @binding(3) var<storage, read> step: array<u32>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let t = gid.y;
    let i = gid.x;
    if (t >= step[params.count_index] || i >= params.f) {
        return;
    }
    let g = gu[t * params.in_stride + i];
    let u = gu[t * params.in_stride + params.f + i];
#ifdef GELU_TANH
    out[t * params.out_stride + i] = 0.5 * g * (1.0 + tanh_safe(0.7978845608028654 * (g + 0.044715 * g * g * g))) * u;
#else
    out[t * params.out_stride + i] = g / (1.0 + exp(-g)) * u;
#endif
}
#endif
