/* The CUDA backend: cuBLAS for GEMM, the kernels of kernels.cu for everything else. Built as
 * the module libhearsay-cuda.so, which src/tensor/backend.c dlopens for --device cuda, so the
 * hearsay binary never links libcudart. The module links none of hearsay's own code: errors
 * and log lines go through the hs_host_api handed to hs_cuda_backend_open, its only export.
 *
 * Threading: a backend is used by one thread at a time (tensor.h), but not always the thread
 * that opened it, so every op first makes the backend's device current on the calling thread.
 * Ordering: all work goes to one stream in the backend's state. Uploads, downloads, dot,
 * softmax_xent and xent_read (which touch host memory) wait for that stream; the other ops
 * return once enqueued, and any error of theirs surfaces at the next op that waits. A training step
 * therefore waits for nothing: its loss goes to softmax_xent_acc's device totals, which the
 * trainer reads (one small copy into page-locked memory, one wait) only at a progress line,
 * an evaluation or a round's end, where x or a value is copied back anyway. */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <type_traits>

#include "core/log.h"
#include "cuda/conv.cuh"
#include "cuda/data.cuh"
#include "cuda/gossip.cuh"
#include "cuda/kernels.cuh"
#include "cuda/precision.cuh"
#include "cuda/startup.cuh"
#include "tensor/backend_internal.h"

extern "C" __attribute__((visibility("default"))) int
hs_cuda_backend_open(hs_backend *be, const hs_backend_cfg *cfg, const hs_host_api *host);

/* The registry calls the entry through this type: a mismatch must not compile. */
static_assert(std::is_same<decltype(&hs_cuda_backend_open), hs_module_open_fn>::value,
              "hs_cuda_backend_open does not match hs_module_open_fn");

typedef struct cuda_state {
    int dev;
    cudaStream_t stream;
    cublasHandle_t blas;
    hs_cuda_result *result; /* device: what a reduction hands back to the host */
    hs_xent_acc *acc_host;  /* page-locked: where xent_read lands the loss totals */
    void *scratch;          /* device: reduction partials, grown on demand */
    size_t scratch_bytes;
    int precision;          /* hs_precision of gemm */
    int sm;                 /* compute capability, major * 10 + minor */
    size_t desc_len;        /* of be->description without the precision's suffix */
} cuda_state;

/* Set by hs_cuda_backend_open before anything can report; the registry passes the same table
 * for every backend it opens. */
static const hs_host_api *g_host;

__attribute__((format(printf, 2, 3))) static int report(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int r = g_host->err(code, fmt, ap);
    va_end(ap);
    return r;
}

__attribute__((format(printf, 2, 3))) static void logmsg(int level, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    g_host->log(level, fmt, ap);
    va_end(ap);
}

/* "cu_upload: cudaMemcpyAsync: an illegal memory access was encountered
 * (cudaErrorIllegalAddress)": the op, the call (its name only) and CUDA's words. */
static int cuda_error(cudaError_t e, const char *fn, const char *call) {
    int len = (int)strcspn(call, "(");
    return report(HS_ECUDA, "cuda %s: %.*s: %s (%s)", fn, len, call, cudaGetErrorString(e),
                  cudaGetErrorName(e));
}

static int cublas_error(cublasStatus_t st, const char *fn, const char *call) {
    int len = (int)strcspn(call, "(");
    return report(HS_ECUDA, "cuda %s: %.*s: %s (%s)", fn, len, call, cublasGetStatusString(st),
                  cublasGetStatusName(st));
}

/* Runs a CUDA runtime call (or a launcher, which returns the launch status); on failure reports
 * it and jumps to the function's `fail` label with err set to HS_ECUDA. */
#define HS_CUDA_TRY(call)                                                                          \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            err = cuda_error(e_, __func__, #call);                                                 \
            goto fail;                                                                             \
        }                                                                                          \
    } while (0)

#define HS_CUBLAS_TRY(call)                                                                        \
    do {                                                                                           \
        cublasStatus_t s_ = (call);                                                                \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                         \
            err = cublas_error(s_, __func__, #call);                                               \
            goto fail;                                                                             \
        }                                                                                          \
    } while (0)

static cuda_state *state(hs_backend *be) { return (cuda_state *)be->priv; }

/* Makes the backend's device current on this thread; cheap when it already is. */
static cudaError_t set_device(const cuda_state *s) {
    int cur = -1;
    cudaError_t e = cudaGetDevice(&cur);
    if (e != cudaSuccess) return e;
    return cur == s->dev ? cudaSuccess : cudaSetDevice(s->dev);
}

/* "940 KiB", for messages about allocations. */
static void format_bytes(char *buf, size_t len, size_t bytes) {
    if (bytes < 10 * 1024) snprintf(buf, len, "%zu bytes", bytes);
    else if (bytes < (size_t)10 << 20) snprintf(buf, len, "%zu KiB", (bytes + 1023) >> 10);
    else snprintf(buf, len, "%zu MiB", (bytes + (1u << 20) - 1) >> 20);
}

/* cudaMalloc with the size in the message when it fails. */
static int device_malloc(void **out, size_t bytes) {
    cudaError_t e = cudaMalloc(out, bytes ? bytes : 1);
    if (e == cudaSuccess) return 0;
    *out = NULL;
    /* Allocation failures are not sticky; clear it so the next call does not report it. */
    (void)cudaGetLastError();
    char sz[32];
    format_bytes(sz, sizeof(sz), bytes);
    return report(HS_ECUDA, "cudaMalloc(%s): %s", sz, cudaGetErrorString(e));
}

/* At least `bytes` of device scratch. Kernels still queued may use the old buffer, so the
 * stream drains before it is freed. */
static int scratch_get(cuda_state *s, size_t bytes, void **out) {
    int err = 0;
    if (bytes > s->scratch_bytes) {
        size_t want = bytes > 2 * s->scratch_bytes ? bytes : 2 * s->scratch_bytes;
        if (want < ((size_t)64 << 10)) want = (size_t)64 << 10;
        HS_CUDA_TRY(cudaStreamSynchronize(s->stream));
        HS_CUDA_TRY(cudaFree(s->scratch));
        s->scratch = NULL;
        s->scratch_bytes = 0;
        if ((err = device_malloc(&s->scratch, want)) < 0) return err;
        s->scratch_bytes = want;
    }
    *out = s->scratch;
    return 0;
fail:
    return err;
}

/* Copies the reduction result to the host once the stream has produced it. */
static int fetch_result(cuda_state *s, hs_cuda_result *r) {
    int err = 0;
    HS_CUDA_TRY(cudaMemcpyAsync(r, s->result, sizeof(*r), cudaMemcpyDeviceToHost, s->stream));
    HS_CUDA_TRY(cudaStreamSynchronize(s->stream));
    return 0;
fail:
    return err;
}

/* ------------------------------------------------------------------ memory */

static int cu_alloc(hs_backend *be, size_t bytes, void **out) {
    cuda_state *s = state(be);
    void *p = NULL;
    int err = 0;
    HS_CUDA_TRY(set_device(s));
    if ((err = device_malloc(&p, bytes)) < 0) return err;
    /* Ordered before any later op on the stream, which is the only way the memory is used. */
    if (bytes) HS_CUDA_TRY(cudaMemsetAsync(p, 0, bytes, s->stream));
    *out = p;
    return 0;
fail:
    cudaFree(p);
    return err;
}

/* Frees p with release (cudaFree, cudaFreeHost) once the stream is done with it: kernels and
 * copies still queued may use it. (cudaFree synchronises the device too, but that is an
 * implementation property, not a documented promise.) Errors are only logged. */
static void free_after_stream(hs_backend *be, void *p, cudaError_t (*release)(void *),
                              const char *what) {
    if (!p) return;
    cuda_state *s = state(be);
    cudaError_t e = set_device(s);
    if (e == cudaSuccess) e = cudaStreamSynchronize(s->stream);
    if (e == cudaSuccess) e = release(p);
    if (e != cudaSuccess)
        logmsg(HS_LOG_WARN, "cuda free: %s: %s (%s)", what, cudaGetErrorString(e),
               cudaGetErrorName(e));
}

static void cu_free(hs_backend *be, void *p) { free_after_stream(be, p, cudaFree, "cudaFree"); }

/* The copies are enqueued on the backend's stream, after the kernels that produce their source;
 * those with host memory on one side are waited for, as the ops table promises. */
static int cu_upload(hs_backend *be, void *dst, const void *src_host, size_t bytes) {
    cuda_state *s = state(be);
    int err = 0;
    if (!bytes) return 0;
    HS_CUDA_TRY(set_device(s));
    HS_CUDA_TRY(cudaMemcpyAsync(dst, src_host, bytes, cudaMemcpyHostToDevice, s->stream));
    HS_CUDA_TRY(cudaStreamSynchronize(s->stream));
    return 0;
fail:
    return err;
}

static int cu_download(hs_backend *be, void *dst_host, const void *src, size_t bytes) {
    cuda_state *s = state(be);
    int err = 0;
    if (!bytes) return 0;
    HS_CUDA_TRY(set_device(s));
    HS_CUDA_TRY(cudaMemcpyAsync(dst_host, src, bytes, cudaMemcpyDeviceToHost, s->stream));
    HS_CUDA_TRY(cudaStreamSynchronize(s->stream));
    return 0;
fail:
    return err;
}

static int cu_copy(hs_backend *be, void *dst, const void *src, size_t bytes) {
    cuda_state *s = state(be);
    int err = 0;
    if (!bytes || dst == src) return 0;
    HS_CUDA_TRY(set_device(s));
    {
        const char *d = (const char *)dst, *c = (const char *)src;
        if (d < c + bytes && c < d + bytes) {
            /* cudaMemcpy leaves overlapping ranges undefined; cpu.c memmoves. Go through
             * scratch. */
            void *tmp;
            if ((err = scratch_get(s, bytes, &tmp)) < 0) return err;
            HS_CUDA_TRY(cudaMemcpyAsync(tmp, src, bytes, cudaMemcpyDeviceToDevice, s->stream));
            src = tmp;
        }
    }
    /* No wait: only work queued behind it on this stream (or a download, which waits) can
     * see dst, so a step that copies (momentum-kind qg, a residual without shortcut_sum) does
     * not stall the host. */
    HS_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s->stream));
    return 0;
fail:
    return err;
}

static int cu_sync(hs_backend *be) {
    cuda_state *s = state(be);
    int err = 0;
    HS_CUDA_TRY(set_device(s));
    HS_CUDA_TRY(cudaStreamSynchronize(s->stream));
    return 0;
fail:
    return err;
}

/* ------------------------------------------------------------------ GEMM */

static int cu_gemm(hs_backend *be, int ta, int tb, int m, int n, int k, float alpha,
                   const float *a, int lda, const float *b, int ldb, float beta, float *c,
                   int ldc) {
    cuda_state *s = state(be);
    int err = 0;
    cublasOperation_t op_a = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t op_b = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    if (m < 0 || n < 0 || k < 0) return report(HS_EINVAL, "gemm: negative size %dx%dx%d", m, n, k);
    if (!m || !n) return 0;
    /* Row-major rules: A is m x k (k x m when transposed) with row stride lda, and so on. */
    int min_lda = ta ? m : k, min_ldb = tb ? k : n;
    if (lda < (min_lda > 1 ? min_lda : 1) || ldb < (min_ldb > 1 ? min_ldb : 1) || ldc < n)
        return report(HS_EINVAL,
                      "gemm: row strides lda=%d ldb=%d ldc=%d too small for %s * %s, %dx%dx%d",
                      lda, ldb, ldc, ta ? "A^T" : "A", tb ? "B^T" : "B", m, n, k);
    HS_CUDA_TRY(set_device(s));
    if (k > 0 && hs__cuda_lowp_wanted(s->precision)) {
        void *scr;
        hs_cuda_lowp_fail f;
        if ((err = scratch_get(s, hs__cuda_lowp_scratch(s->precision, m, n, k), &scr)) < 0)
            return err;
        if (hs__cuda_gemm_lowp(s->blas, s->stream, s->precision, ta, tb, m, n, k, alpha, a, lda,
                               b, ldb, beta, c, ldc, scr, &f) < 0)
            return f.cuda != cudaSuccess ? cuda_error(f.cuda, __func__, f.call)
                                         : cublas_error(f.blas, __func__, f.call);
        return 0;
    }
    if (k == 0) {
        /* BLAS defines C = beta * C here; cuBLAS's documentation does not promise it, so do
         * it ourselves. */
        if (beta != 1.0f) HS_CUDA_TRY(hs__cuda_scale_matrix(s->stream, c, m, n, ldc, beta));
        return 0;
    }
    /* cuBLAS is column-major. A row-major matrix with row stride ld, read as column-major with
     * leading dimension ld, is its transpose. So the row-major C = op(A) op(B) is, in cuBLAS's
     * terms, C^T = op(B)^T op(A)^T: B goes first and A second, m and n swap (C^T is n x m),
     * k stays, and the leading dimensions are the row strides unchanged. Each operand keeps
     * its own flag: cuBLAS sees B^T where B is stored, and applying tb's transpose to that
     * view gives op(B)^T (likewise for A). */
    HS_CUBLAS_TRY(
        cublasSgemm(s->blas, op_b, op_a, n, m, k, &alpha, b, ldb, a, lda, &beta, c, ldc));
    return 0;
fail:
    return err;
}

/* ------------------------------------------------------------------ vector ops */

static int cu_fill(hs_backend *be, float *x, size_t n, float v) {
    cuda_state *s = state(be);
    int err = 0;
    if (!n) return 0;
    HS_CUDA_TRY(set_device(s));
    HS_CUDA_TRY(hs__cuda_fill(s->stream, x, n, v));
    return 0;
fail:
    return err;
}

static int cu_scale(hs_backend *be, float *x, size_t n, float a) {
    cuda_state *s = state(be);
    int err = 0;
    if (!n) return 0;
    HS_CUDA_TRY(set_device(s));
    HS_CUDA_TRY(hs__cuda_scale(s->stream, x, n, a));
    return 0;
fail:
    return err;
}

static int cu_axpy(hs_backend *be, float *y, const float *x, size_t n, float a) {
    cuda_state *s = state(be);
    int err = 0;
    if (!n) return 0;
    HS_CUDA_TRY(set_device(s));
    HS_CUDA_TRY(hs__cuda_axpy(s->stream, y, x, n, a));
    return 0;
fail:
    return err;
}

static int cu_axpby(hs_backend *be, float *y, const float *x, size_t n, float a, float b) {
    cuda_state *s = state(be);
    int err = 0;
    if (!n) return 0;
    HS_CUDA_TRY(set_device(s));
    HS_CUDA_TRY(hs__cuda_axpby(s->stream, y, x, n, a, b));
    return 0;
fail:
    return err;
}

static int cu_dot(hs_backend *be, const float *x, const float *y, size_t n, double *out) {
    cuda_state *s = state(be);
    int err = 0;
    hs_cuda_result r;
    void *scr;
    if (!n) {
        *out = 0.0;
        return 0;
    }
    HS_CUDA_TRY(set_device(s));
    if ((err = scratch_get(s, hs__cuda_dot_scratch(n), &scr)) < 0) return err;
    HS_CUDA_TRY(hs__cuda_dot(s->stream, x, y, n, scr, s->result));
    if ((err = fetch_result(s, &r)) < 0) return err;
    *out = r.sum;
    return 0;
fail:
    return err;
}

/* ------------------------------------------------------------------ layers */

static int cu_bias_add(hs_backend *be, float *y, const float *b, int m, int n) {
    cuda_state *s = state(be);
    int err = 0;
    if (m <= 0 || n <= 0) return 0;
    HS_CUDA_TRY(set_device(s));
    HS_CUDA_TRY(hs__cuda_bias_add(s->stream, y, b, m, n));
    return 0;
fail:
    return err;
}

static int cu_bias_grad(hs_backend *be, float *db, const float *dy, int m, int n) {
    cuda_state *s = state(be);
    int err = 0;
    void *scr = NULL;
    size_t need = hs__cuda_bias_grad_scratch(m, n);
    if (n <= 0) return 0;
    HS_CUDA_TRY(set_device(s));
    if (need && (err = scratch_get(s, need, &scr)) < 0) return err;
    HS_CUDA_TRY(hs__cuda_bias_grad(s->stream, db, dy, m, n, scr));
    return 0;
fail:
    return err;
}

static int cu_relu(hs_backend *be, float *y, const float *x, size_t n) {
    cuda_state *s = state(be);
    int err = 0;
    if (!n) return 0;
    HS_CUDA_TRY(set_device(s));
    HS_CUDA_TRY(hs__cuda_relu(s->stream, y, x, n));
    return 0;
fail:
    return err;
}

static int cu_relu_grad(hs_backend *be, float *dx, const float *dy, const float *y, size_t n) {
    cuda_state *s = state(be);
    int err = 0;
    if (!n) return 0;
    HS_CUDA_TRY(set_device(s));
    HS_CUDA_TRY(hs__cuda_relu_grad(s->stream, dx, dy, y, n));
    return 0;
fail:
    return err;
}

/* Unlike cpu.c, which stops at the first bad label, a bad label here is found after every row
 * ran: the error is the same, but rows other than the bad ones already have their gradient. */
/* Queues the softmax cross-entropy of m >= 1 rows into s->result (and acc, when non-NULL). */
static int queue_xent(cuda_state *s, float *logits, const int32_t *labels, int m, int k,
                      float *dlogits, float grad_scale, hs_xent_acc *acc) {
    int err = 0;
    void *scr;
    /* The kernel's index arithmetic stays in int below 2^30 classes. */
    if (k <= 0 || k > (1 << 30))
        return report(HS_EINVAL, "softmax_xent: %d classes (expected 1..%d)", k, 1 << 30);
    HS_CUDA_TRY(set_device(s));
    if ((err = scratch_get(s, hs__cuda_xent_scratch(m), &scr)) < 0) return err;
    HS_CUDA_TRY(hs__cuda_softmax_xent(s->stream, logits, labels, m, k, dlogits, grad_scale, scr,
                                      s->result, acc));
    return 0;
fail:
    return err;
}

static int cu_softmax_xent(hs_backend *be, float *logits, const int32_t *labels, int m, int k,
                           float *dlogits, float grad_scale, double *loss_sum, int *correct) {
    cuda_state *s = state(be);
    int err = 0;
    hs_cuda_result r;
    if (m <= 0) {
        if (loss_sum) *loss_sum = 0.0;
        if (correct) *correct = 0;
        return 0;
    }
    if ((err = queue_xent(s, logits, labels, m, k, dlogits, grad_scale, NULL)) < 0 ||
        (err = fetch_result(s, &r)) < 0)
        return err;
    if (r.first_bad >= 0) {
        int32_t y = 0;
        HS_CUDA_TRY(cudaMemcpyAsync(&y, labels + r.first_bad, sizeof(y), cudaMemcpyDeviceToHost,
                                    s->stream));
        HS_CUDA_TRY(cudaStreamSynchronize(s->stream));
        return report(HS_EINVAL, "softmax_xent: label %d of row %d not in [0, %d)", (int)y,
                      r.first_bad, k);
    }
    if (loss_sum) *loss_sum = r.sum;
    if (correct) *correct = r.count;
    return 0;
fail:
    return err;
}

/* softmax_xent without the wait: the result stays on the device and is added to acc there. A
 * bad label is recorded in acc (and reported by the next xent_read); its rows get no gradient,
 * as in cu_softmax_xent. */
static int cu_softmax_xent_acc(hs_backend *be, float *logits, const int32_t *labels, int m,
                               int k, float *dlogits, float grad_scale, hs_xent_acc *acc) {
    if (m <= 0) return 0;
    return queue_xent(state(be), logits, labels, m, k, dlogits, grad_scale, acc);
}

static int cu_xent_read(hs_backend *be, hs_xent_acc *acc, hs_xent_acc *out, int reset) {
    cuda_state *s = state(be);
    int err = 0;
    HS_CUDA_TRY(set_device(s));
    HS_CUDA_TRY(cudaMemcpyAsync(s->acc_host, acc, sizeof(*acc), cudaMemcpyDeviceToHost,
                                s->stream));
    if (reset) HS_CUDA_TRY(cudaMemsetAsync(acc, 0, sizeof(*acc), s->stream));
    HS_CUDA_TRY(cudaStreamSynchronize(s->stream));
    *out = *s->acc_host;
    return 0;
fail:
    return err;
}

static int cu_sgd_step(hs_backend *be, float *x, const float *g, float *v, size_t n,
                       const hs_sgd_hparams *h) {
    cuda_state *s = state(be);
    int err = 0;
    if (h->momentum != 0.0f && !v)
        return report(HS_EINVAL, "sgd_step: momentum %g needs a velocity buffer",
                      (double)h->momentum);
    if (!n) return 0;
    HS_CUDA_TRY(set_device(s));
    HS_CUDA_TRY(hs__cuda_sgd(s->stream, x, g, v, n, h->lr, h->momentum, h->weight_decay,
                             h->nesterov));
    return 0;
fail:
    return err;
}

/* ------------------------------------------------------------------ lent to gossip_ops.cu */

int hs__cuda_be_enter(hs_backend *be, const char *fn, cudaStream_t *st) {
    cudaError_t e = set_device(state(be));
    if (e != cudaSuccess) return cuda_error(e, fn, "cudaSetDevice");
    *st = state(be)->stream;
    return 0;
}

int hs__cuda_be_scratch(hs_backend *be, size_t bytes, void **out) {
    return scratch_get(state(be), bytes, out);
}

int hs__cuda_be_error(cudaError_t e, const char *fn, const char *call) {
    return cuda_error(e, fn, call);
}

int hs__cuda_be_report(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int r = g_host->err(code, fmt, ap);
    va_end(ap);
    return r;
}

/* ------------------------------------------------------------------ lifetime */

/* Frees what exists of a state, also a half-built one. Errors are only logged: there is no
 * one left to return them to. */
static void state_free(cuda_state *s) {
    if (!s) return;
    if (s->stream) {
        /* Let queued work finish before its buffers go. */
        cudaError_t e = set_device(s);
        if (e == cudaSuccess) e = cudaStreamSynchronize(s->stream);
        if (e != cudaSuccess)
            logmsg(HS_LOG_WARN, "cuda close: %s (%s)", cudaGetErrorString(e),
                   cudaGetErrorName(e));
    }
    if (s->blas) cublasDestroy(s->blas);
    if (s->scratch) cudaFree(s->scratch);
    if (s->result) cudaFree(s->result);
    if (s->acc_host) cudaFreeHost(s->acc_host);
    if (s->stream) cudaStreamDestroy(s->stream);
    free(s);
}

static void cu_destroy(hs_backend *be) {
    state_free(state(be));
    be->priv = NULL;
}

/* In hs_backend_ops order (C++17 has no designated initialisers). */
static int cu_adamw_step(hs_backend *be, float *x, const float *g, float *m, float *v, size_t n,
                         const hs_adamw_hparams *h) {
    cuda_state *s = state(be);
    int err = 0;
    if (!n) return 0;
    HS_CUDA_TRY(set_device(s));
    HS_CUDA_TRY(hs__cuda_adamw(s->stream, x, g, m, v, n, h->beta1, h->beta2, h->eps, h->decay,
                               h->step_size, h->inv_sqrt_bc2));
    return 0;
fail:
    return err;
}

/* ------------------------------------------------------------------ convolutional layers */

/* The body of an op that only enqueues one launcher of conv.cu; n <= 0 launches nothing. */
#define CU_ENQUEUE(call)                                                                           \
    cuda_state *s = state(be);                                                                     \
    int err = 0;                                                                                   \
    if (n <= 0) return 0;                                                                          \
    HS_CUDA_TRY(set_device(s));                                                                    \
    HS_CUDA_TRY(call);                                                                             \
    return 0;                                                                                      \
fail:                                                                                              \
    return err

static int cu_im2col(hs_backend *be, const float *x, const hs_conv_geom *g, int n, float *col) {
    CU_ENQUEUE(hs__cuda_im2col(s->stream, x, g, n, col));
}
static int cu_col2im(hs_backend *be, const float *col, const hs_conv_geom *g, int n, float *dx) {
    CU_ENQUEUE(hs__cuda_col2im(s->stream, col, g, n, dx));
}
static int cu_maxpool(hs_backend *be, const float *x, const hs_conv_geom *g, int n, float *y,
                      int32_t *arg) {
    CU_ENQUEUE(hs__cuda_maxpool(s->stream, x, g, n, y, arg));
}
static int cu_maxpool_grad(hs_backend *be, const float *dy, const int32_t *arg,
                           const hs_conv_geom *g, int n, float *dx) {
    CU_ENQUEUE(hs__cuda_maxpool_grad(s->stream, dy, arg, g, n, dx));
}
static int cu_avgpool(hs_backend *be, const float *x, int n, int hw, int c, float *y) {
    CU_ENQUEUE(hs__cuda_avgpool(s->stream, x, n, hw, c, y));
}
static int cu_avgpool_grad(hs_backend *be, const float *dy, int n, int hw, int c, float *dx) {
    CU_ENQUEUE(hs__cuda_avgpool_grad(s->stream, dy, n, hw, c, dx));
}
static int cu_groupnorm(hs_backend *be, const float *x, int n, int hw, int c, int groups,
                        float eps, const float *gamma, const float *beta, float *y, float *mean,
                        float *rstd) {
    CU_ENQUEUE(hs__cuda_groupnorm(s->stream, x, n, hw, c, groups, eps, gamma, beta, y, mean, rstd));
}
static int cu_groupnorm_grad(hs_backend *be, const float *dy, const float *x, int n, int hw, int c,
                             int groups, const float *gamma, const float *mean, const float *rstd,
                             float *dx, float *dgamma, float *dbeta) {
    CU_ENQUEUE(hs__cuda_groupnorm_grad(s->stream, dy, x, n, hw, c, groups, gamma, mean, rstd, dx,
                                       dgamma, dbeta));
}
static int cu_shortcut_add(hs_backend *be, float *y, const float *x, const hs_shortcut_geom *sg,
                           int n) {
    CU_ENQUEUE(hs__cuda_shortcut_add(s->stream, y, x, sg, n));
}
static int cu_shortcut_grad(hs_backend *be, float *dx, const float *dy,
                            const hs_shortcut_geom *sg, int n) {
    CU_ENQUEUE(hs__cuda_shortcut_grad(s->stream, dx, dy, sg, n));
}
static int cu_groupnorm_relu(hs_backend *be, const float *x, int n, int hw, int c, int groups,
                             float eps, const float *gamma, const float *beta, float *y,
                             float *mean, float *rstd) {
    CU_ENQUEUE(hs__cuda_groupnorm_relu(s->stream, x, n, hw, c, groups, eps, gamma, beta, y, mean,
                                       rstd));
}
static int cu_shortcut_sum(hs_backend *be, float *y, const float *a, const float *x,
                           const hs_shortcut_geom *sg, int n, int relu) {
    CU_ENQUEUE(hs__cuda_shortcut_sum(s->stream, y, a, x, sg, n, relu));
}
static int cu_groupnorm_relu_grad(hs_backend *be, const float *dy, const float *y, const float *x,
                                  int n, int hw, int c, int groups, const float *gamma,
                                  const float *mean, const float *rstd, float *dx, float *dgamma,
                                  float *dbeta) {
    CU_ENQUEUE(hs__cuda_groupnorm_relu_grad(s->stream, dy, y, x, n, hw, c, groups, gamma, mean,
                                            rstd, dx, dgamma, dbeta));
}

/* ------------------------------------------------------------------ precision */

/* TF32 is cuBLAS's math mode on the FP32 call; BF16 goes through precision.cu, whose FP32
 * accumulation the default mode keeps. The description names any precision but FP32. */
static int cu_set_precision(hs_backend *be, int p) {
    cuda_state *s = state(be);
    int err = hs__cuda_lowp_check(p, s->sm, be->description, s->desc_len);
    if (err < 0) return err;
    int mode = p == HS_PRECISION_TF32
                   ? CUBLAS_TF32_TENSOR_OP_MATH
                   : CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION;
    HS_CUDA_TRY(set_device(s));
    HS_CUBLAS_TRY(cublasSetMathMode(s->blas, (cublasMath_t)mode));
    s->precision = p;
    be->description[s->desc_len] = '\0';
    if (p != HS_PRECISION_FP32)
        snprintf(be->description + s->desc_len, sizeof(be->description) - s->desc_len, ", %s",
                 p == HS_PRECISION_TF32 ? "tf32" : "bf16");
    return 0;
fail:
    return err;
}

/* ------------------------------------------------------------------ data on the device */

static int cu_gather(hs_backend *be, const float *src, const uint8_t *labels, const uint32_t *idx,
                     const uint8_t *aug, const hs_gather_geom *g, int n, float *x, int32_t *y) {
    if (g->c < 1 || g->h < 1 || g->w < 1)
        return report(HS_EINVAL, "cuda gather: example of %d x %d x %d", g->c, g->h, g->w);
    CU_ENQUEUE(hs__cuda_gather(s->stream, src, labels, idx, aug, g, n, x, y));
}

static int cu_host_alloc(hs_backend *be, size_t bytes, void **out) {
    cuda_state *s = state(be);
    int err = 0;
    void *p = NULL;
    HS_CUDA_TRY(set_device(s));
    HS_CUDA_TRY(cudaMallocHost(&p, bytes ? bytes : 1));
    memset(p, 0, bytes);
    *out = p;
    return 0;
fail:
    (void)cudaGetLastError(); /* an allocation failure is not sticky */
    return err;
}

static void cu_host_free(hs_backend *be, void *p) {
    free_after_stream(be, p, cudaFreeHost, "cudaFreeHost");
}

static const hs_backend_ops cuda_ops = {
    "cuda",          /* name */
    cu_alloc,        /* alloc */
    cu_free,         /* free */
    cu_upload,       /* upload */
    cu_download,     /* download */
    cu_copy,         /* copy */
    cu_sync,         /* sync */
    cu_gemm,         /* gemm */
    cu_fill,         /* fill */
    cu_scale,        /* scale */
    cu_axpy,         /* axpy */
    cu_axpby,        /* axpby */
    cu_dot,          /* dot */
    cu_bias_add,     /* bias_add */
    cu_bias_grad,    /* bias_grad */
    cu_relu,         /* relu */
    cu_relu_grad,    /* relu_grad */
    cu_softmax_xent,     /* softmax_xent */
    cu_softmax_xent_acc, /* softmax_xent_acc */
    cu_xent_read,        /* xent_read */
    cu_sgd_step,     /* sgd_step */
    cu_destroy,      /* destroy */
    cu_adamw_step,          /* adamw_step */
    cu_im2col,              /* im2col */
    cu_col2im,              /* col2im */
    cu_maxpool,             /* maxpool */
    cu_maxpool_grad,        /* maxpool_grad */
    cu_avgpool,             /* avgpool */
    cu_avgpool_grad,        /* avgpool_grad */
    cu_groupnorm,           /* groupnorm */
    cu_groupnorm_grad,      /* groupnorm_grad */
    cu_shortcut_add,        /* shortcut_add */
    cu_shortcut_grad,       /* shortcut_grad */
    cu_gather,              /* gather */
    cu_host_alloc,          /* host_alloc */
    cu_host_free,           /* host_free */
    NULL,                   /* im2row: the model lowers with im2col */
    cu_groupnorm_relu,      /* groupnorm_relu */
    cu_shortcut_sum,        /* shortcut_sum */
    &hs__cuda_gossip_ops,   /* gossip */
    /* --precision and the fused backward (gpuprec) */
    cu_set_precision,       /* set_precision */
    cu_groupnorm_relu_grad, /* groupnorm_relu_grad */
};

int hs_cuda_backend_open(hs_backend *be, const hs_backend_cfg *cfg, const hs_host_api *host) {
    /* A module from another build may disagree on the host table's layout, so it cannot even
     * use host->err to say so. */
    if (!host || host->version != HS_HOST_API_VERSION) return HS_ENOTSUP;
    g_host = host;
    int id = cfg ? cfg->device_id : 0;
    int ndev = 0, err = 0;
    cuda_state *s = NULL;
    cudaDeviceProp prop;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev <= 0) {
        char why[512];
        hs__cuda_explain_count_error(e, ndev, why, sizeof(why));
        (void)cudaGetLastError();
        return report(HS_ENODEV, "--device cuda: %s", why);
    }
    if (id < 0 || id >= ndev)
        return report(HS_ENODEV, "--device cuda:%d: CUDA device %d does not exist (%d found: "
                                 "cuda:0..cuda:%d)", id, id, ndev, ndev - 1);
    if (!(s = (cuda_state *)calloc(1, sizeof(*s))))
        return report(HS_ENOMEM, "cuda backend: out of memory");
    s->dev = id;
    HS_CUDA_TRY(cudaSetDevice(id));
    HS_CUDA_TRY(cudaGetDeviceProperties(&prop, id));
    if ((e = hs__cuda_probe()) != cudaSuccess) {
        (void)cudaGetLastError();
        err = report(HS_ENODEV,
                     "--device cuda: %s (sm_%d%d) cannot run this build's kernels (%s); "
                     "rebuild with -Dgpu_sm=%d%d",
                     prop.name, prop.major, prop.minor, cudaGetErrorString(e), prop.major,
                     prop.minor);
        goto fail;
    }
    /* Non-blocking: other libraries' work on the legacy default stream never serialises
     * with ours; our copies are ordered on this stream instead. */
    HS_CUDA_TRY(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking));
    if ((err = device_malloc((void **)&s->result, sizeof(*s->result))) < 0) goto fail;
    HS_CUDA_TRY(cudaMallocHost((void **)&s->acc_host, sizeof(*s->acc_host)));
    HS_CUBLAS_TRY(cublasCreate(&s->blas));
    HS_CUBLAS_TRY(cublasSetStream(s->blas, s->stream));
    /* FP32 GEMM stays FP32: the default math mode never uses TF32 unless asked, and saying so
     * guards against a changed default. No atomics, so GEMM is deterministic run to run. */
    HS_CUBLAS_TRY(cublasSetMathMode(
        s->blas,
        (cublasMath_t)(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
    HS_CUBLAS_TRY(cublasSetAtomicsMode(s->blas, CUBLAS_ATOMICS_NOT_ALLOWED));
    HS_CUBLAS_TRY(cublasSetPointerMode(s->blas, CUBLAS_POINTER_MODE_HOST));

    be->ops = &cuda_ops;
    be->device = HS_DEVICE_CUDA;
    be->host_memory = 0;
    be->threads = cfg && cfg->threads > 0 ? cfg->threads : 0;
    be->priv = s;
    snprintf(be->description, sizeof(be->description), "cuda (%.64s, sm_%d%d, %zu MiB)",
             prop.name, prop.major, prop.minor, (size_t)(prop.totalGlobalMem >> 20));
    s->desc_len = strlen(be->description);
    s->sm = prop.major * 10 + prop.minor;
    return 0;
fail:
    state_free(s);
    return err;
}
