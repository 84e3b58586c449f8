/* Host launchers of the compression primitives' kernels (src/cuda/compress.cu), for the
 * compression entries of the CUDA backend's hs_gossip_ops (gossip_ops.cu). CUDA C++ only.
 *
 * Each launcher enqueues on stream `st` its kernels and the copies between the host pointers it
 * is given and device scratch, and returns the first launch or enqueue error. Host outputs are
 * valid, and host inputs may be reused, only once the caller has synchronised `st`. Device
 * scratch comes from the caller, sized by the matching *_scratch function (256-byte aligned,
 * contents undefined, used by nothing else until `st` has run the launch). Arguments are
 * within the ranges of hs_gossip_ops (src/tensor/gossip_ops.h): 1 <= d <= HS_CUDA_COMPRESS_MAX_D,
 * 1 <= k <= d, bucket >= 1, 1 <= s <= 32767, n >= 1; the launchers do not check them. */
#ifndef HS_CUDA_COMPRESS_CUH
#define HS_CUDA_COMPRESS_CUH

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

/* HS_COMPRESS_MAX_D: every index and count below fits 32 bits; offsets that grow past d (bit
 * positions, bucket ends, byte counts) are 64-bit. */
#define HS_CUDA_COMPRESS_MAX_D ((size_t)UINT32_MAX)

/* Top-k by radix select: idx[0..k), val[0..k), *max_key (host), as hs_gossip_ops. */
size_t hs__cuda_topk_scratch(size_t d, size_t k);
cudaError_t hs__cuda_topk(cudaStream_t st, const float *x, size_t d, size_t k, void *scratch,
                          uint32_t *idx, float *val, uint32_t *max_key);

/* Stratified random-k: idx[0..k), val[0..k) (host). */
size_t hs__cuda_randk_scratch(size_t k);
cudaError_t hs__cuda_randk(cudaStream_t st, const float *x, size_t d, size_t k, uint64_t seed,
                           uint32_t peer, uint64_t round, void *scratch, uint32_t *idx,
                           float *val);

/* QSGD: norms (ceil(d / bucket) LE fp32) and the field stream (host). */
size_t hs__cuda_qsgd_scratch(size_t d, size_t bucket, uint32_t s);
cudaError_t hs__cuda_qsgd(cudaStream_t st, const float *x, size_t d, size_t bucket, uint32_t s,
                          uint64_t seed, uint32_t peer, uint64_t round, void *scratch,
                          void *norms, void *fields);

/* Scaled sign: scales (ceil(d / bucket) LE fp32) and ceil(d / 8) bytes of sign bits (host). */
size_t hs__cuda_sign_scratch(size_t d, size_t bucket);
cudaError_t hs__cuda_sign(cudaStream_t st, const float *x, size_t d, size_t bucket,
                          void *scratch, void *scales, void *bits);

/* 16-bit casts: out (host, 2d bytes LE), binary16 or (bf16) bfloat16. */
size_t hs__cuda_half_scratch(size_t d);
cudaError_t hs__cuda_half(cudaStream_t st, const float *x, size_t d, int bf16, void *scratch,
                          void *out);

/* acc[i] = acc[i] + alpha * v_i, v the n LE values at p (host): fmt 0 fp32, 1 fp16, 2 bf16. */
size_t hs__cuda_add_dense_scratch(size_t n, int fmt);
cudaError_t hs__cuda_add_dense(cudaStream_t st, float *acc, const void *p, size_t n, int fmt,
                               float alpha, void *scratch);

/* acc[idx[j]] = acc[idx[j]] + val[j] (host arrays of n; distinct indices). */
size_t hs__cuda_add_sparse_scratch(size_t n);
cudaError_t hs__cuda_add_sparse(cudaStream_t st, float *acc, const uint32_t *idx,
                                const float *val, size_t n, void *scratch);

/* Decoding a checked QSGD / sign message body (host, `bytes` long) into acc: as
 * hs_gossip_ops.qsgd_add and sign_add (bucket <= d). */
size_t hs__cuda_body_scratch(size_t bytes);
cudaError_t hs__cuda_qsgd_add(cudaStream_t st, float *acc, const void *body, size_t bytes,
                              size_t d, size_t bucket, uint32_t s, float alpha, void *scratch);
cudaError_t hs__cuda_sign_add(cudaStream_t st, float *acc, const void *body, size_t bytes,
                              size_t d, size_t bucket, float alpha, void *scratch);

#endif
