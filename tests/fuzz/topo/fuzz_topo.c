/* fuzz_topo: the topology reader on arbitrary bytes, then every query on what it accepts, with
 * invariants that abort on violation: the strict reader agrees with hs_topo_check, views add up
 * to the matrix, and the JSON writer's output reads back to the same topology. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "hearsay/topo.h"

#define SMALL 64

static void views_agree(const hs_topo *t, int n, uint64_t round) {
    double *W = malloc((size_t)n * (size_t)n * sizeof(double));
    if (!W) return;
    hs_topo_matrix(t, round, W);
    for (int i = 0; i < n; i++) {
        hs_view v;
        if (hs_topo_view(t, i, round, &v) < 0) abort();
        if (v.self_w != W[(size_t)i * n + i]) abort();
        double sum_in = 0;
        for (int k = 0; k < v.n_in; k++) {
            if (k && v.in[k].peer <= v.in[k - 1].peer) abort();
            if (v.in[k].w != W[(size_t)i * n + v.in[k].peer]) abort();
            sum_in += 1;
        }
        for (int k = 0; k < v.n_out; k++) {
            if (k && v.out[k].peer <= v.out[k - 1].peer) abort();
            if (v.out[k].w != W[(size_t)v.out[k].peer * n + i]) abort();
        }
        /* Every non-zero off-diagonal entry of row i is in the view. */
        int nz = 0;
        for (int j = 0; j < n; j++) nz += j != i && W[(size_t)i * n + j] != 0;
        if (nz != (int)sum_in) abort();
        hs_view_free(&v);
    }
    free(W);
}

static void same(const hs_topo *a, const hs_topo *b) {
    int n = hs_topo_n(a);
    if (hs_topo_n(b) != n || hs_topo_period(a) != hs_topo_period(b) ||
        hs_topo_directed(a) != hs_topo_directed(b) || strcmp(hs_topo_name(a), hs_topo_name(b)))
        abort();
    int rounds = hs_topo_period(a) < 4 ? hs_topo_period(a) : 4;
    for (int r = 0; r < rounds; r++)
        for (int i = 0; i < n && i < SMALL; i++) {
            hs_view x, y;
            if (hs_topo_view(a, i, (uint64_t)r, &x) < 0 || hs_topo_view(b, i, (uint64_t)r, &y) < 0)
                abort();
            if (x.self_w != y.self_w || x.n_in != y.n_in || x.n_out != y.n_out) abort();
            for (int k = 0; k < x.n_in; k++)
                if (x.in[k].peer != y.in[k].peer || x.in[k].w != y.in[k].w) abort();
            hs_view_free(&x);
            hs_view_free(&y);
        }
    for (int i = 0; i < n && i < SMALL; i++) {
        const char *p = hs_topo_address(a, i), *q = hs_topo_address(b, i);
        if ((p == NULL) != (q == NULL) || (p && strcmp(p, q))) abort();
        for (int j = 0; j < n && j < SMALL; j++) {
            p = hs_topo_link_emulation(a, i, j);
            q = hs_topo_link_emulation(b, i, j);
            if ((p == NULL) != (q == NULL) || (p && strcmp(p, q))) abort();
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    hs_topo *t = NULL, *u = NULL;
    if (hs_topo_from_json(&t, (const char *)data, size, "fuzz", HS_TOPO_LENIENT) < 0) return 0;
    int n = hs_topo_n(t);
    hs_topo_report r;
    if (hs_topo_check(t, n <= SMALL ? 0 : HS_TOPO_CHECK_NOGAP, &r) < 0) abort();
    if (r.valid != (r.reason[0] == '\0')) abort();

    /* The strict reader accepts exactly what the cheap checks call valid. */
    hs_topo_report cheap;
    if (hs_topo_check(t, HS_TOPO_CHECK_NOGAP, &cheap) < 0) abort();
    int strict = hs_topo_from_json(&u, (const char *)data, size, "fuzz", 0);
    if ((strict == 0) != (cheap.valid != 0)) abort();
    hs_topo_free(u);
    u = NULL;

    if (n <= SMALL) {
        int rounds = hs_topo_period(t) < 4 ? hs_topo_period(t) : 4;
        for (int k = 0; k < rounds; k++) views_agree(t, n, (uint64_t)k);
    }

    char *s = NULL;
    for (unsigned flags = 0; flags < 2; flags++) {
        if (hs_topo_to_json(t, flags, &s) < 0) abort();
        if (hs_topo_from_json(&u, s, strlen(s), "fuzz", HS_TOPO_LENIENT) < 0) abort();
        same(t, u);
        hs_topo_free(u);
        u = NULL;
        free(s);
        s = NULL;
    }
    if (hs_topo_to_dot(t, &s) == 0) free(s);

    uint8_t *alive = malloc((size_t)n);
    if (alive) {
        for (int i = 0; i < n; i++) alive[i] = (uint8_t)((i * 7 + (int)size) % 5 != 0);
        if (hs_topo_restrict(&u, t, alive) == 0) {
            hs_topo_report ru;
            if (hs_topo_check(u, HS_TOPO_CHECK_NOGAP, &ru) < 0) abort();
            /* Re-weighting keeps the matrix stochastic whatever the file's weights were. */
            if (!ru.nonnegative || !ru.col_stochastic) abort();
            if (!hs_topo_directed(u) && !ru.row_stochastic) abort();
            hs_topo_free(u);
        }
        free(alive);
    }
    hs_topo_free(t);
    return 0;
}
