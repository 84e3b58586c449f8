/* Writes the seed corpora of the fuzz_decode_* targets into DIR/fuzz_decode_<op>/: valid
 * messages of a few configurations and sizes (seed 1, peer 0, round 0, as the targets expect),
 * plus a truncated one each. Usage: gen_compress_corpus DIR */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hearsay/buf.h"
#include "hearsay/compress.h"
#include "hearsay/error.h"

static int write_file(const char *dir, const char *op, const char *name, const uint8_t *p,
                      size_t n) {
    char path[1024];
    snprintf(path, sizeof(path), "%s/fuzz_decode_%s/%s", dir, op, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, n, f) != n) {
        fprintf(stderr, "gen_compress_corpus: cannot write %s\n", path);
        if (f) fclose(f);
        return 1;
    }
    fclose(f);
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: gen_compress_corpus DIR\n");
        return 2;
    }
    static const struct {
        const char *op, *spec;
        size_t d;
    } seeds[] = {
        {"none", "none", 1},          {"none", "none", 13},           {"none", "none", 100},
        {"fp16", "fp16", 1},          {"fp16", "fp16", 13},           {"fp16", "fp16", 100},
        {"bf16", "bf16", 1},          {"bf16", "bf16", 13},           {"bf16", "bf16", 100},
        {"topk", "topk:1", 1},        {"topk", "topk:3", 13},         {"topk", "topk:0.01", 1000},
        {"topk", "topk:0.5:fp16", 50}, {"topk", "topk:0.9", 100},
        {"randk", "randk:1", 1},      {"randk", "randk:3", 13},       {"randk", "randk:0.1:fp16", 200},
        {"randk", "randk:0.2:unscaled", 100},
        {"qsgd", "qsgd:1", 1},        {"qsgd", "qsgd:4:8", 13},       {"qsgd", "qsgd:16", 1000},
        {"qsgd", "qsgd:200:50", 120},
        {"sign", "sign", 1},          {"sign", "sign", 13},           {"sign", "sign:16", 100},
        {"topk", "topk:0.3:fp8", 60},
    };
    int bad = 0;
    for (size_t s = 0; s < sizeof(seeds) / sizeof(seeds[0]); s++) {
        size_t d = seeds[s].d;
        float *x = malloc(d * sizeof(float));
        for (size_t i = 0; i < d; i++) x[i] = (float)sin((double)i * 1.7 + 0.3) * (float)(1 + i % 5);
        hs_compressor *c = NULL;
        hs_buf *b = NULL;
        if (hs_compressor_new(&c, seeds[s].spec, d, 1) < 0 || hs_buf_new(&b, 0) < 0 ||
            hs_compress_encode(c, x, d, 0, 0, b) < 0) {
            fprintf(stderr, "gen_compress_corpus: %s: %s\n", seeds[s].spec, hs_error_message());
            return 1;
        }
        char name[64];
        snprintf(name, sizeof(name), "valid-%zu", s);
        bad |= write_file(argv[1], seeds[s].op, name, b->data, b->len);
        if (b->len > 12) {
            snprintf(name, sizeof(name), "truncated-%zu", s);
            bad |= write_file(argv[1], seeds[s].op, name, b->data, b->len - 1);
        }
        hs_buf_unref(b);
        hs_compressor_free(c);
        free(x);
    }
    return bad;
}
