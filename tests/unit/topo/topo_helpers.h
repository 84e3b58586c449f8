/* Helpers shared by the topology unit tests (test_topo.c, test_topo_file.c). */
#ifndef HS_TEST_TOPO_HELPERS_H
#define HS_TEST_TOPO_HELPERS_H

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "hearsay/error.h"
#include "hearsay/topo.h"

/* cmocka 1.1.5 has no floating-point assertion: |a - b| <= eps, printing both on failure. */
#define assert_near(a, b, eps)                                                                     \
    do {                                                                                           \
        double a_ = (a), b_ = (b);                                                                 \
        if (!(fabs(a_ - b_) <= (eps)))                                                             \
            fail_msg("%s = %.17g, expected %.17g within %g", #a, a_, b_, (double)(eps));           \
    } while (0)

static inline hs_topo *gen(const char *spec, int n) {
    hs_topo *t = NULL;
    int err = hs_topo_new(&t, spec, n, 1);
    if (err < 0) fail_msg("%s on %d peers: %s", spec, n, hs_error_message());
    return t;
}

static inline hs_topo *from_str(const char *json, unsigned flags) {
    hs_topo *t = NULL;
    int err = hs_topo_from_json(&t, json, strlen(json), "test.json", flags);
    if (err < 0) fail_msg("%s: %s", json, hs_error_message());
    return t;
}

/* The reader refuses json with `code` and a message containing `text`. */
static inline void refuses(const char *json, int code, const char *text) {
    hs_topo *t = NULL;
    int err = hs_topo_from_json(&t, json, strlen(json), "test.json", 0);
    if (err != code || !strstr(hs_error_message(), text))
        fail_msg("%s: expected %s with '%s', got %s '%s'", json, hs_err_name(code), text,
                 hs_err_name(err), hs_error_message());
    assert_null(t);
}

static inline hs_topo_report check(const hs_topo *t, unsigned flags) {
    hs_topo_report r;
    assert_int_equal(hs_topo_check(t, flags, &r), 0);
    return r;
}

static inline double *dense(const hs_topo *t, uint64_t round) {
    size_t n = (size_t)hs_topo_n(t);
    double *W = malloc(n * n * sizeof(double));
    assert_non_null(W);
    assert_int_equal(hs_topo_matrix(t, round, W), 0);
    return W;
}

/* ------------------------------------------------------------------ spectral gaps */

/* The union of all ranks' views at a round is W, and i lists j as an in-neighbour with w iff j
 * lists i as an out-neighbour with the same w. */
static inline void views_match(const hs_topo *t, uint64_t round) {
    int n = hs_topo_n(t);
    double *W = dense(t, round);
    double *U = calloc((size_t)n * n, sizeof(double));
    double *O = calloc((size_t)n * n, sizeof(double));
    hs_view *v = calloc((size_t)n, sizeof(hs_view));
    assert_true(U && O && v);
    for (int i = 0; i < n; i++) {
        assert_int_equal(hs_topo_view(t, i, round, &v[i]), 0);
        assert_int_equal(v[i].rank, i);
        assert_int_equal(v[i].n, n);
        U[i * n + i] = v[i].self_w;
        O[i * n + i] = v[i].self_w;
        for (int k = 0; k < v[i].n_in; k++) {
            const hs_edge *e = &v[i].in[k];
            assert_true(e->peer >= 0 && e->peer < n && e->peer != i);
            if (k) assert_true(e->peer > v[i].in[k - 1].peer);
            assert_true(e->w > 0);
            U[i * n + e->peer] = e->w;
        }
        for (int k = 0; k < v[i].n_out; k++) {
            const hs_edge *e = &v[i].out[k];
            assert_true(e->peer >= 0 && e->peer < n && e->peer != i);
            if (k) assert_true(e->peer > v[i].out[k - 1].peer);
            O[e->peer * n + i] = e->w;
        }
        if (!hs_topo_directed(t)) {
            assert_int_equal(v[i].n_in, v[i].n_out);
            for (int k = 0; k < v[i].n_in; k++) assert_int_equal(v[i].in[k].peer, v[i].out[k].peer);
        }
    }
    /* Both unions are W entry for entry (the same doubles, not approximately). */
    assert_memory_equal(U, W, (size_t)n * n * sizeof(double));
    assert_memory_equal(O, W, (size_t)n * n * sizeof(double));
    for (int i = 0; i < n; i++)
        for (int k = 0; k < v[i].n_in; k++) {
            int j = v[i].in[k].peer, found = 0;
            for (int q = 0; q < v[j].n_out; q++)
                if (v[j].out[q].peer == i) {
                    found = 1;
                    assert_true(v[j].out[q].w == v[i].in[k].w);
                }
            assert_true(found);
        }
    for (int i = 0; i < n; i++) hs_view_free(&v[i]);
    free(v);
    free(W);
    free(U);
    free(O);
}

#endif
