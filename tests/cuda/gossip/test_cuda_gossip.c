/* Device gossip (hs_backend_ops.gossip, src/tensor/gossip_ops.h) against the CPU code it must
 * reproduce, checkasm-style: random vectors of sizes that are odd, below a warp, and not a
 * multiple of any block or chunk, device output compared with the CPU's bit for bit:
 * - fp16 / bf16 casts on every kind of float (subnormals, rounding midpoints, overflow
 *   boundaries, NaN, Inf), against compress_ew.h and simd.c's encoders;
 * - top-k selection against topk.c's hs__topk_select, ties (to the lower index) included;
 * - whole messages: hs__compress_encode_be's bytes are hs_compress_encode's for every
 *   operator (QSGD draws the CPU's seeded Philox stream, so its fields are equal too), a
 *   device message decodes on the CPU and a CPU message on the device to the same floats, and
 *   refused inputs give the CPU's error;
 * - the algorithms' vector work (CHOCO, BEER, SGP) against their CPU loops; the sums of squares
 *   (statistics) within the CPU's float-lane rounding bound;
 * - CHOCO rounds of three peers in a ring, one of them on the device: every peer's x and
 *   replicas are the bits of the all-CPU run (heterogeneous peers on one wire).
 *
 * Exit-code protocol (../cuda_open.h): 77 without a CUDA build or a GPU (CI), a failure where a
 * GPU cannot be opened or with HEARSAY_REQUIRE_CUDA=1. Without a GPU it runs under
 * ../shared/tools/cuda-emu (see tests/cuda/gossip/meson.build). `test_cuda_gossip --reference`
 * runs it all on gossip_ref.h's reference device instead (host loops posing as a device: the
 * host side, src/compress/device.c, on every machine; not the kernels). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "../cuda_open.h"
#include "gossip_ref.h"
#include "algo/algo_internal.h"
#include "compress/codec.h"
#include "compress/compress_ew.h"
#include "compress/device.h"
#include "hearsay/buf.h"
#include "tensor/gossip_ops.h"

static hs_backend *dev; /* CUDA, or with --reference gossip_ref.h's reference device */
static int reference;

/* Sizes: one element, less than a warp, a few blocks, past a top-k chunk (4096) and a partial
 * one, and a prime a little above 3 chunks. */
static const size_t sizes[] = {1, 7, 1000, 4099, 12289, 100003};
#define N_SIZES (sizeof(sizes) / sizeof(sizes[0]))

/* ---------------------------------------------------------------- vectors */

static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double rng_unit(uint64_t *s) { return (double)(rng_next(s) >> 11) * 0x1p-53; }

static float rng_gauss(uint64_t *s) {
    double u = rng_unit(s), v = rng_unit(s);
    return (float)(sqrt(-2.0 * log(u + 1e-300)) * cos(6.283185307179586 * v));
}

enum { K_GAUSS, K_TIES, K_WIDE, K_SPARSE, N_KINDS };
static const char *const kind_name[N_KINDS] = {"gauss", "ties", "wide", "sparse"};

/* A finite vector of kind k: N(0, 1); integers -3..3 with both zeros (top-k ties); N(0, 1)
 * times 2^U(-30, 10) (many binades, every value inside fp16's range); mostly +-0. */
static float *vec_make(size_t d, uint64_t seed, int kind) {
    float *x = malloc(d * sizeof(float));
    assert_non_null(x);
    uint64_t s = seed * 1000003u + (uint64_t)kind;
    for (size_t i = 0; i < d; i++) {
        float g = rng_gauss(&s);
        switch (kind) {
        case K_TIES: x[i] = (float)((int)(rng_next(&s) % 7) - 3); break;
        case K_WIDE: x[i] = ldexpf(g, (int)(rng_next(&s) % 41) - 30); break;
        case K_SPARSE: x[i] = rng_next(&s) % 16 == 0 ? g : (i & 1 ? -0.0f : 0.0f); break;
        default: x[i] = g;
        }
        if (kind == K_TIES && x[i] == 0.0f && (i & 1)) x[i] = -0.0f;
    }
    return x;
}

static float *up(const float *x, size_t d) {
    float *p = NULL;
    assert_int_equal(hs_be_alloc_f(dev, d, &p), 0);
    assert_int_equal(hs_be_upload(dev, p, x, d * sizeof(float)), 0);
    return p;
}

static float *down(const float *p, size_t d) {
    float *x = malloc(d * sizeof(float));
    assert_non_null(x);
    assert_int_equal(hs_be_download(dev, x, p, d * sizeof(float)), 0);
    return x;
}

/* Bit-for-bit equality of two float vectors, naming the first difference. */
static void same_bits(const float *want, const float *got, size_t d, const char *what) {
    for (size_t i = 0; i < d; i++) {
        if (hs_cw_bits(want[i]) != hs_cw_bits(got[i]))
            fail_msg("%s: element %zu of %zu: CPU %a (0x%08x), device %a (0x%08x)", what, i, d,
                     (double)want[i], hs_cw_bits(want[i]), (double)got[i], hs_cw_bits(got[i]));
    }
}

/* Device vector p equals host vector want, bit for bit. */
static void dev_equals(const float *want, const float *p, size_t d, const char *what) {
    float *got = down(p, d);
    same_bits(want, got, d, what);
    free(got);
}

/* ---------------------------------------------------------------- casts */

/* Bit patterns that exercise the rounding: every exponent, mantissas at and around the fp16
 * and bf16 midpoints, the overflow limits, subnormals, zeros, Inf and NaN. */
static uint32_t cast_bits(uint64_t *s, size_t i) {
    uint32_t r = (uint32_t)rng_next(s);
    switch (i % 8) {
    case 0: return r;                                     /* anything, NaNs and Infs too */
    case 1: /* every exponent near fp16's range, random low bits */
        return (r & 0x80000000u) | ((r % 40u + 100u) << 23) | (r & 0x1FFFu);
    case 2: return (r & 0xFFFFE000u) | 0x1000u;           /* an fp16 midpoint (normal range) */
    case 3: return (r & 0xFFFF0000u) | 0x8000u;           /* a bf16 midpoint */
    case 4: return HS_CW_F16_OVERFLOW + (r % 3u) - 1u;    /* around fp16's overflow limit */
    case 5: /* fp16 subnormals */
        return (r & 0x80000000u) | ((102u + r % 12u) << 23) | (r & 0x7FFFFFu);
    case 6: return (r & 0x807FFFFFu) | (r % 2u ? 0u : 0x7F800000u); /* subnormal or Inf/NaN */
    default: return HS_CW_BF16_OVERFLOW + (r % 3u) - 1u;  /* around bf16's overflow limit */
    }
}

static void test_casts(void **state) {
    (void)state;
    for (size_t z = 0; z < N_SIZES; z++) {
        size_t d = sizes[z];
        uint64_t s = 77 + z;
        float *x = malloc(d * sizeof(float)), *fin = malloc(d * sizeof(float));
        uint8_t *got = malloc(2 * d), *want = malloc(2 * d);
        assert_true(x && fin && got && want);
        for (size_t i = 0; i < d; i++) x[i] = hs_cw_float(cast_bits(&s, i));
        float *dx = up(x, d);
        for (int bf16 = 0; bf16 < 2; bf16++) {
            assert_int_equal(dev->ops->gossip->half(dev, dx, d, bf16, got), 0);
            for (size_t i = 0; i < d; i++) {
                uint16_t w = bf16 ? hs_cw_bf16_from_f32(x[i]) : hs_cw_f16_from_f32(x[i]);
                if (hs__ld16(got + 2 * i) != w)
                    fail_msg("%s of 0x%08x (element %zu of %zu): CPU 0x%04x, device 0x%04x",
                             bf16 ? "bf16" : "fp16", hs_cw_bits(x[i]), i, d, w,
                             hs__ld16(got + 2 * i));
            }
            /* The codecs' own encoders (F16C / AVX-512 where present) on the values they
             * accept: finite and below the format's overflow limit. */
            uint32_t lim = bf16 ? HS_CW_BF16_OVERFLOW : HS_CW_F16_OVERFLOW;
            for (size_t i = 0; i < d; i++) fin[i] = hs_cw_key(x[i]) < lim ? x[i] : 1.0f;
            float *dfin = up(fin, d);
            assert_int_equal(dev->ops->gossip->half(dev, dfin, d, bf16, got), 0);
            (bf16 ? hs__cbf16_encode : hs__cf16_encode)(fin, d, want);
            if (memcmp(got, want, 2 * d) != 0)
                fail_msg("%s of %zu in-range values: device bytes differ from simd.c's",
                         bf16 ? "bf16" : "fp16", d);
            hs_be_free(dev, dfin);
        }
        hs_be_free(dev, dx);
        free(x);
        free(fin);
        free(got);
        free(want);
    }
}

/* ---------------------------------------------------------------- top-k selection */

static void check_topk(const float *x, size_t d, size_t k, const char *kind) {
    hs_compressor *c = NULL;
    assert_int_equal(hs_compressor_new(&c, "topk:1", d, 0), 0);
    hs__topk_scratch scr = {0};
    uint32_t *want = malloc(k * sizeof(uint32_t)), *idx = malloc(k * sizeof(uint32_t));
    float *val = malloc(k * sizeof(float));
    assert_true(want && idx && val);
    assert_int_equal(hs__topk_select(c, x, d, k, want, &scr), 0);
    float *dx = up(x, d);
    uint32_t mk = 0;
    assert_int_equal(dev->ops->gossip->topk(dev, dx, d, k, idx, val, &mk), 0);
    assert_int_equal(mk, hs__cmax_key(x, d));
    for (size_t j = 0; j < k; j++) {
        if (idx[j] != want[j])
            fail_msg("top-%zu of %zu (%s): index %zu: CPU %u, device %u", k, d, kind, j,
                     want[j], idx[j]);
        assert_int_equal(hs_cw_bits(val[j]), hs_cw_bits(x[want[j]]));
    }
    hs_be_free(dev, dx);
    hs__topk_scratch_free(&scr);
    hs_compressor_free(c);
    free(want);
    free(idx);
    free(val);
}

static void test_topk(void **state) {
    (void)state;
    for (size_t z = 0; z < N_SIZES; z++) {
        size_t d = sizes[z];
        for (int kind = 0; kind < N_KINDS; kind++) {
            float *x = vec_make(d, 3 + z, kind);
            const size_t ks[] = {1, 2, d / 100, d / 2, d - 1, d};
            for (size_t j = 0; j < sizeof(ks) / sizeof(ks[0]); j++)
                if (ks[j] >= 1 && ks[j] <= d) check_topk(x, d, ks[j], kind_name[kind]);
            free(x);
        }
    }
}

/* ---------------------------------------------------------------- messages on one wire */

static const char *const specs[] = {
    "none",   "fp16",    "bf16",       "topk:0.01",          "topk:0.05:fp16", "topk:3",
    "randk:0.01", "randk:0.1:unscaled", "qsgd:4", "qsgd:255:100", "qsgd:1000:64", "sign",
    "sign:300",
};
#define N_SPECS (sizeof(specs) / sizeof(specs[0]))

static size_t n_checked; /* check_spec calls that compared something */

/* Spec on x (host) and its device copy: the device's bytes are the CPU's (or the same error),
 * each side decodes the other's message to the same floats, also into two accumulators. */
static void check_spec(const char *spec, const float *x, size_t d, uint64_t round,
                       const char *kind) {
    hs_compressor *c = NULL;
    /* A spec that does not fit d (topk:3 of 1 value) has nothing to compare. */
    if (hs_compressor_new(&c, spec, d, 2024) < 0) return;
    n_checked++;
    hs_buf *mc = NULL, *md = NULL;
    assert_int_equal(hs_buf_new(&mc, 0), 0);
    assert_int_equal(hs_buf_new(&md, 0), 0);
    float *dx = up(x, d);
    int ec = hs_compress_encode(c, x, d, 3, round, mc);
    char msg_c[512];
    snprintf(msg_c, sizeof(msg_c), "%s", ec < 0 ? hs_error_message() : "");
    int ed = hs__compress_encode_be(c, dev, dx, d, 3, round, md);
    if (ec != ed)
        fail_msg("%s on %zu (%s), round %llu: CPU returns %d, device %d (%s)", spec, d, kind,
                 (unsigned long long)round, ec, ed, ed < 0 ? hs_error_message() : "");
    if (ec < 0) {
        assert_string_equal(hs_error_message(), msg_c);
    } else {
        assert_int_equal(mc->len, md->len);
        if (memcmp(mc->data, md->data, mc->len) != 0)
            fail_msg("%s on %zu (%s), round %llu: the device's %zu bytes differ from the CPU's",
                     spec, d, kind, (unsigned long long)round, mc->len);
        /* Cross decoding: the device's message on the CPU, the CPU's on the device. */
        float *base = vec_make(d, 11, K_GAUSS), *acc = malloc(d * sizeof(float));
        float *acc2 = malloc(d * sizeof(float));
        assert_true(acc && acc2);
        memcpy(acc, base, d * sizeof(float));
        memcpy(acc2, base, d * sizeof(float));
        float *da = up(base, d), *da2 = up(base, d);
        assert_int_equal(hs_compress_decode_add(c, md->data, md->len, 3, round, acc, d, 0.37f), 0);
        assert_int_equal(hs__compress_decode_add_be(c, dev, mc->data, mc->len, 3, round, da, d,
                                                    0.37f), 0);
        dev_equals(acc, da, d, spec);
        assert_int_equal(hs_compress_decode_add2(c, md->data, md->len, 3, round, acc, 1.0f,
                                                 acc2, -0.6f, d), 0);
        assert_int_equal(hs__compress_decode_add2_be(c, dev, mc->data, mc->len, 3, round, da,
                                                     1.0f, da2, -0.6f, d), 0);
        dev_equals(acc, da, d, spec);
        dev_equals(acc2, da2, d, spec);
        /* A damaged message is refused on the device as on the CPU, acc unchanged. */
        md->data[0] ^= 0x40;
        int rc = hs_compress_decode_add(c, md->data, md->len, 3, round, acc, d, 1.0f);
        snprintf(msg_c, sizeof(msg_c), "%s", hs_error_message());
        assert_true(rc < 0);
        assert_int_equal(hs__compress_decode_add_be(c, dev, md->data, md->len, 3, round, da, d,
                                                    1.0f), rc);
        assert_string_equal(hs_error_message(), msg_c);
        dev_equals(acc, da, d, spec);
        hs_be_free(dev, da);
        hs_be_free(dev, da2);
        free(base);
        free(acc);
        free(acc2);
    }
    hs_be_free(dev, dx);
    hs_buf_unref(mc);
    hs_buf_unref(md);
    hs_compressor_free(c);
}

static void test_messages(void **state) {
    (void)state;
    const uint64_t rounds[] = {0, 5, ((uint64_t)1 << 32) + 3};
    n_checked = 0;
    for (size_t z = 0; z < N_SIZES; z++) {
        for (int kind = 0; kind < N_KINDS; kind++) {
            float *x = vec_make(sizes[z], 7 + z, kind);
            for (size_t s = 0; s < N_SPECS; s++)
                for (size_t r = 0; r < 3; r++)
                    check_spec(specs[s], x, sizes[z], rounds[r], kind_name[kind]);
            free(x);
        }
    }
    /* Only topk:3 (k > d), qsgd:255:100 and sign:300 (bucket > d) of d = 1 may be missing. */
    assert_true(n_checked + 3 * N_KINDS * 3 >= N_SIZES * N_KINDS * N_SPECS * 3);
}

/* Inputs the messages cannot carry (NaN, Inf, beyond fp16) give the CPU's error. */
static void test_bad_inputs(void **state) {
    (void)state;
    const size_t d = 1000;
    const float bad[] = {NAN, -INFINITY, 70000.0f};
    for (size_t b = 0; b < 3; b++) {
        float *x = vec_make(d, 5, K_GAUSS);
        x[613] = bad[b];
        for (size_t s = 0; s < N_SPECS; s++) check_spec(specs[s], x, d, 9, "bad");
        free(x);
    }
}

/* ---------------------------------------------------------------- vector work */

/* A sum of squares (a statistic): the device adds in double, so it must be within 1e-9 of
 * the double sum in order; the CPU adds in 16 float lanes, each rounding up to d / 16 times,
 * so it must be within (d / 16 + 16) 2^-24 of the device's, relatively. */
static void check_sq(const float *m, size_t d, double cpu, double got, const char *what) {
    if (reference) { /* the reference device is the CPU loop */
        assert_true(cpu == got);
        return;
    }
    double exact = 0;
    for (size_t i = 0; i < d; i++) exact += (double)m[i] * m[i];
    if (!(fabs(got - exact) <= 1e-9 * exact))
        fail_msg("%s: device %.17g, double sum %.17g (more than 1e-9 apart)", what, got, exact);
    double tol = ((double)d / 16 + 16) * 0x1p-24;
    if (!(fabs(cpu - got) <= tol * exact))
        fail_msg("%s: CPU %.17g, device %.17g (more than %.3g apart)", what, cpu, got, tol);
}

static void test_vector_ops(void **state) {
    (void)state;
    const hs_gossip_ops *g = dev->ops->gossip;
    for (size_t z = 0; z < N_SIZES; z++) {
        size_t d = sizes[z];
        float *a = vec_make(d, 21 + z, K_GAUSS), *b = vec_make(d, 22 + z, K_WIDE);
        float *c = vec_make(d, 23 + z, K_GAUSS), *e = vec_make(d, 24 + z, K_SPARSE);
        float *f = vec_make(d, 25 + z, K_GAUSS), *h = vec_make(d, 26 + z, K_GAUSS);
        float *da = up(a, d), *db = up(b, d), *dc = up(c, d), *de = up(e, d), *df = up(f, d);
        float *dh = up(h, d), *out = malloc(d * sizeof(float)), *dout = up(a, d);
        assert_non_null(out);
        /* CHOCO: diff = x - xhat. */
        for (size_t i = 0; i < d; i++) out[i] = a[i] - b[i];
        assert_int_equal(g->sub(dev, dout, da, db, d), 0);
        dev_equals(out, dout, d, "sub");
        /* The mix, replica by replica: acc += w (rep - own). */
        hs__acc_diff(c, a, b, d, 0.3333333f);
        assert_int_equal(g->acc_diff(dev, dc, da, db, d, 0.3333333f), 0);
        dev_equals(c, dc, d, "acc_diff");
        /* The gossip step x += gamma_c m. */
        double sq = hs__step_sq(a, c, 0.0135f, d), dsq = -1;
        assert_int_equal(g->step_sq(dev, da, dc, 0.0135f, d, &dsq), 0);
        dev_equals(a, da, d, "step_sq x");
        check_sq(c, d, sq, dsq, "step_sq sum of squares");
        /* The guard's scale: x unchanged, its sum of squares in doubles (non-negative terms:
         * each order is within (d - 1) 2^-53 relative of the exact sum, so two within d 2^-52). */
        double ssq = hs__sum_sq(b, d), dssq = -1;
        assert_int_equal(g->sumsq(dev, db, d, &dssq), 0);
        dev_equals(b, db, d, "sumsq leaves x");
        if (reference ? ssq != dssq : !(fabs(ssq - dssq) <= (double)d * 0x1p-52 * ssq))
            fail_msg("sumsq: CPU %.17g, device %.17g", ssq, dssq);
        /* BEER: tracker, then model step (v = e, s_prev = f, dg = out, mg = c, g = h). */
        hs__beer_track(e, f, out, c, h, 0.05f, b, a, d);
        assert_int_equal(g->beer_track(dev, de, df, dout, dc, dh, 0.05f, db, da, d), 0);
        dev_equals(e, de, d, "beer_track v");
        dev_equals(f, df, d, "beer_track s_prev");
        dev_equals(out, dout, d, "beer_track dg");
        sq = hs__beer_step_model(a, out, b, c, e, h, 0.05f, d);
        assert_int_equal(g->beer_step(dev, da, dout, db, dc, de, dh, 0.05f, d, &dsq), 0);
        dev_equals(a, da, d, "beer_step x");
        dev_equals(out, dout, d, "beer_step dh");
        check_sq(c, d, sq, dsq, "beer_step sum of squares");
        /* SGP: z = x * (1 / w), in place, and a share p x. */
        float inv = 1.0f / 0.37f;
        for (size_t i = 0; i < d; i++) b[i] = b[i] * inv;
        assert_int_equal(g->scale_to(dev, db, db, d, inv), 0);
        dev_equals(b, db, d, "scale_to in place");
        for (size_t i = 0; i < d; i++) out[i] = 0.25f * a[i];
        assert_int_equal(g->scale_to(dev, dout, da, d, 0.25f), 0);
        dev_equals(out, dout, d, "scale_to");
        float *all[] = {da, db, dc, de, df, dh, dout};
        for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) hs_be_free(dev, all[i]);
        free(a);
        free(b);
        free(c);
        free(e);
        free(f);
        free(h);
        free(out);
    }
}

/* The entries refuse arguments outside gossip_ops.h's ranges. */
static void test_arguments(void **state) {
    (void)state;
    if (reference) skip(); /* the reference's loops do not check arguments */
    const hs_gossip_ops *g = dev->ops->gossip;
    float one = 1.0f, *x = up(&one, 1);
    uint32_t idx[2], mk;
    float val[2];
    uint8_t b[16];
    double sq;
    assert_int_equal(g->topk(dev, x, 1, 0, idx, val, &mk), HS_EINVAL);
    assert_int_equal(g->topk(dev, x, 1, 2, idx, val, &mk), HS_EINVAL);
    assert_int_equal(g->randk(dev, x, 0, 1, 0, 0, 0, idx, val), HS_EINVAL);
    assert_int_equal(g->qsgd(dev, x, 1, 0, 4, 0, 0, 0, b, b), HS_EINVAL);
    assert_int_equal(g->qsgd(dev, x, 1, 1, 0, 0, 0, 0, b, b), HS_EINVAL);
    assert_int_equal(g->sign(dev, x, 1, 2, b, b), HS_EINVAL);
    assert_int_equal(g->add_dense(dev, x, b, 1, 3, 1.0f), HS_EINVAL);
    assert_int_equal(g->add_sparse(dev, x, idx, val, 0), 0);
    assert_int_equal(g->sub(dev, x, x, x, 0), HS_EINVAL);
    assert_int_equal(g->step_sq(dev, x, x, 1.0f, 0, &sq), HS_EINVAL);
    assert_int_equal(g->sumsq(dev, x, 0, &sq), HS_EINVAL);
    hs_be_free(dev, x);
}

/* ---------------------------------------------------------------- CHOCO with mixed peers */

#define PEERS 3

/* One peer of a CHOCO ring: x, its own replica xhat, the replicas of its two neighbours and
 * the mix m = sum_j W_ij (xhat_j - xhat_i), on the host or (on_dev) in device memory. */
typedef struct cpeer {
    int on_dev;
    float *x, *xh, *rep[2], *mix;
} cpeer;

static float *peer_vec(int on_dev, const float *v, size_t d) {
    if (on_dev) return up(v, d);
    float *p = malloc(d * sizeof(float));
    assert_non_null(p);
    memcpy(p, v, d * sizeof(float));
    return p;
}

static void peer_free(cpeer *p) {
    float *all[] = {p->x, p->xh, p->rep[0], p->rep[1], p->mix};
    for (int i = 0; i < 5; i++) {
        if (p->on_dev) hs_be_free(dev, all[i]);
        else free(all[i]);
    }
}

/* R rounds of CHOCO (choco.c's order: diff, encode, own decode into xhat and mix, neighbours'
 * decode into replica and mix, gossip step) on a ring of PEERS with W_ij = 1/3, peers with
 * dev_mask's bits on the device; each round's local step adds a seeded vector. The messages
 * of every peer are returned concatenated in *wire. */
static void choco_run(const char *spec, size_t d, int rounds, unsigned dev_mask, float **xs_out,
                      hs_buf *wire) {
    const float w = 1.0f / 3.0f, gamma = 0.3f;
    cpeer p[PEERS];
    hs_compressor *c = NULL;
    assert_int_equal(hs_compressor_new(&c, spec, d, 99), 0);
    float *zero = calloc(d, sizeof(float)), *diff = malloc(d * sizeof(float));
    assert_true(zero && diff);
    for (int i = 0; i < PEERS; i++) {
        float *x0 = vec_make(d, 40 + (uint64_t)i, K_GAUSS);
        p[i].on_dev = (dev_mask >> i) & 1;
        p[i].x = peer_vec(p[i].on_dev, x0, d);
        p[i].xh = peer_vec(p[i].on_dev, zero, d);
        p[i].rep[0] = peer_vec(p[i].on_dev, zero, d);
        p[i].rep[1] = peer_vec(p[i].on_dev, zero, d);
        p[i].mix = peer_vec(p[i].on_dev, zero, d);
        free(x0);
    }
    float *ddiff = up(zero, d);
    hs_buf *msg[PEERS];
    for (int r = 0; r < rounds; r++) {
        for (int i = 0; i < PEERS; i++) {
            /* The local step: x += a seeded "gradient". */
            float *gr = vec_make(d, 1000 + (uint64_t)(r * PEERS + i), K_GAUSS);
            if (p[i].on_dev) {
                float *dg = up(gr, d);
                assert_int_equal(hs_be_axpy(dev, p[i].x, dg, d, -0.01f), 0);
                hs_be_free(dev, dg);
                assert_int_equal(dev->ops->gossip->sub(dev, ddiff, p[i].x, p[i].xh, d), 0);
            } else {
                for (size_t k = 0; k < d; k++) p[i].x[k] = p[i].x[k] + -0.01f * gr[k];
                for (size_t k = 0; k < d; k++) diff[k] = p[i].x[k] - p[i].xh[k];
            }
            free(gr);
            assert_int_equal(hs_buf_new(&msg[i], 0), 0);
            int n = p[i].on_dev ? hs__compress_encode_be(c, dev, ddiff, d, (uint32_t)i, r, msg[i])
                                : hs_compress_encode(c, diff, d, (uint32_t)i, r, msg[i]);
            assert_true(n > 0);
            assert_int_equal(hs_buf_append(wire, msg[i]->data, msg[i]->len), 0);
            /* xhat_i += q, m -= (sum_j W_ij) q. */
            int e = p[i].on_dev
                        ? hs__compress_decode_add2_be(c, dev, msg[i]->data, msg[i]->len,
                                                      (uint32_t)i, r, p[i].xh, 1.0f, p[i].mix,
                                                      -2.0f * w, d)
                        : hs_compress_decode_add2(c, msg[i]->data, msg[i]->len, (uint32_t)i, r,
                                                  p[i].xh, 1.0f, p[i].mix, -2.0f * w, d);
            assert_int_equal(e, 0);
        }
        for (int i = 0; i < PEERS; i++) {
            for (int s = 0; s < 2; s++) {
                int j = (i + (s ? PEERS - 1 : 1)) % PEERS;
                const hs_buf *m = msg[j];
                /* The replica of j and the mix (weight w) from j's bytes. */
                int e = p[i].on_dev
                            ? hs__compress_decode_add2_be(c, dev, m->data, m->len, (uint32_t)j, r,
                                                          p[i].rep[s], 1.0f, p[i].mix, w, d)
                            : hs_compress_decode_add2(c, m->data, m->len, (uint32_t)j, r,
                                                      p[i].rep[s], 1.0f, p[i].mix, w, d);
                assert_int_equal(e, 0);
            }
            double sq;
            if (p[i].on_dev)
                assert_int_equal(dev->ops->gossip->step_sq(dev, p[i].x, p[i].mix, gamma, d, &sq),
                                 0);
            else
                (void)hs__step_sq(p[i].x, p[i].mix, gamma, d);
        }
        for (int i = 0; i < PEERS; i++) hs_buf_unref(msg[i]);
    }
    for (int i = 0; i < PEERS; i++) {
        xs_out[i] = p[i].on_dev ? down(p[i].x, d) : peer_vec(0, p[i].x, d);
        peer_free(&p[i]);
    }
    hs_be_free(dev, ddiff);
    free(zero);
    free(diff);
    hs_compressor_free(c);
}

static void test_choco_mixed(void **state) {
    (void)state;
    const char *const cspecs[] = {"topk:0.01", "topk:0.03:fp16", "qsgd:16", "sign"};
    const size_t d = 4099;
    for (size_t s = 0; s < sizeof(cspecs) / sizeof(cspecs[0]); s++) {
        float *ref[PEERS], *mixed[PEERS];
        hs_buf *wref = NULL, *wmix = NULL;
        assert_int_equal(hs_buf_new(&wref, 0), 0);
        assert_int_equal(hs_buf_new(&wmix, 0), 0);
        choco_run(cspecs[s], d, 4, 0u, ref, wref);
        choco_run(cspecs[s], d, 4, 1u | 4u, mixed, wmix); /* peers 0 and 2 on the device */
        assert_int_equal(wref->len, wmix->len);
        assert_memory_equal(wref->data, wmix->data, wref->len);
        double spread = 0;
        for (int i = 0; i < PEERS; i++) {
            same_bits(ref[i], mixed[i], d, cspecs[s]);
            for (size_t k = 0; k < d; k++) spread += fabs((double)ref[i][k] - ref[0][k]);
        }
        assert_true(spread > 0); /* the peers did not collapse to one value: a real test */
        for (int i = 0; i < PEERS; i++) {
            free(ref[i]);
            free(mixed[i]);
        }
        hs_buf_unref(wref);
        hs_buf_unref(wmix);
    }
}

static void test_identity(void **state) {
    (void)state;
    assert_int_equal(dev->host_memory, 0);
    const hs_gossip_ops *g = dev->ops->gossip;
    assert_non_null(g);
    assert_true(g->topk && g->randk && g->qsgd && g->sign && g->half && g->add_dense &&
                g->add_sparse && g->sub && g->acc_diff && g->step_sq && g->beer_track &&
                g->beer_step && g->scale_to && g->qsgd_add && g->sign_add &&
                g->sumsq);
}

int main(int argc, char **argv) {
    int rc = gossip_test_open(argc, argv, &dev, &reference);
    if (rc != 0) return rc;
    printf("# device gossip of %s against the CPU\n", dev->description);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_identity),   cmocka_unit_test(test_casts),
        cmocka_unit_test(test_topk),       cmocka_unit_test(test_messages),
        cmocka_unit_test(test_bad_inputs), cmocka_unit_test(test_vector_ops),
        cmocka_unit_test(test_arguments),  cmocka_unit_test(test_choco_mixed),
    };
    int failed = cmocka_run_group_tests_name("cuda-gossip", tests, NULL, NULL);
    hs_backend_close(dev);
    /* cmocka returns the number of failures, which must not read as 77 (skip). */
    return failed ? 1 : 0;
}
