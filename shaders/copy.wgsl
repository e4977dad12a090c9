// Bandwidth probe and buffer copy: dst[i] = src[i] as vec4<u32>, VEC_PER_THREAD vectors per invocation.
// `webinfer bench` reports every kernel's bandwidth beside this one measured in the same run.
#define WG 256
#define VEC_PER_THREAD 4

struct Params { n_vec4: u32, _p0: u32, _p1: u32, _p2: u32 }

@group(0) @binding(0) var<storage, read> src: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read_write> dst: array<vec4<u32>>;
@group(0) @binding(2) var<uniform> params: Params;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let threads = nwg.x * WG;
    let t = gid.x + gid.y * threads;
    for (var j = 0u; j < VEC_PER_THREAD; j++) {
        let i = t + j * threads * nwg.y;  // consecutive lanes read consecutive vectors
        if (i < params.n_vec4) {
            dst[i] = src[i];
        }
    }
}
