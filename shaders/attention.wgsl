// Causal grouped-query attention over a paged KV cache (webinfer/kernels/attention.py builds and dispatches it).
//
// One file, three kernels chosen by KERNEL (each variant declares only the bindings it uses, numbered from 0,
// because an automatic layout drops unused bindings):
//   KERNEL == 0  decode:  sequences with exactly one query token. Flash-decoding: the KV range [0, ctx) is cut
//                into SPLIT-long splits; HEAD_DIM/16 lanes per (split, kv head, sequence) write a partial
//                (max, sum, unnormalised acc) for the GROUP query heads that share the kv head. A sequence with
//                one live split writes its output directly. ROPE: q and k arrive un-rotated in the fused qkv
//                rows; decode applies RoPE itself and writes the token's K and V into the cache (so a decode
//                step needs no rope dispatch).
//   KERNEL == 1  reduce:  merges a decode sequence's partials in split order -> out (sequences of 2+ splits).
//   KERNEL == 2  prefill: sequences with two or more query tokens (chunked prefill; earlier KV read from the
//                cache). The decode lane layout with 4 consecutive queries per lane group instead of a split:
//                each group walks positions 0 .. its workgroup's last query with an online softmax, causal mask
//                per query, for the GROUP query heads of one kv head (head blocks of HB as in decode).
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
// Softmax is f32 with scale 1/sqrt(HEAD_DIM) folded into q (SCALE: that factor instead, e.g. Gemma's
// query_pre_attn_scalar^-0.5).
// Model variants (defines): SOFTCAP = cap: scores -> cap * tanh(score / cap) (Gemma 2). WINDOW = W: sliding-window
// layer, a query at position p sees keys k with p - k < W only (Mistral, Gemma local layers); decode skips the
// splits wholly before the window and the reduce starts at the first split inside it, prefill starts its walk at
// the block holding the workgroup's first visible key.

#define RWG 16

#if KERNEL != 1
fn attn_scale() -> f32 {
#ifdef SCALE
    return f32(SCALE);
#else
    return inverseSqrt(f32(HEAD_DIM));
#endif
}

// soft-capping of 4 scores; tanh's argument is clamped (tanh(15) is 1 in f32) so that an exp inside tanh cannot
// overflow to inf / inf
fn cap_scores(v: vec4<f32>) -> vec4<f32> {
#ifdef SOFTCAP
    return f32(SOFTCAP) * tanh(clamp(v / f32(SOFTCAP), vec4<f32>(-15.0), vec4<f32>(15.0)));
#else
    return v;
#endif
}
#endif

// first key position a query at position qp sees
fn window_lo(qp: u32) -> u32 {
#ifdef WINDOW
    return select(0u, qp + 1u - WINDOW, qp + 1u > WINDOW);
#else
    return 0u;
#endif
}
const GROUP: u32 = N_HEADS / N_KV_HEADS;  // query heads per kv head

// a decode sequence of context ctx has one live split (walked in one piece, or a window inside one SPLIT piece)
fn single_split(ctx: u32) -> bool {
    return ctx <= ONE_SPLIT || window_lo(ctx - 1u) / SPLIT == (ctx - 1u) / SPLIT;
}
const HD4: u32 = HEAD_DIM / 4;
// a masked score; kept finite so that "max - max" never makes NaN
const NEG: f32 = -1.0e30;

#ifdef KV_F16
alias kv_vec = vec4<f16>;
#else
alias kv_vec = vec4<f32>;
#endif

// decode ------------------------------------------------------------------------------------------------------
// Flash-decoding with a split of SPLIT positions per group of NC lanes: lane c of a split owns dims
// [16c, 16c + 16) of the head (four vec4, a mat4x4) for HB query heads of one kv head (GQA: each K and V vector
// is loaded once for all of them; a GROUP above 4 takes ceil(GROUP / 4) head blocks). Every lane walks the
// split's positions once, in order, with an online softmax; the partial dot products of a score are summed over
// the NC lanes (subgroup xor butterfly, or workgroup memory without subgroups), so all NC lanes hold the same
// softmax state. The split writes one partial record per head; the reduce kernel merges them.
// Why this shape (measured on llvmpipe, Mesa 22.3): every storage or workgroup-memory load costs about the same per
// active lane whatever its width or whether the address is uniform, so the loads per position are the budget:
// here 2 x HEAD_DIM/4 vec4 loads per position and kv head, the minimum (the previous layout issued ~5x more:
// q and the scores lived in workgroup memory). And private arrays indexed by a loop counter are spilled (naga's
// loops are not unrolled there), ~3x slower than the fixed registers of the named per-head state used below.
// The K/V loads, the per-head state and the lane sum below serve the decode and the prefill kernels alike.
#if KERNEL != 1
// decode under ROPE writes this step's K and V into the cache itself
#define KV_ACCESS read
#if KERNEL == 0
#ifdef ROPE
#define KV_ACCESS read_write
#endif
#endif
@group(0) @binding(0) var<storage, read> q: array<vec4<f32>>;
#ifdef KV_F16
// f16 K/V read as vec4<u32> (8 halves per load): half the load instructions of vec4<f16>, and loads are what this
// kernel spends its time on (see above)
@group(0) @binding(1) var<storage, KV_ACCESS> k_cache: array<vec4<u32>>;
@group(0) @binding(2) var<storage, KV_ACCESS> v_cache: array<vec4<u32>>;
#else
@group(0) @binding(1) var<storage, KV_ACCESS> k_cache: array<kv_vec>;
@group(0) @binding(2) var<storage, KV_ACCESS> v_cache: array<kv_vec>;
#endif
@group(0) @binding(3) var<storage, read> block_tables: array<u32>;
@group(0) @binding(4) var<storage, read> seqs: array<vec4<u32>>;
#if KERNEL == 0
@group(0) @binding(5) var<storage, read_write> partials: array<vec4<f32>>;
// a sequence whose live positions fit one split writes its output here directly (no reduce pass for it)
@group(0) @binding(6) var<storage, read_write> out: array<vec4<f32>>;
#ifdef ROPE
// (mscale, 0, 0, 0), then the head_dim / 2 inverse frequencies as vec4s (kernels/rope.py rope_table)
@group(0) @binding(7) var<storage, read> rope_tab: array<vec4<f32>>;
#endif
#else
@group(0) @binding(5) var<storage, read_write> out: array<vec4<f32>>;
#endif

const NC: u32 = LANES;  // lanes per split: a power of two >= HEAD_DIM / 16 (wrapper)
const SPLITS_PER_WG: u32 = DWG / NC;

// A context of up to ONE_SPLIT (>= SPLIT) positions is walked as one split: its output needs no reduce pass
// (one dispatch less per layer), and at such lengths the split parallelism saves less than that dispatch costs.
fn seq_split(ctx: u32) -> u32 {
    return select(u32(SPLIT), u32(ONE_SPLIT), ctx <= ONE_SPLIT);
}
const N_HB: u32 = (GROUP + HB - 1u) / HB;  // head blocks per kv head
const REC: u32 = HD4 + 1u;  // partial record: vec4(max, sum, 0, 0), then HD4 vectors of the unnormalised output

#ifndef SG_DECODE
var<workgroup> part: array<vec4<f32>, DWG>;
#endif

fn halves(w: vec2<u32>) -> vec4<f32> {
    return vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y));
}

// vector i (4 dims) of the K or V cache as f32
fn k_vec(i: u32) -> vec4<f32> {
#ifdef KV_F16
    let w = k_cache[i / 2u];
    return halves(select(w.xy, w.zw, i % 2u == 1u));
#else
    return vec4<f32>(k_cache[i]);
#endif
}

fn v_vec(i: u32) -> vec4<f32> {
#ifdef KV_F16
    let w = v_cache[i / 2u];
    return halves(select(w.xy, w.zw, i % 2u == 1u));
#else
    return vec4<f32>(v_cache[i]);
#endif
}

// the four vectors [4c, 4c + 4) of row `base` (HD4 vectors per row); zeros past the head (HEAD_DIM % 16 != 0)
fn load_k(base: u32, c: u32) -> mat4x4<f32> {
#ifdef PAD
    var r = mat4x4<f32>();
    for (var t = 0u; t < 4u; t++) {
        let j = c * 4u + t;
        r[t] = select(vec4<f32>(0.0), k_vec(base + min(j, HD4 - 1u)), j < HD4);
    }
    return r;
#else
#ifdef KV_F16
    let o = (base + c * 4u) / 2u;  // even: rows are HD4 = 4 * LANES vectors long
    let a = k_cache[o];
    let b = k_cache[o + 1u];
    return mat4x4<f32>(halves(a.xy), halves(a.zw), halves(b.xy), halves(b.zw));
#else
    let o = base + c * 4u;
    return mat4x4<f32>(k_vec(o), k_vec(o + 1u), k_vec(o + 2u), k_vec(o + 3u));
#endif
#endif
}

fn load_v(base: u32, c: u32) -> mat4x4<f32> {
#ifdef PAD
    var r = mat4x4<f32>();
    for (var t = 0u; t < 4u; t++) {
        let j = c * 4u + t;
        r[t] = select(vec4<f32>(0.0), v_vec(base + min(j, HD4 - 1u)), j < HD4);
    }
    return r;
#else
#ifdef KV_F16
    let o = (base + c * 4u) / 2u;
    let a = v_cache[o];
    let b = v_cache[o + 1u];
    return mat4x4<f32>(halves(a.xy), halves(a.zw), halves(b.xy), halves(b.zw));
#else
    let o = base + c * 4u;
    return mat4x4<f32>(v_vec(o), v_vec(o + 1u), v_vec(o + 2u), v_vec(o + 3u));
#endif
#endif
}

// one query head's share of a split: its scaled q dims, output accumulator, running max and sum
struct Head {
    q: mat4x4<f32>,
    acc: mat4x4<f32>,
    m: f32,
    l: f32,
}

fn head_new(qbase: u32, c: u32, scale: f32) -> Head {
    var r = mat4x4<f32>();
    for (var t = 0u; t < 4u; t++) {
        let j = c * 4u + t;
        r[t] = select(vec4<f32>(0.0), q[qbase + min(j, HD4 - 1u)] * scale, j < HD4);
    }
    return Head(r, mat4x4<f32>(), NEG, 0.0);
}

fn head_dot(h: Head, k: mat4x4<f32>) -> f32 {
    let t = h.q[0] * k[0] + h.q[1] * k[1] + h.q[2] * k[2] + h.q[3] * k[3];
    return t.x + t.y + t.z + t.w;
}

// online softmax step: rescale when the max grows (factor 1 otherwise; 0 at the first key)
fn head_add(h: ptr<function, Head>, s: f32, v: mat4x4<f32>) {
    let mn = max((*h).m, s);
    let alpha = exp((*h).m - mn);
    let p = exp(s - mn);
    (*h).l = (*h).l * alpha + p;
    (*h).m = mn;
    (*h).acc = (*h).acc * alpha + v * p;
}

// sum of v over the NC lanes of this lane's split; every one of them gets the bit-identical result
fn lane_sum(v: vec4<f32>, lid: u32) -> vec4<f32> {
#if LANES == 1
    return v;
#else
#ifdef SG_DECODE
    var s = v;
    for (var x = 1u; x < NC; x <<= 1u) {
        s += subgroupShuffleXor(s, x);
    }
    return s;
#else
    part[lid] = v;
    workgroupBarrier();
    let first = lid - lid % NC;
    var s = vec4<f32>(0.0);
    for (var x = 0u; x < NC; x++) {
        s += part[first + x];
    }
    workgroupBarrier();
    return s;
#endif
#endif
}

#endif

#if KERNEL == 0
#ifdef ROPE
// RoPE (half-split pairs, as rope.wgsl) of this lane's 4 vectors [4c, 4c + 4) of the head at vec4 index `row` of
// q (the fused qkv rows), at position p. Needs HEAD_DIM % 16 == 0 (no PAD): the partner of vector j is
// j +- HD4 / 2, loaded by the lane itself.
fn rope_lane(row: u32, c: u32, p: u32) -> mat4x4<f32> {
    var r = mat4x4<f32>();
    let ms = rope_tab[0].x;
    for (var t = 0u; t < 4u; t++) {
        let j = c * 4u + t;
        let i = j % (HD4 / 2u);
        let angle = f32(p) * rope_tab[1u + i];
        let cs = cos(angle) * ms;
        let sn = sin(angle) * ms;
        let x = q[row + j];
        if (j < HD4 / 2u) {
            r[t] = x * cs - q[row + j + HD4 / 2u] * sn;
        } else {
            r[t] = x * cs + q[row + j - HD4 / 2u] * sn;
        }
    }
    return r;
}

fn kv_store_k(o: u32, m: mat4x4<f32>) {
#ifdef KV_F16
    k_cache[o / 2u] = vec4<u32>(pack2x16float(m[0].xy), pack2x16float(m[0].zw), pack2x16float(m[1].xy), pack2x16float(m[1].zw));
    k_cache[o / 2u + 1u] = vec4<u32>(pack2x16float(m[2].xy), pack2x16float(m[2].zw), pack2x16float(m[3].xy), pack2x16float(m[3].zw));
#else
    k_cache[o] = kv_vec(m[0]); k_cache[o + 1u] = kv_vec(m[1]); k_cache[o + 2u] = kv_vec(m[2]); k_cache[o + 3u] = kv_vec(m[3]);
#endif
}

fn kv_store_v(o: u32, m: mat4x4<f32>) {
#ifdef KV_F16
    v_cache[o / 2u] = vec4<u32>(pack2x16float(m[0].xy), pack2x16float(m[0].zw), pack2x16float(m[1].xy), pack2x16float(m[1].zw));
    v_cache[o / 2u + 1u] = vec4<u32>(pack2x16float(m[2].xy), pack2x16float(m[2].zw), pack2x16float(m[3].xy), pack2x16float(m[3].zw));
#else
    v_cache[o] = kv_vec(m[0]); v_cache[o + 1u] = kv_vec(m[1]); v_cache[o + 2u] = kv_vec(m[2]); v_cache[o + 3u] = kv_vec(m[3]);
#endif
}
#endif

// query head of this lane's split: its q (RoPE'd at position p under ROPE), scaled
fn head_dec(qbase: u32, c: u32, scale: f32, p: u32) -> Head {
#ifdef ROPE
    return Head(rope_lane(qbase, c, p) * scale, mat4x4<f32>(), NEG, 0.0);
#else
    return head_new(qbase, c, scale);
#endif
}

fn head_out(h: Head, o: u32, c: u32) {
    for (var t = 0u; t < 4u; t++) {
        let j = c * 4u + t;
        if (j < HD4) {
            out[o + j] = h.acc[t] / h.l;
        }
    }
}

fn head_write(h: Head, rec: u32, c: u32) {
    if (c == 0u) {
        partials[rec] = vec4<f32>(h.m, h.l, 0.0, 0.0);
    }
    for (var t = 0u; t < 4u; t++) {
        let j = c * 4u + t;
        if (j < HD4) {
            partials[rec + 1u + j] = h.acc[t];
        }
    }
}

@compute @workgroup_size(DWG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let kvh = wid.y / N_HB;
    let hb = wid.y % N_HB;
    let sq = seqs[wid.z];
    let ctx = sq.x;
    let lo = window_lo(ctx - 1u);
    let sl = seq_split(ctx);  // this sequence's split length
    if (sq.w != 1u || wid.x * SPLITS_PER_WG * sl >= ctx || (wid.x + 1u) * SPLITS_PER_WG * sl <= lo) {
        return;  // uniform per workgroup: not a decode sequence, or none of its splits here / in the window
    }
    let split = wid.x * SPLITS_PER_WG + lid / NC;
    let c = lid % NC;
    let start = split * sl;
    // live steps of this lane; lanes past the last split or before the window (n = 0) and steps past the end
    // still run, masked, so that the lane sums stay in uniform control flow
    let n = select(0u, min(ctx - start, sl), start < ctx && start + sl > lo);
    let scale = attn_scale();
    // head slot j of this block is query head kvh * GROUP + hb * HB + j (clamped; slots past GROUP not written)
    let g0 = hb * HB;
    let qrow = (sq.z * Q_STRIDE + Q_OFFSET) / 4u + kvh * GROUP * HD4;
    let lastp = ctx - 1u;  // the query's position
    var h0 = head_dec(qrow + min(g0, GROUP - 1u) * HD4, c, scale, lastp);
#ifdef H1
    var h1 = head_dec(qrow + min(g0 + 1u, GROUP - 1u) * HD4, c, scale, lastp);
#endif
#ifdef H2
    var h2 = head_dec(qrow + min(g0 + 2u, GROUP - 1u) * HD4, c, scale, lastp);
#endif
#ifdef H3
    var h3 = head_dec(qrow + min(g0 + 3u, GROUP - 1u) * HD4, c, scale, lastp);
#endif
#ifdef ROPE
    // this step's K (RoPE'd) and V of the token, from the qkv row (k after the N_HEADS q heads, v after the k
    // heads) into its cache slot, by the lanes of the split that holds the position: each lane writes the
    // vectors it reads below (program order makes its own write visible to it; other splits never read the
    // position, and head blocks of one kv head write identical values)
    if (start <= lastp && lastp < start + sl) {
        let kvrow = (sq.z * Q_STRIDE + Q_OFFSET) / 4u + N_HEADS * HD4 + kvh * HD4;
        let dst = ((block_tables[sq.y + lastp / BLOCK_SIZE] * BLOCK_SIZE + lastp % BLOCK_SIZE) * N_KV_HEADS + kvh) * HD4
                  + c * 4u;
        kv_store_k(dst, rope_lane(kvrow, c, lastp));
        let vr = kvrow + N_KV_HEADS * HD4 + c * 4u;
        kv_store_v(dst, mat4x4<f32>(q[vr], q[vr + 1u], q[vr + 2u], q[vr + 3u]));
    }
#endif
    // uniform per workgroup: the live length of its first split (later ones are as long or shorter); steps
    // past a split's end are masked, and a masked step after a live one changes nothing, bit for bit
    let iters = min(sl, ctx - wid.x * SPLITS_PER_WG * sl);
    for (var i = 0u; i < iters; i++) {
        let pos = min(start + i, ctx - 1u);  // masked steps re-read a valid position
        let blk = block_tables[sq.y + pos / BLOCK_SIZE];
        let base = ((blk * BLOCK_SIZE + pos % BLOCK_SIZE) * N_KV_HEADS + kvh) * HD4;
        let k = load_k(base, c);
        let v = load_v(base, c);
        var s = vec4<f32>(head_dot(h0, k), 0.0, 0.0, 0.0);
#ifdef H1
        s.y = head_dot(h1, k);
#endif
#ifdef H2
        s.z = head_dot(h2, k);
#endif
#ifdef H3
        s.w = head_dot(h3, k);
#endif
        // keys before the window (first steps of the window's first split) are masked like steps past the end
        s = select(vec4<f32>(NEG), cap_scores(lane_sum(s, lid)), i < n && start + i >= lo);
        head_add(&h0, s.x, v);
#ifdef H1
        head_add(&h1, s.y, v);
#endif
#ifdef H2
        head_add(&h2, s.z, v);
#endif
#ifdef H3
        head_add(&h3, s.w, v);
#endif
    }
    if (n == 0u) {
        return;
    }
    if (single_split(ctx)) {
        // one live split: its normalised output is final (what the reduce's merge of one record computes, bit
        // for bit: 0 * 0 + acc * 1, then acc / l), so the sequence needs no reduce
        let o = (sq.z * N_HEADS + kvh * GROUP + g0) * HD4;
        head_out(h0, o, c);
#ifdef H1
        if (g0 + 1u < GROUP) { head_out(h1, o + HD4, c); }
#endif
#ifdef H2
        if (g0 + 2u < GROUP) { head_out(h2, o + 2u * HD4, c); }
#endif
#ifdef H3
        if (g0 + 3u < GROUP) { head_out(h3, o + 3u * HD4, c); }
#endif
        return;
    }
    let rec0 = ((wid.z * N_HEADS + kvh * GROUP + g0) * MAX_SPLITS + split) * REC;
    head_write(h0, rec0, c);
#ifdef H1
    if (g0 + 1u < GROUP) { head_write(h1, rec0 + MAX_SPLITS * REC, c); }
#endif
#ifdef H2
    if (g0 + 2u < GROUP) { head_write(h2, rec0 + 2u * MAX_SPLITS * REC, c); }
#endif
#ifdef H3
    if (g0 + 3u < GROUP) { head_write(h3, rec0 + 3u * MAX_SPLITS * REC, c); }
#endif
}
#endif

// reduce ------------------------------------------------------------------------------------------------------
#if KERNEL == 1
@group(0) @binding(0) var<storage, read> partials: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> seqs: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> out: array<vec4<f32>>;

// One workgroup per (query head, sequence); invocation d owns output vector d and merges the splits in order in
// one pass (running max; each record's (max, sum) and vector d loaded once).
@compute @workgroup_size(RWG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let h = wid.x;
    let sq = seqs[wid.y];
    if (sq.w != 1u || single_split(sq.x)) {
        return;  // not a decode sequence, or one live split (decode wrote its output)
    }
    let n_splits = (sq.x + SPLIT - 1u) / SPLIT;
    let rec = HD4 + 1u;
    let first = (wid.y * N_HEADS + h) * MAX_SPLITS * rec;
    for (var d = lid; d < HD4; d += RWG) {
        var m = NEG;
        var l = 0.0;
        var acc = vec4<f32>(0.0);
        for (var s = window_lo(sq.x - 1u) / SPLIT; s < n_splits; s++) {  // decode wrote no split before
            let st = partials[first + s * rec];
            let mn = max(m, st.x);
            let a = exp(m - mn);
            let b = exp(st.x - mn);
            l = l * a + st.y * b;
            acc = acc * a + partials[first + s * rec + 1u + d] * b;
            m = mn;
        }
        out[(sq.z * N_HEADS + h) * HD4 + d] = acc / l;
    }
}
#endif

// prefill -----------------------------------------------------------------------------------------------------
// The decode layout, with queries in place of splits: a group of NC lanes owns 4 consecutive query tokens of
// the sequence (one per component of a vec4 score) for the HB query heads of one head block, lane c holding
// dims [16c, 16c + 16) of every one of them (a Quad per head: 4 query mat4x4, 4 output mat4x4, a vec4 of
// running maxima and one of sums). The lanes walk the KV positions once, in order, from 0 to the last query of
// their workgroup; every K and V vector they load serves 4 * HB (query, head) pairs, and one lane sum (a vec4)
// per head finishes the 4 scores of a position. Causal mask per query: a position past a query's own adds
// exactly nothing to it (p = 0, factor exp(0) = 1), so the walk may run to the workgroup's last position.
// Why: on lavapipe loads are the cost (see the decode section); the previous layout (one query per invocation,
// K/V tiles in workgroup memory, q/acc in loop-indexed private arrays) issued ~10x more loads per pair.
// A query's result depends on its sequence alone: the tiling follows its own query count, the order is fixed.
#if KERNEL == 2
const QPW: u32 = SPLITS_PER_WG * 4u;  // queries per workgroup

struct Quad {
    q0: mat4x4<f32>,
    q1: mat4x4<f32>,
    q2: mat4x4<f32>,
    q3: mat4x4<f32>,
    a0: mat4x4<f32>,
    a1: mat4x4<f32>,
    a2: mat4x4<f32>,
    a3: mat4x4<f32>,
    m: vec4<f32>,
    l: vec4<f32>,
}

// head h's queries of token rows row0 .. row0 + 3 (rows past last re-read the last row; they are not written)
fn quad_new(row0: u32, last: u32, h: u32, c: u32, scale: f32) -> Quad {
    let hq = Q_OFFSET / 4u + h * HD4;
    let q0 = head_new(min(row0, last) * (Q_STRIDE / 4u) + hq, c, scale).q;
    let q1 = head_new(min(row0 + 1u, last) * (Q_STRIDE / 4u) + hq, c, scale).q;
    let q2 = head_new(min(row0 + 2u, last) * (Q_STRIDE / 4u) + hq, c, scale).q;
    let q3 = head_new(min(row0 + 3u, last) * (Q_STRIDE / 4u) + hq, c, scale).q;
    let z = mat4x4<f32>();
    return Quad(q0, q1, q2, q3, z, z, z, z, vec4<f32>(NEG), vec4<f32>(0.0));
}

fn mdot(a: mat4x4<f32>, b: mat4x4<f32>) -> f32 {
    let t = a[0] * b[0] + a[1] * b[1] + a[2] * b[2] + a[3] * b[3];
    return t.x + t.y + t.z + t.w;
}

// this lane's part of the 4 scores of key k
fn quad_dot(s: Quad, k: mat4x4<f32>) -> vec4<f32> {
    return vec4<f32>(mdot(s.q0, k), mdot(s.q1, k), mdot(s.q2, k), mdot(s.q3, k));
}

// online softmax step for the 4 queries; `live` masks the queries this position is causal for
fn quad_add(s: ptr<function, Quad>, sc: vec4<f32>, live: vec4<bool>, v: mat4x4<f32>) {
    let mn = max((*s).m, select(vec4<f32>(NEG), sc, live));
    let alpha = exp((*s).m - mn);
    let p = select(vec4<f32>(0.0), exp(sc - mn), live);
    (*s).l = (*s).l * alpha + p;
    (*s).m = mn;
    (*s).a0 = (*s).a0 * alpha.x + v * p.x;
    (*s).a1 = (*s).a1 * alpha.y + v * p.y;
    (*s).a2 = (*s).a2 * alpha.z + v * p.z;
    (*s).a3 = (*s).a3 * alpha.w + v * p.w;
}

fn write_row(a: mat4x4<f32>, l: f32, o: u32, c: u32) {
    for (var t = 0u; t < 4u; t++) {
        let j = c * 4u + t;
        if (j < HD4) {
            out[o + j] = a[t] / l;
        }
    }
}

// rows row0 + j < row0 + n of head h
fn quad_write(s: Quad, row0: u32, n: u32, h: u32, c: u32) {
    let o = (row0 * N_HEADS + h) * HD4;
    let rs = N_HEADS * HD4;
    if (n > 0u) { write_row(s.a0, s.l.x, o, c); }
    if (n > 1u) { write_row(s.a1, s.l.y, o + rs, c); }
    if (n > 2u) { write_row(s.a2, s.l.z, o + 2u * rs, c); }
    if (n > 3u) { write_row(s.a3, s.l.w, o + 3u * rs, c); }
}

// the HB score vectors of a position summed over the NC lanes of the query group: subgroup shuffles per head, or
// without subgroups all heads through workgroup memory at once (one pair of barriers per position, not per head)
#if LANES != 1
#ifndef SG_DECODE
var<workgroup> part_h: array<vec4<f32>, DWG * HB>;
#endif
#endif

fn lane_sum_heads(d: mat4x4<f32>, lid: u32) -> mat4x4<f32> {
#if LANES == 1
    return d;
#else
#ifdef SG_DECODE
    var r = d;
    r[0] = lane_sum(d[0], lid);
#ifdef H1
    r[1] = lane_sum(d[1], lid);
#endif
#ifdef H2
    r[2] = lane_sum(d[2], lid);
#endif
#ifdef H3
    r[3] = lane_sum(d[3], lid);
#endif
    return r;
#else
    for (var j = 0u; j < HB; j++) {
        part_h[lid * HB + j] = d[j];
    }
    workgroupBarrier();
    let first = (lid - lid % NC) * HB;
    var r = mat4x4<f32>();
    for (var x = 0u; x < NC; x++) {
        r[0] += part_h[first + x * HB];
#ifdef H1
        r[1] += part_h[first + x * HB + 1u];
#endif
#ifdef H2
        r[2] += part_h[first + x * HB + 2u];
#endif
#ifdef H3
        r[3] += part_h[first + x * HB + 3u];
#endif
    }
    workgroupBarrier();
    return r;
#endif
#endif
}

@compute @workgroup_size(DWG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let kvh = wid.y / N_HB;
    let hb = wid.y % N_HB;
    let sq = seqs[wid.z];
    let ctx = sq.x;
    let nq = sq.w;
    let wq0 = wid.x * QPW;  // first query (index within the sequence's chunk) of this workgroup
    if (nq <= 1u || wq0 >= nq) {
        return;  // uniform per workgroup: not a prefill sequence, or no queries here
    }
    let start_pos = ctx - nq;
    // uniform end of the walk: one past the workgroup's last query position
    let kv_end = start_pos + min(wq0 + QPW, nq);
    let c = lid % NC;
    let qi = wq0 + (lid / NC) * 4u;  // this lane group's first query
    let qpos = vec4<u32>(start_pos + qi) + vec4<u32>(0u, 1u, 2u, 3u);
    let row0 = sq.z + qi;
    let last = sq.z + nq - 1u;
    let scale = attn_scale();
    let g0 = hb * HB;
    let h0 = kvh * GROUP + g0;  // head slot j: query head h0 + j (clamped; slots past GROUP not written)
    var s0 = quad_new(row0, last, min(h0, kvh * GROUP + GROUP - 1u), c, scale);
#ifdef H1
    var s1 = quad_new(row0, last, min(h0 + 1u, kvh * GROUP + GROUP - 1u), c, scale);
#endif
#ifdef H2
    var s2 = quad_new(row0, last, min(h0 + 2u, kvh * GROUP + GROUP - 1u), c, scale);
#endif
#ifdef H3
    var s3 = quad_new(row0, last, min(h0 + 3u, kvh * GROUP + GROUP - 1u), c, scale);
#endif
    let n_blocks = (kv_end + BLOCK_SIZE - 1u) / BLOCK_SIZE;
    // uniform start: the block of the first key the workgroup's first query sees
    for (var b = window_lo(start_pos + wq0) / BLOCK_SIZE; b < n_blocks; b++) {
        let blk = block_tables[sq.y + b];  // one table load per block, not per position
        let n_slots = min(BLOCK_SIZE, kv_end - b * BLOCK_SIZE);
        for (var slot = 0u; slot < n_slots; slot++) {
            let pos = b * BLOCK_SIZE + slot;
            let base = ((blk * BLOCK_SIZE + slot) * N_KV_HEADS + kvh) * HD4;
            let k = load_k(base, c);
            let v = load_v(base, c);
#ifdef WINDOW
            let live = (vec4<u32>(pos) <= qpos) & (vec4<u32>(pos + WINDOW) > qpos);
#else
            let live = vec4<u32>(pos) <= qpos;
#endif
            var d = mat4x4<f32>();  // column j: this lane's part of head slot j's 4 scores
            d[0] = quad_dot(s0, k);
#ifdef H1
            d[1] = quad_dot(s1, k);
#endif
#ifdef H2
            d[2] = quad_dot(s2, k);
#endif
#ifdef H3
            d[3] = quad_dot(s3, k);
#endif
            d = lane_sum_heads(d, lid);
#ifdef SOFTCAP
            d = mat4x4<f32>(cap_scores(d[0]), cap_scores(d[1]), cap_scores(d[2]), cap_scores(d[3]));
#endif
            quad_add(&s0, d[0], live, v);
#ifdef H1
            quad_add(&s1, d[1], live, v);
#endif
#ifdef H2
            quad_add(&s2, d[2], live, v);
#endif
#ifdef H3
            quad_add(&s3, d[3], live, v);
#endif
        }
    }
    if (qi >= nq) {
        return;
    }
    let n = min(4u, nq - qi);
    quad_write(s0, row0, n, h0, c);
#ifdef H1
    if (g0 + 1u < GROUP) { quad_write(s1, row0, n, h0 + 1u, c); }
#endif
#ifdef H2
    if (g0 + 2u < GROUP) { quad_write(s2, row0, n, h0 + 2u, c); }
#endif
#ifdef H3
    if (g0 + 3u < GROUP) { quad_write(s3, row0, n, h0 + 3u, c); }
#endif
}
#endif
