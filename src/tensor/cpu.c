/* The CPU backend: OpenBLAS for GEMM, plain loops over src/tensor/ew.h for the rest. It is the
 * reference every other backend is compared with. Backend memory is host memory. With more
 * than one thread it owns a pool of lanes (core/pool.h) on which a model splits its batch, and
 * OpenBLAS runs single-threaded inside each lane; every op here is stateless, so lanes call
 * them at once on disjoint buffers. */
#include <cblas.h>
#include <stdio.h>
#include <float.h>
#include <stdlib.h>
#include <string.h>

#include "core/error_internal.h"
#include "core/hd.h"
#include "core/pool.h"
#include "tensor/backend_internal.h"
#include "tensor/ew.h"

static int cpu_alloc(hs_backend *be, size_t bytes, void **out) {
    (void)be;
    /* 64-byte alignment suits AVX-512 loads in BLAS and keeps vectors off shared cache lines. */
    size_t sz = (bytes + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, sz ? sz : 64);
    if (!p) return hs__err(HS_ENOMEM, "cpu backend: cannot allocate %zu bytes", bytes);
    memset(p, 0, sz ? sz : 64);
    *out = p;
    return 0;
}

static void cpu_free(hs_backend *be, void *p) {
    (void)be;
    free(p);
}

static int cpu_memcpy(hs_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    if (bytes && dst != src) memmove(dst, src, bytes);
    return 0;
}

static int cpu_sync(hs_backend *be) {
    (void)be;
    return 0;
}

static int cpu_gemm(hs_backend *be, int ta, int tb, int m, int n, int k, float alpha,
                    const float *a, int lda, const float *b, int ldb, float beta, float *c,
                    int ldc) {
    (void)be;
    if (m < 0 || n < 0 || k < 0) return hs__err(HS_EINVAL, "gemm: negative size %dx%dx%d", m, n, k);
    if (!m || !n) return 0;
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m,
                n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return 0;
}

static int cpu_fill(hs_backend *be, float *x, size_t n, float v) {
    (void)be;
    for (size_t i = 0; i < n; i++) x[i] = v;
    return 0;
}

static int cpu_scale(hs_backend *be, float *x, size_t n, float a) {
    (void)be;
    for (size_t i = 0; i < n; i++) x[i] = a * x[i];
    return 0;
}

HS_VECTOR_CLONES
static int cpu_axpy(hs_backend *be, float *y, const float *x, size_t n, float a) {
    (void)be;
    for (size_t i = 0; i < n; i++) y[i] = hs_ew_axpy(y[i], a, x[i]);
    return 0;
}

static int cpu_axpby(hs_backend *be, float *y, const float *x, size_t n, float a, float b) {
    (void)be;
    for (size_t i = 0; i < n; i++) y[i] = hs_ew_axpby(y[i], a, x[i], b);
    return 0;
}

static int cpu_dot(hs_backend *be, const float *x, const float *y, size_t n, double *out) {
    (void)be;
    /* Four partial sums let the compiler vectorise without reassociating a single chain; the
     * order is fixed, so the result is deterministic. */
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        s0 += (double)x[i] * y[i];
        s1 += (double)x[i + 1] * y[i + 1];
        s2 += (double)x[i + 2] * y[i + 2];
        s3 += (double)x[i + 3] * y[i + 3];
    }
    for (; i < n; i++) s0 += (double)x[i] * y[i];
    *out = (s0 + s1) + (s2 + s3);
    return 0;
}

static int cpu_bias_add(hs_backend *be, float *y, const float *b, int m, int n) {
    (void)be;
    for (int i = 0; i < m; i++) {
        float *row = y + (size_t)i * n;
        for (int j = 0; j < n; j++) row[j] += b[j];
    }
    return 0;
}

static int cpu_bias_grad(hs_backend *be, float *db, const float *dy, int m, int n) {
    (void)be;
    memset(db, 0, sizeof(float) * (size_t)n);
    for (int i = 0; i < m; i++) {
        const float *row = dy + (size_t)i * n;
        for (int j = 0; j < n; j++) db[j] += row[j];
    }
    return 0;
}

static int cpu_relu(hs_backend *be, float *y, const float *x, size_t n) {
    (void)be;
    for (size_t i = 0; i < n; i++) y[i] = hs_ew_relu(x[i]);
    return 0;
}

static int cpu_relu_grad(hs_backend *be, float *dx, const float *dy, const float *y, size_t n) {
    (void)be;
    for (size_t i = 0; i < n; i++) dx[i] = hs_ew_relu_grad(dy[i], y[i]);
    return 0;
}

static int cpu_softmax_xent(hs_backend *be, float *logits, const int32_t *labels, int m, int k,
                            float *dlogits, float grad_scale, double *loss_sum, int *correct) {
    (void)be;
    double loss = 0;
    int ok = 0;
    for (int i = 0; i < m; i++) {
        const float *z = logits + (size_t)i * k;
        int y = labels[i];
        if (y < 0 || y >= k) return hs__err(HS_EINVAL, "softmax_xent: label %d of row %d not in [0, %d)", y, i, k);
        float mx = -FLT_MAX;
        int arg = 0;
        for (int j = 0; j < k; j++)
            if (z[j] > mx) {
                mx = z[j];
                arg = j;
            }
        float s = 0;
        for (int j = 0; j < k; j++) s += expf(z[j] - mx);
        loss += hs_ew_xent_loss(z[y], mx, s);
        ok += arg == y;
        if (dlogits) {
            float inv = 1.0f / s;
            float *dz = dlogits + (size_t)i * k;
            for (int j = 0; j < k; j++) dz[j] = hs_ew_xent_grad(z[j], mx, inv, j == y, grad_scale);
        }
    }
    if (loss_sum) *loss_sum = loss;
    if (correct) *correct = ok;
    return 0;
}

/* The per-step values cost nothing here: a bad label is returned at once, as softmax_xent
 * does, and the totals are summed in the order the trainer summed per-step losses before. */
static int cpu_softmax_xent_acc(hs_backend *be, float *logits, const int32_t *labels, int m,
                                int k, float *dlogits, float grad_scale, hs_xent_acc *acc) {
    double loss = 0;
    int ok = 0;
    if (m <= 0) return 0;
    int err = cpu_softmax_xent(be, logits, labels, m, k, dlogits, grad_scale, &loss, &ok);
    if (err < 0) return err;
    hs_ew_xent_acc_add(acc, loss / m, ok, m);
    return 0;
}

static int cpu_xent_read(hs_backend *be, hs_xent_acc *acc, hs_xent_acc *out, int reset) {
    (void)be;
    *out = *acc;
    if (reset) memset(acc, 0, sizeof(*acc));
    return 0;
}

HS_VECTOR_CLONES
static int cpu_sgd_step(hs_backend *be, float *x, const float *g, float *v, size_t n,
                        const hs_sgd_hparams *h) {
    (void)be;
    float lr = h->lr, mu = h->momentum, wd = h->weight_decay;
    int nest = h->nesterov;
    if (mu != 0.0f && !v) return hs__err(HS_EINVAL, "sgd_step: momentum %g needs a velocity buffer", (double)mu);
    if (mu == 0.0f) {
        float dummy = 0;
        for (size_t i = 0; i < n; i++) hs_ew_sgd(&x[i], g[i], &dummy, lr, 0.0f, wd, nest);
    } else {
        for (size_t i = 0; i < n; i++) hs_ew_sgd(&x[i], g[i], &v[i], lr, mu, wd, nest);
    }
    return 0;
}

HS_VECTOR_CLONES
static int cpu_adamw_step(hs_backend *be, float *x, const float *g, float *m, float *v, size_t n,
                          const hs_adamw_hparams *h) {
    (void)be;
    const float b1 = h->beta1, b2 = h->beta2, eps = h->eps, decay = h->decay,
                ss = h->step_size, ib = h->inv_sqrt_bc2;
    for (size_t i = 0; i < n; i++) hs_ew_adamw(&x[i], g[i], &m[i], &v[i], b1, b2, eps, decay, ss, ib);
    return 0;
}

/* The reference of the CUDA backend's gather; the CPU backend's own batches never need it
 * (its memory is the host's, so the batcher's buffers are used in place). */
static int cpu_gather(hs_backend *be, const float *src, const uint8_t *labels, const uint32_t *idx,
                      const uint8_t *aug, const hs_gather_geom *g, int n, float *x, int32_t *y) {
    (void)be;
    const long dim = (long)g->c * g->h * g->w;
    for (int i = 0; i < n; i++) {
        uint32_t k = idx[i];
        const float *row = src + (size_t)k * (size_t)dim;
        float *out = x + (size_t)i * (size_t)dim;
        int dy = aug ? aug[3 * (size_t)k] : g->pad, dx = aug ? aug[3 * (size_t)k + 1] : g->pad;
        int flip = aug ? aug[3 * (size_t)k + 2] : 0;
        for (long e = 0; e < dim; e++) {
            long at = hs_ew_gather_src(g, e, dy, dx, flip);
            out[e] = at < 0 ? 0.0f : row[at];
        }
        y[i] = labels[k];
    }
    return 0;
}

static void cpu_destroy(hs_backend *be) {
    hs__pool_free(be->priv);
    be->priv = NULL;
}

static const hs_backend_ops cpu_ops = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_memcpy,
    .download = cpu_memcpy,
    .copy = cpu_memcpy,
    .sync = cpu_sync,
    .gemm = cpu_gemm,
    .fill = cpu_fill,
    .scale = cpu_scale,
    .axpy = cpu_axpy,
    .axpby = cpu_axpby,
    .dot = cpu_dot,
    .bias_add = cpu_bias_add,
    .bias_grad = cpu_bias_grad,
    .relu = cpu_relu,
    .relu_grad = cpu_relu_grad,
    .softmax_xent = cpu_softmax_xent,
    .softmax_xent_acc = cpu_softmax_xent_acc,
    .xent_read = cpu_xent_read,
    .sgd_step = cpu_sgd_step,
    .destroy = cpu_destroy,
    .adamw_step = cpu_adamw_step,
    .im2col = hs__cpu_im2col,
    .col2im = hs__cpu_col2im,
    .maxpool = hs__cpu_maxpool,
    .maxpool_grad = hs__cpu_maxpool_grad,
    .avgpool = hs__cpu_avgpool,
    .avgpool_grad = hs__cpu_avgpool_grad,
    .groupnorm = hs__cpu_groupnorm,
    .groupnorm_grad = hs__cpu_groupnorm_grad,
    .shortcut_add = hs__cpu_shortcut_add,
    .shortcut_grad = hs__cpu_shortcut_grad,
    .gather = cpu_gather,
    .im2row = hs__cpu_im2row,
    .groupnorm_relu = hs__cpu_groupnorm_relu,
    .shortcut_sum = hs__cpu_shortcut_sum,
};

hs__pool *hs__cpu_pool(const hs_backend *be) {
    /* The device, not the ops table, says whose priv this is: a test may run the CPU backend
     * on a copy of its table with ops removed, and keeps its lanes. */
    return be->device == HS_DEVICE_CPU && be->host_memory ? be->priv : NULL;
}

int hs__cpu_backend_open(hs_backend *be, const hs_backend_cfg *cfg) {
    be->ops = &cpu_ops;
    be->device = HS_DEVICE_CPU;
    be->host_memory = 1;
    be->threads = cfg && cfg->threads > 0 ? cfg->threads : 0;
    /* Batch lanes rather than BLAS threads: a convolution's GEMMs over a few examples are too
     * small for OpenBLAS to split, while a whole forward and backward pass per lane keeps every
     * thread busy. OpenBLAS's count is process-wide; every backend of this process with a
     * thread count asks for 1, so they agree. */
    if (be->threads > 1) {
        int err = hs__pool_new((hs__pool **)&be->priv, be->threads);
        if (err < 0) return hs__err_prefix(err, "cpu backend, --threads %d: ", be->threads);
    }
    if (be->threads > 0) openblas_set_num_threads(1);
    const char *conf = openblas_get_config();
    if (be->threads > 1)
        snprintf(be->description, sizeof(be->description), "cpu (%s, %d threads in batch lanes)",
                 conf ? conf : "OpenBLAS", be->threads);
    else
        snprintf(be->description, sizeof(be->description), "cpu (%s, %d threads)",
                 conf ? conf : "OpenBLAS", openblas_get_num_threads());
    return 0;
}
