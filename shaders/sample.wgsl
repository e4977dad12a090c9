// Token sampling on the GPU, so that only token ids come back to the host. One workgroup per row; for a big
// vocabulary a scan dispatch first takes each 4096-logit chunk's argmax in a workgroup of its own (SCAN, below).
//
// Per-row controls, applied first (rows without them read the logits as they are and pay nothing):
//   l_i -> l_i / rep (l_i > 0) or l_i * rep (l_i <= 0)  if token i occurred (prompt or output): repetition penalty
//   l_i -> l_i - freq * n_i - pres * [n_i > 0]          n_i = times token i was sampled (OpenAI's penalties)
//   l_i -> l_i + bias_i                                 sparse logit_bias entries (distinct ids)
//   l_i -> -inf where bit i of the row's token mask is 0 (structured output; the grammar engine's words)
// into this row's slice of the scratch buffer, and then min_p (keep p_i >= min_p * p_max after temperature) as a
// logit threshold. Token counts live on the GPU (a u32 per token per sequence slot: bit 31 = in the prompt, low bits
// = times sampled) and the kernel adds the sampled id itself. With logprobs requested, the row also gets the
// log-softmax (no temperature) of the processed logits at the sampled id (or a given score id) with its rank in the
// vocabulary, and the top-n (<= 20) ids and values.
// For a row with parameters (logit_row, top_k, seed, index, temperature, top_p) over logits l[0..VOCAB):
//   greedy (temperature <= 0 or top_k == 1): the argmax, the lowest id among equal maxima.
//   otherwise, with e_i = exp((l_i - max) / temperature):
//     1. top-k (0 < top_k < VOCAB): keep the top_k tokens in order (logit descending, id ascending): every token
//        above the k-th largest logit, then the lowest ids among those equal to it;
//     2. top-p (top_p < 1): in the same order, keep the shortest prefix of the kept tokens whose mass sum(e)
//        reaches top_p * (mass of the kept tokens) (at least one token);
//     3. r = u * (mass of the kept tokens), u = uniform(seed, index) in [0, 1) (see rng below); the answer is the
//        smallest kept id j with sum(e_i, kept, i <= j) > r (inverse CDF in id order).
//   This is exactly webinfer_packager.reference.Sampler's distribution, in f32.
// Thresholds are found by a 16-way search instead of sorting: over the 32 bits of an order-preserving u32 key of
// the logit (the k-th largest value; the value where the top-p mass is reached), then over the id bits (which of
// the tied tokens are kept; where the CDF crosses r), 4 bits per pass: each pass reads the elements once and
// evaluates 16 candidate thresholds at once (4 vec4 accumulators). Every pass ends in a fixed-order workgroup
// reduction, so a row's answer never depends on the other rows (batch invariance) and is deterministic.
//
// Those ~30 passes do not run over the vocabulary but over a short candidate list: one pass builds a histogram
// of the logits in buckets of 1/BSCALE nat below the max (after temperature), which bounds where the top-k /
// top-p thresholds can lie (bucket counts are exact; bucket masses are summed in fixed point rounded down, a
// lower bound); every token in a bucket at or above the cut-off bucket is copied, in id order, to this row's
// slice of the candidate buffer (a count pass, a prefix sum, a write pass). The kept set is a subset of the
// candidates, and the passes only compare keys and ids and sum kept masses, so the answer is the one the full
// search gives. Temperature alone keeps every token: there one pass of per-lane range sums finds r (sample_plain),
// or, for a big vocabulary, the scan's per-chunk masses do (sample_chunks).
// Measured on lavapipe (vocab 49152): full-vocabulary passes cost the same per element whatever they compute
// (every load is a per-lane loop there), so cutting their number from ~30 to 4 (2 without top-k/top-p) is what
// matters.

#define WG 64
// NB histogram buckets of 1/BSCALE nat; the last one collects everything further than (NB - 1) / BSCALE nats
#define NB 256
#define BSCALE 8.0

struct RowParams {
    logit_row: u32,
    top_k: u32,        // 0 = off
    seed: u32,
    index: u32,        // sample counter of the request: (seed, index) -> one uniform draw
    temperature: f32,  // <= 0: greedy
    top_p: f32,        // >= 1: off
    mask_off: u32,     // word offset of the token mask in aux (VOCAB/32 words, rounded up); NONE: no mask
    bias_off: u32,     // word offset of bias_n (id, f32 bits) pairs in aux
    bias_n: u32,
    counts_slot: u32,  // which sequence's token counts; NONE: no counts
    freq: f32,         // frequency penalty
    pres: f32,         // presence penalty
    rep: f32,          // repetition penalty (1 = off)
    min_p: f32,        // 0 = off
    n_logprobs: u32,   // NONE: no logprobs; else the sampled token's logprob and the top n_logprobs (<= 20)
    score_id: u32,     // < VOCAB: the logprob reported is this id's, not the sampled one's (prompt logprobs)
}

const NONE = 0xffffffffu;
const LPW = 43u;  // logprob words per row: sampled logprob, n, 20 x (id, logprob), the reported id's rank

// per row r, at r * (VOCAB + PV) of the scratch buffer `cand`: candidates [0, n): (id, logit bits), ids ascending;
// then from VOCAB on the processed logits (PV = ceil(VOCAB / 2) entries, two f32 bit patterns each), or, for a
// row without controls under CHUNKS, the scan's (key, id) of each chunk and, for a plain_row, from VOCAB + CHUNKS
// each chunk's mass (f32 bits in .x)
const PV: u32 = (u32(VOCAB) + 1u) / 2u;

var<workgroup> red_u: array<u32, WG>;
var<workgroup> red_i: array<u32, WG>;
var<workgroup> res_u: u32;
var<workgroup> res_i: u32;

// -inf, built at run time: WGSL rejects a constant expression whose value is infinite (Tint: "value -inf cannot be
// represented as 'f32'"), so the bit pattern sits in a private variable and is bitcast when read.
var<private> neg_inf_bits: u32 = 0xff800000u;

fn neg_inf() -> f32 {
    return bitcast<f32>(neg_inf_bits);
}

// Order-preserving map f32 -> u32: a < b  <=>  okey(a) < okey(b) (for non-NaN values).
fn okey(x: f32) -> u32 {
    let b = bitcast<u32>(x);
    return select(b | 0x80000000u, ~b, (b & 0x80000000u) != 0u);
}

// (largest key, lowest id among equal keys) over the workgroup's lanes
fn argmax2(key: u32, id: u32, lid: u32) -> vec2<u32> {
    red_u[lid] = key;
    red_i[lid] = id;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            let k2 = red_u[lid + s];
            let i2 = red_i[lid + s];
            if (k2 > red_u[lid] || (k2 == red_u[lid] && i2 < red_i[lid])) {
                red_u[lid] = k2;
                red_i[lid] = i2;
            }
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        res_u = red_u[0];
        res_i = red_i[0];
    }
    return vec2<u32>(workgroupUniformLoad(&res_u), workgroupUniformLoad(&res_i));
}

fn argmax(key: u32, id: u32, lid: u32) -> u32 {
    return argmax2(key, id, lid).y;
}

fn fkey(k: u32) -> f32 {
    return bitcast<f32>(select(~k, k & 0x7fffffffu, (k & 0x80000000u) != 0u));
}

// A row sampled with a temperature alone and no controls: every id kept, the logits read as they are. Under CHUNKS
// the scan sums its masses per chunk and the sampler draws from those sums (sample_chunks).
fn plain_row(p: RowParams) -> bool {
    return p.temperature > 0.0 && p.top_k != 1u && !(p.top_k > 0u && p.top_k < VOCAB) && p.top_p >= 1.0
        && !(p.min_p > 0.0) && p.mask_off == NONE && p.bias_n == 0u
        && !(p.counts_slot != NONE && (p.freq != 0.0 || p.pres != 0.0 || p.rep != 1.0));
}

#ifdef CHUNKS
// id i's mass relative to its chunk's max m (the logit NaN as -inf, as the scan reads it): the one expression the
// scan's sums and the sampler's walk inside a chunk both take, so that they meet bit for bit
fn chunk_term(lb: u32, i: u32, m: f32, inv_t: f32) -> f32 {
    let v = logits[lb + i];
    return exp((select(neg_inf(), v, v >= neg_inf()) - m) * inv_t);
}

// Lane j's range of chunk c (CHUNK / WG contiguous ids) and its mass relative to the chunk's max m, summed in id
// order: the scan and the sampler both compute it so, bit for bit, so that the sampler's walk inside a chunk meets
// the scan's sum at the chunk's end.
fn range_mass(lb: u32, c: u32, j: u32, m: f32, inv_t: f32) -> f32 {
    let span = CHUNK / WG;
    let end = min((c + 1u) * CHUNK, VOCAB);
    var s = 0.0;
    for (var i = min(c * CHUNK + j * span, end); i < min(c * CHUNK + (j + 1u) * span, end); i++) {
        s += chunk_term(lb, i, m, inv_t);
    }
    return s;
}
#endif

#ifdef SCAN
// The scan (a separate dispatch before the sampler, for big vocabularies: kernels/sampling.py SCAN_MIN_VOCAB):
// workgroup (c, row) takes the argmax of the row's raw logits [c * CHUNK, (c + 1) * CHUNK) (NaN as -inf, as the
// sampler reads them) and writes its (key, lowest id) at cand[row * (VOCAB + PV) + VOCAB + c]. The sampler then
// reduces CHUNKS pairs instead of VOCAB logits: the same argmax (the largest key, the lowest id among equal keys,
// whatever the grouping), computed by CHUNKS workgroups instead of one. For a row sampled with a temperature alone
// (plain_row) the workgroup also sums its chunk's masses relative to the chunk's max (range_mass, lanes' ranges
// in lane order) for sample_chunks.
@group(0) @binding(0) var<storage, read> logits: array<f32>;
@group(0) @binding(1) var<storage, read> params: array<RowParams>;
@group(0) @binding(2) var<storage, read_write> cand: array<vec2<u32>>;

var<workgroup> part: array<f32, WG>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let lb = params[wid.y].logit_row * VOCAB;
    let i1 = min((wid.x + 1u) * CHUNK, VOCAB);
    var bk = 0u;
    var bi = NONE;
    for (var i = wid.x * CHUNK + lid; i < i1; i += WG) {
        let v = logits[lb + i];
        let k = okey(select(neg_inf(), v, v >= neg_inf()));
        if (k > bk || bi == NONE) { bk = k; bi = i; }  // ids ascend within an invocation: first wins ties
    }
    let best = argmax2(bk, bi, lid);
    let base = wid.y * (VOCAB + PV) + VOCAB;
    if (lid == 0u) {
        cand[base + wid.x] = best;
    }
    // a temperature alone: the chunk's mass relative to its max, the lanes' range masses added in lane order
    let p = params[wid.y];
    if (plain_row(p)) {
        let m = fkey(best.x);
        part[lid] = select(range_mass(lb, wid.x, lid, m, 1.0 / p.temperature), 0.0, m == neg_inf());
        workgroupBarrier();
        if (lid == 0u) {
            var s = 0.0;
            for (var j = 0u; j < WG; j++) { s += part[j]; }
            cand[base + CHUNKS + wid.x] = vec2<u32>(bitcast<u32>(s), 0u);
        }
    }
}
#else
@group(0) @binding(0) var<storage, read> logits: array<f32>;
@group(0) @binding(1) var<storage, read> params: array<RowParams>;
@group(0) @binding(2) var<storage, read_write> out_ids: array<u32>;
@group(0) @binding(3) var<storage, read_write> cand: array<vec2<u32>>;
@group(0) @binding(4) var<storage, read> aux: array<u32>;                // token masks and logit_bias entries
@group(0) @binding(5) var<storage, read_write> counts: array<u32>;       // [slot * VOCAB + id]
@group(0) @binding(6) var<storage, read_write> logprobs: array<u32>;     // [row * LPW + ...]

var<workgroup> red_f: array<f32, WG>;
var<workgroup> res_f: f32;
var<workgroup> red4: array<vec4<f32>, 4 * WG>;
var<workgroup> res4: array<vec4<f32>, 4>;
var<workgroup> hist: array<atomic<u32>, NB>;
var<workgroup> hmass: array<atomic<u32>, NB>;
var<workgroup> lane_n: array<u32, WG>;

var<private> lbase: u32 = 0u;  // this row's logits
var<private> cbase: u32 = 0u;  // this row's candidate slice
var<private> pbase: u32 = 0u;  // this row's processed logits (in cand)
var<private> n_elems: u32 = 0u;  // candidates in it
var<private> use_proc: bool = false;  // read the processed logits instead of the input row
var<private> thr: f32 = 0.0;  // min_p: logits below thr count as -inf (set in main)


// logit i of this row as sampling sees it: the controls applied, then the min_p threshold
fn lg(i: u32) -> f32 {
    var v: f32;
    if (use_proc) {
        v = bitcast<f32>(cand[pbase + (i >> 1u)][i & 1u]);
    } else {
        v = logits[lbase + i];
    }
    return select(neg_inf(), v, v >= thr);
}

// candidate j of this row: (id, logit bits)
fn elem(j: u32) -> vec2<u32> {
    return cand[cbase + j];
}

// PCG hash (O'Neill's RXS-M-XS output on one LCG step): a bijection on u32.
fn pcg(v: u32) -> u32 {
    let s = v * 747796405u + 2891336453u;
    let w = ((s >> ((s >> 28u) + 4u)) ^ s) * 277803737u;
    return (w >> 22u) ^ w;
}

// u = (pcg(pcg(seed) + index) >> 8) / 2^24, in [0, 1); mirrored by webinfer.kernels.sampling.uniform.
fn uniform01(seed: u32, index: u32) -> f32 {
    return f32(pcg(pcg(seed) + index) >> 8u) * (1.0 / 16777216.0);
}

fn sum_f(v: f32, lid: u32) -> f32 {
    red_f[lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) { red_f[lid] += red_f[lid + s]; }
        workgroupBarrier();
    }
    if (lid == 0u) { res_f = red_f[0]; }
    return workgroupUniformLoad(&res_f);
}

fn max_u(v: u32, lid: u32) -> u32 {
    red_u[lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) { red_u[lid] = max(red_u[lid], red_u[lid + s]); }
        workgroupBarrier();
    }
    if (lid == 0u) { res_u = red_u[0]; }
    return workgroupUniformLoad(&res_u);
}

// the kept set: key > t1, or key == t1 with id <= c1 (top-k); and the same with (t2, c2) (top-p)
var<private> t1: u32 = 0u;
var<private> c1: u32 = 0xffffffffu;
var<private> t2: u32 = 0u;
var<private> c2: u32 = 0xffffffffu;

fn kept(key: u32, i: u32) -> bool {
    return (key > t1 || (key == t1 && i <= c1)) && (key > t2 || (key == t2 && i <= c2));
}

// the 16 totals of a pass, summed over the workgroup in a fixed order (one tree for all four vectors)
fn sum16(a0: vec4<f32>, a1: vec4<f32>, a2: vec4<f32>, a3: vec4<f32>, lid: u32) -> Totals {
    red4[lid] = a0;
    red4[WG + lid] = a1;
    red4[2u * WG + lid] = a2;
    red4[3u * WG + lid] = a3;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            red4[lid] += red4[lid + s];
            red4[WG + lid] += red4[WG + lid + s];
            red4[2u * WG + lid] += red4[2u * WG + lid + s];
            red4[3u * WG + lid] += red4[3u * WG + lid + s];
        }
        workgroupBarrier();
    }
    if (lid < 4u) { res4[lid] = red4[lid * WG]; }
    let t = workgroupUniformLoad(&res4);  // (uniform for Tint's analysis: the thresholds steer barriers later)
    return Totals(t[0], t[1], t[2], t[3]);
}

// the 16 candidate digits of a pass, as offsets b = 0..15 in 4 vectors
struct Totals { a: vec4<f32>, b: vec4<f32>, c: vec4<f32>, d: vec4<f32> }

const B0 = vec4<u32>(0u, 1u, 2u, 3u);
const B1 = vec4<u32>(4u, 5u, 6u, 7u);
const B2 = vec4<u32>(8u, 9u, 10u, 11u);
const B3 = vec4<u32>(12u, 13u, 14u, 15u);

const BY_KEY_COUNT = 0u;   // weight 1, candidate compares key >= c           (top-k value)
const BY_ID_TIES = 1u;     // weight [key == tie] (kept), compares id < c      (which ties; top-k and top-p)
const BY_KEY_MASS = 2u;    // weight e if kept, compares key >= c              (top-p value)
const BY_ID_MASS = 3u;     // weight e if kept, compares id < c                (inverse CDF)

// Element j's weight, added to the totals of the candidates it satisfies (a step of pass16).
fn add16(a: Totals, j: u32, mode: u32, c0: vec4<u32>, c1: vec4<u32>, c2: vec4<u32>, c3: vec4<u32>, mx: f32,
         inv_t: f32, tie: u32, ties_kept: bool) -> Totals {
    let e = elem(j);
    let i = e.x;
    let l = bitcast<f32>(e.y);
    let k = okey(l);
    var w = 1.0;
    var x = vec4<u32>(k);
    if (mode == BY_ID_TIES) {
        w = select(0.0, 1.0, k == tie && (!ties_kept || kept(k, i)));
    } else if (mode != BY_KEY_COUNT) {
        w = select(0.0, exp((l - mx) * inv_t), kept(k, i));
    }
    let wv = vec4<f32>(w);
    let zero = vec4<f32>(0.0);
    if (mode == BY_KEY_COUNT || mode == BY_KEY_MASS) {
        return Totals(a.a + select(zero, wv, x >= c0), a.b + select(zero, wv, x >= c1),
                      a.c + select(zero, wv, x >= c2), a.d + select(zero, wv, x >= c3));
    }
    x = vec4<u32>(i);
    return Totals(a.a + select(zero, wv, x < c0), a.b + select(zero, wv, x < c1),
                  a.c + select(zero, wv, x < c2), a.d + select(zero, wv, x < c3));
}

// One pass over the row: for the 16 candidates c_b = prefix | (b << shift), the total weight of the elements
// that satisfy the mode's comparison. `tie` is the key whose ties BY_ID_TIES counts; ties_kept: only kept ones.
// A lane visits its elements j, j + WG, j + 2 WG, ... four per loop iteration (the candidate loops below do the
// same): llvmpipe ends a shader's loops after 65 535 iterations in all, per invocation (measured: two loops of
// 40 000 ran 40 000 and 25 534 times), and ~21 passes over a long candidate list (Gemma 3's 262k vocabulary at a
// high temperature) went past it at one element per iteration and sampled garbage.
fn pass16(mode: u32, lid: u32, prefix: u32, shift: u32, mx: f32, inv_t: f32, tie: u32,
          ties_kept: bool) -> Totals {
    let sh = vec4<u32>(shift);
    let c0 = vec4<u32>(prefix) | (B0 << sh);
    let c1 = vec4<u32>(prefix) | (B1 << sh);
    let c2 = vec4<u32>(prefix) | (B2 << sh);
    let c3 = vec4<u32>(prefix) | (B3 << sh);
    let zero = vec4<f32>(0.0);
    var a = Totals(zero, zero, zero, zero);
    for (var j = lid; j < n_elems; j += 4u * WG) {
        a = add16(a, j, mode, c0, c1, c2, c3, mx, inv_t, tie, ties_kept);
        if (j + WG < n_elems) { a = add16(a, j + WG, mode, c0, c1, c2, c3, mx, inv_t, tie, ties_kept); }
        if (j + 2u * WG < n_elems) { a = add16(a, j + 2u * WG, mode, c0, c1, c2, c3, mx, inv_t, tie, ties_kept); }
        if (j + 3u * WG < n_elems) { a = add16(a, j + 3u * WG, mode, c0, c1, c2, c3, mx, inv_t, tie, ties_kept); }
    }
    return sum16(a.a, a.b, a.c, a.d, lid);
}

// candidate j's mass if it is kept, else 0 (adding 0.0 leaves a sum's bits as they are)
fn kept_term(j: u32, mx: f32, inv_t: f32) -> f32 {
    let e = elem(j);
    let l = bitcast<f32>(e.y);
    return select(0.0, exp((l - mx) * inv_t), kept(okey(l), e.x));
}

// this lane's sum of the kept candidates' masses, in the order j, j + WG, ... (as pass16 visits them)
fn kept_mass(lid: u32, mx: f32, inv_t: f32) -> f32 {
    var m = 0.0;
    for (var j = lid; j < n_elems; j += 4u * WG) {
        m += kept_term(j, mx, inv_t);
        if (j + WG < n_elems) { m += kept_term(j + WG, mx, inv_t); }
        if (j + 2u * WG < n_elems) { m += kept_term(j + 2u * WG, mx, inv_t); }
        if (j + 3u * WG < n_elems) { m += kept_term(j + 3u * WG, mx, inv_t); }
    }
    return m;
}

// the largest kept id among this lane's candidates (0 if none)
fn kept_last(j: u32) -> u32 {
    let e = elem(j);
    return select(0u, e.x, kept(okey(bitcast<f32>(e.y)), e.x));
}

const GE = 0u;  // candidate satisfies total >= goal
const LT = 1u;  // total < goal
const LE = 2u;  // total <= goal

// How many of the 16 candidates satisfy the comparison; the totals are monotone in b and candidate 0 (the current
// prefix) always satisfies, so the last satisfying digit is that count - 1.
fn digit(t: Totals, goal: f32, cmp: u32) -> u32 {
    let g = vec4<f32>(goal);
    let one = vec4<f32>(1.0);
    let z = vec4<f32>(0.0);
    var n: f32;
    if (cmp == GE) {
        n = dot(select(z, one, t.a >= g), one) + dot(select(z, one, t.b >= g), one)
          + dot(select(z, one, t.c >= g), one) + dot(select(z, one, t.d >= g), one);
    } else if (cmp == LT) {
        n = dot(select(z, one, t.a < g), one) + dot(select(z, one, t.b < g), one)
          + dot(select(z, one, t.c < g), one) + dot(select(z, one, t.d < g), one);
    } else {
        n = dot(select(z, one, t.a <= g), one) + dot(select(z, one, t.b <= g), one)
          + dot(select(z, one, t.c <= g), one) + dot(select(z, one, t.d <= g), one);
    }
    return max(u32(n), 1u) - 1u;
}

fn affine(t: Totals, add: f32, mul: f32) -> Totals {
    return Totals(add + mul * t.a, add + mul * t.b, add + mul * t.c, add + mul * t.d);
}

// histogram bucket of a logit: (max - l) / temperature in 1/BSCALE nat steps; non-decreasing as l falls
fn bucket(l: f32, mx: f32, inv_t: f32) -> u32 {
    return u32(clamp((mx - l) * inv_t * BSCALE, 0.0, f32(NB - 1u)));
}

// Copy every token whose bucket is at or above the cut-off to the candidate list and make the passes walk it.
// The cut-off bucket: with top-k, the first whose cumulative count reaches top_k (the k-th largest logit lies in
// it, so every token top-k keeps is at or above it); with top-p alone, the first whose cumulative mass reaches
// top_p times the total mass, by a lower bound of each bucket's mass (so the top-p prefix lies at or above that
// bucket; the 1e-5 margin covers f32 summation order). A bucket sums its tokens' masses relative to the bucket's
// top, e * exp(b / BSCALE) in (0.88, 1], in fixed point with MASS_SHIFT fraction bits (rounded down), and the cut
// search scales the sum back by exp(-b / BSCALE) less 0.01 % (4x what the f32 exps and sums can err the wrong
// way, at WGSL's exp accuracy of 3 + 2|x| ULP for |x| <= 32): every token keeps
// ~13+ significant bits however far below the max it lies. Summing e itself in fixed point (as before) counted
// every token under 2^-MASS_SHIFT as 0: Gemma 3's 262k vocabulary (13 fraction bits) at T 0.7, top-p 0.95 then
// never reached the goal and copied the whole vocabulary as candidates, 30 ms of sampling a token on lavapipe.
// Returns the whole row's mass when top-k is off (else 0): the candidates hold only the top-p prefix and a bit
// more. (A return value, not a private variable, so that Tint's uniformity analysis sees it is uniform.)
fn compact_candidates(lid: u32, mx: f32, inv_t: f32, top_k: u32, use_k: bool, top_p: f32) -> f32 {
    for (var b = lid; b < NB; b += WG) {
        atomicStore(&hist[b], 0u);
        atomicStore(&hmass[b], 0u);
    }
    workgroupBarrier();
    let scale = f32(1u << MASS_SHIFT);
    var m = 0.0;
    for (var i = lid; i < VOCAB; i += WG) {
        let l = lg(i);
        let b = bucket(l, mx, inv_t);
        if (b < NB - 1u) {  // the last bucket is the rest: never counted
            atomicAdd(&hist[b], 1u);
            if (!use_k) {
                let e = exp((l - mx) * inv_t);
                m += e;
                atomicAdd(&hmass[b], u32(min(e * exp(f32(b) / BSCALE), 1.0) * scale));
            }
        } else if (!use_k) {
            m += exp((l - mx) * inv_t);
        }
    }
    let vocab_mass = sum_f(m, lid);
    let goal = top_p * vocab_mass * (1.0 + 1e-5) * scale;
    if (lid == 0u) {
        var cut = NB - 1u;
        var cnt = 0u;
        var lo = 0.0;
        for (var b = 0u; b < NB - 1u; b++) {
            cnt += atomicLoad(&hist[b]);
            lo += f32(atomicLoad(&hmass[b])) * (0.9999 * exp(-f32(b) / BSCALE));
            if ((use_k && cnt >= top_k) || (!use_k && lo >= goal)) {
                cut = b;
                break;
            }
        }
        res_u = cut;
    }
    let cut = workgroupUniformLoad(&res_u);
    // deterministic order: lane j copies its contiguous id range to offset (candidates of lanes < j)
    let span = (VOCAB + WG - 1u) / WG;
    let r0 = min(lid * span, VOCAB);
    let r1 = min(r0 + span, VOCAB);
    var c = 0u;
    for (var i = r0; i < r1; i++) {
        if (bucket(lg(i), mx, inv_t) <= cut) { c++; }
    }
    lane_n[lid] = c;
    workgroupBarrier();
    if (lid == 0u) {
        var total = 0u;
        for (var j = 0u; j < WG; j++) {
            let n = lane_n[j];
            lane_n[j] = total;
            total += n;
        }
        res_u = total;
    }
    let total = workgroupUniformLoad(&res_u);
    var o = cbase + lane_n[lid];
    for (var i = r0; i < r1; i++) {
        let l = lg(i);
        if (bucket(l, mx, inv_t) <= cut) {
            cand[o] = vec2<u32>(i, bitcast<u32>(l));
            o++;
        }
    }
    storageBarrier();
    workgroupBarrier();
    n_elems = total;
    return vocab_mass;
}

// Temperature alone (every token kept): the inverse CDF in id order without the 16-way passes. Each lane sums
// its contiguous id range; lane 0 finds the range where the running total passes r = u * mass and walks it,
// re-adding that range's terms in the order the lane summed them, so the crossing found there is consistent
// with the range totals. Two passes over the row (after the max) instead of six.
fn sample_plain(lid: u32, mx: f32, inv_t: f32, u: f32) -> u32 {
    let span = (VOCAB + WG - 1u) / WG;
    let r0 = min(lid * span, VOCAB);
    let r1 = min(r0 + span, VOCAB);
    var m = 0.0;
    for (var i = r0; i < r1; i++) { m += exp((lg(i) - mx) * inv_t); }
    red_f[lid] = m;
    workgroupBarrier();
    if (lid == 0u) {
        var total = 0.0;
        for (var j = 0u; j < WG; j++) { total += red_f[j]; }
        let r = u * total;
        var before = 0.0;
        var j = 0u;
        for (; j < WG; j++) {
            if (before + red_f[j] > r) { break; }
            before += red_f[j];
        }
        var id = VOCAB - 1u;  // r within rounding of the total: the last id, as the search path does
        if (j < WG) {
            let a0 = min(j * span, VOCAB);
            let a1 = min(a0 + span, VOCAB);
            var part = 0.0;
            for (var i = a0; i < a1; i++) {
                part += exp((lg(i) - mx) * inv_t);
                if (before + part > r) {
                    id = i;
                    break;
                }
            }
        }
        res_u = id;
    }
    return workgroupUniformLoad(&res_u);
}

#ifdef CHUNKS
var<workgroup> chunk_w: array<f32, CHUNKS>;
var<workgroup> chunk_s: array<f32, CHUNKS>;

// Temperature alone under CHUNKS (plain_row): the scan left each chunk's mass S_c relative to its max m_c. Chunk c
// weighs w_c = exp((m_c - mx) / T) * S_c; lane 0 finds the chunk where the running total of the w_c passes r = u *
// total, the lanes recompute that chunk's range masses as the scan summed them, and lane 0 walks them, then the
// range, comparing before + exp((m_c - mx) / T) * (running sum) with r: at the chunk's end that is before + w_c
// exactly, so the crossing found is consistent with the totals. ~3 x 64 steps in one lane instead of sample_plain's
// two passes of VOCAB / WG per lane (4,096 for Gemma 3's vocabulary) and its walk of one lane's range (as many).
fn sample_chunks(lid: u32, mx: f32, inv_t: f32, u: f32) -> u32 {
    for (var c = lid; c < CHUNKS; c += WG) {
        let s = bitcast<f32>(cand[pbase + CHUNKS + c].x);
        let scale = exp((fkey(cand[pbase + c].x) - mx) * inv_t);
        chunk_s[c] = scale;
        chunk_w[c] = select(scale * s, 0.0, s == 0.0);
    }
    workgroupBarrier();
    if (lid == 0u) {
        var total = 0.0;
        for (var c = 0u; c < CHUNKS; c++) { total += chunk_w[c]; }
        let r = u * total;
        var before = 0.0;
        var c = 0u;
        for (; c < CHUNKS; c++) {
            if (before + chunk_w[c] > r) { break; }
            before += chunk_w[c];
        }
        res_u = c;
        res_f = before;
        red_f[0] = r;
    }
    let c = workgroupUniformLoad(&res_u);
    if (c == CHUNKS) {
        return VOCAB - 1u;  // r within rounding of the total: the last id, as the other paths do
    }
    let m = fkey(cand[pbase + c].x);
    lane_n[lid] = bitcast<u32>(range_mass(lbase, c, lid, m, inv_t));
    workgroupBarrier();
    if (lid == 0u) {
        let before = res_f;
        let r = red_f[0];
        let scale = chunk_s[c];
        let span = CHUNK / WG;
        let end = min((c + 1u) * CHUNK, VOCAB);
        var id = end - 1u;  // (no crossing: rounding; the chunk's last id)
        var run = 0.0;
        var j = 0u;
        for (; j < WG; j++) {
            let pj = bitcast<f32>(lane_n[j]);
            if (before + scale * (run + pj) > r) { break; }
            run += pj;
        }
        if (j < WG) {  // range j's terms re-added from 0 in range_mass's order: at its end, part is its sum
            let i0 = c * CHUNK + j * span;
            var part = 0.0;
            for (var i = i0; i < min(i0 + span, end); i++) {
                part += chunk_term(lbase, i, m, inv_t);
                if (before + scale * (run + part) > r) {
                    id = i;
                    break;
                }
            }
        }
        res_u = id;
    }
    return workgroupUniformLoad(&res_u);
}
#endif

// The controls of the header: penalties and the mask in one pass over the row, then the sparse bias entries.
fn process(p: RowParams, lid: u32) {
    let penal = p.counts_slot != NONE && (p.freq != 0.0 || p.pres != 0.0 || p.rep != 1.0);
    for (var i = lid; i < VOCAB; i += WG) {
        var v = logits[lbase + i];
        if (penal) {
            let c = counts[p.counts_slot * VOCAB + i];
            let n = f32(c & 0x7fffffffu);
            if (c != 0u) {
                v = select(v * p.rep, v / p.rep, v > 0.0);
            }
            v -= n * p.freq + select(0.0, p.pres, n > 0.0);
        }
        if (p.mask_off != NONE && ((aux[p.mask_off + (i >> 5u)] >> (i & 31u)) & 1u) == 0u) {
            v = neg_inf();
        }
        cand[pbase + (i >> 1u)][i & 1u] = bitcast<u32>(v);
    }
    storageBarrier();
    workgroupBarrier();
    for (var j = lid; j < p.bias_n; j += WG) {
        let id = aux[p.bias_off + 2u * j];
        if (id < VOCAB) {
            let k = pbase + (id >> 1u);
            let v = bitcast<f32>(cand[k][id & 1u]) + bitcast<f32>(aux[p.bias_off + 2u * j + 1u]);
            cand[k][id & 1u] = bitcast<u32>(v);
        }
    }
    storageBarrier();
    workgroupBarrier();
}

// log-softmax of the processed logits (no temperature, no filters) at the sampled id (or the row's score_id), its
// rank in the whole vocabulary (1 + the ids before it in the order below: vLLM's prompt_logprobs rank), and the top
// n ids and values (logit descending, id ascending): each lane keeps its own top n (ids ascend within a lane, so an
// equal logit never displaces an earlier id), then n rounds of a workgroup argmax over the lanes' heads. The rank is
// counted in f32 (exact below 2^24 ids) to share the workgroup sum.
fn write_logprobs(row: u32, p: RowParams, id: u32, am: u32, lid: u32) {
    thr = neg_inf();
    let mx = lg(am);
    let x = select(id, p.score_id, p.score_id < VOCAB);
    let lx = lg(x);
    var m = 0.0;
    var before = 0.0;
    for (var i = lid; i < VOCAB; i += WG) {
        let v = lg(i);
        m += exp(v - mx);
        before += select(0.0, 1.0, v > lx || (v == lx && i < x));
    }
    let lse = mx + log(sum_f(m, lid));
    let rank = u32(sum_f(before, lid)) + 1u;
    let n = min(min(p.n_logprobs, 20u), VOCAB);
    var tk: array<u32, 20>;
    var ti: array<u32, 20>;
    var cnt = 0u;
    if (n > 0u) {
        for (var i = lid; i < VOCAB; i += WG) {
            let k = okey(lg(i));
            if (cnt < n || k > tk[n - 1u]) {
                var j = min(cnt, n - 1u);
                while (j > 0u && tk[j - 1u] < k) {
                    tk[j] = tk[j - 1u];
                    ti[j] = ti[j - 1u];
                    j--;
                }
                tk[j] = k;
                ti[j] = i;
                cnt = min(cnt + 1u, n);
            }
        }
    }
    let o = row * LPW;
    var head = 0u;
    for (var r = 0u; r < n; r++) {
        var k = 0u;
        var i = 0xffffffffu;
        if (head < cnt) {
            k = tk[head];
            i = ti[head];
        }
        let w = argmax(k, i, lid);
        if (head < cnt && i == w) { head++; }
        if (lid == 0u) {
            logprobs[o + 2u + 2u * r] = w;
            logprobs[o + 3u + 2u * r] = bitcast<u32>(lg(w) - lse);
        }
    }
    if (lid == 0u) {
        logprobs[o] = bitcast<u32>(lx - lse);
        logprobs[o + 1u] = n;
        logprobs[o + 42u] = rank;
    }
}

// the sampled id: out, counted, and its logprobs when asked
fn finish(row: u32, p: RowParams, id: u32, am: u32, lid: u32) {
    if (lid == 0u) {
        out_ids[row] = id;
        if (p.counts_slot != NONE) {
            counts[p.counts_slot * VOCAB + id] += 1u;
        }
    }
    if (p.n_logprobs != NONE) {
        write_logprobs(row, p, id, am, lid);
    }
}

// top shift of the 4-bit digits of an id (ids have ID_BITS bits)
const ID_TOP: u32 = (u32(ID_BITS) + 3u) / 4u * 4u - 4u;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = wid.x;
    let p = params[row];
    lbase = p.logit_row * VOCAB;
    cbase = row * (VOCAB + PV);
    pbase = cbase + VOCAB;
    thr = neg_inf();
    if (p.mask_off != NONE || p.bias_n > 0u
        || (p.counts_slot != NONE && (p.freq != 0.0 || p.pres != 0.0 || p.rep != 1.0))) {
        process(p, lid);
        use_proc = true;
    }

    var bk = 0u;
    var bi = 0xffffffffu;
#ifdef CHUNKS
    if (!use_proc) {  // the scan's (key, id) per chunk; chunks ascend within an invocation: first wins ties
        for (var j = lid; j < CHUNKS; j += WG) {
            let e = cand[pbase + j];
            if (e.x > bk || bi == 0xffffffffu) { bk = e.x; bi = e.y; }
        }
    } else {
#endif
    for (var i = lid; i < VOCAB; i += WG) {
        let k = okey(lg(i));
        if (k > bk || bi == 0xffffffffu) { bk = k; bi = i; }  // ids ascend within an invocation: first wins ties
    }
#ifdef CHUNKS
    }
#endif
    let am = argmax(bk, bi, lid);
    if (p.temperature <= 0.0 || p.top_k == 1u) {
        finish(row, p, am, am, lid);
        return;
    }
    let mx = lg(am);
    let inv_t = 1.0 / p.temperature;
    if (p.min_p > 0.0) {
        thr = mx + log(p.min_p) * p.temperature;  // p_i >= min_p * p_max  <=>  l_i >= max + T ln(min_p)
    }
    let use_k = p.top_k > 0u && p.top_k < VOCAB;
    if (!use_k && p.top_p >= 1.0) {
#ifdef CHUNKS
        if (plain_row(p)) {  // (the scan summed its chunks)
            finish(row, p, sample_chunks(lid, mx, inv_t, uniform01(p.seed, p.index)), am, lid);
            return;
        }
#endif
        finish(row, p, sample_plain(lid, mx, inv_t, uniform01(p.seed, p.index)), am, lid);
        return;
    }
    let vocab_mass = compact_candidates(lid, mx, inv_t, p.top_k, use_k, p.top_p);

    if (use_k) {
        // largest key t with count(key >= t) >= top_k: the k-th largest logit
        let kf = f32(p.top_k);
        var t = 0u;
        for (var sh = 28i; sh >= 0i; sh -= 4i) {
            t |= digit(pass16(BY_KEY_COUNT, lid, t, u32(sh), mx, inv_t, 0u, false), kf, GE) << u32(sh);
        }
        // how many tokens equal to t are needed after those above it
        let above = pass16(BY_KEY_COUNT, lid, t + 1u, 0u, mx, inv_t, 0u, false).a.x;
        let need = kf - select(above, 0.0, t == 0xffffffffu);
        // the id of the need-th token equal to t: largest x with count(key == t, id < x) < need
        var x = 0u;
        for (var sh = i32(ID_TOP); sh >= 0i; sh -= 4i) {
            x |= digit(pass16(BY_ID_TIES, lid, x, u32(sh), mx, inv_t, t, false), need, LT) << u32(sh);
        }
        t1 = t;
        c1 = x;
    }

    // mass of the tokens top-k keeps (all of them without top-k: then the histogram pass has summed it)
    var mass = vocab_mass;
    if (use_k) {
        mass = sum_f(kept_mass(lid, mx, inv_t), lid);
    }

    if (p.top_p < 1.0) {
        let goal = p.top_p * mass;
        // largest key t with mass(kept, key >= t) >= goal
        var t = 0u;
        for (var sh = 28i; sh >= 0i; sh -= 4i) {
            t |= digit(pass16(BY_KEY_MASS, lid, t, u32(sh), mx, inv_t, 0u, false), goal, GE) << u32(sh);
        }
        var mass_gt = 0.0;
        if (t != 0xffffffffu) {
            mass_gt = pass16(BY_KEY_MASS, lid, t + 1u, 0u, mx, inv_t, 0u, false).a.x;
        }
        let e_t = exp((fkey(t) - mx) * inv_t);
        // ties at t, lowest ids first, until the mass reaches the goal: largest x with
        // mass_gt + e_t * count(kept, key == t, id < x) < goal
        var x = 0u;
        for (var sh = i32(ID_TOP); sh >= 0i; sh -= 4i) {
            let n = pass16(BY_ID_TIES, lid, x, u32(sh), mx, inv_t, t, true);
            x |= digit(affine(n, mass_gt, e_t), goal, LT) << u32(sh);
        }
        t2 = t;
        c2 = x;
        mass = sum_f(kept_mass(lid, mx, inv_t), lid);
    }

    // inverse CDF in id order: largest x with sum(kept, id < x) <= r, i.e. not > r; then x is the sampled id
    let r = uniform01(p.seed, p.index) * mass;
    var x = 0u;
    for (var sh = i32(ID_TOP); sh >= 0i; sh -= 4i) {
        x |= digit(pass16(BY_ID_MASS, lid, x, u32(sh), mx, inv_t, 0u, false), r, LE) << u32(sh);
    }
    // rounding can leave x past the last kept id (r within an ulp of the total): take the last kept id then
    var last = 0u;
    for (var j = lid; j < n_elems; j += 4u * WG) {
        last = max(last, kept_last(j));
        if (j + WG < n_elems) { last = max(last, kept_last(j + WG)); }
        if (j + 2u * WG < n_elems) { last = max(last, kept_last(j + 2u * WG)); }
        if (j + 3u * WG < n_elems) { last = max(last, kept_last(j + 3u * WG)); }
    }
    let last_kept = max_u(last, lid);
    finish(row, p, min(x, last_kept), am, lid);
}
#endif
