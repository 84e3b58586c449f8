/* One peer of a consensus job through the node API (hearsay/node.h) that only averages: each
 * rank starts from a vector of its own (same-start=0, the node API's documented mode for
 * consensus experiments), no local update. Every peer knows every rank's start, so it reports
 * how far its final vector is from their mean.
 *
 *   avg_peer --dim D --world N [NAME=VALUE...]   options as hs_node_options_set takes them
 *                                                (world and rank among them); prints
 *                                                "rounds R max_err E" and exits 0 on success */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hearsay/error.h>
#include <hearsay/node.h>

/* A start of rank r in [-1, 1): a splitmix64 of (r, k), the same in every process. */
static float start(unsigned r, size_t k) {
    uint64_t z = ((uint64_t)r << 40) + k + 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return (float)((double)(z >> 11) / 4503599627370496.0 - 1.0);
}

static int fail(const char *what, int rc) {
    fprintf(stderr, "avg_peer: %s: %s (%s)\n", what, hs_error_message(), hs_err_name(rc));
    return 1;
}

int main(int argc, char **argv) {
    size_t d = 0;
    unsigned world = 0, rank = 0;
    hs_node_options *o = NULL;
    if (hs_node_options_new(&o) < 0) return fail("options", HS_ENOMEM);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--dim") && i + 1 < argc) {
            d = (size_t)strtoul(argv[++i], NULL, 10);
            continue;
        }
        char *eq = strchr(argv[i], '=');
        if (!eq) {
            fprintf(stderr, "avg_peer: %s: expected NAME=VALUE\n", argv[i]);
            return 2;
        }
        *eq = '\0';
        int rc = hs_node_options_set(o, argv[i], eq + 1);
        if (rc < 0) return fail(argv[i], rc);
        if (!strcmp(argv[i], "rank")) rank = (unsigned)atoi(eq + 1);
        if (!strcmp(argv[i], "world")) world = (unsigned)atoi(eq + 1);
    }
    if (!d || !world || rank >= world) {
        fprintf(stderr, "usage: avg_peer --dim D world=N rank=R [NAME=VALUE...]\n");
        return 2;
    }
    float *x = malloc(d * sizeof(float));
    if (!x) return 1;
    for (size_t k = 0; k < d; k++) x[k] = start(rank, k);
    hs_node *n = NULL;
    int rc = hs_node_new(&n, o, d);
    hs_node_options_free(o);
    if (rc < 0) return fail("hs_node_new", rc);
    if ((rc = hs_node_start(n, x, d)) < 0) return fail("hs_node_start", rc);
    float *mean = malloc(d * sizeof(float));
    if (!mean) return 1;
    for (size_t k = 0; k < d; k++) {
        double m = 0;
        for (unsigned r = 0; r < world; r++) m += start(r, k);
        mean[k] = (float)(m / world);
    }
    int rounds = 0;
    do {
        /* A loss for the metrics: the mean square distance to the mean of the starts. */
        double ms = 0;
        for (size_t k = 0; k < d; k++) ms += ((double)x[k] - mean[k]) * ((double)x[k] - mean[k]);
        hs_node_report(n, ms / (double)d, NAN);
        rc = hs_node_step(n, x, d);
        rounds++;
    } while (rc == 0);
    if (rc < 0) return fail("hs_node_step", rc);
    double err = 0;
    for (size_t k = 0; k < d; k++) {
        double e = fabs((double)x[k] - mean[k]);
        if (e > err) err = e;
    }
    free(mean);
    printf("rounds %d max_err %.3g\n", rounds, err);
    hs_node_free(n);
    free(x);
    return 0;
}
