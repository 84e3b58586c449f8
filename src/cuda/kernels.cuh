/* Host launchers of the CUDA backend's kernels (src/cuda/kernels.cu), for backend_cuda.cu.
 * CUDA C++ only: the C side reaches the backend through its ops table, never through this.
 *
 * Every launcher enqueues its work on stream `st` and returns the launch status, so a bad
 * configuration is reported at once and an execution error at the next synchronisation.
 * Pointers are device memory. Sizes of 0 launch nothing. Launchers that need scratch take it
 * from the caller, sized by the matching *_scratch function (device memory, 256-byte aligned,
 * contents undefined, not touched by anyone else until the stream has run the launch). */
#ifndef HS_CUDA_KERNELS_CUH
#define HS_CUDA_KERNELS_CUH

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "hearsay/tensor.h"

/* What a reduction returns to the host, in one small device buffer. */
struct hs_cuda_result {
    double sum;    /* dot product, or the summed softmax cross-entropy loss */
    int count;     /* softmax: rows whose arg-max is the label */
    int first_bad; /* softmax: first row whose label is out of range, or -1 */
};

/* x[i] = v */
cudaError_t hs__cuda_fill(cudaStream_t st, float *x, size_t n, float v);
/* x[i] = a * x[i] */
cudaError_t hs__cuda_scale(cudaStream_t st, float *x, size_t n, float a);
/* y[i] = hs_ew_axpy(y[i], a, x[i]) */
cudaError_t hs__cuda_axpy(cudaStream_t st, float *y, const float *x, size_t n, float a);
/* y[i] = hs_ew_axpby(y[i], a, x[i], b) */
cudaError_t hs__cuda_axpby(cudaStream_t st, float *y, const float *x, size_t n, float a,
                           float b);
/* y[i] = hs_ew_relu(x[i]); y may alias x. */
cudaError_t hs__cuda_relu(cudaStream_t st, float *y, const float *x, size_t n);
/* dx[i] = hs_ew_relu_grad(dy[i], y[i]); dx may alias dy. */
cudaError_t hs__cuda_relu_grad(cudaStream_t st, float *dx, const float *dy, const float *y,
                               size_t n);
/* hs_ew_sgd on every element; v is read and written only when mu != 0 (then non-NULL). */
cudaError_t hs__cuda_sgd(cudaStream_t st, float *x, const float *g, float *v, size_t n, float lr,
                         float mu, float wd, int nesterov);
/* hs_ew_adamw on every element (the scalars as in hs_adamw_hparams). */
cudaError_t hs__cuda_adamw(cudaStream_t st, float *x, const float *g, float *m, float *v,
                           size_t n, float b1, float b2, float eps, float decay, float step_size,
                           float inv_sqrt_bc2);

/* y[m x n] += b[n] on every row (m, n >= 0). */
cudaError_t hs__cuda_bias_add(cudaStream_t st, float *y, const float *b, int m, int n);
/* c[m x n, row stride ldc] = beta * c, with beta == 0 writing zeros without reading c (BLAS's
 * rule, for GEMM with k == 0). */
cudaError_t hs__cuda_scale_matrix(cudaStream_t st, float *c, int m, int n, int ldc, float beta);

/* db[n] = column sums of dy[m x n] (m >= 0: m == 0 gives zeros). */
size_t hs__cuda_bias_grad_scratch(int m, int n);
cudaError_t hs__cuda_bias_grad(cudaStream_t st, float *db, const float *dy, int m, int n,
                               void *scratch);

/* out->sum = sum of (double)x[i] * y[i] (n >= 1). */
size_t hs__cuda_dot_scratch(size_t n);
cudaError_t hs__cuda_dot(cudaStream_t st, const float *x, const float *y, size_t n, void *scratch,
                         hs_cuda_result *out);

/* Softmax cross-entropy over rows of logits[m x k] (m >= 1, 1 <= k <= 2^30): out->sum is the
 * summed loss, out->count the rows classified correctly, out->first_bad the first row with a
 * label outside [0, k) (-1 when none; such rows add nothing and get no gradient). dlogits
 * (NULL: none) receives scale * (softmax - onehot) and may alias logits.
 * With acc non-NULL the result is also added to the running totals acc (hearsay/tensor.h),
 * on the device and in the same launches: the call's mean loss out->sum / m in double, as the
 * host added per-step means, and the first bad label and the first non-finite mean with the
 * call that had them; nothing returns to the host. */
size_t hs__cuda_xent_scratch(int m);
cudaError_t hs__cuda_softmax_xent(cudaStream_t st, float *logits, const int32_t *labels, int m,
                                  int k, float *dlogits, float scale, void *scratch,
                                  hs_cuda_result *out, hs_xent_acc *acc);

/* cudaSuccess when the current device can run this module's kernels (an image for its
 * architecture was compiled in); otherwise the error that every launch would give. */
cudaError_t hs__cuda_probe(void);

#endif
