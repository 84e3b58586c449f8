/* Internal interface between the backend registry and the backends it opens. */
#ifndef HS_TENSOR_BACKEND_INTERNAL_H
#define HS_TENSOR_BACKEND_INTERNAL_H

#include <stdarg.h>

#include "hearsay/tensor.h"

/* Fills *be with the CPU backend. */
int hs__cpu_backend_open(hs_backend *be, const hs_backend_cfg *cfg);

/* The CPU backend's lanes (--threads above 1), on which a model splits a batch; NULL for one
 * thread, for another backend, or when host_memory was cleared (tests that pose as a device). */
struct hs__pool;
struct hs__pool *hs__cpu_pool(const hs_backend *be);

/* The CPU backend's convolutional-layer ops (cpu_conv.c), as documented in hs_backend_ops. */
int hs__cpu_im2col(hs_backend *be, const float *x, const hs_conv_geom *g, int n, float *col);
int hs__cpu_im2row(hs_backend *be, const float *x, const hs_conv_geom *g, int n, float *rows);
int hs__cpu_col2im(hs_backend *be, const float *col, const hs_conv_geom *g, int n, float *dx);
int hs__cpu_maxpool(hs_backend *be, const float *x, const hs_conv_geom *g, int n, float *y,
                    int32_t *arg);
int hs__cpu_maxpool_grad(hs_backend *be, const float *dy, const int32_t *arg,
                         const hs_conv_geom *g, int n, float *dx);
int hs__cpu_avgpool(hs_backend *be, const float *x, int n, int hw, int c, float *y);
int hs__cpu_avgpool_grad(hs_backend *be, const float *dy, int n, int hw, int c, float *dx);
int hs__cpu_groupnorm(hs_backend *be, const float *x, int n, int hw, int c, int groups, float eps,
                      const float *gamma, const float *beta, float *y, float *mean, float *rstd);
int hs__cpu_groupnorm_relu(hs_backend *be, const float *x, int n, int hw, int c, int groups,
                           float eps, const float *gamma, const float *beta, float *y,
                           float *mean, float *rstd);
int hs__cpu_groupnorm_grad(hs_backend *be, const float *dy, const float *x, int n, int hw, int c,
                           int groups, const float *gamma, const float *mean, const float *rstd,
                           float *dx, float *dgamma, float *dbeta);
int hs__cpu_shortcut_add(hs_backend *be, float *y, const float *x, const hs_shortcut_geom *s,
                         int n);
int hs__cpu_shortcut_sum(hs_backend *be, float *y, const float *a, const float *x,
                         const hs_shortcut_geom *s, int n, int relu);
int hs__cpu_shortcut_grad(hs_backend *be, float *dx, const float *dy, const hs_shortcut_geom *s,
                          int n);

/* The host services a backend module loaded with dlopen may call: it links none of hearsay's
 * own code, so errors and log lines go through these. Versioned so a stale module is refused;
 * the version also stands for the length of hs_backend_ops, which the host reads to its end
 * (2: set_precision and groupnorm_relu_grad appended). */
#define HS_HOST_API_VERSION 2
typedef struct hs_host_api {
    int version;
    /* Sets the calling thread's error message and returns code (hs__err). */
    int (*err)(int code, const char *fmt, va_list ap);
    /* Logs a line at level (hs_log_level). */
    void (*log)(int level, const char *fmt, va_list ap);
} hs_host_api;

/* The entry point a backend module exports, by this name. */
#define HS_CUDA_ENTRY "hs_cuda_backend_open"
typedef int (*hs_module_open_fn)(hs_backend *be, const hs_backend_cfg *cfg,
                                 const hs_host_api *host);

#endif
