/* The CUDA backend's low-precision GEMM (--precision tf32|bf16; src/cuda/precision.cu), for
 * backend_cuda.cu. CUDA C++ only.
 *
 * What runs where: on a GPU (nvcc), BF16 converts both operands to BF16 (round to nearest even)
 * and calls cublasGemmEx with BF16 inputs and FP32 compute and output; TF32 is cuBLAS's TF32
 * tensor-op math mode on the plain FP32 call, so it needs nothing here. Under the CPU emulator
 * (no nvcc: ../shared/tools/cuda-emu, whose cuBLAS is OpenBLAS's cblas_sgemm, with neither
 * GemmEx nor tensor cores) the operands are rounded to BF16, or to TF32's 10-bit mantissa,
 * and widened back to FP32 for the FP32 GEMM: the same products of the same rounded inputs,
 * summed in FP32, so the arithmetic of both precisions is emulated, not skipped. So the
 * emulator checks the operand kernel's indexing and rounding; the BF16-output instantiation
 * of that kernel, the cublasGemmEx call and TF32's math mode run only on a GPU, where
 * tests/cuda/fused checks them against the same references (HEARSAY_REQUIRE_CUDA=1). */
#ifndef HS_CUDA_PRECISION_CUH
#define HS_CUDA_PRECISION_CUH

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stddef.h>

/* Which call of hs__cuda_gemm_lowp failed, and how. */
typedef struct hs_cuda_lowp_fail {
    const char *call;    /* "cublasGemmEx", "lowp operands kernel" ... */
    cudaError_t cuda;    /* cudaSuccess when the failure was cuBLAS's */
    cublasStatus_t blas;
} hs_cuda_lowp_fail;

/* Whether a GEMM at precision p (hs_precision) goes through hs__cuda_gemm_lowp rather than
 * the plain cublasSgemm: BF16 always, TF32 only under the emulator. */
int hs__cuda_lowp_wanted(int p);

/* 0 when a device of compute capability sm (major * 10 + minor) can run GEMMs at precision
 * p, else HS_EINVAL reported naming the card (card_len bytes of card, the backend's
 * description). TF32 tensor cores and BF16 GEMM inputs came with 8.0: below it cuBLAS fails
 * the first BF16 GEMM and runs TF32's math mode as plain FP32, a precision not asked for. */
int hs__cuda_lowp_check(int p, int sm, const char *card, size_t card_len);

/* Scratch bytes hs__cuda_gemm_lowp needs for an m x n x k product (256-byte aligned). */
size_t hs__cuda_lowp_scratch(int p, int m, int n, int k);

/* The backend's gemm (row-major, as hs_backend_ops documents it; m, n, k >= 1, strides
 * checked by the caller) at precision p on stream st through handle h, with the rounded
 * operands in scratch. 0, or -1 with *f saying which call failed. */
int hs__cuda_gemm_lowp(cublasHandle_t h, cudaStream_t st, int p, int ta, int tb, int m, int n,
                       int k, float alpha, const float *a, int lda, const float *b, int ldb,
                       float beta, float *c, int ldc, void *scratch, hs_cuda_lowp_fail *f);

#endif
