// Reading one row of a package weight (webinfer/formats.py: layouts and value formulas), shared by gemv.wgsl,
// gemm.wgsl (through linear_common.wgsl) and embed.wgsl.
//
// The includer declares `w: array<vec4<u32>>` (qweight), `sm: array<vec4<u32>>` (the meta binding: scales, then
// mins at word params.m_off, then its super-block words at params.sup_off), `qhigh: array<u32>` under QHIGH, and
// `params` with the fields gs, w_stride4, s_stride, h_stride, m_off, sup_off, sup_stride (per row: vec4 of
// qweight, words of scales (= of mins), of qhigh, of super).
// Defines (set by the wrapper's variant function): DTYPE (q4 q4a q8 q5_0 q5_1 q4k q5k q6k q3k q2k iq4nl iq4xs);
// QHIGH (q5_0 q5_1 q5k q6k q3k), MINS (q4a q5_1 q4k q5k), KQUANT (q4k q5k q6k q3k q2k iq4xs: super-block words),
// SUB16 (q6k q3k q2k: a scale per 16 elements), D2 (q6k q3k iq4xs: two f16 d per super word, no dmin),
// BITS2 (q3k q2k: 2-bit qweight), IQ4 (iq4nl iq4xs: the code indexes the codebook KV).
//
// The work unit is a 32-element chunk c of a row (elements 32c .. 32c + 31): one vec4<u32> of nibbles (two for
// q8, half of one for BITS2), one qhigh word (two for q6k), and one scale group (q4 with group 64/128: a group
// spans several chunks; SUB16: two 16-element sub-blocks, scales s and s2).

alias W8 = array<vec4<f32>, 8>;

fn half_at(word: u32, i: u32) -> f32 {
    return unpack2x16float(word)[i & 1u];
}

// byte i % 4 of a word, unsigned (K-quant 6-bit scales and mins) or signed (q6k scales)
fn u8_at(word: u32, i: u32) -> f32 {
    return f32((word >> (8u * (i & 3u))) & 255u);
}
fn i8_at(word: u32, i: u32) -> f32 {
    return f32(bitcast<i32>(word << (24u - 8u * (i & 3u))) >> 24u);
}

#if DTYPE == q8
// the 4 signed bytes of a word as floats
fn i8x4(u: u32) -> vec4<f32> {
    return vec4<f32>(bitcast<vec4<i32>>(vec4<u32>(u << 24u, u << 16u, u << 8u, u)) >> vec4<u32>(24u));
}
#else
#ifdef BITS2
// 4 consecutive 2-bit codes of a word from bit `sh` (element 0 in bits 0-1)
fn lo2(u: u32, sh: u32) -> vec4<f32> {
    return vec4<f32>((vec4<u32>(u) >> (vec4<u32>(0u, 2u, 4u, 6u) + sh)) & vec4<u32>(3u));
}
#else
#ifdef IQ4
// KV (formats.IQ4_KV) as 16 int8 in 4 words: selects and shifts, no dynamic indexing of an array value
const KV0 = 0xbfad9881u;
const KV1 = 0xf6eaddcfu;
const KV2 = 0x26190d01u;
const KV3 = 0x71594535u;

// KV[q] of 4 codes 0..15 (exact integers)
fn kv4(q: vec4<u32>) -> vec4<f32> {
    let b2 = (q & vec4<u32>(4u)) != vec4<u32>(0u);
    let wd = select(select(vec4<u32>(KV0), vec4<u32>(KV1), b2), select(vec4<u32>(KV2), vec4<u32>(KV3), b2),
                    (q & vec4<u32>(8u)) != vec4<u32>(0u));
    let sh = vec4<u32>(24u) - ((q << vec4<u32>(3u)) & vec4<u32>(24u));  // byte q % 4 to the top
    return vec4<f32>(bitcast<vec4<i32>>(wd << sh) >> vec4<u32>(24u));
}
// the 8 nibbles of a word through the codebook
fn lo4(u: u32) -> vec4<f32> {
    return kv4(vec4<u32>(u, u >> 4u, u >> 8u, u >> 12u) & vec4<u32>(15u));
}
fn hi4(u: u32) -> vec4<f32> {
    return kv4(vec4<u32>(u >> 16u, u >> 20u, u >> 24u, u >> 28u) & vec4<u32>(15u));
}
#else
// the 8 nibbles of a word as unsigned values (low nibble = element 0)
fn lo4(u: u32) -> vec4<f32> {
    return vec4<f32>(vec4<u32>(u, u >> 4u, u >> 8u, u >> 12u) & vec4<u32>(15u));
}
fn hi4(u: u32) -> vec4<f32> {
    return vec4<f32>(vec4<u32>(u >> 16u, u >> 20u, u >> 24u, u >> 28u) & vec4<u32>(15u));
}
#endif
#endif
#endif

#ifdef QHIGH
#if DTYPE == q6k
// 16 * bits 4-5 of 4 consecutive elements: 2 bits each from bit `sh` of a qhigh word
fn high4(h: u32, sh: u32) -> vec4<f32> {
    return 16.0 * vec4<f32>((vec4<u32>(h) >> (vec4<u32>(0u, 2u, 4u, 6u) + sh)) & vec4<u32>(3u));
}
#else
#if DTYPE == q3k
// 4 * bit 2 of 4 consecutive elements: 1 bit each from bit `sh` of a qhigh word
fn high4(h: u32, sh: u32) -> vec4<f32> {
    return 4.0 * vec4<f32>((vec4<u32>(h) >> (vec4<u32>(0u, 1u, 2u, 3u) + sh)) & vec4<u32>(1u));
}
#else
// 16 * bit 4 of 4 consecutive elements: 1 bit each from bit `sh` of a qhigh word
fn high4(h: u32, sh: u32) -> vec4<f32> {
    return 16.0 * vec4<f32>((vec4<u32>(h) >> (vec4<u32>(0u, 1u, 2u, 3u) + sh)) & vec4<u32>(1u));
}
#endif
#endif
#endif

// the 32 codes of chunk c of a row as floats (integers, exact): unsigned with the high bits (q8: signed bytes;
// IQ4: the codebook values KV[q])
fn codes(row: u32, c: u32) -> W8 {
#if DTYPE == q8
    let base = row * params.w_stride4 + 2u * c;
    let a = w[base];
    let b = w[base + 1u];
    return W8(i8x4(a.x), i8x4(a.y), i8x4(a.z), i8x4(a.w), i8x4(b.x), i8x4(b.y), i8x4(b.z), i8x4(b.w));
#else
#ifdef BITS2
    let a4 = w[row * params.w_stride4 + c / 2u];
    let a = select(a4.zw, a4.xy, (c & 1u) == 0u);  // 2 words a chunk: .xy of the vec4 for even c, .zw for odd
#ifdef QHIGH
    let h = qhigh[row * params.h_stride + c];
    return W8(lo2(a.x, 0u) + high4(h, 0u), lo2(a.x, 8u) + high4(h, 4u), lo2(a.x, 16u) + high4(h, 8u),
              lo2(a.x, 24u) + high4(h, 12u), lo2(a.y, 0u) + high4(h, 16u), lo2(a.y, 8u) + high4(h, 20u),
              lo2(a.y, 16u) + high4(h, 24u), lo2(a.y, 24u) + high4(h, 28u));
#else
    return W8(lo2(a.x, 0u), lo2(a.x, 8u), lo2(a.x, 16u), lo2(a.x, 24u), lo2(a.y, 0u), lo2(a.y, 8u), lo2(a.y, 16u),
              lo2(a.y, 24u));
#endif
#else
    let a = w[row * params.w_stride4 + c];
#ifdef QHIGH
#if DTYPE == q6k
    let h0 = qhigh[row * params.h_stride + 2u * c];
    let h1 = qhigh[row * params.h_stride + 2u * c + 1u];
    return W8(lo4(a.x) + high4(h0, 0u), hi4(a.x) + high4(h0, 8u), lo4(a.y) + high4(h0, 16u),
              hi4(a.y) + high4(h0, 24u), lo4(a.z) + high4(h1, 0u), hi4(a.z) + high4(h1, 8u),
              lo4(a.w) + high4(h1, 16u), hi4(a.w) + high4(h1, 24u));
#else
    let h = qhigh[row * params.h_stride + c];
    return W8(lo4(a.x) + high4(h, 0u), hi4(a.x) + high4(h, 4u), lo4(a.y) + high4(h, 8u), hi4(a.y) + high4(h, 12u),
              lo4(a.z) + high4(h, 16u), hi4(a.z) + high4(h, 20u), lo4(a.w) + high4(h, 24u), hi4(a.w) + high4(h, 28u));
#endif
#else
    return W8(lo4(a.x), hi4(a.x), lo4(a.y), hi4(a.y), lo4(a.z), hi4(a.z), lo4(a.w), hi4(a.w));
#endif
#endif
#endif
}

// The meta words of 4 rows that serve several consecutive chunks: every meta row is padded to whole vec4s
// (kernels/linear.py pack_meta), so each row's 4 consecutive scale (mins, super) words come in one vec4 load,
// reloaded when `meta_epoch(c)` changes (a uniform branch in the chunk loop). On llvmpipe a load costs the same
// whatever its width, and these loads were half of a GEMV's: now 1 per chunk or less instead of 2-4.
struct MetaW {
    s0: vec4<u32>, s1: vec4<u32>, s2: vec4<u32>, s3: vec4<u32>,  // scales words 4e .. 4e + 3 of rows r.x .. r.w
    m0: vec4<u32>, m1: vec4<u32>, m2: vec4<u32>, m3: vec4<u32>,  // mins (MINS)
    d0: vec4<u32>, d1: vec4<u32>, d2: vec4<u32>, d3: vec4<u32>,  // super-block words (KQUANT)
}

// one word per row: the scales / mins / super word of one chunk
struct MetaC {
    s: vec4<u32>,
    m: vec4<u32>,
    d: vec4<u32>,
}

// the scales (and mins) word of chunk c within its row
fn word_index(c: u32) -> u32 {
#ifdef KQUANT
#ifdef SUB16
    return c / 2u;  // a scales word = 4 sub-blocks of 16 = 2 chunks
#else
    return c / 4u;  // a scales / mins word = 4 sub-blocks of 32 = 4 chunks
#endif
#else
    return c * 32u / params.gs / 2u;  // a word = 2 groups
#endif
}

// the super-block word of chunk c within its row (KQUANT); a vec4 of them spans a multiple of a scales vec4
fn sup_index(c: u32) -> u32 {
#ifdef D2
    return c / 16u;  // two super-blocks of 256 per word
#else
    return c / 8u;
#endif
}

fn meta_epoch(c: u32) -> u32 {
    return word_index(c) / 4u;
}

fn meta_words(r: vec4<u32>, c: u32) -> MetaW {
    var mw: MetaW;
    let s = r * (params.s_stride / 4u) + vec4<u32>(meta_epoch(c));
    mw.s0 = sm[s.x]; mw.s1 = sm[s.y]; mw.s2 = sm[s.z]; mw.s3 = sm[s.w];
#ifdef MINS
    let m = s + vec4<u32>(params.m_off / 4u);
    mw.m0 = sm[m.x]; mw.m1 = sm[m.y]; mw.m2 = sm[m.z]; mw.m3 = sm[m.w];
#endif
#ifdef KQUANT
    let d = r * (params.sup_stride / 4u) + vec4<u32>(params.sup_off / 4u + sup_index(c) / 4u);
    mw.d0 = sm[d.x]; mw.d1 = sm[d.y]; mw.d2 = sm[d.z]; mw.d3 = sm[d.w];
#endif
    return mw;
}

fn pick(a: vec4<u32>, b: vec4<u32>, c: vec4<u32>, d: vec4<u32>, i: u32) -> vec4<u32> {
    return vec4<u32>(a[i], b[i], c[i], d[i]);
}

// chunk c's words out of the epoch's vectors
fn meta_chunk(m4: MetaW, c: u32) -> MetaC {
    var mw: MetaC;
    let i = word_index(c) % 4u;
    mw.s = pick(m4.s0, m4.s1, m4.s2, m4.s3, i);
#ifdef MINS
    mw.m = pick(m4.m0, m4.m1, m4.m2, m4.m3, i);
#endif
#ifdef KQUANT
    mw.d = pick(m4.d0, m4.d1, m4.d2, m4.d3, sup_index(c) % 4u);
#endif
    return mw;
}

// meta word i (value_at: one element at a time)
fn smw(i: u32) -> u32 {
    return sm[i / 4u][i % 4u];
}

// per-row f32 factors of one chunk (value formulas of formats.py):
//   q4 q8 q5_0 iq4nl: s = scale;  q4a q5_1: s = scale, m = min;  q4k q5k: s = d * scale, m = dmin * min;
//   q6k q3k: s = d * scale (elements 0-15), s2 = d * scale (16-31);  iq4xs: s = d * scale;
//   q2k: s, m = d * (scale & 15), dmin * (scale >> 4) (elements 0-15), s2, m2 (16-31)
struct Scales {
    s: vec4<f32>,
    s2: vec4<f32>,
    m: vec4<f32>,
#if DTYPE == q2k
    m2: vec4<f32>,
#endif
}

fn halves(wd: vec4<u32>, i: u32) -> vec4<f32> {
    return vec4<f32>(half_at(wd.x, i), half_at(wd.y, i), half_at(wd.z, i), half_at(wd.w, i));
}

fn chunk_scales(m4: MetaW, c: u32) -> Scales {
    let mw = meta_chunk(m4, c);
    var sc: Scales;
#ifdef KQUANT
#ifdef D2
    let d = halves(mw.d, c / 8u);  // super-block c / 8, two per word
#ifdef SUB16
    let j = 2u * c;  // sub-block of the chunk's first 16 elements
    sc.s = d * vec4<f32>(i8_at(mw.s.x, j), i8_at(mw.s.y, j), i8_at(mw.s.z, j), i8_at(mw.s.w, j));
    sc.s2 = d * vec4<f32>(i8_at(mw.s.x, j + 1u), i8_at(mw.s.y, j + 1u), i8_at(mw.s.z, j + 1u), i8_at(mw.s.w, j + 1u));
#else
    sc.s = d * vec4<f32>(i8_at(mw.s.x, c), i8_at(mw.s.y, c), i8_at(mw.s.z, c), i8_at(mw.s.w, c));  // iq4xs
#endif
#else
    let d = halves(mw.d, 0u);
    let dmin = halves(mw.d, 1u);
#ifdef SUB16
    // q2k: bytes 2c % 4 and 2c % 4 + 1 of the word, scale in the low nibble, min in the high one
    let b = mw.s >> vec4<u32>(16u * (c & 1u));
    let b2 = b >> vec4<u32>(8u);
    sc.s = d * vec4<f32>(b & vec4<u32>(15u));
    sc.m = dmin * vec4<f32>((b >> vec4<u32>(4u)) & vec4<u32>(15u));
    sc.s2 = d * vec4<f32>(b2 & vec4<u32>(15u));
    sc.m2 = dmin * vec4<f32>((b2 >> vec4<u32>(4u)) & vec4<u32>(15u));
#else
    sc.s = d * vec4<f32>(u8_at(mw.s.x, c), u8_at(mw.s.y, c), u8_at(mw.s.z, c), u8_at(mw.s.w, c));
    sc.m = dmin * vec4<f32>(u8_at(mw.m.x, c), u8_at(mw.m.y, c), u8_at(mw.m.z, c), u8_at(mw.m.w, c));
#endif
#endif
#else
    let g = c * 32u / params.gs;
    sc.s = halves(mw.s, g);
#ifdef MINS
    sc.m = halves(mw.m, g);
#endif
#endif
    return sc;
}

// one element's code as codes() gives it (the tail of a row and the embedding gather)
fn code_at(row: u32, k: u32) -> f32 {
#if DTYPE == q8
    return i8_at(w[row * params.w_stride4 + k / 16u][(k / 4u) % 4u], k);
#else
#ifdef BITS2
    var q = (w[row * params.w_stride4 + k / 64u][(k / 16u) % 4u] >> (2u * (k % 16u))) & 3u;
#ifdef QHIGH
    q |= ((qhigh[row * params.h_stride + k / 32u] >> (k % 32u)) & 1u) << 2u;
#endif
    return f32(q);
#else
    var q = (w[row * params.w_stride4 + k / 32u][(k / 8u) % 4u] >> (4u * (k % 8u))) & 15u;
#ifdef QHIGH
#if DTYPE == q6k
    q |= ((qhigh[row * params.h_stride + k / 16u] >> (2u * (k % 16u))) & 3u) << 4u;
#else
    q |= ((qhigh[row * params.h_stride + k / 32u] >> (k % 32u)) & 1u) << 4u;
#endif
#endif
#ifdef IQ4
    return kv4(vec4<u32>(q)).x;
#else
    return f32(q);
#endif
#endif
#endif
}

// W[row, k] exactly as formats.py (and gguf.quants.dequantize) computes it, operation for operation
fn value_at(row: u32, k: u32) -> f32 {
    let q = code_at(row, k);
#ifdef KQUANT
#ifdef D2
#ifdef SUB16
    let s = k / 16u;
#else
    let s = k / 32u;
#endif
    let d = half_at(smw(params.sup_off + row * params.sup_stride + k / 512u), k / 256u);
#if DTYPE == q6k
    return (d * i8_at(smw(row * params.s_stride + s / 4u), s)) * (q - 32.0);
#else
#if DTYPE == q3k
    return (d * i8_at(smw(row * params.s_stride + s / 4u), s)) * (q - 4.0);
#else
    return (d * i8_at(smw(row * params.s_stride + s / 4u), s)) * q;  // iq4xs: q = KV[code]
#endif
#endif
#else
#ifdef SUB16
    let s = k / 16u;
    let dd = unpack2x16float(smw(params.sup_off + row * params.sup_stride + k / 256u));
    let b = (smw(row * params.s_stride + s / 4u) >> (8u * (s % 4u))) & 255u;  // q2k: scale | min << 4
    return (dd.x * f32(b & 15u)) * q - (dd.y * f32(b >> 4u));
#else
    let s = k / 32u;
    let dd = unpack2x16float(smw(params.sup_off + row * params.sup_stride + k / 256u));
    let sc = u8_at(smw(row * params.s_stride + s / 4u), s);
    let mn = u8_at(smw(params.m_off + row * params.s_stride + s / 4u), s);
    return (dd.x * sc) * q - (dd.y * mn);
#endif
#endif
#else
    let g = k / params.gs;
    let s = half_at(smw(row * params.s_stride + g / 2u), g);
#ifdef MINS
    return q * s + half_at(smw(params.m_off + row * params.s_stride + g / 2u), g);
#else
#ifdef IQ4
    return s * q;  // iq4nl: q = KV[code]
#else
#if DTYPE == q4
    return (q - 8.0) * s;
#else
#if DTYPE == q5_0
    return (q - 16.0) * s;
#else
    return q * s;
#endif
#endif
#endif
#endif
#endif
}
