/* A stand-in for the CUDA backend module with memory ops only: no GEMM, no layer at all, so
 * every model asks it for an op it lacks (check_ops in src/model/model.c, HS_ENOTSUP). Loaded
 * through HEARSAY_CUDA_MODULE by test_missing_layer.sh to see how the commands answer a model
 * the device cannot run; no real backend lacks a layer today. Host memory throughout. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hearsay/error.h"
#include "tensor/backend_internal.h"

static int f_alloc(hs_backend *be, size_t bytes, void **out) {
    (void)be;
    *out = calloc(1, bytes ? bytes : 1);
    return *out ? 0 : HS_ENOMEM;
}

static void f_free(hs_backend *be, void *p) {
    (void)be;
    free(p);
}

static int f_copy(hs_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    memmove(dst, src, bytes);
    return 0;
}

static int f_sync(hs_backend *be) {
    (void)be;
    return 0;
}

static const hs_backend_ops fake_ops = {
    .name = "cuda",
    .alloc = f_alloc,
    .free = f_free,
    .upload = f_copy,
    .download = f_copy,
    .copy = f_copy,
    .sync = f_sync,
};

__attribute__((visibility("default"))) int
hs_cuda_backend_open(hs_backend *be, const hs_backend_cfg *cfg, const hs_host_api *host);

int hs_cuda_backend_open(hs_backend *be, const hs_backend_cfg *cfg, const hs_host_api *host) {
    (void)cfg;
    if (!host || host->version != HS_HOST_API_VERSION) return HS_ENOTSUP;
    be->ops = &fake_ops;
    be->device = HS_DEVICE_CUDA;
    be->host_memory = 1;
    snprintf(be->description, sizeof(be->description), "cuda (a test stand-in without layers)");
    return 0;
}
