/* The harness of test_cuda_round.c (round_job.h): the backend's ops wrapped to count and fail
 * copies, allocations and staged primitive calls, and the mixed jobs of real hs_algo objects
 * over hs_simnet checked bit for bit against the all-host job. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "round_job.h"
#include "algo/algo_internal.h"
#include "compress/compress_ew.h"
#include "core/error_internal.h"
#include "hearsay/sim.h"
#include "hearsay/topo.h"
#include "tensor/gossip_ops.h"

hs_backend *dev;
int reference, reload_at, leave_at, leaver, round_allocs, x_downloads, fail_x;
int fail_pull_at, fail_pull_rc[N];
static int fail_add; /* the decode primitives fail (HS_ECUDA) */
size_t x_bytes;
static hs_backend_ops counted_ops;
static const hs_backend_ops *real_ops;
static int full_downloads; /* downloads of D floats or more since last cleared */

/* Device allocations through the backend's ops (hs_be_alloc_f) not freed yet. */
static int live_allocs;

static int counted_alloc(hs_backend *be, size_t bytes, void **out) {
    int err = real_ops->alloc(be, bytes, out);
    live_allocs += err == 0;
    return err;
}

static void counted_free(hs_backend *be, void *p) {
    live_allocs -= p != NULL;
    real_ops->free(be, p);
}

static int counted_download(hs_backend *be, void *dst, const void *src, size_t bytes) {
    if (bytes >= sizeof(float) * D) full_downloads++;
    if (x_bytes && bytes == x_bytes) x_downloads++;
    if (fail_x && bytes == x_bytes) return hs__err(HS_ECUDA, "test: the copy of x fails");
    return real_ops->download(be, dst, src, bytes);
}

/* Pinned staging (hs_backend.stage): every host buffer of a message that the gossip primitives
 * fill or read must come from the backend's host_alloc (page-locked on CUDA). The reference
 * device has none: the test's stands in (calloc), and hs_backend_close frees it with free. */
static hs_gossip_ops counted_gossip;
static const hs_gossip_ops *real_gossip;
static struct {
    const char *p;
    size_t n;
} pinned[16];
static int staged, unstaged; /* primitive calls with their buffers staged, and not */

static int counted_host_alloc(hs_backend *be, size_t bytes, void **out) {
    int err = real_ops->host_alloc ? real_ops->host_alloc(be, bytes, out)
                                   : (*out = calloc(1, bytes)) ? 0 : HS_ENOMEM;
    for (int i = 0; err == 0 && i < 16; i++)
        if (!pinned[i].p) {
            pinned[i].p = *out;
            pinned[i].n = bytes;
            break;
        }
    return err;
}

static void counted_host_free(hs_backend *be, void *p) {
    for (int i = 0; i < 16; i++)
        if (p && pinned[i].p == p) pinned[i].p = NULL;
    if (real_ops->host_alloc) real_ops->host_free(be, p);
    else free(p);
}

/* Counts a call whose host buffers are a and b (n bytes each at most; b may be NULL). */
static void need_pinned(const void *a, const void *b, size_t n) {
    int in = 0;
    for (int i = 0; i < 16; i++) {
        const char *p = pinned[i].p;
        if (p && (const char *)a >= p && (const char *)a + n <= p + pinned[i].n &&
            (!b || ((const char *)b >= p && (const char *)b + n <= p + pinned[i].n)))
            in = 1;
    }
    if (in) staged++;
    else unstaged++;
}

static int c_topk(hs_backend *be, const float *x, size_t d, size_t k, uint32_t *idx, float *val,
                  uint32_t *max_key) {
    need_pinned(idx, val, 4 * k);
    return real_gossip->topk(be, x, d, k, idx, val, max_key);
}
static int c_randk(hs_backend *be, const float *x, size_t d, size_t k, uint64_t seed,
                   uint32_t peer, uint64_t round, uint32_t *idx, float *val) {
    need_pinned(idx, val, 4 * k);
    return real_gossip->randk(be, x, d, k, seed, peer, round, idx, val);
}
static int c_qsgd(hs_backend *be, const float *x, size_t d, size_t bucket, uint32_t s,
                  uint64_t seed, uint32_t peer, uint64_t round, void *norms, void *fields) {
    need_pinned(norms, fields, 1);
    return real_gossip->qsgd(be, x, d, bucket, s, seed, peer, round, norms, fields);
}
static int c_sign(hs_backend *be, const float *x, size_t d, size_t bucket, void *scales,
                  void *bits) {
    need_pinned(scales, bits, 1);
    return real_gossip->sign(be, x, d, bucket, scales, bits);
}
static int c_half(hs_backend *be, const float *x, size_t d, int bf16, void *out) {
    need_pinned(out, NULL, 2 * d);
    return real_gossip->half(be, x, d, bf16, out);
}
static int c_add_dense(hs_backend *be, float *acc, const void *p, size_t n, int fmt,
                       float alpha) {
    need_pinned(p, NULL, (fmt ? 2 : 4) * n);
    if (fail_add) return hs__err(HS_ECUDA, "test: the decode on the device fails");
    return real_gossip->add_dense(be, acc, p, n, fmt, alpha);
}
static int c_add_sparse(hs_backend *be, float *acc, const uint32_t *idx, const float *val,
                        size_t n) {
    need_pinned(idx, val, 4 * n);
    if (fail_add) return hs__err(HS_ECUDA, "test: the decode on the device fails");
    return real_gossip->add_sparse(be, acc, idx, val, n);
}
static int c_qsgd_add(hs_backend *be, float *acc, const void *body, size_t d, size_t bucket,
                      uint32_t s, float alpha) {
    need_pinned(body, NULL, 1);
    if (fail_add) return hs__err(HS_ECUDA, "test: the decode on the device fails");
    return real_gossip->qsgd_add(be, acc, body, d, bucket, s, alpha);
}
static int c_sign_add(hs_backend *be, float *acc, const void *body, size_t d, size_t bucket,
                      float alpha) {
    need_pinned(body, NULL, 1);
    if (fail_add) return hs__err(HS_ECUDA, "test: the decode on the device fails");
    return real_gossip->sign_add(be, acc, body, d, bucket, alpha);
}

static int on_device(int i) { return i == 1 || i == 2; }

/* The algorithms with a device path (hs__algo_ops.to_device). */
static int has_device_path(hs_algo_kind k) {
    return k == HS_ALGO_CHOCO || k == HS_ALGO_BEER || k == HS_ALGO_DCD || k == HS_ALGO_SGP ||
           k == HS_ALGO_DPSGD;
}

static uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static float rng_float(uint64_t *s) { return (float)((double)(rng_next(s) >> 40) * 0x1p-24 - 0.5); }

static void reload_peers(hs_algo **a, const hs_algo_cfg *cfg, float *const *x0) {
    for (int i = 0; i < N; i++) {
        if (!on_device(i)) continue;
        int was_dev = a[i]->be != NULL;
        hs_buf *b;
        assert_int_equal(hs_buf_new(&b, 64), 0);
        if (hs_algo_save(a[i], b) < 0) fail_msg("save of peer %d: %s", i, hs_error_message());
        hs_algo_free(a[i]);
        if (hs_algo_new(&a[i], cfg, (uint32_t)i, D, x0[i]) < 0 ||
            hs__algo_to_device(a[i], was_dev ? dev : NULL) != was_dev ||
            hs_algo_load(a[i], b->data, b->len) < 0)
            fail_msg("reload of peer %d: %s", i, hs_error_message());
        hs_buf_unref(b);
    }
}

void run_job(const job_opts *o, float *x_out, uint64_t *save_hash) {
    hs_topo *topo;
    hs_simnet *sim;
    if (hs_topo_new(&topo, o->topo ? o->topo : "ring", N, 5) < 0)
        fail_msg("topology: %s", hs_error_message());
    assert_int_equal(hs_simnet_new(&sim, topo), 0);
    if (o->loss > 0) hs_simnet_set_loss(sim, o->loss, 11);
    hs_algo_cfg cfg;
    hs_algo_cfg_default(&cfg);
    cfg.kind = o->kind;
    cfg.compress = o->spec;
    cfg.gamma_c = 0.5f;
    cfg.seed = 3;
    cfg.recv_timeout_ms = 0;
    cfg.same_start = o->same_start;
    hs_algo *a[N];
    float *xh[N], *target[N], *x[N], *tgt[N];
    for (int i = 0; i < N; i++) {
        uint64_t s = (uint64_t)(o->same_start ? 1 : 100 + i);
        xh[i] = malloc(sizeof(float) * D);
        target[i] = malloc(sizeof(float) * D);
        assert_true(xh[i] && target[i]);
        for (size_t k = 0; k < D; k++) xh[i][k] = rng_float(&s);
        uint64_t t = (uint64_t)(7 + i);
        for (size_t k = 0; k < D; k++) target[i][k] = 4.0f * rng_float(&t);
        if (hs_algo_new(&a[i], &cfg, (uint32_t)i, D, xh[i]) < 0)
            fail_msg("hs_algo_new: %s", hs_error_message());
        x[i] = xh[i];
        tgt[i] = target[i];
        if (!o->mixed || !on_device(i)) continue;
        int rc = hs__algo_to_device(a[i], dev);
        if (rc < 0) fail_msg("hs__algo_to_device: %s", hs_error_message());
        /* Those with a device path move; the others keep the host path. */
        assert_int_equal(rc, has_device_path(o->kind) && strncmp(o->spec, "ef:", 3));
        if (rc == 0) continue;
        assert_int_equal(hs_be_alloc_f(dev, D, &x[i]), 0);
        assert_int_equal(hs_be_alloc_f(dev, D, &tgt[i]), 0);
        assert_int_equal(hs_be_upload(dev, x[i], xh[i], sizeof(float) * D), 0);
        assert_int_equal(hs_be_upload(dev, tgt[i], target[i], sizeof(float) * D), 0);
    }
    int live0 = live_allocs;
    for (int r = 0; r < ROUNDS; r++) {
        full_downloads = 0;
        /* begin (x_r), then the local step, x += 0.1 (target_i - x), where x lives: the same
         * floats anywhere. */
        if (leave_at && r == leave_at + 1) assert_int_equal(hs_simnet_leave(sim, leaver), 0);
        if (leave_at && r == leave_at + 3) assert_int_equal(hs_simnet_kill(sim, leaver), 0);
        for (int i = 0; i < N; i++) {
            if (!hs_simnet_alive(sim, i)) continue;
            hs_simnet_set_clock(sim, i, (double)r + 0.5);
            if (hs_algo_begin(a[i], hs_simnet_exchange(sim, i), (uint64_t)r, x[i]) < 0)
                fail_msg("begin of peer %d, round %d: %s", i, r, hs_error_message());
            if (x[i] != xh[i])
                assert_int_equal(dev->ops->gossip->acc_diff(dev, x[i], tgt[i], x[i], D, 0.1f), 0);
            else
                hs__acc_diff(x[i], target[i], x[i], D, 0.1f);
        }
        for (int i = 0; i < N; i++) {
            if (!hs_simnet_alive(sim, i)) continue;
            hs_simnet_set_clock(sim, i, (double)r + 1);
            if (hs_algo_push(a[i], hs_simnet_exchange(sim, i), (uint64_t)r, x[i]) < 0)
                fail_msg("push of peer %d, round %d: %s", i, r, hs_error_message());
        }
        int failing = o->mixed && fail_pull_at && r == fail_pull_at;
        for (int i = 0; i < N; i++) {
            if (!hs_simnet_alive(sim, i)) continue;
            fail_add = failing && x[i] != xh[i];
            int rc = hs_algo_pull(a[i], hs_simnet_exchange(sim, i), (uint64_t)r, x[i]);
            if (fail_add) fail_pull_rc[i] = rc;
            else if (rc < 0) fail_msg("pull of peer %d, round %d: %s", i, r, hs_error_message());
            fail_add = 0;
        }
        if (failing) break; /* the device peers' state is the error's */
        /* A steady round (no loss, past the first) moves only messages across. */
        if (o->mixed && r > 0 && o->loss == 0 && !leave_at && !o->topo && strcmp(o->spec, "none") &&
            has_device_path(o->kind) && strncmp(o->spec, "ef:", 3) && full_downloads)
            fail_msg("%s: round %d brought %d vectors of %d floats to the host", o->spec, r,
                     full_downloads, D);
        for (int i = 0; i < N; i++) {
            float *out = x_out + ((size_t)r * N + (size_t)i) * D;
            if (x[i] != xh[i])
                assert_int_equal(hs_be_download(dev, out, x[i], sizeof(float) * D), 0);
            else
                memcpy(out, x[i], sizeof(float) * D);
        }
        if (reload_at && r == reload_at) reload_peers(a, &cfg, xh);
    }
    round_allocs = live_allocs - live0;
    for (int i = 0; i < N; i++) {
        hs_buf *b;
        assert_int_equal(hs_buf_new(&b, 64), 0);
        if (hs_algo_save(a[i], b) < 0) fail_msg("save of peer %d: %s", i, hs_error_message());
        uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
        for (size_t k = 0; k < b->len; k++) h = (h ^ b->data[k]) * 0x100000001b3ull;
        save_hash[i] = h;
        hs_buf_unref(b);
        if (x[i] != xh[i]) {
            hs_be_free(dev, x[i]);
            hs_be_free(dev, tgt[i]);
        }
        /* Freed before the backend's vectors go: fini frees the device state. */
        hs_algo_free(a[i]);
        free(xh[i]);
        free(target[i]);
    }
    hs_simnet_free(sim);
    hs_topo_free(topo);
}

/* Mean squared distance of the peers' x from their average, at round r. */
static double consensus(const float *x, int r) {
    double sum = 0;
    for (size_t k = 0; k < D; k++) {
        double m = 0;
        for (int i = 0; i < N; i++) m += x[((size_t)r * N + (size_t)i) * D + k];
        m /= N;
        for (int i = 0; i < N; i++) {
            double e = x[((size_t)r * N + (size_t)i) * D + k] - m;
            sum += e * e;
        }
    }
    return sum / (N * D);
}

void check(const job_opts *o) {
    size_t n = (size_t)ROUNDS * N * D;
    float *cpu = malloc(sizeof(float) * n), *mixed = malloc(sizeof(float) * n);
    assert_true(cpu && mixed);
    job_opts c = *o;
    uint64_t hc[N], hm[N];
    c.mixed = 0;
    run_job(&c, cpu, hc);
    c.mixed = 1;
    staged = unstaged = 0;
    run_job(&c, mixed, hm);
    /* Messages cross through the pinned staging only (ef: compressors stay on the host). */
    if (unstaged || (has_device_path(o->kind) && strncmp(o->spec, "ef:", 3) && !staged))
        fail_msg("%s: %d primitive calls on staged buffers, %d on others", o->spec, staged,
                 unstaged);
    for (int i = 0; i < N; i++)
        if (hc[i] != hm[i])
            fail_msg("%s: peer %d's saved state differs from the host run's", o->spec, i);
    for (size_t j = 0; j < n; j++)
        if (hs_cw_bits(cpu[j]) != hs_cw_bits(mixed[j]))
            fail_msg("%s %s (same start %d, loss %g): round %zu, peer %zu, element %zu: host "
                     "run %a, mixed run %a",
                     hs_algo_kind_name(o->kind), o->spec, o->same_start, o->loss,
                     j / ((size_t)N * D), j / D % N, j % D, (double)cpu[j], (double)mixed[j]);
    printf("# %s %s same_start %d loss %g: consensus %.4g -> %.4g, bit-identical\n",
           hs_algo_kind_name(o->kind), o->spec, o->same_start, o->loss, consensus(cpu, 0),
           consensus(cpu, ROUNDS - 1));
    free(cpu);
    free(mixed);
}

void round_job_instrument(hs_backend *be) {
    dev = be;
    real_ops = dev->ops;
    counted_ops = *dev->ops;
    counted_ops.download = counted_download;
    counted_ops.alloc = counted_alloc;
    counted_ops.free = counted_free;
    counted_ops.host_alloc = counted_host_alloc;
    counted_ops.host_free = counted_host_free;
    real_gossip = real_ops->gossip;
    counted_gossip = *real_gossip;
    counted_gossip.topk = c_topk;
    counted_gossip.randk = c_randk;
    counted_gossip.qsgd = c_qsgd;
    counted_gossip.sign = c_sign;
    counted_gossip.half = c_half;
    counted_gossip.add_dense = c_add_dense;
    counted_gossip.add_sparse = c_add_sparse;
    counted_gossip.qsgd_add = c_qsgd_add;
    counted_gossip.sign_add = c_sign_add;
    counted_ops.gossip = &counted_gossip;
    dev->ops = &counted_ops;
}

void round_job_uninstrument(hs_backend *be) { be->ops = real_ops; }
