/* One peer of a seeded synchronous job driven through the node API (hearsay/node.h) from C, the
 * twin of node_peer.py: the same starting vector, the same local update each round
 * (x -= 0.1 * (x - rank), float32) and the same options, so the two must end with the same bits.
 *
 *   node_peer --dim D --out FILE [NAME=VALUE...]   options as hs_node_options_set takes them;
 *                                                  writes the final vector (raw float32) and
 *                                                  prints the time of the rounds (for
 *                                                  tools/bench/python/overhead.sh) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <hearsay/error.h>
#include <hearsay/node.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int fail(const char *what, int rc) {
    fprintf(stderr, "node_peer: %s: %s (%s)\n", what, hs_error_message(), hs_err_name(rc));
    return 1;
}

int main(int argc, char **argv) {
    size_t d = 0;
    const char *out = NULL;
    float rank = 0.0f;
    hs_node_options *o = NULL;
    if (hs_node_options_new(&o) < 0) return fail("options", HS_ENOMEM);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--dim") && i + 1 < argc) {
            d = (size_t)strtoul(argv[++i], NULL, 10);
        } else if (!strcmp(argv[i], "--out") && i + 1 < argc) {
            out = argv[++i];
        } else {
            char *eq = strchr(argv[i], '=');
            if (!eq) {
                fprintf(stderr, "node_peer: %s: expected NAME=VALUE\n", argv[i]);
                return 2;
            }
            *eq = '\0';
            int rc = hs_node_options_set(o, argv[i], eq + 1);
            if (rc < 0) return fail(argv[i], rc);
            if (!strcmp(argv[i], "rank")) rank = (float)atoi(eq + 1);
        }
    }
    if (!d || !out) {
        fprintf(stderr, "usage: node_peer --dim D --out FILE [NAME=VALUE...]\n");
        return 2;
    }
    float *x = malloc(d * sizeof(float));
    if (!x) return 1;
    /* The same on every peer and in node_peer.py: (k mod 101) / 101 - 0.5, in doubles. */
    for (size_t k = 0; k < d; k++) x[k] = (float)((double)(k % 101) / 101.0 - 0.5);
    hs_node *n = NULL;
    int rc = hs_node_new(&n, o, d);
    hs_node_options_free(o);
    if (rc < 0) return fail("hs_node_new", rc);
    if ((rc = hs_node_start(n, x, d)) < 0) return fail("hs_node_start", rc);
    double t0 = now(), in_step = 0;
    int rounds = 0;
    do {
        for (size_t k = 0; k < d; k++) x[k] -= 0.1f * (x[k] - rank);
        double t1 = now();
        rc = hs_node_step(n, x, d);
        in_step += now() - t1;
        rounds++;
    } while (rc == 0);
    if (rc < 0) return fail("hs_node_step", rc);
    printf("rounds %d seconds %.6f step_seconds %.6f\n", rounds, now() - t0, in_step);
    FILE *f = fopen(out, "wb");
    if (!f || fwrite(x, sizeof(float), d, f) != d || fclose(f) != 0) {
        fprintf(stderr, "node_peer: cannot write %s\n", out);
        return 1;
    }
    hs_node_free(n);
    free(x);
    return 0;
}
