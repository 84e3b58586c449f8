/* Benchmark of one GPU peer's CHOCO round (issue 23: top-1% of a 25M vector in <= 2 ms on the
 * device), the device path against the host path a GPU peer takes today:
 * - device: x, xhat, the two neighbours' replicas and the mix stay in device memory; the round
 *   is x - xhat, top-k on the device (only the k pairs cross PCIe), the own message decoded
 *   into xhat and the mix, the two neighbours' messages into their replicas and the mix, and
 *   the gossip step x += gamma_c m (hs_gossip_ops, src/compress/device.c);
 * - host: x copied to the host, the same round with the CPU codecs and loops, x copied back.
 * The neighbours' messages are encoded once beforehand (a ring: two in-neighbours); the local
 * step that stands for the optimizer is not timed. Times are wall-clock (the device works
 * asynchronously; every path ends waiting for it), the median over --rounds rounds after 2
 * warm-up rounds. Prints both, and their ratio. Needs the CUDA backend (--device cuda).
 *
 *   gossip_gpu_bench [--d D] [--compress SPEC] [--rounds N]   (defaults 25000000 topk:0.01 20) */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BENCH_NAME "gossip_gpu_bench"
#include "gpu_bench.h"
#include "algo/algo_internal.h"
#include "compress/device.h"
#include "hearsay/buf.h"
#include "hearsay/compress.h"
#include "hearsay/error.h"
#include "hearsay/tensor.h"
#include "tensor/gossip_ops.h"

int main(int argc, char **argv) {
    size_t d = 25000000;
    const char *spec = "topk:0.01";
    int rounds = 20;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--d") && i + 1 < argc) d = (size_t)strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--compress") && i + 1 < argc) spec = argv[++i];
        else if (!strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: gossip_gpu_bench [--d D] [--compress SPEC] [--rounds N]\n");
            return 2;
        }
    }
    if (d < 1 || rounds < 1) {
        fprintf(stderr, "gossip_gpu_bench: --d and --rounds must be at least 1\n");
        return 2;
    }
    hs_backend *be = NULL;
    CHECK(hs_backend_open(&be, HS_DEVICE_CUDA, NULL));
    if (!be->ops->gossip) {
        fprintf(stderr, "gossip_gpu_bench: %s has no device gossip\n", be->description);
        return 1;
    }
    hs_compressor *c = NULL;
    CHECK(hs_compressor_new(&c, spec, d, 7));
    const float w = 1.0f / 3.0f, gamma = 0.0135f;
    float *h[6], *dv[6]; /* x, xhat, rep0, rep1, mix, diff: host and device */
    for (int i = 0; i < 6; i++) {
        h[i] = calloc(d, sizeof(float));
        if (!h[i]) {
            fprintf(stderr, "gossip_gpu_bench: out of memory for %zu floats\n", d);
            return 1;
        }
        if (i == 0) fill(h[i], d, 1);
        CHECK(hs_be_alloc_f(be, d, &dv[i]));
        CHECK(hs_be_upload(be, dv[i], h[i], d * sizeof(float)));
    }
    /* The neighbours' messages, encoded once. */
    hs_buf *nb[2], *own = NULL;
    for (int s = 0; s < 2; s++) {
        fill(h[5], d, 10 + (uint64_t)s);
        CHECK(hs_buf_new(&nb[s], 0));
        CHECK(hs_compress_encode(c, h[5], d, 1 + (uint32_t)s, 0, nb[s]));
    }
    CHECK(hs_buf_new(&own, 0));
    const hs_gossip_ops *g = be->ops->gossip;
    double *tdev = malloc(sizeof(double) * (size_t)rounds);
    double *thost = malloc(sizeof(double) * (size_t)rounds);
    if (!tdev || !thost) return 1;
    double sq;
    for (int r = -2; r < rounds; r++) {
        /* Device path. */
        CHECK(be->ops->sync(be));
        double t0 = now();
        CHECK(g->sub(be, dv[5], dv[0], dv[1], d));
        own->len = 0;
        CHECK(hs__compress_encode_be(c, be, dv[5], d, 0, 0, own));
        CHECK(hs__compress_decode_add2_be(c, be, own->data, own->len, 0, 0, dv[1], 1.0f, dv[4],
                                          -2.0f * w, d));
        for (int s = 0; s < 2; s++)
            CHECK(hs__compress_decode_add2_be(c, be, nb[s]->data, nb[s]->len, 1 + (uint32_t)s, 0,
                                              dv[2 + s], 1.0f, dv[4], w, d));
        CHECK(g->step_sq(be, dv[0], dv[4], gamma, d, &sq));
        CHECK(be->ops->sync(be));
        double t1 = now();
        /* Host path: x crosses both ways. */
        CHECK(hs_be_download(be, h[0], dv[0], d * sizeof(float)));
        for (size_t k = 0; k < d; k++) h[5][k] = h[0][k] - h[1][k];
        own->len = 0;
        CHECK(hs_compress_encode(c, h[5], d, 0, 0, own));
        CHECK(hs_compress_decode_add2(c, own->data, own->len, 0, 0, h[1], 1.0f, h[4], -2.0f * w,
                                      d));
        for (int s = 0; s < 2; s++)
            CHECK(hs_compress_decode_add2(c, nb[s]->data, nb[s]->len, 1 + (uint32_t)s, 0, h[2 + s],
                                          1.0f, h[4], w, d));
        (void)hs__step_sq(h[0], h[4], gamma, d);
        CHECK(hs_be_upload(be, dv[0], h[0], d * sizeof(float)));
        double t2 = now();
        if (r >= 0) {
            tdev[r] = t1 - t0;
            thost[r] = t2 - t1;
        }
    }
    double md = median(tdev, rounds), mh = median(thost, rounds);
    printf("%s\nCHOCO round, %s, d = %zu, ring (2 neighbours), median of %d rounds:\n",
           be->description, hs_compressor_name(c), d, rounds);
    printf("  device path: %.3f ms (only the messages cross PCIe)\n", md * 1e3);
    printf("  host path:   %.3f ms (x copied to the host and back)\n", mh * 1e3);
    printf("  host / device: %.2fx\n", mh / md);
    for (int i = 0; i < 6; i++) {
        hs_be_free(be, dv[i]);
        free(h[i]);
    }
    hs_buf_unref(nb[0]);
    hs_buf_unref(nb[1]);
    hs_buf_unref(own);
    free(tdev);
    free(thost);
    hs_compressor_free(c);
    hs_backend_close(be);
    return 0;
}
