// Token sampling on the GPU, so that only token ids come back to the host. One workgroup per row.
//
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
// Thresholds are found by bisection instead of sorting: over the 32 bits of an order-preserving u32 key of the
// logit (the k-th largest value; the value where the top-p mass is reached), then over the id bits (which of the
// tied tokens are kept; where the CDF crosses r). Every step is one pass over the row with a fixed-order workgroup
// reduction, so a row's answer never depends on the other rows (batch invariance) and is deterministic.

#define WG 256

struct RowParams {
    logit_row: u32,
    top_k: u32,        // 0 = off
    seed: u32,
    index: u32,        // sample counter of the request: (seed, index) -> one uniform draw
    temperature: f32,  // <= 0: greedy
    top_p: f32,        // >= 1: off
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<storage, read> logits: array<f32>;
@group(0) @binding(1) var<storage, read> params: array<RowParams>;
@group(0) @binding(2) var<storage, read_write> out_ids: array<u32>;

var<workgroup> red_f: array<f32, WG>;
var<workgroup> red_u: array<u32, WG>;
var<workgroup> red_i: array<u32, WG>;
var<workgroup> res_f: f32;
var<workgroup> res_u: u32;
var<workgroup> res_i: u32;

// Order-preserving map f32 -> u32: a < b  <=>  okey(a) < okey(b) (for non-NaN values).
fn okey(x: f32) -> u32 {
    let b = bitcast<u32>(x);
    return select(b | 0x80000000u, ~b, (b & 0x80000000u) != 0u);
}

fn fkey(k: u32) -> f32 {
    return bitcast<f32>(select(~k, k & 0x7fffffffu, (k & 0x80000000u) != 0u));
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

fn sum_u(v: u32, lid: u32) -> u32 {
    red_u[lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) { red_u[lid] += red_u[lid + s]; }
        workgroupBarrier();
    }
    if (lid == 0u) { res_u = red_u[0]; }
    return workgroupUniformLoad(&res_u);
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

// (largest key, lowest id among equal keys) of the row
fn argmax(key: u32, id: u32, lid: u32) -> u32 {
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
    if (lid == 0u) { res_i = red_i[0]; }
    return workgroupUniformLoad(&res_i);
}

// the kept set: key > t1, or key == t1 with id <= c1 (top-k); and the same with (t2, c2) (top-p)
var<private> t1: u32 = 0u;
var<private> c1: u32 = 0xffffffffu;
var<private> t2: u32 = 0u;
var<private> c2: u32 = 0xffffffffu;

fn kept(key: u32, i: u32) -> bool {
    return (key > t1 || (key == t1 && i <= c1)) && (key > t2 || (key == t2 && i <= c2));
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = wid.x;
    let p = params[row];
    let base = p.logit_row * VOCAB;

    var bk = 0u;
    var bi = 0xffffffffu;
    for (var i = lid; i < VOCAB; i += WG) {
        let k = okey(logits[base + i]);
        if (k > bk || bi == 0xffffffffu) { bk = k; bi = i; }  // ids ascend within an invocation: first wins ties
    }
    let am = argmax(bk, bi, lid);
    if (p.temperature <= 0.0 || p.top_k == 1u) {
        if (lid == 0u) { out_ids[row] = am; }
        return;
    }
    let mx = logits[base + am];
    let inv_t = 1.0 / p.temperature;

    if (p.top_k > 0u && p.top_k < VOCAB) {
        // largest key t with count(key >= t) >= top_k: the k-th largest logit
        var t = 0u;
        for (var bit = 31i; bit >= 0i; bit--) {
            let cand = t | (1u << u32(bit));
            var n = 0u;
            for (var i = lid; i < VOCAB; i += WG) { n += u32(okey(logits[base + i]) >= cand); }
            if (sum_u(n, lid) >= p.top_k) { t = cand; }
        }
        var n_gt = 0u;
        for (var i = lid; i < VOCAB; i += WG) { n_gt += u32(okey(logits[base + i]) > t); }
        let need = p.top_k - sum_u(n_gt, lid);
        // the id of the need-th token equal to t: largest x with count(key == t, id < x) < need
        var x = 0u;
        for (var bit = ID_BITS - 1i; bit >= 0i; bit--) {
            let cand = x | (1u << u32(bit));
            var n = 0u;
            for (var i = lid; i < min(cand, VOCAB); i += WG) { n += u32(okey(logits[base + i]) == t); }
            if (sum_u(n, lid) < need) { x = cand; }
        }
        t1 = t;
        c1 = x;
    }

    var m = 0.0;
    for (var i = lid; i < VOCAB; i += WG) {
        let l = logits[base + i];
        if (kept(okey(l), i)) { m += exp((l - mx) * inv_t); }
    }
    var mass = sum_f(m, lid);

    if (p.top_p < 1.0) {
        let goal = p.top_p * mass;
        // largest key t with mass(kept, key >= t) >= goal
        var t = 0u;
        for (var bit = 31i; bit >= 0i; bit--) {
            let cand = t | (1u << u32(bit));
            var s = 0.0;
            for (var i = lid; i < VOCAB; i += WG) {
                let l = logits[base + i];
                let k = okey(l);
                if (k >= cand && kept(k, i)) { s += exp((l - mx) * inv_t); }
            }
            if (sum_f(s, lid) >= goal) { t = cand; }
        }
        var s_gt = 0.0;
        for (var i = lid; i < VOCAB; i += WG) {
            let l = logits[base + i];
            let k = okey(l);
            if (k > t && kept(k, i)) { s_gt += exp((l - mx) * inv_t); }
        }
        let mass_gt = sum_f(s_gt, lid);
        let e_t = exp((fkey(t) - mx) * inv_t);
        // ties at t, lowest ids first, until the mass reaches the goal: largest x with
        // mass_gt + e_t * count(kept, key == t, id < x) < goal
        var x = 0u;
        for (var bit = ID_BITS - 1i; bit >= 0i; bit--) {
            let cand = x | (1u << u32(bit));
            var n = 0u;
            for (var i = lid; i < min(cand, VOCAB); i += WG) {
                let k = okey(logits[base + i]);
                n += u32(k == t && kept(k, i));
            }
            if (mass_gt + e_t * f32(sum_u(n, lid)) < goal) { x = cand; }
        }
        t2 = t;
        c2 = x;
        m = 0.0;
        for (var i = lid; i < VOCAB; i += WG) {
            let l = logits[base + i];
            if (kept(okey(l), i)) { m += exp((l - mx) * inv_t); }
        }
        mass = sum_f(m, lid);
    }

    // inverse CDF in id order: largest x with sum(kept, id < x) <= r; then x is the sampled id
    let r = uniform01(p.seed, p.index) * mass;
    var x = 0u;
    for (var bit = ID_BITS - 1i; bit >= 0i; bit--) {
        let cand = x | (1u << u32(bit));
        var s = 0.0;
        for (var i = lid; i < min(cand, VOCAB); i += WG) {
            let l = logits[base + i];
            if (kept(okey(l), i)) { s += exp((l - mx) * inv_t); }
        }
        if (sum_f(s, lid) <= r) { x = cand; }
    }
    // rounding can leave x past the last kept id (r within an ulp of the total): take the last kept id then
    var last = 0u;
    for (var i = lid; i < VOCAB; i += WG) {
        if (kept(okey(logits[base + i]), i)) { last = max(last, i); }
    }
    let last_kept = max_u(last, lid);
    if (lid == 0u) { out_ids[row] = min(x, last_kept); }
}
