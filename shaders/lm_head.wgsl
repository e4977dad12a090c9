// LM head for short rows (K <= 1024): logits y[t, n] = sum_k W[n, k] x[t, k] over the whole vocabulary, for the
// 1..max_seqs sampled rows of a step; weights q4 / q4a / q8 as in docs/package-format.md.
//
// Why a kernel of its own ("x-stationary"): at K = 576 a weight row is only 36 (q8) or 18 (q4) vec4<u32> loads, so
// gemv.wgsl, which re-reads and broadcasts x for every 32-wide chunk of 4 rows, spends as many instructions on x
// as on the weights. Here each lane copies its activation row(s) into registers ONCE (with the per-chunk sums of x
// that the q4/q4a offsets need), then streams RPL consecutive weight rows, a whole row at a time.
// On llvmpipe that only works with constant register indices: an array read at a loop index becomes a per-lane
// gather (measured: slower than gemv.wgsl), and x re-read from storage per row is ~15x slower. So the chunk loop
// is written out for up to 32 chunks, each guarded by `if (KC > c)` on the compile-time chunk count (folded away).
// No cross-lane reduction (workgroup barriers cost ~20 us each on llvmpipe), no subgroups, no f16 (x stays f32:
// SwiftShader has no shader-f16): one path for every device.
//
// Measured (lavapipe, q8 49152x576): ~parity with gemv.wgsl at 1 row, slower at 4-16 rows: not the default head.
//
// Layout: grid x = ceil(N / (64 RPL)) workgroups of 64 lanes; lane i of workgroup b owns rows
// (64 b + i) RPL + j, j = 0..RPL-1. Grid y selects a tile of TILE (1, 2 or 4) activation rows that share each
// loaded and unpacked weight chunk.
//
// Batch invariance, bit for bit: the logit of activation row t is always
//     sum over chunks c = 0..KC-1 in order of  s * dot32(q, x_c) (q8),  s * (dot32(q, x_c) - 8 sum(x_c)) (q4),
//                                              s * dot32(q, x_c) + m sum(x_c) (q4a)
// computed by the same code whatever tile slot it sits in and whatever else shares the dispatch; tile slots past
// the row count are skipped by uniform branches.
// K tail: the register copy of x is zero at k >= K (x is never read there), so the padding columns of the last
// chunk contribute q * s * 0 = 0 exactly (weights are finite: integers times a finite f16 scale).
// Defines: DTYPE (q4 | q4a | q8), KC (32-wide chunks per row = ceil(K / 32), 1..32), RPL, TILE.
#define RPL 16
#define KC 18
#define TILE 1
#define DTYPE q8

struct Params {
    n: u32,            // output rows of this weight binding
    k: u32,            // logical reduction length (only k < K is read from x)
    gs: u32,           // group size (multiple of 32)
    w_stride4: u32,    // vec4<u32> per weight row
    s_stride: u32,     // u32 words per scale row
    x_stride4: u32,    // vec4<f32> per activation row
    y_stride: u32,     // f32 per output row
    n_offset: u32,     // column of y where this binding's rows start
    count_index: u32,  // which step[] entry holds the number of activation rows
    _p0: u32,
    _p1: u32,
    _p2: u32,
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

alias W8 = array<vec4<f32>, 8>;

#if DTYPE == q8
// the 4 signed bytes of a word as floats
fn i8x4(u: u32) -> vec4<f32> {
    let v = bitcast<vec4<i32>>(vec4<u32>(u << 24u, u << 16u, u << 8u, u)) >> vec4<u32>(24u);
    return vec4<f32>(v);
}
// the 32 int8 weights of chunk c of a row (2 vec4<u32>)
fn unpack_row(row: u32, c: u32) -> W8 {
    let base = row * params.w_stride4 + 2u * c;
    let a = w[base];
    let b = w[base + 1u];
    return W8(i8x4(a.x), i8x4(a.y), i8x4(a.z), i8x4(a.w), i8x4(b.x), i8x4(b.y), i8x4(b.z), i8x4(b.w));
}
#else
// the 8 nibbles of a word as unsigned values (low nibble = element 0)
fn lo4(u: u32) -> vec4<f32> {
    return vec4<f32>(vec4<u32>(u, u >> 4u, u >> 8u, u >> 12u) & vec4<u32>(15u));
}
fn hi4(u: u32) -> vec4<f32> {
    return vec4<f32>(vec4<u32>(u >> 16u, u >> 20u, u >> 24u, u >> 28u) & vec4<u32>(15u));
}
// the 32 unsigned nibbles of chunk c of a row (one vec4<u32>)
fn unpack_row(row: u32, c: u32) -> W8 {
    let a = w[row * params.w_stride4 + c];
    return W8(lo4(a.x), hi4(a.x), lo4(a.y), hi4(a.y), lo4(a.z), hi4(a.z), lo4(a.w), hi4(a.w));
}
#endif

fn dot32(q: W8, a: W8) -> f32 {
    return dot(q[0], a[0]) + dot(q[1], a[1]) + dot(q[2], a[2]) + dot(q[3], a[3])
         + dot(q[4], a[4]) + dot(q[5], a[5]) + dot(q[6], a[6]) + dot(q[7], a[7]);
}

fn sum32(a: W8) -> f32 {
    let s = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
    return (s.x + s.y) + (s.z + s.w);
}

// vec4 v of the activation row at vec4 index xrow, zero where k >= K
fn x_at(xrow: u32, v: u32) -> vec4<f32> {
    let k0 = 4u * v;
    if (k0 + 4u <= params.k) {
        return x[xrow + v];
    }
    var r = vec4<f32>(0.0);
    for (var e = 0u; e < 4u; e++) {
        if (k0 + e < params.k) {
            r[e] = x[xrow + v][e];
        }
    }
    return r;
}

// chunk c of weight row n: unpacked integers and the scale (q4a: min) of its group
struct WQ {
    q: W8,
    s: f32,
    m: f32,
}

fn load_chunk(n: u32, c: u32) -> WQ {
    let g = c * 32u / params.gs;
    let si = n * params.s_stride + g / 2u;
    var r: WQ;
    r.q = unpack_row(n, c);
    r.s = unpack2x16float(scales[si])[g & 1u];
#if DTYPE == q4a
    r.m = unpack2x16float(mins[si])[g & 1u];
#endif
    return r;
}

fn term(wq: WQ, a: W8, sa: f32) -> f32 {
#if DTYPE == q4a
    return wq.s * dot32(wq.q, a) + wq.m * sa;
#else
#if DTYPE == q8
    return wq.s * dot32(wq.q, a);
#else
    return wq.s * (dot32(wq.q, a) - 8.0 * sa);
#endif
#endif
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let count = step[params.count_index];
    let t0 = wid.y * TILE;  // the tile's first activation row: uniform over the workgroup
    if (t0 >= count) {
        return;
    }
    let nt = min(count - t0, TILE);
    let xr0 = t0 * params.x_stride4;
    let xr1 = xr0 + params.x_stride4;
    let xr2 = xr1 + params.x_stride4;
    let xr3 = xr2 + params.x_stride4;
    // x prepared once, in registers (constant indices only): chunks of every active activation row and their sums
    // (sized for 32 chunks: naga rejects constant indices past the end even in folded-away branches)
    var xs0: array<W8, 32>; var xs1: array<W8, 32>; var xs2: array<W8, 32>; var xs3: array<W8, 32>;
    var ss0: array<f32, 32>; var ss1: array<f32, 32>; var ss2: array<f32, 32>; var ss3: array<f32, 32>;
    {
        if (KC > 0u) { xs0[0] = W8(x_at(xr0, 0u), x_at(xr0, 1u), x_at(xr0, 2u), x_at(xr0, 3u), x_at(xr0, 4u), x_at(xr0, 5u), x_at(xr0, 6u), x_at(xr0, 7u)); ss0[0] = sum32(xs0[0]); }
        if (KC > 1u) { xs0[1] = W8(x_at(xr0, 8u), x_at(xr0, 9u), x_at(xr0, 10u), x_at(xr0, 11u), x_at(xr0, 12u), x_at(xr0, 13u), x_at(xr0, 14u), x_at(xr0, 15u)); ss0[1] = sum32(xs0[1]); }
        if (KC > 2u) { xs0[2] = W8(x_at(xr0, 16u), x_at(xr0, 17u), x_at(xr0, 18u), x_at(xr0, 19u), x_at(xr0, 20u), x_at(xr0, 21u), x_at(xr0, 22u), x_at(xr0, 23u)); ss0[2] = sum32(xs0[2]); }
        if (KC > 3u) { xs0[3] = W8(x_at(xr0, 24u), x_at(xr0, 25u), x_at(xr0, 26u), x_at(xr0, 27u), x_at(xr0, 28u), x_at(xr0, 29u), x_at(xr0, 30u), x_at(xr0, 31u)); ss0[3] = sum32(xs0[3]); }
        if (KC > 4u) { xs0[4] = W8(x_at(xr0, 32u), x_at(xr0, 33u), x_at(xr0, 34u), x_at(xr0, 35u), x_at(xr0, 36u), x_at(xr0, 37u), x_at(xr0, 38u), x_at(xr0, 39u)); ss0[4] = sum32(xs0[4]); }
        if (KC > 5u) { xs0[5] = W8(x_at(xr0, 40u), x_at(xr0, 41u), x_at(xr0, 42u), x_at(xr0, 43u), x_at(xr0, 44u), x_at(xr0, 45u), x_at(xr0, 46u), x_at(xr0, 47u)); ss0[5] = sum32(xs0[5]); }
        if (KC > 6u) { xs0[6] = W8(x_at(xr0, 48u), x_at(xr0, 49u), x_at(xr0, 50u), x_at(xr0, 51u), x_at(xr0, 52u), x_at(xr0, 53u), x_at(xr0, 54u), x_at(xr0, 55u)); ss0[6] = sum32(xs0[6]); }
        if (KC > 7u) { xs0[7] = W8(x_at(xr0, 56u), x_at(xr0, 57u), x_at(xr0, 58u), x_at(xr0, 59u), x_at(xr0, 60u), x_at(xr0, 61u), x_at(xr0, 62u), x_at(xr0, 63u)); ss0[7] = sum32(xs0[7]); }
        if (KC > 8u) { xs0[8] = W8(x_at(xr0, 64u), x_at(xr0, 65u), x_at(xr0, 66u), x_at(xr0, 67u), x_at(xr0, 68u), x_at(xr0, 69u), x_at(xr0, 70u), x_at(xr0, 71u)); ss0[8] = sum32(xs0[8]); }
        if (KC > 9u) { xs0[9] = W8(x_at(xr0, 72u), x_at(xr0, 73u), x_at(xr0, 74u), x_at(xr0, 75u), x_at(xr0, 76u), x_at(xr0, 77u), x_at(xr0, 78u), x_at(xr0, 79u)); ss0[9] = sum32(xs0[9]); }
        if (KC > 10u) { xs0[10] = W8(x_at(xr0, 80u), x_at(xr0, 81u), x_at(xr0, 82u), x_at(xr0, 83u), x_at(xr0, 84u), x_at(xr0, 85u), x_at(xr0, 86u), x_at(xr0, 87u)); ss0[10] = sum32(xs0[10]); }
        if (KC > 11u) { xs0[11] = W8(x_at(xr0, 88u), x_at(xr0, 89u), x_at(xr0, 90u), x_at(xr0, 91u), x_at(xr0, 92u), x_at(xr0, 93u), x_at(xr0, 94u), x_at(xr0, 95u)); ss0[11] = sum32(xs0[11]); }
        if (KC > 12u) { xs0[12] = W8(x_at(xr0, 96u), x_at(xr0, 97u), x_at(xr0, 98u), x_at(xr0, 99u), x_at(xr0, 100u), x_at(xr0, 101u), x_at(xr0, 102u), x_at(xr0, 103u)); ss0[12] = sum32(xs0[12]); }
        if (KC > 13u) { xs0[13] = W8(x_at(xr0, 104u), x_at(xr0, 105u), x_at(xr0, 106u), x_at(xr0, 107u), x_at(xr0, 108u), x_at(xr0, 109u), x_at(xr0, 110u), x_at(xr0, 111u)); ss0[13] = sum32(xs0[13]); }
        if (KC > 14u) { xs0[14] = W8(x_at(xr0, 112u), x_at(xr0, 113u), x_at(xr0, 114u), x_at(xr0, 115u), x_at(xr0, 116u), x_at(xr0, 117u), x_at(xr0, 118u), x_at(xr0, 119u)); ss0[14] = sum32(xs0[14]); }
        if (KC > 15u) { xs0[15] = W8(x_at(xr0, 120u), x_at(xr0, 121u), x_at(xr0, 122u), x_at(xr0, 123u), x_at(xr0, 124u), x_at(xr0, 125u), x_at(xr0, 126u), x_at(xr0, 127u)); ss0[15] = sum32(xs0[15]); }
        if (KC > 16u) { xs0[16] = W8(x_at(xr0, 128u), x_at(xr0, 129u), x_at(xr0, 130u), x_at(xr0, 131u), x_at(xr0, 132u), x_at(xr0, 133u), x_at(xr0, 134u), x_at(xr0, 135u)); ss0[16] = sum32(xs0[16]); }
        if (KC > 17u) { xs0[17] = W8(x_at(xr0, 136u), x_at(xr0, 137u), x_at(xr0, 138u), x_at(xr0, 139u), x_at(xr0, 140u), x_at(xr0, 141u), x_at(xr0, 142u), x_at(xr0, 143u)); ss0[17] = sum32(xs0[17]); }
        if (KC > 18u) { xs0[18] = W8(x_at(xr0, 144u), x_at(xr0, 145u), x_at(xr0, 146u), x_at(xr0, 147u), x_at(xr0, 148u), x_at(xr0, 149u), x_at(xr0, 150u), x_at(xr0, 151u)); ss0[18] = sum32(xs0[18]); }
        if (KC > 19u) { xs0[19] = W8(x_at(xr0, 152u), x_at(xr0, 153u), x_at(xr0, 154u), x_at(xr0, 155u), x_at(xr0, 156u), x_at(xr0, 157u), x_at(xr0, 158u), x_at(xr0, 159u)); ss0[19] = sum32(xs0[19]); }
        if (KC > 20u) { xs0[20] = W8(x_at(xr0, 160u), x_at(xr0, 161u), x_at(xr0, 162u), x_at(xr0, 163u), x_at(xr0, 164u), x_at(xr0, 165u), x_at(xr0, 166u), x_at(xr0, 167u)); ss0[20] = sum32(xs0[20]); }
        if (KC > 21u) { xs0[21] = W8(x_at(xr0, 168u), x_at(xr0, 169u), x_at(xr0, 170u), x_at(xr0, 171u), x_at(xr0, 172u), x_at(xr0, 173u), x_at(xr0, 174u), x_at(xr0, 175u)); ss0[21] = sum32(xs0[21]); }
        if (KC > 22u) { xs0[22] = W8(x_at(xr0, 176u), x_at(xr0, 177u), x_at(xr0, 178u), x_at(xr0, 179u), x_at(xr0, 180u), x_at(xr0, 181u), x_at(xr0, 182u), x_at(xr0, 183u)); ss0[22] = sum32(xs0[22]); }
        if (KC > 23u) { xs0[23] = W8(x_at(xr0, 184u), x_at(xr0, 185u), x_at(xr0, 186u), x_at(xr0, 187u), x_at(xr0, 188u), x_at(xr0, 189u), x_at(xr0, 190u), x_at(xr0, 191u)); ss0[23] = sum32(xs0[23]); }
        if (KC > 24u) { xs0[24] = W8(x_at(xr0, 192u), x_at(xr0, 193u), x_at(xr0, 194u), x_at(xr0, 195u), x_at(xr0, 196u), x_at(xr0, 197u), x_at(xr0, 198u), x_at(xr0, 199u)); ss0[24] = sum32(xs0[24]); }
        if (KC > 25u) { xs0[25] = W8(x_at(xr0, 200u), x_at(xr0, 201u), x_at(xr0, 202u), x_at(xr0, 203u), x_at(xr0, 204u), x_at(xr0, 205u), x_at(xr0, 206u), x_at(xr0, 207u)); ss0[25] = sum32(xs0[25]); }
        if (KC > 26u) { xs0[26] = W8(x_at(xr0, 208u), x_at(xr0, 209u), x_at(xr0, 210u), x_at(xr0, 211u), x_at(xr0, 212u), x_at(xr0, 213u), x_at(xr0, 214u), x_at(xr0, 215u)); ss0[26] = sum32(xs0[26]); }
        if (KC > 27u) { xs0[27] = W8(x_at(xr0, 216u), x_at(xr0, 217u), x_at(xr0, 218u), x_at(xr0, 219u), x_at(xr0, 220u), x_at(xr0, 221u), x_at(xr0, 222u), x_at(xr0, 223u)); ss0[27] = sum32(xs0[27]); }
        if (KC > 28u) { xs0[28] = W8(x_at(xr0, 224u), x_at(xr0, 225u), x_at(xr0, 226u), x_at(xr0, 227u), x_at(xr0, 228u), x_at(xr0, 229u), x_at(xr0, 230u), x_at(xr0, 231u)); ss0[28] = sum32(xs0[28]); }
        if (KC > 29u) { xs0[29] = W8(x_at(xr0, 232u), x_at(xr0, 233u), x_at(xr0, 234u), x_at(xr0, 235u), x_at(xr0, 236u), x_at(xr0, 237u), x_at(xr0, 238u), x_at(xr0, 239u)); ss0[29] = sum32(xs0[29]); }
        if (KC > 30u) { xs0[30] = W8(x_at(xr0, 240u), x_at(xr0, 241u), x_at(xr0, 242u), x_at(xr0, 243u), x_at(xr0, 244u), x_at(xr0, 245u), x_at(xr0, 246u), x_at(xr0, 247u)); ss0[30] = sum32(xs0[30]); }
        if (KC > 31u) { xs0[31] = W8(x_at(xr0, 248u), x_at(xr0, 249u), x_at(xr0, 250u), x_at(xr0, 251u), x_at(xr0, 252u), x_at(xr0, 253u), x_at(xr0, 254u), x_at(xr0, 255u)); ss0[31] = sum32(xs0[31]); }
    }
    if (TILE > 1u && nt > 1u) {
        if (KC > 0u) { xs1[0] = W8(x_at(xr1, 0u), x_at(xr1, 1u), x_at(xr1, 2u), x_at(xr1, 3u), x_at(xr1, 4u), x_at(xr1, 5u), x_at(xr1, 6u), x_at(xr1, 7u)); ss1[0] = sum32(xs1[0]); }
        if (KC > 1u) { xs1[1] = W8(x_at(xr1, 8u), x_at(xr1, 9u), x_at(xr1, 10u), x_at(xr1, 11u), x_at(xr1, 12u), x_at(xr1, 13u), x_at(xr1, 14u), x_at(xr1, 15u)); ss1[1] = sum32(xs1[1]); }
        if (KC > 2u) { xs1[2] = W8(x_at(xr1, 16u), x_at(xr1, 17u), x_at(xr1, 18u), x_at(xr1, 19u), x_at(xr1, 20u), x_at(xr1, 21u), x_at(xr1, 22u), x_at(xr1, 23u)); ss1[2] = sum32(xs1[2]); }
        if (KC > 3u) { xs1[3] = W8(x_at(xr1, 24u), x_at(xr1, 25u), x_at(xr1, 26u), x_at(xr1, 27u), x_at(xr1, 28u), x_at(xr1, 29u), x_at(xr1, 30u), x_at(xr1, 31u)); ss1[3] = sum32(xs1[3]); }
        if (KC > 4u) { xs1[4] = W8(x_at(xr1, 32u), x_at(xr1, 33u), x_at(xr1, 34u), x_at(xr1, 35u), x_at(xr1, 36u), x_at(xr1, 37u), x_at(xr1, 38u), x_at(xr1, 39u)); ss1[4] = sum32(xs1[4]); }
        if (KC > 5u) { xs1[5] = W8(x_at(xr1, 40u), x_at(xr1, 41u), x_at(xr1, 42u), x_at(xr1, 43u), x_at(xr1, 44u), x_at(xr1, 45u), x_at(xr1, 46u), x_at(xr1, 47u)); ss1[5] = sum32(xs1[5]); }
        if (KC > 6u) { xs1[6] = W8(x_at(xr1, 48u), x_at(xr1, 49u), x_at(xr1, 50u), x_at(xr1, 51u), x_at(xr1, 52u), x_at(xr1, 53u), x_at(xr1, 54u), x_at(xr1, 55u)); ss1[6] = sum32(xs1[6]); }
        if (KC > 7u) { xs1[7] = W8(x_at(xr1, 56u), x_at(xr1, 57u), x_at(xr1, 58u), x_at(xr1, 59u), x_at(xr1, 60u), x_at(xr1, 61u), x_at(xr1, 62u), x_at(xr1, 63u)); ss1[7] = sum32(xs1[7]); }
        if (KC > 8u) { xs1[8] = W8(x_at(xr1, 64u), x_at(xr1, 65u), x_at(xr1, 66u), x_at(xr1, 67u), x_at(xr1, 68u), x_at(xr1, 69u), x_at(xr1, 70u), x_at(xr1, 71u)); ss1[8] = sum32(xs1[8]); }
        if (KC > 9u) { xs1[9] = W8(x_at(xr1, 72u), x_at(xr1, 73u), x_at(xr1, 74u), x_at(xr1, 75u), x_at(xr1, 76u), x_at(xr1, 77u), x_at(xr1, 78u), x_at(xr1, 79u)); ss1[9] = sum32(xs1[9]); }
        if (KC > 10u) { xs1[10] = W8(x_at(xr1, 80u), x_at(xr1, 81u), x_at(xr1, 82u), x_at(xr1, 83u), x_at(xr1, 84u), x_at(xr1, 85u), x_at(xr1, 86u), x_at(xr1, 87u)); ss1[10] = sum32(xs1[10]); }
        if (KC > 11u) { xs1[11] = W8(x_at(xr1, 88u), x_at(xr1, 89u), x_at(xr1, 90u), x_at(xr1, 91u), x_at(xr1, 92u), x_at(xr1, 93u), x_at(xr1, 94u), x_at(xr1, 95u)); ss1[11] = sum32(xs1[11]); }
        if (KC > 12u) { xs1[12] = W8(x_at(xr1, 96u), x_at(xr1, 97u), x_at(xr1, 98u), x_at(xr1, 99u), x_at(xr1, 100u), x_at(xr1, 101u), x_at(xr1, 102u), x_at(xr1, 103u)); ss1[12] = sum32(xs1[12]); }
        if (KC > 13u) { xs1[13] = W8(x_at(xr1, 104u), x_at(xr1, 105u), x_at(xr1, 106u), x_at(xr1, 107u), x_at(xr1, 108u), x_at(xr1, 109u), x_at(xr1, 110u), x_at(xr1, 111u)); ss1[13] = sum32(xs1[13]); }
        if (KC > 14u) { xs1[14] = W8(x_at(xr1, 112u), x_at(xr1, 113u), x_at(xr1, 114u), x_at(xr1, 115u), x_at(xr1, 116u), x_at(xr1, 117u), x_at(xr1, 118u), x_at(xr1, 119u)); ss1[14] = sum32(xs1[14]); }
        if (KC > 15u) { xs1[15] = W8(x_at(xr1, 120u), x_at(xr1, 121u), x_at(xr1, 122u), x_at(xr1, 123u), x_at(xr1, 124u), x_at(xr1, 125u), x_at(xr1, 126u), x_at(xr1, 127u)); ss1[15] = sum32(xs1[15]); }
        if (KC > 16u) { xs1[16] = W8(x_at(xr1, 128u), x_at(xr1, 129u), x_at(xr1, 130u), x_at(xr1, 131u), x_at(xr1, 132u), x_at(xr1, 133u), x_at(xr1, 134u), x_at(xr1, 135u)); ss1[16] = sum32(xs1[16]); }
        if (KC > 17u) { xs1[17] = W8(x_at(xr1, 136u), x_at(xr1, 137u), x_at(xr1, 138u), x_at(xr1, 139u), x_at(xr1, 140u), x_at(xr1, 141u), x_at(xr1, 142u), x_at(xr1, 143u)); ss1[17] = sum32(xs1[17]); }
        if (KC > 18u) { xs1[18] = W8(x_at(xr1, 144u), x_at(xr1, 145u), x_at(xr1, 146u), x_at(xr1, 147u), x_at(xr1, 148u), x_at(xr1, 149u), x_at(xr1, 150u), x_at(xr1, 151u)); ss1[18] = sum32(xs1[18]); }
        if (KC > 19u) { xs1[19] = W8(x_at(xr1, 152u), x_at(xr1, 153u), x_at(xr1, 154u), x_at(xr1, 155u), x_at(xr1, 156u), x_at(xr1, 157u), x_at(xr1, 158u), x_at(xr1, 159u)); ss1[19] = sum32(xs1[19]); }
        if (KC > 20u) { xs1[20] = W8(x_at(xr1, 160u), x_at(xr1, 161u), x_at(xr1, 162u), x_at(xr1, 163u), x_at(xr1, 164u), x_at(xr1, 165u), x_at(xr1, 166u), x_at(xr1, 167u)); ss1[20] = sum32(xs1[20]); }
        if (KC > 21u) { xs1[21] = W8(x_at(xr1, 168u), x_at(xr1, 169u), x_at(xr1, 170u), x_at(xr1, 171u), x_at(xr1, 172u), x_at(xr1, 173u), x_at(xr1, 174u), x_at(xr1, 175u)); ss1[21] = sum32(xs1[21]); }
        if (KC > 22u) { xs1[22] = W8(x_at(xr1, 176u), x_at(xr1, 177u), x_at(xr1, 178u), x_at(xr1, 179u), x_at(xr1, 180u), x_at(xr1, 181u), x_at(xr1, 182u), x_at(xr1, 183u)); ss1[22] = sum32(xs1[22]); }
        if (KC > 23u) { xs1[23] = W8(x_at(xr1, 184u), x_at(xr1, 185u), x_at(xr1, 186u), x_at(xr1, 187u), x_at(xr1, 188u), x_at(xr1, 189u), x_at(xr1, 190u), x_at(xr1, 191u)); ss1[23] = sum32(xs1[23]); }
        if (KC > 24u) { xs1[24] = W8(x_at(xr1, 192u), x_at(xr1, 193u), x_at(xr1, 194u), x_at(xr1, 195u), x_at(xr1, 196u), x_at(xr1, 197u), x_at(xr1, 198u), x_at(xr1, 199u)); ss1[24] = sum32(xs1[24]); }
        if (KC > 25u) { xs1[25] = W8(x_at(xr1, 200u), x_at(xr1, 201u), x_at(xr1, 202u), x_at(xr1, 203u), x_at(xr1, 204u), x_at(xr1, 205u), x_at(xr1, 206u), x_at(xr1, 207u)); ss1[25] = sum32(xs1[25]); }
        if (KC > 26u) { xs1[26] = W8(x_at(xr1, 208u), x_at(xr1, 209u), x_at(xr1, 210u), x_at(xr1, 211u), x_at(xr1, 212u), x_at(xr1, 213u), x_at(xr1, 214u), x_at(xr1, 215u)); ss1[26] = sum32(xs1[26]); }
        if (KC > 27u) { xs1[27] = W8(x_at(xr1, 216u), x_at(xr1, 217u), x_at(xr1, 218u), x_at(xr1, 219u), x_at(xr1, 220u), x_at(xr1, 221u), x_at(xr1, 222u), x_at(xr1, 223u)); ss1[27] = sum32(xs1[27]); }
        if (KC > 28u) { xs1[28] = W8(x_at(xr1, 224u), x_at(xr1, 225u), x_at(xr1, 226u), x_at(xr1, 227u), x_at(xr1, 228u), x_at(xr1, 229u), x_at(xr1, 230u), x_at(xr1, 231u)); ss1[28] = sum32(xs1[28]); }
        if (KC > 29u) { xs1[29] = W8(x_at(xr1, 232u), x_at(xr1, 233u), x_at(xr1, 234u), x_at(xr1, 235u), x_at(xr1, 236u), x_at(xr1, 237u), x_at(xr1, 238u), x_at(xr1, 239u)); ss1[29] = sum32(xs1[29]); }
        if (KC > 30u) { xs1[30] = W8(x_at(xr1, 240u), x_at(xr1, 241u), x_at(xr1, 242u), x_at(xr1, 243u), x_at(xr1, 244u), x_at(xr1, 245u), x_at(xr1, 246u), x_at(xr1, 247u)); ss1[30] = sum32(xs1[30]); }
        if (KC > 31u) { xs1[31] = W8(x_at(xr1, 248u), x_at(xr1, 249u), x_at(xr1, 250u), x_at(xr1, 251u), x_at(xr1, 252u), x_at(xr1, 253u), x_at(xr1, 254u), x_at(xr1, 255u)); ss1[31] = sum32(xs1[31]); }
    }
    if (TILE > 2u && nt > 2u) {
        if (KC > 0u) { xs2[0] = W8(x_at(xr2, 0u), x_at(xr2, 1u), x_at(xr2, 2u), x_at(xr2, 3u), x_at(xr2, 4u), x_at(xr2, 5u), x_at(xr2, 6u), x_at(xr2, 7u)); ss2[0] = sum32(xs2[0]); }
        if (KC > 1u) { xs2[1] = W8(x_at(xr2, 8u), x_at(xr2, 9u), x_at(xr2, 10u), x_at(xr2, 11u), x_at(xr2, 12u), x_at(xr2, 13u), x_at(xr2, 14u), x_at(xr2, 15u)); ss2[1] = sum32(xs2[1]); }
        if (KC > 2u) { xs2[2] = W8(x_at(xr2, 16u), x_at(xr2, 17u), x_at(xr2, 18u), x_at(xr2, 19u), x_at(xr2, 20u), x_at(xr2, 21u), x_at(xr2, 22u), x_at(xr2, 23u)); ss2[2] = sum32(xs2[2]); }
        if (KC > 3u) { xs2[3] = W8(x_at(xr2, 24u), x_at(xr2, 25u), x_at(xr2, 26u), x_at(xr2, 27u), x_at(xr2, 28u), x_at(xr2, 29u), x_at(xr2, 30u), x_at(xr2, 31u)); ss2[3] = sum32(xs2[3]); }
        if (KC > 4u) { xs2[4] = W8(x_at(xr2, 32u), x_at(xr2, 33u), x_at(xr2, 34u), x_at(xr2, 35u), x_at(xr2, 36u), x_at(xr2, 37u), x_at(xr2, 38u), x_at(xr2, 39u)); ss2[4] = sum32(xs2[4]); }
        if (KC > 5u) { xs2[5] = W8(x_at(xr2, 40u), x_at(xr2, 41u), x_at(xr2, 42u), x_at(xr2, 43u), x_at(xr2, 44u), x_at(xr2, 45u), x_at(xr2, 46u), x_at(xr2, 47u)); ss2[5] = sum32(xs2[5]); }
        if (KC > 6u) { xs2[6] = W8(x_at(xr2, 48u), x_at(xr2, 49u), x_at(xr2, 50u), x_at(xr2, 51u), x_at(xr2, 52u), x_at(xr2, 53u), x_at(xr2, 54u), x_at(xr2, 55u)); ss2[6] = sum32(xs2[6]); }
        if (KC > 7u) { xs2[7] = W8(x_at(xr2, 56u), x_at(xr2, 57u), x_at(xr2, 58u), x_at(xr2, 59u), x_at(xr2, 60u), x_at(xr2, 61u), x_at(xr2, 62u), x_at(xr2, 63u)); ss2[7] = sum32(xs2[7]); }
        if (KC > 8u) { xs2[8] = W8(x_at(xr2, 64u), x_at(xr2, 65u), x_at(xr2, 66u), x_at(xr2, 67u), x_at(xr2, 68u), x_at(xr2, 69u), x_at(xr2, 70u), x_at(xr2, 71u)); ss2[8] = sum32(xs2[8]); }
        if (KC > 9u) { xs2[9] = W8(x_at(xr2, 72u), x_at(xr2, 73u), x_at(xr2, 74u), x_at(xr2, 75u), x_at(xr2, 76u), x_at(xr2, 77u), x_at(xr2, 78u), x_at(xr2, 79u)); ss2[9] = sum32(xs2[9]); }
        if (KC > 10u) { xs2[10] = W8(x_at(xr2, 80u), x_at(xr2, 81u), x_at(xr2, 82u), x_at(xr2, 83u), x_at(xr2, 84u), x_at(xr2, 85u), x_at(xr2, 86u), x_at(xr2, 87u)); ss2[10] = sum32(xs2[10]); }
        if (KC > 11u) { xs2[11] = W8(x_at(xr2, 88u), x_at(xr2, 89u), x_at(xr2, 90u), x_at(xr2, 91u), x_at(xr2, 92u), x_at(xr2, 93u), x_at(xr2, 94u), x_at(xr2, 95u)); ss2[11] = sum32(xs2[11]); }
        if (KC > 12u) { xs2[12] = W8(x_at(xr2, 96u), x_at(xr2, 97u), x_at(xr2, 98u), x_at(xr2, 99u), x_at(xr2, 100u), x_at(xr2, 101u), x_at(xr2, 102u), x_at(xr2, 103u)); ss2[12] = sum32(xs2[12]); }
        if (KC > 13u) { xs2[13] = W8(x_at(xr2, 104u), x_at(xr2, 105u), x_at(xr2, 106u), x_at(xr2, 107u), x_at(xr2, 108u), x_at(xr2, 109u), x_at(xr2, 110u), x_at(xr2, 111u)); ss2[13] = sum32(xs2[13]); }
        if (KC > 14u) { xs2[14] = W8(x_at(xr2, 112u), x_at(xr2, 113u), x_at(xr2, 114u), x_at(xr2, 115u), x_at(xr2, 116u), x_at(xr2, 117u), x_at(xr2, 118u), x_at(xr2, 119u)); ss2[14] = sum32(xs2[14]); }
        if (KC > 15u) { xs2[15] = W8(x_at(xr2, 120u), x_at(xr2, 121u), x_at(xr2, 122u), x_at(xr2, 123u), x_at(xr2, 124u), x_at(xr2, 125u), x_at(xr2, 126u), x_at(xr2, 127u)); ss2[15] = sum32(xs2[15]); }
        if (KC > 16u) { xs2[16] = W8(x_at(xr2, 128u), x_at(xr2, 129u), x_at(xr2, 130u), x_at(xr2, 131u), x_at(xr2, 132u), x_at(xr2, 133u), x_at(xr2, 134u), x_at(xr2, 135u)); ss2[16] = sum32(xs2[16]); }
        if (KC > 17u) { xs2[17] = W8(x_at(xr2, 136u), x_at(xr2, 137u), x_at(xr2, 138u), x_at(xr2, 139u), x_at(xr2, 140u), x_at(xr2, 141u), x_at(xr2, 142u), x_at(xr2, 143u)); ss2[17] = sum32(xs2[17]); }
        if (KC > 18u) { xs2[18] = W8(x_at(xr2, 144u), x_at(xr2, 145u), x_at(xr2, 146u), x_at(xr2, 147u), x_at(xr2, 148u), x_at(xr2, 149u), x_at(xr2, 150u), x_at(xr2, 151u)); ss2[18] = sum32(xs2[18]); }
        if (KC > 19u) { xs2[19] = W8(x_at(xr2, 152u), x_at(xr2, 153u), x_at(xr2, 154u), x_at(xr2, 155u), x_at(xr2, 156u), x_at(xr2, 157u), x_at(xr2, 158u), x_at(xr2, 159u)); ss2[19] = sum32(xs2[19]); }
        if (KC > 20u) { xs2[20] = W8(x_at(xr2, 160u), x_at(xr2, 161u), x_at(xr2, 162u), x_at(xr2, 163u), x_at(xr2, 164u), x_at(xr2, 165u), x_at(xr2, 166u), x_at(xr2, 167u)); ss2[20] = sum32(xs2[20]); }
        if (KC > 21u) { xs2[21] = W8(x_at(xr2, 168u), x_at(xr2, 169u), x_at(xr2, 170u), x_at(xr2, 171u), x_at(xr2, 172u), x_at(xr2, 173u), x_at(xr2, 174u), x_at(xr2, 175u)); ss2[21] = sum32(xs2[21]); }
        if (KC > 22u) { xs2[22] = W8(x_at(xr2, 176u), x_at(xr2, 177u), x_at(xr2, 178u), x_at(xr2, 179u), x_at(xr2, 180u), x_at(xr2, 181u), x_at(xr2, 182u), x_at(xr2, 183u)); ss2[22] = sum32(xs2[22]); }
        if (KC > 23u) { xs2[23] = W8(x_at(xr2, 184u), x_at(xr2, 185u), x_at(xr2, 186u), x_at(xr2, 187u), x_at(xr2, 188u), x_at(xr2, 189u), x_at(xr2, 190u), x_at(xr2, 191u)); ss2[23] = sum32(xs2[23]); }
        if (KC > 24u) { xs2[24] = W8(x_at(xr2, 192u), x_at(xr2, 193u), x_at(xr2, 194u), x_at(xr2, 195u), x_at(xr2, 196u), x_at(xr2, 197u), x_at(xr2, 198u), x_at(xr2, 199u)); ss2[24] = sum32(xs2[24]); }
        if (KC > 25u) { xs2[25] = W8(x_at(xr2, 200u), x_at(xr2, 201u), x_at(xr2, 202u), x_at(xr2, 203u), x_at(xr2, 204u), x_at(xr2, 205u), x_at(xr2, 206u), x_at(xr2, 207u)); ss2[25] = sum32(xs2[25]); }
        if (KC > 26u) { xs2[26] = W8(x_at(xr2, 208u), x_at(xr2, 209u), x_at(xr2, 210u), x_at(xr2, 211u), x_at(xr2, 212u), x_at(xr2, 213u), x_at(xr2, 214u), x_at(xr2, 215u)); ss2[26] = sum32(xs2[26]); }
        if (KC > 27u) { xs2[27] = W8(x_at(xr2, 216u), x_at(xr2, 217u), x_at(xr2, 218u), x_at(xr2, 219u), x_at(xr2, 220u), x_at(xr2, 221u), x_at(xr2, 222u), x_at(xr2, 223u)); ss2[27] = sum32(xs2[27]); }
        if (KC > 28u) { xs2[28] = W8(x_at(xr2, 224u), x_at(xr2, 225u), x_at(xr2, 226u), x_at(xr2, 227u), x_at(xr2, 228u), x_at(xr2, 229u), x_at(xr2, 230u), x_at(xr2, 231u)); ss2[28] = sum32(xs2[28]); }
        if (KC > 29u) { xs2[29] = W8(x_at(xr2, 232u), x_at(xr2, 233u), x_at(xr2, 234u), x_at(xr2, 235u), x_at(xr2, 236u), x_at(xr2, 237u), x_at(xr2, 238u), x_at(xr2, 239u)); ss2[29] = sum32(xs2[29]); }
        if (KC > 30u) { xs2[30] = W8(x_at(xr2, 240u), x_at(xr2, 241u), x_at(xr2, 242u), x_at(xr2, 243u), x_at(xr2, 244u), x_at(xr2, 245u), x_at(xr2, 246u), x_at(xr2, 247u)); ss2[30] = sum32(xs2[30]); }
        if (KC > 31u) { xs2[31] = W8(x_at(xr2, 248u), x_at(xr2, 249u), x_at(xr2, 250u), x_at(xr2, 251u), x_at(xr2, 252u), x_at(xr2, 253u), x_at(xr2, 254u), x_at(xr2, 255u)); ss2[31] = sum32(xs2[31]); }
    }
    if (TILE > 3u && nt > 3u) {
        if (KC > 0u) { xs3[0] = W8(x_at(xr3, 0u), x_at(xr3, 1u), x_at(xr3, 2u), x_at(xr3, 3u), x_at(xr3, 4u), x_at(xr3, 5u), x_at(xr3, 6u), x_at(xr3, 7u)); ss3[0] = sum32(xs3[0]); }
        if (KC > 1u) { xs3[1] = W8(x_at(xr3, 8u), x_at(xr3, 9u), x_at(xr3, 10u), x_at(xr3, 11u), x_at(xr3, 12u), x_at(xr3, 13u), x_at(xr3, 14u), x_at(xr3, 15u)); ss3[1] = sum32(xs3[1]); }
        if (KC > 2u) { xs3[2] = W8(x_at(xr3, 16u), x_at(xr3, 17u), x_at(xr3, 18u), x_at(xr3, 19u), x_at(xr3, 20u), x_at(xr3, 21u), x_at(xr3, 22u), x_at(xr3, 23u)); ss3[2] = sum32(xs3[2]); }
        if (KC > 3u) { xs3[3] = W8(x_at(xr3, 24u), x_at(xr3, 25u), x_at(xr3, 26u), x_at(xr3, 27u), x_at(xr3, 28u), x_at(xr3, 29u), x_at(xr3, 30u), x_at(xr3, 31u)); ss3[3] = sum32(xs3[3]); }
        if (KC > 4u) { xs3[4] = W8(x_at(xr3, 32u), x_at(xr3, 33u), x_at(xr3, 34u), x_at(xr3, 35u), x_at(xr3, 36u), x_at(xr3, 37u), x_at(xr3, 38u), x_at(xr3, 39u)); ss3[4] = sum32(xs3[4]); }
        if (KC > 5u) { xs3[5] = W8(x_at(xr3, 40u), x_at(xr3, 41u), x_at(xr3, 42u), x_at(xr3, 43u), x_at(xr3, 44u), x_at(xr3, 45u), x_at(xr3, 46u), x_at(xr3, 47u)); ss3[5] = sum32(xs3[5]); }
        if (KC > 6u) { xs3[6] = W8(x_at(xr3, 48u), x_at(xr3, 49u), x_at(xr3, 50u), x_at(xr3, 51u), x_at(xr3, 52u), x_at(xr3, 53u), x_at(xr3, 54u), x_at(xr3, 55u)); ss3[6] = sum32(xs3[6]); }
        if (KC > 7u) { xs3[7] = W8(x_at(xr3, 56u), x_at(xr3, 57u), x_at(xr3, 58u), x_at(xr3, 59u), x_at(xr3, 60u), x_at(xr3, 61u), x_at(xr3, 62u), x_at(xr3, 63u)); ss3[7] = sum32(xs3[7]); }
        if (KC > 8u) { xs3[8] = W8(x_at(xr3, 64u), x_at(xr3, 65u), x_at(xr3, 66u), x_at(xr3, 67u), x_at(xr3, 68u), x_at(xr3, 69u), x_at(xr3, 70u), x_at(xr3, 71u)); ss3[8] = sum32(xs3[8]); }
        if (KC > 9u) { xs3[9] = W8(x_at(xr3, 72u), x_at(xr3, 73u), x_at(xr3, 74u), x_at(xr3, 75u), x_at(xr3, 76u), x_at(xr3, 77u), x_at(xr3, 78u), x_at(xr3, 79u)); ss3[9] = sum32(xs3[9]); }
        if (KC > 10u) { xs3[10] = W8(x_at(xr3, 80u), x_at(xr3, 81u), x_at(xr3, 82u), x_at(xr3, 83u), x_at(xr3, 84u), x_at(xr3, 85u), x_at(xr3, 86u), x_at(xr3, 87u)); ss3[10] = sum32(xs3[10]); }
        if (KC > 11u) { xs3[11] = W8(x_at(xr3, 88u), x_at(xr3, 89u), x_at(xr3, 90u), x_at(xr3, 91u), x_at(xr3, 92u), x_at(xr3, 93u), x_at(xr3, 94u), x_at(xr3, 95u)); ss3[11] = sum32(xs3[11]); }
        if (KC > 12u) { xs3[12] = W8(x_at(xr3, 96u), x_at(xr3, 97u), x_at(xr3, 98u), x_at(xr3, 99u), x_at(xr3, 100u), x_at(xr3, 101u), x_at(xr3, 102u), x_at(xr3, 103u)); ss3[12] = sum32(xs3[12]); }
        if (KC > 13u) { xs3[13] = W8(x_at(xr3, 104u), x_at(xr3, 105u), x_at(xr3, 106u), x_at(xr3, 107u), x_at(xr3, 108u), x_at(xr3, 109u), x_at(xr3, 110u), x_at(xr3, 111u)); ss3[13] = sum32(xs3[13]); }
        if (KC > 14u) { xs3[14] = W8(x_at(xr3, 112u), x_at(xr3, 113u), x_at(xr3, 114u), x_at(xr3, 115u), x_at(xr3, 116u), x_at(xr3, 117u), x_at(xr3, 118u), x_at(xr3, 119u)); ss3[14] = sum32(xs3[14]); }
        if (KC > 15u) { xs3[15] = W8(x_at(xr3, 120u), x_at(xr3, 121u), x_at(xr3, 122u), x_at(xr3, 123u), x_at(xr3, 124u), x_at(xr3, 125u), x_at(xr3, 126u), x_at(xr3, 127u)); ss3[15] = sum32(xs3[15]); }
        if (KC > 16u) { xs3[16] = W8(x_at(xr3, 128u), x_at(xr3, 129u), x_at(xr3, 130u), x_at(xr3, 131u), x_at(xr3, 132u), x_at(xr3, 133u), x_at(xr3, 134u), x_at(xr3, 135u)); ss3[16] = sum32(xs3[16]); }
        if (KC > 17u) { xs3[17] = W8(x_at(xr3, 136u), x_at(xr3, 137u), x_at(xr3, 138u), x_at(xr3, 139u), x_at(xr3, 140u), x_at(xr3, 141u), x_at(xr3, 142u), x_at(xr3, 143u)); ss3[17] = sum32(xs3[17]); }
        if (KC > 18u) { xs3[18] = W8(x_at(xr3, 144u), x_at(xr3, 145u), x_at(xr3, 146u), x_at(xr3, 147u), x_at(xr3, 148u), x_at(xr3, 149u), x_at(xr3, 150u), x_at(xr3, 151u)); ss3[18] = sum32(xs3[18]); }
        if (KC > 19u) { xs3[19] = W8(x_at(xr3, 152u), x_at(xr3, 153u), x_at(xr3, 154u), x_at(xr3, 155u), x_at(xr3, 156u), x_at(xr3, 157u), x_at(xr3, 158u), x_at(xr3, 159u)); ss3[19] = sum32(xs3[19]); }
        if (KC > 20u) { xs3[20] = W8(x_at(xr3, 160u), x_at(xr3, 161u), x_at(xr3, 162u), x_at(xr3, 163u), x_at(xr3, 164u), x_at(xr3, 165u), x_at(xr3, 166u), x_at(xr3, 167u)); ss3[20] = sum32(xs3[20]); }
        if (KC > 21u) { xs3[21] = W8(x_at(xr3, 168u), x_at(xr3, 169u), x_at(xr3, 170u), x_at(xr3, 171u), x_at(xr3, 172u), x_at(xr3, 173u), x_at(xr3, 174u), x_at(xr3, 175u)); ss3[21] = sum32(xs3[21]); }
        if (KC > 22u) { xs3[22] = W8(x_at(xr3, 176u), x_at(xr3, 177u), x_at(xr3, 178u), x_at(xr3, 179u), x_at(xr3, 180u), x_at(xr3, 181u), x_at(xr3, 182u), x_at(xr3, 183u)); ss3[22] = sum32(xs3[22]); }
        if (KC > 23u) { xs3[23] = W8(x_at(xr3, 184u), x_at(xr3, 185u), x_at(xr3, 186u), x_at(xr3, 187u), x_at(xr3, 188u), x_at(xr3, 189u), x_at(xr3, 190u), x_at(xr3, 191u)); ss3[23] = sum32(xs3[23]); }
        if (KC > 24u) { xs3[24] = W8(x_at(xr3, 192u), x_at(xr3, 193u), x_at(xr3, 194u), x_at(xr3, 195u), x_at(xr3, 196u), x_at(xr3, 197u), x_at(xr3, 198u), x_at(xr3, 199u)); ss3[24] = sum32(xs3[24]); }
        if (KC > 25u) { xs3[25] = W8(x_at(xr3, 200u), x_at(xr3, 201u), x_at(xr3, 202u), x_at(xr3, 203u), x_at(xr3, 204u), x_at(xr3, 205u), x_at(xr3, 206u), x_at(xr3, 207u)); ss3[25] = sum32(xs3[25]); }
        if (KC > 26u) { xs3[26] = W8(x_at(xr3, 208u), x_at(xr3, 209u), x_at(xr3, 210u), x_at(xr3, 211u), x_at(xr3, 212u), x_at(xr3, 213u), x_at(xr3, 214u), x_at(xr3, 215u)); ss3[26] = sum32(xs3[26]); }
        if (KC > 27u) { xs3[27] = W8(x_at(xr3, 216u), x_at(xr3, 217u), x_at(xr3, 218u), x_at(xr3, 219u), x_at(xr3, 220u), x_at(xr3, 221u), x_at(xr3, 222u), x_at(xr3, 223u)); ss3[27] = sum32(xs3[27]); }
        if (KC > 28u) { xs3[28] = W8(x_at(xr3, 224u), x_at(xr3, 225u), x_at(xr3, 226u), x_at(xr3, 227u), x_at(xr3, 228u), x_at(xr3, 229u), x_at(xr3, 230u), x_at(xr3, 231u)); ss3[28] = sum32(xs3[28]); }
        if (KC > 29u) { xs3[29] = W8(x_at(xr3, 232u), x_at(xr3, 233u), x_at(xr3, 234u), x_at(xr3, 235u), x_at(xr3, 236u), x_at(xr3, 237u), x_at(xr3, 238u), x_at(xr3, 239u)); ss3[29] = sum32(xs3[29]); }
        if (KC > 30u) { xs3[30] = W8(x_at(xr3, 240u), x_at(xr3, 241u), x_at(xr3, 242u), x_at(xr3, 243u), x_at(xr3, 244u), x_at(xr3, 245u), x_at(xr3, 246u), x_at(xr3, 247u)); ss3[30] = sum32(xs3[30]); }
        if (KC > 31u) { xs3[31] = W8(x_at(xr3, 248u), x_at(xr3, 249u), x_at(xr3, 250u), x_at(xr3, 251u), x_at(xr3, 252u), x_at(xr3, 253u), x_at(xr3, 254u), x_at(xr3, 255u)); ss3[31] = sum32(xs3[31]); }
    }
    let last = params.n - 1u;
    for (var j = 0u; j < RPL; j++) {
        let n = gid.x * RPL + j;
        if (n > last) {
            break;  // rows only grow with j
        }
        var acc = vec4<f32>(0.0);  // tile slots 0..3
            if (KC > 0u) {
                let wq = load_chunk(n, 0u);
                acc.x += term(wq, xs0[0], ss0[0]);
                if (TILE > 1u && nt > 1u) { acc[1] += term(wq, xs1[0], ss1[0]); }
                if (TILE > 2u && nt > 2u) { acc[2] += term(wq, xs2[0], ss2[0]); }
                if (TILE > 3u && nt > 3u) { acc[3] += term(wq, xs3[0], ss3[0]); }
            }
            if (KC > 1u) {
                let wq = load_chunk(n, 1u);
                acc.x += term(wq, xs0[1], ss0[1]);
                if (TILE > 1u && nt > 1u) { acc[1] += term(wq, xs1[1], ss1[1]); }
                if (TILE > 2u && nt > 2u) { acc[2] += term(wq, xs2[1], ss2[1]); }
                if (TILE > 3u && nt > 3u) { acc[3] += term(wq, xs3[1], ss3[1]); }
            }
            if (KC > 2u) {
                let wq = load_chunk(n, 2u);
                acc.x += term(wq, xs0[2], ss0[2]);
                if (TILE > 1u && nt > 1u) { acc[1] += term(wq, xs1[2], ss1[2]); }
                if (TILE > 2u && nt > 2u) { acc[2] += term(wq, xs2[2], ss2[2]); }
                if (TILE > 3u && nt > 3u) { acc[3] += term(wq, xs3[2], ss3[2]); }
            }
            if (KC > 3u) {
                let wq = load_chunk(n, 3u);
                acc.x += term(wq, xs0[3], ss0[3]);
                if (TILE > 1u && nt > 1u) { acc[1] += term(wq, xs1[3], ss1[3]); }
                if (TILE > 2u && nt > 2u) { acc[2] += term(wq, xs2[3], ss2[3]); }
                if (TILE > 3u && nt > 3u) { acc[3] += term(wq, xs3[3], ss3[3]); }
            }
            if (KC > 4u) {
                let wq = load_chunk(n, 4u);
                acc.x += term(wq, xs0[4], ss0[4]);
                if (TILE > 1u && nt > 1u) { acc[1] += term(wq, xs1[4], ss1[4]); }
                if (TILE > 2u && nt > 2u) { acc[2] += term(wq, xs2[4], ss2[4]); }
                if (TILE > 3u && nt > 3u) { acc[3] += term(wq, xs3[4], ss3[4]); }
            }
            if (KC > 5u) {
                let wq = load_chunk(n, 5u);
                acc.x += term(wq, xs0[5], ss0[5]);
                if (TILE > 1u && nt > 1u) { acc[1] += term(wq, xs1[5], ss1[5]); }
                if (TILE > 2u && nt > 2u) { acc[2] += term(wq, xs2[5], ss2[5]); }
                if (TILE > 3u && nt > 3u) { acc[3] += term(wq, xs3[5], ss3[5]); }
            }
            if (KC > 6u) {
                let wq = load_chunk(n, 6u);
                acc.x += term(wq, xs0[6], ss0[6]);
                if (TILE > 1u && nt > 1u) { acc[1] += term(wq, xs1[6], ss1[6]); }
                if (TILE > 2u && nt > 2u) { acc[2] += term(wq, xs2[6], ss2[6]); }
                if (TILE > 3u && nt > 3u) { acc[3] += term(wq, xs3[6], ss3[6]); }
            }
            if (KC > 7u) {
                let wq = load_chunk(n, 7u);
                acc.x += term(wq, xs0[7], ss0[7]);
                if (TILE > 1u && nt > 1u) { acc[1] += term(wq, xs1[7], ss1[7]); }
                if (TILE > 2u && nt > 2u) { acc[2] += term(wq, xs2[7], ss2[7]); }
                if (TILE > 3u && nt > 3u) { acc[3] += term(wq, xs3[7], ss3[7]); }
            }
            if (KC > 8u) {
                let wq = load_chunk(n, 8u);
                acc.x += term(wq, xs0[8], ss0[8]);
                if (TILE > 1u && nt > 1u) { acc[1] += term(wq, xs1[8], ss1[8]); }
                if (TILE > 2u && nt > 2u) { acc[2] += term(wq, xs2[8], ss2[8]); }
                if (TILE > 3u && nt > 3u) { acc[3] += term(wq, xs3[8], ss3[8]); }
            }
            if (KC > 9u) {
                let wq = load_chunk(n, 9u);
                acc.x += term(wq, xs0[9], ss0[9]);
                if (TILE > 1u && nt > 1u) { acc[1] += term(wq, xs1[9], ss1[9]); }
                if (TILE > 2u && nt > 2u) { acc[2] += term(wq, xs2[9], ss2[9]); }
                if (TILE > 3u && nt > 3u) { acc[3] += term(wq, xs3[9], ss3[9]); }
            }
            if (KC > 10u) {
                let wq = load_chunk(n, 10u);
                acc.x += term(wq, xs0[10], ss0[10]);
                if (TILE > 1u && nt > 1u) { acc[1] += term(wq, xs1[10], ss1[10]); }
                if (TILE > 2u && nt > 2u) { acc[2] += term(wq, xs2[10], ss2[10]); }
                if (TILE > 3u && nt > 3u) { acc[3] += term(wq, xs3[10], ss3[10]); }
            }
            if (KC > 11u) {
                let wq = load_chunk(n, 11u);
                acc.x += term(wq, xs0[11], ss0[11]);
                if (TILE > 1u && nt > 1u) { acc[1] += term(wq, xs1[11], ss1[11]); }
                if (TILE > 2u && nt > 2u) { acc[2] += term(wq, xs2[11], ss2[11]); }
                if (TILE > 3u && nt > 3u) { acc[3] += term(wq, xs3[11], ss3[11]); }
            }
            if (KC > 12u) {
                let wq = load_chunk(n, 12u);
                acc.x += term(wq, xs0[12], ss0[12]);
                if (TILE > 1u && nt > 1u) { acc[1] += term(wq, xs1[12], ss1[12]); }
                if (TILE > 2u && nt > 2u) { acc[2] += term(wq, xs2[12], ss2[12]); }
                if (TILE > 3u && nt > 3u) { acc[3] += term(wq, xs3[12], ss3[12]); }
            }
            if (KC > 13u) {
                let wq = load_chunk(n, 13u);
                acc.x += term(wq, xs0[13], ss0[13]);
                if (TILE > 1u && nt > 1u) { acc[1] += term(wq, xs1[13], ss1[13]); }
                if (TILE > 2u && nt > 2u) { acc[2] += term(wq, xs2[13], ss2[13]); }
                if (TILE > 3u && nt > 3u) { acc[3] += term(wq, xs3[13], ss3[13]); }
            }
            if (KC > 14u) {
                let wq = load_chunk(n, 14u);
                acc.x += term(wq, xs0[14], ss0[14]);
                if (TILE > 1u && nt > 1u) { acc[1] += term(wq, xs1[14], ss1[14]); }
                if (TILE > 2u && nt > 2u) { acc[2] += term(wq, xs2[14], ss2[14]); }
                if (TILE > 3u && nt > 3u) { acc[3] += term(wq, xs3[14], ss3[14]); }
            }
            if (KC > 15u) {
                let wq = load_chunk(n, 15u);
                acc.x += term(wq, xs0[15], ss0[15]);
                if (TILE > 1u && nt > 1u) { acc[1] += term(wq, xs1[15], ss1[15]); }
                if (TILE > 2u && nt > 2u) { acc[2] += term(wq, xs2[15], ss2[15]); }
                if (TILE > 3u && nt > 3u) { acc[3] += term(wq, xs3[15], ss3[15]); }
            }
            if (KC > 16u) {
                let wq = load_chunk(n, 16u);
                acc.x += term(wq, xs0[16], ss0[16]);
                if (TILE > 1u && nt > 1u) { acc[1] += term(wq, xs1[16], ss1[16]); }
                if (TILE > 2u && nt > 2u) { acc[2] += term(wq, xs2[16], ss2[16]); }
                if (TILE > 3u && nt > 3u) { acc[3] += term(wq, xs3[16], ss3[16]); }
            }
            if (KC > 17u) {
                let wq = load_chunk(n, 17u);
                acc.x += term(wq, xs0[17], ss0[17]);
                if (TILE > 1u && nt > 1u) { acc[1] += term(wq, xs1[17], ss1[17]); }
                if (TILE > 2u && nt > 2u) { acc[2] += term(wq, xs2[17], ss2[17]); }
                if (TILE > 3u && nt > 3u) { acc[3] += term(wq, xs3[17], ss3[17]); }
            }
            if (KC > 18u) {
                let wq = load_chunk(n, 18u);
                acc.x += term(wq, xs0[18], ss0[18]);
                if (TILE > 1u && nt > 1u) { acc[1] += term(wq, xs1[18], ss1[18]); }
                if (TILE > 2u && nt > 2u) { acc[2] += term(wq, xs2[18], ss2[18]); }
                if (TILE > 3u && nt > 3u) { acc[3] += term(wq, xs3[18], ss3[18]); }
            }
            if (KC > 19u) {
                let wq = load_chunk(n, 19u);
                acc.x += term(wq, xs0[19], ss0[19]);
                if (TILE > 1u && nt > 1u) { acc[1] += term(wq, xs1[19], ss1[19]); }
                if (TILE > 2u && nt > 2u) { acc[2] += term(wq, xs2[19], ss2[19]); }
                if (TILE > 3u && nt > 3u) { acc[3] += term(wq, xs3[19], ss3[19]); }
            }
            if (KC > 20u) {
                let wq = load_chunk(n, 20u);
                acc.x += term(wq, xs0[20], ss0[20]);
                if (TILE > 1u && nt > 1u) { acc[1] += term(wq, xs1[20], ss1[20]); }
                if (TILE > 2u && nt > 2u) { acc[2] += term(wq, xs2[20], ss2[20]); }
                if (TILE > 3u && nt > 3u) { acc[3] += term(wq, xs3[20], ss3[20]); }
            }
            if (KC > 21u) {
                let wq = load_chunk(n, 21u);
                acc.x += term(wq, xs0[21], ss0[21]);
                if (TILE > 1u && nt > 1u) { acc[1] += term(wq, xs1[21], ss1[21]); }
                if (TILE > 2u && nt > 2u) { acc[2] += term(wq, xs2[21], ss2[21]); }
                if (TILE > 3u && nt > 3u) { acc[3] += term(wq, xs3[21], ss3[21]); }
            }
            if (KC > 22u) {
                let wq = load_chunk(n, 22u);
                acc.x += term(wq, xs0[22], ss0[22]);
                if (TILE > 1u && nt > 1u) { acc[1] += term(wq, xs1[22], ss1[22]); }
                if (TILE > 2u && nt > 2u) { acc[2] += term(wq, xs2[22], ss2[22]); }
                if (TILE > 3u && nt > 3u) { acc[3] += term(wq, xs3[22], ss3[22]); }
            }
            if (KC > 23u) {
                let wq = load_chunk(n, 23u);
                acc.x += term(wq, xs0[23], ss0[23]);
                if (TILE > 1u && nt > 1u) { acc[1] += term(wq, xs1[23], ss1[23]); }
                if (TILE > 2u && nt > 2u) { acc[2] += term(wq, xs2[23], ss2[23]); }
                if (TILE > 3u && nt > 3u) { acc[3] += term(wq, xs3[23], ss3[23]); }
            }
            if (KC > 24u) {
                let wq = load_chunk(n, 24u);
                acc.x += term(wq, xs0[24], ss0[24]);
                if (TILE > 1u && nt > 1u) { acc[1] += term(wq, xs1[24], ss1[24]); }
                if (TILE > 2u && nt > 2u) { acc[2] += term(wq, xs2[24], ss2[24]); }
                if (TILE > 3u && nt > 3u) { acc[3] += term(wq, xs3[24], ss3[24]); }
            }
            if (KC > 25u) {
                let wq = load_chunk(n, 25u);
                acc.x += term(wq, xs0[25], ss0[25]);
                if (TILE > 1u && nt > 1u) { acc[1] += term(wq, xs1[25], ss1[25]); }
                if (TILE > 2u && nt > 2u) { acc[2] += term(wq, xs2[25], ss2[25]); }
                if (TILE > 3u && nt > 3u) { acc[3] += term(wq, xs3[25], ss3[25]); }
            }
            if (KC > 26u) {
                let wq = load_chunk(n, 26u);
                acc.x += term(wq, xs0[26], ss0[26]);
                if (TILE > 1u && nt > 1u) { acc[1] += term(wq, xs1[26], ss1[26]); }
                if (TILE > 2u && nt > 2u) { acc[2] += term(wq, xs2[26], ss2[26]); }
                if (TILE > 3u && nt > 3u) { acc[3] += term(wq, xs3[26], ss3[26]); }
            }
            if (KC > 27u) {
                let wq = load_chunk(n, 27u);
                acc.x += term(wq, xs0[27], ss0[27]);
                if (TILE > 1u && nt > 1u) { acc[1] += term(wq, xs1[27], ss1[27]); }
                if (TILE > 2u && nt > 2u) { acc[2] += term(wq, xs2[27], ss2[27]); }
                if (TILE > 3u && nt > 3u) { acc[3] += term(wq, xs3[27], ss3[27]); }
            }
            if (KC > 28u) {
                let wq = load_chunk(n, 28u);
                acc.x += term(wq, xs0[28], ss0[28]);
                if (TILE > 1u && nt > 1u) { acc[1] += term(wq, xs1[28], ss1[28]); }
                if (TILE > 2u && nt > 2u) { acc[2] += term(wq, xs2[28], ss2[28]); }
                if (TILE > 3u && nt > 3u) { acc[3] += term(wq, xs3[28], ss3[28]); }
            }
            if (KC > 29u) {
                let wq = load_chunk(n, 29u);
                acc.x += term(wq, xs0[29], ss0[29]);
                if (TILE > 1u && nt > 1u) { acc[1] += term(wq, xs1[29], ss1[29]); }
                if (TILE > 2u && nt > 2u) { acc[2] += term(wq, xs2[29], ss2[29]); }
                if (TILE > 3u && nt > 3u) { acc[3] += term(wq, xs3[29], ss3[29]); }
            }
            if (KC > 30u) {
                let wq = load_chunk(n, 30u);
                acc.x += term(wq, xs0[30], ss0[30]);
                if (TILE > 1u && nt > 1u) { acc[1] += term(wq, xs1[30], ss1[30]); }
                if (TILE > 2u && nt > 2u) { acc[2] += term(wq, xs2[30], ss2[30]); }
                if (TILE > 3u && nt > 3u) { acc[3] += term(wq, xs3[30], ss3[30]); }
            }
            if (KC > 31u) {
                let wq = load_chunk(n, 31u);
                acc.x += term(wq, xs0[31], ss0[31]);
                if (TILE > 1u && nt > 1u) { acc[1] += term(wq, xs1[31], ss1[31]); }
                if (TILE > 2u && nt > 2u) { acc[2] += term(wq, xs2[31], ss2[31]); }
                if (TILE > 3u && nt > 3u) { acc[3] += term(wq, xs3[31], ss3[31]); }
            }
        let col = params.n_offset + n;
        y[t0 * params.y_stride + col] = acc.x;
        for (var i = 1u; i < nt; i++) {
            y[(t0 + i) * params.y_stride + col] = acc[i];
        }
    }
}
