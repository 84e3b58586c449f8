/* The CUDA backend's hs_gossip_ops (src/tensor/gossip_ops.h): argument checks, scratch and
 * waits around the launchers of compress.cu and gossip.cu, on the backend's one stream.
 *
 * Entries with host outputs or inputs (every compression primitive, step_sq and beer_step)
 * wait for the stream: the host buffers are filled, or free to reuse, on return, also after
 * an error (a launcher may fail after enqueueing copies to or from them). The pure vector
 * entries only enqueue, as the backend's other vector ops do; their errors surface at the next
 * call that waits. */
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "cuda/compress.cuh"
#include "compress/compress_ew.h"
#include "cuda/gossip.cuh"
#include "hearsay/error.h"

/* Runs a CUDA call or launcher; on failure reports it and jumps to `fail` with err set. */
#define GO_TRY(call)                                                                               \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            err = hs__cuda_be_error(e_, __func__, #call);                                          \
            goto fail;                                                                             \
        }                                                                                          \
    } while (0)

/* The prologue of an entry: be's stream in st, or return the error. */
#define GO_ENTER()                                                                                 \
    cudaStream_t st;                                                                               \
    int err = hs__cuda_be_enter(be, __func__, &st);                                                \
    if (err < 0) return err

/* After a failure: wait for what was enqueued, so the host buffers are no longer in use. */
static int drain(cudaStream_t st, int err) {
    (void)cudaStreamSynchronize(st);
    return err;
}

static int check_dim(const char *fn, size_t d) {
    if (d < 1 || d > HS_GOSSIP_MAX_D)
        return hs__cuda_be_report(HS_EINVAL, "cuda %s: d = %zu is not in 1..%zu", fn, d,
                                  HS_GOSSIP_MAX_D);
    return 0;
}

static int check_count(const char *fn, size_t d, size_t k) {
    int err = check_dim(fn, d);
    if (err == 0 && (k < 1 || k > d))
        err = hs__cuda_be_report(HS_EINVAL, "cuda %s: k = %zu is not in 1..%zu", fn, k, d);
    return err;
}

/* ------------------------------------------------------------------ compression primitives */

static int go_topk(hs_backend *be, const float *x, size_t d, size_t k, uint32_t *idx, float *val,
                   uint32_t *max_key) {
    int cerr = check_count(__func__, d, k);
    if (cerr < 0) return cerr;
    GO_ENTER();
    void *scr;
    if ((err = hs__cuda_be_scratch(be, hs__cuda_topk_scratch(d, k), &scr)) < 0) return err;
    GO_TRY(hs__cuda_topk(st, x, d, k, scr, idx, val, max_key));
    GO_TRY(cudaStreamSynchronize(st));
    return 0;
fail:
    return drain(st, err);
}

static int go_randk(hs_backend *be, const float *x, size_t d, size_t k, uint64_t seed,
                    uint32_t peer, uint64_t round, uint32_t *idx, float *val) {
    int cerr = check_count(__func__, d, k);
    if (cerr < 0) return cerr;
    GO_ENTER();
    void *scr;
    if ((err = hs__cuda_be_scratch(be, hs__cuda_randk_scratch(k), &scr)) < 0) return err;
    GO_TRY(hs__cuda_randk(st, x, d, k, seed, peer, round, scr, idx, val));
    GO_TRY(cudaStreamSynchronize(st));
    return 0;
fail:
    return drain(st, err);
}

static int go_qsgd(hs_backend *be, const float *x, size_t d, size_t bucket, uint32_t lv,
                   uint64_t seed, uint32_t peer, uint64_t round, void *norms, void *fields) {
    int cerr = check_dim(__func__, d);
    if (cerr < 0) return cerr;
    if (bucket < 1 || lv < 1 || lv > 32767)
        return hs__cuda_be_report(HS_EINVAL, "cuda %s: bucket %zu, s = %u (expected >= 1, "
                                             "1..32767)", __func__, bucket, lv);
    GO_ENTER();
    void *scr;
    if ((err = hs__cuda_be_scratch(be, hs__cuda_qsgd_scratch(d, bucket, lv), &scr)) < 0)
        return err;
    GO_TRY(hs__cuda_qsgd(st, x, d, bucket, lv, seed, peer, round, scr, norms, fields));
    GO_TRY(cudaStreamSynchronize(st));
    return 0;
fail:
    return drain(st, err);
}

static int go_sign(hs_backend *be, const float *x, size_t d, size_t bucket, void *scales,
                   void *bits) {
    int cerr = check_count(__func__, d, bucket);
    if (cerr < 0) return cerr;
    GO_ENTER();
    void *scr;
    if ((err = hs__cuda_be_scratch(be, hs__cuda_sign_scratch(d, bucket), &scr)) < 0) return err;
    GO_TRY(hs__cuda_sign(st, x, d, bucket, scr, scales, bits));
    GO_TRY(cudaStreamSynchronize(st));
    return 0;
fail:
    return drain(st, err);
}

static int go_half(hs_backend *be, const float *x, size_t d, int bf16, void *out) {
    int cerr = check_dim(__func__, d);
    if (cerr < 0) return cerr;
    GO_ENTER();
    void *scr;
    if ((err = hs__cuda_be_scratch(be, hs__cuda_half_scratch(d), &scr)) < 0) return err;
    GO_TRY(hs__cuda_half(st, x, d, bf16 != 0, scr, out));
    GO_TRY(cudaStreamSynchronize(st));
    return 0;
fail:
    return drain(st, err);
}

static int go_add_dense(hs_backend *be, float *acc, const void *p, size_t n, int fmt,
                        float alpha) {
    int cerr = check_dim(__func__, n);
    if (cerr < 0) return cerr;
    if (fmt < 0 || fmt > 2)
        return hs__cuda_be_report(HS_EINVAL, "cuda %s: value format %d (expected 0..2)",
                                  __func__, fmt);
    GO_ENTER();
    void *scr;
    if ((err = hs__cuda_be_scratch(be, hs__cuda_add_dense_scratch(n, fmt), &scr)) < 0)
        return err;
    GO_TRY(hs__cuda_add_dense(st, acc, p, n, fmt, alpha, scr));
    GO_TRY(cudaStreamSynchronize(st));
    return 0;
fail:
    return drain(st, err);
}

static int go_add_sparse(hs_backend *be, float *acc, const uint32_t *idx, const float *val,
                         size_t n) {
    if (!n) return 0;
    int cerr = check_dim(__func__, n);
    if (cerr < 0) return cerr;
    GO_ENTER();
    void *scr;
    if ((err = hs__cuda_be_scratch(be, hs__cuda_add_sparse_scratch(n), &scr)) < 0) return err;
    GO_TRY(hs__cuda_add_sparse(st, acc, idx, val, n, scr));
    GO_TRY(cudaStreamSynchronize(st));
    return 0;
fail:
    return drain(st, err);
}

/* The bytes of a QSGD / sign message body of d elements in nb buckets, fields of b bits. */
static size_t body_bytes(size_t d, size_t nb, uint32_t b) { return 4 * nb + (d * b + 7) / 8; }

static int go_qsgd_add(hs_backend *be, float *acc, const void *body, size_t d, size_t bucket,
                       uint32_t lv, float alpha) {
    int cerr = check_dim(__func__, d);
    if (cerr < 0) return cerr;
    if (bucket < 1 || lv < 1 || lv > 32767)
        return hs__cuda_be_report(HS_EINVAL, "cuda %s: bucket %zu, s = %u (expected >= 1, "
                                             "1..32767)", __func__, bucket, lv);
    if (bucket > d) bucket = d;
    size_t bytes = body_bytes(d, (d + bucket - 1) / bucket, hs_cw_qsgd_bits(lv));
    GO_ENTER();
    void *scr;
    if ((err = hs__cuda_be_scratch(be, hs__cuda_body_scratch(bytes), &scr)) < 0) return err;
    GO_TRY(hs__cuda_qsgd_add(st, acc, body, bytes, d, bucket, lv, alpha, scr));
    GO_TRY(cudaStreamSynchronize(st));
    return 0;
fail:
    return drain(st, err);
}

static int go_sign_add(hs_backend *be, float *acc, const void *body, size_t d, size_t bucket,
                       float alpha) {
    int cerr = check_count(__func__, d, bucket);
    if (cerr < 0) return cerr;
    size_t bytes = body_bytes(d, (d + bucket - 1) / bucket, 1);
    GO_ENTER();
    void *scr;
    if ((err = hs__cuda_be_scratch(be, hs__cuda_body_scratch(bytes), &scr)) < 0) return err;
    GO_TRY(hs__cuda_sign_add(st, acc, body, bytes, d, bucket, alpha, scr));
    GO_TRY(cudaStreamSynchronize(st));
    return 0;
fail:
    return drain(st, err);
}

/* ------------------------------------------------------------------ vector work */

/* The body of an entry that only enqueues one launcher. */
#define GO_ENQUEUE(call)                                                                           \
    int cerr = check_dim(__func__, n);                                                             \
    if (cerr < 0) return cerr;                                                                     \
    GO_ENTER();                                                                                    \
    GO_TRY(call);                                                                                  \
    return 0;                                                                                      \
fail:                                                                                              \
    return err

static int go_sub(hs_backend *be, float *out, const float *x, const float *y, size_t n) {
    GO_ENQUEUE(hs__cuda_sub(st, out, x, y, n));
}

static int go_acc_diff(hs_backend *be, float *acc, const float *a, const float *b, size_t n,
                       float w) {
    GO_ENQUEUE(hs__cuda_acc_diff(st, acc, a, b, n, w));
}

static int go_scale_to(hs_backend *be, float *out, const float *x, size_t n, float a) {
    GO_ENQUEUE(hs__cuda_scale_to(st, out, x, n, a));
}

static int go_beer_track(hs_backend *be, float *v, float *s_prev, float *dg, const float *mg,
                         const float *g, float gamma, const float *xr, const float *x, size_t n) {
    GO_ENQUEUE(hs__cuda_beer_track(st, v, s_prev, dg, mg, g, gamma, xr, x, n));
}

static int go_step_sq(hs_backend *be, float *x, const float *m, float g, size_t n, double *sq) {
    int cerr = check_dim(__func__, n);
    if (cerr < 0) return cerr;
    GO_ENTER();
    void *scr;
    if ((err = hs__cuda_be_scratch(be, hs__cuda_gossip_sum_scratch(), &scr)) < 0) return err;
    GO_TRY(hs__cuda_step_sq(st, x, m, g, n, scr, sq));
    GO_TRY(cudaStreamSynchronize(st));
    return 0;
fail:
    return drain(st, err);
}

static int go_beer_step(hs_backend *be, float *x, float *dh, const float *xr, const float *mh,
                        const float *v, const float *h, float gamma, size_t n, double *sq) {
    int cerr = check_dim(__func__, n);
    if (cerr < 0) return cerr;
    GO_ENTER();
    void *scr;
    if ((err = hs__cuda_be_scratch(be, hs__cuda_gossip_sum_scratch(), &scr)) < 0) return err;
    GO_TRY(hs__cuda_beer_step(st, x, dh, xr, mh, v, h, gamma, n, scr, sq));
    GO_TRY(cudaStreamSynchronize(st));
    return 0;
fail:
    return drain(st, err);
}

static int go_sumsq(hs_backend *be, const float *x, size_t n, double *sq) {
    int cerr = check_dim(__func__, n);
    if (cerr < 0) return cerr;
    GO_ENTER();
    void *scr;
    if ((err = hs__cuda_be_scratch(be, hs__cuda_gossip_sum_scratch(), &scr)) < 0) return err;
    GO_TRY(hs__cuda_sumsq(st, x, n, scr, sq));
    GO_TRY(cudaStreamSynchronize(st));
    return 0;
fail:
    return drain(st, err);
}

/* In hs_gossip_ops order (C++17 has no designated initialisers). */
const hs_gossip_ops hs__cuda_gossip_ops = {
    go_topk,       /* topk */
    go_randk,      /* randk */
    go_qsgd,       /* qsgd */
    go_sign,       /* sign */
    go_half,       /* half */
    go_add_dense,  /* add_dense */
    go_add_sparse, /* add_sparse */
    go_sub,        /* sub */
    go_acc_diff,   /* acc_diff */
    go_step_sq,    /* step_sq */
    go_beer_track, /* beer_track */
    go_beer_step,  /* beer_step */
    go_scale_to,   /* scale_to */
    go_qsgd_add,   /* qsgd_add */
    go_sign_add,   /* sign_add */
    go_sumsq,      /* sumsq */
};
