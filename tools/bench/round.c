/* Benchmark of one peer's gossip work per round, CHOCO against BEER with the same compressor
 * (issue 14: BEER at most 2.2x CHOCO, as it sends two compressed vectors instead of one). It
 * runs the real hs_algo code over hs_simnet on a ring (every peer has two neighbours, as in the
 * experiments) and times begin + push + pull of every peer, single thread, divided by the
 * number of peers: encoding, decoding the own message and the neighbours' into the replicas,
 * and the mixing and model/tracker updates around them. Not timed: the local step that stands
 * for the optimizer (x -= 0.01 g, g one of three N(0, 1) vectors, a different one each round
 * and peer, so top-k selects new coordinates every round). Next to them, the codec alone: one
 * vector's encode plus three decode-adds (the own message and two neighbours'), the floor of
 * CHOCO's round; BEER's floor is twice that.
 *
 *   round_bench [--d D]... [--compress SPEC]... [--peers N] [--blocks B]
 *
 * Defaults: d = 235,146 (the default MLP) and 4,194,304; topk:0.01 and topk:0.03:fp16; 4 peers
 * (a ring's per-peer work does not depend on its size); 3 blocks. Times are the thread's CPU
 * time (the machine is shared). An algorithm's figure is the median over blocks of the mean
 * round of a block of 64 consecutive rounds, after 3 warm-up rounds: BEER rebuilds its mixes
 * from the replicas every 64 rounds, and each block holds one such round. The codec's figure is
 * the median of 64 repetitions. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/rng.h"
#include "hearsay/algo.h"
#include "hearsay/buf.h"
#include "hearsay/compress.h"
#include "hearsay/error.h"
#include "hearsay/sim.h"
#include "hearsay/topo.h"

enum { WARMUP = 3, BLOCK = 64, N_STEPS = 3, MAX_LIST = 8 };

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *s, int n) {
    qsort(s, (size_t)n, sizeof(double), cmp_double);
    return s[n / 2];
}

/* Seconds per peer and round of `kind`'s begin + push + pull on a ring of n peers: the median
 * over `blocks` blocks of BLOCK rounds of the block's mean. */
static int time_rounds(hs_algo_kind kind, const char *spec, size_t d, int n, int blocks,
                       float *const *steps, double *out) {
    hs_topo *topo = NULL;
    hs_simnet *sim = NULL;
    hs_algo **a = calloc((size_t)n, sizeof(*a));
    float **x = calloc((size_t)n, sizeof(*x));
    double *t = calloc((size_t)blocks, sizeof(double));
    int err = HS_ENOMEM;
    if (!a || !x || !t) goto done;
    if ((err = hs_topo_generate(&topo, "ring", n, 5)) < 0 ||
        (err = hs_simnet_new(&sim, topo)) < 0)
        goto done;
    hs_algo_cfg cfg;
    hs_algo_cfg_default(&cfg);
    cfg.kind = kind;
    cfg.compress = spec;
    cfg.seed = 77;
    cfg.same_start = 1;
    if ((err = hs_algo_cfg_set_topology(&cfg, topo)) < 0) goto done;
    for (int i = 0; i < n; i++) {
        err = HS_ENOMEM;
        if (!(x[i] = malloc(sizeof(float) * d))) goto done;
        memcpy(x[i], steps[0], sizeof(float) * d);
        if ((err = hs_algo_new(&a[i], &cfg, (uint32_t)i, d, x[i])) < 0) goto done;
    }
    for (int r = 0; r < WARMUP + blocks * BLOCK; r++) {
        double busy = 0, t0 = now();
        for (int i = 0; i < n; i++)
            if ((err = hs_algo_begin(a[i], hs_simnet_exchange(sim, i), (uint64_t)r, x[i])) < 0)
                goto done;
        busy += now() - t0;
        for (int i = 0; i < n; i++) {
            const float *g = steps[(r + i) % N_STEPS];
            for (size_t k = 0; k < d; k++) x[i][k] = x[i][k] - 0.01f * g[k];
        }
        t0 = now();
        for (int i = 0; i < n; i++) {
            hs_simnet_set_clock(sim, i, (double)r + 1);
            if ((err = hs_algo_push(a[i], hs_simnet_exchange(sim, i), (uint64_t)r, x[i])) < 0)
                goto done;
        }
        for (int i = 0; i < n; i++)
            if ((err = hs_algo_pull(a[i], hs_simnet_exchange(sim, i), (uint64_t)r, x[i])) < 0)
                goto done;
        busy += now() - t0;
        if (r >= WARMUP) t[(r - WARMUP) / BLOCK] += busy / n / BLOCK;
    }
    *out = median(t, blocks);
    err = 0;
done:
    for (int i = 0; a && x && i < n; i++) {
        hs_algo_free(a[i]);
        free(x[i]);
    }
    free(a);
    free(x);
    free(t);
    hs_simnet_free(sim);
    hs_topo_free(topo);
    return err;
}

/* Median seconds of one encode plus three decode-adds of a d-vector with `spec`. */
static int time_codec(const char *spec, size_t d, float *const *steps, double *out) {
    int rounds = BLOCK;
    hs_compressor *c = NULL;
    hs_buf *b = NULL;
    float *acc = calloc(d, sizeof(float));
    double *t = malloc(sizeof(double) * (size_t)rounds);
    int err = HS_ENOMEM;
    if (!acc || !t) goto done;
    if ((err = hs_compressor_new(&c, spec, d, 77)) < 0 || (err = hs_buf_new(&b, 0)) < 0)
        goto done;
    for (int r = 0; r < WARMUP + rounds; r++) {
        double t0 = now();
        b->len = 0;
        if ((err = hs_compress_encode(c, steps[r % N_STEPS], d, 0, (uint64_t)r, b)) < 0)
            goto done;
        for (int k = 0; k < 3; k++)
            if ((err = hs_compress_decode_add(c, b->data, b->len, 0, (uint64_t)r, acc, d,
                                              0.5f)) < 0)
                goto done;
        if (r >= WARMUP) t[r - WARMUP] = now() - t0;
    }
    *out = median(t, rounds);
    err = 0;
done:
    hs_buf_unref(b);
    hs_compressor_free(c);
    free(acc);
    free(t);
    return err;
}

int main(int argc, char **argv) {
    size_t ds[MAX_LIST] = {235146, 4194304};
    const char *specs[MAX_LIST] = {"topk:0.01", "topk:0.03:fp16"};
    int n_d = 0, n_spec = 0, peers = 4, blocks = 3;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--d") && i + 1 < argc && n_d < MAX_LIST) {
            ds[n_d++] = (size_t)atol(argv[++i]);
        } else if (!strcmp(argv[i], "--compress") && i + 1 < argc && n_spec < MAX_LIST) {
            specs[n_spec++] = argv[++i];
        } else if (!strcmp(argv[i], "--peers") && i + 1 < argc) {
            peers = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--blocks") && i + 1 < argc) {
            blocks = atoi(argv[++i]);
        } else {
            fprintf(stderr, "usage: round_bench [--d D]... [--compress SPEC]... [--peers N] "
                            "[--blocks B]\n");
            return 2;
        }
    }
    if (!n_d) n_d = 2;
    if (!n_spec) n_spec = 2;
    if (peers < 3 || blocks < 1) {
        fprintf(stderr, "round_bench: --peers must be at least 3 and --blocks at least 1\n");
        return 2;
    }
    for (int z = 0; z < n_d; z++)
        if (ds[z] < 1) {
            fprintf(stderr, "round_bench: --d must be at least 1\n");
            return 2;
        }
    printf("gossip work per peer and round (begin + push + pull), ring of %d peers, single "
           "thread CPU time, median over %d blocks of %d rounds\n\n",
           peers, blocks, BLOCK);
    printf("| d | compressor | codec: encode + 3 decodes (ms) | CHOCO (ms) | BEER (ms) | "
           "BEER / CHOCO |\n|---|---|---|---|---|---|\n");
    for (int z = 0; z < n_d; z++) {
        size_t d = ds[z];
        float *steps[N_STEPS] = {0};
        for (int s = 0; s < N_STEPS; s++) {
            if (!(steps[s] = malloc(sizeof(float) * d))) {
                fprintf(stderr, "round_bench: out of memory for d = %zu\n", d);
                return 1;
            }
            hs_rng r;
            hs__rng_init(&r, 1, HS_RNG_TEST, (uint32_t)s, 0);
            for (size_t k = 0; k < d; k++) steps[s][k] = (float)hs__rng_normal(&r);
        }
        for (int c = 0; c < n_spec; c++) {
            double codec, choco, beer;
            if (time_codec(specs[c], d, steps, &codec) < 0 ||
                time_rounds(HS_ALGO_CHOCO, specs[c], d, peers, blocks, steps, &choco) < 0 ||
                time_rounds(HS_ALGO_BEER, specs[c], d, peers, blocks, steps, &beer) < 0) {
                fprintf(stderr, "round_bench: d = %zu, %s: %s\n", d, specs[c],
                        hs_error_message());
                return 1;
            }
            printf("| %zu | %s | %.3f | %.3f | %.3f | %.2fx |\n", d, specs[c], codec * 1e3,
                   choco * 1e3, beer * 1e3, beer / choco);
            fflush(stdout);
        }
        for (int s = 0; s < N_STEPS; s++) free(steps[s]);
    }
    return 0;
}
