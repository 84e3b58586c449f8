/* Low-precision GEMM operands and calls of the CUDA backend; what runs where is in
 * precision.cuh. The rounding is integer arithmetic on the float's bits (compress_ew.h's BF16
 * conversion, the one the bf16 compressor uses), so the emulator, a GPU and the CPU tests that
 * check them round alike, whatever the floating-point environment. */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "compress/compress_ew.h"
#include "cuda/gossip.cuh"
#include "cuda/precision.cuh"
#include "hearsay/error.h"
#include "hearsay/tensor.h"

#define LOWP_THREADS 256
#define LOWP_MAX_BLOCKS 65535u

/* nvcc means a real GPU; the emulator compiles the .cu files with g++. */
#ifdef __NVCC__
#define LOWP_EMULATED 0
#else
#define LOWP_EMULATED 1
#endif

#if LOWP_EMULATED
/* Round to nearest even at TF32's 10 mantissa bits; infinities and NaNs pass unchanged. Only
 * the emulator rounds TF32 operands: a GPU's tensor cores do it (precision.cuh). */
static __device__ float tf32_round(float x) {
    uint32_t u = hs_cw_bits(x);
    if ((u & 0x7F800000u) == 0x7F800000u) return x;
    u += 0xFFFu + ((u >> 13) & 1u);
    return hs_cw_float(u & ~0x1FFFu);
}
#endif

/* One operand element as the GEMM reads it: BF16 bits, or the rounded value widened to FP32
 * (the emulator's operands). */
template <typename Out, int kPrec> static __device__ Out lowp_value(float x) {
    if constexpr (sizeof(Out) == 2) return hs_cw_bf16_from_f32(x);
#if LOWP_EMULATED
    else if constexpr (kPrec == HS_PRECISION_TF32) return tf32_round(x);
#endif
    else return hs_cw_f32_from_bf16(hs_cw_bf16_from_f32(x));
}

/* One GEMM operand: the stored rows x cols matrix src of row stride ld, and where its dense
 * rounded copy goes. */
typedef struct lowp_mat {
    const float *src;
    int rows, cols, ld;
    void *dst;
} lowp_mat;

template <typename Out, int kPrec>
static __device__ void round_at(const lowp_mat &m, size_t i) {
    size_t cols = (size_t)m.cols;
    ((Out *)m.dst)[i] = lowp_value<Out, kPrec>(m.src[(i / cols) * (size_t)m.ld + i % cols]);
}

/* Both operands in one launch (a GEMM's rounding costs one launch, not two): elements below
 * a's size are a's, the rest b's. */
template <typename Out, int kPrec>
static __global__ void operands_kernel(lowp_mat a, lowp_mat b) {
    size_t na = (size_t)a.rows * (size_t)a.cols, total = na + (size_t)b.rows * (size_t)b.cols;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (size_t)blockDim.x * gridDim.x) {
        if (i < na) round_at<Out, kPrec>(a, i);
        else round_at<Out, kPrec>(b, i - na);
    }
}

template <typename Out, int kPrec>
static cudaError_t operands(cudaStream_t st, const lowp_mat &a, const lowp_mat &b) {
    size_t total = (size_t)a.rows * (size_t)a.cols + (size_t)b.rows * (size_t)b.cols;
    size_t blocks = (total + LOWP_THREADS - 1) / LOWP_THREADS;
    unsigned grid = blocks < LOWP_MAX_BLOCKS ? (unsigned)blocks : LOWP_MAX_BLOCKS;
    operands_kernel<Out, kPrec><<<grid, LOWP_THREADS, 0, st>>>(a, b);
    return cudaGetLastError();
}

int hs__cuda_lowp_check(int p, int sm, const char *card, size_t card_len) {
    if (p == HS_PRECISION_FP32 || sm >= 80) return 0;
    return hs__cuda_be_report(HS_EINVAL,
                              "--precision %s: %.*s has compute capability %d.%d, and tf32 and "
                              "bf16 need 8.0 (Ampere) or newer: use --precision fp32",
                              p == HS_PRECISION_TF32 ? "tf32" : "bf16", (int)card_len, card,
                              sm / 10, sm % 10);
}

int hs__cuda_lowp_wanted(int p) {
    return p == HS_PRECISION_BF16 || (LOWP_EMULATED && p == HS_PRECISION_TF32);
}

static size_t align256(size_t bytes) { return (bytes + 255) & ~(size_t)255; }

/* Bytes of one element of the rounded operands. */
static size_t elem_bytes(void) { return LOWP_EMULATED ? sizeof(float) : sizeof(uint16_t); }

size_t hs__cuda_lowp_scratch(int p, int m, int n, int k) {
    (void)p;
    return align256(elem_bytes() * (size_t)m * (size_t)k) +
           align256(elem_bytes() * (size_t)k * (size_t)n);
}

/* Rounds both operands into their dense copies. */
static cudaError_t round_operands(cudaStream_t st, int p, const lowp_mat &a, const lowp_mat &b) {
#if LOWP_EMULATED
    if (p == HS_PRECISION_TF32) return operands<float, HS_PRECISION_TF32>(st, a, b);
    return operands<float, HS_PRECISION_BF16>(st, a, b);
#else
    (void)p;
    return operands<uint16_t, HS_PRECISION_BF16>(st, a, b);
#endif
}

int hs__cuda_gemm_lowp(cublasHandle_t h, cudaStream_t st, int p, int ta, int tb, int m, int n,
                       int k, float alpha, const float *a, int lda, const float *b, int ldb,
                       float beta, float *c, int ldc, void *scratch, hs_cuda_lowp_fail *f) {
    /* The stored matrices: A is m x k (k x m when transposed), B k x n (n x k); their dense
     * rounded copies keep the layout, with the row length as the new stride. */
    int ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
    void *ra = scratch;
    void *rb = (char *)scratch + align256(elem_bytes() * (size_t)m * (size_t)k);
    f->call = "lowp operands kernel";
    f->blas = CUBLAS_STATUS_SUCCESS;
    if ((f->cuda = round_operands(st, p, lowp_mat{a, ar, ac, lda, ra},
                                  lowp_mat{b, br, bc, ldb, rb})) != cudaSuccess)
        return -1;
    /* Row-major as column-major, operands swapped: see cu_gemm in backend_cuda.cu. */
    cublasOperation_t op_a = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t op_b = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
#if LOWP_EMULATED
    f->call = "cublasSgemm";
    f->blas = cublasSgemm(h, op_b, op_a, n, m, k, &alpha, (const float *)rb, bc, (const float *)ra,
                          ac, &beta, c, ldc);
#else
    f->call = "cublasGemmEx";
    f->blas = cublasGemmEx(h, op_b, op_a, n, m, k, &alpha, rb, CUDA_R_16BF, bc, ra, CUDA_R_16BF,
                           ac, &beta, c, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
#endif
    return f->blas == CUBLAS_STATUS_SUCCESS ? 0 : -1;
}
