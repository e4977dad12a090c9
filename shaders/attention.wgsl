// Causal grouped-query attention over a paged KV cache (webinfer/kernels/attention.py builds and dispatches it).
//
// One file, three kernels chosen by KERNEL (each variant declares only the bindings it uses, numbered from 0,
// because an automatic layout drops unused bindings):
//   KERNEL == 0  decode:  sequences with exactly one query token. Flash-decoding: the KV range [0, ctx) is cut
//                into CHUNK-long splits, one workgroup per (split, kv head, sequence) writes a partial
//                (max, sum, unnormalised acc) for the GROUP query heads that share the kv head.
//   KERNEL == 1  reduce:  merges a decode sequence's partials in split order -> out.
//   KERNEL == 2  prefill: sequences with two or more query tokens (chunked prefill; earlier KV read from the
//                cache). One workgroup per (WG-query tile, query head, sequence), one query per invocation; K/V
//                tiles of BK positions in workgroup memory; online softmax.
// Which kernel serves a sequence depends only on its own query count, and the split count only on its own
// context length, so a sequence's output never depends on the rest of the batch (batch invariance).
//
// Data (all written before attention runs; see attention.py for the packing):
//   q      f32 [T, Q_STRIDE]: query head h of token row t at q[t*Q_STRIDE + Q_OFFSET + h*HEAD_DIM ..], RoPE applied
//   k, v   [num_blocks, BLOCK_SIZE, N_KV_HEADS, HEAD_DIM], f32 (f16 under KV_F16); position p of a sequence
//          lives in block block_tables[bt_offset + p / BLOCK_SIZE], slot p % BLOCK_SIZE
//   seqs   u32 [n_seqs] x vec4: (ctx_len, bt_offset, q_row, n_q): the sequence's KV length including this step's
//          tokens, where its block table starts, its first token row in q/out, and its query token count.
//          Its queries sit at positions ctx_len - n_q .. ctx_len - 1.
//   out    f32 [T, N_HEADS * HEAD_DIM]
// Softmax is f32 with scale 1/sqrt(HEAD_DIM) folded into q.

#define WG 64
const GROUP: u32 = N_HEADS / N_KV_HEADS;  // query heads per kv head
const HD4: u32 = HEAD_DIM / 4;
// a masked score; kept finite so that "max - max" never makes NaN
const NEG: f32 = -1.0e30;

#ifdef KV_F16
alias kv_vec = vec4<f16>;
#else
alias kv_vec = vec4<f32>;
#endif

// decode ------------------------------------------------------------------------------------------------------
#if KERNEL == 0
@group(0) @binding(0) var<storage, read> q: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> k_cache: array<kv_vec>;
@group(0) @binding(2) var<storage, read> v_cache: array<kv_vec>;
@group(0) @binding(3) var<storage, read> block_tables: array<u32>;
@group(0) @binding(4) var<storage, read> seqs: array<vec4<u32>>;
@group(0) @binding(5) var<storage, read_write> partials: array<vec4<f32>>;

var<workgroup> q_s: array<vec4<f32>, GROUP * HD4>;
var<workgroup> sc: array<f32, GROUP * CHUNK>;
var<workgroup> red: array<f32, GROUP * WG>;
var<workgroup> stat: array<f32, GROUP>;
// the weighted V sum splits the positions over SLICES groups of HD4 invocations (HD4 <= WG)
const SLICES: u32 = max(WG / HD4, 1u);
var<workgroup> vex: array<vec4<f32>, max(SLICES - 1u, 1u) * GROUP * HD4>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let split = wid.x;
    let kvh = wid.y;
    let sq = seqs[wid.z];
    let ctx = sq.x;
    let start = split * CHUNK;
    if (sq.w != 1u || start >= ctx) {
        return;  // not a decode sequence, or past its last split: uniform per workgroup
    }
    let n = min(ctx - start, CHUNK);
    let scale = inverseSqrt(f32(HEAD_DIM));
    for (var i = lid; i < GROUP * HD4; i += WG) {
        let g = i / HD4;
        q_s[i] = q[(sq.z * Q_STRIDE + Q_OFFSET) / 4u + (kvh * GROUP + g) * HD4 + i % HD4] * scale;
    }
    workgroupBarrier();
    // scores: one key per invocation at a time; each K vector is loaded once for the GROUP query heads
    var mloc: array<f32, GROUP>;
    for (var g = 0u; g < GROUP; g++) { mloc[g] = NEG; }
    for (var i = lid; i < n; i += WG) {
        let pos = start + i;
        let blk = block_tables[sq.y + pos / BLOCK_SIZE];
        let base = ((blk * BLOCK_SIZE + pos % BLOCK_SIZE) * N_KV_HEADS + kvh) * HD4;
        var acc: array<vec4<f32>, GROUP>;
        for (var g = 0u; g < GROUP; g++) { acc[g] = vec4<f32>(0.0); }
        for (var d = 0u; d < HD4; d++) {
            let kv = vec4<f32>(k_cache[base + d]);
            for (var g = 0u; g < GROUP; g++) { acc[g] += q_s[g * HD4 + d] * kv; }
        }
        for (var g = 0u; g < GROUP; g++) {
            let s = acc[g].x + acc[g].y + acc[g].z + acc[g].w;
            sc[g * CHUNK + i] = s;
            mloc[g] = max(mloc[g], s);
        }
    }
    for (var g = 0u; g < GROUP; g++) { red[g * WG + lid] = mloc[g]; }
    workgroupBarrier();
    if (lid < GROUP) {
        var m = NEG;
        for (var j = 0u; j < WG; j++) { m = max(m, red[lid * WG + j]); }
        stat[lid] = m;
    }
    workgroupBarrier();
    var lloc: array<f32, GROUP>;
    for (var g = 0u; g < GROUP; g++) { lloc[g] = 0.0; }
    for (var i = lid; i < n; i += WG) {
        for (var g = 0u; g < GROUP; g++) {
            let p = exp(sc[g * CHUNK + i] - stat[g]);
            sc[g * CHUNK + i] = p;
            lloc[g] += p;
        }
    }
    for (var g = 0u; g < GROUP; g++) { red[g * WG + lid] = lloc[g]; }
    workgroupBarrier();
    // partial record of (seq, head, split): vec4(max, sum, 0, 0) then HD4 vectors of the unnormalised output
    let rec = HD4 + 1u;
    if (lid < GROUP) {
        var l = 0.0;
        for (var j = 0u; j < WG; j++) { l += red[lid * WG + j]; }
        let h = kvh * GROUP + lid;
        partials[((wid.z * N_HEADS + h) * MAX_SPLITS + split) * rec] = vec4<f32>(stat[lid], l, 0.0, 0.0);
    }
    // weighted V sum: invocation (slice, d) walks positions slice, slice + SLICES, ... for output vector d of all
    // GROUP heads (each V vector loaded once); the SLICES partial sums are then added in slice order
    let d = lid % HD4;
    let slice = lid / HD4;
    var vacc: array<vec4<f32>, GROUP>;
    for (var g = 0u; g < GROUP; g++) { vacc[g] = vec4<f32>(0.0); }
    if (slice < SLICES) {
        for (var i = slice; i < n; i += SLICES) {
            let pos = start + i;
            let blk = block_tables[sq.y + pos / BLOCK_SIZE];
            let vv = vec4<f32>(v_cache[((blk * BLOCK_SIZE + pos % BLOCK_SIZE) * N_KV_HEADS + kvh) * HD4 + d]);
            for (var g = 0u; g < GROUP; g++) { vacc[g] += sc[g * CHUNK + i] * vv; }
        }
    }
    if (slice > 0u && slice < SLICES) {
        for (var g = 0u; g < GROUP; g++) { vex[((slice - 1u) * GROUP + g) * HD4 + d] = vacc[g]; }
    }
    workgroupBarrier();
    if (slice == 0u) {
        for (var g = 0u; g < GROUP; g++) {
            var a = vacc[g];
            for (var sl = 1u; sl < SLICES; sl++) { a += vex[((sl - 1u) * GROUP + g) * HD4 + d]; }
            let h = kvh * GROUP + g;
            partials[((wid.z * N_HEADS + h) * MAX_SPLITS + split) * rec + 1u + d] = a;
        }
    }
}
#endif

// reduce ------------------------------------------------------------------------------------------------------
#if KERNEL == 1
@group(0) @binding(0) var<storage, read> partials: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> seqs: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> out: array<vec4<f32>>;

// one workgroup per (query head, sequence); invocation d owns output vector d; splits merged in order
@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let h = wid.x;
    let sq = seqs[wid.y];
    if (sq.w != 1u) {
        return;
    }
    let n_splits = (sq.x + CHUNK - 1u) / CHUNK;
    let rec = HD4 + 1u;
    let first = (wid.y * N_HEADS + h) * MAX_SPLITS * rec;
    var m = NEG;
    for (var s = 0u; s < n_splits; s++) { m = max(m, partials[first + s * rec].x); }
    var l = 0.0;
    for (var s = 0u; s < n_splits; s++) {
        let st = partials[first + s * rec];
        l += st.y * exp(st.x - m);
    }
    for (var d = lid; d < HD4; d += WG) {
        var acc = vec4<f32>(0.0);
        for (var s = 0u; s < n_splits; s++) {
            acc += partials[first + s * rec + 1u + d] * exp(partials[first + s * rec].x - m);
        }
        out[(sq.z * N_HEADS + h) * HD4 + d] = acc / l;
    }
}
#endif

// prefill -----------------------------------------------------------------------------------------------------
// One invocation per query row (WG rows per workgroup) keeps its scaled query and its output in registers; K/V
// tiles of BK positions are staged in workgroup memory and every invocation reads the same element at the same
// time (uniform addresses). Measured on lavapipe: 1.7x faster than 16x16 score tiles shared by 4 invocations/row.
#if KERNEL == 2
@group(0) @binding(0) var<storage, read> q: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> k_cache: array<kv_vec>;
@group(0) @binding(2) var<storage, read> v_cache: array<kv_vec>;
@group(0) @binding(3) var<storage, read> block_tables: array<u32>;
@group(0) @binding(4) var<storage, read> seqs: array<vec4<u32>>;
@group(0) @binding(5) var<storage, read_write> out: array<vec4<f32>>;

var<workgroup> k_s: array<vec4<f32>, BK * HD4>;
var<workgroup> v_s: array<vec4<f32>, BK * HD4>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let h = wid.y;
    let kvh = h / GROUP;
    let sq = seqs[wid.z];
    let ctx = sq.x;
    let nq = sq.w;
    let q0 = wid.x * WG;
    if (nq <= 1u || q0 >= nq) {
        return;
    }
    let start_pos = ctx - nq;
    let scale = inverseSqrt(f32(HEAD_DIM));
    let valid = q0 + lid < nq;
    let qpos = start_pos + q0 + lid;
    var qr: array<vec4<f32>, HD4>;
    var acc: array<vec4<f32>, HD4>;
    let qbase = ((sq.z + q0 + lid) * Q_STRIDE + Q_OFFSET) / 4u + h * HD4;
    for (var d = 0u; d < HD4; d++) {
        qr[d] = select(vec4<f32>(0.0), q[qbase + d] * scale, valid);
        acc[d] = vec4<f32>(0.0);
    }
    let kv_end = start_pos + min(q0 + WG, nq);
    var m = NEG;
    var l = 0.0;
    for (var kt = 0u; kt < kv_end; kt += BK) {
        workgroupBarrier();
        for (var i = lid; i < BK * HD4; i += WG) {
            let pos = kt + i / HD4;
            var kv = vec4<f32>(0.0);
            var vv = vec4<f32>(0.0);
            if (pos < kv_end) {
                let blk = block_tables[sq.y + pos / BLOCK_SIZE];
                let base = ((blk * BLOCK_SIZE + pos % BLOCK_SIZE) * N_KV_HEADS + kvh) * HD4;
                kv = vec4<f32>(k_cache[base + i % HD4]);
                vv = vec4<f32>(v_cache[base + i % HD4]);
            }
            k_s[i] = kv;
            v_s[i] = vv;
        }
        workgroupBarrier();
        var s: array<f32, BK>;
        var mt = m;
        for (var c = 0u; c < BK; c++) {
            var a = vec4<f32>(0.0);
            for (var d = 0u; d < HD4; d++) { a += qr[d] * k_s[c * HD4 + d]; }
            s[c] = select(NEG, a.x + a.y + a.z + a.w, kt + c <= qpos);
            mt = max(mt, s[c]);
        }
        let alpha = exp(m - mt);
        l *= alpha;
        for (var d = 0u; d < HD4; d++) { acc[d] *= alpha; }
        for (var c = 0u; c < BK; c++) {
            if (s[c] > 0.5 * NEG) {
                let p = exp(s[c] - mt);
                l += p;
                for (var d = 0u; d < HD4; d++) { acc[d] += p * v_s[c * HD4 + d]; }
            }
        }
        m = mt;
    }
    if (valid) {
        for (var d = 0u; d < HD4; d++) {
            out[((sq.z + q0 + lid) * N_HEADS + h) * HD4 + d] = acc[d] / l;
        }
    }
}
#endif
