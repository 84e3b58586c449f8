/* Consensus over the network runtime, 4 processes with TLS (learning rate 0, a different random
 * vector per peer): for D-PSGD, DCD-PSGD (exact messages), CHOCO-SGD (top-10%, gamma_c 0.2) and SGP
 * (one-peer exponential graph), the network average stays within 1e-5 (relative) of the
 * starting average after every round, and the consensus distance falls at least 1000x. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define NP 4
#define DIM 500

static const char *secret;

typedef struct series {
    int rounds;        /* records */
    double *w;         /* rounds */
    float *z;          /* rounds x DIM */
} series;

static void load(const char *path, series *s) {
    FILE *f = fopen(path, "rb");
    H_CHECK(f, "cannot open %s", path);
    s->rounds = 0;
    s->w = NULL;
    s->z = NULL;
    for (;;) {
        uint64_t r;
        double w;
        float z[DIM];
        if (fread(&r, 8, 1, f) != 1) break;
        H_CHECK(fread(&w, 8, 1, f) == 1 && fread(z, 4, DIM, f) == DIM, "%s: truncated", path);
        s->w = realloc(s->w, sizeof(double) * (size_t)(s->rounds + 1));
        s->z = realloc(s->z, sizeof(float) * DIM * (size_t)(s->rounds + 1));
        s->w[s->rounds] = w;
        memcpy(s->z + (size_t)s->rounds * DIM, z, sizeof(z));
        s->rounds++;
    }
    fclose(f);
}

static void scenario(int k, const char *algo, const char *compress, const char *topo,
                     const char *rounds, int sgp) {
    const char *ip = h_ip(k);
    char boot[64], listen[NP][64], out[600], err[NP][600];
    snprintf(boot, sizeof(boot), "%s:7170", ip);
    snprintf(out, sizeof(out), "%s/%s", h_dir(), algo);
    hproc p[NP];
    char exe[4096];
    snprintf(exe, sizeof(exe), "%s/tests/integration/algo/algopeer", getenv("HS_BUILD_ROOT"));
    for (int i = 0; i < NP; i++) {
        snprintf(listen[i], sizeof(listen[i]), "%s:%d", ip, 7170 + i);
        snprintf(err[i], sizeof(err[i]), "%s/%s-%d.err", h_dir(), algo, i);
        char *argv[] = {exe, "--listen", listen[i], "--bootstrap", i ? boot : NULL,
                        NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                        NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
        int a = i ? 5 : 3;
        char *rest[] = {"--secret-file", (char *)secret, "--algo", (char *)algo, "--compress",
                        (char *)compress, "--topo", (char *)topo, "--rounds", (char *)rounds,
                        "--dim", "500", "--out", out, "--gamma-c", "0.2",
                        /* Without compute between rounds push-sum peers would race through
                         * their rounds before any share arrives: bound the staleness. */
                        "--staleness", sgp ? "1" : "0", NULL};
        for (int j = 0; rest[j]; j++) argv[a++] = rest[j];
        argv[a] = NULL;
        H_CHECK(h_spawn(&p[i], argv, NULL, err[i]) == 0, "spawn algopeer %d", i);
    }
    for (int i = 0; i < NP; i++) {
        int rc = h_wait(&p[i], 120);
        if (rc != 0) {
            char *e = h_read(err[i]);
            H_CHECK(rc == 0, "%s: algopeer %d exited %d: %s", algo, i, rc, e ? e : "");
        }
    }
    series s[NP];
    for (int i = 0; i < NP; i++) {
        char path[700];
        snprintf(path, sizeof(path), "%s-%d.bin", out, i);
        load(path, &s[i]);
        H_CHECK(s[i].rounds == s[0].rounds && s[i].rounds > 1, "%s: peer %d has %d records", algo,
                i, s[i].rounds);
    }
    /* The true average is that of the starting vectors; for push-sum, sum x / sum w with all
     * weights 1 at the start. */
    double avg0[DIM] = {0}, norm0 = 0;
    for (int i = 0; i < NP; i++)
        for (int k2 = 0; k2 < DIM; k2++) avg0[k2] += s[i].z[k2] / NP;
    for (int k2 = 0; k2 < DIM; k2++) norm0 += avg0[k2] * avg0[k2];
    double dist0 = 0, dist = 0, worst = 0;
    for (int r = 0; r < s[0].rounds; r++) {
        double avg[DIM] = {0}, e = 0, dd = 0;
        for (int i = 0; i < NP; i++)
            for (int k2 = 0; k2 < DIM; k2++) avg[k2] += s[i].z[(size_t)r * DIM + k2] / NP;
        for (int k2 = 0; k2 < DIM; k2++) e += (avg[k2] - avg0[k2]) * (avg[k2] - avg0[k2]);
        for (int i = 0; i < NP; i++)
            for (int k2 = 0; k2 < DIM; k2++) {
                double q = s[i].z[(size_t)r * DIM + k2] - avg[k2];
                dd += q * q;
            }
        /* Push-sum's z_i are not mass-weighted: only their limit is the average. */
        if (!sgp && sqrt(e / norm0) > worst) worst = sqrt(e / norm0);
        if (r == 0) dist0 = dd;
        dist = dd;
    }
    double final_err = 0;
    {
        int r = s[0].rounds - 1;
        for (int i = 0; i < NP; i++)
            for (int k2 = 0; k2 < DIM; k2++) {
                double q = s[i].z[(size_t)r * DIM + k2] - avg0[k2];
                final_err += q * q;
            }
        final_err = sqrt(final_err / NP / norm0);
    }
    h_note("%s %s on %s: %d rounds, distance %.3g -> %.3g, average drift %.2e, z off the true "
           "average by %.2e", algo, compress, topo, s[0].rounds - 1, dist0, dist, worst, final_err);
    H_CHECK(dist <= dist0 / 1000, "%s: consensus distance only fell from %g to %g", algo, dist0, dist);
    H_CHECK(worst <= 1e-5, "%s: the network average drifted by %g", algo, worst);
    H_CHECK(final_err <= 1e-4, "%s: the peers agree on a point %g away from the average", algo,
            final_err);
    for (int i = 0; i < NP; i++) {
        free(s[i].w);
        free(s[i].z);
    }
}

int main(void) {
    h_init("net_consensus", 280);
    secret = h_file("secret", "algo-consensus-test-secret-0123456789abcdef\n");
    scenario(1, "dpsgd", "none", "ring", "40", 0);
    scenario(2, "dcd", "none", "ring", "40", 0);
    scenario(3, "choco", "topk:0.1", "ring", "400", 0);
    scenario(4, "sgp", "none", "onepeer-exp", "60", 1);
    h_done();
    return 0;
}
