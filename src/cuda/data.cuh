/* Host launcher of the device shard's gather kernel (src/cuda/data.cu), for backend_cuda.cu.
 * CUDA C++ only. Computes what hs_backend_ops.gather defines (include/hearsay/tensor.h),
 * enqueued on stream `st`; returns the launch status. Pointers are device memory; n >= 1. */
#ifndef HS_CUDA_DATA_CUH
#define HS_CUDA_DATA_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "hearsay/tensor.h"

cudaError_t hs__cuda_gather(cudaStream_t st, const float *src, const uint8_t *labels,
                            const uint32_t *idx, const uint8_t *aug, const hs_gather_geom *g,
                            int n, float *x, int32_t *y);

#endif
