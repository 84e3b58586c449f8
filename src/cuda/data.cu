/* The device shard's batch gather (declared in data.cuh): one thread per element of the batch
 * reads its source through hs_ew_gather_src, the expression the CPU backend uses, so a batch
 * drawn on the GPU is the host batcher's bit for bit (it only copies floats, or writes zeros).
 * Threading: the launcher only enqueues on its stream. */
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda/data.cuh"
#include "tensor/ew.h"

#define GATHER_THREADS 256
#define GATHER_MAX_BLOCKS 65535u

static __global__ void gather_kernel(const float *src, const uint8_t *labels,
                                     const uint32_t *idx, const uint8_t *aug, hs_gather_geom g,
                                     size_t dim, size_t total, float *x, int32_t *y) {
    for (size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x; t < total;
         t += (size_t)blockDim.x * gridDim.x) {
        size_t i = t / dim, e = t % dim;
        size_t k = idx[i];
        int dy = aug ? aug[3 * k] : g.pad, dx = aug ? aug[3 * k + 1] : g.pad;
        int flip = aug ? aug[3 * k + 2] : 0;
        long at = hs_ew_gather_src(&g, (long)e, dy, dx, flip);
        x[t] = at < 0 ? 0.0f : src[k * dim + (size_t)at];
        if (e == 0) y[i] = labels[k];
    }
}

cudaError_t hs__cuda_gather(cudaStream_t st, const float *src, const uint8_t *labels,
                            const uint32_t *idx, const uint8_t *aug, const hs_gather_geom *g,
                            int n, float *x, int32_t *y) {
    size_t dim = (size_t)g->c * g->h * g->w, total = dim * (size_t)n;
    size_t blocks = (total + GATHER_THREADS - 1) / GATHER_THREADS;
    unsigned grid = blocks < GATHER_MAX_BLOCKS ? (unsigned)blocks : GATHER_MAX_BLOCKS;
    gather_kernel<<<grid, GATHER_THREADS, 0, st>>>(src, labels, idx, aug, *g, dim, total, x, y);
    return cudaGetLastError();
}
