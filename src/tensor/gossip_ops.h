/* The device half of gossip: compression primitives and the algorithms' per-round vector work
 * on vectors in a backend's memory, reached through hs_backend_ops.gossip (NULL: the backend
 * has none, and callers use a host copy). C and CUDA C++ alike.
 *
 * The CPU code is the reference of every entry: the compression primitives compute numbers
 * defined in src/compress/compress_ew.h (src/compress/device.c packs them into exactly the
 * bytes of hs_compress_encode), and the vector entries do the CPU loops' IEEE operations in the
 * same order per element (no FMA), so their outputs are the CPU's bits. The one exception is
 * the statistic `sq` of step_sq and beer_step, which the CPU sums in 16 float lanes and a
 * device in doubles: they agree within the float lanes' rounding, (d / 16 + 16) 2^-24
 * relative (tests/cuda/gossip).
 *
 * Every vector pointer is backend memory of n floats (1 <= n <= HS_GOSSIP_MAX_D); other
 * pointers are host memory, filled (or read) when the call returns. "LE" outputs are
 * little-endian bytes at any alignment. None of these report non-finite inputs: the caller
 * checks the results (max_key, norms, scales, halves). Errors: a negative HS_E* with the
 * message set (HS_EINVAL for arguments outside these ranges, HS_ECUDA for the device). */
#ifndef HS_TENSOR_GOSSIP_OPS_H
#define HS_TENSOR_GOSSIP_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "hearsay/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The codecs' own limit (HS_COMPRESS_MAX_D): an index fits 32 bits; the vector entries index
 * in 64 bits. */
#define HS_GOSSIP_MAX_D ((size_t)UINT32_MAX)

typedef struct hs_gossip_ops {
    /* ---------------------------------------------------------- compression primitives */

    /* Top-k: idx[0..k) the indices of the k largest hs_cw_key(x_i), ties to the lower index,
     * in increasing order (topk.c's hs__topk_select), val[j] = x[idx[j]], *max_key the
     * largest key of x (1 <= k <= d). */
    int (*topk)(hs_backend *be, const float *x, size_t d, size_t k, uint32_t *idx, float *val,
                uint32_t *max_key);
    /* Stratified random-k of the stream (seed, peer, round): idx[j] = start_j +
     * hs_cw_randk_offset(hs_cw_randk_word(seed, peer, round, j), size_j) for the strata of
     * hs_cw_randk_stratum(d, k, j), val[j] = x[idx[j]] (1 <= k <= d). */
    int (*randk)(hs_backend *be, const float *x, size_t d, size_t k, uint64_t seed,
                 uint32_t peer, uint64_t round, uint32_t *idx, float *val);
    /* QSGD with s levels (1..32767) on buckets of `bucket` elements (>= 1; the last may be
     * shorter): norms (LE fp32, ceil(d / bucket)) hs_cw_qsgd_norm of each bucket's 32-lane sum
     * of squares; fields (ceil(d b / 8) bytes, b = hs_cw_qsgd_bits(s)) the LSB-first stream of
     * hs_cw_qsgd_field of every element with its bucket's hs_cw_qsgd_factors and the draw
     * hs_cw_qsgd_draw(seed, peer, round, i): the CPU's Philox stream, element by element, so
     * the fields are the CPU's bits. Unspecified where a norm is not finite. */
    int (*qsgd)(hs_backend *be, const float *x, size_t d, size_t bucket, uint32_t s,
                uint64_t seed, uint32_t peer, uint64_t round, void *norms, void *fields);
    /* Scaled sign on buckets of `bucket` elements (1..d; the last may be shorter): scales (LE
     * fp32, one per bucket) hs_cw_sign_scale of the bucket's 32-lane sum of |x_i|; bits
     * (ceil(d / 8) bytes) the sign bits of x, LSB-first, zero padding. */
    int (*sign)(hs_backend *be, const float *x, size_t d, size_t bucket, void *scales,
                void *bits);
    /* out (2d bytes, LE) = hs_cw_f16_from_f32(x_i), or hs_cw_bf16_from_f32(x_i) if bf16:
     * round to nearest even on the bit patterns. */
    int (*half)(hs_backend *be, const float *x, size_t d, int bf16, void *out);
    /* acc[i] = acc[i] + alpha * v_i for the n LE values v of p (host, any alignment): fmt 0
     * fp32, 1 binary16, 2 bfloat16 (finite: the caller checked them). */
    int (*add_dense)(hs_backend *be, float *acc, const void *p, size_t n, int fmt, float alpha);
    /* acc[idx[j]] = acc[idx[j]] + val[j] for j < n (host arrays; distinct indices within acc;
     * n = 0 does nothing). */
    int (*add_sparse)(hs_backend *be, float *acc, const uint32_t *idx, const float *val,
                      size_t n);

    /* ---------------------------------------------------------- the algorithms' vector work */

    /* out = x - y (CHOCO's x_half - xhat_i, the vector it compresses). */
    int (*sub)(hs_backend *be, float *out, const float *x, const float *y, size_t n);
    /* acc = acc + w * (a - b) (hs__acc_diff: CHOCO's and BEER's mix sum_j W_ij (xhat_j -
     * xhat_i), replica by replica; SGP's keep + (share - res) with w = 1). */
    int (*acc_diff)(hs_backend *be, float *acc, const float *a, const float *b, size_t n,
                    float w);
    /* x = x + g * m (hs__step_sq: CHOCO's gossip step x += gamma_c m); *sq = sum m_k^2. */
    int (*step_sq)(hs_backend *be, float *x, const float *m, float g, size_t n, double *sq);
    /* BEER's tracker (beer.c's track): st = xr - x; v = v + gamma mg + (st - s_prev);
     * s_prev = st; dg = v - g. */
    int (*beer_track)(hs_backend *be, float *v, float *s_prev, float *dg, const float *mg,
                      const float *g, float gamma, const float *xr, const float *x, size_t n);
    /* BEER's model step (beer.c's step_model): x = (xr + gamma mh) - v; dh = x - h;
     * *sq = sum mh_k^2. */
    int (*beer_step)(hs_backend *be, float *x, float *dh, const float *xr, const float *mh,
                     const float *v, const float *h, float gamma, size_t n, double *sq);
    /* out = a * x (SGP's weight scaling: z = x / w as x * (1 / w), and the push-sum shares
     * p x). out may alias x. */
    int (*scale_to)(hs_backend *be, float *out, const float *x, size_t n, float a);

    /* ---------------------------------------------------------- decoding on the device
     * The body of a checked message (host memory, any alignment, after the 12-byte header)
     * added to acc: its bytes cross, not d floats. */

    /* QSGD (s levels, buckets of `bucket`, clamped to d): body = the norms (LE fp32) then the
     * field stream; acc[i] = acc[i] + alpha * hs_cw_qsgd_value(field_i, b,
     * hs_cw_qsgd_unit(norm of i's bucket, s)), as qsgd.c's decode. */
    int (*qsgd_add)(hs_backend *be, float *acc, const void *body, size_t d, size_t bucket,
                    uint32_t s, float alpha);
    /* Scaled sign (buckets of `bucket`, 1..d): body = the scales (LE fp32) then the sign bits;
     * with as = alpha * scale of i's bucket, acc[i] = acc[i] + (bit i ? -as : as), as sign.c's
     * decode. */
    int (*sign_add)(hs_backend *be, float *acc, const void *body, size_t d, size_t bucket,
                    float alpha);

    /* ---------------------------------------------------------- statistics */

    /* *sq = sum x_k^2 in doubles (hs__sum_sq, whose sequential sum it matches within
     * d 2^-52 relative): the divergence guard's scale of a model the device holds, which then
     * stays there. */
    int (*sumsq)(hs_backend *be, const float *x, size_t n, double *sq);
} hs_gossip_ops;

#ifdef __cplusplus
}
#endif
#endif
