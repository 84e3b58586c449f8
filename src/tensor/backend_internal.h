/* Internal interface between the backend registry and the backends it opens. */
#ifndef HS_TENSOR_BACKEND_INTERNAL_H
#define HS_TENSOR_BACKEND_INTERNAL_H

#include <stdarg.h>

#include "hearsay/tensor.h"

/* Fills *be with the CPU backend. */
int hs__cpu_backend_open(hs_backend *be, const hs_backend_cfg *cfg);

/* The host services a backend module loaded with dlopen may call: it links none of hearsay's
 * own code, so errors and log lines go through these. Versioned so a stale module is refused. */
#define HS_HOST_API_VERSION 1
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
