/* Kernels of the algorithms' per-round vector work on the device (the vector entries of
 * hs_gossip_ops, src/tensor/gossip_ops.h) and their launchers (gossip.cuh).
 *
 * Each element gets the CPU loop's IEEE operations in the CPU's order, one per statement, and
 * the module is built with --fmad=false, so no multiply-add is fused: the outputs are the CPU's
 * bits (choco.c's sub, algo.c's hs__acc_diff and hs__step_sq, beer.c's track and step_model,
 * sgp.c's scalings). The sums of squares are statistics: each block adds its elements' squares
 * in double in a fixed tree, and one block adds the blocks' partial sums in block order, so the
 * value is the same on every run (not the CPU's float-lane value, which rounds more: see
 * src/tensor/gossip_ops.h). */
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "cuda/gossip.cuh"

#define GV_THREADS 256
#define GV_WARPS (GV_THREADS / 32)
/* The sums' grid: at most this many partial sums, each block taking a grid-stride share. */
#define GV_SUM_BLOCKS 256u
#define GV_MAX_BLOCKS 65535u
#define GV_FULL_MASK 0xffffffffu

#define GV_GRID_STRIDE(i, n)                                                                       \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                        \
         i += (size_t)blockDim.x * gridDim.x)

static unsigned grid_for(size_t n, unsigned cap) {
    size_t b = (n + GV_THREADS - 1) / GV_THREADS;
    return b < cap ? (unsigned)(b ? b : 1) : cap;
}

/* The block's sum of v (every thread calls), valid in thread 0: warps by shuffle-down, then
 * thread 0 adds the warps' sums in warp order. */
static __device__ double block_sum_f64(double v, double *sh) {
    for (int h = 16; h > 0; h >>= 1) v = v + __shfl_down_sync(GV_FULL_MASK, v, h);
    if ((threadIdx.x & 31u) == 0) sh[threadIdx.x >> 5] = v;
    __syncthreads();
    double s = 0.0;
    if (threadIdx.x == 0)
        for (int w = 0; w < GV_WARPS; w++) s = s + sh[w];
    return s;
}

/* One block: *out = the partial sums in block order. */
static __global__ void sum_partials_kernel(const double *part, unsigned n, double *out) {
    if (threadIdx.x == 0) {
        double s = 0.0;
        for (unsigned b = 0; b < n; b++) s = s + part[b];
        *out = s;
    }
}

static __global__ void sub_kernel(float *out, const float *x, const float *y, size_t n) {
    GV_GRID_STRIDE(i, n) out[i] = x[i] - y[i];
}

static __global__ void acc_diff_kernel(float *acc, const float *a, const float *b, size_t n,
                                       float w) {
    GV_GRID_STRIDE(i, n) {
        float t = a[i] - b[i];
        float u = w * t;
        acc[i] = acc[i] + u;
    }
}

static __global__ void scale_to_kernel(float *out, const float *x, size_t n, float a) {
    GV_GRID_STRIDE(i, n) out[i] = x[i] * a;
}

/* x += g m; part[block] = the block's sum of m^2. */
static __global__ void step_sq_kernel(float *x, const float *m, float g, size_t n, double *part) {
    __shared__ double sh[GV_WARPS];
    double sq = 0.0;
    GV_GRID_STRIDE(i, n) {
        float mi = m[i];
        float t = g * mi;
        x[i] = x[i] + t;
        sq = sq + (double)mi * (double)mi;
    }
    double s = block_sum_f64(sq, sh);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}

/* part[block] = the block's sum of x^2 (x unchanged). */
static __global__ void sumsq_kernel(const float *x, size_t n, double *part) {
    __shared__ double sh[GV_WARPS];
    double sq = 0.0;
    GV_GRID_STRIDE(i, n) {
        double xi = (double)x[i];
        sq = sq + xi * xi;
    }
    double s = block_sum_f64(sq, sh);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}

static __global__ void beer_track_kernel(float *v, float *s_prev, float *dg, const float *mg,
                                         const float *g, float gamma, const float *xr,
                                         const float *x, size_t n) {
    GV_GRID_STRIDE(i, n) {
        float st = xr[i] - x[i];
        /* v + gamma mg + (st - s_prev), left to right as C evaluates it. */
        float t = gamma * mg[i];
        float u = v[i] + t;
        float vi = u + (st - s_prev[i]);
        v[i] = vi;
        s_prev[i] = st;
        dg[i] = vi - g[i];
    }
}

static __global__ void beer_step_kernel(float *x, float *dh, const float *xr, const float *mh,
                                        const float *v, const float *h, float gamma, size_t n,
                                        double *part) {
    __shared__ double sh[GV_WARPS];
    double sq = 0.0;
    GV_GRID_STRIDE(i, n) {
        float mi = mh[i];
        float t = gamma * mi;
        float xi = (xr[i] + t) - v[i];
        x[i] = xi;
        dh[i] = xi - h[i];
        sq = sq + (double)mi * (double)mi;
    }
    double s = block_sum_f64(sq, sh);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}

/* After a kernel that left one partial sum per block of its grid in part: their total into
 * *sq (host), enqueued. */
static cudaError_t sum_to_host(cudaStream_t st, double *part, unsigned grid, double *sq) {
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    double *dsum = part + GV_SUM_BLOCKS;
    sum_partials_kernel<<<1, 32, 0, st>>>(part, grid, dsum);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    return cudaMemcpyAsync(sq, dsum, sizeof(double), cudaMemcpyDeviceToHost, st);
}

size_t hs__cuda_gossip_sum_scratch(void) { return (GV_SUM_BLOCKS + 1) * sizeof(double); }

cudaError_t hs__cuda_sub(cudaStream_t st, float *out, const float *x, const float *y, size_t n) {
    sub_kernel<<<grid_for(n, GV_MAX_BLOCKS), GV_THREADS, 0, st>>>(out, x, y, n);
    return cudaGetLastError();
}

cudaError_t hs__cuda_acc_diff(cudaStream_t st, float *acc, const float *a, const float *b,
                              size_t n, float w) {
    acc_diff_kernel<<<grid_for(n, GV_MAX_BLOCKS), GV_THREADS, 0, st>>>(acc, a, b, n, w);
    return cudaGetLastError();
}

cudaError_t hs__cuda_scale_to(cudaStream_t st, float *out, const float *x, size_t n, float a) {
    scale_to_kernel<<<grid_for(n, GV_MAX_BLOCKS), GV_THREADS, 0, st>>>(out, x, n, a);
    return cudaGetLastError();
}

cudaError_t hs__cuda_step_sq(cudaStream_t st, float *x, const float *m, float g, size_t n,
                             void *scratch, double *sq) {
    double *part = (double *)scratch;
    unsigned grid = grid_for(n, GV_SUM_BLOCKS);
    step_sq_kernel<<<grid, GV_THREADS, 0, st>>>(x, m, g, n, part);
    return sum_to_host(st, part, grid, sq);
}

cudaError_t hs__cuda_sumsq(cudaStream_t st, const float *x, size_t n, void *scratch,
                           double *sq) {
    double *part = (double *)scratch;
    unsigned grid = grid_for(n, GV_SUM_BLOCKS);
    sumsq_kernel<<<grid, GV_THREADS, 0, st>>>(x, n, part);
    return sum_to_host(st, part, grid, sq);
}

cudaError_t hs__cuda_beer_track(cudaStream_t st, float *v, float *s_prev, float *dg,
                                const float *mg, const float *g, float gamma, const float *xr,
                                const float *x, size_t n) {
    beer_track_kernel<<<grid_for(n, GV_MAX_BLOCKS), GV_THREADS, 0, st>>>(v, s_prev, dg, mg, g,
                                                                          gamma, xr, x, n);
    return cudaGetLastError();
}

cudaError_t hs__cuda_beer_step(cudaStream_t st, float *x, float *dh, const float *xr,
                               const float *mh, const float *v, const float *h, float gamma,
                               size_t n, void *scratch, double *sq) {
    double *part = (double *)scratch;
    unsigned grid = grid_for(n, GV_SUM_BLOCKS);
    beer_step_kernel<<<grid, GV_THREADS, 0, st>>>(x, dh, xr, mh, v, h, gamma, n, part);
    return sum_to_host(st, part, grid, sq);
}
