/* Shared by the backend compression tests (tests/unit/compress/test_compress_be.c on the CPU,
 * tests/cuda/compress/test_cuda_compress.c on CUDA):
 *
 * - an emulated device backend: the CPU backend with host_memory = 0 (so hs_compress_*_be take
 *   their device paths) and the compression primitives of hs_backend_ops written as sequential
 *   models of the CUDA kernels in src/cuda/compress.cu (the same radix-select passes, chunks,
 *   tiles and scans, the same warp sums and bit packing, thread after thread). It checks the
 *   host side (src/compress/device.c) and the kernels' decomposition on a machine without a
 *   GPU; it says nothing about the GPU itself;
 * - be_check_spec(): hs_compress_encode_be / hs_compress_decode_add_be on a backend against
 *   hs_compress_encode / hs_compress_decode_add on the host: same return values, same bytes,
 *   same floats (bit for bit), same errors (code and message), destination unchanged on error;
 * - be_check_topk() / be_check_randk(): the selection primitives' indices and values against
 *   the CPU's.
 * Uses cmocka: include after <cmocka.h>. */
#ifndef HS_TEST_BE_CHECK_H
#define HS_TEST_BE_CHECK_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compress/compress_ew.h"
#include "compress/compress_internal.h"
#include "core/rng.h"
#include "hearsay/compress.h"
#include "hearsay/error.h"
#include "hearsay/tensor.h"

/* ---------------------------------------------------------------- test vectors */

enum be_vec_kind {
    BE_GAUSS,  /* N(0, 1) */
    BE_TIES,   /* integers in -3..3: many equal magnitudes, +-0 (top-k ties) */
    BE_WIDE,   /* N(0, 1) * 2^U(-40, 15): many binades; some beyond fp16 for large d */
    BE_SPARSE, /* mostly +-0.0, a few N(0, 1) */
    BE_TINY,   /* N(0, 1) * 2^-75, a few subnormals: QSGD norms below 2^-64 */
    BE_ULP1,   /* sums of |x_i| on float rounding midpoints (see be_ulp_value) */
    BE_ULP2,   /* sums of squares whose square roots are float midpoints */
    BE_KINDS
};

static const char *const be_kind_name[BE_KINDS] = {"gauss",  "ties", "wide",
                                                   "sparse", "tiny", "ulp1", "ulp2"};

/* Vectors on which any summation order but compress_ew.h's changes a sign scale or a QSGD
 * norm (with ordinary data a different order almost never shows after rounding to float).
 * Per block of 64 elements the large terms make the exact sum a float rounding midpoint:
 * L1: 2^100 + 2^76 (float ulp 2^77 there); squares: 2^100 + 2^77 + 2^52 = (2^50 + 2^26)^2,
 * whose root is the midpoint 2^50 + 2^26. A few terms of half a double ulp of that sum (2^47,
 * or 2^23 squared, a quarter ulp) are absorbed with ties to even or survive, depending on what
 * they are added to first; rounding to float then goes down (exactly the midpoint: to even) or
 * up. Buckets of 64, 512 and 4096 keep the property for L1 sums, 64 and 4096 for squares. */
static float be_ulp_value(size_t i, int squares, hs_rng *r) {
    size_t o = i % 64;
    float v = 0.0f;
    if (!squares && (i / 4096) % 2) {
        /* Odd regions of 4096: 2^47 + 2^47 in lane 0 make 2^48 before meeting 2^100 in lane 16
         * (a sum with 16 lanes, or sequential, absorbs them one by one instead). Whole
         * regions, so that buckets of 4096 stay all of one pattern. */
        if (o == 16)
            v = 0x1p100f;
        else if (o == 1)
            v = 0x1p76f;
        else if (o == 0 || o == 32)
            v = 0x1p47f;
    } else if (!squares) {
        if (o == 0)
            v = 0x1p100f;
        else if (o == 16)
            v = 0x1p76f;
        else if (hs_rng_uniform(r, 20) == 0)
            v = hs_rng_uniform(r, 2) ? 0x1p47f : 0x1p46f;
    } else {
        if (o == 0)
            v = 0x1p50f;
        else if (o == 16 || o == 48)
            v = 0x1p38f;
        else if (o == 8)
            v = 0x1p26f;
        else if (hs_rng_uniform(r, 10) == 0)
            v = 0x1p23f;
    }
    return hs_rng_uniform(r, 2) ? -v : v;
}

static float *be_vec(size_t d, uint64_t seed, int kind) {
    float *x = malloc(d * sizeof(float));
    assert_non_null(x);
    hs_rng r;
    hs_rng_init(&r, seed, HS_RNG_TEST, 100 + (uint32_t)kind, (uint32_t)d);
    for (size_t i = 0; i < d; i++) {
        switch (kind) {
        case BE_GAUSS:
            x[i] = (float)hs_rng_normal(&r);
            break;
        case BE_TIES:
            x[i] = (float)((int)hs_rng_uniform(&r, 7) - 3);
            if (x[i] == 0.0f && hs_rng_uniform(&r, 2)) x[i] = -0.0f;
            break;
        case BE_WIDE:
            x[i] = (float)ldexp(hs_rng_normal(&r), (int)hs_rng_uniform(&r, 56) - 40);
            break;
        case BE_SPARSE:
            x[i] = hs_rng_uniform(&r, 10) == 0 ? (float)hs_rng_normal(&r)
                   : hs_rng_uniform(&r, 2)     ? -0.0f
                                               : 0.0f;
            break;
        case BE_TINY:
            x[i] = (float)ldexp(hs_rng_normal(&r), hs_rng_uniform(&r, 16) ? -75 : -140);
            break;
        default:
            x[i] = be_ulp_value(i, kind == BE_ULP2, &r);
            break;
        }
    }
    return x;
}

/* A receiver's vector: values around 1, with +0.0 and -0.0 sprinkled in (adding -0.0 and
 * +0.0 to them is where staged decoding could go wrong). */
static float *be_acc(size_t d, uint64_t seed) {
    float *a = malloc(d * sizeof(float));
    assert_non_null(a);
    hs_rng r;
    hs_rng_init(&r, seed, HS_RNG_TEST, 199, (uint32_t)d);
    for (size_t i = 0; i < d; i++) {
        uint32_t u = hs_rng_uniform(&r, 16);
        a[i] = u == 0 ? -0.0f : u == 1 ? 0.0f : (float)(hs_rng_double(&r) + 0.5);
    }
    return a;
}

/* ---------------------------------------------------------------- the emulated device */

/* Sequential model of compress.cu's radix-select top-k. */
#define EMU_TK_CHUNK 4096
#define EMU_TK_TILE 256
#define EMU_TK_SCAN_THREADS 1024

static uint32_t emu_chunk_taken(uint32_t gt, uint32_t eq, uint32_t eq_before, uint32_t ties) {
    uint32_t left = ties > eq_before ? ties - eq_before : 0u;
    return gt + (eq < left ? eq : left);
}

static int emu_topk(hs_backend *be, const float *x, size_t d, size_t k, uint32_t *idx,
                    float *val, uint32_t *max_key) {
    (void)be;
    if (d < 1 || k < 1 || k > d) return -1;
    static uint32_t hist[2048];
    uint32_t prefix = 0, need = (uint32_t)k, thresh = 0, ties = 0, mx = 0;
    for (int pass = 0; pass < 3; pass++) {
        int nbins = pass == 0 ? 2048 : 1024, per = nbins / 256;
        memset(hist, 0, sizeof(hist));
        for (size_t i = 0; i < d; i++) {
            uint32_t key = hs_cw_key(x[i]);
            if (pass == 0) {
                hist[key >> 20]++;
                mx = key > mx ? key : mx;
            } else if (pass == 1) {
                if ((key >> 20) == (prefix >> 20)) hist[(key >> 10) & 1023u]++;
            } else if ((key >> 10) == (prefix >> 10)) {
                hist[key & 1023u]++;
            }
        }
        uint32_t seg[256], above = 0;
        for (int t = 0; t < 256; t++) {
            seg[t] = 0;
            for (int j = 0; j < per; j++) seg[t] += hist[t * per + j];
        }
        int sg = 255;
        for (; sg > 0; sg--) {
            if (above + seg[sg] >= need) break;
            above += seg[sg];
        }
        int b = sg * per + per - 1;
        for (; b > sg * per; b--) {
            if (above + hist[b] >= need) break;
            above += hist[b];
        }
        need -= above;
        if (pass == 0) {
            prefix = (uint32_t)b << 20;
        } else if (pass == 1) {
            prefix |= (uint32_t)b << 10;
        } else {
            thresh = prefix | (uint32_t)b;
            ties = need;
        }
    }
    size_t nch = (d + EMU_TK_CHUNK - 1) / EMU_TK_CHUNK;
    uint32_t *cnt = calloc(4 * nch, sizeof(uint32_t));
    assert_non_null(cnt);
    uint32_t *cnt_gt = cnt, *cnt_eq = cnt + nch, *off = cnt + 2 * nch, *eqb = cnt + 3 * nch;
    for (size_t c = 0; c < nch; c++) {
        size_t lo = c * EMU_TK_CHUNK, hi = d - lo < EMU_TK_CHUNK ? d : lo + EMU_TK_CHUNK;
        for (size_t i = lo; i < hi; i++) {
            uint32_t key = hs_cw_key(x[i]);
            cnt_gt[c] += key > thresh;
            cnt_eq[c] += key == thresh;
        }
    }
    /* The one-block scan: thread t owns a run of chunks; the runs' totals are scanned in
     * thread order. */
    uint32_t per = (uint32_t)((nch + EMU_TK_SCAN_THREADS - 1) / EMU_TK_SCAN_THREADS);
    uint32_t ebase = 0, sbase = 0;
    for (uint32_t t = 0; t < EMU_TK_SCAN_THREADS; t++) {
        uint32_t b0 = t * per, b1 = b0 + per;
        b0 = b0 < nch ? b0 : (uint32_t)nch;
        b1 = b1 < nch ? b1 : (uint32_t)nch;
        uint32_t e = 0, taken = 0;
        for (uint32_t b = b0, eb = ebase; b < b1; b++) {
            eqb[b] = eb;
            taken += emu_chunk_taken(cnt_gt[b], cnt_eq[b], eb, ties);
            e += cnt_eq[b];
            eb += cnt_eq[b];
        }
        for (uint32_t b = b0, sb = sbase; b < b1; b++) {
            off[b] = sb;
            sb += emu_chunk_taken(cnt_gt[b], cnt_eq[b], eqb[b], ties);
        }
        ebase += e;
        sbase += taken;
    }
    size_t written = 0;
    for (size_t c = 0; c < nch; c++) {
        size_t lo = c * EMU_TK_CHUNK, hi = d - lo < EMU_TK_CHUNK ? d : lo + EMU_TK_CHUNK;
        uint32_t run_out = off[c], run_eq = eqb[c];
        for (size_t base = lo; base < hi; base += EMU_TK_TILE) {
            uint32_t er = 0, pos = 0; /* the two block scans, thread after thread */
            for (size_t t = 0; t < EMU_TK_TILE; t++) {
                size_t i = base + t;
                if (i >= hi) continue;
                uint32_t key = hs_cw_key(x[i]);
                int gt = key > thresh, eq = key == thresh;
                int take = gt || (eq && run_eq + er < ties);
                er += (uint32_t)eq;
                if (take) {
                    size_t at = (size_t)run_out + pos++;
                    assert_true(at < k);
                    idx[at] = (uint32_t)i;
                    val[at] = x[i];
                    written++;
                }
            }
            run_eq += er;
            run_out += pos;
        }
    }
    assert_int_equal(written, k);
    free(cnt);
    *max_key = mx;
    return 0;
}

static int emu_randk(hs_backend *be, const float *x, size_t d, size_t k, uint64_t seed,
                     uint32_t peer, uint64_t round, uint32_t *idx, float *val) {
    (void)be;
    uint64_t key = hs_cw_key_seed(seed, round);
    for (size_t q = 0; q < (k + 3) / 4; q++) {
        uint32_t w[4];
        hs_rng_block(key, HS_RNG_RANDK, peer, (uint32_t)round, (uint32_t)q, w);
        for (uint32_t e = 0; e < 4; e++) {
            uint32_t j = (uint32_t)q * 4u + e, start, size;
            if (j >= k) break;
            hs_cw_randk_stratum((uint32_t)d, (uint32_t)k, j, &start, &size);
            idx[j] = start + hs_cw_randk_offset(w[e], size);
            val[j] = x[idx[j]];
        }
    }
    return 0;
}

/* lanes32_kernel for one bucket: 32 lanes summing in element order (four loads ahead, which
 * changes nothing), then shuffle-down for h = 16 .. 1 (a lane past 31 reads its own value).
 * Buckets of 4096 and more walk lanes32_block_kernel's tiles of 64 rows of 32 instead. */
static double emu_lanes32(const float *x, size_t lo, size_t hi, int squares) {
    double acc[32];
    if (hi - lo >= 4096) {
        size_t n = hi - lo;
        memset(acc, 0, sizeof(acc));
        for (size_t q = 0; q < (n + 2047) / 2048; q++) {
            const float *tile = x + lo + q * 2048;
            size_t cnt = n - q * 2048 < 2048 ? n - q * 2048 : 2048;
            for (unsigned r = 0; r < 64; r++)
                for (unsigned lane = 0; lane < 32; lane++) {
                    size_t t = (size_t)r * 32 + lane;
                    if (t >= cnt) continue;
                    double v = squares ? (double)tile[t] * (double)tile[t] : (double)fabsf(tile[t]);
                    acc[lane] = acc[lane] + v;
                }
        }
    } else {
        for (unsigned lane = 0; lane < 32; lane++) {
            double a = 0.0;
            for (size_t i = lo + lane; i < hi; i += 32) {
                double t = squares ? (double)x[i] * (double)x[i] : (double)fabsf(x[i]);
                a = a + t;
            }
            acc[lane] = a;
        }
    }
    for (unsigned h = 16; h > 0; h >>= 1) {
        double nxt[32];
        for (unsigned l = 0; l < 32; l++) nxt[l] = acc[l] + (l + h < 32 ? acc[l + h] : acc[l]);
        memcpy(acc, nxt, sizeof(acc));
    }
    return acc[0];
}

static int emu_qsgd(hs_backend *be, const float *x, size_t d, size_t bucket, uint32_t s,
                    uint64_t seed, uint32_t peer, uint64_t round, void *norms_out,
                    void *fields_out) {
    (void)be;
    if (bucket > d) bucket = d;
    size_t nb = (d + bucket - 1) / bucket;
    uint32_t b = hs_cw_qsgd_bits(s);
    float *norms = malloc(nb * sizeof(float));
    assert_non_null(norms);
    for (size_t j = 0; j < nb; j++) {
        size_t lo = j * bucket, hi = d - lo < bucket ? d : lo + bucket;
        norms[j] = hs_cw_qsgd_norm(emu_lanes32(x, lo, hi, 1));
        hs__stf((uint8_t *)norms_out + 4 * j, norms[j]);
    }
    uint8_t *fields = fields_out;
    uint64_t key = hs_cw_key_seed(seed, round);
    for (size_t g = 0; g < (d + 7) / 8; g++) {
        uint32_t w[4];
        hs_rng_block(key, HS_RNG_QSGD, peer, (uint32_t)round, (uint32_t)g, w);
        uint32_t i0 = (uint32_t)g * 8u, n = (uint32_t)d - i0 < 8u ? (uint32_t)d - i0 : 8u;
        uint32_t j = i0 / (uint32_t)bucket, next = (j + 1u) * (uint32_t)bucket;
        float pre, inv16;
        hs_cw_qsgd_factors(norms[j], s, &pre, &inv16);
        uint64_t lo = 0, hi = 0;
        for (uint32_t e = 0; e < n; e++) {
            uint32_t i = i0 + e;
            if (i >= next) {
                j++;
                next += (uint32_t)bucket;
                hs_cw_qsgd_factors(norms[j], s, &pre, &inv16);
            }
            uint32_t u = (e & 1) ? w[e >> 1] >> 16 : w[e >> 1] & 0xFFFFu;
            uint64_t f = hs_cw_qsgd_field(x[i], pre, inv16, s, b, u);
            uint32_t pos = e * b;
            if (pos < 64) {
                lo |= f << pos;
                if (pos + b > 64) hi |= f >> (64 - pos);
            } else {
                hi |= f << (pos - 64);
            }
        }
        uint32_t nbytes = (n * b + 7) / 8;
        for (uint32_t t = 0; t < nbytes; t++)
            fields[g * b + t] = (uint8_t)(t < 8 ? lo >> (8 * t) : hi >> (8 * (t - 8)));
    }
    free(norms);
    return 0;
}

static int emu_sign(hs_backend *be, const float *x, size_t d, size_t bucket, void *scales,
                    void *bits_out) {
    (void)be;
    if (bucket < 1 || bucket > d) return -1;
    size_t nb = (d + bucket - 1) / bucket, nbytes = (d + 7) / 8;
    for (size_t j = 0; j < nb; j++) {
        size_t lo = j * bucket, hi = d - lo < bucket ? d : lo + bucket;
        hs__stf((uint8_t *)scales + 4 * j,
                hs_cw_sign_scale(emu_lanes32(x, lo, hi, 0), (uint32_t)(hi - lo)));
    }
    uint8_t *bits = bits_out;
    for (size_t w = 0; w < (d + 31) / 32; w++) {
        uint32_t m = 0;
        for (unsigned lane = 0; lane < 32; lane++) {
            size_t i = w * 32 + lane;
            if (i < d && (hs_cw_bits(x[i]) >> 31)) m |= 1u << lane;
        }
        for (unsigned lane = 0; lane < 4; lane++)
            if (w * 4 + lane < nbytes) bits[w * 4 + lane] = (uint8_t)(m >> (8 * lane));
    }
    return 0;
}

static int emu_half(hs_backend *be, const float *x, size_t d, int bf16, void *out) {
    (void)be;
    for (size_t i = 0; i < d; i++)
        hs__st16((uint8_t *)out + 2 * i, bf16 ? hs_cw_bf16_from_f32(x[i]) : hs_cw_f16_from_f32(x[i]));
    return 0;
}

static int emu_add_dense(hs_backend *be, float *acc, const void *p, size_t n, int fmt,
                         float alpha) {
    (void)be;
    const uint8_t *v = p;
    for (size_t i = 0; i < n; i++) {
        float f = fmt == 0   ? hs__ldf(v + 4 * i)
                  : fmt == 1 ? hs_cw_f32_from_f16(hs__ld16(v + 2 * i))
                             : hs_cw_f32_from_bf16(hs__ld16(v + 2 * i));
        acc[i] = acc[i] + alpha * f;
    }
    return 0;
}

static int emu_add_sparse(hs_backend *be, float *acc, const uint32_t *idx, const float *val,
                          size_t n) {
    (void)be;
    for (size_t j = 0; j < n; j++) acc[idx[j]] = acc[idx[j]] + val[j];
    return 0;
}

static hs_backend_ops emu_ops_prims, emu_ops_bare;

/* The emulated device: with_prims 1 gives it the primitives above, 0 none of them (the copy
 * fallbacks). Close with hs_backend_close. */
static hs_backend *emu_open(int with_prims) {
    hs_backend_cfg cfg = {1, 0};
    hs_backend *be = NULL;
    assert_int_equal(hs_backend_open(&be, HS_DEVICE_CPU, &cfg), 0);
    hs_backend_ops *o = with_prims ? &emu_ops_prims : &emu_ops_bare;
    *o = *be->ops;
    o->name = with_prims ? "emulated-device" : "emulated-device-bare";
    if (with_prims) {
        o->compress_topk = emu_topk;
        o->compress_randk = emu_randk;
        o->compress_qsgd = emu_qsgd;
        o->compress_sign = emu_sign;
        o->compress_half = emu_half;
        o->compress_add_dense = emu_add_dense;
        o->compress_add_sparse = emu_add_sparse;
    }
    be->ops = o;
    be->host_memory = 0; /* take the device paths */
    return be;
}

/* ---------------------------------------------------------------- helpers */

static float *be_upload(hs_backend *be, const float *h, size_t n) {
    float *p = NULL;
    assert_int_equal(hs_be_alloc_f(be, n, &p), 0);
    assert_int_equal(hs_be_upload(be, p, h, n * sizeof(float)), 0);
    return p;
}

static void be_fetch(hs_backend *be, float *h, const float *p, size_t n) {
    assert_int_equal(hs_be_download(be, h, p, n * sizeof(float)), 0);
}

/* Index of the first element whose bits differ, or n. */
static size_t be_first_diff(const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0) return i;
    return n;
}

static hs_compressor *be_mk(const char *spec, size_t d, uint64_t seed) {
    hs_compressor *c = NULL;
    int err = hs_compressor_new(&c, spec, d, seed);
    if (err < 0) print_error("%s (d=%zu): %s\n", spec, d, hs_error_message());
    assert_int_equal(err, 0);
    return c;
}

static hs_buf *be_newbuf(void) {
    hs_buf *b = NULL;
    assert_int_equal(hs_buf_new(&b, 0), 0);
    assert_int_equal(hs_buf_append(b, "pre", 3), 0); /* messages are appended after this */
    return b;
}

#define BE_FAIL(...)                                                                               \
    do {                                                                                           \
        print_error(__VA_ARGS__);                                                                  \
        fail();                                                                                    \
    } while (0)

/* Decodes message p[0..len) with c into a host acc and, with hs_compress_decode_add_be, into a
 * backend copy of it; both must return the same (error code and message) and give the same
 * bits (acc unchanged on error). */
static void be_check_decode(hs_backend *be, const hs_compressor *c, const uint8_t *p, size_t len,
                            uint32_t peer, uint64_t round, float alpha, const char *what) {
    size_t d = hs_compressor_dim(c);
    float *acc = be_acc(d, (uint64_t)len * 31 + round), *got = malloc(d * sizeof(float));
    float *acc0 = malloc(d * sizeof(float));
    assert_non_null(got);
    assert_non_null(acc0);
    memcpy(acc0, acc, d * sizeof(float));
    float *dev = be_upload(be, acc, d);
    int r_ref = hs_compress_decode_add(c, p, len, peer, round, acc, d, alpha);
    char msg_ref[512];
    snprintf(msg_ref, sizeof(msg_ref), "%s", r_ref < 0 ? hs_error_message() : "");
    int r_be = hs_compress_decode_add_be(c, (struct hs_backend *)be, p, len, peer, round, dev, d,
                                         alpha);
    if (r_be != r_ref)
        BE_FAIL("%s: decode_add_be returned %d (%s), decode_add %d (%s)\n", what, r_be,
                r_be < 0 ? hs_error_message() : "", r_ref, msg_ref);
    if (r_ref < 0 && strcmp(hs_error_message(), msg_ref) != 0)
        BE_FAIL("%s: decode_add_be says \"%s\", decode_add \"%s\"\n", what, hs_error_message(),
                msg_ref);
    be_fetch(be, got, dev, d);
    size_t i = be_first_diff(got, acc, d);
    if (i < d)
        BE_FAIL("%s: decoded element %zu: %a (backend) vs %a (host)\n", what, i, (double)got[i],
                (double)acc[i]);
    if (r_ref < 0 && be_first_diff(got, acc0, d) < d)
        BE_FAIL("%s: a refused message changed the destination\n", what);
    hs_be_free(be, dev);
    free(acc0);
    free(got);
    free(acc);
}

/* Encodes x (host, d floats) with spec in `rounds` rounds on the host and through the backend
 * (a copy of x in its memory), and checks return values, bytes, errors, ef: residuals, and the
 * decoding of every message and of damaged copies (thorough: three alphas and five damages;
 * otherwise one of each, for large d). */
static void be_check_spec(hs_backend *be, const char *spec, const float *x, size_t d,
                          uint64_t seed, int rounds, int thorough, const char *label) {
    hs_compressor *cr = be_mk(spec, d, seed), *cb = be_mk(spec, d, seed);
    float *dev = be_upload(be, x, d);
    char what[256];
    for (int r = 0; r < rounds; r++) {
        /* The last round has bits above 32 (the key folds them in). */
        uint64_t round = r == rounds - 1 && r > 0 ? ((uint64_t)1 << 32) + 7 : (uint64_t)r;
        uint32_t peer = 3 + (uint32_t)r;
        snprintf(what, sizeof(what), "%s: %s, d=%zu, round %llu", label, spec, d,
                 (unsigned long long)round);
        hs_buf *br = be_newbuf(), *bb = be_newbuf();
        int nr = hs_compress_encode(cr, x, d, peer, round, br);
        char msg_ref[512];
        snprintf(msg_ref, sizeof(msg_ref), "%s", nr < 0 ? hs_error_message() : "");
        int nb = hs_compress_encode_be(cb, (struct hs_backend *)be, dev, d, peer, round, bb);
        if (nb != nr)
            BE_FAIL("%s: encode_be returned %d (%s), encode %d (%s)\n", what, nb,
                    nb < 0 ? hs_error_message() : "", nr, msg_ref);
        if (nr < 0 && strcmp(hs_error_message(), msg_ref) != 0)
            BE_FAIL("%s: encode_be says \"%s\", encode \"%s\"\n", what, hs_error_message(),
                    msg_ref);
        if (bb->len != br->len) BE_FAIL("%s: %zu vs %zu bytes\n", what, bb->len, br->len);
        for (size_t i = 0; i < br->len; i++)
            if (bb->data[i] != br->data[i])
                BE_FAIL("%s: byte %zu of %zu: %02x (backend) vs %02x (host)\n", what, i - 3,
                        br->len - 3, bb->data[i], br->data[i]);
        const float *er = hs_compressor_residual(cr), *eb = hs_compressor_residual(cb);
        if (er && be_first_diff(er, eb, d) < d) BE_FAIL("%s: ef residuals differ\n", what);
        if (nr > 0) {
            const uint8_t *p = br->data + 3;
            size_t len = (size_t)nr;
            const float alphas[3] = {-0.5f, 1.0f, 0.3f};
            for (int a = 0; a < (thorough ? 3 : 1); a++)
                be_check_decode(be, cr, p, len, peer, round, alphas[a], what);
            /* Damaged copies: truncated, a trailing byte, a foreign codec id, the last byte
             * flipped (padding, an index, a value or a level: each codec refuses something),
             * and for random codecs another round (stream check). */
            uint8_t *q = malloc(len + 1);
            assert_non_null(q);
            memcpy(q, p, len);
            q[len] = 0;
            be_check_decode(be, cr, q, len - 1, peer, round, 1.0f, what);
            if (thorough) {
                be_check_decode(be, cr, q, len + 1, peer, round, 1.0f, what);
                q[0] = (uint8_t)(q[0] == HS_CODEC_NONE ? HS_CODEC_FP16 : HS_CODEC_NONE);
                be_check_decode(be, cr, q, len, peer, round, 1.0f, what);
                q[0] = p[0];
                q[len - 1] ^= 0xFF;
                be_check_decode(be, cr, q, len, peer, round, 1.0f, what);
                q[len - 1] = p[len - 1];
                be_check_decode(be, cr, q, len, peer + 1, round + 1, 1.0f, what);
            }
            free(q);
        }
        hs_buf_unref(br);
        hs_buf_unref(bb);
    }
    hs_be_free(be, dev);
    hs_compressor_free(cb);
    hs_compressor_free(cr);
}

/* The top-k primitive against hs__topk_select: same indices, values x[idx], max key. */
static void be_check_topk(hs_backend *be, const float *x, size_t d, size_t k, const char *label) {
    hs_compressor *c = be_mk("topk:1", d, 0); /* names errors; k is passed explicitly */
    uint32_t *ir = malloc(k * sizeof(uint32_t)), *ib = malloc(k * sizeof(uint32_t));
    float *vb = malloc(k * sizeof(float));
    assert_true(ir && ib && vb);
    hs__topk_scratch sc = {0};
    assert_int_equal(hs__topk_select(c, x, d, k, ir, &sc), 0);
    hs__topk_scratch_free(&sc);
    float *dev = be_upload(be, x, d);
    uint32_t mk = 0;
    assert_int_equal(be->ops->compress_topk(be, dev, d, k, ib, vb, &mk), 0);
    if (mk != hs__cmax_key(x, d))
        BE_FAIL("%s: topk d=%zu k=%zu: max key %08x, host %08x\n", label, d, k, mk,
                hs__cmax_key(x, d));
    for (size_t j = 0; j < k; j++) {
        if (ib[j] != ir[j])
            BE_FAIL("%s: topk d=%zu k=%zu: index %zu is %u, host %u\n", label, d, k, j, ib[j],
                    ir[j]);
        if (memcmp(&vb[j], &x[ir[j]], sizeof(float)) != 0)
            BE_FAIL("%s: topk d=%zu k=%zu: value %zu is %a, x[%u] = %a\n", label, d, k, j,
                    (double)vb[j], ir[j], (double)x[ir[j]]);
    }
    hs_be_free(be, dev);
    free(vb);
    free(ib);
    free(ir);
    hs_compressor_free(c);
}

/* The random-k primitive against the CPU's indices (compress_ew.h, word by word). */
static void be_check_randk(hs_backend *be, const float *x, size_t d, size_t k, uint64_t seed,
                           uint32_t peer, uint64_t round, const char *label) {
    uint32_t *ib = malloc(k * sizeof(uint32_t));
    float *vb = malloc(k * sizeof(float));
    assert_true(ib && vb);
    float *dev = be_upload(be, x, d);
    assert_int_equal(be->ops->compress_randk(be, dev, d, k, seed, peer, round, ib, vb), 0);
    for (uint32_t j = 0; j < k; j++) {
        uint32_t st, m;
        hs_cw_randk_stratum((uint32_t)d, (uint32_t)k, j, &st, &m);
        uint32_t at = st + hs_cw_randk_offset(hs_cw_randk_word(seed, peer, round, j), m);
        if (ib[j] != at)
            BE_FAIL("%s: randk d=%zu k=%zu: index %u is %u, host %u\n", label, d, k, j, ib[j], at);
        if (memcmp(&vb[j], &x[at], sizeof(float)) != 0)
            BE_FAIL("%s: randk d=%zu k=%zu: value %u differs\n", label, d, k, j);
    }
    hs_be_free(be, dev);
    free(vb);
    free(ib);
}

/* Specs covering every operator and device path: dense casts, top-k (k = 1, 1%, 30%, d, fp16),
 * random-k (scaled, unscaled, fp16, k = d), QSGD (fields of 2, 3, 4, 6, 8, 10 and 16 bits,
 * buckets of 1, 7, 64, 100, 512, 1000, 4096), sign (one bucket, 1, 64, 512, 4096, 100000), and
 * ef: (host path). Buckets from 4096 on take the CUDA block kernel; 64 and 4096 keep the
 * midpoints of the ulp vectors (64 M for L1, 64 m^2 = (8 m)^2 for squares). */
static const char *const be_specs[] = {
    "none",          "fp16",           "bf16",           "topk:1",
    "topk:0.01",     "topk:0.01:fp16", "topk:0.3",       "topk:1.0",
    "randk:1",       "randk:0.01",     "randk:0.1:fp16:unscaled", "randk:1.0:fp16",
    "qsgd:1:7",      "qsgd:16",        "qsgd:127:100",   "qsgd:255:1000",
    "qsgd:32767:64", "qsgd:4:1",       "qsgd:2:64",      "qsgd:8:4096",
    "sign",          "sign:1",         "sign:64",        "sign:512",
    "sign:4096",     "sign:100000",    "ef:topk:0.01",   "ef:qsgd:8:256",
    "ef:sign",
};
#define BE_N_SPECS (sizeof(be_specs) / sizeof(be_specs[0]))

/* Inputs the messages cannot carry: a NaN, an infinity, an fp16 overflow, a QSGD norm above
 * 2^127 (finite elements), at an awkward place. Every spec must refuse or accept them exactly
 * as the host does. */
static void be_check_bad_inputs(hs_backend *be, size_t d, const char *label) {
    const float bad[4] = {NAN, -INFINITY, 70000.0f, 3.0e38f};
    for (int v = 0; v < 4; v++) {
        float *x = be_vec(d, 5, BE_GAUSS);
        x[d / 2 + (d > 2)] = bad[v];
        if (v == 3 && d > 1) x[d / 2] = -3.0e38f;
        char lab[128];
        snprintf(lab, sizeof(lab), "%s, bad input %d", label, v);
        for (size_t s = 0; s < BE_N_SPECS; s++)
            be_check_spec(be, be_specs[s], x, d, 11, 1, 1, lab);
        free(x);
    }
}

#endif
