/* Internal interface of the compression operators (codec.c implements the shared parts): the
 * compressor object, the per-operator ops table, the common message header, little-endian helpers
 * and the bulk kernels (simd.c).
 *
 * Every message starts with a 12-byte header (little-endian):
 *   u8 codec id | u8 flags | u16 param | u32 d | u32 n
 * where param and n are per codec (docs/PROTOCOL.md): qsgd puts s in param and its bucket size
 * in n, sign its bucket size in n, topk/randk k in n, the dense codecs d in n. */
#ifndef HS_COMPRESS_CODEC_H
#define HS_COMPRESS_CODEC_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "core/error_internal.h"
#include "hearsay/compress.h"

#define HS__CHDR 12

/* Header flag bits. Bits a codec does not define must be zero. */
#define HS__CF_FP16 0x01u     /* topk, randk: values are binary16 */
#define HS__CF_BITMAP 0x02u   /* topk: indices as a bitmap of d bits (else gap varints) */
#define HS__CF_UNSCALED 0x04u /* randk: values are not multiplied by their stratum size */
#define HS__CF_FP8 0x08u      /* topk: values are one fp32 scale and k FP8 E4M3 bytes */

typedef struct hs__cops hs__cops;

/* One ':'-separated field of a compressor spec (not NUL-terminated). */
typedef struct hs__cfield {
    const char *s;
    size_t len;
} hs__cfield;

/* Top-k selection candidates (index, low key bits), grown on demand. */
typedef struct hs__topk_scratch {
    uint32_t *ci, *ck;
    size_t cap;
} hs__topk_scratch;

struct hs_compressor {
    const hs__cops *ops;
    size_t d;
    uint64_t seed;
    uint32_t k;      /* topk, randk: values per message */
    double frac;     /* topk, randk: k as a fraction of d (0: given as a count) */
    uint32_t s;      /* qsgd: levels */
    uint32_t bucket; /* qsgd, sign: bucket length as configured (0: the whole vector) */
    uint32_t flags;  /* HS__CF_FP16 / HS__CF_FP8 / HS__CF_UNSCALED as configured */
    int ef;
    float *residual; /* ef: e, d floats */
    float *ef_tmp;   /* ef: x + e, d floats */
    uint32_t *idx;   /* topk, randk: k indices (encode scratch) */
    hs__topk_scratch sel; /* topk: selection candidates */
    void *aux;       /* qsgd: per-bucket random words and fields */
    char name[80];
};

struct hs__cops {
    const char *name;
    hs_codec_id id;
    /* Checks the parameters parsed into c and allocates its scratch. */
    int (*init)(hs_compressor *c);
    int (*unbiased)(const hs_compressor *c);
    size_t (*max_bytes)(const hs_compressor *c);
    /* Writes the message of C(x) to dst (max_bytes free bytes) and its length to *n. */
    int (*encode)(hs_compressor *c, const float *x, uint32_t peer, uint64_t round, uint8_t *dst,
                  size_t *n);
    int (*decode)(const hs_compressor *c, const uint8_t *p, size_t len, uint32_t peer,
                  uint64_t round, float *acc, float alpha);
    int (*apply)(const hs_compressor *c, const float *x, uint32_t peer, uint64_t round,
                 float *out);
    /* Optional: decode once into two accumulators (acc += alpha C, acc2 += alpha2 C); without
     * it hs_compress_decode_add2 decodes twice. */
    int (*decode2)(const hs_compressor *c, const uint8_t *p, size_t len, uint32_t peer,
                   uint64_t round, float *acc, float alpha, float *acc2, float alpha2);
    /* The contraction delta of hs_compressor_delta, from the parsed configuration. */
    double (*delta)(const hs_compressor *c);
    /* Parses the operator's parameters f[1..n-1] of `spec` (f[0] is its name; the ef: prefix
     * is gone) into c, and appends their canonical spelling to c->name (which holds the
     * operator's name): HS_EINVAL naming spec and the field that was wrong. */
    int (*parse)(hs_compressor *c, const char *spec, const hs__cfield *f, int n);
    /* What its first parameter is, for advice to send more (hs_compressor_spec_more): a kept
     * part (a fraction, which stops at all of it, or a count), or a number of levels. */
    enum { HS__CSIZE_NONE, HS__CSIZE_KEPT, HS__CSIZE_LEVELS } size_param;
};

/* Spec parsing helpers for the operators' parse hooks (compress.c). */
/* 1 when field f is exactly word. */
int hs__cfield_is(const hs__cfield *f, const char *word);
/* A decimal count (digits only) into *v; -1 when f is not one. */
int hs__cparse_count(const hs__cfield *f, uint64_t *v);
/* K: a count 1..d (c->k, c->frac = 0) or a fraction in (0, 1] (c->frac, c->k rounded). */
int hs__cparse_k(hs_compressor *c, const char *spec, const hs__cfield *f);
/* The parameters of a sparse operator, NAME:K[:OPTION...]: K as hs__cparse_k, then each of the
 * options in `options` (HS__CF_FP16 "fp16", HS__CF_FP8 "fp8", HS__CF_UNSCALED "unscaled") at
 * most once, fp16 and fp8 not both; appends the canonical ":K[:fp16|:fp8][:unscaled]" to
 * c->name. */
int hs__cparse_sparse(hs_compressor *c, const char *spec, const hs__cfield *f, int n,
                      uint32_t options);
/* Appends printf-formatted text to c->name. */
void hs__cname_append(hs_compressor *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Appends ":K" to c->name in the spelling K was given in (a count, or the exact fraction). */
void hs__cname_append_k(hs_compressor *c);

/* Unit roundoff of the binary16 and bfloat16 casts (round to nearest even): each kept value
 * is off by at most this fraction of itself, so a cast costs a factor (1 - u^2) of delta. */
#define HS__FP16_U 0x1p-11
#define HS__BF16_U 0x1p-8
/* FP8 E4M3's (3 mantissa bits), for values in its normal range. */
#define HS__FP8_U 0x1p-4

/* The argument checks every decode makes before it reads a byte: d is c's, alpha is finite. */
int hs__cdecode_args(const hs_compressor *c, size_t d, float alpha);
/* Checks a dense (none, fp16, bf16) message of c completely: header, length, every value
 * finite (dense.c). */
int hs__dense_check(const hs_compressor *c, const uint8_t *p, size_t len);
/* Its two halves, for a reader that takes a message's values as they arrive: the header
 * (p: the first HS__CHDR bytes of a message of len bytes in all; nothing past them is read),
 * and n fp32 values at v, the first being value `first` (HS_EFORMAT naming the first value
 * that is not finite). */
int hs__dense_check_head(const hs_compressor *c, const uint8_t *p, size_t len);
int hs__dense_check_f32(const hs_compressor *c, const uint8_t *v, size_t n, size_t first);
/* The d little-endian fp32 values inside a message of c, checked as a decode checks them,
 * for a compressor whose message is x itself (none, no error feedback): a reader may take
 * them where they are instead of decoding into a vector of its own. HS_EINVAL for others. */
int hs__compress_f32_values(const hs_compressor *c, const uint8_t *p, size_t len,
                            const uint8_t **values);
/* 1 when c's messages are x itself (hs__compress_f32_values applies), else 0: asked first, a
 * caller of every round leaves the thread's last error alone for the other compressors. */
int hs__compress_values_raw(const hs_compressor *c);
/* The same in pieces: the header (its first HS__CHDR bytes) of a message of len bytes of a
 * compressor whose messages are x itself, checked as hs__compress_f32_values checks it; then
 * each run of n values, the first being value `first`, checked before it is used. */
int hs__compress_f32_head(const hs_compressor *c, const uint8_t *hdr, size_t len);
int hs__compress_f32_check(const hs_compressor *c, const uint8_t *v, size_t n, size_t first);
/* A dense cast's message (none, fp16, bf16 without error feedback) in runs (dense.c): the bytes
 * of one value (0 for any other compressor); the header (its first HS__CHDR bytes) of a message
 * of len bytes, checked as a decode checks it; then each run of n values (the first being value
 * `first`) checked finite and added, acc += alpha C and acc2 += alpha2 C (acc2 may be NULL),
 * in the operations of hs_compress_decode_add2. Nothing is added from a run that fails. */
size_t hs__compress_dense_width(const hs_compressor *c);
/* 1 for the dense casts' operators (none, fp16, bf16), with or without error feedback. */
int hs__cops_dense(const hs__cops *o);
int hs__compress_dense_head(const hs_compressor *c, const uint8_t *hdr, size_t len);
int hs__compress_dense_add(const hs_compressor *c, const uint8_t *v, size_t n, size_t first,
                           float *acc, float alpha, float *acc2, float alpha2);

extern const hs__cops hs__cops_none, hs__cops_fp16, hs__cops_bf16, hs__cops_topk,
    hs__cops_randk, hs__cops_qsgd, hs__cops_sign;

/* QSGD's error E||Q(v) - v||^2 / ||v||^2 on a flat bucket (every |v_i| equal): sqrt(B) / s - 1
 * while s < sqrt(B). It is what limits CHOCO (hs__compress_replica_scale). */
double hs__qsgd_flat_error(const hs_compressor *c);

/* The factor CHOCO and BEER apply to a difference before they compress it, so that the
 * replicas track: 1, or 1 / (1 + w) for QSGD whose error w on a flat vector reaches 1.
 * A gossip difference x - xhat flattens as its large entries are sent, and an unbiased Q with
 * w >= 1 then leaves an error at least as large as the difference: xhat drifts from x at any
 * consensus step (qsgd:4 with buckets of 512, w = 4.66, was stopped by the guard at round 15
 * with every gamma_c down to 0.015; qsgd:4:64, w = 1, at round 225). Q / (1 + w) is the
 * rescaled QSGD of Koloskova et al. 2019 (section 3), a contraction with error w / (1 + w).
 * Below 1 the unscaled Q already contracts and is kept (qsgd:16, w = 0.41, stays bounded for
 * 10,000 rounds: test_step.c), as it was before. */
float hs__compress_replica_scale(const hs_compressor *c);

/* ---------------------------------------------------------------- little-endian access */

static inline uint16_t hs__ld16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static inline uint32_t hs__ld32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline void hs__st16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static inline void hs__st32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}
static inline float hs__ldf(const uint8_t *p) {
    uint32_t u = hs__ld32(p);
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline void hs__stf(uint8_t *p, float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    hs__st32(p, u);
}

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define HS__LE 1
#else
#define HS__LE 0
#endif

/* ---------------------------------------------------------------- header */

void hs__chdr_put(uint8_t *p, hs_codec_id id, uint32_t flags, uint32_t param, uint32_t d,
                  uint32_t n);

/* What a decoder expects of a header: values outside [min, max] are malformed (HS_EFORMAT),
 * values inside but different from the configuration mismatch (HS_EMISMATCH). */
typedef struct hs__chdr_want {
    uint32_t legal_flags;  /* bits the codec defines */
    uint32_t config_flags; /* of those, the bits that must equal c->flags */
    uint32_t param, param_min, param_max;
    uint32_t n, n_min, n_max;
    const char *param_name, *n_name;
} hs__chdr_want;

/* Checks the header of p[0..len) against c: length, codec id, d, flags, param, n. Format errors
 * (HS_EFORMAT) are reported before mismatches (HS_EMISMATCH). Writes the flags to *flags. */
int hs__chdr_check(const hs_compressor *c, const uint8_t *p, size_t len,
                   const hs__chdr_want *want, uint32_t *flags);

/* Checks that p[0..len) is a message of c's codec (compress.c): HS_EFORMAT when truncated or
 * of no known codec, HS_EMISMATCH when of another. Every decode makes it first. */
int hs__ccheck_codec(const hs_compressor *c, const uint8_t *p, size_t len);

/* Checks that a message of `have` bytes is exactly `want` bytes long. */
int hs__clen_check(const hs_compressor *c, size_t have, size_t want, const char *what);

/* Error for a non-finite or unrepresentable input value. */
int hs__cerr_value(const hs_compressor *c, const float *x, size_t d, uint32_t limit_key,
                   const char *format);

/* ---------------------------------------------------------------- top-k selection (topk.c) */

/* Writes to idx[0..k) the indices of the k largest |x_i| of x[0..d), ties to the lower index,
 * in increasing order. HS_ERANGE (with c's name) if x holds a non-finite value; HS_ENOMEM. */
int hs__topk_select(const hs_compressor *c, const float *x, size_t d, size_t k, uint32_t *idx,
                    hs__topk_scratch *s);
int hs__topk_scratch_grow(hs__topk_scratch *s, size_t n);
void hs__topk_scratch_free(hs__topk_scratch *s);

/* The pairs of a top-k message, checked as its decode checks it (after hs__ccheck_codec):
 * idx[j] its j-th index, val[j] = alpha * its j-th value (c->k of each), so acc[idx[j]] +
 * val[j] is what decoding adds. For decoders whose accumulator is elsewhere (a device). */
int hs__topk_unpack(const hs_compressor *c, const uint8_t *p, size_t len, float alpha,
                    uint32_t *idx, float *val);

/* The whole check of a QSGD / sign message as its decode makes it (after hs__ccheck_codec):
 * header, length, norms or scales, padding, and QSGD's levels. Then the body (norms or scales,
 * then fields or bits, as compress_ew.h defines them) may be added anywhere. */
int hs__qsgd_check(const hs_compressor *c, const uint8_t *p, size_t len);
int hs__sign_check(const hs_compressor *c, const uint8_t *p, size_t len);

/* ---------------------------------------------------------------- packing selected values
 *
 * The message of a selection: top-k the sorted indices and their values; random-k the stratum
 * indices (hs_cw_randk_*) and their values. value j is src[idx[j]] with gather, else src[j].
 * HS_ERANGE if a value is not finite or does not fit fp16 (or, for random-k, its rescaling
 * overflows). dst needs max_bytes; *n gets the length. */
int hs__topk_pack(const hs_compressor *c, const uint32_t *idx, const float *src, int gather,
                  uint8_t *dst, size_t *n);
int hs__randk_pack(const hs_compressor *c, uint32_t peer, uint64_t round, const uint32_t *idx,
                   const float *src, int gather, uint8_t *dst, size_t *n);

/* ---------------------------------------------------------------- bulk kernels (simd.c) */

/* Highest instruction set the kernels use: 0 portable C, 1 AVX2 (+F16C, BMI2), 2 AVX-512.
 * hs__csimd_cap lowers the ceiling (tests compare the paths; benchmarks report them) and
 * returns the level now in effect. All levels give identical bits. */
int hs__csimd_level(void);
int hs__csimd_cap(int max_level);

/* Largest hs_cw_key (|x| bits) of x[0..n); 0 for n == 0. */
uint32_t hs__cmax_key(const float *x, size_t n);

/* dst[i] = binary16 / bfloat16 of x[i], little-endian (inputs already range-checked). */
void hs__cf16_encode(const float *x, size_t n, uint8_t *dst);
void hs__cbf16_encode(const float *x, size_t n, uint8_t *dst);

/* acc[i] += alpha * value of the i-th little-endian fp32 / fp16 / bf16 of p. */
void hs__cf32_add(const uint8_t *p, size_t n, float *acc, float alpha);
void hs__cf16_add(const uint8_t *p, size_t n, float *acc, float alpha);
void hs__cbf16_add(const uint8_t *p, size_t n, float *acc, float alpha);

/* dst = x[0..n) as little-endian fp32, and the converse; both return the largest hs_cw_key of
 * the values copied. Use these, not memcpy, for vectors behind a header (see simd.c). */
uint32_t hs__cf32_put(const float *x, size_t n, uint8_t *dst);
uint32_t hs__cf32_get(const uint8_t *p, size_t n, float *dst);

/* Largest magnitude bits (hs_cw_key) of n little-endian fp32 values, and of n binary16 /
 * bfloat16 values (as 16-bit magnitudes), to check finiteness in one pass. */
uint32_t hs__cf32_max_key(const uint8_t *p, size_t n);
uint16_t hs__c16_max_mag(const uint8_t *p, size_t n);

/* Philox4x32-10 words first .. first + n - 1 of the stream (seed, purpose, peer, round):
 * out[j] = hs_rng_at(seed, purpose, peer, round, first + j). first must be a multiple of 4. */
void hs__cphilox_fill(uint64_t seed, uint32_t purpose, uint32_t peer, uint32_t round,
                      uint64_t first, size_t n, uint32_t *out);

/* Sum of |x_i| of x[0..n) in the 32-lane order of compress_ew.h. */
double hs__cl1(const float *x, size_t n);
/* Sum of x_i^2 of x[0..n) in the same order. */
double hs__cl2sq(const float *x, size_t n);

/* Sign bits of x[0..n): bit i of the LSB-first stream = signbit(x[i]); writes ceil(n/8) bytes,
 * zero padding. */
void hs__csign_pack(const float *x, size_t n, uint8_t *dst);

/* QSGD fields of one bucket x[0..n) (n <= 512 would do; any n) given its factors and 16-bit
 * random draws u[0..n): f[i] = hs_cw_qsgd_field(...) as one byte (b <= 8) or two. */
void hs__cqsgd_fields8(const float *x, size_t n, float pre, float inv16, uint32_t s,
                       uint32_t b, const uint16_t *u, uint8_t *f);

/* QSGD decoding of n byte fields (b <= 8): check8 returns nonzero if a level exceeds lmax or
 * a field is a signed zero; add8 adds alpha * hs_cw_qsgd_value(f[i], b, unit) to acc[i]. */
int hs__cqsgd_check8(const uint8_t *f, size_t n, uint32_t b, uint32_t lmax);
void hs__cqsgd_add8(const uint8_t *f, size_t n, uint32_t b, float unit, float alpha, float *acc);

/* acc[i] += bit i of the sign stream ? -as : as, for i in [lo, hi). */
void hs__csign_add(const uint8_t *bits, size_t lo, size_t hi, float as, float *acc);

/* Packs n fields of b bits (1..8, one per byte of f) LSB-first into ceil(n*b/8) bytes of dst,
 * and the inverse (the unused high bits of each byte of f are zero). */
void hs__cbits_pack8(const uint8_t *f, size_t n, uint32_t b, uint8_t *dst);
void hs__cbits_unpack8(const uint8_t *src, size_t n, uint32_t b, uint8_t *f);

#endif
