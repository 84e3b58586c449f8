/* What the GPU gossip benchmarks (gossip_gpu.c, algo_gpu.c) share: a wall clock, the median of
 * a series, a reproducible test vector and a check that exits naming the failed call. */
#ifndef HS_TOOLS_BENCH_GPU_BENCH_H
#define HS_TOOLS_BENCH_GPU_BENCH_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "hearsay/error.h"

static inline double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static inline int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Sorts v. */
static inline double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* x = values in [-0.5, 0.5) from an xorshift stream of seed. */
static inline void fill(float *x, size_t d, uint64_t seed) {
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < d; i++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        x[i] = (float)((double)(s >> 11) * 0x1p-53 - 0.5);
    }
}

/* Runs a call returning a negative HS_E* on failure; on one, says which and exits 1. */
#define CHECK(call)                                                                                \
    do {                                                                                           \
        int e_ = (call);                                                                           \
        if (e_ < 0) {                                                                              \
            fprintf(stderr, "%s: %s: %s\n", BENCH_NAME, #call, hs_error_message());               \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

#endif
