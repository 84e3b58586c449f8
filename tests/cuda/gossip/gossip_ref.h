/* A reference device for test_cuda_gossip --reference: the CPU backend posing as a device
 * (host_memory = 0, so src/compress/device.c takes its device paths) with an hs_gossip_ops of
 * plain host loops over the compress_ew.h definitions and the CPU's own loops. It checks
 * device.c (packing the primitives' output, the host redo of refused inputs, dense, sparse and
 * staged decoding, two accumulators) and this test's logic on every machine, CI included; it
 * says nothing about the CUDA kernels, which the test checks on a GPU or under cuda-emu.
 * Included by test_cuda_gossip.c and test_cuda_round.c. */
#ifndef HS_TESTS_CUDA_GOSSIP_REF_H
#define HS_TESTS_CUDA_GOSSIP_REF_H

#include <stdlib.h>
#include <string.h>

#include "../cuda_open.h"
#include "algo/algo_internal.h"
#include "compress/codec.h"
#include "compress/compress_ew.h"
#include "tensor/gossip_ops.h"

static int ref_topk(hs_backend *be, const float *x, size_t d, size_t k, uint32_t *idx,
                    float *val, uint32_t *max_key) {
    (void)be;
    *max_key = hs__cmax_key(x, d);
    hs_compressor *c = NULL;
    hs__topk_scratch scr = {0};
    int err = 0;
    if (*max_key >= HS_CW_KEY_INF) {
        /* The kernels' selection of a non-finite x is unspecified: device.c redoes it. */
        for (size_t j = 0; j < k; j++) idx[j] = (uint32_t)j;
    } else if ((err = hs_compressor_new(&c, "topk:1", d, 0)) == 0) {
        err = hs__topk_select(c, x, d, k, idx, &scr);
    }
    for (size_t j = 0; err == 0 && j < k; j++) val[j] = x[idx[j]];
    hs__topk_scratch_free(&scr);
    hs_compressor_free(c);
    return err;
}

static int ref_randk(hs_backend *be, const float *x, size_t d, size_t k, uint64_t seed,
                     uint32_t peer, uint64_t round, uint32_t *idx, float *val) {
    (void)be;
    for (uint32_t j = 0; j < k; j++) {
        uint32_t start, size;
        hs_cw_randk_stratum((uint32_t)d, (uint32_t)k, j, &start, &size);
        idx[j] = start + hs_cw_randk_offset(hs_cw_randk_word(seed, peer, round, j), size);
        val[j] = x[idx[j]];
    }
    return 0;
}

static int ref_qsgd(hs_backend *be, const float *x, size_t d, size_t bucket, uint32_t s,
                    uint64_t seed, uint32_t peer, uint64_t round, void *norms, void *fields) {
    (void)be;
    if (bucket > d) bucket = d;
    uint32_t b = hs_cw_qsgd_bits(s);
    uint8_t *f = fields;
    memset(f, 0, (d * b + 7) / 8);
    for (size_t lo = 0; lo < d; lo += bucket) {
        size_t n = d - lo < bucket ? d - lo : bucket;
        float norm = hs_cw_qsgd_norm(hs__cl2sq(x + lo, n)), pre, inv16;
        hs__stf((uint8_t *)norms + 4 * (lo / bucket), norm);
        hs_cw_qsgd_factors(norm, s, &pre, &inv16);
        for (size_t i = lo; i < lo + n; i++) {
            uint32_t v = hs_cw_qsgd_field(x[i], pre, inv16, s, b,
                                          hs_cw_qsgd_draw(seed, peer, round, i));
            for (uint32_t t = 0; t < b; t++)
                if ((v >> t) & 1u) f[(i * b + t) / 8] |= (uint8_t)(1u << ((i * b + t) % 8));
        }
    }
    return 0;
}

static int ref_sign(hs_backend *be, const float *x, size_t d, size_t bucket, void *scales,
                    void *bits) {
    (void)be;
    for (size_t lo = 0; lo < d; lo += bucket) {
        size_t n = d - lo < bucket ? d - lo : bucket;
        hs__stf((uint8_t *)scales + 4 * (lo / bucket),
                hs_cw_sign_scale(hs__cl1(x + lo, n), (uint32_t)n));
    }
    hs__csign_pack(x, d, bits);
    return 0;
}

static int ref_half(hs_backend *be, const float *x, size_t d, int bf16, void *out) {
    (void)be;
    for (size_t i = 0; i < d; i++)
        hs__st16((uint8_t *)out + 2 * i,
                 bf16 ? hs_cw_bf16_from_f32(x[i]) : hs_cw_f16_from_f32(x[i]));
    return 0;
}

static int ref_add_dense(hs_backend *be, float *acc, const void *p, size_t n, int fmt,
                         float alpha) {
    (void)be;
    const uint8_t *q = p;
    for (size_t i = 0; i < n; i++) {
        float v = fmt == 0   ? hs__ldf(q + 4 * i)
                  : fmt == 1 ? hs_cw_f32_from_f16(hs__ld16(q + 2 * i))
                             : hs_cw_f32_from_bf16(hs__ld16(q + 2 * i));
        acc[i] = acc[i] + alpha * v;
    }
    return 0;
}

static int ref_add_sparse(hs_backend *be, float *acc, const uint32_t *idx, const float *val,
                          size_t n) {
    (void)be;
    for (size_t j = 0; j < n; j++) acc[idx[j]] = acc[idx[j]] + val[j];
    return 0;
}

static int ref_sub(hs_backend *be, float *out, const float *x, const float *y, size_t n) {
    (void)be;
    for (size_t i = 0; i < n; i++) out[i] = x[i] - y[i];
    return 0;
}

static int ref_acc_diff(hs_backend *be, float *acc, const float *a, const float *b, size_t n,
                        float w) {
    (void)be;
    hs__acc_diff(acc, a, b, n, w);
    return 0;
}

static int ref_step_sq(hs_backend *be, float *x, const float *m, float g, size_t n, double *sq) {
    (void)be;
    *sq = hs__step_sq(x, m, g, n);
    return 0;
}

static int ref_sumsq(hs_backend *be, const float *x, size_t n, double *sq) {
    (void)be;
    *sq = hs__sum_sq(x, n);
    return 0;
}

static int ref_beer_track(hs_backend *be, float *v, float *s_prev, float *dg, const float *mg,
                          const float *g, float gamma, const float *xr, const float *x, size_t n) {
    (void)be;
    hs__beer_track(v, s_prev, dg, mg, g, gamma, xr, x, n);
    return 0;
}

static int ref_beer_step(hs_backend *be, float *x, float *dh, const float *xr, const float *mh,
                         const float *v, const float *h, float gamma, size_t n, double *sq) {
    (void)be;
    *sq = hs__beer_step_model(x, dh, xr, mh, v, h, gamma, n);
    return 0;
}

static int ref_scale_to(hs_backend *be, float *out, const float *x, size_t n, float a) {
    (void)be;
    for (size_t i = 0; i < n; i++) out[i] = x[i] * a;
    return 0;
}

static int ref_qsgd_add(hs_backend *be, float *acc, const void *body, size_t d, size_t bucket,
                        uint32_t s, float alpha) {
    (void)be;
    const uint8_t *q = body;
    uint32_t b = hs_cw_qsgd_bits(s);
    size_t nb = (d + bucket - 1) / bucket;
    for (size_t i = 0; i < d; i++) {
        uint32_t f = 0;
        for (uint32_t t = 0; t < b; t++) {
            size_t bit = i * b + t;
            f |= (uint32_t)((q[4 * nb + bit / 8] >> (bit % 8)) & 1u) << t;
        }
        float unit = hs_cw_qsgd_unit(hs__ldf(q + 4 * (i / bucket)), s);
        acc[i] = acc[i] + alpha * hs_cw_qsgd_value(f, b, unit);
    }
    return 0;
}

static int ref_sign_add(hs_backend *be, float *acc, const void *body, size_t d, size_t bucket,
                        float alpha) {
    (void)be;
    const uint8_t *q = body;
    size_t nb = (d + bucket - 1) / bucket;
    for (size_t i = 0; i < d; i++) {
        float as = alpha * hs__ldf(q + 4 * (i / bucket));
        acc[i] = acc[i] + (((q[4 * nb + i / 8] >> (i % 8)) & 1u) ? -as : as);
    }
    return 0;
}

static const hs_gossip_ops ref_gossip = {
    .topk = ref_topk,           .randk = ref_randk,         .qsgd = ref_qsgd,
    .sign = ref_sign,           .half = ref_half,           .add_dense = ref_add_dense,
    .add_sparse = ref_add_sparse, .sub = ref_sub,           .acc_diff = ref_acc_diff,
    .step_sq = ref_step_sq,     .beer_track = ref_beer_track, .beer_step = ref_beer_step,
    .scale_to = ref_scale_to,   .qsgd_add = ref_qsgd_add,   .sign_add = ref_sign_add,
    .sumsq = ref_sumsq,
};

static hs_backend_ops ref_ops;

/* The CPU backend posing as a device with ref_gossip; NULL (and the reason on stderr) on
 * failure. Closed with hs_backend_close. */
static hs_backend *ref_open(void) {
    hs_backend_cfg cfg = {1, 0};
    hs_backend *be = NULL;
    if (hs_backend_open(&be, HS_DEVICE_CPU, &cfg) < 0) {
        fprintf(stderr, "reference device: %s\n", hs_error_message());
        return NULL;
    }
    ref_ops = *be->ops;
    ref_ops.gossip = &ref_gossip;
    be->ops = &ref_ops;
    be->host_memory = 0;
    snprintf(be->description, sizeof(be->description), "the reference device (CPU loops)");
    return be;
}

/* The test's device: with `--reference` (argv[1]) the reference device above, else the GPU
 * (cuda_test_open: skip 77 without one). 0, or the exit status the test ends with. */
static int gossip_test_open(int argc, char **argv, hs_backend **dev, int *reference) {
    *reference = argc > 1 && !strcmp(argv[1], "--reference");
    if (*reference) return (*dev = ref_open()) ? 0 : 1;
    hs_backend_cfg cfg = {1, 0};
    return cuda_test_open(dev, &cfg);
}

#endif
