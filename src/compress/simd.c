/* Bulk kernels of the codecs. Each has a portable C version and, on x86-64, AVX2 (with F16C
 * and BMI2) and AVX-512 versions chosen at run time from CPUID. Every version computes the same
 * bits: the arithmetic is the per-element definition of compress_ew.h (integer operations,
 * single IEEE operations, fixed summation order), only spread over vector lanes. The tests run
 * every level against the portable one. Thread-safe: no state but the level ceiling.
 * -DHS_COMPRESS_PORTABLE builds only the portable versions (as on other architectures). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "compress/compress_ew.h"
#include "compress/codec.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(HS_COMPRESS_PORTABLE)
#define HS__X86 1
#include <cpuid.h>
#include <immintrin.h>
#define TGT_AVX2 __attribute__((target("avx2,f16c,bmi,bmi2,popcnt")))
#define TGT_AVX512                                                                                 \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,f16c,bmi,bmi2,popcnt")))
#else
#define HS__X86 0
#endif

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* ---------------------------------------------------------------- level */

static int hw_level(void) {
#if HS__X86
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    int osxsave = (c >> 27) & 1, f16c = (c >> 29) & 1;
    if (!osxsave || !f16c) return 0;
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    (void)hi;
    if ((lo & 6) != 6) return 0; /* the OS saves SSE and AVX state */
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    int avx2 = (b >> 5) & 1, bmi1 = (b >> 3) & 1, bmi2 = (b >> 8) & 1;
    if (!avx2 || !bmi1 || !bmi2) return 0;
    int f = (b >> 16) & 1, dq = (b >> 17) & 1, bw = (b >> 30) & 1, vl = (b >> 31) & 1;
    if (f && dq && bw && vl && (lo & 0xE6) == 0xE6) return 2;
    return 1;
#else
    return 0;
#endif
}

static int level_hw = -1;   /* detected once; racing first calls store the same value */
static int level_cap = 2;

int hs__csimd_level(void) {
    int hw = __atomic_load_n(&level_hw, __ATOMIC_RELAXED);
    if (hw < 0) {
        hw = hw_level();
        __atomic_store_n(&level_hw, hw, __ATOMIC_RELAXED);
    }
    int cap = __atomic_load_n(&level_cap, __ATOMIC_RELAXED);
    return hw < cap ? hw : cap;
}

int hs__csimd_cap(int max_level) {
    __atomic_store_n(&level_cap, max_level < 0 ? 0 : max_level, __ATOMIC_RELAXED);
    return hs__csimd_level();
}

/* Defines name(args) dispatching to name_avx512 / name_avx2 / name_c, where the vector versions
 * compile the same always-inline body with wider targets (the compiler vectorizes it). */
#if HS__X86
#define AUTOVEC(ret, name, params, args)                                                           \
    TGT_AVX2 static ret name##_avx2 params { return name##_body args; }                            \
    TGT_AVX512 static ret name##_avx512 params { return name##_body args; }                        \
    ret name params {                                                                              \
        int lv = hs__csimd_level();                                                                \
        if (lv >= 2) return name##_avx512 args;                                                    \
        if (lv >= 1) return name##_avx2 args;                                                      \
        return name##_body args;                                                                   \
    }
/* The same for functions returning void. */
#define AUTOVEC_VOID(name, params, args)                                                           \
    TGT_AVX2 static void name##_avx2 params { name##_body args; }                                  \
    TGT_AVX512 static void name##_avx512 params { name##_body args; }                              \
    void name params {                                                                             \
        int lv = hs__csimd_level();                                                                \
        if (lv >= 2)                                                                               \
            name##_avx512 args;                                                                    \
        else if (lv >= 1)                                                                          \
            name##_avx2 args;                                                                      \
        else                                                                                       \
            name##_body args;                                                                      \
    }
#else
#define AUTOVEC(ret, name, params, args)                                                           \
    ret name params { return name##_body args; }
#define AUTOVEC_VOID(name, params, args)                                                           \
    void name params { name##_body args; }
#endif

/* ---------------------------------------------------------------- magnitudes */

ALWAYS_INLINE uint32_t hs__cmax_key_body(const float *x, size_t n) {
    uint32_t m = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t k;
        memcpy(&k, &x[i], 4);
        k &= 0x7FFFFFFFu;
        m = k > m ? k : m;
    }
    return m;
}
AUTOVEC(uint32_t, hs__cmax_key, (const float *x, size_t n), (x, n))

ALWAYS_INLINE uint32_t hs__cf32_max_key_body(const uint8_t *p, size_t n) {
    uint32_t m = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t k = hs__ld32(p + 4 * i) & 0x7FFFFFFFu;
        m = k > m ? k : m;
    }
    return m;
}
AUTOVEC(uint32_t, hs__cf32_max_key, (const uint8_t *p, size_t n), (p, n))

ALWAYS_INLINE uint16_t hs__c16_max_mag_body(const uint8_t *p, size_t n) {
    uint16_t m = 0;
    for (size_t i = 0; i < n; i++) {
        uint16_t k = (uint16_t)(hs__ld16(p + 2 * i) & 0x7FFFu);
        m = k > m ? k : m;
    }
    return m;
}
AUTOVEC(uint16_t, hs__c16_max_mag, (const uint8_t *p, size_t n), (p, n))

/* ---------------------------------------------------------------- fp16 / bf16 / fp32 */

static void f16_encode_c(const float *x, size_t n, uint8_t *dst) {
    for (size_t i = 0; i < n; i++) hs__st16(dst + 2 * i, hs_cw_f16_from_f32(x[i]));
}

#if HS__X86
TGT_AVX2 static void f16_encode_avx2(const float *x, size_t n, uint8_t *dst) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT);
        _mm_storeu_si128((__m128i *)(void *)(dst + 2 * i), h);
    }
    f16_encode_c(x + i, n - i, dst + 2 * i);
}

TGT_AVX512 static void f16_encode_avx512(const float *x, size_t n, uint8_t *dst) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i h = _mm512_cvtps_ph(_mm512_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT);
        _mm256_storeu_si256((__m256i *)(void *)(dst + 2 * i), h);
    }
    f16_encode_c(x + i, n - i, dst + 2 * i);
}
#endif

void hs__cf16_encode(const float *x, size_t n, uint8_t *dst) {
#if HS__X86
    int lv = hs__csimd_level();
    if (lv >= 2) {
        f16_encode_avx512(x, n, dst);
        return;
    }
    if (lv >= 1) {
        f16_encode_avx2(x, n, dst);
        return;
    }
#endif
    f16_encode_c(x, n, dst);
}

ALWAYS_INLINE void hs__cbf16_encode_body(const float *x, size_t n, uint8_t *dst) {
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], 4);
        uint16_t h = (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
#if HS__LE
        memcpy(dst + 2 * i, &h, 2);
#else
        hs__st16(dst + 2 * i, h);
#endif
    }
}
AUTOVEC_VOID(hs__cbf16_encode, (const float *x, size_t n, uint8_t *dst), (x, n, dst))

ALWAYS_INLINE void hs__cf32_add_body(const uint8_t *p, size_t n, float *acc, float alpha) {
    for (size_t i = 0; i < n; i++) {
#if HS__LE
        float v;
        memcpy(&v, p + 4 * i, 4);
#else
        float v = hs__ldf(p + 4 * i);
#endif
        acc[i] = acc[i] + alpha * v;
    }
}
AUTOVEC_VOID(hs__cf32_add, (const uint8_t *p, size_t n, float *acc, float alpha),
        (p, n, acc, alpha))

/* Copies written as loops rather than memcpy: glibc's memcpy uses `rep movsb` for these sizes,
 * which AMD Zen runs at 1-3 GB/s instead of 30-40 when dst - src is 1..15 bytes modulo 4096
 * (the offset a 12-byte header or a 1-byte payload tag gives between two page-aligned
 * buffers). The loops also return the largest key, so the copy is the finiteness check. */
ALWAYS_INLINE uint32_t hs__cf32_put_body(const float *x, size_t n, uint8_t *dst) {
    uint32_t m = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t k;
        memcpy(&k, &x[i], 4);
#if HS__LE
        memcpy(dst + 4 * i, &k, 4);
#else
        hs__st32(dst + 4 * i, k);
#endif
        k &= 0x7FFFFFFFu;
        m = k > m ? k : m;
    }
    return m;
}
AUTOVEC(uint32_t, hs__cf32_put, (const float *x, size_t n, uint8_t *dst), (x, n, dst))

ALWAYS_INLINE uint32_t hs__cf32_get_body(const uint8_t *p, size_t n, float *dst) {
    uint32_t m = 0;
    for (size_t i = 0; i < n; i++) {
#if HS__LE
        uint32_t k;
        memcpy(&k, p + 4 * i, 4);
#else
        uint32_t k = hs__ld32(p + 4 * i);
#endif
        memcpy(&dst[i], &k, 4);
        k &= 0x7FFFFFFFu;
        m = k > m ? k : m;
    }
    return m;
}
AUTOVEC(uint32_t, hs__cf32_get, (const uint8_t *p, size_t n, float *dst), (p, n, dst))

static void f16_add_c(const uint8_t *p, size_t n, float *acc, float alpha) {
    for (size_t i = 0; i < n; i++) acc[i] = acc[i] + alpha * hs_cw_f32_from_f16(hs__ld16(p + 2 * i));
}

#if HS__X86
TGT_AVX2 static void f16_add_avx2(const uint8_t *p, size_t n, float *acc, float alpha) {
    size_t i = 0;
    __m256 a = _mm256_set1_ps(alpha);
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(p + 2 * i)));
        _mm256_storeu_ps(acc + i, _mm256_add_ps(_mm256_loadu_ps(acc + i), _mm256_mul_ps(a, v)));
    }
    f16_add_c(p + 2 * i, n - i, acc + i, alpha);
}

TGT_AVX512 static void f16_add_avx512(const uint8_t *p, size_t n, float *acc, float alpha) {
    size_t i = 0;
    __m512 a = _mm512_set1_ps(alpha);
    for (; i + 16 <= n; i += 16) {
        __m512 v =
            _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(p + 2 * i)));
        _mm512_storeu_ps(acc + i, _mm512_add_ps(_mm512_loadu_ps(acc + i), _mm512_mul_ps(a, v)));
    }
    f16_add_c(p + 2 * i, n - i, acc + i, alpha);
}
#endif

void hs__cf16_add(const uint8_t *p, size_t n, float *acc, float alpha) {
#if HS__X86
    int lv = hs__csimd_level();
    if (lv >= 2) {
        f16_add_avx512(p, n, acc, alpha);
        return;
    }
    if (lv >= 1) {
        f16_add_avx2(p, n, acc, alpha);
        return;
    }
#endif
    f16_add_c(p, n, acc, alpha);
}

ALWAYS_INLINE void hs__cbf16_add_body(const uint8_t *p, size_t n, float *acc, float alpha) {
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
#if HS__LE
        memcpy(&h, p + 2 * i, 2);
#else
        h = hs__ld16(p + 2 * i);
#endif
        uint32_t u = (uint32_t)h << 16;
        float v;
        memcpy(&v, &u, 4);
        acc[i] = acc[i] + alpha * v;
    }
}
AUTOVEC_VOID(hs__cbf16_add, (const uint8_t *p, size_t n, float *acc, float alpha),
        (p, n, acc, alpha))

/* ---------------------------------------------------------------- reductions */

ALWAYS_INLINE double hs__cl1_body(const float *x, size_t n) {
    double l[32];
    memset(l, 0, sizeof(l));
    size_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int j = 0; j < 32; j++) l[j] += (double)fabsf(x[i + j]);
    for (int j = 0; i < n; i++, j++) l[j] += (double)fabsf(x[i]);
    return hs_cw_lanes32(l);
}
AUTOVEC(double, hs__cl1, (const float *x, size_t n), (x, n))

ALWAYS_INLINE double hs__cl2sq_body(const float *x, size_t n) {
    double l[32];
    memset(l, 0, sizeof(l));
    size_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int j = 0; j < 32; j++) l[j] += (double)x[i + j] * (double)x[i + j];
    for (int j = 0; i < n; i++, j++) l[j] += (double)x[i] * (double)x[i];
    return hs_cw_lanes32(l);
}
AUTOVEC(double, hs__cl2sq, (const float *x, size_t n), (x, n))

/* ---------------------------------------------------------------- sign bits */

static void sign_pack_c(const float *x, size_t n, uint8_t *dst) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        unsigned byte = 0;
        for (int j = 0; j < 8; j++) byte |= (hs_cw_bits(x[i + j]) >> 31) << j;
        dst[i / 8] = (uint8_t)byte;
    }
    if (i < n) {
        unsigned byte = 0;
        for (int j = 0; i + (size_t)j < n; j++) byte |= (hs_cw_bits(x[i + j]) >> 31) << j;
        dst[i / 8] = (uint8_t)byte;
    }
}

#if HS__X86
TGT_AVX2 static void sign_pack_avx2(const float *x, size_t n, uint8_t *dst) {
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        uint32_t m = (uint32_t)_mm256_movemask_ps(_mm256_loadu_ps(x + i)) |
                     (uint32_t)_mm256_movemask_ps(_mm256_loadu_ps(x + i + 8)) << 8 |
                     (uint32_t)_mm256_movemask_ps(_mm256_loadu_ps(x + i + 16)) << 16 |
                     (uint32_t)_mm256_movemask_ps(_mm256_loadu_ps(x + i + 24)) << 24;
        hs__st32(dst + i / 8, m);
    }
    sign_pack_c(x + i, n - i, dst + i / 8);
}

TGT_AVX512 static void sign_pack_avx512(const float *x, size_t n, uint8_t *dst) {
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        uint64_t m = 0;
        for (int j = 0; j < 4; j++)
            m |= (uint64_t)_mm512_movepi32_mask(_mm512_loadu_si512((const void *)(x + i + 16 * j)))
                 << (16 * j);
        memcpy(dst + i / 8, &m, 8);
    }
    sign_pack_c(x + i, n - i, dst + i / 8);
}
#endif

void hs__csign_pack(const float *x, size_t n, uint8_t *dst) {
#if HS__X86
    int lv = hs__csimd_level();
    if (lv >= 2) {
        sign_pack_avx512(x, n, dst);
        return;
    }
    if (lv >= 1) {
        sign_pack_avx2(x, n, dst);
        return;
    }
#endif
    sign_pack_c(x, n, dst);
}

/* ---------------------------------------------------------------- Philox */

static void philox_fill_c(uint64_t seed, uint32_t purpose, uint32_t peer, uint32_t round,
                          uint32_t block, size_t nblocks, uint32_t *out) {
    for (size_t j = 0; j < nblocks; j++)
        hs_rng_block(seed, purpose, peer, round, block + (uint32_t)j, out + 4 * j);
}

#if HS__X86
/* Philox4x32-10 of 8 consecutive blocks in the lanes of c0 (counters), the other counter words
 * and the key broadcast; the 32x32->64 products come from vpmuludq on the even lanes and on
 * the odd lanes shifted down. */
TGT_AVX2 static void philox8_avx2(__m256i c0, __m256i c1, __m256i c2, __m256i c3, uint32_t k0,
                                  uint32_t k1, uint32_t *out) {
    const __m256i m0 = _mm256_set1_epi64x(0xD2511F53), m1 = _mm256_set1_epi64x(0xCD9E8D57);
    for (int r = 0; r < 10; r++) {
        __m256i pe0 = _mm256_mul_epu32(c0, m0), po0 = _mm256_mul_epu32(_mm256_srli_epi64(c0, 32), m0);
        __m256i pe1 = _mm256_mul_epu32(c2, m1), po1 = _mm256_mul_epu32(_mm256_srli_epi64(c2, 32), m1);
        __m256i hi0 = _mm256_blend_epi32(_mm256_srli_epi64(pe0, 32), po0, 0xAA);
        __m256i lo0 = _mm256_blend_epi32(pe0, _mm256_slli_epi64(po0, 32), 0xAA);
        __m256i hi1 = _mm256_blend_epi32(_mm256_srli_epi64(pe1, 32), po1, 0xAA);
        __m256i lo1 = _mm256_blend_epi32(pe1, _mm256_slli_epi64(po1, 32), 0xAA);
        __m256i n0 = _mm256_xor_si256(_mm256_xor_si256(hi1, c1), _mm256_set1_epi32((int)k0));
        __m256i n2 = _mm256_xor_si256(_mm256_xor_si256(hi0, c3), _mm256_set1_epi32((int)k1));
        c0 = n0;
        c1 = lo1;
        c2 = n2;
        c3 = lo0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    /* Transpose the 4 x 8 words into 8 blocks of 4. */
    __m256i t0 = _mm256_unpacklo_epi32(c0, c1), t1 = _mm256_unpackhi_epi32(c0, c1);
    __m256i t2 = _mm256_unpacklo_epi32(c2, c3), t3 = _mm256_unpackhi_epi32(c2, c3);
    __m256i u0 = _mm256_unpacklo_epi64(t0, t2), u1 = _mm256_unpackhi_epi64(t0, t2);
    __m256i u2 = _mm256_unpacklo_epi64(t1, t3), u3 = _mm256_unpackhi_epi64(t1, t3);
    _mm256_storeu_si256((__m256i *)(void *)(out + 0), _mm256_permute2x128_si256(u0, u1, 0x20));
    _mm256_storeu_si256((__m256i *)(void *)(out + 8), _mm256_permute2x128_si256(u2, u3, 0x20));
    _mm256_storeu_si256((__m256i *)(void *)(out + 16), _mm256_permute2x128_si256(u0, u1, 0x31));
    _mm256_storeu_si256((__m256i *)(void *)(out + 24), _mm256_permute2x128_si256(u2, u3, 0x31));
}

TGT_AVX2 static void philox_fill_avx2(uint64_t seed, uint32_t purpose, uint32_t peer,
                                      uint32_t round, uint32_t block, size_t nblocks,
                                      uint32_t *out) {
    size_t j = 0;
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (; j + 8 <= nblocks; j += 8) {
        __m256i c0 = _mm256_add_epi32(_mm256_set1_epi32((int)(block + (uint32_t)j)), lane);
        philox8_avx2(c0, _mm256_set1_epi32((int)purpose), _mm256_set1_epi32((int)round),
                     _mm256_set1_epi32((int)peer), (uint32_t)seed, (uint32_t)(seed >> 32),
                     out + 4 * j);
    }
    philox_fill_c(seed, purpose, peer, round, block + (uint32_t)j, nblocks - j, out + 4 * j);
}

/* Philox4x32-10 of 8 blocks with one block per 64-bit lane (the 32-bit words in the low
 * halves; the high halves carry junk that never reaches a low half): vpmuludq then gives each
 * 64-bit product whole, its low half is `lo` as it stands and vpshufd brings `hi` down, so a
 * round costs 2 multiplies, 2 shuffles and 2 ternary XORs per 8 blocks. Two sets of 8 blocks
 * are interleaved for instruction-level parallelism. */
TGT_AVX512 static void philox16_avx512(uint32_t block, uint32_t purpose, uint32_t round,
                                       uint32_t peer, uint32_t k0, uint32_t k1, uint32_t *out) {
    const __m512i m0 = _mm512_set1_epi64(0xD2511F53), m1 = _mm512_set1_epi64(0xCD9E8D57);
    const __m512i lane = _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7);
    __m512i a0 = _mm512_add_epi64(_mm512_set1_epi64(block), lane);
    __m512i b0 = _mm512_add_epi64(a0, _mm512_set1_epi64(8));
    __m512i a1 = _mm512_set1_epi64(purpose), b1 = a1;
    __m512i a2 = _mm512_set1_epi64(round), b2 = a2;
    __m512i a3 = _mm512_set1_epi64(peer), b3 = a3;
    for (int r = 0; r < 10; r++) {
        __m512i K0 = _mm512_set1_epi32((int)k0), K1 = _mm512_set1_epi32((int)k1);
        __m512i pa0 = _mm512_mul_epu32(a0, m0), pa1 = _mm512_mul_epu32(a2, m1);
        __m512i pb0 = _mm512_mul_epu32(b0, m0), pb1 = _mm512_mul_epu32(b2, m1);
        /* 0xF5 moves each high dword down; 0x96 is a ^ b ^ c. */
        a0 = _mm512_ternarylogic_epi32(_mm512_shuffle_epi32(pa1, (_MM_PERM_ENUM)0xF5), a1, K0, 0x96);
        a2 = _mm512_ternarylogic_epi32(_mm512_shuffle_epi32(pa0, (_MM_PERM_ENUM)0xF5), a3, K1, 0x96);
        b0 = _mm512_ternarylogic_epi32(_mm512_shuffle_epi32(pb1, (_MM_PERM_ENUM)0xF5), b1, K0, 0x96);
        b2 = _mm512_ternarylogic_epi32(_mm512_shuffle_epi32(pb0, (_MM_PERM_ENUM)0xF5), b3, K1, 0x96);
        a1 = pa1;
        a3 = pa0;
        b1 = pb1;
        b3 = pb0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    /* Words of block j: low dwords of qword j of c0..c3. Pair them into (c0, c1) and (c2, c3)
     * qwords, then interleave the pairs block by block. */
    const __m512i lo = _mm512_setr_epi64(0, 8, 1, 9, 2, 10, 3, 11);
    const __m512i hi = _mm512_setr_epi64(4, 12, 5, 13, 6, 14, 7, 15);
    __m512i c[2][4] = {{a0, a1, a2, a3}, {b0, b1, b2, b3}};
    for (int h = 0; h < 2; h++) {
        __m512i t01 = _mm512_mask_blend_epi32(
            0xAAAA, c[h][0], _mm512_shuffle_epi32(c[h][1], (_MM_PERM_ENUM)0xA0));
        __m512i t23 = _mm512_mask_blend_epi32(
            0xAAAA, c[h][2], _mm512_shuffle_epi32(c[h][3], (_MM_PERM_ENUM)0xA0));
        _mm512_storeu_si512((void *)(out + 32 * h), _mm512_permutex2var_epi64(t01, lo, t23));
        _mm512_storeu_si512((void *)(out + 32 * h + 16),
                            _mm512_permutex2var_epi64(t01, hi, t23));
    }
}

TGT_AVX512 static void philox_fill_avx512(uint64_t seed, uint32_t purpose, uint32_t peer,
                                          uint32_t round, uint32_t block, size_t nblocks,
                                          uint32_t *out) {
    size_t j = 0;
    for (; j + 16 <= nblocks; j += 16)
        philox16_avx512(block + (uint32_t)j, purpose, round, peer, (uint32_t)seed,
                        (uint32_t)(seed >> 32), out + 4 * j);
    philox_fill_c(seed, purpose, peer, round, block + (uint32_t)j, nblocks - j, out + 4 * j);
}
#endif

void hs__cphilox_fill(uint64_t seed, uint32_t purpose, uint32_t peer, uint32_t round,
                      uint64_t first, size_t n, uint32_t *out) {
    uint32_t block = (uint32_t)(first >> 2);
    size_t nb = n / 4;
#if HS__X86
    int lv = hs__csimd_level();
    if (lv >= 2)
        philox_fill_avx512(seed, purpose, peer, round, block, nb, out);
    else if (lv >= 1)
        philox_fill_avx2(seed, purpose, peer, round, block, nb, out);
    else
#endif
        philox_fill_c(seed, purpose, peer, round, block, nb, out);
    if (n % 4) {
        uint32_t tail[4];
        hs_rng_block(seed, purpose, peer, round, block + (uint32_t)nb, tail);
        memcpy(out + 4 * nb, tail, (n % 4) * sizeof(uint32_t));
    }
}

/* ---------------------------------------------------------------- QSGD fields */

ALWAYS_INLINE void fields8_loop(const float *x, size_t n, float pre, int use_pre, float inv16,
                                uint32_t s, uint32_t b, const uint16_t *u, uint8_t *f) {
    const uint32_t sh = b - 1u;
    for (size_t i = 0; i < n; i++) {
        uint32_t xb;
        memcpy(&xb, &x[i], 4);
        uint32_t ab = xb & 0x7FFFFFFFu;
        float a;
        memcpy(&a, &ab, 4);
        float r16 = (use_pre ? a * pre : a) * inv16;
        uint32_t l = ((uint32_t)(int32_t)r16 + u[i]) >> 16;
        l = l < s ? l : s;
        uint32_t neg = (xb >> 31) & (l != 0 ? 1u : 0u);
        f[i] = (uint8_t)(l | (neg << sh));
    }
}

/* hs_cw_qsgd_field over a bucket segment; with pre == 1 the multiply by pre is exact and
 * skipped. */
ALWAYS_INLINE void hs__cqsgd_fields8_body(const float *x, size_t n, float pre, float inv16,
                                          uint32_t s, uint32_t b, const uint16_t *u,
                                          uint8_t *f) {
    if (pre == 1.0f)
        fields8_loop(x, n, pre, 0, inv16, s, b, u, f);
    else
        fields8_loop(x, n, pre, 1, inv16, s, b, u, f);
}
#if HS__X86
TGT_AVX2 static void hs__cqsgd_fields8_avx2(const float *x, size_t n, float pre, float inv16,
                                            uint32_t s, uint32_t b, const uint16_t *u,
                                            uint8_t *f) {
    hs__cqsgd_fields8_body(x, n, pre, inv16, s, b, u, f);
}

/* The same per 16 elements with mask registers: the sign goes in by a masked OR where x is
 * negative and the level nonzero, and vpmovdb narrows to bytes. */
TGT_AVX512 static void hs__cqsgd_fields8_avx512(const float *x, size_t n, float pre, float inv16,
                                                uint32_t s, uint32_t b, const uint16_t *u,
                                                uint8_t *f) {
    size_t i = 0;
    const __m512 vpre = _mm512_set1_ps(pre), vinv = _mm512_set1_ps(inv16);
    const __m512i vs = _mm512_set1_epi32((int)s), vsign = _mm512_set1_epi32((int)(1u << (b - 1)));
    const __m512i absm = _mm512_set1_epi32(0x7FFFFFFF);
    const int use_pre = pre != 1.0f;
    for (; i + 16 <= n; i += 16) {
        __m512i xb = _mm512_loadu_si512((const void *)(x + i));
        __m512 a = _mm512_castsi512_ps(_mm512_and_si512(xb, absm));
        if (use_pre) a = _mm512_mul_ps(a, vpre);
        __m512i fix = _mm512_cvttps_epi32(_mm512_mul_ps(a, vinv));
        __m512i uu = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)(u + i)));
        __m512i l = _mm512_min_epu32(_mm512_srli_epi32(_mm512_add_epi32(fix, uu), 16), vs);
        __mmask16 neg = _mm512_movepi32_mask(xb) & _mm512_test_epi32_mask(l, l);
        l = _mm512_mask_or_epi32(l, neg, l, vsign);
        _mm_storeu_si128((__m128i *)(void *)(f + i), _mm512_cvtepi32_epi8(l));
    }
    hs__cqsgd_fields8_body(x + i, n - i, pre, inv16, s, b, u + i, f + i);
}

void hs__cqsgd_fields8(const float *x, size_t n, float pre, float inv16, uint32_t s, uint32_t b,
                       const uint16_t *u, uint8_t *f) {
    int lv = hs__csimd_level();
    if (lv >= 2)
        hs__cqsgd_fields8_avx512(x, n, pre, inv16, s, b, u, f);
    else if (lv >= 1)
        hs__cqsgd_fields8_avx2(x, n, pre, inv16, s, b, u, f);
    else
        hs__cqsgd_fields8_body(x, n, pre, inv16, s, b, u, f);
}
#else
AUTOVEC_VOID(hs__cqsgd_fields8,
             (const float *x, size_t n, float pre, float inv16, uint32_t s, uint32_t b,
              const uint16_t *u, uint8_t *f),
             (x, n, pre, inv16, s, b, u, f))
#endif

ALWAYS_INLINE int hs__cqsgd_check8_body(const uint8_t *f, size_t n, uint32_t b, uint32_t lmax) {
    const uint32_t lmask = (1u << (b - 1u)) - 1u, neg0 = lmask + 1u;
    int bad = 0;
    for (size_t i = 0; i < n; i++) bad |= ((f[i] & lmask) > lmax) | (f[i] == neg0);
    return bad;
}
AUTOVEC(int, hs__cqsgd_check8, (const uint8_t *f, size_t n, uint32_t b, uint32_t lmax),
        (f, n, b, lmax))

ALWAYS_INLINE void hs__cqsgd_add8_body(const uint8_t *f, size_t n, uint32_t b, float unit,
                                       float alpha, float *acc) {
    const uint32_t lmask = (1u << (b - 1u)) - 1u, sh = b - 1u;
    for (size_t i = 0; i < n; i++) {
        /* hs_cw_qsgd_value, with the sign applied by XOR of the sign bit (same bits as the
         * negation). */
        float v = (float)(int32_t)(f[i] & lmask) * unit;
        uint32_t vb;
        memcpy(&vb, &v, 4);
        vb ^= (uint32_t)(f[i] >> sh) << 31;
        memcpy(&v, &vb, 4);
        acc[i] = acc[i] + alpha * v;
    }
}
AUTOVEC_VOID(hs__cqsgd_add8,
             (const uint8_t *f, size_t n, uint32_t b, float unit, float alpha, float *acc),
             (f, n, b, unit, alpha, acc))

/* ---------------------------------------------------------------- sign decode */

static void sign_add_c(const uint8_t *bits, size_t lo, size_t hi, float as, float *acc) {
    float v[2] = {as, -as};
    for (size_t i = lo; i < hi; i++) acc[i] = acc[i] + v[(bits[i >> 3] >> (i & 7)) & 1];
}

#if HS__X86
TGT_AVX2 static void sign_add_avx2(const uint8_t *bits, size_t lo, size_t hi, float as,
                                   float *acc) {
    size_t i = lo;
    size_t head = (8 - lo % 8) % 8;
    if (head > hi - lo) head = hi - lo;
    sign_add_c(bits, i, i + head, as, acc);
    i += head;
    const __m256i sel = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    const __m256 pos = _mm256_set1_ps(as), neg = _mm256_set1_ps(-as);
    for (; i + 8 <= hi; i += 8) {
        __m256i m = _mm256_and_si256(_mm256_set1_epi32(bits[i >> 3]), sel);
        __m256 v = _mm256_blendv_ps(pos, neg, _mm256_castsi256_ps(_mm256_cmpeq_epi32(m, sel)));
        _mm256_storeu_ps(acc + i, _mm256_add_ps(_mm256_loadu_ps(acc + i), v));
    }
    sign_add_c(bits, i, hi, as, acc);
}

TGT_AVX512 static void sign_add_avx512(const uint8_t *bits, size_t lo, size_t hi, float as,
                                       float *acc) {
    size_t i = lo;
    size_t head = (16 - lo % 16) % 16;
    if (head > hi - lo) head = hi - lo;
    sign_add_c(bits, i, i + head, as, acc);
    i += head;
    const __m512 pos = _mm512_set1_ps(as), neg = _mm512_set1_ps(-as);
    for (; i + 16 <= hi; i += 16) {
        __mmask16 m = (__mmask16)hs__ld16(bits + (i >> 3));
        __m512 v = _mm512_mask_blend_ps(m, pos, neg);
        _mm512_storeu_ps(acc + i, _mm512_add_ps(_mm512_loadu_ps(acc + i), v));
    }
    sign_add_c(bits, i, hi, as, acc);
}
#endif

void hs__csign_add(const uint8_t *bits, size_t lo, size_t hi, float as, float *acc) {
#if HS__X86
    int lv = hs__csimd_level();
    if (lv >= 2) {
        sign_add_avx512(bits, lo, hi, as, acc);
        return;
    }
    if (lv >= 1) {
        sign_add_avx2(bits, lo, hi, as, acc);
        return;
    }
#endif
    sign_add_c(bits, lo, hi, as, acc);
}

/* ---------------------------------------------------------------- bit packing */

/* Mask with the low b bits of each of the 8 bytes. */
static uint64_t field_mask8(uint32_t b) { return 0x0101010101010101ull * ((1u << b) - 1u); }

static void pack8_c(const uint8_t *f, size_t n, uint32_t b, uint8_t *dst) {
    size_t g = 0, full = n / 8;
    for (; g < full; g++) {
        uint64_t v = 0;
        for (uint32_t j = 0; j < 8; j++) v |= (uint64_t)f[8 * g + j] << (j * b);
        for (uint32_t j = 0; j < b; j++) dst[g * b + j] = (uint8_t)(v >> (8 * j));
    }
    size_t rem = n % 8;
    if (rem) {
        uint64_t v = 0;
        for (uint32_t j = 0; j < rem; j++) v |= (uint64_t)f[8 * g + j] << (j * b);
        size_t bytes = (rem * b + 7) / 8;
        for (size_t j = 0; j < bytes; j++) dst[g * b + j] = (uint8_t)(v >> (8 * j));
    }
}

static void unpack8_c(const uint8_t *src, size_t n, uint32_t b, uint8_t *f) {
    size_t g = 0, full = n / 8;
    uint32_t mask = (1u << b) - 1u;
    for (; g < full; g++) {
        uint64_t v = 0;
        for (uint32_t j = 0; j < b; j++) v |= (uint64_t)src[g * b + j] << (8 * j);
        for (uint32_t j = 0; j < 8; j++) f[8 * g + j] = (uint8_t)((v >> (j * b)) & mask);
    }
    size_t rem = n % 8;
    if (rem) {
        uint64_t v = 0;
        size_t bytes = (rem * b + 7) / 8;
        for (size_t j = 0; j < bytes; j++) v |= (uint64_t)src[g * b + j] << (8 * j);
        for (uint32_t j = 0; j < rem; j++) f[8 * g + j] = (uint8_t)((v >> (j * b)) & mask);
    }
}

#if HS__X86 && HS__LE
/* pext gathers the low b bits of 8 bytes into 8b contiguous bits; pdep spreads them back. */
TGT_AVX2 static void pack8_bmi2(const uint8_t *f, size_t n, uint32_t b, uint8_t *dst) {
    size_t full = n / 8, g = 0, out_bytes = (n * b + 7) / 8;
    uint64_t mask = field_mask8(b);
    for (; g < full && g * b + 8 <= out_bytes; g++) {
        uint64_t v;
        memcpy(&v, f + 8 * g, 8);
        v = _pext_u64(v, mask);
        memcpy(dst + g * b, &v, 8); /* the next group overwrites the excess */
    }
    pack8_c(f + 8 * g, n - 8 * g, b, dst + g * b);
}

TGT_AVX2 static void unpack8_bmi2(const uint8_t *src, size_t n, uint32_t b, uint8_t *f) {
    size_t full = n / 8, g = 0, in_bytes = (n * b + 7) / 8;
    uint64_t mask = field_mask8(b);
    for (; g < full && g * b + 8 <= in_bytes; g++) {
        uint64_t v;
        memcpy(&v, src + g * b, 8);
        v = _pdep_u64(v, mask); /* pdep takes only the low 8b bits of v */
        memcpy(f + 8 * g, &v, 8);
    }
    unpack8_c(src + g * b, n - 8 * g, b, f + 8 * g);
}
#endif

void hs__cbits_pack8(const uint8_t *f, size_t n, uint32_t b, uint8_t *dst) {
#if HS__X86 && HS__LE
    if (hs__csimd_level() >= 1) {
        pack8_bmi2(f, n, b, dst);
        return;
    }
#endif
    pack8_c(f, n, b, dst);
}

void hs__cbits_unpack8(const uint8_t *src, size_t n, uint32_t b, uint8_t *f) {
#if HS__X86 && HS__LE
    if (hs__csimd_level() >= 1) {
        unpack8_bmi2(src, n, b, f);
        return;
    }
#endif
    unpack8_c(src, n, b, f);
}
