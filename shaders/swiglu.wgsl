// SwiGLU: out[t, i] = silu(gu[t, i]) * gu[t, F + i] for the fused gate/up output [T, 2F] (gate first).
// The model normally fuses this into the gate/up GEMV (gemv.wgsl SWIGLU); this kernel serves weights whose
// row count does not allow that fusion (F not a multiple of 4, or gate/up split over several bindings).
#define WG 64

struct Params { f: u32, in_stride: u32, out_stride: u32, count_index: u32 }

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
    out[t * params.out_stride + i] = g / (1.0 + exp(-g)) * u;
}
