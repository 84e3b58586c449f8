/* Host launchers of the convolutional-layer kernels (src/cuda/conv.cu), for backend_cuda.cu.
 * CUDA C++ only. Each launcher computes what the hs_backend_ops entry of the same name defines
 * (include/hearsay/tensor.h), enqueued on stream `st`, and returns the launch status. Pointers
 * are device memory; activations are NHWC; n >= 1 and every dimension >= 1 (the caller returns
 * early otherwise). None needs scratch memory. */
#ifndef HS_CUDA_CONV_CUH
#define HS_CUDA_CONV_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "hearsay/tensor.h"

cudaError_t hs__cuda_im2col(cudaStream_t st, const float *x, const hs_conv_geom *g, int n,
                            float *col);
cudaError_t hs__cuda_col2im(cudaStream_t st, const float *col, const hs_conv_geom *g, int n,
                            float *dx);
cudaError_t hs__cuda_maxpool(cudaStream_t st, const float *x, const hs_conv_geom *g, int n,
                             float *y, int32_t *arg);
cudaError_t hs__cuda_maxpool_grad(cudaStream_t st, const float *dy, const int32_t *arg,
                                  const hs_conv_geom *g, int n, float *dx);
cudaError_t hs__cuda_avgpool(cudaStream_t st, const float *x, int n, int hw, int c, float *y);
cudaError_t hs__cuda_avgpool_grad(cudaStream_t st, const float *dy, int n, int hw, int c,
                                  float *dx);
cudaError_t hs__cuda_groupnorm(cudaStream_t st, const float *x, int n, int hw, int c, int groups,
                               float eps, const float *gamma, const float *beta, float *y,
                               float *mean, float *rstd);
cudaError_t hs__cuda_groupnorm_grad(cudaStream_t st, const float *dy, const float *x, int n,
                                    int hw, int c, int groups, const float *gamma,
                                    const float *mean, const float *rstd, float *dx,
                                    float *dgamma, float *dbeta);
cudaError_t hs__cuda_shortcut_add(cudaStream_t st, float *y, const float *x,
                                  const hs_shortcut_geom *s, int n);
cudaError_t hs__cuda_shortcut_grad(cudaStream_t st, float *dx, const float *dy,
                                   const hs_shortcut_geom *s, int n);
/* The fused ops (the hs_backend_ops entries of the same names). */
cudaError_t hs__cuda_groupnorm_relu(cudaStream_t st, const float *x, int n, int hw, int c,
                                    int groups, float eps, const float *gamma, const float *beta,
                                    float *y, float *mean, float *rstd);
cudaError_t hs__cuda_shortcut_sum(cudaStream_t st, float *y, const float *a, const float *x,
                                  const hs_shortcut_geom *s, int n, int relu);
cudaError_t hs__cuda_groupnorm_relu_grad(cudaStream_t st, const float *dy, const float *y,
                                         const float *x, int n, int hw, int c, int groups,
                                         const float *gamma, const float *mean,
                                         const float *rstd, float *dx, float *dgamma,
                                         float *dbeta);

#endif
