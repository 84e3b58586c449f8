/* hearsay: compute backends.
 *
 * A backend is a table of functions over its own memory: the CPU backend (OpenBLAS, always
 * built) and the CUDA backend (cuBLAS, a module loaded at run time when --device cuda asks for
 * it). Pointers named "device" below point into the backend's memory; for the CPU backend that
 * is ordinary host memory and `host_memory` is set, so callers may skip copies.
 *
 * Layout: every matrix is row-major and dense; vectors are contiguous floats.
 * Threading: a backend object is used by one thread at a time (the training thread). The CPU
 * backend with threads > 1 owns a pool of threads - 1 workers (joined by hs_backend_close) on
 * which a model splits each batch into `threads` lanes that call the ops at once on disjoint
 * buffers, so the CPU ops keep no state of their own; OpenBLAS then runs one thread per call
 * (its thread count is process-wide: every CPU backend with a thread count sets it to 1).
 * Errors: functions return 0 or a negative HS_E* with hs_error_message() set. */
#ifndef HEARSAY_TENSOR_H
#define HEARSAY_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#include "hearsay/buf.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum hs_device {
    HS_DEVICE_CPU = 0,
    HS_DEVICE_CUDA = 1,
} hs_device;

typedef struct hs_backend hs_backend;

/* Hyper-parameters of one SGD step; see hs_ew_sgd() in src/tensor/ew.h for the exact update
 * (PyTorch's convention: weight decay added to the gradient, dampening 0). */
typedef struct hs_sgd_hparams {
    float lr;
    float momentum;     /* 0 disables the velocity buffer */
    float weight_decay; /* L2 coefficient */
    int nesterov;       /* 1: Nesterov momentum; 0: heavy ball */
} hs_sgd_hparams;

/* One AdamW step, with the host's per-step scalars; see hs_ew_adamw() in src/tensor/ew.h. */
typedef struct hs_adamw_hparams {
    float beta1, beta2, eps;
    float decay;        /* 1 - lr * weight_decay: the decoupled weight decay */
    float step_size;    /* lr / (1 - beta1^t) */
    float inv_sqrt_bc2; /* 1 / sqrt(1 - beta2^t) */
} hs_adamw_hparams;

/* The shape of a convolution or pooling window over one example of c x h x w. */
typedef struct hs_conv_geom {
    int c, h, w;          /* input channels, height, width */
    int k, stride, pad;   /* square kernel, stride, zero padding on every side */
    int oh, ow;           /* output height and width: (h + 2 pad - k) / stride + 1 */
    int chw_input;        /* im2col only: x is NCHW rather than NHWC */
} hs_conv_geom;

/* The residual shortcut from x (h x w x c) to y (oh x ow x oc), oc >= c, h = (oh - 1) stride + 1
 * or more. */
typedef struct hs_shortcut_geom {
    int c, h, w, oc, oh, ow, stride;
} hs_shortcut_geom;

/* One example of a training set for gather: c x h x w floats, channel-major in the set. */
typedef struct hs_gather_geom {
    int c, h, w;
    int nhwc; /* write the batch channels-last, as a model whose input goes NHWC wants it */
    int pad;  /* the crop's zero border when augmenting (HS_AUGMENT_PAD, hearsay/data.h) */
} hs_gather_geom;

/* Running totals of softmax_xent_acc over the steps since the buffer was last zeroed: a few
 * bytes of backend memory (alloc'd zeroed by the caller) that a training loop reads back only
 * where it needs a value, with xent_read. All zero is the empty state. */
typedef struct hs_xent_acc {
    double loss;          /* the sum over the calls of each call's mean loss (loss sum / m) */
    double nonfinite_loss; /* the mean loss of call nonfinite_call */
    int64_t correct;      /* rows whose arg-max was their label */
    int64_t rows;
    int64_t calls;
    int64_t nonfinite_call; /* the first call (from 1) whose mean loss was not finite; 0: none */
    int64_t bad_call;       /* the first call (from 1) with a label outside [0, k); 0: none */
    int32_t bad_row, bad_label, bad_classes; /* of that call: row, label and k */
    int32_t reserved;
} hs_xent_acc;

typedef struct hs_backend_ops {
    const char *name;

    /* Memory. alloc returns zeroed backend memory of `bytes` bytes (owned by the caller, freed
     * with free). upload/download/copy move bytes between host and backend memory or within
     * the backend. upload and download have completed when they return; copy (backend to
     * backend memory) is ordered before every later op and may still be running on a device
     * backend, which no caller can tell (the host sees backend memory only by download). */
    int (*alloc)(hs_backend *be, size_t bytes, void **out);
    void (*free)(hs_backend *be, void *p); /* accepts NULL */
    int (*upload)(hs_backend *be, void *dst, const void *src_host, size_t bytes);
    int (*download)(hs_backend *be, void *dst_host, const void *src, size_t bytes);
    int (*copy)(hs_backend *be, void *dst, const void *src, size_t bytes);
    int (*sync)(hs_backend *be);

    /* C[m x n] = alpha * op(A) * op(B) + beta * C, row-major; op(A) is m x k, op(B) is k x n;
     * trans_* != 0 selects the transpose. lda/ldb/ldc are row strides in elements. */
    int (*gemm)(hs_backend *be, int trans_a, int trans_b, int m, int n, int k, float alpha,
                const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc);

    /* Vector ops on device vectors of n floats. */
    int (*fill)(hs_backend *be, float *x, size_t n, float v);
    int (*scale)(hs_backend *be, float *x, size_t n, float a);                     /* x *= a */
    int (*axpy)(hs_backend *be, float *y, const float *x, size_t n, float a);      /* y += a x */
    int (*axpby)(hs_backend *be, float *y, const float *x, size_t n, float a, float b); /* y = a x + b y */
    /* Dot product accumulated in double, returned to the host. */
    int (*dot)(hs_backend *be, const float *x, const float *y, size_t n, double *out);

    /* Layers. y[m x n] += b[n] on every row. */
    int (*bias_add)(hs_backend *be, float *y, const float *b, int m, int n);
    /* db[n] = sum over the m rows of dy[m x n]. */
    int (*bias_grad)(hs_backend *be, float *db, const float *dy, int m, int n);
    /* y = max(x, 0); y may alias x. */
    int (*relu)(hs_backend *be, float *y, const float *x, size_t n);
    /* dx = dy where y > 0, else 0; dx may alias dy. y is the ReLU's output. */
    int (*relu_grad)(hs_backend *be, float *dx, const float *dy, const float *y, size_t n);
    /* Softmax cross-entropy over rows of logits[m x k] with labels[m] (int32, device memory,
     * each in [0, k)). Returns the summed loss and the number of rows whose arg-max equals the
     * label to the host. When dlogits is non-NULL it receives grad_scale * (softmax - onehot);
     * dlogits may alias logits. */
    int (*softmax_xent)(hs_backend *be, float *logits, const int32_t *labels, int m, int k,
                        float *dlogits, float grad_scale, double *loss_sum, int *correct);
    /* softmax_xent for a training step whose loss the host does not wait for: the call's mean
     * loss, correct count and rows are added to *acc (backend memory), and a bad label or a
     * non-finite mean loss is recorded there (the first of each) instead of returned. Nothing
     * is copied to the host and nothing waits, so a device backend can queue the next step's
     * work behind it. A backend whose memory is the host's may also return a bad label at once,
     * as softmax_xent does (the CPU does: its behaviour is then exactly softmax_xent's). */
    int (*softmax_xent_acc)(hs_backend *be, float *logits, const int32_t *labels, int m, int k,
                            float *dlogits, float grad_scale, hs_xent_acc *acc);
    /* Copies *acc (backend memory) to *out (host) and, when reset is non-zero, zeroes *acc: the
     * one point where the accumulated steps are waited for (one small copy through page-locked
     * memory on CUDA). */
    int (*xent_read)(hs_backend *be, hs_xent_acc *acc, hs_xent_acc *out, int reset);
    /* One SGD step on n parameters: x, gradient g, velocity v (may be NULL if momentum is 0). */
    int (*sgd_step)(hs_backend *be, float *x, const float *g, float *v, size_t n,
                    const hs_sgd_hparams *h);

    /* Releases the backend's private state; called by hs_backend_close. */
    void (*destroy)(hs_backend *be);

    /* ---------------------------------------------------------- optional: optimizers
     * One AdamW step (hs_ew_adamw on every element) on n parameters x with gradient g and
     * moments m, v (device vectors). NULL: the backend refuses --optimizer adamw. */
    int (*adamw_step)(hs_backend *be, float *x, const float *g, float *m, float *v, size_t n,
                      const hs_adamw_hparams *h);

    /* ---------------------------------------------------------- optional: convolutional layers
     * Activations are NHWC (channels last) so that a convolution is a GEMM over im2col rows
     * of any number of examples (the model lowers a host batch a few examples at a time, a
     * device batch whole); entries are last in the table so a backend that predates them
     * leaves them NULL, and a model needing one refuses that backend at creation. n is the
     * number of examples in the call. */

    /* col[(n * oh * ow) x (k * k * c)] from x: row (b, i, j) holds the k x k x c patch at
     * output position (i, j), ordered (kh, kw, channel); zero outside the padded border. x is
     * NHWC, or NCHW when g->chw_input (the raw input of a model). */
    int (*im2col)(hs_backend *be, const float *x, const struct hs_conv_geom *g, int n,
                  float *col);
    /* dx (NHWC, overwritten) = the sum of the col rows' entries back at their positions. */
    int (*col2im)(hs_backend *be, const float *col, const struct hs_conv_geom *g, int n,
                  float *dx);
    /* y[n, oh, ow, c] = max over the k x k window (no padding); arg receives the index in x of
     * each maximum (the first, in window order) for the backward pass. */
    int (*maxpool)(hs_backend *be, const float *x, const struct hs_conv_geom *g, int n, float *y,
                   int32_t *arg);
    /* dx (overwritten) = dy scattered to arg. */
    int (*maxpool_grad)(hs_backend *be, const float *dy, const int32_t *arg,
                        const struct hs_conv_geom *g, int n, float *dx);
    /* y[n, c] = mean of x[n, :, c] over hw positions; and its gradient dx = dy / hw. */
    int (*avgpool)(hs_backend *be, const float *x, int n, int hw, int c, float *y);
    int (*avgpool_grad)(hs_backend *be, const float *dy, int n, int hw, int c, float *dx);
    /* Group normalisation of x[n, hw, c] over `groups` groups of c / groups channels, then the
     * affine gamma, beta per channel; mean and rstd (n * groups) are kept for the gradient. */
    int (*groupnorm)(hs_backend *be, const float *x, int n, int hw, int c, int groups, float eps,
                     const float *gamma, const float *beta, float *y, float *mean, float *rstd);
    /* dx (overwritten), dgamma and dbeta (overwritten) from dy and the forward's x, mean, rstd. */
    int (*groupnorm_grad)(hs_backend *be, const float *dy, const float *x, int n, int hw, int c,
                          int groups, const float *gamma, const float *mean, const float *rstd,
                          float *dx, float *dgamma, float *dbeta);
    /* The residual shortcut (He et al.'s option A): y[b, i, j, ch] += x[b, i s, j s, ch] for
     * ch < s->c, where y is s->oh x s->ow x s->oc and x s->h x s->w x s->c; channels of y past
     * x's get nothing (zero padding). shortcut_grad overwrites dx with the adjoint. */
    int (*shortcut_add)(hs_backend *be, float *y, const float *x, const struct hs_shortcut_geom *s,
                        int n);
    int (*shortcut_grad)(hs_backend *be, float *dx, const float *dy,
                         const struct hs_shortcut_geom *s, int n);

    /* ---------------------------------------------------------- optional: data on the device
     * A training shard kept in backend memory, so that drawing a batch needs nothing from the
     * host (src/model/devshard.c). NULL: batches are gathered on the host and uploaded. */

    /* For i < n, with k = idx[i]: row i of x (c x h x w floats; NHWC when g->nhwc, else
     * channel-major) = example k of src (channel-major rows of c x h x w floats), and
     * y[i] = labels[k]. When aug is non-NULL the example is cropped and flipped as
     * hs_augment_apply does (hearsay/data.h) with dy = aug[3k], dx = aug[3k + 1],
     * flip = aug[3k + 2] and g->pad. Every pointer is backend memory. */
    int (*gather)(hs_backend *be, const float *src, const uint8_t *labels, const uint32_t *idx,
                  const uint8_t *aug, const struct hs_gather_geom *g, int n, float *x,
                  int32_t *y);
    /* Page-locked host memory (zeroed), which copies to and from the device reach without a
     * staging copy; host_free accepts NULL. NULL entries: ordinary malloc'd memory serves. */
    int (*host_alloc)(hs_backend *be, size_t bytes, void **out);
    void (*host_free)(hs_backend *be, void *p);

    /* ---------------------------------------------------------- optional: convolution lowering
     * rows[(n * (oh + k - 1) * ow) x (k * c)] for a stride-1 g: row (b, r, j) holds the kernel
     * row x[b, r - pad, j - pad + kw, :] for kw < k, ordered (kw, channel), zero outside the
     * image. Kernel row kh of im2col's row (b, i, j) is row (b, i + kh, j), so a stride-1
     * convolution is k GEMMs over blocks of these rows shifted by ow (K = k c each), from k
     * times fewer floats than im2col writes. NULL: the model lowers with im2col alone. */
    int (*im2row)(hs_backend *be, const float *x, const struct hs_conv_geom *g, int n,
                  float *rows);

    /* ---------------------------------------------------------- optional: fused layers
     * One pass where the model would make two over the same activations; NULL: it makes two.
     * groupnorm_relu: groupnorm, then max(., 0) on every output (the ReLU after it). */
    int (*groupnorm_relu)(hs_backend *be, const float *x, int n, int hw, int c, int groups,
                          float eps, const float *gamma, const float *beta, float *y,
                          float *mean, float *rstd);
    /* y = a + the shortcut of x as shortcut_add adds it (a, y: s->oh x s->ow x s->oc), then
     * max(., 0) when relu; y may alias a. The same bits as copying a to y, shortcut_add and
     * relu. */
    int (*shortcut_sum)(hs_backend *be, float *y, const float *a, const float *x,
                        const struct hs_shortcut_geom *s, int n, int relu);

    /* ---------------------------------------------------------- optional: gossip on the device
     * Compression primitives and the algorithms' per-round vector work on backend vectors
     * (src/tensor/gossip_ops.h). NULL: gossip works on a host copy of the vectors. */
    const struct hs_gossip_ops *gossip;

    /* ---------------------------------------------------------- optional: GEMM precision
     * Switches gemm to precision p (an hs_precision, checked by hs_backend_set_precision).
     * NULL: FP32 is the backend's only arithmetic. */
    int (*set_precision)(hs_backend *be, int p);

    /* ---------------------------------------------------------- optional: fused backward
     * groupnorm_grad of dy taken through the ReLU whose output y (the groupnorm_relu output)
     * it is: the result of relu_grad(dy, y) then groupnorm_grad, without writing the masked
     * dy (dy is left as it was). NULL: the model makes the two passes. */
    int (*groupnorm_relu_grad)(hs_backend *be, const float *dy, const float *y, const float *x,
                               int n, int hw, int c, int groups, const float *gamma,
                               const float *mean, const float *rstd, float *dx, float *dgamma,
                               float *dbeta);
} hs_backend_ops;

struct hs_backend {
    const hs_backend_ops *ops;
    hs_device device;
    int host_memory; /* backend memory is host memory: a pointer may be used by the CPU */
    int threads;     /* CPU: lanes a model splits a batch into (0 or 1: none) */
    void *priv;      /* the backend's own state */
    void *module;    /* dlopen handle of a loaded backend module, or NULL */
    char description[128]; /* "cpu (OpenBLAS 0.3.21, 2 threads)", "cuda (NVIDIA H100, sm_90)" */
    /* Host memory from ops->host_alloc (page-locked on CUDA; malloc without one) through which
     * gossip messages cross (src/compress/device.c), grown on demand; hs_backend_close frees
     * it. Used by the one thread that uses the backend. */
    void *stage;
    size_t stage_bytes;
};

/* The arithmetic of a backend's GEMMs (--precision; hs_backend_set_precision). Parameters,
 * gradients, optimizer state and every other op stay FP32 whatever the choice: the flat FP32
 * vector is what the algorithms see. FP32 is the only precision of the CPU backend. */
typedef enum hs_precision {
    HS_PRECISION_FP32 = 0, /* plain FP32 GEMM */
    HS_PRECISION_TF32 = 1, /* CUDA: FP32 GEMM on the tensor cores (inputs rounded to TF32) */
    HS_PRECISION_BF16 = 2, /* CUDA: GEMM inputs rounded to BF16, FP32 products and sums */
} hs_precision;

typedef struct hs_backend_cfg {
    int threads;   /* CPU: > 1 splits batches into lanes; <= 0 leaves OpenBLAS its default */
    int device_id; /* CUDA device ordinal */
} hs_backend_cfg;

/* Parses "fp32", "tf32" or "bf16"; HS_EINVAL with a message naming the text. */
int hs_precision_parse(const char *s, hs_precision *out);
const char *hs_precision_name(hs_precision p);

/* Opens a backend. HS_ENODEV with a message when the device or the module is not there
 * ("--device cuda: no CUDA device found (cudaGetDeviceCount: ...)"); HS_ENOTSUP when this
 * build has no such backend. *out is returned owned. */
int hs_backend_open(hs_backend **out, hs_device device, const hs_backend_cfg *cfg);

/* Accepts NULL. */
void hs_backend_close(hs_backend *be);

/* Sets the precision of be's GEMMs from now on (a backend opens in FP32). HS_EINVAL with a
 * message when the backend has no such arithmetic: the CPU backend has FP32 only. */
int hs_backend_set_precision(hs_backend *be, hs_precision p);

/* The highest CUDA device number "cuda:N" accepts. */
#define HS_DEVICE_ID_MAX 1023

/* Parses "cpu", "cuda" or "cuda:N" (N in 0..HS_DEVICE_ID_MAX, digits only) into *out and the
 * device number into *device_id (0 unless given; for hs_backend_cfg.device_id). A NULL
 * device_id refuses "cuda:N". HS_EINVAL with a message naming the text. */
int hs_device_parse_id(const char *s, hs_device *out, int *device_id);
/* hs_device_parse_id(s, out, NULL): "cpu" or "cuda". */
int hs_device_parse(const char *s, hs_device *out);
const char *hs_device_name(hs_device d);

/* Comma-separated names of the backends built in ("cpu,cuda"). Static string. */
const char *hs_backends_built(void);

/* Convenience wrappers. */
static inline int hs_be_alloc_f(hs_backend *be, size_t n, float **out) {
    return be->ops->alloc(be, n * sizeof(float), (void **)out);
}
static inline void hs_be_free(hs_backend *be, void *p) { be->ops->free(be, p); }
static inline int hs_be_upload(hs_backend *be, void *dst, const void *src, size_t bytes) {
    return be->ops->upload(be, dst, src, bytes);
}
static inline int hs_be_download(hs_backend *be, void *dst, const void *src, size_t bytes) {
    return be->ops->download(be, dst, src, bytes);
}
static inline int hs_be_copy_f(hs_backend *be, float *dst, const float *src, size_t n) {
    return be->ops->copy(be, dst, src, n * sizeof(float));
}
static inline int hs_be_axpy(hs_backend *be, float *y, const float *x, size_t n, float a) {
    return be->ops->axpy(be, y, x, n, a);
}
static inline int hs_be_scale(hs_backend *be, float *x, size_t n, float a) {
    return be->ops->scale(be, x, n, a);
}
static inline int hs_be_dot(hs_backend *be, const float *x, const float *y, size_t n,
                            double *out) {
    return be->ops->dot(be, x, y, n, out);
}

#ifdef __cplusplus
}
#endif
#endif
