/* Every compressor's round trip on one vector past 2^28 values (issue 21: the codecs other than
 * the dense casts were limited to 2^28): encode, decode into zeros, and the dense reference
 * (hs_compress_apply), compared element by element, with each step's time. Three vectors of d
 * floats and one message: about 3.5 GB at the default d = 2^28 + 3, so it is not in the suite.
 *
 *   ninja -C build tools/bench/codecs_big && build/tools/bench/codecs_big [D [SPEC...]]
 *
 * Default specs: topk:0.01, topk:0.01:fp8, randk:0.01, randk:0.01:fp16, qsgd:16, qsgd:32767,
 * sign, sign:512. Exit 0 only if every decode equals the reference in every element. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hearsay/buf.h"
#include "hearsay/compress.h"
#include "hearsay/error.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* A deterministic vector with values over a range of magnitudes and both signs, so that top-k,
 * the buckets and the signs all have something to choose. */
static void fill(float *x, size_t d) {
    uint64_t s = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < d; i++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        float u = (float)(s >> 40) * 0x1p-24f; /* [0, 1) */
        x[i] = (u - 0.5f) * (float)(1 + (s & 7));
    }
}

/* Encodes x, decodes into acc (zeros), and compares with the reference ref; 0 when equal. */
static int run(const char *spec, const float *x, float *acc, float *ref, size_t d) {
    hs_compressor *c = NULL;
    hs_buf *b = NULL;
    int rc = hs_compressor_new(&c, spec, d, 42);
    if (rc == 0) rc = hs_buf_new(&b, 0);
    if (rc < 0) {
        fprintf(stderr, "%s: %s\n", spec, hs_error_message());
        hs_compressor_free(c);
        return 1;
    }
    double t0 = now();
    rc = hs_compress_encode(c, x, d, 3, 7, b);
    double t1 = now();
    memset(acc, 0, d * sizeof(float));
    double t2 = now();
    if (rc > 0) rc = hs_compress_decode_add(c, b->data, b->len, 3, 7, acc, d, 1.0f);
    double t3 = now();
    if (rc >= 0) rc = hs_compress_apply(c, x, d, 3, 7, ref);
    if (rc < 0) {
        fprintf(stderr, "%s: %s\n", spec, hs_error_message());
        hs_buf_unref(b);
        hs_compressor_free(c);
        return 1;
    }
    size_t bad = 0, first = 0, nonzero = 0;
    for (size_t i = 0; i < d; i++) {
        /* 0 + r is r for every r but -0.0 (it gives +0.0): compare as numbers */
        if (acc[i] != ref[i] && !bad++) first = i;
        nonzero += acc[i] != 0.0f;
    }
    printf("%-16s d %zu  message %zu bytes  encode %.2f s  decode %.2f s  nonzero %zu  %s", spec,
           d, b->len, t1 - t0, t3 - t2, nonzero, bad ? "MISMATCH" : "equal to the reference\n");
    if (bad)
        printf(" in %zu elements, the first %zu: %.9g against %.9g\n", bad, first,
               (double)acc[first], (double)ref[first]);
    hs_buf_unref(b);
    hs_compressor_free(c);
    return bad != 0;
}

int main(int argc, char **argv) {
    size_t d = argc > 1 ? (size_t)strtoull(argv[1], NULL, 10) : ((size_t)1 << 28) + 3;
    static const char *defaults[] = {"topk:0.01", "topk:0.01:fp8", "randk:0.01",
                                     "randk:0.01:fp16", "qsgd:16", "qsgd:32767", "sign",
                                     "sign:512"};
    float *x = malloc(d * sizeof(float)), *acc = malloc(d * sizeof(float)),
          *ref = malloc(d * sizeof(float));
    if (!d || !x || !acc || !ref) {
        fprintf(stderr, "codecs_big: 3 vectors of %zu floats: out of memory\n", d);
        return 2;
    }
    fill(x, d);
    int fails = 0;
    if (argc > 2)
        for (int i = 2; i < argc; i++) fails += run(argv[i], x, acc, ref, d);
    else
        for (size_t i = 0; i < sizeof(defaults) / sizeof(defaults[0]); i++)
            fails += run(defaults[i], x, acc, ref, d);
    free(x);
    free(acc);
    free(ref);
    printf("%s\n", fails ? "FAILED" : "all equal");
    return fails ? 1 : 0;
}
