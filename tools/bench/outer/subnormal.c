/* A probe for the question "do subnormal floats slow our CPU steps?" (docs/RESULTS.md, issue 19):
 * loaded with LD_PRELOAD in front of OpenBLAS, it counts the subnormal floats that each
 * cblas_sgemm reads and writes, and prints the totals at exit. HS_PROBE_FTZ=1 also sets
 * flush-to-zero and denormals-are-zero on the loading thread, to time the same run without
 * them; HS_PROBE_COUNT=0 skips the counting (which costs about as much as the run), for
 * timing. Built on demand: ninja -C build tools/bench/subnormal_probe.so; run the sim with
 * OPENBLAS_NUM_THREADS=1 so that every GEMM runs on the thread whose mode was set. */
#ifndef _GNU_SOURCE /* RTLD_NEXT; the build defines it already */
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <math.h>
#include <pmmintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xmmintrin.h>

typedef void sgemm_fn(int, int, int, int, int, int, float, const float *, int, const float *, int,
                      float, float *, int);

static unsigned long long sub_in, sub_out, all_in, all_out, calls;
static int counting = 1;

/* Subnormals in a row-major rows x cols block with leading dimension ld. */
static unsigned long long count(const float *p, int rows, int cols, int ld) {
    unsigned long long c = 0;
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++)
            c += fpclassify(p[(size_t)i * (size_t)ld + (size_t)j]) == FP_SUBNORMAL;
    return c;
}

enum { TRANS = 112 }; /* CblasTrans */

void cblas_sgemm(int order, int ta, int tb, int m, int n, int k, float alpha, const float *a,
                 int lda, const float *b, int ldb, float beta, float *c, int ldc);
void cblas_sgemm(int order, int ta, int tb, int m, int n, int k, float alpha, const float *a,
                 int lda, const float *b, int ldb, float beta, float *c, int ldc) {
    static sgemm_fn *real;
    if (!real) {
        void *sym = dlsym(RTLD_NEXT, "cblas_sgemm");
        if (!sym) {
            fprintf(stderr, "subnormal probe: no cblas_sgemm behind the probe\n");
            abort();
        }
        memcpy(&real, &sym, sizeof(real)); /* ISO C has no object-to-function pointer cast */
    }
    if (!counting) {
        real(order, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        return;
    }
    /* Row-major, as src/tensor/cpu.c calls it: op(A) is m x k, op(B) is k x n. */
    int ar = ta == TRANS ? k : m, ac = ta == TRANS ? m : k;
    int br = tb == TRANS ? n : k, bc = tb == TRANS ? k : n;
    sub_in += count(a, ar, ac, lda) + count(b, br, bc, ldb);
    all_in += (unsigned long long)ar * (unsigned long long)ac +
              (unsigned long long)br * (unsigned long long)bc;
    real(order, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    sub_out += count(c, m, n, ldc);
    all_out += (unsigned long long)m * (unsigned long long)n;
    calls++;
}

__attribute__((constructor)) static void probe_init(void) {
    const char *ftz = getenv("HS_PROBE_FTZ"), *cnt = getenv("HS_PROBE_COUNT");
    counting = !(cnt && strcmp(cnt, "0") == 0);
    if (ftz && strcmp(ftz, "1") == 0) {
        _MM_SET_FLUSH_ZERO_MODE(_MM_FLUSH_ZERO_ON);
        _MM_SET_DENORMALS_ZERO_MODE(_MM_DENORMALS_ZERO_ON);
    }
}

__attribute__((destructor)) static void probe_report(void) {
    if (!counting) return;
    fprintf(stderr,
            "subnormal probe: %llu gemm calls; subnormal inputs %llu of %llu, outputs %llu of "
            "%llu\n",
            calls, sub_in, all_in, sub_out, all_out);
}
