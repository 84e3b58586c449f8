/* The CUDA backend's kernels and their host launchers (declared in kernels.cuh).
 *
 * Element-wise arithmetic is src/tensor/ew.h, the very functions the CPU backend runs; with
 * --fmad=false nothing is fused into FMAs, so those ops give the CPU's bits exactly.
 * Reductions are deterministic: launch shapes depend only on the problem size (never on the
 * GPU's SM count), every thread adds its elements in a fixed order, blocks combine in a fixed
 * tree and a second pass combines the blocks in order. No atomics, so the same inputs give the
 * same bits on every run. Threading: launchers only enqueue on the stream they are given. */
#include <cuda_runtime.h>
#include <float.h>
#include <limits.h>
#include <stdint.h>

#include "cuda/kernels.cuh"
#include "tensor/ew.h"

/* Threads per block for every kernel here; the reductions' shared-memory trees assume it. */
#define HS_CUDA_THREADS 256
/* Grid cap of the element-wise kernels: enough blocks to fill any current GPU, and the
 * grid-stride loops cover longer vectors. */
#define HS_CUDA_MAX_BLOCKS 65535u
/* The dot product's first pass uses at most this many blocks (and the second pass adds their
 * partial sums). A constant, so the summation order depends on n alone. */
#define HS_CUDA_DOT_BLOCKS 1024u
/* bias_grad sums this many rows per thread in its first pass. Batches up to this size are
 * summed row by row from 0.0f, which is exactly cpu.c's order. */
#define HS_CUDA_BIAS_CHUNK 256
#define HS_CUDA_WARP 32
/* softmax_xent gives each row one warp. */
#define HS_CUDA_ROWS_PER_BLOCK (HS_CUDA_THREADS / HS_CUDA_WARP)

/* size_t indices throughout: vectors may exceed 2^31 elements. */
#define HS_GRID_STRIDE(i, n)                                                                       \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                        \
         i += (size_t)blockDim.x * gridDim.x)

static unsigned ew_grid(size_t n) {
    size_t b = (n + HS_CUDA_THREADS - 1) / HS_CUDA_THREADS;
    return b < HS_CUDA_MAX_BLOCKS ? (unsigned)b : HS_CUDA_MAX_BLOCKS;
}

static size_t align256(size_t bytes) { return (bytes + 255) & ~(size_t)255; }

/* ------------------------------------------------------------------ element-wise */

static __global__ void fill_kernel(float *x, size_t n, float v) {
    HS_GRID_STRIDE(i, n) x[i] = v;
}

static __global__ void scale_kernel(float *x, size_t n, float a) {
    HS_GRID_STRIDE(i, n) x[i] = a * x[i];
}

static __global__ void axpy_kernel(float *y, const float *x, size_t n, float a) {
    HS_GRID_STRIDE(i, n) y[i] = hs_ew_axpy(y[i], a, x[i]);
}

static __global__ void axpby_kernel(float *y, const float *x, size_t n, float a, float b) {
    HS_GRID_STRIDE(i, n) y[i] = hs_ew_axpby(y[i], a, x[i], b);
}

/* No __restrict__ on these: the outputs may alias the inputs (each element is read before it
 * is written, by the same thread). */
static __global__ void relu_kernel(float *y, const float *x, size_t n) {
    HS_GRID_STRIDE(i, n) y[i] = hs_ew_relu(x[i]);
}

static __global__ void relu_grad_kernel(float *dx, const float *dy, const float *y, size_t n) {
    HS_GRID_STRIDE(i, n) dx[i] = hs_ew_relu_grad(dy[i], y[i]);
}

/* Two instantiations so the plain-SGD one never touches v (which may be NULL), like cpu.c. */
template <bool kMomentum>
static __global__ void sgd_kernel(float *x, const float *g, float *v, size_t n, float lr,
                                  float mu, float wd, int nesterov) {
    HS_GRID_STRIDE(i, n) {
        float xi = x[i];
        if constexpr (kMomentum) {
            float vi = v[i];
            hs_ew_sgd(&xi, g[i], &vi, lr, mu, wd, nesterov);
            v[i] = vi;
        } else {
            float unused = 0.0f;
            hs_ew_sgd(&xi, g[i], &unused, lr, 0.0f, wd, nesterov);
        }
        x[i] = xi;
    }
}

static __global__ void adamw_kernel(float *x, const float *g, float *m, float *v, size_t n,
                                    float b1, float b2, float eps, float decay, float step_size,
                                    float inv_sqrt_bc2) {
    HS_GRID_STRIDE(i, n) {
        float xi = x[i], mi = m[i], vi = v[i];
        hs_ew_adamw(&xi, g[i], &mi, &vi, b1, b2, eps, decay, step_size, inv_sqrt_bc2);
        x[i] = xi;
        m[i] = mi;
        v[i] = vi;
    }
}

/* y[m x n] += b: element i is in column i % n. The same single IEEE add as cpu.c. */
static __global__ void bias_add_kernel(float *y, const float *b, size_t total, size_t n) {
    HS_GRID_STRIDE(i, total) y[i] = y[i] + b[i % n];
}

static __global__ void scale_matrix_kernel(float *c, size_t total, size_t n, size_t ldc,
                                           float beta) {
    HS_GRID_STRIDE(i, total) {
        float *p = c + (i / n) * ldc + i % n;
        *p = beta == 0.0f ? 0.0f : beta * *p;
    }
}

cudaError_t hs__cuda_fill(cudaStream_t st, float *x, size_t n, float v) {
    if (!n) return cudaSuccess;
    fill_kernel<<<ew_grid(n), HS_CUDA_THREADS, 0, st>>>(x, n, v);
    return cudaGetLastError();
}

cudaError_t hs__cuda_scale(cudaStream_t st, float *x, size_t n, float a) {
    if (!n) return cudaSuccess;
    scale_kernel<<<ew_grid(n), HS_CUDA_THREADS, 0, st>>>(x, n, a);
    return cudaGetLastError();
}

cudaError_t hs__cuda_axpy(cudaStream_t st, float *y, const float *x, size_t n, float a) {
    if (!n) return cudaSuccess;
    axpy_kernel<<<ew_grid(n), HS_CUDA_THREADS, 0, st>>>(y, x, n, a);
    return cudaGetLastError();
}

cudaError_t hs__cuda_axpby(cudaStream_t st, float *y, const float *x, size_t n, float a,
                           float b) {
    if (!n) return cudaSuccess;
    axpby_kernel<<<ew_grid(n), HS_CUDA_THREADS, 0, st>>>(y, x, n, a, b);
    return cudaGetLastError();
}

cudaError_t hs__cuda_relu(cudaStream_t st, float *y, const float *x, size_t n) {
    if (!n) return cudaSuccess;
    relu_kernel<<<ew_grid(n), HS_CUDA_THREADS, 0, st>>>(y, x, n);
    return cudaGetLastError();
}

cudaError_t hs__cuda_relu_grad(cudaStream_t st, float *dx, const float *dy, const float *y,
                               size_t n) {
    if (!n) return cudaSuccess;
    relu_grad_kernel<<<ew_grid(n), HS_CUDA_THREADS, 0, st>>>(dx, dy, y, n);
    return cudaGetLastError();
}

cudaError_t hs__cuda_sgd(cudaStream_t st, float *x, const float *g, float *v, size_t n, float lr,
                         float mu, float wd, int nesterov) {
    if (!n) return cudaSuccess;
    if (mu != 0.0f)
        sgd_kernel<true><<<ew_grid(n), HS_CUDA_THREADS, 0, st>>>(x, g, v, n, lr, mu, wd, nesterov);
    else
        sgd_kernel<false><<<ew_grid(n), HS_CUDA_THREADS, 0, st>>>(x, g, v, n, lr, mu, wd,
                                                                  nesterov);
    return cudaGetLastError();
}

cudaError_t hs__cuda_adamw(cudaStream_t st, float *x, const float *g, float *m, float *v,
                           size_t n, float b1, float b2, float eps, float decay, float step_size,
                           float inv_sqrt_bc2) {
    if (!n) return cudaSuccess;
    adamw_kernel<<<ew_grid(n), HS_CUDA_THREADS, 0, st>>>(x, g, m, v, n, b1, b2, eps, decay,
                                                         step_size, inv_sqrt_bc2);
    return cudaGetLastError();
}

cudaError_t hs__cuda_bias_add(cudaStream_t st, float *y, const float *b, int m, int n) {
    if (m <= 0 || n <= 0) return cudaSuccess;
    size_t total = (size_t)m * (size_t)n;
    bias_add_kernel<<<ew_grid(total), HS_CUDA_THREADS, 0, st>>>(y, b, total, (size_t)n);
    return cudaGetLastError();
}

cudaError_t hs__cuda_scale_matrix(cudaStream_t st, float *c, int m, int n, int ldc, float beta) {
    if (m <= 0 || n <= 0) return cudaSuccess;
    size_t total = (size_t)m * (size_t)n;
    scale_matrix_kernel<<<ew_grid(total), HS_CUDA_THREADS, 0, st>>>(c, total, (size_t)n,
                                                                     (size_t)ldc, beta);
    return cudaGetLastError();
}

/* ------------------------------------------------------------------ reductions */

/* Sums v over the block (HS_CUDA_THREADS threads, all of which must call this) in a fixed
 * tree; the result is valid in every thread. */
static __device__ double block_sum(double v, double *sh) {
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int s = HS_CUDA_THREADS / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
        __syncthreads();
    }
    return sh[0];
}

/* bias_grad, pass 1: thread j sums column j over one chunk of rows, in row order from 0.0f.
 * Adjacent threads read adjacent columns, so each row's loads are coalesced. */
static __global__ void bias_grad_partial_kernel(const float *dy, int m, int n, int chunks,
                                                float *part) {
    long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= n) return;
    for (long long c = blockIdx.y; c < chunks; c += gridDim.y) {
        long long r0 = c * HS_CUDA_BIAS_CHUNK;
        long long r1 = r0 + HS_CUDA_BIAS_CHUNK < m ? r0 + HS_CUDA_BIAS_CHUNK : m;
        float acc = 0.0f;
        for (long long r = r0; r < r1; r++) acc += dy[(size_t)r * (size_t)n + (size_t)j];
        part[(size_t)c * (size_t)n + (size_t)j] = acc;
    }
}

/* bias_grad, pass 2: the chunks' sums of column j, in chunk order. */
static __global__ void bias_grad_final_kernel(const float *part, int chunks, int n, float *db) {
    long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= n) return;
    float acc = 0.0f;
    for (long long c = 0; c < chunks; c++) acc += part[(size_t)c * (size_t)n + (size_t)j];
    db[j] = acc;
}

static int bias_chunks(int m) {
    return (int)(((long long)m + HS_CUDA_BIAS_CHUNK - 1) / HS_CUDA_BIAS_CHUNK);
}

size_t hs__cuda_bias_grad_scratch(int m, int n) {
    int chunks = bias_chunks(m);
    return chunks > 1 && n > 0 ? (size_t)chunks * (size_t)n * sizeof(float) : 0;
}

cudaError_t hs__cuda_bias_grad(cudaStream_t st, float *db, const float *dy, int m, int n,
                               void *scratch) {
    if (n <= 0) return cudaSuccess;
    if (m <= 0) return cudaMemsetAsync(db, 0, sizeof(float) * (size_t)n, st);
    int chunks = bias_chunks(m);
    /* One chunk: pass 1 already has the final sums. */
    float *part = chunks > 1 ? (float *)scratch : db;
    unsigned cols = (unsigned)(((long long)n + HS_CUDA_THREADS - 1) / HS_CUDA_THREADS);
    dim3 grid(cols, (unsigned)(chunks < 65535 ? chunks : 65535));
    bias_grad_partial_kernel<<<grid, HS_CUDA_THREADS, 0, st>>>(dy, m, n, chunks, part);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess || chunks == 1) return e;
    bias_grad_final_kernel<<<cols, HS_CUDA_THREADS, 0, st>>>(part, chunks, n, db);
    return cudaGetLastError();
}

static unsigned dot_blocks(size_t n) {
    size_t b = (n + HS_CUDA_THREADS - 1) / HS_CUDA_THREADS;
    return b < HS_CUDA_DOT_BLOCKS ? (unsigned)b : HS_CUDA_DOT_BLOCKS;
}

/* Products of two floats are exact in double, so only the additions round. */
static __global__ void dot_partial_kernel(const float *x, const float *y, size_t n,
                                          double *part) {
    __shared__ double sh[HS_CUDA_THREADS];
    double acc = 0.0;
    HS_GRID_STRIDE(i, n) acc += (double)x[i] * (double)y[i];
    double s = block_sum(acc, sh);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}

static __global__ void dot_final_kernel(const double *part, unsigned nparts, hs_cuda_result *out) {
    __shared__ double sh[HS_CUDA_THREADS];
    double acc = 0.0;
    for (unsigned i = threadIdx.x; i < nparts; i += HS_CUDA_THREADS) acc += part[i];
    double s = block_sum(acc, sh);
    if (threadIdx.x == 0) {
        out->sum = s;
        out->count = 0;
        out->first_bad = -1;
    }
}

size_t hs__cuda_dot_scratch(size_t n) { return (size_t)dot_blocks(n) * sizeof(double); }

cudaError_t hs__cuda_dot(cudaStream_t st, const float *x, const float *y, size_t n, void *scratch,
                         hs_cuda_result *out) {
    if (!n) return cudaErrorInvalidValue; /* the caller answers 0 without a launch */
    unsigned nb = dot_blocks(n);
    dot_partial_kernel<<<nb, HS_CUDA_THREADS, 0, st>>>(x, y, n, (double *)scratch);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    dot_final_kernel<<<1, HS_CUDA_THREADS, 0, st>>>((const double *)scratch, nb, out);
    return cudaGetLastError();
}

/* One warp per row; the exit test is uniform across the warp (all its lanes share the row),
 * so the full-mask shuffles below always have all 32 lanes. Per row, as cpu.c: the max and its
 * first index (strictly greater wins, starting from -FLT_MAX, so ties keep the lowest index
 * and NaNs never win), s = sum exp(z - max), the loss and the gradient through ew.h. The
 * butterfly reductions leave bit-identical values in every lane: at each step the two lanes of
 * a pair combine the same two values, and both combinations are commutative. */
static __global__ void xent_rows_kernel(float *logits, const int32_t *labels, int m, int k,
                                        float *dlogits, float scale, float *row_loss,
                                        int *row_flag) {
    const unsigned full = 0xffffffffu;
    int lane = (int)(threadIdx.x % HS_CUDA_WARP);
    long long row = (long long)blockIdx.x * HS_CUDA_ROWS_PER_BLOCK + threadIdx.x / HS_CUDA_WARP;
    if (row >= m) return;
    const float *z = logits + (size_t)row * (size_t)k;
    int y = labels[row];
    bool bad = y < 0 || y >= k;

    /* arg == -1: no element above -FLT_MAX seen yet. Each lane scans its indices in increasing
     * order, so its own ties already keep the lowest. */
    float mx = -FLT_MAX;
    int arg = -1;
    for (int j = lane; j < k; j += HS_CUDA_WARP) {
        float v = z[j];
        if (v > mx) {
            mx = v;
            arg = j;
        }
    }
    for (int off = HS_CUDA_WARP / 2; off > 0; off >>= 1) {
        float om = __shfl_xor_sync(full, mx, off);
        int oa = __shfl_xor_sync(full, arg, off);
        if (oa >= 0 && (arg < 0 || om > mx || (om == mx && oa < arg))) {
            mx = om;
            arg = oa;
        }
    }
    if (arg < 0) arg = 0; /* cpu.c's initial arg-max, with mx still -FLT_MAX */

    float s = 0.0f;
    for (int j = lane; j < k; j += HS_CUDA_WARP) s += expf(z[j] - mx);
    for (int off = HS_CUDA_WARP / 2; off > 0; off >>= 1) s += __shfl_xor_sync(full, s, off);

    /* dlogits may be logits: every lane reads z[y] before any lane overwrites the row. */
    float zy = bad ? 0.0f : z[y];
    __syncwarp(full);
    if (lane == 0) {
        row_loss[row] = bad ? 0.0f : hs_ew_xent_loss(zy, mx, s);
        row_flag[row] = bad ? 2 : (arg == y ? 1 : 0);
    }
    if (dlogits && !bad) {
        float inv = 1.0f / s;
        float *dz = dlogits + (size_t)row * (size_t)k;
        /* Each lane rewrites only the elements it read itself. */
        for (int j = lane; j < k; j += HS_CUDA_WARP)
            dz[j] = hs_ew_xent_grad(z[j], mx, inv, j == y, scale);
    }
}

/* Adds the result r of one softmax_xent call to the running totals acc. */
static __device__ void xent_acc_add(const hs_cuda_result *r, const int32_t *labels, int m, int k,
                                    hs_xent_acc *acc) {
    int64_t call = hs_ew_xent_acc_add(acc, r->sum / (double)m, r->count, m);
    if (r->first_bad >= 0 && !acc->bad_call) {
        acc->bad_call = call;
        acc->bad_row = r->first_bad;
        acc->bad_label = labels[r->first_bad];
        acc->bad_classes = k;
    }
}

/* Sums the rows' losses (in double, as cpu.c) and correct flags, and finds the first bad
 * label, in one block with a fixed order; with acc, thread 0 then adds the result to the
 * running totals in the same launch (a training step's loss: two launches, not three). */
static __global__ void xent_sum_kernel(const float *row_loss, const int *row_flag, int m,
                                       hs_cuda_result *out, const int32_t *labels, int k,
                                       hs_xent_acc *acc) {
    __shared__ double shl[HS_CUDA_THREADS];
    __shared__ int shc[HS_CUDA_THREADS];
    __shared__ int shb[HS_CUDA_THREADS];
    double loss = 0.0;
    int ok = 0, bad = INT_MAX;
    for (int i = (int)threadIdx.x; i < m; i += HS_CUDA_THREADS) {
        loss += (double)row_loss[i];
        int f = row_flag[i];
        ok += f == 1;
        if (f == 2 && bad == INT_MAX) bad = i; /* ascending, so the first is the lowest */
        if (i > INT_MAX - HS_CUDA_THREADS) break;
    }
    unsigned t = threadIdx.x;
    shl[t] = loss;
    shc[t] = ok;
    shb[t] = bad;
    __syncthreads();
    for (unsigned s = HS_CUDA_THREADS / 2; s > 0; s >>= 1) {
        if (t < s) {
            shl[t] += shl[t + s];
            shc[t] += shc[t + s];
            if (shb[t + s] < shb[t]) shb[t] = shb[t + s];
        }
        __syncthreads();
    }
    if (t == 0) {
        out->sum = shl[0];
        out->count = shc[0];
        out->first_bad = shb[0] == INT_MAX ? -1 : shb[0];
        if (acc) xent_acc_add(out, labels, m, k, acc);
    }
}

size_t hs__cuda_xent_scratch(int m) {
    return m > 0 ? 2 * align256(sizeof(float) * (size_t)m) : 0;
}

cudaError_t hs__cuda_softmax_xent(cudaStream_t st, float *logits, const int32_t *labels, int m,
                                  int k, float *dlogits, float scale, void *scratch,
                                  hs_cuda_result *out, hs_xent_acc *acc) {
    if (m <= 0 || k <= 0) return cudaErrorInvalidValue; /* the caller handles these */
    float *row_loss = (float *)scratch;
    int *row_flag = (int *)((char *)scratch + align256(sizeof(float) * (size_t)m));
    unsigned grid =
        (unsigned)(((long long)m + HS_CUDA_ROWS_PER_BLOCK - 1) / HS_CUDA_ROWS_PER_BLOCK);
    xent_rows_kernel<<<grid, HS_CUDA_THREADS, 0, st>>>(logits, labels, m, k, dlogits, scale,
                                                       row_loss, row_flag);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    xent_sum_kernel<<<1, HS_CUDA_THREADS, 0, st>>>(row_loss, row_flag, m, out, labels, k, acc);
    return cudaGetLastError();
}

cudaError_t hs__cuda_probe(void) {
    cudaFuncAttributes attr;
    return cudaFuncGetAttributes(&attr, fill_kernel);
}
