/* The body of the fuzz_decode_<op> targets: each target's .c defines FUZZ_OP (the operator's
 * name) and includes this file.
 *
 * Input: one message. The receiver's configuration is read from the message's own header when
 * it is plausible (so the fuzzer reaches the body checks instead of stopping at a mismatch),
 * else a fixed one. Invariants, checked with abort():
 *   - a rejected message leaves the destination bit-for-bit unchanged, and the error is
 *     HS_EFORMAT or HS_EMISMATCH with a message;
 *   - an accepted message adds finite values only;
 *   - the dense codecs and sign are canonical: re-encoding what an accepted message decodes to
 *     gives the same bytes. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hearsay/buf.h"
#include "hearsay/compress.h"
#include "hearsay/error.h"

#define FUZZ_MAX_D 65536u
#define FUZZ_SEED 1u /* the seed corpus is encoded with seed 1, peer 0, round 0 */

static uint32_t ld32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* The spec a receiver of this header would have; 0 if none fits (use the fallback). */
static size_t spec_of(const uint8_t *p, size_t len, char *spec, size_t n) {
    if (len < 12) return 0;
    uint32_t flags = p[1], param = (uint32_t)(p[2] | p[3] << 8), d = ld32(p + 4), k = ld32(p + 8);
    if (d < 1 || d > FUZZ_MAX_D) return 0;
    const char *op = FUZZ_OP;
    if (!strcmp(op, "topk") || !strcmp(op, "randk")) {
        if (k < 1 || k > d) return 0;
        snprintf(spec, n, "%s:%u%s%s%s", op, k, (flags & 1) ? ":fp16" : "",
                 (!strcmp(op, "topk") && (flags & 8) && !(flags & 1)) ? ":fp8" : "",
                 (!strcmp(op, "randk") && (flags & 4)) ? ":unscaled" : "");
    } else if (!strcmp(op, "qsgd")) {
        if (param < 1 || param > 32767 || k < 1) return 0;
        snprintf(spec, n, "qsgd:%u:%u", param, k);
    } else if (!strcmp(op, "sign")) {
        if (k == 0)
            snprintf(spec, n, "sign");
        else
            snprintf(spec, n, "sign:%u", k);
    } else {
        snprintf(spec, n, "%s", op);
    }
    return d;
}

static const char *fallback(void) {
    const char *op = FUZZ_OP;
    if (!strcmp(op, "topk")) return "topk:4";
    if (!strcmp(op, "randk")) return "randk:4";
    if (!strcmp(op, "qsgd")) return "qsgd:4:16";
    if (!strcmp(op, "sign")) return "sign:16";
    return op;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char spec[64];
    size_t d = spec_of(data, size, spec, sizeof(spec));
    if (!d) {
        snprintf(spec, sizeof(spec), "%s", fallback());
        d = 64;
    }
    hs_compressor *c = NULL;
    if (hs_compressor_new(&c, spec, d, FUZZ_SEED) < 0) return 0;
    float *acc = malloc(d * sizeof(float)), *copy = malloc(d * sizeof(float));
    if (!acc || !copy) abort();
    /* -0.0 is the identity of addition: acc ends up holding exactly the decoded values. */
    for (size_t i = 0; i < d; i++) acc[i] = -0.0f;
    memcpy(copy, acc, d * sizeof(float));
    int err = hs_compress_decode_add(c, data, size, 0, 0, acc, d, 1.0f);
    if (err < 0) {
        if (err != HS_EFORMAT && err != HS_EMISMATCH) abort();
        if (!hs_error_message()[0]) abort();
        if (memcmp(acc, copy, d * sizeof(float)) != 0) abort();
    } else {
        for (size_t i = 0; i < d; i++)
            if (!(acc[i] - acc[i] == 0.0f)) abort(); /* finite */
        hs_codec_id id = hs_compressor_codec(c);
        if (id == HS_CODEC_NONE || id == HS_CODEC_FP16 || id == HS_CODEC_BF16 ||
            id == HS_CODEC_SIGN) {
            hs_buf *b = NULL;
            if (hs_buf_new(&b, 0) < 0) abort();
            int n = hs_compress_encode(c, acc, d, 0, 0, b);
            if (n < 0 || (size_t)n != size || memcmp(b->data, data, size) != 0) {
                fprintf(stderr, "%s: re-encoding gives other bytes (%d of %zu)\n", spec, n, size);
                abort();
            }
            hs_buf_unref(b);
        }
    }
    free(acc);
    free(copy);
    hs_compressor_free(c);
    return 0;
}
