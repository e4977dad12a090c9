// RoPE (half-split: x[i] pairs with x[i + hd/2]) on q and k of the fused qkv projection output, then K and V
// scattered into the paged KV cache.
//   qkv   [T, qkv_stride]: q heads at column 0, k heads at q_dim, v heads at q_dim + kv_dim
//   q is rotated in place; rotated k and plain v go to cache slot `slot[t]`
//   (slot = block_table[pos / block_size] * block_size + pos % block_size, computed on the host per step)
//   cache layout (per layer, K and V alike): [num_blocks, block_size, n_kv_heads, head_dim] f32,
//   element (slot, h, d) at slot * kv_dim + h * head_dim + d
// KV_F16: the cache holds f16 (half the memory; attention reads it with the same define). Math stays f32.
// inv_freq [head_dim / 2] is computed once at load (llama3 scaling applied there), angle = pos * inv_freq[i].
#define WG 64

struct Params {
    n_heads: u32,
    n_kv_heads: u32,
    head_dim: u32,
    qkv_stride: u32,
    count_index: u32,
    mscale: f32,  // cos and sin are multiplied by this (LongRoPE's attention factor; 1 otherwise)
    start_index: u32,  // has_start: rows step[start_index] .. + step[count_index] (the prefill rows of a step)
    has_start: u32,
}

#ifdef KV_F16
alias kv_t = f16;
#else
alias kv_t = f32;
#endif

@group(0) @binding(0) var<storage, read_write> qkv: array<f32>;
@group(0) @binding(1) var<storage, read_write> k_cache: array<kv_t>;
@group(0) @binding(2) var<storage, read_write> v_cache: array<kv_t>;
@group(0) @binding(3) var<uniform> params: Params;
@group(0) @binding(4) var<storage, read> step: array<u32>;
@group(0) @binding(5) var<storage, read> pos: array<u32>;
@group(0) @binding(6) var<storage, read> slot: array<u32>;
@group(0) @binding(7) var<storage, read> inv_freq: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let half = params.head_dim / 2u;
    let p = gid.x;
    if (gid.y >= step[params.count_index] || p >= (params.n_heads + params.n_kv_heads) * half) {
        return;
    }
    let t = gid.y + select(0u, step[params.start_index], params.has_start != 0u);
    let head = p / half;
    let i = p % half;
    let angle = f32(pos[t]) * inv_freq[i];
    let c = cos(angle) * params.mscale;
    let s = sin(angle) * params.mscale;
    let row = t * params.qkv_stride;
    let q_dim = params.n_heads * params.head_dim;
    let kv_dim = params.n_kv_heads * params.head_dim;
    if (head < params.n_heads) {
        let a = row + head * params.head_dim + i;
        let x1 = qkv[a];
        let x2 = qkv[a + half];
        qkv[a] = x1 * c - x2 * s;
        qkv[a + half] = x2 * c + x1 * s;
    } else {
        let h = head - params.n_heads;
        let a = row + q_dim + h * params.head_dim + i;
        let x1 = qkv[a];
        let x2 = qkv[a + half];
        let dst = slot[t] * kv_dim + h * params.head_dim + i;
        k_cache[dst] = kv_t(x1 * c - x2 * s);
        k_cache[dst + half] = kv_t(x2 * c + x1 * s);
        v_cache[dst] = kv_t(qkv[a + kv_dim]);
        v_cache[dst + half] = kv_t(qkv[a + kv_dim + half]);
    }
}
