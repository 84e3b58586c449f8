/* Benchmark of the compression codecs, single thread: encode and decode throughput of each
 * operator (GB/s of the fp32 vector, 4 d bytes, per second) next to memcpy of the same bytes,
 * for the default MLP (d = 235,146) and d = 4,194,304. tools/bench/compress.sh runs it with
 * torch.topk's times (--torch D:MS) so the table shows the top-k ratio.
 *
 *   compress_bench [--level N] [--samples N] [--torch D:MS]... [--only SPEC]
 *
 * Each figure is the median over samples; a sample times enough back-to-back calls to last at
 * least 20 ms. Inputs are N(0, 1). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "compress/codec.h"
#include "core/rng.h"
#include "hearsay/buf.h"
#include "hearsay/compress.h"
#include "hearsay/error.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef int (*bench_fn)(void *ctx);

/* Median seconds per call of fn over `samples` samples of >= 20 ms each. */
static double time_it(bench_fn fn, void *ctx, int samples) {
    double t0 = now();
    int reps = 0;
    do {
        if (fn(ctx) < 0) return -1;
        reps++;
    } while (now() - t0 < 0.02);
    double *s = malloc((size_t)samples * sizeof(double));
    for (int i = 0; i < samples; i++) {
        t0 = now();
        for (int r = 0; r < reps; r++)
            if (fn(ctx) < 0) return -1;
        s[i] = (now() - t0) / reps;
    }
    qsort(s, (size_t)samples, sizeof(double), cmp_double);
    double med = s[samples / 2];
    free(s);
    return med;
}

typedef struct ctx {
    hs_compressor *c;
    const float *x;
    float *acc, *dst;
    size_t d;
    hs_buf *b;
    uint64_t round;
} ctx;

static int do_memcpy(void *p) {
    ctx *c = p;
    memcpy(c->dst, c->x, c->d * sizeof(float));
    __asm__ volatile("" : : "r"(c->dst) : "memory");
    return 0;
}

static int do_encode(void *p) {
    ctx *c = p;
    c->b->len = 0;
    /* A fixed round: random operators then do the same work every time. */
    return hs_compress_encode(c->c, c->x, c->d, 0, c->round, c->b);
}

static int do_decode(void *p) {
    ctx *c = p;
    return hs_compress_decode_add(c->c, c->b->data, c->b->len, 0, c->round, c->acc, c->d, 0.5f);
}

static const char *specs[] = {"none",       "fp16",       "bf16",      "topk:0.01",
                              "topk:0.01:fp16", "topk:0.1", "randk:0.01", "qsgd:16",
                              "qsgd:4",     "qsgd:16:4096", "sign",    "sign:512",
                              "ef:topk:0.01"};

int main(int argc, char **argv) {
    int level = -1, samples = 15;
    const char *only = NULL;
    size_t torch_d[8];
    double torch_ms[8];
    int n_torch = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--level") && i + 1 < argc) {
            level = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--samples") && i + 1 < argc) {
            samples = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--only") && i + 1 < argc) {
            only = argv[++i];
        } else if (!strcmp(argv[i], "--torch") && i + 1 < argc && n_torch < 8) {
            if (sscanf(argv[++i], "%zu:%lf", &torch_d[n_torch], &torch_ms[n_torch]) == 2)
                n_torch++;
        } else {
            fprintf(stderr,
                    "usage: %s [--level N] [--samples N] [--only SPEC] [--torch D:MS]\n",
                    argv[0]);
            return 2;
        }
    }
    if (samples < 1) samples = 1;
    if (level >= 0) hs__csimd_cap(level);
    const char *lvname[] = {"portable C", "AVX2+F16C+BMI2", "AVX-512"};
    printf("compress bench: kernels %s, %d samples (median), single thread\n",
           lvname[hs__csimd_level()], samples);
    size_t sizes[] = {235146, 4194304};
    for (int z = 0; z < 2; z++) {
        size_t d = sizes[z];
        float *x = malloc(d * sizeof(float)), *acc = calloc(d, sizeof(float)),
              *dst = malloc(d * sizeof(float));
        hs_rng r;
        hs__rng_init(&r, 1, HS_RNG_TEST, 0, 0);
        for (size_t i = 0; i < d; i++) x[i] = (float)hs__rng_normal(&r);
        memset(dst, 0, d * sizeof(float));
        ctx cx = {NULL, x, acc, dst, d, NULL, 7};
        double mc = time_it(do_memcpy, &cx, samples);
        double gb = (double)d * 4 / 1e9;
        printf("\nd = %zu (%.2f MB fp32): %s %.2f GB/s\n", d, gb * 1e3,
               "memcpy", gb / mc);
        printf("%-16s %10s %8s %10s %9s %10s %9s\n", "operator", "bytes", "ratio", "enc GB/s",
               "enc/mcpy", "dec GB/s", "enc ms");
        for (size_t s = 0; s < sizeof(specs) / sizeof(specs[0]); s++) {
            if (only && strcmp(only, specs[s])) continue;
            hs_compressor *c = NULL;
            if (hs_compressor_new(&c, specs[s], d, 1) < 0 || hs_buf_new(&cx.b, 0) < 0) {
                fprintf(stderr, "%s: %s\n", specs[s], hs_error_message());
                return 1;
            }
            cx.c = c;
            double te = time_it(do_encode, &cx, samples);
            double td = time_it(do_decode, &cx, samples);
            if (te < 0 || td < 0) {
                fprintf(stderr, "%s: %s\n", specs[s], hs_error_message());
                return 1;
            }
            printf("%-16s %10zu %7.1fx %10.2f %8.0f%% %10.2f %9.3f", specs[s], cx.b->len,
                   (double)d * 4 / (double)cx.b->len, gb / te, 100 * mc / te, gb / td,
                   te * 1e3);
            for (int t = 0; t < n_torch; t++)
                if (torch_d[t] == d && !strcmp(specs[s], "topk:0.01"))
                    printf("   torch.topk %.3f ms: %.1fx faster", torch_ms[t],
                           torch_ms[t] / (te * 1e3));
            printf("\n");
            hs_buf_unref(cx.b);
            hs_compressor_free(c);
        }
        free(x);
        free(acc);
        free(dst);
    }
    return 0;
}
