// webinfer's CPU engine: the transformer's kernels in C for wasm32 + SIMD128, no libc (no Emscripten).
//
// Built by scripts/build-wasm.sh into webinfer/cpu/kernels.wasm (base SIMD128) and kernels-relaxed.wasm
// (-DRELAXED: relaxed-SIMD integer dot products in fast mode). The same module runs in the page (JS WebAssembly)
// and natively (wasmtime); Python (webinfer/cpu/runner.py) owns the linear memory layout: it places weights, the
// paged KV cache and every scratch buffer at offsets it allocates, and passes only integer offsets here.
//
// Weights use the package encodings of webinfer/formats.py (read its docstring): every format decodes in units of
// 32 elements, each unit two halves of 16 with a coefficient pair (a, b) such that value = a * q + b, q the
// element's code (q4k/q5k/q6k sub-block scales fold into a; offsets into b). A row's dot product with x is then
//     sum over halves of  a * sum(q * x) + b * sum(x)
// with the half-sums of x computed once per activation row (xsum16). Fast mode quantizes each 32-element block of
// x to int8 with one f32 scale (as llama.cpp's Q8 activations) and sums q * x in integers; exact mode keeps f32
// precision: x as exact integer parts per element (EXACT_INT, EXACT_I8) for the formats with one scale per unit,
// f32 for the rest.
// A row's result depends only on that row (no cross-row reductions), so a token gives the same numbers alone,
// batched, or in a prefill chunk (batch invariance).
#include <stdint.h>
#include <wasm_simd128.h>

#define EXPORT(name) __attribute__((export_name(#name)))
#define INLINE static inline __attribute__((always_inline))

typedef uint32_t u32;
typedef int32_t i32;
typedef uint8_t u8;
typedef int8_t i8;
typedef uint16_t u16;
typedef int16_t i16;

// clang lowers struct copies and zeroing loops to these; bulk memory makes them single instructions
void *memcpy(void *d, const void *s, unsigned long n) { __builtin_memcpy(d, s, n); return d; }
void *memset(void *d, int c, unsigned long n) { __builtin_memset(d, c, n); return d; }

// ------------------------------------------------------------------------------------------------ scalar math

INLINE u32 f32_bits(float f) { union { float f; u32 u; } v = {f}; return v.u; }
INLINE float bits_f32(u32 u) { union { u32 u; float f; } v = {u}; return v.f; }

// f16 -> f32 without branches: the f16 bits shifted into an f32 exponent/mantissa read 2^-112 times the value, so
// one exact multiplication fixes it (normals and subnormals alike). Inf/NaN scales are not supported (a packed
// scale is always finite).
INLINE float f16_to_f32(u32 h) {
    return bits_f32(((h & 0x8000u) << 16) | f32_bits(bits_f32((h & 0x7fffu) << 13) * 0x1p112f));
}

// exp(x) in f32, within ~1 ulp: x = n ln2 + r, |r| <= ln2/2, exp(r) by a degree-7 Taylor polynomial
static float expf_(float x) {
    if (x != x) return x;
    if (x < -103.972f) return 0.0f;
    if (x > 88.7228f) return bits_f32(0x7f800000u);
    float n = __builtin_rintf(x * 1.44269504088896341f);
    float r = x - n * 0.693145751953125f;  // ln2 split in two for an exact first product
    r = r - n * 1.428606765330187e-06f;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    i32 k = (i32)n;
    if (k < -126) {  // subnormal result: scale in two steps
        return p * bits_f32((u32)(k + 126 + 127) << 23) * bits_f32(1u << 23);
    }
    if (k > 127) return p * bits_f32(254u << 23) * 2.0f;  // 2^128 is not an f32: 2^127 * 2
    return p * bits_f32((u32)(k + 127) << 23);
}

// ------------------------------------------------------------------------------------------------ weights

enum { F_F32 = 0, F_Q4 = 1, F_Q4A = 2, F_Q8 = 3, F_Q5_0 = 4, F_Q5_1 = 5, F_Q4K = 6, F_Q5K = 7, F_Q6K = 8, F_Q3K = 9,
       F_Q2K = 10, F_IQ4NL = 11, F_IQ4XS = 12 };
// q6k after wi_repack: q8's packed layout with a scale per 16-element half (codes q - 32). Not a package format:
// the kernels' name for it.
#define F_Q8H 13u
// q5_1 and q5k after wi_repack: q8's packed layout holding the codes (0 .. 31) and a (a, b) pair per unit
#define F_Q8B 14u
// q2k after wi_repack: q4a's packed layout (nibble codes 0 .. 3) with an (a, b) pair per 16-element half
#define F_Q4H 15u
// q3k after wi_repack: q4's packed layout (nibble codes 0 .. 7) with a scale per 16-element half, value (q - 4) a
#define F_Q4Z 16u

// One weight matrix [n, k] in a package encoding; component addresses are 0 when the format has none.
typedef struct {
    u32 dtype, n, k, kp, gs;
    const u8 *qweight, *qhigh, *scales, *mins, *super;
    const float *bias;  // [n] or 0
    u32 packed;         // 1: repacked by wi_repack into the PACKED layout at qweight (scales, mins, qhigh unused)
} Weight;

INLINE u32 row_bytes_q(const Weight *w) {
    return w->dtype == F_Q8 ? w->kp : w->dtype == F_Q2K || w->dtype == F_Q3K ? w->kp / 4 : w->kp / 2;
}

// the formats whose unit_codes are signed bytes: q8, and the iq4 formats' codebook values KV[q] (-127 .. 113)
#define SIGNED_CODES(dt) ((dt) == F_Q8 || (dt) == F_IQ4NL || (dt) == F_IQ4XS)

// Codes of unit u (elements [32u, 32u + 32)) of a row as two u8x16 vectors (SIGNED_CODES: i8x16) v0, v1, each to
// be multiplied with 16 activations of the unit's (ordered) activation block xb: v0 . xb[0..16) + v1 . xb[16..32).
//   q8: natural order, xb = x (v0: half 0, v1: half 1).
//   the others: v0 = the even elements 0, 2, .., 30 (the nibble formats' low nibbles), v1 = the odd ones (the
//   high nibbles), so no shuffles: the activations are permuted instead (ODD_EVEN, once per call), xb = x[0],
//   x[2], .., x[30], x[1], x[3], .., x[31]. Lanes 0-7 of either vector belong to half 0 (elements < 16), lanes
//   8-15 to half 1.
#define ODD_EVEN(dt) ((dt) != F_Q8 && (dt) != F_F32)
INLINE void unit_codes(u32 dt, const u8 *qrow, const u8 *hrow, u32 u, v128_t *c0, v128_t *c1) {
    if (dt == F_Q8) {
        *c0 = wasm_v128_load(qrow + 32 * u);
        *c1 = wasm_v128_load(qrow + 32 * u + 16);
        return;
    }
    v128_t m = wasm_i8x16_splat(0x0f), v0, v1;
    if (dt == F_Q2K || dt == F_Q3K) {
        // 2-bit codes: byte i of the unit's 8 holds elements 4i .. 4i + 3 at bits 2 (e % 4). Its nibbles interleaved
        // put elements 2l, 2l + 1 in lane l's bits 0-1 and 2-3
        v128_t b = wasm_v128_load64_zero(qrow + 8 * u), m3 = wasm_i8x16_splat(3);
        v128_t n = wasm_i8x16_shuffle(wasm_v128_and(b, m), wasm_v128_and(wasm_u16x8_shr(b, 4), m), 0, 16, 1, 17, 2,
                                      18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
        v0 = wasm_v128_and(n, m3);
        v1 = wasm_v128_and(wasm_u16x8_shr(n, 2), m3);
    } else {
        v128_t b = wasm_v128_load(qrow + 16 * u);  // byte i: element 2i (low nibble), 2i + 1 (high nibble)
        v0 = wasm_v128_and(b, m);
        v1 = wasm_v128_and(wasm_u16x8_shr(b, 4), m);
    }
    if (dt == F_Q5_0 || dt == F_Q5_1 || dt == F_Q5K || dt == F_Q3K) {
        // bit 4 (q3k: bit 2) of element e = bit e % 32 of the unit's word: lane i (elements 2i, 2i + 1) reads
        // byte i / 4
        v128_t h = wasm_i8x16_swizzle(wasm_v128_load32_splat(hrow + 4 * u),
                                      wasm_i8x16_const(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3));
        v128_t be = wasm_i8x16_const(1, 4, 16, 64, 1, 4, 16, 64, 1, 4, 16, 64, 1, 4, 16, 64);
        v128_t bo = wasm_i8x16_const(2, 8, 32, -128, 2, 8, 32, -128, 2, 8, 32, -128, 2, 8, 32, -128);
        v128_t x10 = wasm_i8x16_splat(dt == F_Q3K ? 0x04 : 0x10);
        v0 = wasm_v128_or(v0, wasm_v128_and(wasm_i8x16_eq(wasm_v128_and(h, be), be), x10));
        v1 = wasm_v128_or(v1, wasm_v128_and(wasm_i8x16_eq(wasm_v128_and(h, bo), bo), x10));
    } else if (dt == F_IQ4NL || dt == F_IQ4XS) {  // index -> codebook value (formats.py IQ4_KV), as signed bytes
        v128_t kv = wasm_i8x16_const(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113);
        v0 = wasm_i8x16_swizzle(kv, v0);
        v1 = wasm_i8x16_swizzle(kv, v1);
    } else if (dt == F_Q6K) {
        // bits 4-5 of element e = bits 2 (e % 16) .. +1 of word e / 16, i.e. of byte e / 4 of the unit's 8 bytes
        // at bit 2 (e % 4): lane i (elements 2i, 2i + 1) reads byte i / 2
        v128_t h = wasm_i8x16_swizzle(wasm_v128_load64_splat(hrow + 8 * u),
                                      wasm_i8x16_const(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7));
        v128_t e1 = wasm_i8x16_const(1, 16, 1, 16, 1, 16, 1, 16, 1, 16, 1, 16, 1, 16, 1, 16);
        v128_t e2 = wasm_i8x16_const(2, 32, 2, 32, 2, 32, 2, 32, 2, 32, 2, 32, 2, 32, 2, 32);
        v128_t o1 = wasm_i8x16_const(4, 64, 4, 64, 4, 64, 4, 64, 4, 64, 4, 64, 4, 64, 4, 64);
        v128_t o2 = wasm_i8x16_const(8, -128, 8, -128, 8, -128, 8, -128, 8, -128, 8, -128, 8, -128, 8, -128);
        v128_t x10 = wasm_i8x16_splat(0x10), x20 = wasm_i8x16_splat(0x20);
        v0 = wasm_v128_or(v0, wasm_v128_or(wasm_v128_and(wasm_i8x16_eq(wasm_v128_and(h, e1), e1), x10),
                                           wasm_v128_and(wasm_i8x16_eq(wasm_v128_and(h, e2), e2), x20)));
        v1 = wasm_v128_or(v1, wasm_v128_or(wasm_v128_and(wasm_i8x16_eq(wasm_v128_and(h, o1), o1), x10),
                                           wasm_v128_and(wasm_i8x16_eq(wasm_v128_and(h, o2), o2), x20)));
    }
    *c0 = v0;
    *c1 = v1;
}

// A row's scale components, located once per row (no divisions in the unit loop)
typedef struct {
    const u8 *sc, *mn, *sup;
    u32 gshift;  // scale group of unit u = u >> gshift (q4/q4a/q8/q5: group_size / 32 units per group)
} RowCoefs;

INLINE RowCoefs row_coefs(u32 d, const Weight *w, u32 row) {
    RowCoefs c = {0, 0, 0, 0};
    if (d == F_Q4K || d == F_Q5K) {
        c.sc = w->scales + row * (w->kp / 32);
        c.mn = w->mins + row * (w->kp / 32);
        c.sup = w->super + row * (w->kp / 256) * 4;
    } else if (d == F_Q6K || d == F_Q3K || d == F_IQ4XS) {  // a byte per sub-block (iq4xs: of 32), two d a word
        c.sc = w->scales + row * (w->kp / (d == F_IQ4XS ? 32 : 16));
        c.sup = w->super + row * ((w->kp / 256 + 1) / 2) * 4;
    } else if (d == F_Q2K) {  // a byte per 16-element sub-block, a (d, dmin) word per super-block
        c.sc = w->scales + row * (w->kp / 16);
        c.sup = w->super + row * (w->kp / 256) * 4;
    } else if (d != F_F32) {
        u32 bytes = (w->kp / w->gs + 1) / 2 * 4;  // f16 per group, two per word
        c.sc = w->scales + row * bytes;
        c.mn = w->mins ? w->mins + row * bytes : 0;
        c.gshift = __builtin_ctz(w->gs / 32);
    }
    return c;
}

// (a, b) of the two halves of unit u: value = a * q + b
INLINE void unit_coefs(u32 d, const RowCoefs *c, u32 u, float *a0, float *b0, float *a1, float *b1) {
    if (d == F_Q4K || d == F_Q5K) {
        u32 sup = ((const u32 *)c->sup)[u / 8];
        float dd = f16_to_f32(sup & 0xffff), dm = f16_to_f32(sup >> 16);
        float a = dd * (float)c->sc[u], b = -(dm * (float)c->mn[u]);
        *a0 = *a1 = a;
        *b0 = *b1 = b;
        return;
    }
    if (d == F_Q6K || d == F_Q3K) {
        float dd = f16_to_f32(((const u16 *)c->sup)[u / 8]), z = d == F_Q6K ? -32.0f : -4.0f;
        const i8 *sc = (const i8 *)c->sc + 2 * u;
        *a0 = dd * (float)sc[0];
        *a1 = dd * (float)sc[1];
        *b0 = z * *a0;
        *b1 = z * *a1;
        return;
    }
    if (d == F_Q2K) {  // scale in the low nibble, min in the high one
        u32 sup = ((const u32 *)c->sup)[u / 8];
        float dd = f16_to_f32(sup & 0xffff), dm = f16_to_f32(sup >> 16);
        const u8 *sc = c->sc + 2 * u;
        *a0 = dd * (float)(sc[0] & 15);
        *a1 = dd * (float)(sc[1] & 15);
        *b0 = -(dm * (float)(sc[0] >> 4));
        *b1 = -(dm * (float)(sc[1] >> 4));
        return;
    }
    if (d == F_IQ4XS) {
        *a0 = *a1 = f16_to_f32(((const u16 *)c->sup)[u / 8]) * (float)((const i8 *)c->sc)[u];
        *b0 = *b1 = 0.0f;
        return;
    }
    u32 g = u >> c->gshift;
    float s = f16_to_f32(((const u16 *)c->sc)[g]);
    float b = 0.0f;
    if (d == F_Q4) b = -8.0f * s;
    else if (d == F_Q5_0) b = -16.0f * s;
    else if (d == F_Q4A || d == F_Q5_1) b = f16_to_f32(((const u16 *)c->mn)[g]);
    *a0 = *a1 = s;
    *b0 = *b1 = b;
}

INLINE const u8 *qhigh_row(const Weight *w, u32 row) {
    if (w->packed) return 0;
    if (w->dtype == F_Q6K) return w->qhigh + row * (w->kp / 4);
    return w->qhigh ? w->qhigh + row * (w->kp / 8) : 0;
}

// ------------------------------------------------------------------------------------------------ packed weights
//
// The decode GEMV's layout (wi_repack, at load): q4, q4a and q8 with one scale per 32-element unit, and the other
// formats as one of them (below), are rewritten so that one SIMD lane holds one weight row. Rows go in groups of 4
// (a last partial group padded with zero rows); a group's units follow one another, each one block of
//     nibble formats (q4, q4a): 64 code bytes, then f32 a[4] and f32 b[4] (value = a * q + b; q4: b = -8 a)
//     q8:                       128 code bytes, then f32 a[4]
//     q6k (F_Q8H):              q8's 128 code bytes (q - 32), then f32 a0[4] (elements 0-15), a1[4] (16-31)
//     q5_1, q5k (F_Q8B):        q8's 128 code bytes (q), then f32 a[4] and f32 b[4]
//     q2k (F_Q4H):              q4a's 64 code bytes (q), then f32 a0[4], a1[4], b0[4], b1[4] (per half, as F_Q8H)
//     q3k (F_Q4Z):              q4a's 64 code bytes (q), then f32 a0[4], a1[4] (b = -4 a per half)
// Code bytes come in 16-byte vectors whose byte 4r + j belongs to row r of the group: nibble vector t (0..3) holds
// element 8t + j in its low nibble and element 8t + 4 + j in its high nibble; q8 vector t (0..7) holds element
// 4t + j. Against activations broadcast per 4 elements, one byte or i16 dot product then sums 4 elements of 4 rows
// at once, the unit's integer sums end as one lane per row without a horizontal reduction, the scales are f32 (no
// f16 decode in the loop) and 4 rows share every activation load. Per row the arithmetic is a sequence over units,
// so a row's result does not depend on its neighbours (batch invariance) nor on the build (exact integer sums).
// Resident size per 32 weights: q4a 24 bytes (package 20), q4 24 (18), q8 36 (34).
// The other formats take these layouts without changing a weight's value: q4k as q4a (a = d * sc and
// b = -(dmin * m) are exact f32 products of an f16 and a 6-bit integer: 24 bytes against the package's 18.5),
// q5_0 as q8 (codes q - 16, a = s: 36 bytes against 22), q6k as F_Q8H (codes q - 32, a = d * sc per half, exact:
// 40 bytes against 26), q5_1 and q5k as F_Q8B (codes q, (a, b) per unit: 40 bytes against 24 and 22.5). They are
// what llama.cpp's Q4_K_M and Q5_K_M files hold (q5_0 where a K-quant needs K % 256 == 0 and the row is shorter,
// as Gemma 3's 640). Their per-row kernels decoded scales per unit in scalar code: Gemma 3 270M's q5_0 and q4k
// GEMVs read 4-7 GB/s, its q6k one 2 GB/s (a byte per code already), where the packed q8 and q4a ones read 13-20
// (docs/cpu-backend.md, "Weight formats").
// The low-bit GGUF formats likewise: iq4nl and iq4xs as q8 (codes KV[q], a = s or d * sc: 36 bytes against 18
// and 17), q2k as F_Q4H (its (a, b) change every 16 elements: 32 bytes against 10.5), q3k as F_Q4Z (a = d * sc
// per half: 24 bytes against 13.75). Both keep nibble codes, which the relaxed build's byte dots read; q3k as
// F_Q8H (codes q - 4) took 40 bytes and its fast GEMV 1.4x the time (docs/cpu-backend.md).
#define PACKED_AS(dt)                                                                                      \
    ((dt) == F_Q4K ? F_Q4A : (dt) == F_Q5_0 || (dt) == F_IQ4NL || (dt) == F_IQ4XS ? F_Q8                   \
     : (dt) == F_Q6K ? F_Q8H : (dt) == F_Q5_1 || (dt) == F_Q5K ? F_Q8B : (dt) == F_Q2K ? F_Q4H              \
     : (dt) == F_Q3K ? F_Q4Z : (dt))
#define PACKABLE(dt, w)                                                                                            \
    ((((dt) == F_Q4 || (dt) == F_Q4A || (dt) == F_Q8 || (dt) == F_Q5_0 || (dt) == F_Q5_1 || (dt) == F_IQ4NL) &&    \
      (w)->gs == 32) ||                                                                                            \
     (dt) == F_Q4K || (dt) == F_Q5K || (dt) == F_Q6K || (dt) == F_Q3K || (dt) == F_Q2K || (dt) == F_IQ4XS)
#define BYTE_PACKED(dt) ((dt) == F_Q8 || (dt) == F_Q8H || (dt) == F_Q8B)  // a byte per code, read as signed
// a b term (mins: the second f32[4] of a block; F_Q4H: the 3rd and 4th; F_Q4Z: -4 a, no f32 of its own)
#define HAS_B(dt) ((dt) != F_Q8 && (dt) != F_Q8H)
#define HALVES(dt) ((dt) == F_Q8H || (dt) == F_Q4H || (dt) == F_Q4Z)  // coefficients per 16-element half
#define PCODES(dt) (BYTE_PACKED(dt) ? 128u : 64u)
#define PBLK(dt) ((dt) == F_Q8 ? 144u : (dt) == F_Q8H || (dt) == F_Q8B ? 160u : (dt) == F_Q4H ? 128u : 96u)

// one unit of one row in element order: codes (q8: as i8) and the row's (a, b) of each half: ab = a0, b0, a1, b1
static void unit_elements(const Weight *w, u32 row, u32 u, u8 *codes, float *ab) {
    u32 dt = w->dtype;
    v128_t c0, c1;
    u8 raw[32] __attribute__((aligned(16)));
    unit_codes(dt, w->qweight + row * row_bytes_q(w), qhigh_row(w, row), u, &c0, &c1);
    wasm_v128_store(raw, c0);
    wasm_v128_store(raw + 16, c1);
    for (u32 i = 0; i < 32; i++) codes[i] = raw[ODD_EVEN(dt) ? (i % 2) * 16 + i / 2 : i];
    RowCoefs rc = row_coefs(dt, w, row);
    unit_coefs(dt, &rc, u, ab, ab + 1, ab + 2, ab + 3);
}

// bytes of w's packed layout (0: w is not packable or already packed)
EXPORT(wi_repack_bytes) u32 wi_repack_bytes(const Weight *w) {
    if (w->packed || !PACKABLE(w->dtype, w)) return 0;
    return (w->n + 3) / 4 * (w->kp / 32) * PBLK(PACKED_AS(w->dtype));
}

// Writes the packed layout of units [u0, u1) of every row of w (packable, not packed) to dst, (u1 - u0) * 32 columns
// from column 32 u0, and describes it in *out: a packed matrix of its own (no bias).
static void repack_units(const Weight *w, u8 *dst, u32 u0, u32 u1, Weight *out) {
    u32 dt = PACKED_AS(w->dtype), nu = u1 - u0, nc = PCODES(dt);
    // q5_0's and q6k's codes as signed bytes: q - 16, q - 32 (their b = -16 a, -32 a then vanishes); the iq4
    // formats' are KV[q] already
    u8 zero = w->dtype == F_Q5_0 ? 16 : w->dtype == F_Q6K ? 32 : 0;
    u8 codes[32];
    for (u32 g = 0; g < (w->n + 3) / 4; g++)
        for (u32 u = 0; u < nu; u++) {
            u8 *blk = dst + (g * nu + u) * PBLK(dt);
            float *coef = (float *)(blk + nc);
            for (u32 i = 0; i < PBLK(dt); i++) blk[i] = 0;
            for (u32 r = 0; r < 4 && 4 * g + r < w->n; r++) {
                float ab[4];
                unit_elements(w, 4 * g + r, u0 + u, codes, ab);
                for (u32 t = 0; t < nc / 16; t++)
                    for (u32 j = 0; j < 4; j++)
                        blk[16 * t + 4 * r + j] = BYTE_PACKED(dt) ? (u8)(codes[4 * t + j] - zero)
                                                                    : (u8)(codes[8 * t + j] | codes[8 * t + 4 + j] << 4);
                coef[r] = ab[0];
                if (HALVES(dt)) coef[4 + r] = ab[2];
                else if (HAS_B(dt)) coef[4 + r] = ab[1];
                if (dt == F_Q4H) {
                    coef[8 + r] = ab[1];
                    coef[12 + r] = ab[3];
                }
            }
        }
    Weight v = {dt, w->n, (w->k < 32 * u1 ? w->k : 32 * u1) - 32 * u0, 32 * nu, 32, dst, 0, 0, 0, 0, 0, 1};
    *out = v;
}

// Writes w's packed layout to dst (wi_repack_bytes bytes, not overlapping w's components) and points w at it.
EXPORT(wi_repack) void wi_repack(Weight *w, u8 *dst) {
    Weight v;
    repack_units(w, dst, 0, w->kp / 32, &v);
    v.bias = w->bias;
    *w = v;
}

// w's units [u0, u1) packed as a matrix of their own at dst, described at *out (both from the runner): a K part of
// w, for step_body's split_k (wi_repack_bytes of w times (u1 - u0) / (kp / 32) bytes). w keeps its layout.
EXPORT(wi_repack_part) void wi_repack_part(const Weight *w, u8 *dst, u32 u0, u32 u1, Weight *out) {
    repack_units(w, dst, u0, u1, out);
}

// a packed row to f32, in dequant_row's order
static void dequant_packed_row(const Weight *w, u32 row, float *out) {
    u32 dt = w->dtype, nu = w->kp / 32, r = row % 4;
    for (u32 u = 0; u < nu; u++) {
        const u8 *blk = w->qweight + ((row / 4) * nu + u) * PBLK(dt);
        const float *coef = (const float *)(blk + PCODES(dt));
        for (u32 i = 0; i < 32 && 32 * u + i < w->k; i++) {
            float v, a = coef[HALVES(dt) && i >= 16 ? 4 + r : r];
            if (dt == F_Q8B) {
                v = a * (float)blk[16 * (i / 4) + 4 * r + i % 4] + coef[4 + r];
            } else if (BYTE_PACKED(dt)) {
                v = (float)(i8)blk[16 * (i / 4) + 4 * r + i % 4] * a;
            } else {
                u8 byte = blk[16 * (i / 8) + 4 * r + i % 4];
                float q = (float)(i % 8 < 4 ? byte & 15 : byte >> 4);
                v = dt == F_Q4 ? (q - 8.0f) * a : dt == F_Q4Z ? (q - 4.0f) * a
                  : a * q + coef[(dt == F_Q4H ? (i < 16 ? 8 : 12) : 4) + r];
            }
            out[32 * u + i] = v;
        }
    }
}

// Dequantize one row to f32 (the embedding gather, and the tests' decoder check): value = a * q + b, in the order
// formats.py gives (q4k: (d * sc) * q - dmin * m), so repacked GGUF rows decode as gguf.quants does.
static void dequant_row(const Weight *w, u32 row, float *out) {
    if (w->packed == 1) {
        dequant_packed_row(w, row, out);
        return;
    }
    if (w->dtype == F_F32) {
        const float *src = (const float *)w->qweight + row * w->k;
        for (u32 i = 0; i < w->k; i++) out[i] = src[i];
        return;
    }
    const u8 *qrow = w->qweight + row * row_bytes_q(w), *hrow = qhigh_row(w, row);
    u8 codes[32] __attribute__((aligned(16)));
    u32 dt = w->dtype;
    RowCoefs rc = row_coefs(dt, w, row);
    for (u32 u = 0; u < w->kp / 32; u++) {
        v128_t c0, c1;
        unit_codes(dt, qrow, hrow, u, &c0, &c1);
        wasm_v128_store(codes, c0);
        wasm_v128_store(codes + 16, c1);
        float a0, b0, a1, b1;
        unit_coefs(dt, &rc, u, &a0, &b0, &a1, &b1);
        for (u32 i = 0; i < 32 && 32 * u + i < w->k; i++) {
            u32 ci = ODD_EVEN(w->dtype) ? (i % 2) * 16 + i / 2 : i;  // where element i sits in codes[]
            float q = SIGNED_CODES(w->dtype) ? (float)(i8)codes[ci] : (float)codes[ci];
            float a = i < 16 ? a0 : a1;
            u32 d = w->dtype;
            float v;
            if (d == F_Q4 || d == F_Q5_0 || d == F_Q6K || d == F_Q3K)
                v = (q - (d == F_Q4 ? 8.0f : d == F_Q5_0 ? 16.0f : d == F_Q6K ? 32.0f : 4.0f)) * a;
            else if (SIGNED_CODES(d)) v = q * a;  // (iq4: q = KV[index])
            else v = a * q + (i < 16 ? b0 : b1);  // q4a/q5_1: q * s + m; q4k/q5k/q2k: (d sc) q - (dmin m)
            out[32 * u + i] = v;
        }
    }
}

// ------------------------------------------------------------------------------------------------ activations

// Prepared activation rows: x itself (f32, rows of x_stride floats), sums of each 16-element half, and in fast
// mode int8 codes (pre-widened to i16 for the base-SIMD dot) with one scale per 32-element block.
typedef struct {
    const float *x;
    u32 x_stride;
    float *xsum;  // [rows, kp / 16]
    i8 *xq;       // [rows, kp]
    i16 *xw;      // [rows, kp]
    float *xd;    // [rows, kp / 32]
    float *xs32;  // [rows, kp / 32]: sums of whole units (the 4-unit path's offset term)
    i16 *xl;      // [rows, kp]: exact mode's low halves (EXACT_INT)
    u32 n0, n1;   // the output rows this call computes: [0, n), or a thread's share (n0 a multiple of 4)
    float *xs16;  // [rows, kp / 16]: the packed layout's sums of halves (F_Q4H's and F_Q4Z's b terms)
} Acts;

// linear()'s activation modes: f32, int8 / int16 codes per 32-block (fast mode), and exact mode's integer form for
// the formats with one scale per unit (VEC4): each element as hi * D + lo * D / 32768 with int16 hi and lo
// (D = block amax / 32767). That is x to within 2^-31 of its block's largest element: below f32's own rounding of
// any dot product over the block, so this is exact mode's precision with the integer dot products' speed. The
// packed layout's EXACT_INT (prepare_packed) rounds x to 2^-24 of the block's largest element instead, f32's own
// rounding of that element, so that its digits fit int8 dots (EXACT_I8: the relaxed build's packed GEMV). Measured
// on SmolLM2, 17 teacher-forced steps: RMS logit distance from an f64 reference 1.35e-5 (the 2^-31 form: 1.08e-5;
// the f32 numpy reference: 0.89e-5).
enum { ACT_F32 = 0, ACT_I8 = 1, ACT_I16 = 2, EXACT_INT = 3, EXACT_I8 = 4 };

INLINE float hsum(v128_t v) {
    return (wasm_f32x4_extract_lane(v, 0) + wasm_f32x4_extract_lane(v, 1)) +
           (wasm_f32x4_extract_lane(v, 2) + wasm_f32x4_extract_lane(v, 3));
}

// x rows have k elements; the weights' padding up to kp multiplies zeros. `perm`: the nibble formats' block order
// (ODD_EVEN): element i of each 32-block goes to slot (i % 2) * 16 + i / 2. The copy (exact mode) and the int8
// codes (fast mode) are written in that order; the half-sums xsum stay in natural order (half = elements 16h..).
// prepare = 0: the arrays already hold this x's preparation for the same layout (the previous linear() call, on
// a matrix with the same format, k and group size: q/k/v, gate/up); only the pointers are set.
static void prepare_acts(Acts *A, u32 rows, u32 k, u32 kp, int fast, int perm, float *xpad, int prepare) {
    for (u32 r = 0; r < rows && prepare; r++) {
        const float *x = A->x + r * A->x_stride;
        for (u32 h = 0; h < kp / 16; h++) {
            float s = 0.0f;
            for (u32 i = 16 * h; i < 16 * h + 16 && i < k; i++) s += x[i];
            A->xsum[r * (kp / 16) + h] = s;
        }
        for (u32 b = 0; b < kp / 32; b++)
            A->xs32[r * (kp / 32) + b] = A->xsum[r * (kp / 16) + 2 * b] + A->xsum[r * (kp / 16) + 2 * b + 1];
        if (fast == EXACT_INT) {
            for (u32 b = 0; b < kp / 32; b++) {
                float amax = 0.0f;
                for (u32 i = 32 * b; i < 32 * b + 32 && i < k; i++) {
                    float v = x[i] < 0 ? -x[i] : x[i];
                    amax = v > amax ? v : amax;
                }
                // in f64: hi * D and x - hi * D are exact there, so lo rounds only once
                float D = amax / 32767.0f;
                double Dd = D, id = D > 0.0f ? 1.0 / Dd : 0.0, il = D > 0.0f ? 32768.0 / Dd : 0.0;
                A->xd[r * (kp / 32) + b] = D / 32768.0f;
                for (u32 i = 0; i < 32; i++) {
                    u32 e = 32 * b + i, slot = 32 * b + (perm ? (i % 2) * 16 + i / 2 : i);
                    double v = e < k ? (double)x[e] : 0.0, hi = __builtin_rint(v * id);
                    hi = hi > 32767.0 ? 32767.0 : hi < -32767.0 ? -32767.0 : hi;
                    A->xw[r * kp + slot] = (i16)(i32)hi;
                    A->xl[r * kp + slot] = (i16)(i32)__builtin_rint((v - hi * Dd) * il);
                }
            }
        } else if (fast) {
            for (u32 b = 0; b < kp / 32; b++) {
                float amax = 0.0f;
                for (u32 i = 32 * b; i < 32 * b + 32 && i < k; i++) {
                    float v = x[i] < 0 ? -x[i] : x[i];
                    amax = v > amax ? v : amax;
                }
                float d = amax / (fast == 2 ? 32767.0f : 127.0f), id = d > 0.0f ? 1.0f / d : 0.0f;
                A->xd[r * (kp / 32) + b] = d;
                for (u32 i = 0; i < 32; i++) {
                    u32 e = 32 * b + i, slot = 32 * b + (perm ? (i % 2) * 16 + i / 2 : i);
                    i32 q = e < k ? (i32)__builtin_rintf(x[e] * id) : 0;
                    A->xq[r * kp + slot] = (i8)q;
                    A->xw[r * kp + slot] = (i16)q;
                }
            }
        } else if (perm || k < kp) {
            for (u32 b = 0; b < kp / 32; b++)
                for (u32 i = 0; i < 32; i++) {
                    u32 e = 32 * b + i, slot = 32 * b + (perm ? (i % 2) * 16 + i / 2 : i);
                    xpad[r * kp + slot] = e < k ? x[e] : 0.0f;
                }
        }
    }
    if (!fast && (perm || k < kp)) {
        A->x = xpad;
        A->x_stride = kp;
    }
}

INLINE v128_t u8_f32(v128_t c, int part) {  // 4 codes (lanes 4 part .. +3) to f32
    v128_t w16 = part < 2 ? wasm_u16x8_extend_low_u8x16(c) : wasm_u16x8_extend_high_u8x16(c);
    v128_t w32 = (part & 1) ? wasm_u32x4_extend_high_u16x8(w16) : wasm_u32x4_extend_low_u16x8(w16);
    return wasm_f32x4_convert_i32x4(w32);
}

INLINE v128_t i8_f32(v128_t c, int part) {
    v128_t w16 = part < 2 ? wasm_i16x8_extend_low_i8x16(c) : wasm_i16x8_extend_high_i8x16(c);
    v128_t w32 = (part & 1) ? wasm_i32x4_extend_high_i16x8(w16) : wasm_i32x4_extend_low_i16x8(w16);
    return wasm_f32x4_convert_i32x4(w32);
}

// sum over 16 codes of q * x (f32), as a vector of 4 partial sums
INLINE v128_t half_dot_f32(v128_t c, const float *x, int is_signed) {
    v128_t acc = wasm_f32x4_mul(is_signed ? i8_f32(c, 0) : u8_f32(c, 0), wasm_v128_load(x));
    acc = wasm_f32x4_add(acc, wasm_f32x4_mul(is_signed ? i8_f32(c, 1) : u8_f32(c, 1), wasm_v128_load(x + 4)));
    acc = wasm_f32x4_add(acc, wasm_f32x4_mul(is_signed ? i8_f32(c, 2) : u8_f32(c, 2), wasm_v128_load(x + 8)));
    return wasm_f32x4_add(acc, wasm_f32x4_mul(is_signed ? i8_f32(c, 3) : u8_f32(c, 3), wasm_v128_load(x + 12)));
}

// sum over 16 codes of q * xq (integers), as 4 partial i32 sums; relaxed: one instruction (codes are < 128 and
// the x codes signed: the i7 operand is the weight; q8's signed weights take the i16 path)
INLINE v128_t half_dot_i8(v128_t c, const i8 *xq, const i16 *xw, int is_signed, int wide) {
#ifdef RELAXED
    if (!is_signed && !wide) return wasm_i32x4_relaxed_dot_i8x16_i7x16_add(wasm_v128_load(xq), c, wasm_i32x4_splat(0));
#endif
    (void)xq;
    v128_t w0 = is_signed ? wasm_i16x8_extend_low_i8x16(c) : wasm_u16x8_extend_low_u8x16(c);
    v128_t w1 = is_signed ? wasm_i16x8_extend_high_i8x16(c) : wasm_u16x8_extend_high_u8x16(c);
    v128_t d0 = wasm_i32x4_dot_i16x8(w0, wasm_v128_load(xw)), d1 = wasm_i32x4_dot_i16x8(w1, wasm_v128_load(xw + 8));
    // lane j = elements 4j .. 4j + 3, as the relaxed dot sums them: both builds then round the same partial sums
    return wasm_i32x4_add(wasm_i32x4_shuffle(d0, d1, 0, 2, 4, 6), wasm_i32x4_shuffle(d0, d1, 1, 3, 5, 7));
}

// The formats whose scale (and min) change every unit: their coefficients are decoded 4 units at a time
#define VEC4(dt, w) \
    (((dt) == F_Q4 || (dt) == F_Q4A || (dt) == F_Q8 || (dt) == F_Q5_0 || (dt) == F_Q5_1) && (w)->gs == 32)

// 4 consecutive f16 -> f32x4, as f16_to_f32
INLINE v128_t f16x4(const u8 *p) {
    v128_t h = wasm_u32x4_extend_low_u16x8(wasm_v128_load64_zero(p));
    v128_t sign = wasm_i32x4_shl(wasm_v128_and(h, wasm_i32x4_splat(0x8000)), 16);
    v128_t mag = wasm_f32x4_mul(wasm_i32x4_shl(wasm_v128_and(h, wasm_i32x4_splat(0x7fff)), 13),
                                wasm_f32x4_splat(0x1p112f));
    return wasm_v128_or(sign, mag);
}

INLINE v128_t code_f32(u32 dt, v128_t c, int part) { return SIGNED_CODES(dt) ? i8_f32(c, part) : u8_f32(c, part); }

// sum of q * x over one unit for activation row ri, as 4 f32 partial sums per half (h0: elements < 16)
INLINE void unit_dot_f32(u32 dt, v128_t c0, v128_t c1, const float *x, v128_t *h0, v128_t *h1) {
    if (ODD_EVEN(dt)) {
        *h0 = wasm_f32x4_add(wasm_f32x4_add(wasm_f32x4_mul(code_f32(dt, c0, 0), wasm_v128_load(x)),
                                            wasm_f32x4_mul(code_f32(dt, c0, 1), wasm_v128_load(x + 4))),
                             wasm_f32x4_add(wasm_f32x4_mul(code_f32(dt, c1, 0), wasm_v128_load(x + 16)),
                                            wasm_f32x4_mul(code_f32(dt, c1, 1), wasm_v128_load(x + 20))));
        *h1 = wasm_f32x4_add(wasm_f32x4_add(wasm_f32x4_mul(code_f32(dt, c0, 2), wasm_v128_load(x + 8)),
                                            wasm_f32x4_mul(code_f32(dt, c0, 3), wasm_v128_load(x + 12))),
                             wasm_f32x4_add(wasm_f32x4_mul(code_f32(dt, c1, 2), wasm_v128_load(x + 24)),
                                            wasm_f32x4_mul(code_f32(dt, c1, 3), wasm_v128_load(x + 28))));
    } else {
        *h0 = half_dot_f32(c0, x, dt == F_Q8);
        *h1 = half_dot_f32(c1, x + 16, dt == F_Q8);
    }
}

// integer sum of q * xq over one unit: lanes 0-1 half 0, 2-3 half 1 for odd/even formats (q8: one scale)
INLINE v128_t unit_dot_i8(u32 dt, v128_t c0, v128_t c1, const Acts *A, u32 ri, u32 kp, u32 u, int wide) {
    const i8 *xq = A->xq + ri * kp + 32 * u;
    const i16 *xw = A->xw + ri * kp + 32 * u;
    return wasm_i32x4_add(half_dot_i8(c0, xq, xw, SIGNED_CODES(dt), wide),
                          half_dot_i8(c1, xq + 16, xw + 16, SIGNED_CODES(dt), wide));
}

// integer sum of q * xq over one unit as an i32x4 whose lane sum is the exact total (lane layout differs between
// the builds; only the total is used). Relaxed: two byte dots (codes < 64 are the i7 operand; q8's signed
// weights and the int16 activations take the i16 path).
INLINE v128_t unit_idot(u32 dt, v128_t c0, v128_t c1, const i8 *xq, const i16 *xw, int wide) {
    int sgn = SIGNED_CODES(dt);
#ifdef RELAXED
    // i16 lanes: |x| <= 127 and codes <= 31, so each pair sum and the two halves' sum stay < 2^15 (no saturation,
    // whatever the engine's choice)
    if (!sgn && !wide)
        return wasm_i32x4_extadd_pairwise_i16x8(
            wasm_i16x8_add(wasm_i16x8_relaxed_dot_i8x16_i7x16(wasm_v128_load(xq), c0),
                           wasm_i16x8_relaxed_dot_i8x16_i7x16(wasm_v128_load(xq + 16), c1)));
#endif
    (void)xq;
    v128_t w0 = sgn ? wasm_i16x8_extend_low_i8x16(c0) : wasm_u16x8_extend_low_u8x16(c0);
    v128_t w1 = sgn ? wasm_i16x8_extend_high_i8x16(c0) : wasm_u16x8_extend_high_u8x16(c0);
    v128_t w2 = sgn ? wasm_i16x8_extend_low_i8x16(c1) : wasm_u16x8_extend_low_u8x16(c1);
    v128_t w3 = sgn ? wasm_i16x8_extend_high_i8x16(c1) : wasm_u16x8_extend_high_u8x16(c1);
    return wasm_i32x4_add(wasm_i32x4_add(wasm_i32x4_dot_i16x8(w0, wasm_v128_load(xw)),
                                         wasm_i32x4_dot_i16x8(w1, wasm_v128_load(xw + 8))),
                          wasm_i32x4_add(wasm_i32x4_dot_i16x8(w2, wasm_v128_load(xw + 16)),
                                         wasm_i32x4_dot_i16x8(w3, wasm_v128_load(xw + 24))));
}

// lane j = the lane sum of s_j
INLINE v128_t reduce4(v128_t s0, v128_t s1, v128_t s2, v128_t s3) {
    v128_t a = wasm_i32x4_add(wasm_i32x4_shuffle(s0, s1, 0, 4, 1, 5), wasm_i32x4_shuffle(s0, s1, 2, 6, 3, 7));
    v128_t b = wasm_i32x4_add(wasm_i32x4_shuffle(s2, s3, 0, 4, 1, 5), wasm_i32x4_shuffle(s2, s3, 2, 6, 3, 7));
    return wasm_i32x4_add(wasm_i32x4_shuffle(a, b, 0, 1, 4, 5), wasm_i32x4_shuffle(a, b, 2, 3, 6, 7));
}

// Fast mode over units u .. u + m - 1 (m <= 4) of NW weight rows against R activation rows (NW * R <= 4):
// av / bv[i] weight row i's coefficients (value = a * q + b), one lane per unit, zero past m; `keep` masks lanes
// past m. acc / bacc[i * R + r]: the pair's scaled integer dots and offset terms.
INLINE void fast_group(u32 dt, const u8 *const *qrow, const u8 *const *hrow, int NW, const Acts *A, u32 r0, int R,
                       int fast, u32 kp, u32 nu, u32 u, u32 m, const v128_t *av, const v128_t *bv, v128_t keep,
                       v128_t *acc, v128_t *bacc) {
    v128_t s[4][4], sl[4][4];  // sl: EXACT_INT's low halves
    for (u32 j = 0; j < 4; j++) {
        for (int i = 0; i < NW; i++) {
            v128_t c0 = wasm_i32x4_splat(0), c1 = c0;
            if (j < m) unit_codes(dt, qrow[i], hrow[i], u + j, &c0, &c1);
            for (int r = 0; r < R; r++) {
                u32 o = (r0 + r) * kp + 32 * (u + j);
                v128_t z = wasm_i32x4_splat(0);
                s[i * R + r][j] = j < m ? unit_idot(dt, c0, c1, A->xq + o, A->xw + o, fast >= ACT_I16) : z;
                if (fast == EXACT_INT) sl[i * R + r][j] = j < m ? unit_idot(dt, c0, c1, A->xq + o, A->xl + o, 1) : z;
            }
        }
    }
    for (int r = 0; r < R; r++) {
        u32 ri = r0 + r;
        // activation scales and sums past the last unit are other scratch: masked, never multiplied
        v128_t xd = wasm_v128_and(wasm_v128_load(A->xd + ri * nu + u), keep);
        v128_t xs = wasm_v128_and(wasm_v128_load(A->xs32 + ri * nu + u), keep);
        for (int i = 0; i < NW; i++) {
            v128_t *sp = s[i * R + r];
            v128_t t = wasm_f32x4_convert_i32x4(reduce4(sp[0], sp[1], sp[2], sp[3]));
            if (fast == EXACT_INT) {
                v128_t *lp = sl[i * R + r];
                t = wasm_f32x4_add(wasm_f32x4_mul(t, wasm_f32x4_splat(32768.0f)),
                                   wasm_f32x4_convert_i32x4(reduce4(lp[0], lp[1], lp[2], lp[3])));
            }
            acc[i * R + r] = wasm_f32x4_add(acc[i * R + r], wasm_f32x4_mul(t, wasm_f32x4_mul(av[i], xd)));
            if (dt != F_Q8) bacc[i * R + r] = wasm_f32x4_add(bacc[i * R + r], wasm_f32x4_mul(bv[i], xs));
        }
    }
}

// (a, b) of units u .. u + m - 1 of a row with one f16 scale (and min) per unit, one lane per unit, zero past m
INLINE void unit_coefs4(u32 dt, const RowCoefs *rc, u32 u, u32 m, v128_t *av, v128_t *bv) {
    if (m >= 4) {
        *av = f16x4(rc->sc + 2 * u);
        *bv = (dt == F_Q4A || dt == F_Q5_1) ? f16x4(rc->mn + 2 * u) : wasm_f32x4_splat(0.0f);
    } else {  // no loads past the row's scales
        const u16 *sc = (const u16 *)rc->sc + u, *mn = (const u16 *)rc->mn + u;
        *av = wasm_f32x4_make(f16_to_f32(sc[0]), m > 1 ? f16_to_f32(sc[1]) : 0.0f, m > 2 ? f16_to_f32(sc[2]) : 0.0f,
                              0.0f);
        *bv = wasm_f32x4_splat(0.0f);
        if (dt == F_Q4A || dt == F_Q5_1)
            *bv = wasm_f32x4_make(f16_to_f32(mn[0]), m > 1 ? f16_to_f32(mn[1]) : 0.0f,
                                  m > 2 ? f16_to_f32(mn[2]) : 0.0f, 0.0f);
    }
    if (dt == F_Q4) *bv = wasm_f32x4_mul(*av, wasm_f32x4_splat(-8.0f));
    else if (dt == F_Q5_0) *bv = wasm_f32x4_mul(*av, wasm_f32x4_splat(-16.0f));
}

// Fast mode for the formats with one scale per 32-unit (VEC4): NW weight rows n0.. against R activation rows,
// out[i * R + r]. Each unit's integer dot is reduced exactly to one lane (reduce4) and scaled by the unit's weight
// scale times its activation scale; a row's arithmetic is the same for every NW and R (batch invariance).
INLINE void rows_dot_fast(u32 dt, const Weight *w, u32 n0, int NW, const Acts *A, u32 r0, int R, int fast,
                          float *out) {
    u32 kp = w->kp, nu = kp / 32;
    const u8 *qrow[4], *hrow[4];
    RowCoefs rc[4];
    v128_t acc[4], bacc[4], av[4], bv[4];
    for (int i = 0; i < NW; i++) {
        qrow[i] = w->qweight + (n0 + i) * row_bytes_q(w);
        hrow[i] = qhigh_row(w, n0 + i);
        rc[i] = row_coefs(dt, w, n0 + i);
    }
    for (int i = 0; i < NW * R; i++) acc[i] = bacc[i] = wasm_f32x4_splat(0.0f);
    u32 u = 0;
    for (; u + 4 <= nu; u += 4) {
        for (int i = 0; i < NW; i++) unit_coefs4(dt, &rc[i], u, 4, &av[i], &bv[i]);
        fast_group(dt, qrow, hrow, NW, A, r0, R, fast, kp, nu, u, 4, av, bv, wasm_i32x4_splat(-1), acc, bacc);
    }
    if (u < nu) {  // the last 1-3 units: the same arithmetic, missing lanes zero
        u32 m = nu - u;
        for (int i = 0; i < NW; i++) unit_coefs4(dt, &rc[i], u, m, &av[i], &bv[i]);
        fast_group(dt, qrow, hrow, NW, A, r0, R, fast, kp, nu, u, m, av, bv,
                   wasm_i32x4_make(-1, m > 1 ? -1 : 0, m > 2 ? -1 : 0, 0), acc, bacc);
    }
    for (int i = 0; i < NW * R; i++) out[i] = hsum(acc[i]) + hsum(bacc[i]);
}

// One weight row against R activation rows (R constant after inlining), unit by unit: the formats other than
// rows_dot_fast's (K-quants, groups over 32). Per row the operations are the same
// whatever R is: a token's result does not depend on its neighbours.
// fast: ACT_I8 / ACT_I16 (int8 / int16 activations), EXACT_INT (exact mode: x = (hi * 32768 + lo) * xd; a lane's
// integer dots stay below 2^24 for codes up to 6 bits (8 x 63 x 32767), so they convert to f32 exactly and the
// lane's sum rounds once (q8's signed codes may reach 2^25: one more f32 rounding): f32 precision at the integer
// path's speed (Gemma 3's q6k down projection 640x2048: 1.98 -> 1.57 ms), ACT_F32 (f32 products).
INLINE void row_dot(u32 dt, const Weight *w, u32 row, const Acts *A, u32 r0, int R, int fast, float *out) {
    const u8 *qrow = w->qweight + row * row_bytes_q(w), *hrow = qhigh_row(w, row);
    u32 kp = w->kp, nu = kp / 32;
    RowCoefs rc = row_coefs(dt, w, row);
    v128_t acc[4];
    float bacc[4];
    for (int r = 0; r < R; r++) { acc[r] = wasm_f32x4_splat(0.0f); bacc[r] = 0.0f; }
    for (u32 u = 0; u < nu; u++) {
        v128_t c0, c1;
        unit_codes(dt, qrow, hrow, u, &c0, &c1);
        float a0, b0, a1, b1;
        unit_coefs(dt, &rc, u, &a0, &b0, &a1, &b1);
        for (int r = 0; r < R; r++) {
            u32 ri = r0 + r;
            const float *xs = A->xsum + ri * (kp / 16) + 2 * u;
            bacc[r] += b0 * xs[0] + b1 * xs[1];
            if (fast == EXACT_INT) {
                float d = A->xd[ri * nu + u], ad0 = a0 * d, ad1 = a1 * d;
                const i16 *xl = A->xl + ri * kp + 32 * u;
                v128_t sh = unit_dot_i8(dt, c0, c1, A, ri, kp, u, 1);
                v128_t sl = wasm_i32x4_add(half_dot_i8(c0, 0, xl, SIGNED_CODES(dt), 1),
                                           half_dot_i8(c1, 0, xl + 16, SIGNED_CODES(dt), 1));
                v128_t t = wasm_f32x4_add(wasm_f32x4_mul(wasm_f32x4_convert_i32x4(sh), wasm_f32x4_splat(32768.0f)),
                                          wasm_f32x4_convert_i32x4(sl));
                acc[r] = wasm_f32x4_add(acc[r], wasm_f32x4_mul(t, wasm_f32x4_make(ad0, ad0, ad1, ad1)));
            } else if (fast) {
                float d = A->xd[ri * nu + u], ad0 = a0 * d, ad1 = a1 * d;
                v128_t s = unit_dot_i8(dt, c0, c1, A, ri, kp, u, fast == 2);
                acc[r] = wasm_f32x4_add(acc[r], wasm_f32x4_mul(wasm_f32x4_convert_i32x4(s),
                                                               wasm_f32x4_make(ad0, ad0, ad1, ad1)));
            } else {
                v128_t h0, h1;
                unit_dot_f32(dt, c0, c1, A->x + ri * A->x_stride + 32 * u, &h0, &h1);
                acc[r] = wasm_f32x4_add(acc[r], wasm_f32x4_add(wasm_f32x4_mul(h0, wasm_f32x4_splat(a0)),
                                                               wasm_f32x4_mul(h1, wasm_f32x4_splat(a1))));
            }
        }
    }
    for (int r = 0; r < R; r++) out[r] = hsum(acc[r]) + bacc[r];
}

INLINE void row_dot_f32(const Weight *w, u32 row, const Acts *A, u32 r0, int R, float *out) {
    const float *wr = (const float *)w->qweight + row * w->k;
    u32 k = w->k, k4 = k & ~3u;
    v128_t acc[4];
    float tail[4];
    for (int r = 0; r < R; r++) { acc[r] = wasm_f32x4_splat(0.0f); tail[r] = 0.0f; }
    for (u32 i = 0; i < k4; i += 4) {
        v128_t wv = wasm_v128_load(wr + i);
        for (int r = 0; r < R; r++)
            acc[r] = wasm_f32x4_add(acc[r], wasm_f32x4_mul(wv, wasm_v128_load(A->x + (r0 + r) * A->x_stride + i)));
    }
    for (u32 i = k4; i < k; i++)
        for (int r = 0; r < R; r++) tail[r] += wr[i] * A->x[(r0 + r) * A->x_stride + i];
    for (int r = 0; r < R; r++) out[r] = hsum(acc[r]) + tail[r];
}

#define TILE 4

// rows_dot_fast for a 4-row tile (R == TILE: one weight row) or one activation row (nw weight rows)
INLINE void rows_dot_tile(u32 dt, const Weight *w, u32 n, u32 nw, const Acts *A, u32 r0, u32 R, int fast,
                          float *out) {
    if (R == TILE) rows_dot_fast(dt, w, n, 1, A, r0, TILE, fast, out);
    else if (nw == 2) rows_dot_fast(dt, w, n, 2, A, r0, 1, fast, out);
    else rows_dot_fast(dt, w, n, 1, A, r0, 1, fast, out);
}

// Rows in tiles of 4 (each weight row decoded once per tile), the rest one by one: a row's arithmetic is the same
// in every path, so tiling never changes a result.
INLINE void linear_rows(u32 dt, const Weight *w, const Acts *A, float *y, u32 y_stride, u32 rows, int accumulate,
                        int fast) {
    float out[TILE];
    for (u32 r0 = 0; r0 < rows;) {
        u32 R = rows - r0 >= TILE ? TILE : 1;
        for (u32 n = A->n0; n < A->n1; n++) {
            if (dt == F_F32) {
                if (R == TILE) row_dot_f32(w, n, A, r0, TILE, out);
                else row_dot_f32(w, n, A, r0, 1, out);
            } else if (fast && VEC4(dt, w)) {
                // one activation row (decode): two nibble-format weight rows at a time share its loads (q8: one,
                // measured faster: its i16 path needs more registers)
                u32 nw = R == 1 && dt != F_Q8 && fast != EXACT_INT && n + 1 < A->n1 ? 2 : 1;
                // a constant mode per call, so that each mode's loop is specialised (no per-unit mode branches)
                if (fast == EXACT_INT) rows_dot_tile(dt, w, n, nw, A, r0, R, EXACT_INT, out);
                else if (fast == ACT_I16) rows_dot_tile(dt, w, n, nw, A, r0, R, ACT_I16, out);
                else rows_dot_tile(dt, w, n, nw, A, r0, R, ACT_I8, out);
                for (u32 i = 0; i < nw * R; i++) {  // out[i * R + r]: weight row n + i, activation row r0 + r
                    u32 wi = i / R, r = i % R;
                    float v = out[i] + (w->bias ? w->bias[n + wi] : 0.0f);
                    float *dst = y + (r0 + r) * y_stride + n + wi;
                    *dst = accumulate ? *dst + v : v;
                }
                n += nw - 1;
                continue;
            } else if (fast == EXACT_INT) {
                if (R == TILE) row_dot(dt, w, n, A, r0, TILE, EXACT_INT, out);
                else row_dot(dt, w, n, A, r0, 1, EXACT_INT, out);
            } else if (fast == 2) {
                if (R == TILE) row_dot(dt, w, n, A, r0, TILE, 2, out);
                else row_dot(dt, w, n, A, r0, 1, 2, out);
            } else if (fast) {
                if (R == TILE) row_dot(dt, w, n, A, r0, TILE, 1, out);
                else row_dot(dt, w, n, A, r0, 1, 1, out);
            } else {
                if (R == TILE) row_dot(dt, w, n, A, r0, TILE, 0, out);
                else row_dot(dt, w, n, A, r0, 1, 0, out);
            }
            float b = w->bias ? w->bias[n] : 0.0f;
            for (u32 r = 0; r < R; r++) {
                float v = out[r] + b;
                float *dst = y + (r0 + r) * y_stride + n;
                *dst = accumulate ? *dst + v : v;
            }
        }
        r0 += R;
    }
}

// ------------------------------------------------------------------------------------------------ packed GEMV

// Whether a packed matrix's fast-mode dot runs on int8 activations (the relaxed build's byte dot, for the nibble
// formats' codes < 16: the 7-bit operand) or on int16 ones (i32x4.dot_i16x8: base build, q8's signed codes,
// int16 and exact activations)
INLINE int packed_i8(u32 dt, int mode) {
#ifdef RELAXED
    return !BYTE_PACKED(dt) && mode == ACT_I8;
#else
    (void)dt;
    (void)mode;
    return 0;
#endif
}

// The packed kernels' activations, per row: xd (the unit's activation scale) and xs32 (the unit's sum of x, for
// the b term) per 32-block, and the codes broadcast per 4 elements: xb 16 bytes [x0..x3] x 4 (int8), or xw (and
// exact mode's low parts xl) 8 int16 [x0..x3] x 2; element e's group at byte 4e of the row's kp * 4 bytes.
// Fast mode's codes are prepare_acts' (the same rounding): int8 / int16 with d = amax / qmax.
// Exact mode (EXACT_INT) here: X = rint(x / D), D = amax / EXACT_X (|X| <= EXACT_X < 2^23, so x within D / 2 =
// 2^-24 amax: f32's own rounding of the block's largest element), written as balanced base-256 digits
// X = (d2 * 256 + d1) * 256 + d0, each in [-128, 127]. The base build dots hi = d2 * 256 + d1 and lo = d0 as int16
// (xw, xl); the relaxed build's GEMV on the nibble formats dots the three digits as int8 (EXACT_I8: 6 byte dots
// per code vector where the int16 form takes 8 dots and 4 widenings; measured 11-14 % faster on SmolLM2's shapes,
// and no faster in the GEMM, which keeps the int16 form). All give the same exact integer sums (the unit's hi sum
// < 2^24), so GEMV, GEMM and both builds agree bit for bit.
#define EXACT_X 8323072  // 127 * 65536: the top digit stays in [-127, 127]

static void prepare_packed(Acts *A, u32 rows, u32 k, u32 kp, int mode, int i8codes) {
    int exact3 = mode == EXACT_I8;
    if (exact3) mode = EXACT_INT;
    for (u32 r = 0; r < rows; r++) {
        const float *x = A->x + r * A->x_stride;
        i8 *xb = A->xq + r * kp * (exact3 ? 12 : 4);  // exact3: the digits d2, d1, d0 at 0, kp * 4, kp * 8
        i16 *xw = A->xw + r * kp * 2, *xl = A->xl + r * kp * 2;
        for (u32 b = 0; b < kp / 32; b++) {
            float s0 = 0.0f, s1 = 0.0f, amax = 0.0f;
            int full = 32 * b + 32 <= k;
            for (u32 i = 32 * b; i < 32 * b + 32 && i < k; i++) {
                if (i < 32 * b + 16) s0 += x[i];
                else s1 += x[i];
                float v = x[i] < 0 ? -x[i] : x[i];
                amax = full ? amax : v > amax ? v : amax;
            }
            if (full) {  // the same maximum (pmax: a NaN never replaces it, as above)
                v128_t am = wasm_f32x4_splat(0.0f);
                for (u32 q = 0; q < 8; q++) am = wasm_f32x4_pmax(am, wasm_f32x4_abs(wasm_v128_load(x + 32 * b + 4 * q)));
                for (u32 l = 0; l < 4; l++) {
                    float v = l == 0 ? wasm_f32x4_extract_lane(am, 0) : l == 1 ? wasm_f32x4_extract_lane(am, 1)
                            : l == 2 ? wasm_f32x4_extract_lane(am, 2) : wasm_f32x4_extract_lane(am, 3);
                    amax = v > amax ? v : amax;
                }
            }
            A->xs32[r * (kp / 32) + b] = s0 + s1;
            A->xs16[r * (kp / 16) + 2 * b] = s0;
            A->xs16[r * (kp / 16) + 2 * b + 1] = s1;
            float D = amax / (mode == ACT_I8 ? 127.0f : mode == ACT_I16 ? 32767.0f : (float)EXACT_X);
            double id = D > 0.0f ? 1.0 / (double)D : 0.0;  // exact mode: x / D in f64, so X rounds once
            float fid = D > 0.0f ? 1.0f / D : 0.0f;
            A->xd[r * (kp / 32) + b] = D;
            if (full) {  // the scalar loop's arithmetic, 4 elements (one broadcast group) at a time
                for (u32 q = 0; q < 8; q++) {
                    u32 g = 8 * b + q;
                    v128_t v = wasm_v128_load(x + 4 * g), hi;
                    if (mode == EXACT_INT) {
                        v128_t h2[2];
                        for (u32 half = 0; half < 2; half++) {
                            v128_t d = wasm_f64x2_promote_low_f32x4(half ? wasm_i32x4_shuffle(v, v, 2, 3, 0, 1) : v);
                            v128_t h = wasm_f64x2_nearest(wasm_f64x2_mul(d, wasm_f64x2_splat(id)));
                            h = wasm_f64x2_pmax(wasm_f64x2_pmin(h, wasm_f64x2_splat(EXACT_X)), wasm_f64x2_splat(-EXACT_X));
                            h2[half] = wasm_i32x4_trunc_sat_f64x2_zero(h);
                        }
                        v128_t X = wasm_i32x4_shuffle(h2[0], h2[1], 0, 1, 4, 5), c128 = wasm_i32x4_splat(128);
                        v128_t m255 = wasm_i32x4_splat(255);
                        v128_t d0 = wasm_i32x4_sub(wasm_v128_and(wasm_i32x4_add(X, c128), m255), c128);
                        hi = wasm_i32x4_shr(wasm_i32x4_sub(X, d0), 8);
                        if (exact3) {
                            v128_t d1 = wasm_i32x4_sub(wasm_v128_and(wasm_i32x4_add(hi, c128), m255), c128);
                            v128_t d2 = wasm_i32x4_shr(wasm_i32x4_sub(hi, d1), 8);
                            v128_t dg[3] = {d2, d1, d0};
                            for (u32 p = 0; p < 3; p++) {
                                v128_t t16 = wasm_i16x8_narrow_i32x4(dg[p], dg[p]);
                                wasm_v128_store(xb + p * kp * 4 + 16 * g, wasm_i8x16_narrow_i16x8(t16, t16));
                            }
                            continue;
                        }
                        wasm_v128_store(xl + 8 * g, wasm_i16x8_narrow_i32x4(d0, d0));
                    } else {
                        hi = wasm_i32x4_trunc_sat_f32x4(wasm_f32x4_nearest(wasm_f32x4_mul(v, wasm_f32x4_splat(fid))));
                    }
                    v128_t h16 = wasm_i16x8_narrow_i32x4(hi, hi);  // [x0..x3] twice
                    if (i8codes) wasm_v128_store(xb + 16 * g, wasm_i8x16_narrow_i16x8(h16, h16));
                    else wasm_v128_store(xw + 8 * g, h16);
                }
                continue;
            }
            for (u32 i = 0; i < 32; i++) {
                u32 e = 32 * b + i;
                i32 hi, lo = 0;
                if (mode == EXACT_INT) {
                    double v = e < k ? (double)x[e] : 0.0, h = __builtin_rint(v * id);
                    h = h > EXACT_X ? EXACT_X : h < -EXACT_X ? -EXACT_X : h;
                    i32 X = (i32)h;
                    lo = ((X + 128) & 255) - 128;
                    hi = (X - lo) >> 8;
                } else {
                    hi = e < k ? (i32)__builtin_rintf(x[e] * fid) : 0;
                }
                u32 g = e / 4, j = e % 4;
                if (exact3) {
                    i32 d1 = ((hi + 128) & 255) - 128, dg[3] = {(hi - d1) >> 8, d1, lo};
                    for (u32 p = 0; p < 3; p++)
                        for (u32 c = 0; c < 4; c++) xb[p * kp * 4 + 16 * g + 4 * c + j] = (i8)dg[p];
                } else if (i8codes) {
                    for (u32 c = 0; c < 4; c++) xb[16 * g + 4 * c + j] = (i8)hi;
                } else {
                    xw[8 * g + j] = xw[8 * g + 4 + j] = (i16)hi;
                    if (mode == EXACT_INT) xl[8 * g + j] = xl[8 * g + 4 + j] = (i16)lo;
                }
            }
        }
    }
}

#define GEMM_ROWS 16   // activation rows per packed GEMM tile (at most)
#define GEMM_UNITS 16  // units whose integer sums a GEMM tile holds before their float steps

// lane r = (lo01 lanes 2r, 2r + 1 for r < 2, hi23's for r >= 2) summed: the i16 dots' pair sums to one per row
INLINE v128_t rows4(v128_t a01, v128_t a23) {
    return wasm_i32x4_add(wasm_i32x4_shuffle(a01, a23, 0, 2, 4, 6), wasm_i32x4_shuffle(a01, a23, 1, 3, 5, 7));
}

// One packed code vector as i16 lanes for the i16 dot products: q8's 16 signed codes in 2 vectors, a nibble format's
// 32 codes in 4 (low nibbles' halves, then high nibbles'); returns how many
INLINE u32 i16_codes(u32 dt, v128_t v, v128_t *w) {
    if (BYTE_PACKED(dt)) {
        w[0] = wasm_i16x8_extend_low_i8x16(v);
        w[1] = wasm_i16x8_extend_high_i8x16(v);
        return 2;
    }
    v128_t m = wasm_i8x16_splat(0x0f);
    v128_t lo = wasm_v128_and(v, m), hi = wasm_v128_and(wasm_u16x8_shr(v, 4), m);
    w[0] = wasm_u16x8_extend_low_u8x16(lo);
    w[1] = wasm_u16x8_extend_high_u8x16(lo);
    w[2] = wasm_u16x8_extend_low_u8x16(hi);
    w[3] = wasm_u16x8_extend_high_u8x16(hi);
    return 4;
}

// exact3's digit sums (i16 lanes, pairs summed to one lane per weight row) to packed_unit's (is, il): is = the
// sum against hi = d2 * 256 + d1 (below 2^24 in magnitude: exact in i32 and in f32), il = the sum against d0
#ifdef RELAXED
INLINE void exact3_sums(const v128_t *s, v128_t *is, v128_t *il) {
    *is = wasm_i32x4_add(wasm_i32x4_shl(wasm_i32x4_extadd_pairwise_i16x8(s[0]), 8),
                         wasm_i32x4_extadd_pairwise_i16x8(s[1]));
    *il = wasm_i32x4_extadd_pairwise_i16x8(s[2]);
}
#endif

// One unit of a packed group against R (1 or 4) activation rows: is[r] (and exact mode's low halves il[r]) = the
// exact integer sum of codes x activation codes, lane i = weight row i of the group: the GEMV's (R = 1) and the
// int16 tile's (R = 4); HALVES' two halves apart, the second at is[R + r]. Integer sums are exact: gemm_unit's
// other grouping gives the same sums.
// hi_only (a constant after inlining): exact mode's sums against the high digits only, il = 0 (head_bounds)
INLINE void packed_unit(u32 dt, const u8 *blk, const Acts *A, u32 r0, int R, int mode, u32 kp, u32 u, v128_t *is,
                        v128_t *il, int hi_only) {
    v128_t z = wasm_i32x4_splat(0);
    // HALVES: the first half's code vectors (F_Q8H: 0-3, F_Q4H and F_Q4Z: 0-1) hold elements 0-15, the others 16-31
    const u32 nh = HALVES(dt) ? 2 : 1, nt = PCODES(dt) / 16 / nh;
    if (mode == EXACT_I8) {
#ifdef RELAXED
        // exact mode's three digits (|d| <= 128, codes <= 15: 8 byte dots stay below 2^15 per i16 lane, as below)
        v128_t s[2][4][3];
        for (u32 h = 0; h < nh; h++)
            for (int r = 0; r < R; r++) s[h][r][0] = s[h][r][1] = s[h][r][2] = z;
        for (u32 t = 0; t < 4; t++) {
            v128_t v = wasm_v128_load(blk + 16 * t), m = wasm_i8x16_splat(0x0f);
            v128_t lo = wasm_v128_and(v, m), hi = wasm_v128_and(wasm_u16x8_shr(v, 4), m);
            for (int r = 0; r < R; r++) {
                const i8 *xb = A->xq + (r0 + r) * kp * 12 + 4 * (32 * u + 8 * t);
                for (u32 p = 0; p < (hi_only ? 2u : 3u); p++) {
                    v128_t d0 = wasm_i16x8_relaxed_dot_i8x16_i7x16(wasm_v128_load(xb + p * kp * 4), lo);
                    v128_t d1 = wasm_i16x8_relaxed_dot_i8x16_i7x16(wasm_v128_load(xb + p * kp * 4 + 16), hi);
                    s[t / nt][r][p] = wasm_i16x8_add(s[t / nt][r][p], wasm_i16x8_add(d0, d1));
                }
            }
        }
        for (u32 h = 0; h < nh; h++)
            for (int r = 0; r < R; r++) exact3_sums(s[h][r], is + h * R + r, il + h * R + r);
#endif
        return;
    }
    if (packed_i8(dt, mode)) {
#ifdef RELAXED
        // i16 lanes: |x| <= 127 and codes <= 15, so 8 byte dots (2 products each) stay below 2^15
        v128_t s[2][4];
        for (u32 h = 0; h < nh; h++)
            for (int r = 0; r < R; r++) s[h][r] = z;
        for (u32 t = 0; t < 4; t++) {
            v128_t v = wasm_v128_load(blk + 16 * t), m = wasm_i8x16_splat(0x0f);
            v128_t lo = wasm_v128_and(v, m), hi = wasm_v128_and(wasm_u16x8_shr(v, 4), m);
            for (int r = 0; r < R; r++) {
                const i8 *xb = A->xq + (r0 + r) * kp * 4 + 4 * (32 * u + 8 * t);
                v128_t d0 = wasm_i16x8_relaxed_dot_i8x16_i7x16(wasm_v128_load(xb), lo);
                v128_t d1 = wasm_i16x8_relaxed_dot_i8x16_i7x16(wasm_v128_load(xb + 16), hi);
                s[t / nt][r] = wasm_i16x8_add(s[t / nt][r], wasm_i16x8_add(d0, d1));
            }
        }
        for (u32 h = 0; h < nh; h++)
            for (int r = 0; r < R; r++) is[h * R + r] = wasm_i32x4_extadd_pairwise_i16x8(s[h][r]);
#endif
        return;
    }
    for (u32 half = 0; half < nh; half++) {
        v128_t a01[4] = {z, z, z, z}, a23[4] = {z, z, z, z}, l01[4] = {z, z, z, z}, l23[4] = {z, z, z, z};
        for (u32 t = half * nt; t < half * nt + nt; t++) {
            v128_t w[4];  // i16 codes: rows 0-1 and 2-3 of the first 4 elements, then (nibbles) of the next 4
            u32 nw = i16_codes(dt, wasm_v128_load(blk + 16 * t), w);
            u32 e = BYTE_PACKED(dt) ? 32 * u + 4 * t : 32 * u + 8 * t;  // the vector's first element
            for (int r = 0; r < R; r++) {
                const i16 *xw = A->xw + (r0 + r) * kp * 2 + 2 * e, *xl = A->xl + (r0 + r) * kp * 2 + 2 * e;
                for (u32 h = 0; h < nw; h += 2) {
                    v128_t xa = wasm_v128_load(xw + 4 * h);
                    a01[r] = wasm_i32x4_add(a01[r], wasm_i32x4_dot_i16x8(w[h], xa));
                    a23[r] = wasm_i32x4_add(a23[r], wasm_i32x4_dot_i16x8(w[h + 1], xa));
                    if (mode == EXACT_INT && !hi_only) {
                        v128_t la = wasm_v128_load(xl + 4 * h);
                        l01[r] = wasm_i32x4_add(l01[r], wasm_i32x4_dot_i16x8(w[h], la));
                        l23[r] = wasm_i32x4_add(l23[r], wasm_i32x4_dot_i16x8(w[h + 1], la));
                    }
                }
            }
        }
        for (int r = 0; r < R; r++) {
            is[half * R + r] = rows4(a01[r], a23[r]);
            if (mode == EXACT_INT) il[half * R + r] = rows4(l01[r], l23[r]);
        }
    }
}

// A unit's float step for one activation row (o: the row's unit index into xd and xs32), the one arithmetic of the
// GEMV and the GEMM (batch invariance): acc += sums * (unit scales * xd), bacc += unit mins * xs32. F_Q8H: each
// half's sums (the second at is[hs], il[hs]) times its scale, the first half's step first; F_Q4H and F_Q4Z as
// F_Q8H, then each half's b times its half's sum of x (xs16).
INLINE v128_t unit_sums(v128_t is, v128_t il, int mode) {
    v128_t t = wasm_f32x4_convert_i32x4(is);
    if (mode == EXACT_INT || mode == EXACT_I8)
        t = wasm_f32x4_add(wasm_f32x4_mul(t, wasm_f32x4_splat(256.0f)), wasm_f32x4_convert_i32x4(il));
    return t;
}

INLINE void unit_step(u32 dt, const u8 *blk, const v128_t *is, const v128_t *il, u32 hs, const Acts *A, u32 o,
                      int mode, v128_t *acc, v128_t *bacc) {
    v128_t xd = wasm_v128_load32_splat(A->xd + o);
    v128_t av = wasm_v128_load(blk + PCODES(dt));
    *acc = wasm_f32x4_add(*acc, wasm_f32x4_mul(unit_sums(is[0], il[0], mode), wasm_f32x4_mul(av, xd)));
    if (HALVES(dt)) {
        v128_t av1 = wasm_v128_load(blk + PCODES(dt) + 16);
        *acc = wasm_f32x4_add(*acc, wasm_f32x4_mul(unit_sums(is[hs], il[hs], mode), wasm_f32x4_mul(av1, xd)));
    }
    if (dt == F_Q4H || dt == F_Q4Z) {  // each half's b against its half's sum of x (F_Q4Z: b = -4 a, exact)
        v128_t m4 = wasm_f32x4_splat(-4.0f);
        v128_t b0 = dt == F_Q4Z ? wasm_f32x4_mul(av, m4) : wasm_v128_load(blk + PCODES(dt) + 32);
        v128_t b1 = dt == F_Q4Z ? wasm_f32x4_mul(wasm_v128_load(blk + PCODES(dt) + 16), m4)
                                : wasm_v128_load(blk + PCODES(dt) + 48);
        *bacc = wasm_f32x4_add(*bacc, wasm_f32x4_mul(b0, wasm_v128_load32_splat(A->xs16 + 2 * o)));
        *bacc = wasm_f32x4_add(*bacc, wasm_f32x4_mul(b1, wasm_v128_load32_splat(A->xs16 + 2 * o + 1)));
    } else if (HAS_B(dt))
        *bacc = wasm_f32x4_add(*bacc, wasm_f32x4_mul(wasm_v128_load(blk + PCODES(dt) + 16),
                                                     wasm_v128_load32_splat(A->xs32 + o)));
}

// GEMV: weight rows 4g .. 4g + 3 (one lane each) of the ns (1 or GEMV_STREAMS, a constant after inlining) groups
// gs[] against activation row r, out[j] group gs[j]'s, the groups' units interleaved; a group's arithmetic does not
// depend on ns (the same bits). Why two streams: the weights stream from memory (a decode step reads ~100 MB)
// and one group's loop keeps too few cache misses in flight for one core to reach its read bandwidth. Where it pays
// (measured, SmolLM2, tok per CPU-second, docs/cpu-backend.md): the relaxed build's fast mode, light enough to wait
// on memory (+18 %); not exact mode's three-digit dots nor the base build's int16 dots, compute-bound (0 to -4 %:
// two streams' accumulators spill). Three or four streams were no better than two.
#define GEMV_STREAMS 2
INLINE int streamed(int mode) {
#ifdef RELAXED
    return mode == ACT_I8 || mode == ACT_I16;
#else
    (void)mode;
    return 0;
#endif
}

// packed_groups, or with hi_only (a constant after inlining) the two-pass head's first pass: sums against the high
// digits only, and bnd[j] = sum over units of |a_u xd_u| per row (the bound's factor; head_bounds)
INLINE void packed_groups_hi(u32 dt, const Weight *w, const u32 *gs, int ns, const Acts *A, u32 r, int mode,
                             v128_t *out, int hi_only, v128_t *bnd) {
    u32 kp = w->kp, nu = kp / 32;
    const u8 *p[GEMV_STREAMS];
    v128_t acc[GEMV_STREAMS], bacc[GEMV_STREAMS], sp[GEMV_STREAMS];
    for (int j = 0; j < ns; j++) {
        p[j] = w->qweight + gs[j] * nu * PBLK(dt);
        acc[j] = bacc[j] = sp[j] = wasm_f32x4_splat(0.0f);
    }
    for (u32 u = 0; u < nu; u++) {
        v128_t is[2 * GEMV_STREAMS], il[2 * GEMV_STREAMS];  // (HALVES: two halves a stream)
        for (int j = 0; j < ns; j++) packed_unit(dt, p[j], A, r, 1, mode, kp, u, &is[2 * j], &il[2 * j], hi_only);
        for (int j = 0; j < ns; j++) {
            unit_step(dt, p[j], &is[2 * j], &il[2 * j], 1, A, r * nu + u, mode, &acc[j], &bacc[j]);
            if (hi_only) {  // (the products unit_step rounds: |fl(a xd)|)
                v128_t xd = wasm_v128_load32_splat(A->xd + r * nu + u);
                sp[j] = wasm_f32x4_add(sp[j], wasm_f32x4_abs(wasm_f32x4_mul(wasm_v128_load(p[j] + PCODES(dt)), xd)));
                if (HALVES(dt))
                    sp[j] = wasm_f32x4_add(sp[j], wasm_f32x4_abs(wasm_f32x4_mul(wasm_v128_load(p[j] + PCODES(dt) + 16),
                                                                                xd)));
            }
            p[j] += PBLK(dt);
        }
    }
    for (int j = 0; j < ns; j++) {
        out[j] = wasm_f32x4_add(acc[j], bacc[j]);
        if (hi_only) bnd[j] = sp[j];
    }
}

INLINE void packed_groups(u32 dt, const Weight *w, const u32 *gs, int ns, const Acts *A, u32 r, int mode,
                          v128_t *out) {
    packed_groups_hi(dt, w, gs, ns, A, r, mode, out, 0, 0);
}

// gemm_unit's exact-mode row r: wb[2i], wb[2i + 1] are weight rows 0-1 and 2-3 against the activations' i-th 4
// elements (8 i16 per 4)
INLINE void exact_row(const v128_t *wb, const Acts *A, u32 r, u32 kp, u32 u, v128_t *is, v128_t *il) {
    v128_t a01 = wasm_i32x4_splat(0), a23 = a01, l01 = a01, l23 = a01;
    const i16 *xw = A->xw + r * kp * 2 + 64 * u, *xl = A->xl + r * kp * 2 + 64 * u;
    for (u32 i = 0; i < 8; i++) {
        v128_t xa = wasm_v128_load(xw + 8 * i), la = wasm_v128_load(xl + 8 * i);
        a01 = wasm_i32x4_add(a01, wasm_i32x4_dot_i16x8(wb[2 * i], xa));
        a23 = wasm_i32x4_add(a23, wasm_i32x4_dot_i16x8(wb[2 * i + 1], xa));
        l01 = wasm_i32x4_add(l01, wasm_i32x4_dot_i16x8(wb[2 * i], la));
        l23 = wasm_i32x4_add(l23, wasm_i32x4_dot_i16x8(wb[2 * i + 1], la));
    }
    *is = rows4(a01, a23);
    *il = rows4(l01, l23);
}

// One unit's integer sums for the R activation rows r0 .. r0 + R - 1 of a GEMM tile (relaxed int8 or exact mode),
// as packed_unit's: the codes decoded once, then the rows in a loop kept rolled (unrolled, clang hoists every
// row's activation loads and wasmtime's register allocator spills them: the unrolled 4-row tile ran slower per row
// than the GEMV)
INLINE void gemm_unit(u32 dt, const u8 *blk, const Acts *A, u32 r0, u32 R, int mode, u32 kp, u32 u, v128_t *is,
                      v128_t *il) {
    if (packed_i8(dt, mode)) {
#ifdef RELAXED
        v128_t z = wasm_i32x4_splat(0), c[8], m = wasm_i8x16_splat(0x0f);
        for (u32 t = 0; t < 4; t++) {
            v128_t v = wasm_v128_load(blk + 16 * t);
            c[2 * t] = wasm_v128_and(v, m);
            c[2 * t + 1] = wasm_v128_and(wasm_u16x8_shr(v, 4), m);
        }
#pragma clang loop unroll(disable)
        for (u32 r = 0; r < R; r++) {
            const i8 *xb = A->xq + (r0 + r) * kp * 4 + 4 * 32 * u;
            v128_t s = z;
            for (u32 t = 0; t < 4; t++) {
                v128_t d0 = wasm_i16x8_relaxed_dot_i8x16_i7x16(wasm_v128_load(xb + 32 * t), c[2 * t]);
                v128_t d1 = wasm_i16x8_relaxed_dot_i8x16_i7x16(wasm_v128_load(xb + 32 * t + 16), c[2 * t + 1]);
                s = wasm_i16x8_add(s, wasm_i16x8_add(d0, d1));
            }
            is[r] = wasm_i32x4_extadd_pairwise_i16x8(s);
        }
#endif
        return;
    }
    v128_t wb[16];  // the unit's i16 codes, packed_unit's w[] of vector t at wb[4t ..] (q8: wb[2t ..])
    for (u32 t = 0; t < PCODES(dt) / 16; t++)
        i16_codes(dt, wasm_v128_load(blk + 16 * t), wb + (BYTE_PACKED(dt) ? 2 : 4) * t);
    // one row at a time: exact mode's 4 accumulators a row (hi and lo halves) fill the registers
#pragma clang loop unroll(disable)
    for (u32 r = 0; r < R; r++) exact_row(wb, A, r0 + r, kp, u, is + r, il + r);
}

// The int16-activation path's tile (fast mode in the base build, q8, the int16 down projection): 4 rows in
// registers, each unit's integer sums and float steps in turn (measured faster there than the GEMM below, whose
// stack round trip costs more than the shared decode saves)
INLINE void packed_group4(u32 dt, const Weight *w, u32 g, const Acts *A, u32 r0, int mode, v128_t *out) {
    u32 kp = w->kp, nu = kp / 32;
    const u8 *blk = w->qweight + g * nu * PBLK(dt);
    v128_t acc[4], bacc[4];
    for (int r = 0; r < 4; r++) acc[r] = bacc[r] = wasm_f32x4_splat(0.0f);
    for (u32 u = 0; u < nu; u++, blk += PBLK(dt)) {
        v128_t is[8], il[8];  // (HALVES: the second half's at 4 + r)
        packed_unit(dt, blk, A, r0, 4, mode, kp, u, is, il, 0);
        for (u32 r = 0; r < 4; r++)
            unit_step(dt, blk, is + r, il + r, 4, A, (r0 + r) * nu + u, mode, &acc[r], &bacc[r]);
    }
    for (int r = 0; r < 4; r++) out[r] = wasm_f32x4_add(acc[r], bacc[r]);
}

// GEMM: weight rows 4g .. 4g + 3 against the R (2 .. GEMM_ROWS) activation rows r0 .. r0 + R - 1. Per chunk of
// GEMM_UNITS units: every row's integer sums (gemm_unit), held on the stack, then each row's float steps in unit
// order, the GEMV's sequence (bit-identical to it), with one row's float accumulators live at a time.
INLINE void packed_gemm_group(u32 dt, const Weight *w, u32 g, const Acts *A, u32 r0, u32 R, int mode, v128_t *out) {
    u32 kp = w->kp, nu = kp / 32;
    const u8 *blk = w->qweight + g * nu * PBLK(dt);
    for (u32 r = 0; r < R; r++) out[r] = wasm_f32x4_splat(0.0f);
    v128_t bacc[GEMM_ROWS];
    for (u32 r = 0; r < R; r++) bacc[r] = out[r];
    for (u32 u0 = 0; u0 < nu; u0 += GEMM_UNITS) {
        u32 nc = nu - u0 < GEMM_UNITS ? nu - u0 : GEMM_UNITS;
        v128_t is[GEMM_UNITS][GEMM_ROWS], il[GEMM_UNITS][GEMM_ROWS];
        for (u32 c = 0; c < nc; c++)
            gemm_unit(dt, blk + (u0 + c) * PBLK(dt), A, r0, R, mode, kp, u0 + c, is[c], il[c]);
        for (u32 r = 0; r < R; r++)
            for (u32 c = 0; c < nc; c++)
                unit_step(dt, blk + (u0 + c) * PBLK(dt), &is[c][r], &il[c][r], 0, A, (r0 + r) * nu + u0 + c, mode,
                          &out[r], &bacc[r]);
    }
    for (u32 r = 0; r < R; r++) out[r] = wasm_f32x4_add(out[r], bacc[r]);
}

// y[r, 4g .. 4g + 3] (+)= v (+ bias), only the columns below n1
INLINE void store_group(const Weight *w, const Acts *A, v128_t v, u32 g, float *yrow, int accumulate) {
    float lanes[4] __attribute__((aligned(16)));
    wasm_v128_store(lanes, v);
    for (u32 i = 0; i < 4 && 4 * g + i < A->n1; i++) {
        float x = lanes[i] + (w->bias ? w->bias[4 * g + i] : 0.0f), *dst = yrow + 4 * g + i;
        *dst = accumulate ? *dst + x : x;
    }
}

// linear_rows for a packed matrix: activation rows in GEMM tiles of up to GEMM_ROWS (relaxed int8 and exact
// activations) or 4-row tiles (int16), a single row by the GEMV. Per tile, every weight group in turn (the tile's
// activations stay in L1 while the weights stream).
INLINE void linear_packed(u32 dt, const Weight *w, const Acts *A, float *y, u32 y_stride, u32 rows, int accumulate,
                          int mode) {
    v128_t out[GEMM_ROWS];
    // (HALVES: never the GEMM, whose unit sums are one per row: their prompt rows take the 4-row tiles)
    int gemm = !HALVES(dt) && (packed_i8(dt, mode) || mode == EXACT_INT);
    u32 g0 = A->n0 / 4, g1 = (A->n1 + 3) / 4;
    for (u32 r0 = 0; r0 < rows;) {
        u32 R = !gemm ? (rows - r0 >= 4 ? 4 : 1) : rows - r0 < GEMM_ROWS ? rows - r0 : GEMM_ROWS;
        if (R == 1) {  // the GEMV: the groups in ns parts, a group of each at a time
            int ns = streamed(mode) ? GEMV_STREAMS : 1;
            u32 part = (g1 - g0 + ns - 1) / ns;
            for (u32 i = 0; i < part; i++) {
                u32 gs[GEMV_STREAMS];
                int n = 0;  // the parts that still have a group i (a prefix: the last part may be shorter)
                for (int j = 0; j < ns; j++)
                    if ((gs[j] = g0 + j * part + i) < g1) n++;
                if (n == ns) packed_groups(dt, w, gs, ns, A, r0, mode, out);
                else
                    for (int j = 0; j < n; j++) packed_groups(dt, w, gs + j, 1, A, r0, mode, out + j);
                for (int j = 0; j < n; j++) store_group(w, A, out[j], gs[j], y + r0 * y_stride, accumulate);
            }
            r0 += 1;
            continue;
        }
        for (u32 g = g0; g < g1; g++) {
            if (!gemm) packed_group4(dt, w, g, A, r0, mode, out);
            else packed_gemm_group(dt, w, g, A, r0, R, mode, out);
            for (u32 r = 0; r < R; r++) store_group(w, A, out[r], g, y + (r0 + r) * y_stride, accumulate);
        }
        r0 += R;
    }
}

// one specialised loop per packed format and activation mode
static void linear_packed_any(const Weight *w, const Acts *A, float *y, u32 y_stride, u32 rows, int acc, int mode) {
#define LP(dt)                                                                          \
    do {                                                                                \
        if (mode == EXACT_INT) linear_packed(dt, w, A, y, y_stride, rows, acc, EXACT_INT); \
        else if (mode == EXACT_I8 && !BYTE_PACKED(dt)) linear_packed(dt, w, A, y, y_stride, rows, acc, EXACT_I8); \
        else if (mode == ACT_I16) linear_packed(dt, w, A, y, y_stride, rows, acc, ACT_I16); \
        else linear_packed(dt, w, A, y, y_stride, rows, acc, ACT_I8);                    \
    } while (0)
    if (w->dtype == F_Q4) LP(F_Q4);
    else if (w->dtype == F_Q4A) LP(F_Q4A);
    else if (w->dtype == F_Q8H) LP(F_Q8H);
    else if (w->dtype == F_Q8B) LP(F_Q8B);
    else if (w->dtype == F_Q4H) LP(F_Q4H);
    else if (w->dtype == F_Q4Z) LP(F_Q4Z);
    else LP(F_Q8);
#undef LP
}

// y[r, n] (+)= W x[r] (+ bias) for `rows` activation rows: GEMV for one row, 4-row GEMM tiles for more.
// scratch: room for prepare_acts (wi_linear_scratch_bytes); prepare: see prepare_acts. Only the output columns
// [n0, n1) are computed (a thread's share; n0 a multiple of 4, the packed layout's row group).
// The bench's switch (wi_bench_skip_linear): every linear() returns at once, so a step's time is its remainder
// (attention, norms, RoPE, SwiGLU, sampling), measured directly rather than as a difference that noise can make
// negative. Never set outside the bench: the outputs are then garbage.
static u32 skip_linear;

// A packed matrix's activation arrays in scratch (A->x set), for `rows` rows in mode `fast` (linear()'s after its
// f32 -> EXACT_INT mapping); returns the mode the packed kernels run (the relaxed build's GEMV: EXACT_I8 for exact
// nibble formats)
INLINE int packed_acts(const Weight *w, Acts *A, u8 *scratch, u32 rows, int fast) {
    u32 kp = w->kp;
    u8 *p = scratch;
    A->xd = (float *)p;
    p += rows * (kp / 32) * 4;
    A->xs32 = (float *)p;
    p += rows * (kp / 32) * 4;
    A->xs16 = (float *)p;  // (in the room linear()'s xsum takes in the package layouts)
    p = (u8 *)(((uintptr_t)p + rows * (kp / 16) * 4 + 15) & ~(uintptr_t)15);
    A->xw = (i16 *)p;
    A->xq = (i8 *)(p + rows * kp * 4);
    A->xl = (i16 *)(p + rows * kp * 4);  // xq (int8 codes) and xl (exact mode) are never both used
#ifdef RELAXED
    if (fast == EXACT_INT && !BYTE_PACKED(w->dtype) && rows == 1) {
        fast = EXACT_I8;
        A->xq = (i8 *)p;  // the three digits (kp * 12 bytes) in place of xw and xl
    }
#endif
    return fast;
}

EXPORT(wi_bench_skip_linear) void wi_bench_skip_linear(u32 on) { skip_linear = on; }

static void linear(const Weight *w, const float *x, u32 x_stride, float *y, u32 y_stride, u32 rows, int accumulate,
                   int fast, u8 *scratch, int prepare, u32 n0, u32 n1) {
    if (skip_linear) return;
    u32 kp = w->dtype == F_F32 ? w->k : w->kp;
    Acts A = {x, x_stride, (float *)scratch, 0, 0, 0, 0, 0, n0, n1, 0};
    if (w->dtype == F_F32) fast = ACT_F32;  // in: 0 exact, 1 int8 activations, 2 int16 activations
    else if (fast == ACT_F32) fast = EXACT_INT;  // every quantized format: integer dots at f32 precision
    if (w->packed == 1) {  // (always a VEC4 format: exact mode is EXACT_INT)
        fast = packed_acts(w, &A, scratch, rows, fast);
        if (prepare) prepare_packed(&A, rows, w->k, kp, fast, packed_i8(w->dtype, fast));
        linear_packed_any(w, &A, y, y_stride, rows, accumulate, fast);
        return;
    }
    if (w->dtype != F_F32) {
        u8 *p = scratch + rows * (kp / 16) * 4;
        A.xd = (float *)p;
        p += rows * (kp / 32) * 4;
        A.xs32 = (float *)p;
        p += rows * (kp / 32) * 4;
        A.xw = (i16 *)p;
        p += rows * kp * 2;
        A.xq = (i8 *)p;
        A.xl = (i16 *)p;  // EXACT_INT uses neither xq nor xpad: its 2 bytes per element fit their 5
        p += rows * kp;
        prepare_acts(&A, rows, w->k, kp, fast, ODD_EVEN(w->dtype), (float *)(((uintptr_t)p + 15) & ~(uintptr_t)15),
                     prepare);
    }
    switch (w->dtype) {  // one specialised loop per format: the format's branches fold away
        case F_F32: linear_rows(F_F32, w, &A, y, y_stride, rows, accumulate, 0); break;
        case F_Q4: linear_rows(F_Q4, w, &A, y, y_stride, rows, accumulate, fast); break;
        case F_Q4A: linear_rows(F_Q4A, w, &A, y, y_stride, rows, accumulate, fast); break;
        case F_Q8: linear_rows(F_Q8, w, &A, y, y_stride, rows, accumulate, fast); break;
        case F_Q5_0: linear_rows(F_Q5_0, w, &A, y, y_stride, rows, accumulate, fast); break;
        case F_Q5_1: linear_rows(F_Q5_1, w, &A, y, y_stride, rows, accumulate, fast); break;
        case F_Q4K: linear_rows(F_Q4K, w, &A, y, y_stride, rows, accumulate, fast); break;
        case F_Q5K: linear_rows(F_Q5K, w, &A, y, y_stride, rows, accumulate, fast); break;
        case F_Q6K: linear_rows(F_Q6K, w, &A, y, y_stride, rows, accumulate, fast); break;
        case F_Q3K: linear_rows(F_Q3K, w, &A, y, y_stride, rows, accumulate, fast); break;
        case F_Q2K: linear_rows(F_Q2K, w, &A, y, y_stride, rows, accumulate, fast); break;
        case F_IQ4NL: linear_rows(F_IQ4NL, w, &A, y, y_stride, rows, accumulate, fast); break;
        case F_IQ4XS: linear_rows(F_IQ4XS, w, &A, y, y_stride, rows, accumulate, fast); break;
    }
}

// ------------------------------------------------------------------------------------------------ LM head in two passes
//
// A greedy row (argmax; no logprobs, penalties, mask or bias) needs only the id of its largest logit; a row sampled
// with min_p or top-p only the logits near it (head_cut, draw()). In exact mode a packed LM head then runs in two
// passes. head_bounds: every row's sums against the high digits of x only (exact mode's X = hi * 256 + lo, the lo
// dots skipped: the integer work of fast mode's int16 GEMV, about half an exact one), v, with a bound B on |v - e|, e
// the logit the one-pass head computes (linear()'s bits). With L the largest v - B over the threads, head_candidates
// computes again, in full exact mode, every group of 4 rows holding a row with v + B >= the row's cut (greedy: L).
// A greedy row left out has e <= v + B < L <= e' of the row that gave L, so it is neither the argmax nor tied with
// it: the id is the one-pass head's, ties included (lowest id); head_cut gives the sampled rows' argument. The
// logits row then holds exact values for the candidates' groups and v + B for the rest; the runner's logits() asks
// for every row exact (FULL_LOGITS).
//
// B, per unit u of a row, p_u = fl(a_u xd_u) (its scale times the activations' block scale, as unit_step rounds it):
// the skipped sum |il_u| <= 128 * 32 QMAX (|lo| <= 128, |code| <= QMAX); both passes' f32 roundings (t_u = 256 is_u
// + il_u rounded once; n <= 2 nu + 2 products and sums of terms at most T = 32 QMAX (256 * 32640 + 128)) add at most
// 2^-24 T + 2 gamma_n T <= 32 QMAX (0.5 + 1.01 n). So |v - e| <= C sum_u |p_u|, C = 32 QMAX (129 + 1.01 n), and the
// b term's and the bias's additions add < 2^-22 (|v| + |out|): B takes (1 + 2^-10) of the first, 2^-18 of the second
// and 1e-30 (underflow) — generous, and still ~1e-3 of a logit's scale (measured: 1-3 candidate groups a step).
INLINE float qmax_of(u32 dt) { return dt == F_Q8 ? 128.0f : dt == F_Q8H ? 32.0f : dt == F_Q8B ? 31.0f : 15.0f; }

// The first pass over rows [A->n0, A->n1) against one activation row prepared for `mode` (exact): y[n] = v + B;
// returns the largest v - B, or NaN when any v or B is not finite (head_candidates then computes every row)
INLINE float head_bounds(u32 dt, const Weight *w, const Acts *A, int mode, float *y, float *bmax) {
    u32 nu = w->kp / 32, g0 = A->n0 / 4, g1 = (A->n1 + 3) / 4, part = (g1 - g0 + 1) / 2;
    v128_t C = wasm_f32x4_splat(32.0f * qmax_of(dt) * (129.0f + 1.01f * (float)(2 * nu + 2)) * (1.0f + 0x1p-10f));
    v128_t inf = wasm_f32x4_splat(__builtin_inff()), best = wasm_f32x4_splat(-__builtin_inff()), ok = wasm_i32x4_splat(-1);
    v128_t bm = wasm_f32x4_splat(0.0f);  // the largest B
    for (u32 i = 0; i < part; i++) {  // two streams of groups, as the fast GEMV (the weights stream from memory)
        u32 gs[2] = {g0 + i, g0 + part + i};
        int ns = gs[1] < g1 ? 2 : 1;
        v128_t out[2], bnd[2];
        if (ns == 2) packed_groups_hi(dt, w, gs, 2, A, 0, mode, out, 1, bnd);
        else packed_groups_hi(dt, w, gs, 1, A, 0, mode, out, 1, bnd);
        for (int j = 0; j < ns; j++) {
            u32 n = 4 * gs[j], m = A->n1 - n < 4 ? A->n1 - n : 4;  // rows of this group in [n0, n1)
            v128_t bias = wasm_f32x4_splat(0.0f);
            if (w->bias)
                bias = wasm_f32x4_make(w->bias[n], m > 1 ? w->bias[n + 1] : 0.0f, m > 2 ? w->bias[n + 2] : 0.0f,
                                       m > 3 ? w->bias[n + 3] : 0.0f);
            v128_t v = wasm_f32x4_add(out[j], bias);  // (store_group's value)
            v128_t b = wasm_f32x4_add(wasm_f32x4_add(wasm_f32x4_mul(C, bnd[j]),
                                                     wasm_f32x4_mul(wasm_f32x4_splat(0x1p-18f),
                                                                    wasm_f32x4_add(wasm_f32x4_abs(v),
                                                                                   wasm_f32x4_abs(out[j])))),
                                      wasm_f32x4_splat(1e-30f));
            v128_t keep = wasm_i32x4_make(-1, m > 1 ? -1 : 0, m > 2 ? -1 : 0, m > 3 ? -1 : 0);
            // a lane past n1 counts as finite and as -inf below
            ok = wasm_v128_and(ok, wasm_v128_or(wasm_v128_andnot(wasm_i32x4_splat(-1), keep),
                                                wasm_v128_and(wasm_f32x4_lt(wasm_f32x4_abs(v), inf),
                                                              wasm_f32x4_lt(b, inf))));
            best = wasm_f32x4_pmax(best, wasm_v128_bitselect(wasm_f32x4_sub(v, b), wasm_f32x4_neg(inf), keep));
            bm = wasm_f32x4_pmax(bm, wasm_v128_and(b, keep));
            v128_t up = wasm_f32x4_add(v, b);
            if (m == 4) wasm_v128_store(y + n, up);
            else {
                float t[4] __attribute__((aligned(16)));
                wasm_v128_store(t, up);
                for (u32 l = 0; l < m; l++) y[n + l] = t[l];
            }
        }
    }
    if (!wasm_i32x4_all_true(ok)) return __builtin_nanf("");
    float m0 = wasm_f32x4_extract_lane(bm, 0), m1 = wasm_f32x4_extract_lane(bm, 1);
    float m2 = wasm_f32x4_extract_lane(bm, 2), m3 = wasm_f32x4_extract_lane(bm, 3);
    m0 = m1 > m0 ? m1 : m0;
    m2 = m3 > m2 ? m3 : m2;
    *bmax = m2 > m0 ? m2 : m0;
    float b0 = wasm_f32x4_extract_lane(best, 0), b1 = wasm_f32x4_extract_lane(best, 1);
    float b2 = wasm_f32x4_extract_lane(best, 2), b3 = wasm_f32x4_extract_lane(best, 3);
    b0 = b1 > b0 ? b1 : b0;
    b2 = b3 > b2 ? b3 : b2;
    return b2 > b0 ? b2 : b0;
}

// The second pass over rows [A->n0, A->n1): the groups holding a row with y >= L (every group when L is NaN) in
// full exact mode, stored over their bounds; A: head_bounds' preparation
INLINE void head_candidates(u32 dt, const Weight *w, const Acts *A, int mode, float *y, float L) {
    u32 n = A->n1, full = n / 4, all = L != L;
    v128_t lv = wasm_f32x4_splat(L);
    for (u32 g = A->n0 / 4; g < (n + 3) / 4; g++) {
        int need = all;
        if (!need && g < full) need = wasm_v128_any_true(wasm_f32x4_ge(wasm_v128_load(y + 4 * g), lv));
        for (u32 i = 0; !need && g == full && 4 * g + i < n; i++) need = y[4 * g + i] >= L;
        if (!need) continue;
        v128_t out;
        packed_groups(dt, w, &g, 1, A, 0, mode, &out);  // (exact modes run one stream: linear_packed's GEMV)
        store_group(w, A, out, g, y, 0);
    }
}

// head_bounds (first = 1, returns the largest lower bound, the largest B in *bmax) or head_candidates (first = 0,
// cut L) over rows [n0, n1) (n0 a multiple of 4) for packed w and the one activation row x (prepared in scratch by
// each pass: a few microseconds)
static float head_pass(const Weight *w, const float *x, float *y, u8 *scratch, u32 n0, u32 n1, int first, float L,
                       float *bmax) {
    Acts A = {x, w->k, (float *)scratch, 0, 0, 0, 0, 0, n0, n1, 0};
    int mode = packed_acts(w, &A, scratch, 1, EXACT_INT);
    prepare_packed(&A, 1, w->k, w->kp, mode, 0);
#define HP(dt)                                                                                              \
    do {                                                                                                    \
        if (!first && mode == EXACT_I8) head_candidates(dt, w, &A, EXACT_I8, y, L);                         \
        else if (!first) head_candidates(dt, w, &A, EXACT_INT, y, L);                                       \
        else if (mode == EXACT_I8) return head_bounds(dt, w, &A, EXACT_I8, y, bmax);                        \
        else return head_bounds(dt, w, &A, EXACT_INT, y, bmax);                                             \
    } while (0)
    if (w->dtype == F_Q4) HP(F_Q4);
    else if (w->dtype == F_Q4A) HP(F_Q4A);
    else if (w->dtype == F_Q8H) HP(F_Q8H);
    else if (w->dtype == F_Q8B) HP(F_Q8B);
    else if (w->dtype == F_Q4H) HP(F_Q4H);
    else if (w->dtype == F_Q4Z) HP(F_Q4Z);
    else HP(F_Q8);
#undef HP
    return 0.0f;
}

// ------------------------------------------------------------------------------------------------ other ops

// sqrt(mean(x^2) + eps) of one row of d
INLINE float rms_den(const float *x, u32 d, float eps) {
    v128_t acc = wasm_f32x4_splat(0.0f);
    u32 d4 = d & ~3u;
    for (u32 i = 0; i < d4; i += 4) {
        v128_t v = wasm_v128_load(x + i);
        acc = wasm_f32x4_add(acc, wasm_f32x4_mul(v, v));
    }
    float ss = hsum(acc);
    for (u32 i = d4; i < d; i++) ss += x[i] * x[i];
    return __builtin_sqrtf(ss / (float)d + eps);
}

// y = x / sqrt(mean(x^2) + eps) * w, per row (the reference's order: divide, then scale)
static void rmsnorm(const float *x, u32 x_stride, const float *w, float *y, u32 y_stride, u32 rows, u32 d, float eps) {
    for (u32 r = 0; r < rows; r++) {
        const float *xr = x + r * x_stride;
        float *yr = y + r * y_stride, den = rms_den(xr, d, eps);
        for (u32 i = 0; i < d; i++) yr[i] = (xr[i] / den) * w[i];
    }
}

// half-split rotation of n_heads heads of row x at table row `pos` (cos/sin tables [max_pos, hd/2])
static void rope_row(float *x, u32 n_heads, u32 hd, const float *cos_t, const float *sin_t, u32 pos) {
    u32 half = hd / 2;
    const float *c = cos_t + pos * half, *s = sin_t + pos * half;
    for (u32 h = 0; h < n_heads; h++) {
        float *v = x + h * hd;
        for (u32 i = 0; i < half; i++) {
            float x1 = v[i], x2 = v[i + half];
            v[i] = x1 * c[i] - x2 * s[i];
            v[i + half] = x2 * c[i] + x1 * s[i];
        }
    }
}

INLINE float silu(float x) { return x / (1.0f + expf_(-x)); }

// tanh(x) in f32 within a few 1e-8 (absolute): an odd series below 1/8 (no cancellation), else
// sign(x) (1 - e) / (1 + e), e = exp(-2|x|). Gemma's soft-capping and GELU use it.
static float tanhf_(float x) {
    float a = x < 0 ? -x : x, t;
    if (a < 0.125f) {
        float a2 = a * a;
        t = a + a * a2 * (-1.0f / 3.0f + a2 * (2.0f / 15.0f + a2 * (-17.0f / 315.0f)));
    } else {
        float e = expf_(-2.0f * a);
        t = (1.0f - e) / (1.0f + e);
    }
    return x < 0 ? -t : t;  // (NaN: expf_ passes it through)
}

// GELU, tanh approximation (the reference's gelu_tanh: PyTorch's gelu(approximate='tanh'), Gemma's MLP)
INLINE float gelu_tanh(float x) {
    return 0.5f * x * (1.0f + tanhf_(0.7978845608028654f * (x + 0.044715f * (x * x * x))));
}

// cap * tanh(x / cap): Gemma 2's soft-capping of attention scores and final logits
INLINE float softcap(float x, float cap) { return cap * tanhf_(x / cap); }

INLINE float dot_f32(const float *a, const float *b, u32 n) {
    v128_t acc = wasm_f32x4_splat(0.0f);
    u32 n4 = n & ~3u;
    for (u32 i = 0; i < n4; i += 4) acc = wasm_f32x4_add(acc, wasm_f32x4_mul(wasm_v128_load(a + i), wasm_v128_load(b + i)));
    float s = hsum(acc);
    for (u32 i = n4; i < n; i++) s += a[i] * b[i];
    return s;
}

// dot_f32(q, k_c, hd) / scale for 4 key rows at once (hd a multiple of 4): the same lane sums and the same
// horizontal sum order ((l0 + l1) + (l2 + l3)) per row, through a transpose
INLINE void attend_scores4(const float *q, const float *k0, const float *k1, const float *k2, const float *k3, u32 hd,
                           float scale, float mul, float *out) {
    v128_t a = wasm_f32x4_splat(0.0f), b = a, c = a, d = a;
    for (u32 i = 0; i < hd; i += 4) {
        v128_t qv = wasm_v128_load(q + i);
        a = wasm_f32x4_add(a, wasm_f32x4_mul(qv, wasm_v128_load(k0 + i)));
        b = wasm_f32x4_add(b, wasm_f32x4_mul(qv, wasm_v128_load(k1 + i)));
        c = wasm_f32x4_add(c, wasm_f32x4_mul(qv, wasm_v128_load(k2 + i)));
        d = wasm_f32x4_add(d, wasm_f32x4_mul(qv, wasm_v128_load(k3 + i)));
    }
    v128_t ab = wasm_f32x4_add(wasm_i32x4_shuffle(a, b, 0, 4, 2, 6), wasm_i32x4_shuffle(a, b, 1, 5, 3, 7));
    v128_t cd = wasm_f32x4_add(wasm_i32x4_shuffle(c, d, 0, 4, 2, 6), wasm_i32x4_shuffle(c, d, 1, 5, 3, 7));
    v128_t s = wasm_f32x4_add(wasm_i32x4_shuffle(ab, cd, 0, 1, 4, 5), wasm_i32x4_shuffle(ab, cd, 2, 3, 6, 7));
    wasm_v128_store(out, mul != 0.0f ? wasm_f32x4_mul(s, wasm_f32x4_splat(mul)) : wasm_f32x4_div(s, wasm_f32x4_splat(scale)));
}

// Attention's softmax weights: exp(x - mx), and 0 where x - mx < -64 ln 2 (a weight below 2^-64 of the maximum's).
// Why: x86 runs an arithmetic op with a subnormal operand or result ~100x slower, and wasm gives no flush-to-zero
// mode; a long context's scores spread far below the maximum, where exp and then p / sum and p x v go subnormal
// (one layer at 1000 positions with spread scores: 5x its time on normal numbers). What is dropped: each term
// p_j v_j with p_j < 2^-64 (the maximum's p >= 1 / n): together < n 2^-64 max |v| (5e-16 at n = 1000, |v| <= 10),
// under half an ulp of any output element above ~2e-8, and an absolute error of that size below it.
#define EXP_FLOOR (-44.3614196f)  // -64 ln 2
INLINE float softmax_exp(float x) { return x < EXP_FLOOR ? 0.0f : expf_(x); }

// expf_(x) in every lane, bit for bit, where 2^n is a normal f32 (x in about [-87.3, 88.7]: expf_'s main path)
INLINE v128_t exp4_normal(v128_t x) {
    v128_t n = wasm_f32x4_nearest(wasm_f32x4_mul(x, wasm_f32x4_splat(1.44269504088896341f)));
    v128_t r = wasm_f32x4_sub(x, wasm_f32x4_mul(n, wasm_f32x4_splat(0.693145751953125f)));
    r = wasm_f32x4_sub(r, wasm_f32x4_mul(n, wasm_f32x4_splat(1.428606765330187e-06f)));
    v128_t e = wasm_f32x4_splat(1.0f / 5040.0f);
    e = wasm_f32x4_add(wasm_f32x4_mul(e, r), wasm_f32x4_splat(1.0f / 720.0f));
    e = wasm_f32x4_add(wasm_f32x4_mul(e, r), wasm_f32x4_splat(1.0f / 120.0f));
    e = wasm_f32x4_add(wasm_f32x4_mul(e, r), wasm_f32x4_splat(1.0f / 24.0f));
    e = wasm_f32x4_add(wasm_f32x4_mul(e, r), wasm_f32x4_splat(1.0f / 6.0f));
    e = wasm_f32x4_add(wasm_f32x4_mul(e, r), wasm_f32x4_splat(0.5f));
    e = wasm_f32x4_add(wasm_f32x4_mul(e, r), wasm_f32x4_splat(1.0f));
    e = wasm_f32x4_add(wasm_f32x4_mul(e, r), wasm_f32x4_splat(1.0f));
    v128_t two_n = wasm_i32x4_shl(wasm_i32x4_add(wasm_i32x4_trunc_sat_f32x4(n), wasm_i32x4_splat(127)), 23);
    return wasm_f32x4_mul(e, two_n);
}

// p[0..3] = softmax_exp(p[i] - mx), 4 at a time, bit for bit: expf_'s arithmetic in every lane (x in [EXP_FLOOR,
// 0]: 2^n is a normal f32), zero below; a lane above 0 or NaN (never in a softmax, where mx is the maximum) takes
// expf_ itself.
INLINE void expf4(float *p, float mx) {
    v128_t x = wasm_f32x4_sub(wasm_v128_load(p), wasm_f32x4_splat(mx));
    if (!wasm_i32x4_all_true(wasm_f32x4_le(x, wasm_f32x4_splat(0.0f)))) {
        float xs[4] __attribute__((aligned(16)));
        wasm_v128_store(xs, x);
        for (u32 i = 0; i < 4; i++) p[i] = softmax_exp(xs[i]);
        return;
    }
    v128_t low = wasm_f32x4_lt(x, wasm_f32x4_splat(EXP_FLOOR));
    x = wasm_v128_andnot(x, low);  // (those lanes: exp(0), discarded; no huge n to convert)
    wasm_v128_store(p, wasm_v128_andnot(exp4_normal(x), low));
}

// o[0 .. 4 NV) = sum over positions j0 <= j <= pos of p[j] v_j (v_j = v + rows[j]: position j's row), the
// NV vectors held in registers over the positions (the additions and their order are those of accumulating in
// memory, without a store and a load per position)
INLINE void attend_pv(float *o, const float *v, const float *p, const u32 *rows, u32 j0, u32 pos, int NV) {
    v128_t acc[8];
    for (int c = 0; c < NV; c++) acc[c] = wasm_f32x4_splat(0.0f);
    for (u32 j = j0; j <= pos; j++) {
        const float *vj = v + rows[j];
        v128_t pv = wasm_f32x4_splat(p[j]);
        for (int c = 0; c < NV; c++) acc[c] = wasm_f32x4_add(acc[c], wasm_f32x4_mul(pv, wasm_v128_load(vj + 4 * c)));
    }
    for (int c = 0; c < NV; c++) wasm_v128_store(o + 4 * c, acc[c]);
}

// Causal attention of one query row q [n_heads * hd] at position `pos` over cached positions [0, pos] of one
// sequence (K/V [num_blocks, block_size, n_kv_heads, hd] per layer; table maps position / block_size to a block).
// Scores: q.k * mul, or q.k / sqrt(hd) where mul = 0 (the llama block's scale: exact for hd a power of 4);
// soft-capped by cap (0: none); window (0: none): only keys with pos - j < window (a sliding layer).
// scores: 2 (pos + 4) floats (the scores, then each position's cache offset).
static void attend_row(const float *q, float *out, const float *kc, const float *vc, const u32 *table, u32 pos,
                       u32 n_heads, u32 n_kv, u32 hd, u32 bs, float *scores, u32 h0, u32 h1, float mul, float cap,
                       u32 window) {
    u32 kvd = n_kv * hd, group = n_heads / n_kv, j0 = window && pos >= window ? pos - window + 1 : 0;
    float scale = __builtin_sqrtf((float)hd);
    // rows[j]: position j's offset in the cache (floats), once per call, not a division and a table load per
    // position in each head's each pass (with the exp floor: decode at a 1000-token context x1.05-1.06)
    u32 *rows = (u32 *)(scores + ((pos + 4) & ~3u));
    for (u32 j = j0; j <= pos;) {
        u32 b = j / bs, o = j % bs, base = table[b] * bs;
        for (; o < bs && j <= pos; o++, j++) rows[j] = (base + o) * kvd;
    }
    for (u32 h = h0; h < h1; h++) {  // (query heads [h0, h1): a thread's share)
        const float *qh = q + h * hd;
        u32 kvh = h / group;
        u32 j = j0;
        if (hd % 4 == 0)
            for (; j + 3 <= pos; j += 4) {
                const float *kj = kc + kvh * hd;
                attend_scores4(qh, kj + rows[j], kj + rows[j + 1], kj + rows[j + 2], kj + rows[j + 3], hd, scale, mul,
                               scores + j);
            }
        for (; j <= pos; j++) {
            float dt = dot_f32(qh, kc + rows[j] + kvh * hd, hd);
            scores[j] = mul != 0.0f ? dt * mul : dt / scale;
        }
        if (cap != 0.0f)
            for (j = j0; j <= pos; j++) scores[j] = softcap(scores[j], cap);
        float mx = bits_f32(0xff800000u);
        for (j = j0; j <= pos; j++) mx = scores[j] > mx ? scores[j] : mx;
        float sum = 0.0f;
        for (j = j0; j + 3 <= pos; j += 4) {
            expf4(scores + j, mx);
            sum = (((sum + scores[j]) + scores[j + 1]) + scores[j + 2]) + scores[j + 3];
        }
        for (; j <= pos; j++) {
            float e = softmax_exp(scores[j] - mx);
            scores[j] = e;
            sum += e;
        }
        for (u32 j = j0; j <= pos; j++) scores[j] = scores[j] / sum;
        float *o = out + h * hd;
        const float *vh = vc + kvh * hd;
        u32 i = 0;
        for (; i + 32 <= hd; i += 32) attend_pv(o + i, vh + i, scores, rows, j0, pos, 8);
        for (; i + 4 <= hd; i += 4) attend_pv(o + i, vh + i, scores, rows, j0, pos, 1);
        for (; i < hd; i++) {
            o[i] = 0.0f;
            for (u32 j = j0; j <= pos; j++) o[i] += scores[j] * vh[rows[j] + i];
        }
    }
}

// ------------------------------------------------------------------------------------------------ sampling

// Order-preserving map f32 -> u32 (as sample.wgsl's okey)
INLINE u32 okey(float x) {
    u32 b = f32_bits(x);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

INLINE u32 pcg(u32 v) {
    u32 s = v * 747796405u + 2891336453u;
    u32 w = ((s >> ((s >> 28) + 4)) ^ s) * 277803737u;
    return (w >> 22) ^ w;
}

// webinfer/kernels/sampling.py's RowParams (sample.wgsl), packed by its pack()
typedef struct {
    u32 logit_row, top_k, seed, index;
    float temperature, top_p;
    u32 mask_off, bias_off, bias_n;  // word offsets into the step's aux words; mask_off NONE: no mask
    u32 counts_slot;
    float freq, pres, rep, min_p;
    u32 n_logprobs;
    u32 score_id;  // < vocab: the logprob reported is this id's, not the sampled one's (prompt logprobs)
} SampleParams;

// greedy: the argmax (temperature 0, or top-k 1)
INLINE int greedy(const SampleParams *p) { return p->temperature <= 0.0f || p->top_k == 1; }

#define NONE 0xffffffffu

// natural log of a positive normal x (min_p's threshold, the logprobs' log-sum-exp), within a few ulp: x = 2^e m,
// m in [sqrt(1/2), sqrt(2)), log m = 2 atanh(s), s = (m - 1) / (m + 1), by its odd series
static float logf_(float x) {
    u32 b = f32_bits(x);
    i32 e = (i32)((b >> 23) & 0xff) - 127;
    float m = bits_f32((b & 0x7fffffu) | 0x3f800000u);
    if (m > 1.41421356f) { m *= 0.5f; e += 1; }
    float t = (m - 1.0f) / (m + 1.0f), t2 = t * t;
    float poly = 1.0f + t2 * (1.0f / 3 + t2 * (1.0f / 5 + t2 * (1.0f / 7 + t2 * (1.0f / 9 + t2 * (1.0f / 11)))));
    return 2.0f * t * poly + (float)e * 0.693147180559945f;
}

// LSD radix sort of n (key, value) pairs by key ascending, stable: 4 byte passes from (ka, va) through (kb, vb)
// back to (ka, va)
static void radix_sort(u32 *ka, u32 *va, u32 *kb, u32 *vb, u32 n) {
    for (u32 sh = 0; sh < 32; sh += 8) {
        u32 cnt[256];
        for (u32 b = 0; b < 256; b++) cnt[b] = 0;
        for (u32 i = 0; i < n; i++) cnt[(ka[i] >> sh) & 255]++;
        u32 tot = 0;
        for (u32 b = 0; b < 256; b++) { u32 c = cnt[b]; cnt[b] = tot; tot += c; }
        for (u32 i = 0; i < n; i++) {
            u32 o = cnt[(ka[i] >> sh) & 255]++;
            kb[o] = ka[i];
            vb[o] = va[i];
        }
        u32 *t = ka; ka = kb; kb = t;
        t = va; va = vb; vb = t;
    }
}

// The sampler's head: the ids with x = (l - max) / T >= HEAD_X (expf_(x) >= ~2^-24). Top-p's cut (the shortest
// prefix, by logit descending, whose mass reaches top_p of the kept mass) lies inside it unless the ids below it
// hold more than 1 - top_p of that mass, so draw() sorts the head alone (a few to a few thousand ids of a 262k
// vocabulary, measured on Gemma 3 at T 0.7) and sorts every id only when the head's walk ends short of the goal.
#define HEAD_X (-16.7f)
static u32 sort_all;  // tests (wi_test_sort_all): draw() sorts every id and sums every term (TINY_X), the rule as
                      // written, to compare with

// The sampler's sums are doubles: in float, a sum over a 262k vocabulary rounds away every term under half an ulp
// of the running sum, and Gemma 3 at T 1.5 has 7.8 % of its mass in tokens below p = 1e-5: draws landed hundreds
// of ids from the reference's (docs/cpu-backend.md "The sampler's sums in doubles"). A term expf_(x) with x below
// TINY_X is < 2^-124, under half an ulp of any double >= 2^-60: added to such a sum it rounds back to
// the same double. Summing in id order (draw() with every id kept, logprobs_top's log-sum-exp), the sum passes
// 2^-60 at the max's term (exactly 1) at the latest, so from there such terms are skipped, bit for bit the same
// sums, without expf_'s subnormal multiplies (slow on x86 cores) for them (docs/cpu-backend.md "Tiny terms").
#define TINY_X (-87.0f)
INLINE int tiny_term(float x, double sum) { return x < TINY_X && sum >= 0x1p-60 && !sort_all; }

// x[0..3] = (l[i] - mx) * inv_t and t[0..3] = expf_(x[i]) for the lanes with x in [TINY_X, 0], 4 at a time, bit for
// bit expf_'s arithmetic (there 2^n is a normal f32); the other lanes' t is 0, for the caller to take from expf_ or
// skip (tiny_term).
INLINE void terms4(const float *l, float mx, float inv_t, float *x, float *t) {
    v128_t v = wasm_f32x4_mul(wasm_f32x4_sub(wasm_v128_load(l), wasm_f32x4_splat(mx)), wasm_f32x4_splat(inv_t));
    wasm_v128_store(x, v);
    v128_t in = wasm_v128_and(wasm_f32x4_ge(v, wasm_f32x4_splat(TINY_X)), wasm_f32x4_le(v, wasm_f32x4_splat(0.0f)));
    wasm_v128_store(t, wasm_v128_and(exp4_normal(wasm_v128_and(v, in)), in));  // (other lanes: exp(0), dropped)
}

// The running sum (a double) of every id's term expf_((l[i] - mx) * inv_t) in id order, as one term at a time
// would give it (tiny_term skipped): the mass (r < 0), or the first id at which it exceeds r (vocab - 1 if none: r
// within rounding of the total; *id answers)
static double sum_terms(const float *l, u32 vocab, float mx, float inv_t, double r, u32 *id) {
    double c = 0.0;
    float x[4] __attribute__((aligned(16))), t[4] __attribute__((aligned(16)));
    u32 i = 0;
    for (; i + 4 <= vocab && !sort_all; i += 4) {  // (tests: sort_all sums one term at a time, every term)
        terms4(l + i, mx, inv_t, x, t);
        for (u32 j = 0; j < 4; j++) {
            if (!(x[j] >= TINY_X && x[j] <= 0.0f)) {  // (below, above 0 or NaN: as one term at a time)
                if (tiny_term(x[j], c)) continue;
                t[j] = expf_(x[j]);
            }
            c += t[j];
            if (r >= 0.0 && c > r) { *id = i + j; return c; }
        }
    }
    for (; i < vocab; i++) {
        float xi = (l[i] - mx) * inv_t;
        if (!tiny_term(xi, c)) c += expf_(xi);
        if (r >= 0.0 && c > r) { *id = i; return c; }
    }
    *id = vocab - 1;
    return c;
}

// The mass of every id's term, as sum_terms(r < 0) gives it but in four double accumulators (two f64x2 lanes
// pairs; a term under TINY_X counts 0): the same value within a few ulps of a double, without the one-at-a-time
// chain of adds. NaN if any x is NaN. The walk (sum_terms) stops where its running sum passes u x this mass; u <
// 1 - 2^-24 keeps that point inside the sum's end whatever the last ulps. (sort_all: sum_terms itself.)
static double mass_terms(const float *l, u32 vocab, float mx, float inv_t) {
    u32 id, i = 0;
    if (sort_all) return sum_terms(l, vocab, mx, inv_t, -1.0, &id);
    v128_t a0 = wasm_f64x2_splat(0.0), a1 = a0, nan = wasm_i32x4_splat(0);
    float xs[4] __attribute__((aligned(16))), ts[4] __attribute__((aligned(16)));
    for (; i + 4 <= vocab; i += 4) {
        terms4(l + i, mx, inv_t, xs, ts);  // (terms under TINY_X, and NaN lanes, come back 0)
        v128_t x = wasm_v128_load(xs), t = wasm_v128_load(ts);
        nan = wasm_v128_or(nan, wasm_f32x4_ne(x, x));
        a0 = wasm_f64x2_add(a0, wasm_f64x2_promote_low_f32x4(t));
        a1 = wasm_f64x2_add(a1, wasm_f64x2_promote_low_f32x4(wasm_i32x4_shuffle(t, t, 2, 3, 0, 1)));
    }
    double c = (wasm_f64x2_extract_lane(a0, 0) + wasm_f64x2_extract_lane(a1, 0)) +
               (wasm_f64x2_extract_lane(a0, 1) + wasm_f64x2_extract_lane(a1, 1));
    if (wasm_v128_any_true(nan)) return __builtin_nan("");
    for (; i < vocab; i++) {
        float xi = (l[i] - mx) * inv_t;
        if (!tiny_term(xi, c)) c += expf_(xi);
    }
    return c;
}

// the id of l's largest value in okey's order (the lowest id on ties)
static u32 argmax_okey(const float *l, u32 vocab) {
    u32 best = 0, bk = okey(l[0]);
    for (u32 i = 1; i < vocab; i++) {
        u32 k = okey(l[i]);
        if (k > bk) { bk = k; best = i; }
    }
    return best;
}

// The GPU sampler's rule (webinfer/kernels/sampling.py, sample.wgsl) on processed logits l: greedy = argmax, lowest
// id on ties; else temperature -> min_p (logits below max + T ln(min_p) -> -inf) -> top-k (logit descending, id
// ascending) -> top-p (shortest prefix of that order whose mass reaches top_p of the kept mass) -> inverse CDF in id
// order at u * mass, u = uniform(seed, index); every sum a double (above). proc: where min_p writes (may be l: the
// kept logits stay as they are). scratch: 17 bytes x vocab (+ 16). Top-k within the head, or a top-p cut inside it,
// sorts only the head (HEAD_X); else every id (the same result).
static u32 draw(const float *l, u32 vocab, const SampleParams *p, u8 *scratch, float *proc) {
    u32 best = argmax_okey(l, vocab);
    if (greedy(p)) return best;
    float mx = l[best], inv_t = 1.0f / p->temperature;
    if (p->min_p > 0.0f) {  // p_i >= min_p * p_max  <=>  l_i >= max + T ln(min_p): the rest count as -inf
        float thr = mx + logf_(p->min_p) * p->temperature;
        for (u32 i = 0; i < vocab; i++) proc[i] = l[i] >= thr ? l[i] : bits_f32(0xff800000u);
        l = proc;
    }
    double u = (double)(pcg(pcg(p->seed) + p->index) >> 8) * (1.0 / 16777216.0);
    int use_k = p->top_k > 0 && p->top_k < vocab;
    u32 id;
    if (!use_k && p->top_p >= 1.0f) {  // every id kept
        sum_terms(l, vocab, mx, inv_t, u * mass_terms(l, vocab, mx, inv_t), &id);
        return id;
    }
    // the ids to sort, in id order, keyed ~okey (ascending = logit descending; the sort is stable: id ascending)
    u32 *ka = (u32 *)(scratch + ((vocab + 15) & ~15u)), *ia = ka + vocab, *kb = ia + vocab, *ib = kb + vocab;
    u32 h = 0, all = sort_all;
    for (u32 i = 0; i < vocab && !all; i++) {
        float x = (l[i] - mx) * inv_t;
        if (x >= HEAD_X) { ka[h] = ~okey(l[i]); ia[h++] = i; }
        else all |= x != x;  // a NaN (or an infinite max): sort everything
    }
    all |= use_k && p->top_k > h;  // top-k past the head: its order matters
    // top-p's goal: top_p x the mass of the ids it chooses among (every id's without top-k, in id order)
    double goal = !use_k && p->top_p < 1.0f ? (double)p->top_p * mass_terms(l, vocab, mx, inv_t) : 0.0;
    u32 n;
    for (;;) {
        if (all) {
            for (u32 i = 0; i < vocab; i++) { ka[i] = ~okey(l[i]); ia[i] = i; }
            h = vocab;
        }
        radix_sort(ka, ia, kb, ib, h);
        n = use_k && p->top_k < h ? p->top_k : h;
        if (!(p->top_p < 1.0f)) break;
        if (use_k) {  // (top-k's k ids are all sorted here)
            double kept = 0.0;
            for (u32 j = 0; j < n; j++) kept += expf_((l[ia[j]] - mx) * inv_t);
            goal = (double)p->top_p * kept;
        }
        double c = 0.0;
        u32 j = 0;
        while (j < n) {
            c += expf_((l[ia[j++]] - mx) * inv_t);
            if (c >= goal) break;
        }
        if (c >= goal || all) {  // (every id sorted: the walk reaches the goal but for rounding, or a NaN)
            n = j;
            break;
        }
        all = 1;  // the ids below the head hold more than 1 - top_p of the mass: the cut lies among them
    }
    // the kept ids (the first n) in id order: the draw walks them so
    for (u32 j = 0; j < n; j++) kb[j] = ib[j] = ia[j];
    radix_sort(kb, ib, ka, ia, n);
    double mass = 0.0, c = 0.0;
    for (u32 j = 0; j < n; j++) mass += expf_((l[kb[j]] - mx) * inv_t);
    double r = u * mass;
    for (u32 j = 0; j < n; j++) {
        c += expf_((l[kb[j]] - mx) * inv_t);
        if (c > r) return kb[j];
    }
    return n ? kb[n - 1] : 0;  // r within rounding of the total
}

#define LPW 43u  // logprob words per row (sampling.py LOGPROB_WORDS): sampled logprob, n, 20 x (id, logprob), rank

// log-sum-exp of l, and the top n (<= 20) ids and log-softmax values (logit descending, id ascending: ids ascend,
// so an equal logit never displaces an earlier id) into lp[1 ..]; returns the log-sum-exp
static float logprobs_top(const float *l, u32 vocab, u32 n, u32 *lp) {
    u32 mk = okey(l[0]);
    for (u32 i = 1; i < vocab; i++) mk = okey(l[i]) > mk ? okey(l[i]) : mk;
    float mx = bits_f32(mk & 0x80000000u ? mk & 0x7fffffffu : ~mk);
    double m = 0.0;
    for (u32 i = 0; i < vocab; i++) {
        float x = l[i] - mx;
        if (!tiny_term(x, m)) m += expf_(x);
    }
    float lse = mx + logf_((float)m);
    n = n < 20 ? n : 20;
    n = n < vocab ? n : vocab;
    u32 tk[20], ti[20], cnt = 0;
    for (u32 i = 0; i < vocab && n; i++) {
        u32 k = okey(l[i]);
        if (cnt < n || k > tk[n - 1]) {
            u32 j = cnt < n ? cnt : n - 1;
            for (; j > 0 && tk[j - 1] < k; j--) {
                tk[j] = tk[j - 1];
                ti[j] = ti[j - 1];
            }
            tk[j] = k;
            ti[j] = i;
            cnt = cnt + 1 < n ? cnt + 1 : n;
        }
    }
    lp[1] = n;
    for (u32 r = 0; r < n; r++) {
        lp[2 + 2 * r] = ti[r];
        lp[3 + 2 * r] = f32_bits(l[ti[r]] - lse);
    }
    return lse;
}

// One sampled row as the GPU sampler does it: the row's controls (repetition_penalty on tokens of the prompt or
// the output, frequency / presence penalties on output counts, the mask's disallowed tokens -> -inf, logit_bias)
// make the processed logits; draw() picks the id; the id is counted in the row's counts slot; with logprobs, the
// log-softmax of the processed logits (no temperature, no filters) at the id (or the score id) with its rank in the
// vocabulary, and the top n go to lp (LPW words).
// aux: the step's mask / bias words; counts: the counts slots (vocab u32 each: bit 31 = in the prompt, low bits =
// times sampled; sampling.py counts_slot_init) or 0; lp: this row's logprob words or 0. scratch: 21 bytes x vocab
// (+ 32).
static u32 sample_row(const float *l, u32 vocab, const SampleParams *p, const u32 *aux, u32 *counts, u32 *lp,
                      u8 *scratch) {
    float *proc = (float *)(scratch + ((17 * vocab + 31) & ~15u));  // the processed logits, when there are controls
    u32 *cnt = counts && p->counts_slot != NONE ? counts + p->counts_slot * vocab : 0;
    int penal = cnt && (p->freq != 0.0f || p->pres != 0.0f || p->rep != 1.0f);
    if (penal || p->mask_off != NONE || p->bias_n) {
        const u32 *mask = p->mask_off != NONE ? aux + p->mask_off : 0;
        for (u32 i = 0; i < vocab; i++) {
            float v = l[i];
            if (penal) {  // (sample.wgsl's order and arithmetic)
                u32 c = cnt[i];
                float n = (float)(c & 0x7fffffffu);
                if (c) v = v > 0.0f ? v / p->rep : v * p->rep;
                v -= n * p->freq + (n > 0.0f ? p->pres : 0.0f);
            }
            proc[i] = mask && !((mask[i >> 5] >> (i & 31)) & 1u) ? bits_f32(0xff800000u) : v;
        }
        for (u32 j = 0; j < p->bias_n; j++) {
            u32 id = aux[p->bias_off + 2 * j];
            if (id < vocab) proc[id] += bits_f32(aux[p->bias_off + 2 * j + 1]);
        }
        l = proc;
    }
    int want_lp = lp && p->n_logprobs != NONE;
    float lse = want_lp ? logprobs_top(l, vocab, p->n_logprobs, lp) : 0.0f;
    u32 id = draw(l, vocab, p, scratch, proc);  // (min_p keeps the drawn id's logit as it was)
    if (cnt) cnt[id] += 1;
    if (want_lp) {
        u32 x = p->score_id < vocab ? p->score_id : id, before = 0;
        float lx = l[x];
        for (u32 i = 0; i < vocab; i++) before += l[i] > lx || (l[i] == lx && i < x);
        lp[0] = f32_bits(lx - lse);
        lp[LPW - 1] = before + 1;  // x's rank (logit descending, id ascending), as sample.wgsl's
    }
    return id;
}

// ------------------------------------------------------------------------------------------------ the model

// FAST_DOWN16: the down projection's activations (after SwiGLU: the largest outliers) as int16 instead of int8;
// FAST_GATE_UP16: gate's and up's as int16 (the runner's choice for GeGLU models: docs/cpu-backend.md "Modes")
// FULL_LOGITS: every logit exact, never the LM head's two passes (the runner's logits() reads them)
enum { FAST_QKV = 1, FAST_O = 2, FAST_GATE_UP = 4, FAST_DOWN = 8, FAST_HEAD = 16, FAST_DOWN16 = 32,
       FAST_GATE_UP16 = 64, FULL_LOGITS = 128 };

typedef struct {
    const float *attn_norm, *ffn_norm;
    float *k_cache, *v_cache;
    const Weight *q, *k, *v, *o, *gate, *up, *down;
    const float *q_norm, *k_norm;                // [hd] each: per-head RMSNorm of q and k before RoPE; 0: none
    const float *post_attn_norm, *post_ffn_norm;  // [d] each: RMSNorm of o's / down's output before the add; 0: none
    u32 sliding;  // 1: a sliding-window layer (the Model's window, and its local RoPE tables)
} Layer;

typedef struct {
    u32 d, f, n_layers, n_heads, n_kv, hd, vocab, block_size;
    float eps;
    u32 fast, max_pos, max_ctx;  // fast: FAST_* bits (int8 activations per matrix); table/score sizes (the runner checks)
    const Weight *embed, *lm_head;
    const float *norm, *cos_t, *sin_t;
    const Layer *layers;
    // scratch, sized by Python for max_tokens rows: r, xn [T, d]; q [T, q_dim]; k, v [T, kv_dim]; attn [T, q_dim];
    // g, up [T, f]; logits [S, vocab]; xs [S, d]; scores [max_ctx]; work: linear's and the sampler's scratch
    float *r, *xn, *q, *k, *v, *attn, *g, *u, *logits, *xs, *scores;
    u8 *work;
    struct Team *team;  // 0: one thread; else the threads build's team (wi_worker runs threads 1..)
    // the family features of webinfer/package.py ModelConfig (the llama block: 0, 1.0, 0, 0, 0, 0, the tables)
    u32 gelu;                    // 1: GeGLU, gelu_tanh(gate) * up (Gemma); 0: SwiGLU
    float emb_mult;              // the embedding row times this (Gemma: sqrt(d) rounded to f32)
    float attn_mul;              // scores = q.k * this (query_pre_attn_scalar^-1/2); 0: q.k / sqrt(hd)
    float attn_cap, final_cap;   // soft-capping of attention scores / final logits (Gemma 2); 0: none
    u32 window;                  // a sliding layer's query at p sees keys j with p - j < window
    const float *cos_l, *sin_l;  // sliding layers' RoPE tables (Gemma 3's local base; else the global ones)
    float *po;                   // [T, d] o's / down's output before its post-norm (post-norm models; else 0)
    float *parts;                // [4, T, d]: o's two K parts, then down's (step_body's split_k; else 0)
    float head_wide;             // two_pass_head's band limit for sampled rows (the runner measures it)
} Model;

typedef struct {
    u32 q_row, n_q, start_pos;
    const u32 *table;
} Seq;

typedef struct {
    u32 n_tokens, n_seqs, n_sampled;
    const u32 *ids, *pos, *slot;
    const Seq *seqs;
    const u32 *sample_rows;        // token row of each sampled chunk
    const SampleParams *params;    // per sampled chunk (logit_row = its index)
    u32 *out_ids;
    const u32 *aux;                // the sampled rows' masks and logit_bias entries (SampleParams offsets)
    u32 *counts;                   // the penalties' token counts slots (SampleParams counts_slot)
    u32 *logprobs;                 // LPW words per sampled row (filled for the rows that ask)
} Step;

// whether b's activations are prepared as a's (same format, k and group size): the second may reuse the first's
INLINE int same_layout(const Weight *a, const Weight *b) {
    return a->dtype == b->dtype && a->k == b->k && a->kp == b->kp && a->gs == b->gs && a->packed == b->packed;
}

// ------------------------------------------------------------------------------------------------ threads
//
// The threads build (-DTHREADS: shared memory, atomics) runs a step on nth threads (2..MAX_THREADS), each its own
// instance of the module on the same memory: thread 0 is the host's wi_step call, threads 1..max-1 host threads
// parked in wi_worker. Each step's threads walk the same step (step_body), each computing its share of every
// matrix's output columns (whole groups of 4 rows, the packed layout's) with its own activation scratch, and of
// the KV heads (RoPE, cache writes and the attention of their query heads); every thread norms the whole residual
// into its own buffer, thread 0 samples, and a barrier (team_sync) follows every op whose output another thread
// reads. A column's or a head's arithmetic does not depend on the split, so the ids are those of one thread.
// Without THREADS (or with team = 0) it is the one-thread step. The host picks nth per step (a decode block may
// run faster on fewer threads than were started: webinfer/cpu/threads.py); the threads past nth sit that step out.
#define MAX_THREADS 16
#define GO_STEP 64  // go = steps started x GO_STEP + GO_HEAD? + that step's nth (one word: a thread reads all at once)
#define GO_HEAD 32  // the started call is wi_head's (head_body), not a step

typedef struct Bufs {  // a worker thread's own buffers
    u8 *work;          // linear scratch and attention scores (thread 0 uses the Model's work, scores)
    float *xn;         // normed activations [max(T, S), d] (thread 0 uses the Model's xn and xs)
    float *k, *v;      // k and v rows [T, kv_dim] (thread 0 uses the Model's k and v)
    float *r;          // the residual [T, d] with split_k (thread 0's is the Model's r)
} Bufs;

typedef struct Team {
    u32 nth;            // threads of the next steps (2..max; the host sets it between steps)
    u32 spins;          // polls of a word before blocking on it (memory.atomic.wait32)
    u32 go;             // written by thread 0 to start a step: GO_STEP more, and the step's nth in the low bits
    u32 quit;           // 1: leave (the host closes, or a thread failed): every wait returns
    u32 arrived, gen;   // the barrier: threads arrived, generation
    const void *m, *s;  // the step the workers run (Model, Step)
    u32 max;            // threads started: thread 0 and max - 1 workers
    Bufs *bufs;         // bufs[tid - 1]: worker tid's buffers
} Team;

typedef struct {
    u32 tid, nth;
    u8 *work;
    Team *team;
    float *scores;  // attention's scores (a worker: its work area, which the GEMVs use only outside attention)
    float *xn, *xs;  // this thread's normed activations: the layers' (every thread norms the whole residual itself,
                     // cheaper than a barrier) and the sampled rows' (a worker: both in its Bufs' xn)
    float *k, *v;    // this thread's k and v rows (the head split computes a KV head two threads read on both)
    float *r;        // the residual this thread updates: with split_k its own copy (a worker: its Bufs' r)
} Ctx;

#ifdef THREADS
// waits until *p != old (or the team quits): polls `spins` times, then blocks (a Worker may block; the engine
// never runs wasm on the browser's main thread)
static void team_wait(Team *t, u32 *p, u32 old, u32 spins) {
    for (u32 i = 0; i < spins; i++)
        if (__atomic_load_n(p, __ATOMIC_ACQUIRE) != old) return;
    while (__atomic_load_n(p, __ATOMIC_ACQUIRE) == old && !__atomic_load_n(&t->quit, __ATOMIC_ACQUIRE))
        __builtin_wasm_memory_atomic_wait32((int *)p, (int)old, -1);
}
#endif

// the barrier; returns 1 when the team quits (the step is abandoned: the host raises)
static int team_sync(const Ctx *c) {
#ifdef THREADS
    Team *t = c->team;
    if (!t) return 0;
    u32 gen = __atomic_load_n(&t->gen, __ATOMIC_ACQUIRE);
    if (__atomic_add_fetch(&t->arrived, 1, __ATOMIC_ACQ_REL) == c->nth) {
        __atomic_store_n(&t->arrived, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&t->gen, gen + 1, __ATOMIC_RELEASE);
        __builtin_wasm_memory_atomic_notify((int *)&t->gen, ~0u);
    } else {
        team_wait(t, &t->gen, gen, t->spins);
    }
    return __atomic_load_n(&t->quit, __ATOMIC_ACQUIRE) != 0;
#else
    (void)c;
    return 0;
#endif
}

// this thread's share of n output columns: whole groups of 4, split evenly
INLINE void share(const Ctx *c, u32 n, u32 *n0, u32 *n1) {
    u32 groups = (n + 3) / 4, e = 4 * (groups * (c->tid + 1) / c->nth);
    *n0 = 4 * (groups * c->tid / c->nth);
    *n1 = e < n ? e : n;
}

// linear() on this thread's share of w's output columns, with this thread's scratch
static void linear_share(const Ctx *c, const Weight *w, const float *x, u32 x_stride, float *y, u32 y_stride,
                         u32 rows, int accumulate, int fast, int prepare) {
    u32 n0, n1;
    share(c, w->n, &n0, &n1);
    linear(w, x, x_stride, y, y_stride, rows, accumulate, fast, c->work, prepare, n0, n1);
}

// r[t, this thread's columns] += rmsnorm(po[t]) * w for the T rows (every thread norms whole rows: the same bits;
// the reference's order: x / den * w, then the add)
static void post_norm_add(const Ctx *c, const Model *m, const float *w, u32 T) {
    u32 d = m->d, n0, n1;
    share(c, d, &n0, &n1);
    for (u32 t = 0; t < T; t++) {
        const float *p = m->po + t * d;
        float den = rms_den(p, d, m->eps);
        for (u32 i = n0; i < n1; i++) c->r[t * d + i] += (p[i] / den) * w[i];
    }
}

// The largest float <= d (d finite, not a float's overflow)
INLINE float f32_below(double d) {
    float f = (float)d;
    if ((double)f <= d) return f;
    u32 b = f32_bits(f);
    return f == 0.0f ? bits_f32(0x80000001u) : bits_f32(f > 0.0f ? b - 1 : b + 1);
}

// The two-pass LM head's cut for one sampled row ("The LM head in two passes"): its second pass computes exactly
// every group with a row at or above it, the others keep their bounds y = v + B >= e, and sample_row must draw the
// one-pass head's id from that row. L: the largest v - B (<= the exact maximum mx). NaN: the row needs every logit
// exact (then the step runs the one-pass head); a NaN L gives NaN (every group again).
// - greedy: L. A row left out has e <= y < L <= mx: neither the argmax nor tied with it.
// - min_p (with or without top-k / top-p): fl(L + c), c = fl(ln(min_p) T) as draw() rounds it (c <= 0). A row left
//   out has e <= y < fl(L + c) <= fl(mx + c), draw()'s threshold (rounding is monotone): -inf after min_p from
//   either value, a term of 0 in every sum.
// - top-k alone (topk_alone): C, a value at least k logits reach (head_topk_floor). A row left out has e <= y < C
//   <= the k-th largest logit: not among the top k nor tied with the k-th, and its bound sorts below all of them
//   too, so draw() keeps the same k ids, every one exact. (The callers give C = NaN for any other row.)
// - top-p without min_p, or temperature alone: NaN. Their sums take every id's term (top-p's goal is a fraction of
//   the whole mass), and a double sum feels the smallest of them.
INLINE float head_cut(const SampleParams *p, float L, float C) {
    float T = p->temperature, nan = __builtin_nanf("");
    if (L != L) return nan;
    if (greedy(p)) return L;
    if (!(T < 1e30f && 1.0f / T < 1e30f)) return nan;
    if (p->min_p > 0.0f) {
        float c = logf_(p->min_p) * p->temperature;
        return c <= 0.0f ? L + c : nan;  // (min_p > 1: the API refuses it)
    }
    return p->top_p < 1.0f ? nan : C;
}

// A row sampled with top-k alone (1 < k < vocab, no min_p, top_p 1): its two passes cut at head_topk_floor
INLINE int topk_alone(const SampleParams *p, u32 vocab) {
    return p->temperature > 0.0f && p->top_k > 1 && p->top_k < vocab && !(p->min_p > 0.0f) && !(p->top_p < 1.0f);
}

// For top-k alone: a value C such that at least k of y[0..n) (the first pass's upper bounds y = fl(v + B) of logits
// e >= v - B, every B <= bmax) have e >= C; -inf if n < k, NaN if y is not finite. One histogram pass in buckets of
// 1/8 below the largest y: the k-th largest y lies in the bucket where the counts from the top reach k, and C lies
// below that bucket's lower edge (one bucket of margin for the bucketing's rounding) by 2 bmax and y's rounding.
#define TOPK_BINS 256
#define TOPK_SCALE 8.0f
static float head_topk_floor(const float *y, u32 n, u32 k, float bmax) {
    if (k > n) return -__builtin_inff();
    float top = y[0];
    for (u32 i = 1; i < n; i++) top = y[i] > top ? y[i] : top;
    if (!(top - top == 0.0f) || !(bmax - bmax == 0.0f)) return __builtin_nanf("");
    u32 cnt[TOPK_BINS];
    for (u32 b = 0; b < TOPK_BINS; b++) cnt[b] = 0;
    for (u32 i = 0; i < n; i++) {
        float d = (top - y[i]) * TOPK_SCALE;  // (NaN: the last bucket)
        cnt[d < (float)(TOPK_BINS - 1) ? (u32)d : TOPK_BINS - 1]++;
    }
    u32 b = 0, acc = cnt[0];
    while (acc < k) acc += cnt[++b];
    if (b >= TOPK_BINS - 2) return -__builtin_inff();  // the k-th in the catch-all bucket: no bound
    double edge = (double)top - (double)(b + 2) / TOPK_SCALE;
    double big = __builtin_fabs(top) > __builtin_fabs(edge) ? __builtin_fabs(top) : __builtin_fabs(edge);
    return f32_below(edge - big * 0x1p-23 - 2.0 * (double)bmax * (1.0 + 0x1p-10));
}

#define HEAD_ROWS 16

// Whether a row may take the two passes: it has a cut (head_cut: greedy, or sampled with min_p, top-p or top-k) and
// nothing that reads or changes other logits (logprobs, penalties, a mask, logit_bias)
INLINE int head_row_ok(const SampleParams *p, u32 vocab) {
    float C = topk_alone(p, vocab) ? 0.0f : __builtin_nanf("");
    return p->mask_off == NONE && p->bias_n == 0 && p->n_logprobs == NONE && p->freq == 0.0f && p->pres == 0.0f &&
           p->rep == 1.0f && head_cut(p, 0.0f, C) == head_cut(p, 0.0f, C);
}

// Whether the model and step allow the two passes: an exact packed head without a final soft-cap (whose rounding
// could tie rows), 1 to HEAD_ROWS sampled rows
INLINE int head_step_ok(const Model *m, const Step *s) {
    return s->n_sampled && s->n_sampled <= HEAD_ROWS && !skip_linear && !(m->fast & (FAST_HEAD | FULL_LOGITS)) &&
           m->lm_head->packed == 1 && m->final_cap == 0.0f;
}

// A sampled row's second pass recomputes every row at or above its cut: with a flat distribution at T 0.7 top-p,
// most of the vocabulary (41k of SmolLM2's 49k on one step), and the first pass is then lost. What the first pass
// costs against a one-pass head depends on the machine: 0.6-0.85 where the exact head is bound by its multiplies,
// ~0.95 where neither is (this project's VM on 12-06: both at ~11 GB/s). Per sampled row slot, the fraction of the
// head's rows at or above the row's cut in its last step (head_band_update); a step whose sampled row's slot was
// not below the Model's head_wide (the runner's measured break-even, CpuRunner.calibrate_head; 0: sampled rows
// never take two passes) runs the one-pass head, whose exact logits give the next step's figure. Rows keep their
// slots across decode steps of one batch, so the last step predicts the next (a mismatch after the batch changes
// costs time, never bits: both heads give the same ids).
// Shared by the threads; written by thread 0 alone, after the head and before the next step.
static float head_band[HEAD_ROWS];

// Whether the step's LM head takes two passes ("The LM head in two passes"): head_step_ok, and every sampled row
// head_row_ok, greedy or not predicted wide (head_band). Each row takes its own passes: per row the first costs
// about half of an exact row of the head (the GEMM tile shares a weight decode among rows but is bound by its
// multiplies, one row's worth per row).
INLINE int two_pass_head(const Model *m, const Step *s) {
    if (!head_step_ok(m, s)) return 0;
    for (u32 j = 0; j < s->n_sampled; j++) {
        const SampleParams *p = s->params + j;
        if (!head_row_ok(p, m->vocab) || (!greedy(p) && !(head_band[j] < m->head_wide))) return 0;
    }
    return 1;
}

// how many of y[0..n) are >= cut (0 for a NaN cut)
static u32 count_ge(const float *y, u32 n, float cut) {
    v128_t cv = wasm_f32x4_splat(cut);
    u32 c = 0, i = 0;
    for (; i + 4 <= n; i += 4) c += __builtin_popcount(wasm_i32x4_bitmask(wasm_f32x4_ge(wasm_v128_load(y + i), cv)));
    for (; i < n; i++) c += y[i] >= cut;
    return c;
}

// head_band for the step's sampled rows (thread 0, before sampling: min_p may write over the logits). cuts: each
// row's cut where the step took two passes (its logits row then holds bounds below the cut), else NULL: the cut at
// the row's exact maximum (top-k alone: k / vocab). Greedy rows and rows the two passes do not take count 0.
static void head_band_update(const Model *m, const Step *s, const float *cuts) {
    if (!head_step_ok(m, s) || !(m->head_wide > 0.0f)) return;  // (0: no sampled row takes two passes)
    for (u32 j = 0; j < s->n_sampled; j++) {
        const SampleParams *p = s->params + j;
        const float *y = m->logits + j * m->vocab;
        head_band[j] = 0.0f;
        if (!head_row_ok(p, m->vocab) || greedy(p)) continue;
        if (!cuts && topk_alone(p, m->vocab)) {  // (its floor needs the bounds: k rows, and a little more)
            head_band[j] = (float)p->top_k / (float)m->vocab;
            continue;
        }
        float cut = cuts ? cuts[j] : 0.0f;
        if (!cuts) {
            float mx = y[0];
            for (u32 i = 1; i < m->vocab; i++) mx = y[i] > mx ? y[i] : mx;
            cut = head_cut(p, mx, __builtin_nanf(""));
        }
        head_band[j] = (float)count_ge(y, m->vocab, cut) / (float)m->vocab;
    }
}

// bytes of scratch linear() needs for `rows` rows of K = kp: the packed layout's rows * (kp / 32 * 16 + kp * 8) + 16,
// or for one row (EXACT_I8) kp / 32 * 16 + kp * 12 + 16
INLINE u32 linear_scratch_bytes(u32 rows, u32 kp) { return rows * (kp / 16 * 4 + kp / 32 * 8 + kp * 8) + kp * 4 + 64; }

// Where each thread leaves its rows' largest lower bounds (HEAD_ROWS floats) and top-k floors (head_topk_floor,
// HEAD_ROWS more) for the others: past head_pass's scratch in its work buffer (the runner sizes every work buffer
// HEAD_LB_BYTES over the linear scratch)
#define HEAD_LB_BYTES 128
_Static_assert(HEAD_LB_BYTES >= 2 * HEAD_ROWS * 4, "head_lbs: L and C per row");
INLINE float *head_lbs(u8 *work, const Model *m) {
    return (float *)(work + ((linear_scratch_bytes(1, m->lm_head->kp) + 15) & ~15u));
}

#define SYNC()                          \
    do {                                \
        if (team_sync(c)) return;       \
    } while (0)

// split_k: r[t] += P0[t] + P1[t] for the T rows (P1 = P + T d), or with a post-norm w, r[t] += rmsnorm(P0[t] + P1[t])
// * w (the sum held in this thread's xn, which is normed afresh from r next). Every thread adds to its own r.
static void add_parts(const Ctx *c, const Model *m, const float *P, const float *w, u32 T) {
    u32 d = m->d;
    for (u32 t = 0; t < T; t++) {
        const float *a = P + t * d, *b = P + (T + t) * d;
        float *rt = c->r + t * d, *sum = c->xn + t * d;
        if (!w) {
            for (u32 i = 0; i < d; i++) rt[i] += a[i] + b[i];
            continue;
        }
        for (u32 i = 0; i < d; i++) sum[i] = a[i] + b[i];
        float den = rms_den(sum, d, m->eps);
        for (u32 i = 0; i < d; i++) rt[i] += (sum[i] / den) * w[i];
    }
}

// One engine step on thread c->tid (see "threads" above): every fed token through the model, K/V into the paged
// cache, the sampled rows' next ids.
// split_k (the runner gives the Model its `parts`, and each layer's o and down as two part matrices by input
// columns, each packed on its own: wi_repack_part): o's parts split the query heads (part 0: heads [0, n_heads / 2),
// thread 0's attention heads with two threads), down's the units of f (gate and up computed for the same columns);
// each part goes into its buffer of `parts`, then every thread adds both parts to its own copy of the residual, so
// that a layer has two barriers: after o's parts and after down's. A part's arithmetic does not depend on which
// thread computes it, and one thread computes both parts the same way: the same bits on one or two threads.
// (Half of each row group's units read from one packed layout streamed slower from memory, 70 -> 90 us a cold
// 576 x 1536 q4a GEMV: hence a layout per part.)
// Else the output columns of every matrix are split, and barriers follow attention (o reads every head), o and
// down (the norms read the whole residual) and SwiGLU (down reads every column): four a layer. Either way one more
// follows the LM head; no norm has one, and with the q/k/v columns split by heads (by_heads) none sits between
// the projections and attention.
static void step_body(const Ctx *c, const Model *m, const Step *s) {
    u32 T = s->n_tokens, d = m->d, hd = m->hd, qd = m->n_heads * hd, kvd = m->n_kv * hd, bs = m->block_size;
    int t0 = c->tid == 0, sk = m->parts != 0;
    float *r = c->r;
    // the embedding into r; without split_k only thread 0 writes r, the others take it into their xn (normed there)
    for (u32 t = 0; t < T; t++) {
        float *e = (t0 || sk ? r : c->xn) + t * d;
        dequant_row(m->embed, s->ids[t], e);
        if (m->emb_mult != 1.0f)
            for (u32 i = 0; i < d; i++) e[i] = e[i] * m->emb_mult;
    }
    // this thread's query heads [h0, h1) and the KV heads they read [kv0, kv1): with by_heads (a head's columns
    // whole groups of 4) the query heads split evenly and each thread computes its query heads' q columns and its
    // KV heads' k/v columns into its own k/v rows, then RoPE, the cache writes and attention, which read only what
    // the same thread wrote. A KV head whose query heads both threads hold (SmolLM2's 3 KV heads of 9 query heads,
    // Gemma 3's one) is computed by both: the same bits, the same cache writes, and no barrier. Else the columns
    // are split evenly, a barrier follows them, and the KV heads split evenly (the query heads follow theirs).
    u32 grp = m->n_heads / m->n_kv, h0, h1, kv0, kv1;
    int by_heads = (hd & 3) == 0;
    if (by_heads) {
        h0 = m->n_heads * c->tid / c->nth;
        h1 = m->n_heads * (c->tid + 1) / c->nth;
        kv0 = h0 / grp;
        kv1 = h1 > h0 ? (h1 + grp - 1) / grp : kv0;
    } else {
        kv0 = m->n_kv * c->tid / c->nth;
        kv1 = m->n_kv * (c->tid + 1) / c->nth;
        h0 = kv0 * grp;
        h1 = kv1 * grp;
    }
    // split_k's parts this thread computes: [p0, p1) of 0 and 1. One thread computes both, two one each (whole:
    // thread 0's attention heads are part 0's, so no barrier sits between attention and o, nor between SwiGLU and
    // down); with more, part p's threads (those with 2 tid / nth = p: gn of them from g0) split its output columns
    // and its units of f, with a barrier after attention and one after SwiGLU (each part reads all of its half)
    u32 p0 = c->nth == 1 ? 0 : 2 * c->tid / c->nth, p1 = c->nth == 1 ? 2 : p0 + 1;
    u32 g0 = (p0 * c->nth + 1) / 2, gn = c->nth <= 2 ? 1 : (p1 * c->nth + 1) / 2 - g0;
    Ctx gc = *c;  // this thread's place in its part's group (share() over the group)
    gc.tid = c->nth <= 2 ? 0 : c->tid - g0;
    gc.nth = gn;
    float *kb = by_heads ? c->k : m->k, *vb = by_heads ? c->v : m->v;  // the k/v rows RoPE and the cache read
    for (u32 li = 0; li < m->n_layers; li++) {
        const Layer *L = m->layers + li;
        rmsnorm(li || t0 || sk ? r : c->xn, d, L->attn_norm, c->xn, d, T, d, m->eps);
        int fq = (m->fast & FAST_QKV) != 0;
        if (by_heads) {
            linear(L->q, c->xn, d, m->q, qd, T, 0, fq, c->work, 1, h0 * hd, h1 * hd);
            linear(L->k, c->xn, d, kb, kvd, T, 0, fq, c->work, !same_layout(L->q, L->k), kv0 * hd, kv1 * hd);
            linear(L->v, c->xn, d, vb, kvd, T, 0, fq, c->work, !same_layout(L->k, L->v), kv0 * hd, kv1 * hd);
        } else {
            linear_share(c, L->q, c->xn, d, m->q, qd, T, 0, fq, 1);
            linear_share(c, L->k, c->xn, d, m->k, kvd, T, 0, fq, !same_layout(L->q, L->k));
            linear_share(c, L->v, c->xn, d, m->v, kvd, T, 0, fq, !same_layout(L->k, L->v));
            SYNC();
        }
        const float *ct = L->sliding ? m->cos_l : m->cos_t, *st = L->sliding ? m->sin_l : m->sin_t;
        for (u32 t = 0; t < T; t++) {
            float *qh = m->q + t * qd + h0 * hd, *kh = kb + t * kvd + kv0 * hd;
            if (L->q_norm) {  // (in place: each head's norm is read before it is written)
                rmsnorm(qh, hd, L->q_norm, qh, hd, h1 - h0, hd, m->eps);
                rmsnorm(kh, hd, L->k_norm, kh, hd, kv1 - kv0, hd, m->eps);
            }
            rope_row(qh, h1 - h0, hd, ct, st, s->pos[t]);
            rope_row(kh, kv1 - kv0, hd, ct, st, s->pos[t]);
            float *kd = L->k_cache + s->slot[t] * kvd, *vd = L->v_cache + s->slot[t] * kvd;
            for (u32 i = kv0 * hd; i < kv1 * hd; i++) { kd[i] = kb[t * kvd + i]; vd[i] = vb[t * kvd + i]; }
        }
        for (u32 si = 0; si < s->n_seqs; si++) {
            const Seq *q = s->seqs + si;
            for (u32 j = 0; j < q->n_q; j++) {
                u32 row = q->q_row + j;
                attend_row(m->q + row * qd, m->attn + row * qd, L->k_cache, L->v_cache, q->table, q->start_pos + j,
                           m->n_heads, m->n_kv, hd, bs, c->scores, h0, h1, m->attn_mul, m->attn_cap,
                           L->sliding ? m->window : 0);
            }
        }
        int fo = (m->fast & FAST_O) != 0;
        int fg = (m->fast & FAST_GATE_UP16) ? 2 : (m->fast & FAST_GATE_UP) != 0;
        int fd = (m->fast & FAST_DOWN16) ? 2 : (m->fast & FAST_DOWN) != 0;
        if (sk) {  // L->o, L->down: two part matrices each (part 1's columns start where part 0's end)
            u32 pf0 = p0 ? L->down[0].k : 0, pf1 = p1 == 2 ? m->f : L->down[0].k, f0, f1, n0, n1;
            share(&gc, pf1 - pf0, &f0, &f1);  // (gn = 1: the part's whole range, and all of d below)
            f0 += pf0;
            f1 += pf0;
            share(&gc, d, &n0, &n1);
            if (c->nth > 2) SYNC();
            for (u32 p = p0; p < p1; p++)
                linear(L->o + p, m->attn + (p ? L->o[0].k : 0), qd, m->parts + p * T * d, d, T, 0, fo, c->work, 1, n0,
                       n1);
            SYNC();
            add_parts(c, m, m->parts, L->post_attn_norm, T);
            rmsnorm(r, d, L->ffn_norm, c->xn, d, T, d, m->eps);
            linear(L->gate, c->xn, d, m->g, m->f, T, 0, fg, c->work, 1, f0, f1);
            linear(L->up, c->xn, d, m->u, m->f, T, 0, fg, c->work, !same_layout(L->gate, L->up), f0, f1);
            for (u32 t = 0; t < T; t++)
                for (u32 i = t * m->f + f0; i < t * m->f + f1; i++)
                    m->g[i] = (m->gelu ? gelu_tanh(m->g[i]) : silu(m->g[i])) * m->u[i];
            if (c->nth > 2) SYNC();
            for (u32 p = p0; p < p1; p++)
                linear(L->down + p, m->g + (p ? L->down[0].k : 0), m->f, m->parts + (2 + p) * T * d, d, T, 0, fd,
                       c->work, 1, n0, n1);
            SYNC();
            add_parts(c, m, m->parts + 2 * T * d, L->post_ffn_norm, T);
            continue;
        }
        SYNC();
        if (L->post_attn_norm) {  // r += rmsnorm(o's output): o into po, then each thread adds its columns
            linear_share(c, L->o, m->attn, qd, m->po, d, T, 0, fo, 1);
            SYNC();
            post_norm_add(c, m, L->post_attn_norm, T);
        } else {
            linear_share(c, L->o, m->attn, qd, r, d, T, 1, fo, 1);
        }
        SYNC();
        rmsnorm(r, d, L->ffn_norm, c->xn, d, T, d, m->eps);
        linear_share(c, L->gate, c->xn, d, m->g, m->f, T, 0, fg, 1);
        linear_share(c, L->up, c->xn, d, m->u, m->f, T, 0, fg, !same_layout(L->gate, L->up));
        u32 f0, f1;  // SwiGLU on the columns this thread computed
        share(c, m->f, &f0, &f1);
        for (u32 t = 0; t < T; t++)
            for (u32 i = t * m->f + f0; i < t * m->f + f1; i++)
                m->g[i] = (m->gelu ? gelu_tanh(m->g[i]) : silu(m->g[i])) * m->u[i];
        SYNC();
        if (L->post_ffn_norm) {
            linear_share(c, L->down, m->g, m->f, m->po, d, T, 0, fd, 1);
            SYNC();
            post_norm_add(c, m, L->post_ffn_norm, T);
        } else {
            linear_share(c, L->down, m->g, m->f, r, d, T, 1, fd, 1);
        }
        SYNC();
    }
    for (u32 j = 0; j < s->n_sampled; j++)
        rmsnorm(r + s->sample_rows[j] * d, d, m->norm, c->xs + j * d, d, 1, d, m->eps);
    int two = two_pass_head(m, s);
    float cuts[HEAD_ROWS];  // the two passes: each row's cut
    if (two) {  // the first pass on this thread's rows; its lower bounds where every thread reads them
        u32 n0, n1;
        share(c, m->vocab, &n0, &n1);
        float *lb = head_lbs(c->work, m);
        for (u32 j = 0; j < s->n_sampled; j++) {
            float bmax = 0.0f, *y = m->logits + j * m->vocab;
            lb[j] = head_pass(m->lm_head, c->xs + j * d, y, c->work, n0, n1, 1, 0.0f, &bmax);
            lb[HEAD_ROWS + j] = topk_alone(s->params + j, m->vocab)
                                    ? head_topk_floor(y + n0, n1 - n0, s->params[j].top_k, bmax) : __builtin_nanf("");
        }
    } else if (s->n_sampled) {
        linear_share(c, m->lm_head, c->xs, d, m->logits, m->vocab, s->n_sampled, 0, (m->fast & FAST_HEAD) != 0, 1);
        if (m->final_cap != 0.0f) {  // this thread's columns
            u32 n0, n1;
            share(c, m->vocab, &n0, &n1);
            for (u32 j = 0; j < s->n_sampled; j++)
                for (u32 i = n0; i < n1; i++) m->logits[j * m->vocab + i] = softcap(m->logits[j * m->vocab + i], m->final_cap);
        }
    }
    SYNC();
    if (two) {  // the second pass on this thread's rows, at the cut from every thread's L
        u32 n0, n1;
        share(c, m->vocab, &n0, &n1);
        for (u32 j = 0; j < s->n_sampled; j++) {
            float L = head_lbs(m->work, m)[j], C = head_lbs(m->work, m)[HEAD_ROWS + j];  // (thread 0's: the Model's)
#ifdef THREADS
            for (u32 i = 1; i < c->nth; i++) {  // the largest over the threads (NaN if any is NaN)
                float o = head_lbs(c->team->bufs[i - 1].work, m)[j], oc = head_lbs(c->team->bufs[i - 1].work, m)[HEAD_ROWS + j];
                L = o != o || L != L ? __builtin_nanf("") : o > L ? o : L;
                C = oc != oc || C != C ? __builtin_nanf("") : oc > C ? oc : C;  // (each thread's C holds globally)
            }
#endif
            cuts[j] = head_cut(s->params + j, L, C);
            head_pass(m->lm_head, c->xs + j * d, m->logits + j * m->vocab, c->work, n0, n1, 0, cuts[j], 0);
        }
        SYNC();
    }
    if (t0) head_band_update(m, s, two ? cuts : 0);
    if (t0)
        for (u32 j = 0; j < s->n_sampled; j++)
            s->out_ids[j] = sample_row(m->logits + j * m->vocab, m->vocab, s->params + j, s->aux, s->counts,
                                       s->logprobs + LPW * j, m->work);
}
#undef SYNC

// starts the parked workers on the call thread 0 is about to run (flag: 0 a step, GO_HEAD wi_head's rows)
static void team_start(Team *t, const Model *m, const Step *s, u32 flag) {
#ifdef THREADS
    if (!t) return;
    t->m = m;
    t->s = s;
    u32 go = __atomic_load_n(&t->go, __ATOMIC_RELAXED);
    __atomic_store_n(&t->go, (go / GO_STEP + 1) * GO_STEP + flag + t->nth, __ATOMIC_RELEASE);
    __builtin_wasm_memory_atomic_notify((int *)&t->go, ~0u);
#else
    (void)t, (void)m, (void)s, (void)flag;
#endif
}

// One engine step (thread 0). With a team, its workers (parked in wi_worker) are started on the same step first:
// threads 1..nth-1 run it with thread 0, the others sit it out.
EXPORT(wi_step) void wi_step(const Model *m, const Step *s) {
    Team *t = m->team;
    Ctx c = {0, t ? t->nth : 1, m->work, t, m->scores, m->xn, m->xs, m->k, m->v, m->r};
    team_start(t, m, s, 0);
    step_body(&c, m, s);
}

// Prompt logprobs (engine/batch.py SeqChunk.score_ids): the final norm, the one-pass LM head (as many rows as a
// step samples) and the sampler over the Step's sample rows of the residual the last wi_step left. The head's
// columns are split among the step's threads as a step's are (every thread norms the rows itself), thread 0
// samples. The rows' params carry score_id and logprobs, no counts slot; the head band (two_pass_head's memory of
// the real sampled rows) is left as it was.
#define SYNC()                          \
    do {                                \
        if (team_sync(c)) return;       \
    } while (0)
static void head_body(const Ctx *c, const Model *m, const Step *s) {
    u32 d = m->d, V = m->vocab, n0, n1;
    for (u32 j = 0; j < s->n_sampled; j++)
        rmsnorm(c->r + s->sample_rows[j] * d, d, m->norm, c->xs + j * d, d, 1, d, m->eps);
    linear_share(c, m->lm_head, c->xs, d, m->logits, V, s->n_sampled, 0, (m->fast & FAST_HEAD) != 0, 1);
    share(c, V, &n0, &n1);
    if (m->final_cap != 0.0f)  // this thread's columns
        for (u32 j = 0; j < s->n_sampled; j++)
            for (u32 i = n0; i < n1; i++) m->logits[j * V + i] = softcap(m->logits[j * V + i], m->final_cap);
    SYNC();
    if (c->tid == 0)
        for (u32 j = 0; j < s->n_sampled; j++)
            s->out_ids[j] = sample_row(m->logits + j * V, V, s->params + j, s->aux, 0, s->logprobs + LPW * j, m->work);
}
#undef SYNC

EXPORT(wi_head) void wi_head(const Model *m, const Step *s) {
    Team *t = m->team;
    Ctx c = {0, t ? t->nth : 1, m->work, t, m->scores, m->xn, m->xs, m->k, m->v, m->r};
    team_start(t, m, s, GO_HEAD);
    head_body(&c, m, s);
}

// A decode block (webinfer/engine/batch.py StepBatch.steps = K): the host writes step 0 as a plain step of n
// one-token sequences that all sample (tables covering K positions more); each later step feeds every sequence the
// id the step before sampled for it, one position on (cache slot from its table), with the next sample index. So
// each step is a plain step of the same shape (the same ids as K host steps), and the host is not called between
// them: ids_out[j * n + i] = step j's id of sequence i; lp_out (0: none) gets each step's n logprob rows.
// Runs the block's steps from..K-1: a block may be run in segments (from = the steps run so far; the step struct
// then holds the last step run, whose sampled ids feed the next), e.g. its first step on the other thread count.
EXPORT(wi_steps) void wi_steps(const Model *m, Step *s, u32 K, u32 *ids_out, u32 *lp_out, u32 from) {
    u32 n = s->n_seqs, bs = m->block_size;
    u32 *ids = (u32 *)s->ids, *pos = (u32 *)s->pos, *slot = (u32 *)s->slot;
    Seq *q = (Seq *)s->seqs;
    SampleParams *p = (SampleParams *)s->params;
    for (u32 j = from; j < K; j++) {
        if (j)
            for (u32 i = 0; i < n; i++) {
                u32 ps = ++pos[i];
                ids[i] = s->out_ids[i];
                slot[i] = q[i].table[ps / bs] * bs + ps % bs;
                q[i].start_pos++;
                p[i].index++;
            }
        wi_step(m, s);
#ifdef THREADS
        if (m->team && __atomic_load_n(&m->team->quit, __ATOMIC_ACQUIRE)) return;  // abandoned: the host raises
#endif
        for (u32 i = 0; i < n; i++) ids_out[j * n + i] = s->out_ids[i];
        if (lp_out) __builtin_memcpy(lp_out + j * n * LPW, s->logprobs, 4 * LPW * n);
    }
}

#ifdef THREADS
// Worker tid's life (its own instance, its own stack: the host sets __stack_pointer first): waits for each step
// wi_step starts and runs its share, or sits it out when the step runs on fewer threads (then it blocks for the
// next one at once, not polling: a thread the host does not use takes no core); returns when the team quits.
EXPORT(wi_worker) void wi_worker(Team *t, u32 tid) {
    for (u32 seen = 0, used = 1;;) {
        team_wait(t, &t->go, seen, used ? t->spins : 0);
        if (__atomic_load_n(&t->quit, __ATOMIC_ACQUIRE)) return;
        seen = __atomic_load_n(&t->go, __ATOMIC_ACQUIRE);
        u32 nth = seen % GO_HEAD;  // this step's (thread 0 wrote it with the step: never a later step's)
        used = tid < nth;
        if (!used) continue;
        const Model *m = (const Model *)t->m;
        Bufs *b = t->bufs + (tid - 1);
        Ctx c = {tid, nth, b->work, t, (float *)b->work, b->xn, b->xn, b->k, b->v, m->parts ? b->r : m->r};
        if (seen & GO_HEAD)
            head_body(&c, m, (const Step *)t->s);
        else
            step_body(&c, m, (const Step *)t->s);
    }
}

// Makes every thread leave: wi_worker returns, a step in flight is abandoned at its next barrier.
EXPORT(wi_team_quit) void wi_team_quit(Team *t) {
    __atomic_store_n(&t->quit, 1, __ATOMIC_RELEASE);
    __atomic_add_fetch(&t->go, GO_STEP, __ATOMIC_RELEASE);
    __atomic_add_fetch(&t->gen, 1, __ATOMIC_RELEASE);
    __builtin_wasm_memory_atomic_notify((int *)&t->go, ~0u);
    __builtin_wasm_memory_atomic_notify((int *)&t->gen, ~0u);
}
#endif

// ------------------------------------------------------------------------------------------------ single kernels
// (the tests call these against numpy; the bench times them)

EXPORT(wi_linear) void wi_linear(const Weight *w, const float *x, u32 x_stride, float *y, u32 y_stride, u32 rows,
                                 u32 accumulate, u32 fast, u8 *scratch) {
    linear(w, x, x_stride, y, y_stride, rows, accumulate, fast, scratch, 1, 0, w->n);
}

// wi_linear for the output columns [n0, n1) only (n0 a multiple of 4): one thread's share of a matrix
EXPORT(wi_linear_part) void wi_linear_part(const Weight *w, const float *x, u32 x_stride, float *y, u32 y_stride,
                                           u32 rows, u32 accumulate, u32 fast, u8 *scratch, u32 n0, u32 n1) {
    linear(w, x, x_stride, y, y_stride, rows, accumulate, fast, scratch, 1, n0, n1);
}

// wi_linear `reps` times in one call: the bench times kernels without the host's per-call cost (~40 us in wasmtime-py).
// The activations are prepared once (the first rep), as a step prepares them once for q/k/v and gate/up: the
// bench's per-matrix times are the matrices' own, and the preparation falls in the step's remainder.
EXPORT(wi_linear_reps) void wi_linear_reps(const Weight *w, const float *x, u32 x_stride, float *y, u32 y_stride,
                                           u32 rows, u32 fast, u8 *scratch, u32 reps) {
    for (u32 i = 0; i < reps; i++) linear(w, x, x_stride, y, y_stride, rows, 0, fast, scratch, i == 0, 0, w->n);
}

// tests: the LM head's two passes on one thread over every row of packed w against one activation row x, at the
// cut of the sampled row p (0: greedy); y gets what a step leaves in its logits row (exact for the candidates'
// groups, upper bounds elsewhere); returns y's argmax (lowest id on ties)
EXPORT(wi_head_two_pass) u32 wi_head_two_pass(const Weight *w, const float *x, float *y, u8 *scratch,
                                              const SampleParams *p) {
    float bmax = 0.0f, L = head_pass(w, x, y, scratch, 0, w->n, 1, 0.0f, &bmax);
    float C = p && topk_alone(p, w->n) ? head_topk_floor(y, w->n, p->top_k, bmax) : __builtin_nanf("");
    float cut = p ? head_cut(p, L, C) : L;
    head_pass(w, x, y, scratch, 0, w->n, 0, cut, 0);
    u32 best = 0;
    for (u32 i = 1; i < w->n; i++)
        if (okey(y[i]) > okey(y[best])) best = i;
    return best;
}

// bytes of scratch wi_linear needs for `rows` rows of K = kp
EXPORT(wi_linear_scratch_bytes) u32 wi_linear_scratch_bytes(u32 rows, u32 kp) { return linear_scratch_bytes(rows, kp); }

EXPORT(wi_dequant_rows) void wi_dequant_rows(const Weight *w, u32 row0, u32 rows, float *out) {
    for (u32 r = 0; r < rows; r++) dequant_row(w, row0 + r, out + r * w->k);
}

EXPORT(wi_rmsnorm) void wi_rmsnorm(const float *x, u32 x_stride, const float *w, float *y, u32 y_stride, u32 rows,
                                   u32 d, float eps) {
    rmsnorm(x, x_stride, w, y, y_stride, rows, d, eps);
}

EXPORT(wi_rope) void wi_rope(float *x, u32 rows, u32 stride, u32 n_heads, u32 hd, const float *cos_t,
                             const float *sin_t, const u32 *pos) {
    for (u32 r = 0; r < rows; r++) rope_row(x + r * stride, n_heads, hd, cos_t, sin_t, pos[r]);
}

// mul, cap, window: attend_row's (0: the llama block's 1/sqrt(hd), no soft-cap, no window)
EXPORT(wi_attention) void wi_attention(const float *q, float *out, u32 rows, const float *kc, const float *vc,
                                       const u32 *table, u32 start_pos, u32 n_heads, u32 n_kv, u32 hd, u32 bs,
                                       float *scores, float mul, float cap, u32 window) {
    for (u32 j = 0; j < rows; j++)
        attend_row(q + j * n_heads * hd, out + j * n_heads * hd, kc, vc, table, start_pos + j, n_heads, n_kv, hd, bs,
                   scores, 0, n_heads, mul, cap, window);
}

EXPORT(wi_swiglu) void wi_swiglu(float *g, const float *u, u32 n) {
    for (u32 i = 0; i < n; i++) g[i] = silu(g[i]) * u[i];
}

EXPORT(wi_geglu) void wi_geglu(float *g, const float *u, u32 n) {
    for (u32 i = 0; i < n; i++) g[i] = gelu_tanh(g[i]) * u[i];
}

EXPORT(wi_softcap) void wi_softcap(float *x, u32 n, float cap) {
    for (u32 i = 0; i < n; i++) x[i] = softcap(x[i], cap);
}

EXPORT(wi_exp) void wi_exp(const float *x, float *y, u32 n) {
    for (u32 i = 0; i < n; i++) y[i] = expf_(x[i]);
}

// attention's softmax exp of x - mx: mode 0 softmax_exp one by one, 1 expf4 4 at a time (n a multiple of 4)
EXPORT(wi_softmax_exp) void wi_softmax_exp(const float *x, float *y, u32 n, float mx, u32 mode) {
    for (u32 i = 0; i < n; i++) y[i] = mode ? x[i] : softmax_exp(x[i] - mx);
    if (mode)
        for (u32 i = 0; i + 4 <= n; i += 4) expf4(y + i, mx);
}

// counts, logprobs: as the Step's (0: none)
EXPORT(wi_test_sort_all) void wi_test_sort_all(u32 on) { sort_all = on; }
EXPORT(wi_test_tiny_x) float wi_test_tiny_x(void) { return TINY_X; }
// tests: draw()'s sum of every id's term (sum_terms): the mass (r < 0) or the walk's id at r (into *id)
EXPORT(wi_test_sum_terms) double wi_test_sum_terms(const float *l, u32 vocab, float mx, float inv_t, double r, u32 *id) {
    return sum_terms(l, vocab, mx, inv_t, r, id);
}
// tests: draw()'s mass of every id's term in four accumulators (mass_terms)
EXPORT(wi_test_mass_terms) double wi_test_mass_terms(const float *l, u32 vocab, float mx, float inv_t) {
    return mass_terms(l, vocab, mx, inv_t);
}
EXPORT(wi_test_head_band) float wi_test_head_band(u32 j) { return j < HEAD_ROWS ? head_band[j] : -1.0f; }

EXPORT(wi_sample) void wi_sample(const float *logits, u32 vocab, const SampleParams *p, const u32 *aux, u32 rows,
                                 u32 *out, u8 *scratch, u32 *counts, u32 *logprobs) {
    for (u32 j = 0; j < rows; j++)
        out[j] = sample_row(logits + p[j].logit_row * vocab, vocab, p + j, aux, counts,
                            logprobs ? logprobs + LPW * j : 0, scratch);
}

// Read bandwidth: sums `bytes` bytes (a multiple of 64) `reps` times; the bench sets GEMV GB/s beside it.
EXPORT(wi_read_bw) u32 wi_read_bw(const u8 *p, u32 bytes, u32 reps) {
    v128_t a0 = wasm_i32x4_splat(0), a1 = a0, a2 = a0, a3 = a0;
    for (u32 r = 0; r < reps; r++)
        for (u32 i = 0; i < bytes; i += 64) {
            a0 = wasm_i32x4_add(a0, wasm_v128_load(p + i));
            a1 = wasm_i32x4_add(a1, wasm_v128_load(p + i + 16));
            a2 = wasm_i32x4_add(a2, wasm_v128_load(p + i + 32));
            a3 = wasm_i32x4_add(a3, wasm_v128_load(p + i + 48));
        }
    v128_t s = wasm_i32x4_add(wasm_i32x4_add(a0, a1), wasm_i32x4_add(a2, a3));
    return (u32)(wasm_i32x4_extract_lane(s, 0) + wasm_i32x4_extract_lane(s, 1) + wasm_i32x4_extract_lane(s, 2) +
                 wasm_i32x4_extract_lane(s, 3));
}

// Relaxed-SIMD self-test: engines have shipped relaxed-SIMD bugs, so the runner checks the one instruction it
// relies on against plain arithmetic before choosing this variant. Returns 1 when it agrees (base build: 1).
EXPORT(wi_selftest) u32 wi_selftest(void) {
#ifdef RELAXED
    i8 a[16] __attribute__((aligned(16)));
    u8 b[16] __attribute__((aligned(16)));
    for (int t = 0; t < 8; t++) {
        for (int i = 0; i < 16; i++) {
            a[i] = (i8)(((i * 37 + t * 91) % 255) - 127);
            b[i] = (u8)((i * 13 + t * 7) % 64);
        }
        volatile int seed = t;
        v128_t r = wasm_i32x4_relaxed_dot_i8x16_i7x16_add(wasm_v128_load(a), wasm_v128_load(b), wasm_i32x4_splat(seed));
        for (int j = 0; j < 4; j++) {
            i32 want = seed;
            for (int i = 4 * j; i < 4 * j + 4; i++) want += (i32)a[i] * (i32)b[i];
            i32 got = j == 0 ? wasm_i32x4_extract_lane(r, 0) : j == 1 ? wasm_i32x4_extract_lane(r, 1)
                    : j == 2 ? wasm_i32x4_extract_lane(r, 2) : wasm_i32x4_extract_lane(r, 3);
            if (got != want) return 0;
        }
    }
#endif
    return 1;
}

EXPORT(wi_relaxed) u32 wi_relaxed(void) {
#ifdef RELAXED
    return 1;
#else
    return 0;
#endif
}
