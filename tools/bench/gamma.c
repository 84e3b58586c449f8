/* Benchmark: the largest CHOCO consensus step gamma_c that keeps pure CHOCO-gossip bounded, per
 * (compressor, topology). It runs the real hs_algo code over hs_simnet with learning rate 0
 * (no local update), peers starting from different random vectors (same_start = 0), and
 * bisects gamma_c over a fixed log grid. docs/RESULTS.md has its table.
 *
 *   gamma_bench [--d D] [--rounds R] [--only COMPRESS@TOPO:N] [--check GAMMA|auto]
 *
 * "Bounded" (with R rounds, w = R / 5, D(r) the exact consensus distance after round r):
 *   every D(r) is finite and at most 10 D(0), and
 *   max D over the last w rounds <= 2 max D over the w rounds before them,
 * so a distance that still grows geometrically at the end is caught however small it is, and a
 * distance that shrinks or sits at float round-off passes. The grid is 10^(k/8) for k = -24..0
 * (0.001 .. 1, ratio 1.33); the result is the largest grid value found bounded (assuming
 * stability is monotone in gamma_c, which every measured cell showed). --check runs each cell
 * at one gamma_c and reports bounded or not, the rounds run (a run stops once unbounded) and the
 * largest distance in each window. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/philox.h"
#include "core/rng.h"
#include "hearsay/algo.h"
#include "hearsay/compress.h"
#include "hearsay/error.h"
#include "hearsay/sim.h"
#include "hearsay/topo.h"

typedef struct cell {
    const char *compress, *topo;
    int n;
} cell;

static const cell default_cells[] = {
    {"topk:0.01", "ring", 8},    {"topk:0.01", "ring", 16},    {"topk:0.01", "torus:4x4", 16},
    {"topk:0.01", "exponential", 16}, {"topk:0.01", "complete", 8},
    {"topk:0.1", "ring", 8},     {"topk:0.1", "ring", 16},     {"topk:0.1", "torus:4x4", 16},
    {"topk:0.1", "exponential", 16},  {"topk:0.1", "complete", 8},
    {"sign", "ring", 8},         {"sign", "ring", 16},         {"sign", "torus:4x4", 16},
    {"sign", "exponential", 16}, {"sign", "complete", 8},
    {"qsgd:16", "ring", 8},      {"qsgd:16", "ring", 16},      {"qsgd:16", "torus:4x4", 16},
    {"qsgd:16", "exponential", 16},   {"qsgd:16", "complete", 8},
    {"randk:0.01:unscaled", "ring", 8}, {"randk:0.01:unscaled", "ring", 16},
    {"randk:0.01:unscaled", "torus:4x4", 16}, {"randk:0.01:unscaled", "exponential", 16},
    {"randk:0.01:unscaled", "complete", 8},
};

typedef struct result {
    int bounded;
    int rounds_run;
    double d0, w1_max, w2_max, peak;
} result;

static double gap_of(const hs_topo *t) {
    hs_topo_report rep;
    if (hs_topo_check(t, 0, &rep) < 0 || !rep.gap_computed) return NAN;
    return rep.gap;
}

/* Exact consensus distance (1/n) sum_i ||x_i - avg||^2 / d, in double. */
static double consensus(float **x, int n, size_t d, double *avg) {
    memset(avg, 0, sizeof(double) * d);
    for (int i = 0; i < n; i++)
        for (size_t k = 0; k < d; k++) avg[k] += x[i][k];
    for (size_t k = 0; k < d; k++) avg[k] /= n;
    double s = 0;
    for (int i = 0; i < n; i++)
        for (size_t k = 0; k < d; k++) {
            double e = x[i][k] - avg[k];
            s += e * e;
        }
    return s / n / (double)d;
}

static int run(const cell *c, size_t d, int rounds, float gamma_c, result *res) {
    hs_topo *topo = NULL;
    hs_simnet *sim = NULL;
    int n = c->n, err = 0;
    hs_algo **a = calloc((size_t)n, sizeof(*a));
    float **x = calloc((size_t)n, sizeof(*x));
    double *avg = malloc(sizeof(double) * d);
    memset(res, 0, sizeof(*res));
    if ((err = hs_topo_generate(&topo, c->topo, n, 5)) < 0 || (err = hs_simnet_new(&sim, topo)) < 0)
        goto done;
    hs_algo_cfg cfg;
    hs_algo_cfg_default(&cfg);
    cfg.kind = HS_ALGO_CHOCO;
    cfg.compress = c->compress;
    cfg.gamma_c = gamma_c;
    cfg.same_start = 0;
    cfg.seed = 77;
    for (int i = 0; i < n; i++) {
        x[i] = malloc(sizeof(float) * d);
        hs_rng r;
        hs__rng_init(&r, 123, HS_RNG_TEST, (uint32_t)i, 0);
        for (size_t k = 0; k < d; k++) x[i][k] = (float)hs__rng_normal(&r);
        if ((err = hs_algo_new(&a[i], &cfg, (uint32_t)i, d, x[i])) < 0) goto done;
    }
    int w = rounds / 5;
    res->d0 = res->peak = consensus(x, n, d, avg);
    res->bounded = 1;
    for (int r = 0; r < rounds; r++) {
        for (int i = 0; i < n && !err; i++)
            err = hs_algo_begin(a[i], hs_simnet_exchange(sim, i), (uint64_t)r, x[i]);
        for (int i = 0; i < n && !err; i++) {
            hs_simnet_set_clock(sim, i, (double)r + 1);
            err = hs_algo_push(a[i], hs_simnet_exchange(sim, i), (uint64_t)r, x[i]);
        }
        for (int i = 0; i < n && !err; i++)
            err = hs_algo_pull(a[i], hs_simnet_exchange(sim, i), (uint64_t)r, x[i]);
        res->rounds_run = r + 1;
        if (err == HS_ERANGE) { /* a value overflowed the message format: diverged */
            err = 0;
            res->bounded = 0;
            break;
        }
        if (err < 0) goto done;
        double dist = consensus(x, n, d, avg);
        if (!isfinite(dist) || dist > 10 * res->d0) {
            res->peak = dist;
            res->bounded = 0;
            break;
        }
        if (dist > res->peak) res->peak = dist;
        if (r >= rounds - 2 * w && r < rounds - w && dist > res->w1_max) res->w1_max = dist;
        if (r >= rounds - w && dist > res->w2_max) res->w2_max = dist;
    }
    if (res->bounded && res->w2_max > 2 * res->w1_max) res->bounded = 0;
done:
    for (int i = 0; i < n; i++) {
        hs_algo_free(a[i]);
        free(x[i]);
    }
    free(a);
    free(x);
    free(avg);
    hs_simnet_free(sim);
    hs_topo_free(topo);
    return err;
}

static int parse_cell(const char *s, cell *c) {
    static char buf[256];
    snprintf(buf, sizeof(buf), "%s", s);
    char *at = strchr(buf, '@'), *colon = at ? strrchr(at, ':') : NULL;
    if (!at || !colon) return -1;
    *at = *colon = '\0';
    c->compress = buf;
    c->topo = at + 1;
    c->n = atoi(colon + 1);
    return c->n > 1 ? 0 : -1;
}

int main(int argc, char **argv) {
    size_t d = 20000;
    int rounds = 5000;
    double check = 0;
    int check_auto = 0;
    cell only;
    const cell *cells = default_cells;
    size_t n_cells = sizeof(default_cells) / sizeof(default_cells[0]);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--d") && i + 1 < argc) d = (size_t)atol(argv[++i]);
        else if (!strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--check") && i + 1 < argc) {
            /* auto: the automatic step, which hs_algo_new resolves from gamma_c = 0. */
            check_auto = !strcmp(argv[++i], "auto");
            check = check_auto ? 1 : atof(argv[i]);
        }
        else if (!strcmp(argv[i], "--only") && i + 1 < argc && parse_cell(argv[++i], &only) == 0) {
            cells = &only;
            n_cells = 1;
        } else {
            fprintf(stderr, "usage: gamma_bench [--d D] [--rounds R] [--only COMPRESS@TOPO:N] "
                            "[--check GAMMA|auto]\n");
            return 2;
        }
    }
    if (d < 1 || rounds < 10 || check < 0 || check > 1) {
        fprintf(stderr, "gamma_bench: bad --d, --rounds or --check\n");
        return 2;
    }
    float grid[25];
    for (int k = 0; k < 25; k++) grid[k] = (float)pow(10.0, (k - 24) / 8.0);
    printf("pure CHOCO-gossip, d = %zu, %d rounds, lr 0, different random starts\n\n", d, rounds);
    if (check > 0)
        printf("| compressor | topology | n | gap | delta | gamma_c | bounded | rounds run | D(0) | "
               "max D (2nd-last window) | max D (last window) |\n"
               "|---|---|---|---|---|---|---|---|---|---|---|\n");
    else
        printf("| compressor | topology | n | gap | delta | largest bounded gamma_c | default "
               "gamma_c | runs |\n|---|---|---|---|---|---|---|---|\n");
    fflush(stdout);
    for (size_t ci = 0; ci < n_cells; ci++) {
        const cell *c = &cells[ci];
        hs_topo *t = NULL;
        hs_compressor *comp = NULL;
        if (hs_topo_generate(&t, c->topo, c->n, 5) < 0 || hs_compressor_new(&comp, c->compress, d, 77) < 0) {
            fprintf(stderr, "gamma_bench: %s\n", hs_error_message());
            return 1;
        }
        double gap = gap_of(t), delta = hs_compressor_delta(comp);
        float def = 0;
        if (hs_algo_auto_gamma_c(comp, &def, NULL) < 0) {
            fprintf(stderr, "gamma_bench: %s\n", hs_error_message());
            return 1;
        }
        hs_topo_free(t);
        hs_compressor_free(comp);
        result res;
        if (check > 0) {
            if (run(c, d, rounds, check_auto ? 0.0f : (float)check, &res) < 0) {
                fprintf(stderr, "gamma_bench: %s\n", hs_error_message());
                return 1;
            }
            printf("| %s | %s | %d | %.4f | %.4g | %.4g | %s | %d | %.3g | %.3g | %.3g |\n",
                   c->compress, c->topo, c->n, gap, delta, check_auto ? (double)def : check,
                   res.bounded ? "yes" : "NO",
                   res.rounds_run, res.d0, res.w1_max, res.w2_max);
            fflush(stdout);
            continue;
        }
        int lo = -1, hi = 25, runs = 0; /* grid[lo] bounded, grid[hi] not (sentinels) */
        while (hi - lo > 1) {
            int mid = (lo + hi) / 2;
            if (run(c, d, rounds, grid[mid], &res) < 0) {
                fprintf(stderr, "gamma_bench: %s\n", hs_error_message());
                return 1;
            }
            runs++;
            if (res.bounded) lo = mid;
            else hi = mid;
        }
        char limit[32];
        if (lo < 0) snprintf(limit, sizeof(limit), "< %.3g", (double)grid[0]);
        else snprintf(limit, sizeof(limit), "%.3g", (double)grid[lo]);
        printf("| %s | %s | %d | %.4f | %.4g | %s | %.3g | %d |\n", c->compress, c->topo, c->n, gap,
               delta, limit, (double)def, runs);
        fflush(stdout);
    }
    return 0;
}
