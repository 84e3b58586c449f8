/* Validation of a topology: stochasticity, symmetry, sign, (strong) connectivity, periodicity
 * and the spectral gap. Everything but the gap is linear in period * (n + nnz); the gap is one
 * dense LAPACK eigenvalue call (dsyev when the matrix is symmetric, dgeev otherwise). */
#include <lapacke.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error_internal.h"
#include "topo/topo_internal.h"

#define SYM_TOL 1e-12
#define GAP_MIN 1e-10

static double sum_err(double s) {
    double e = fabs(s - 1.0);
    return isnan(e) ? INFINITY : e;
}

/* The prefix of a message about round r ("" for static topologies). */
static const char *round_prefix(const hs_topo *t, int r, char *buf, size_t len) {
    if (t->period == 1) return "";
    snprintf(buf, len, "round %d: ", r);
    return buf;
}

static long gcd(long a, long b) {
    if (a < 0) a = -a;
    if (b < 0) b = -b;
    while (b) {
        long c = a % b;
        a = b;
        b = c;
    }
    return a;
}

/* Visits the union graph from `start` along arcs j -> i (W[i][j] > 0) when forward, i -> j
 * otherwise. Marks seen[] with `mark`, returns how many were reached; level[] (optional)
 * receives BFS depths. */
static int bfs(const hs_topo *t, int start, int forward, int *seen, int mark, int *queue,
               int *level) {
    int head = 0, tail = 0;
    seen[start] = mark;
    if (level) level[start] = 0;
    queue[tail++] = start;
    while (head < tail) {
        int u = queue[head++];
        for (int r = 0; r < t->period; r++) {
            const hs__tgraph *g = &t->g[r];
            const size_t *p = forward ? g->cp : g->rp;
            const int *idx = forward ? g->ci : g->ri;
            const double *w = forward ? g->cw : g->rw;
            for (size_t q = p[u]; q < p[u + 1]; q++) {
                int v = idx[q];
                if (!(w[q] > 0) || seen[v] == mark) continue;
                seen[v] = mark;
                if (level) level[v] = level[u] + 1;
                queue[tail++] = v;
            }
        }
    }
    return tail;
}

/* Second largest eigenvalue modulus of the dense row-major n x n matrix A (destroyed). */
static int second_modulus(double *A, int n, int symmetric, double *lambda2, const char **method) {
    double *wr = malloc((size_t)n * sizeof(double)), *wi = NULL;
    int err = 0;
    lapack_int info;
    if (!wr) return hs__err(HS_ENOMEM, "spectral gap: out of memory");
    if (symmetric) {
        *method = "dsyev";
        info = LAPACKE_dsyev(LAPACK_ROW_MAJOR, 'N', 'U', n, A, n, wr);
    } else {
        *method = "dgeev";
        if (!(wi = malloc((size_t)n * sizeof(double)))) {
            free(wr);
            return hs__err(HS_ENOMEM, "spectral gap: out of memory");
        }
        info = LAPACKE_dgeev(LAPACK_ROW_MAJOR, 'N', 'N', n, A, n, wr, wi, NULL, 1, NULL, 1);
    }
    if (info != 0) {
        err = hs__err(HS_EIO, "spectral gap: LAPACK %s failed (info %d)", *method, (int)info);
        goto done;
    }
    double m1 = -1, m2 = 0;
    for (int k = 0; k < n; k++) {
        double m = wi ? hypot(wr[k], wi[k]) : fabs(wr[k]);
        if (m > m1) {
            m2 = m1;
            m1 = m;
        } else if (m > m2) {
            m2 = m;
        }
    }
    *lambda2 = n > 1 ? m2 : 0.0;
done:
    free(wr);
    free(wi);
    return err;
}

/* The matrix whose second eigenvalue sets the rate: W for a static topology, the product
 * W[P-1] ... W[0] of one period for a schedule (rows of W[r] are sparse, so each factor costs
 * nnz * n, not n^3). */
static int period_matrix(const hs_topo *t, double *A, int *symmetric) {
    size_t n = (size_t)t->n;
    if (t->period == 1) {
        hs_topo_matrix(t, 0, A);
    } else {
        double *B = malloc(n * n * sizeof(double));
        if (!B) return hs__err(HS_ENOMEM, "spectral gap: out of memory for %zu x %zu", n, n);
        memset(A, 0, n * n * sizeof(double));
        for (size_t i = 0; i < n; i++) A[i * n + i] = 1.0;
        for (int r = 0; r < t->period; r++) {
            const hs__tgraph *g = &t->g[r];
            for (size_t i = 0; i < n; i++) {
                double *bi = B + i * n;
                const double *ai = A + i * n;
                for (size_t c = 0; c < n; c++) bi[c] = g->self[i] * ai[c];
                for (size_t q = g->rp[i]; q < g->rp[i + 1]; q++) {
                    const double *aj = A + (size_t)g->ri[q] * n;
                    double w = g->rw[q];
                    for (size_t c = 0; c < n; c++) bi[c] += w * aj[c];
                }
            }
            memcpy(A, B, n * n * sizeof(double));
        }
        free(B);
    }
    *symmetric = 1;
    for (size_t i = 0; i < n && *symmetric; i++)
        for (size_t j = i + 1; j < n; j++)
            if (fabs(A[i * n + j] - A[j * n + i]) > SYM_TOL) {
                *symmetric = 0;
                break;
            }
    return 0;
}

int hs_topo_check(const hs_topo *t, unsigned flags, hs_topo_report *r) {
    int n = t->n, err = 0;
    char pre[32];
    char why_neg[256] = "", why_row[256] = "", why_col[256] = "", why_sym[256] = "";
    memset(r, 0, sizeof(*r));
    r->n = n;
    r->directed = t->directed;
    r->period = t->period;
    r->symmetric = 1;
    r->nonnegative = 1;
    r->method = "";
    r->lambda2 = NAN;
    r->gap = NAN;
    r->aperiodic = 1;

    for (int k = 0; k < t->period; k++) {
        const hs__tgraph *g = &t->g[k];
        for (int i = 0; i < n; i++) {
            double rs = g->self[i], cs = g->self[i];
            for (size_t q = g->rp[i]; q < g->rp[i + 1]; q++) {
                rs += g->rw[q];
                if (!(g->rw[q] >= 0) && r->nonnegative) {
                    r->nonnegative = 0;
                    snprintf(why_neg, sizeof(why_neg), "%sW[%d][%d] = %g is negative",
                             round_prefix(t, k, pre, sizeof(pre)), i, g->ri[q], g->rw[q]);
                }
            }
            for (size_t q = g->cp[i]; q < g->cp[i + 1]; q++) cs += g->cw[q];
            if (!(g->self[i] >= 0) && r->nonnegative) {
                r->nonnegative = 0;
                double others = (t->directed ? cs : rs) - g->self[i];
                snprintf(why_neg, sizeof(why_neg),
                         "%sW[%d][%d] = %.9g is negative (peer %d's self weight; its other "
                         "weights sum to %.9g)",
                         round_prefix(t, k, pre, sizeof(pre)), i, i, g->self[i], i, others);
            }
            double re = sum_err(rs), ce = sum_err(cs);
            if (re > r->row_err) r->row_err = re;
            if (ce > r->col_err) r->col_err = ce;
            if (re > HS_TOPO_SUM_TOL && !why_row[0])
                snprintf(why_row, sizeof(why_row), "%srow %d sums to %.9g (expected 1 within %g)",
                         round_prefix(t, k, pre, sizeof(pre)), i, rs, HS_TOPO_SUM_TOL);
            if (ce > HS_TOPO_SUM_TOL && !why_col[0])
                snprintf(why_col, sizeof(why_col),
                         "%scolumn %d sums to %.9g (expected 1 within %g)",
                         round_prefix(t, k, pre, sizeof(pre)), i, cs, HS_TOPO_SUM_TOL);
            /* Row i and column i are both sorted by the other index: W is symmetric when they
             * hold the same entries. */
            size_t nr = g->rp[i + 1] - g->rp[i], nc = g->cp[i + 1] - g->cp[i];
            int same = nr == nc;
            for (size_t q = 0; same && q < nr; q++)
                same = g->ri[g->rp[i] + q] == g->ci[g->cp[i] + q] &&
                       fabs(g->rw[g->rp[i] + q] - g->cw[g->cp[i] + q]) <= SYM_TOL;
            if (!same && r->symmetric) {
                r->symmetric = 0;
                snprintf(why_sym, sizeof(why_sym), "%srow %d differs from column %d",
                         round_prefix(t, k, pre, sizeof(pre)), i, i);
            }
        }
    }
    r->row_stochastic = r->row_err <= HS_TOPO_SUM_TOL;
    r->col_stochastic = r->col_err <= HS_TOPO_SUM_TOL;

    /* Degrees and edges of the union graph. */
    int *stamp = malloc((size_t)n * sizeof(int)), *queue = malloc((size_t)n * sizeof(int));
    int *level = malloc((size_t)n * sizeof(int));
    int lonely = -1;
    double *A = NULL;
    if (!stamp || !queue || !level) {
        err = hs__err(HS_ENOMEM, "topology %s: out of memory", t->name);
        goto done;
    }
    for (int i = 0; i < n; i++) stamp[i] = -1;
    long arcs = 0;
    r->in_min = r->out_min = n;
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < n; i++) {
            int deg = 0;
            int mark = pass * n + i;
            for (int k = 0; k < t->period; k++) {
                const hs__tgraph *g = &t->g[k];
                const size_t *p = pass ? g->cp : g->rp;
                const int *idx = pass ? g->ci : g->ri;
                const double *w = pass ? g->cw : g->rw;
                for (size_t q = p[i]; q < p[i + 1]; q++)
                    if (w[q] > 0 && stamp[idx[q]] != mark) {
                        stamp[idx[q]] = mark;
                        deg++;
                    }
            }
            if (pass == 0) {
                arcs += deg;
                if (deg < r->in_min) r->in_min = deg;
                if (deg > r->in_max) r->in_max = deg;
                level[i] = deg;
            } else {
                if (deg < r->out_min) r->out_min = deg;
                if (deg > r->out_max) r->out_max = deg;
                if (n > 1 && deg == 0 && level[i] == 0 && lonely < 0) lonely = i;
            }
        }
    r->edges = t->directed ? arcs : arcs / 2;

    /* (Strong) connectivity: everyone reached from 0 forward and, when directed, backward. */
    char why_conn[256] = "";
    for (int i = 0; i < n; i++) stamp[i] = -1;
    int fwd = bfs(t, 0, 1, stamp, 1, queue, level);
    r->connected = fwd == n;
    if (!r->connected) {
        int miss = 0;
        while (stamp[miss] == 1) miss++;
        if (t->directed) {
            snprintf(why_conn, sizeof(why_conn),
                     "not strongly connected: peer 0 cannot reach peer %d", miss);
        } else {
            int comps = 1;
            for (int i = 0; i < n; i++)
                if (stamp[i] != 1 && stamp[i] < 2) bfs(t, i, 1, stamp, 2 + comps++, queue, NULL);
            snprintf(why_conn, sizeof(why_conn),
                     "not connected: %d components (peer %d is not reachable from peer 0)", comps,
                     miss);
        }
    } else if (t->directed) {
        int bwd = bfs(t, 0, 0, stamp, 2, queue, NULL);
        if (bwd != n) {
            int miss = 0;
            while (stamp[miss] == 2) miss++;
            r->connected = 0;
            snprintf(why_conn, sizeof(why_conn),
                     "not strongly connected: peer %d cannot reach peer 0", miss);
        }
    }

    /* Periodicity of a static chain: with any positive self weight it is aperiodic; else its
     * period is the gcd over arcs j -> i of level(j) + 1 - level(i) (BFS levels from 0). */
    char why_per[256] = "";
    if (t->period == 1 && r->connected && n > 1) {
        const hs__tgraph *g = &t->g[0];
        int lazy = 0;
        for (int i = 0; i < n && !lazy; i++) lazy = g->self[i] > 0;
        if (!lazy) {
            for (int i = 0; i < n; i++) stamp[i] = -1;
            bfs(t, 0, 1, stamp, 1, queue, level);
            long p = 0;
            for (int i = 0; i < n; i++)
                for (size_t q = g->rp[i]; q < g->rp[i + 1]; q++)
                    if (g->rw[q] > 0) p = gcd(p, (long)level[g->ri[q]] + 1 - level[i]);
            if (p != 1) {
                r->aperiodic = 0;
                snprintf(why_per, sizeof(why_per),
                         "periodic with period %ld (no self weight anywhere: e.g. a bipartite "
                         "graph), so gossip oscillates instead of converging",
                         p);
            }
        }
    }

    int stochastic =
        r->nonnegative && r->col_stochastic && (t->directed || r->row_stochastic);
    if (!(flags & HS_TOPO_CHECK_NOGAP) && n <= HS_TOPO_GAP_MAX_N && stochastic) {
        int sym = 0;
        if (!(A = malloc((size_t)n * (size_t)n * sizeof(double)))) {
            err = hs__err(HS_ENOMEM, "topology %s: out of memory for the %d x %d matrix", t->name,
                          n, n);
            goto done;
        }
        if ((err = period_matrix(t, A, &sym)) < 0) goto done;
        if ((err = second_modulus(A, n, sym, &r->lambda2, &r->method)) < 0) goto done;
        r->gap = 1.0 - r->lambda2;
        r->gap_computed = 1;
    }

    const char *why = "";
    if (lonely >= 0) {
        snprintf(r->reason, sizeof(r->reason), "peer %d has no neighbours", lonely);
        why = r->reason;
    } else if (!r->nonnegative) why = why_neg;
    else if (!t->directed && !r->row_stochastic) why = why_row;
    else if (!r->col_stochastic) why = why_col;
    else if (!t->directed && !r->symmetric) why = why_sym;
    else if (!r->connected) why = why_conn;
    else if (!r->aperiodic) why = why_per;
    else if (r->gap_computed && !(r->gap > GAP_MIN)) {
        snprintf(why_per, sizeof(why_per),
                 "spectral gap %.3g (|lambda_2| = %.9g): gossip does not converge", r->gap,
                 r->lambda2);
        why = why_per;
    }
    if (why != r->reason) snprintf(r->reason, sizeof(r->reason), "%s", why);
    r->valid = r->reason[0] == '\0';
done:
    free(stamp);
    free(queue);
    free(level);
    free(A);
    return err;
}
