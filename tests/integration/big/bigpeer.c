/* One peer of a job with a large vector, driven through the node API (hearsay/node.h): the same
 * start on every peer, a local update each round that pulls rank r's vector towards r (so that
 * only the gossip keeps the peers together), and at the end a line with what the test checks:
 *
 *   bigpeer --dim D [--stop-after K] [NAME=VALUE...]   options as hs_node_options_set takes
 *   -> "steps N x0 X xmid X xlast X hwm_kb N vec_kb N start_s T round_s T start_hwm_kb N"
 *
 * --stop-after K asks the node to stop after K steps with a checkpoint (hs_node_request_stop),
 * as a SIGTERM does; that ends with status 0 too. hwm_kb is the process's peak resident memory
 * (VmHWM of /proc/self/status), start_hwm_kb the same once hs_node_start returned (a joiner:
 * with the WELCOME's snapshot adopted), vec_kb the vector's own size, steps the rounds run;
 * start_s the time hs_node_start
 * took (a joiner: dialing, WELCOME with the snapshot, adopting it), round_s the median time of a
 * step (tools/bench/big reads these two). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <hearsay/error.h>
#include <hearsay/node.h>

static long vm_hwm_kb(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    while (f && fgets(line, sizeof(line), f))
        if (!strncmp(line, "VmHWM:", 6))
            kb = atol(line + 6);
    if (f)
        fclose(f);
    return kb;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int fail(const char *what, int rc) {
    fprintf(stderr, "bigpeer: %s: %s (%s)\n", what, hs_error_message(), hs_err_name(rc));
    return 1;
}

int main(int argc, char **argv) {
    size_t d = 0;
    long stop_after = -1;
    float rank = 0.0f;
    hs_node_options *o = NULL;
    if (hs_node_options_new(&o) < 0)
        return fail("options", HS_ENOMEM);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--dim") && i + 1 < argc) {
            d = (size_t)strtoull(argv[++i], NULL, 10);
        } else if (!strcmp(argv[i], "--stop-after") && i + 1 < argc) {
            stop_after = atol(argv[++i]);
        } else {
            char *eq = strchr(argv[i], '=');
            if (!eq) {
                fprintf(stderr, "bigpeer: %s: expected NAME=VALUE\n", argv[i]);
                return 2;
            }
            *eq = '\0';
            int rc = hs_node_options_set(o, argv[i], eq + 1);
            if (rc < 0)
                return fail(argv[i], rc);
            if (!strcmp(argv[i], "rank"))
                rank = (float)atoi(eq + 1);
        }
    }
    if (!d) {
        fprintf(stderr, "usage: bigpeer --dim D [--stop-after K] [NAME=VALUE...]\n");
        return 2;
    }
    float *x = malloc(d * sizeof(float));
    if (!x)
        return fail("vector", HS_ENOMEM);
    for (size_t k = 0; k < d; k++)
        x[k] = (float)((double)(k % 101) / 101.0 - 0.5);
    hs_node *n = NULL;
    int rc = hs_node_new(&n, o, d);
    hs_node_options_free(o);
    if (rc < 0)
        return fail("hs_node_new", rc);
    double t0 = now();
    if ((rc = hs_node_start(n, x, d)) < 0)
        return fail("hs_node_start", rc);
    double start_s = now() - t0, times[4096];
    long start_hwm = vm_hwm_kb();
    long steps = 0;
    do {
        if (steps == stop_after)
            hs_node_request_stop(n, 1);
        for (size_t k = 0; k < d; k++)
            x[k] -= 0.1f * (x[k] - rank);
        double t1 = now();
        rc = hs_node_step(n, x, d);
        /* 0: a round done, more to come; 1: the job's last round done; < 0: stopped. */
        if (rc >= 0 && steps < 4096)
            times[steps] = now() - t1;
        steps += rc >= 0;
    } while (rc == 0);
    if (rc < 0 && !(rc == HS_EINTR && steps == stop_after))
        return fail("hs_node_step", rc);
    size_t nt = steps < 4096 ? (size_t)steps : 4096;
    qsort(times, nt, sizeof(double), cmp_double);
    printf("steps %ld x0 %.9g xmid %.9g xlast %.9g hwm_kb %ld vec_kb %zu start_s %.3f round_s "
           "%.3f start_hwm_kb %ld\n",
           steps, x[0], x[d / 2], x[d - 1], vm_hwm_kb(), d * sizeof(float) / 1024, start_s,
           nt ? times[nt / 2] : 0.0, start_hwm);
    hs_node_free(n);
    free(x);
    return 0;
}
