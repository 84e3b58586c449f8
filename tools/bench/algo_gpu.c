/* Benchmark of one GPU peer's gossip round for each algorithm (issue 23, part 3): the device
 * path (hs__algo_to_device: x and the algorithm's state in device memory, messages through
 * the backend's pinned staging) against the host path a peer with an outer step takes (x
 * copied to the host, the CPU round, x copied back). A real hs_algo round over hs_simnet: a
 * ring of three, peer 0 on the device or on the host, peers 1 and 2 on the host. Timed: peer
 * 0's begin, push and pull (and the host path's two copies of x), wall-clock, each path ending
 * with the device synchronised; the other peers and the local step that stands for the
 * optimizer are not. The median over --rounds rounds after 2 warm-up rounds, both paths and
 * their ratio. Needs the CUDA backend (--device cuda); under ../shared/tools/cuda-emu it runs
 * (small --d) but its times mean nothing.
 *
 *   algo_gpu_bench [--algo A] [--compress C] [--d D] [--rounds N]
 *                  (defaults: choco, the algorithm's default compressor, 25000000, 20) */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BENCH_NAME "algo_gpu_bench"
#include "gpu_bench.h"
#include "algo/algo_internal.h"
#include "core/error_internal.h"
#include "hearsay/error.h"
#include "hearsay/sim.h"
#include "hearsay/tensor.h"
#include "hearsay/topo.h"
#include "tensor/gossip_ops.h"

#define PEERS 3
#define WARM 2

/* The median seconds of peer 0's round, on the device (dev) or through a host copy. */
static double run(hs_backend *be, const hs_algo_cfg *cfg, size_t d, int rounds, int dev) {
    hs_topo *topo;
    hs_simnet *sim;
    CHECK(hs_topo_new(&topo, "ring", PEERS, 1));
    CHECK(hs_simnet_new(&sim, topo));
    hs_algo *a[PEERS];
    float *x[PEERS], *tgt[PEERS], *xd = NULL, *td = NULL;
    for (int i = 0; i < PEERS; i++) {
        x[i] = malloc(sizeof(float) * d);
        tgt[i] = malloc(sizeof(float) * d);
        if (!x[i] || !tgt[i]) CHECK(hs__err(HS_ENOMEM, "out of memory"));
        fill(x[i], d, 1);
        fill(tgt[i], d, 2 + (uint64_t)i);
        CHECK(hs_algo_new(&a[i], cfg, (uint32_t)i, d, x[i]));
    }
    /* peer 0's x where its round works on it; the host path's copy is x[0] */
    CHECK(hs_be_alloc_f(be, d, &xd));
    CHECK(hs_be_alloc_f(be, d, &td));
    CHECK(hs_be_upload(be, xd, x[0], sizeof(float) * d));
    CHECK(hs_be_upload(be, td, tgt[0], sizeof(float) * d));
    if (dev) {
        int rc = hs__algo_to_device(a[0], be);
        CHECK(rc);
        if (rc == 0) CHECK(hs__err(HS_ENOTSUP, "%s keeps the host path here", cfg->compress));
    }
    double *t = malloc(sizeof(double) * (size_t)rounds);
    if (!t) CHECK(hs__err(HS_ENOMEM, "out of memory"));
    for (int r = 0; r < rounds + WARM; r++) {
        double spent = 0;
        for (int i = 0; i < PEERS; i++) {
            hs_simnet_set_clock(sim, i, (double)r + 0.5);
            double t0 = now();
            if (i == 0 && !dev) CHECK(hs_be_download(be, x[0], xd, sizeof(float) * d));
            CHECK(hs_algo_begin(a[i], hs_simnet_exchange(sim, i), (uint64_t)r,
                                i == 0 && dev ? xd : x[i]));
            if (i == 0) spent += now() - t0;
            /* the local step, untimed: x += 0.01 (target - x) */
            if (i == 0 && dev) CHECK(be->ops->gossip->acc_diff(be, xd, td, xd, d, 0.01f));
            else hs__acc_diff(x[i], tgt[i], x[i], d, 0.01f);
        }
        if (dev) CHECK(be->ops->sync(be));
        for (int ph = 0; ph < 2; ph++)
            for (int i = 0; i < PEERS; i++) {
                hs_simnet_set_clock(sim, i, (double)r + 1);
                float *xi = i == 0 && dev ? xd : x[i];
                double t0 = now();
                CHECK(ph ? hs_algo_pull(a[i], hs_simnet_exchange(sim, i), (uint64_t)r, xi)
                         : hs_algo_push(a[i], hs_simnet_exchange(sim, i), (uint64_t)r, xi));
                if (i == 0 && ph && !dev) CHECK(hs_be_upload(be, xd, x[0], sizeof(float) * d));
                if (i == 0) CHECK(be->ops->sync(be));
                if (i == 0) spent += now() - t0;
            }
        if (r >= WARM) t[r - WARM] = spent;
    }
    double med = median(t, rounds);
    free(t);
    for (int i = 0; i < PEERS; i++) {
        hs_algo_free(a[i]);
        free(x[i]);
        free(tgt[i]);
    }
    hs_be_free(be, xd);
    hs_be_free(be, td);
    hs_simnet_free(sim);
    hs_topo_free(topo);
    return med;
}

int main(int argc, char **argv) {
    const char *algo = "choco", *spec = NULL;
    size_t d = 25000000;
    int rounds = 20;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--algo")) algo = argv[i + 1];
        else if (!strcmp(argv[i], "--compress")) spec = argv[i + 1];
        else if (!strcmp(argv[i], "--d")) d = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--rounds")) rounds = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "usage: algo_gpu_bench [--algo A] [--compress C] [--d D] "
                            "[--rounds N]\n");
            return 2;
        }
    }
    if (argc % 2 == 0 || d < 1 || d > HS_GOSSIP_MAX_D || rounds < 1) {
        fprintf(stderr, "algo_gpu_bench: bad arguments (--d in 1..%zu, --rounds >= 1)\n",
                HS_GOSSIP_MAX_D);
        return 2;
    }
    hs_algo_cfg cfg;
    hs_algo_cfg_default(&cfg);
    CHECK(hs_algo_kind_parse(algo, &cfg.kind));
    cfg.compress = spec ? spec : hs_algo_kind_default_compress(cfg.kind);
    cfg.gamma_c = 0.5f;
    cfg.recv_timeout_ms = 0;
    cfg.same_start = 1;
    hs_backend *be;
    CHECK(hs_backend_open(&be, HS_DEVICE_CUDA, NULL));
    printf("%s, %s --compress %s, d = %zu, median of %d rounds (peer 0 of a ring of 3)\n",
           be->description, algo, cfg.compress, d, rounds);
    double host = run(be, &cfg, d, rounds, 0), dev = run(be, &cfg, d, rounds, 1);
    printf("host path (x down, CPU round, x up): %.3f ms\n", 1e3 * host);
    printf("device path (only messages cross):   %.3f ms\n", 1e3 * dev);
    printf("ratio host / device: %.2f\n", host / dev);
    hs_backend_close(be);
    return 0;
}
