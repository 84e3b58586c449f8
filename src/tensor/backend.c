/* The backend registry: the CPU backend is linked in; the CUDA backend is a module loaded with
 * dlopen on first use, so the hearsay binary itself never depends on libcudart or a driver. */
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error_internal.h"
#include "core/log.h"
#include "hs_config.h"
#include "tensor/backend_internal.h"

#if HS_HAVE_CUDA
/* What a loaded module may call back into (unused, and so absent, in a build without CUDA). */
static int host_err(int code, const char *fmt, va_list ap) {
    char msg[1024];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    return hs__err(code, "%s", msg);
}

static void host_log(int level, const char *fmt, va_list ap) {
    char msg[1024];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    hs__log((hs_log_level)level, "%s", msg);
}

static const hs_host_api host_api = {HS_HOST_API_VERSION, host_err, host_log};
#endif

const char *hs_backends_built(void) { return HS_HAVE_CUDA ? "cpu,cuda" : "cpu"; }

const char *hs_device_name(hs_device d) { return d == HS_DEVICE_CUDA ? "cuda" : "cpu"; }

int hs_device_parse_id(const char *s, hs_device *out, int *device_id) {
    int id = 0;
    if (s && !strcmp(s, "cpu")) {
        *out = HS_DEVICE_CPU;
    } else if (s && !strcmp(s, "cuda")) {
        *out = HS_DEVICE_CUDA;
    } else if (s && !strncmp(s, "cuda:", 5)) {
        /* Digits only: strtol would take " 1", "+1" or "0x1". */
        const char *p = s + 5;
        if (!*p || strspn(p, "0123456789") != strlen(p) || strlen(p) > 4 ||
            (id = atoi(p)) > HS_DEVICE_ID_MAX)
            return hs__err(HS_EINVAL, "device '%s': the CUDA device number must be 0..%d", s,
                           HS_DEVICE_ID_MAX);
        if (!device_id)
            return hs__err(HS_EINVAL, "device '%s': a device number is not accepted here", s);
        *out = HS_DEVICE_CUDA;
    } else {
        return hs__err(HS_EINVAL, "unknown device '%s' (expected cpu, cuda or cuda:N)",
                       s ? s : "");
    }
    if (device_id) *device_id = id;
    return 0;
}

int hs_device_parse(const char *s, hs_device *out) { return hs_device_parse_id(s, out, NULL); }

static const char *const precision_names[] = {"fp32", "tf32", "bf16"};

const char *hs_precision_name(hs_precision p) {
    return (unsigned)p < 3 ? precision_names[p] : "unknown";
}

int hs_precision_parse(const char *s, hs_precision *out) {
    for (int i = 0; i < 3; i++)
        if (s && !strcmp(s, precision_names[i])) {
            *out = (hs_precision)i;
            return 0;
        }
    return hs__err(HS_EINVAL, "unknown precision '%s' (expected fp32, tf32 or bf16)", s ? s : "");
}

#if HS_HAVE_CUDA
/* Appends to the list of what was tried, for the message when nothing loads. */
static void tried_add(char *tried, size_t len, const char *path, const char *why) {
    size_t used = strlen(tried);
    if (used < len)
        snprintf(tried + used, len - used, "%s%s: %s", used ? "; " : "", path, why);
}

/* Where the module may be: $HEARSAY_CUDA_MODULE, beside the running executable (the build
 * tree), then the install directory. The first readable one is dlopened; `tried` lists every
 * candidate looked at and why it was not used.
 *
 * RTLD_NODELETE, and no dlclose anywhere: the module pulls in libcudart and libcublas, which
 * register atexit handlers and driver state; unloading them mid-process leaves those pointing
 * into unmapped code, a known crash at exit. A module once loaded stays for the process. */
static void *load_cuda_module(char *tried, size_t tried_len) {
    char cand[3][PATH_MAX];
    const char *label[3];
    int nc = 0;
    const char *env = getenv("HEARSAY_CUDA_MODULE");
    if (env && *env) {
        label[nc] = "$HEARSAY_CUDA_MODULE ";
        snprintf(cand[nc++], PATH_MAX, "%s", env);
    }
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n > 0) {
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = '\0';
            label[nc] = "";
            snprintf(cand[nc++], PATH_MAX, "%.*s/%s", PATH_MAX - 64, exe, HS_CUDA_MODULE_NAME);
        }
    }
    label[nc] = "";
    snprintf(cand[nc++], PATH_MAX, "%s/%s", HS_MODULE_DIR, HS_CUDA_MODULE_NAME);
    tried[0] = '\0';
    for (int i = 0; i < nc; i++) {
        char what[PATH_MAX + 32];
        snprintf(what, sizeof(what), "%s%s", label[i], cand[i]);
        if (access(cand[i], R_OK) != 0) {
            tried_add(tried, tried_len, what, strerror(errno));
            continue;
        }
        void *h = dlopen(cand[i], RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
        if (h) return h;
        /* dlerror names the path itself, and the library it lacked (libcudart.so.13...). */
        const char *e = dlerror();
        tried_add(tried, tried_len, what, e ? e : "dlopen failed");
        return NULL;
    }
    return NULL;
}
#endif

static int open_cuda(hs_backend *be, const hs_backend_cfg *cfg) {
#if HS_HAVE_CUDA
    char why[3 * PATH_MAX + 512];
    void *h = load_cuda_module(why, sizeof(why));
    if (!h)
        return hs__err(HS_ENODEV, "--device cuda: cannot load the CUDA backend module %s (%s)",
                       HS_CUDA_MODULE_NAME, why);
    /* ISO C has no object-to-function pointer conversion (-Wpedantic); POSIX guarantees that
     * dlsym's result may be used this way, so copy the pointer's bytes. */
    hs_module_open_fn fn;
    void *sym = dlsym(h, HS_CUDA_ENTRY);
    memcpy(&fn, &sym, sizeof(fn));
    if (!fn)
        return hs__err(HS_ENODEV, "--device cuda: %s has no entry point %s", HS_CUDA_MODULE_NAME,
                       HS_CUDA_ENTRY);
    /* On failure too the module stays loaded (see load_cuda_module): the runtime may already
     * have started. A later open finds it loaded and costs nothing. */
    be->module = h;
    int err = fn(be, cfg, &host_api);
    if (err < 0) {
        be->module = NULL;
        if (err == HS_ENOTSUP)
            return hs__err(HS_ENODEV, "--device cuda: %s is from another hearsay build (host "
                                      "interface version mismatch)", HS_CUDA_MODULE_NAME);
        return err;
    }
    return 0;
#else
    (void)be;
    (void)cfg;
    return hs__err(HS_ENOTSUP, "--device cuda: this hearsay was built without CUDA "
                               "(backends built in: %s)", hs_backends_built());
#endif
}

int hs_backend_open(hs_backend **out, hs_device device, const hs_backend_cfg *cfg) {
    hs_backend_cfg defcfg = {0, 0};
    if (!cfg) cfg = &defcfg;
    hs_backend *be = calloc(1, sizeof(*be));
    if (!be) return hs__err(HS_ENOMEM, "backend: out of memory");
    int err;
    if (device == HS_DEVICE_CPU) err = hs__cpu_backend_open(be, cfg);
    else if (device == HS_DEVICE_CUDA) err = open_cuda(be, cfg);
    else err = hs__err(HS_EINVAL, "unknown device %d", (int)device);
    if (err < 0) {
        free(be);
        return err;
    }
    *out = be;
    return 0;
}

int hs_backend_set_precision(hs_backend *be, hs_precision p) {
    if ((unsigned)p > HS_PRECISION_BF16)
        return hs__err(HS_EINVAL, "precision %d: expected fp32, tf32 or bf16", (int)p);
    /* OpenBLAS has no TF32, and emulating one on the CPU would be slower than FP32 for no
     * gain: a backend without the entry says no rather than pretend. */
    if (!be->ops->set_precision && p != HS_PRECISION_FP32)
        return hs__err(HS_EINVAL, "--precision %s needs --device cuda: the %s backend computes in "
                                  "fp32 only", hs_precision_name(p), be->ops->name);
    if (!be->ops->set_precision) return 0;
    return be->ops->set_precision(be, (int)p);
}

void hs_backend_close(hs_backend *be) {
    if (!be) return;
    if (be->stage && be->ops && be->ops->host_alloc) be->ops->host_free(be, be->stage);
    else free(be->stage);
    if (be->ops && be->ops->destroy) be->ops->destroy(be);
    /* be->module is never dlclosed: see load_cuda_module. */
    free(be);
}
