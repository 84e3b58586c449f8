/* Device gossip in the CUDA module. CUDA C++ only.
 *
 * - Launchers of the vector kernels (gossip.cu): each computes what the hs_gossip_ops entry of
 *   the same name defines (src/tensor/gossip_ops.h), enqueued on stream `st`; the ones with a
 *   host output (*sq) are complete only once the caller has synchronised `st`. Scratch is
 *   device memory of hs__cuda_gossip_sum_scratch() bytes, from the caller.
 * - What backend_cuda.cu lends the table of gossip_ops.cu (its stream, scratch and errors), and
 *   that table, which backend_cuda.cu puts in its hs_backend_ops. */
#ifndef HS_CUDA_GOSSIP_CUH
#define HS_CUDA_GOSSIP_CUH

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "tensor/gossip_ops.h"

size_t hs__cuda_gossip_sum_scratch(void);
cudaError_t hs__cuda_sub(cudaStream_t st, float *out, const float *x, const float *y, size_t n);
cudaError_t hs__cuda_acc_diff(cudaStream_t st, float *acc, const float *a, const float *b,
                              size_t n, float w);
cudaError_t hs__cuda_scale_to(cudaStream_t st, float *out, const float *x, size_t n, float a);
cudaError_t hs__cuda_step_sq(cudaStream_t st, float *x, const float *m, float g, size_t n,
                             void *scratch, double *sq);
cudaError_t hs__cuda_sumsq(cudaStream_t st, const float *x, size_t n, void *scratch,
                           double *sq);
cudaError_t hs__cuda_beer_track(cudaStream_t st, float *v, float *s_prev, float *dg,
                                const float *mg, const float *g, float gamma, const float *xr,
                                const float *x, size_t n);
cudaError_t hs__cuda_beer_step(cudaStream_t st, float *x, float *dh, const float *xr,
                               const float *mh, const float *v, const float *h, float gamma,
                               size_t n, void *scratch, double *sq);

/* From backend_cuda.cu. enter: makes be's device current on this thread and gives its stream
 * (0, or HS_ECUDA reported). scratch: at least `bytes` of be's device scratch (see
 * scratch_get there). cuda_error: reports a failed CUDA call of op `fn` and returns HS_ECUDA.
 * report: sets the error message and returns code. */
int hs__cuda_be_enter(hs_backend *be, const char *fn, cudaStream_t *st);
int hs__cuda_be_scratch(hs_backend *be, size_t bytes, void **out);
int hs__cuda_be_error(cudaError_t e, const char *fn, const char *call);
__attribute__((format(printf, 2, 3))) int hs__cuda_be_report(int code, const char *fmt, ...);

extern const hs_gossip_ops hs__cuda_gossip_ops;

#endif
