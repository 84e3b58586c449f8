/* The public node entries over a caller-owned vector. Where the algorithm holds the round's x
 * itself from one call to the next (D-PSGD: the message it sent), or has a scratch vector that is
 * dead from one round to the next to hold it in (CHOCO: its difference x - xhat_i; DCD's z, BEER's
 * dh), the caller's vector is the algorithm's x during each call and the node keeps no copy (a
 * model of several GB costs one vector less); otherwise the node keeps its own copy of x and
 * exchanges the caller's vector at hs_node_start and hs_node_step. Under SGP the caller sees
 * z = x / w: the node keeps the numerator x and applies the caller's change of z to it, measured
 * from the z of x (x and w do not change between calls), and during a call writes z into the
 * caller's vector, its own once that change is taken: no vector of z of its own. One thread. */
#include <stdlib.h>
#include <string.h>

#include "algo/algo_internal.h"
#include "core/error_internal.h"
#include "core/log.h"
#include "node/node_internal.h"
#include "train/outer.h"
#include "train/state.h"

typedef struct caller_vec {
    hs_algo_cfg acfg;
    hs_algo *algo;
    size_t d;
    float *x;  /* the algorithm's x: ours, or (lend) the caller's during a call, else NULL */
    int split; /* SGP: the caller's vector is z, the evaluation point of x */
    float *cz; /* split, in a call once the caller's change was taken: the caller's vector, where
                  the node writes z (NULL: the algorithm's z, hs_algo_eval_point) */
    int lend;  /* the caller's vector is x during each call (no copy of ours) */
    int in_call;
    const void *between; /* lend, between calls: the vector the last call returned, as the
                            algorithm holds it (the round's x_r), in its idle scratch, or in
                            keep */
    float *keep;          /* lend: that vector when no round holds it (the job ended) */
    hs__outer *outer; /* the outer step after the gossip, or NULL */
    long steps; /* rounds stepped, counting those of an adopted snapshot */
} caller_vec;

static void vec_free(void *p) {
    caller_vec *v = p;
    if (!v) return;
    hs_algo_free(v->algo);
    hs__outer_free(v->outer);
    if (!v->lend) free(v->x);
    free(v->keep);
    free(v);
}

static hs_algo *v_algo(void *c) { return ((caller_vec *)c)->algo; }
static float *v_x(void *c) { return ((caller_vec *)c)->x; }
static const float *v_eval(void *c) {
    caller_vec *v = c;
    if (!v->cz) return hs_algo_eval_point(v->algo, v->x);
    hs__algo_eval_range(v->algo, v->cz, v->x, 0, v->d);
    return v->cz;
}
/* The caller's vector is host memory: nothing to copy. */
static int v_eval_ms(void *c, double *ms) {
    caller_vec *v = c;
    *ms = hs__sum_sq(v_eval(v), v->d) / (double)(v->d ? v->d : 1);
    return 0;
}
static long v_steps(void *c) { return ((caller_vec *)c)->steps; }

/* The parts of the vector's state and snapshot (train/state.h): no optimizer (the caller's
 * own), so a snapshot is the trainer's layout without optimizer state. */
static hs__state_parts parts(caller_vec *v) {
    const void *model = v->lend && !v->in_call ? v->between : v_eval(v);
    hs__state_parts s = {v->d, (uint64_t)v->steps, model, NULL, NULL, v->outer, v->algo};
    return s;
}

static int v_snapshot(void *c, hs_buf *out) {
    hs__state_parts s = parts(c);
    return hs__state_put_snapshot(out, &s);
}

/* Steps over a trainer snapshot's optimizer state (u32 kind, u32 vectors, u64 count, the
 * vectors), which is not read here, up to the outer section or the end. */
static int skip_optim(caller_vec *v, const uint8_t **p, const uint8_t *end) {
    uint32_t kind, nv;
    uint64_t count;
    int err;
    if ((err = hs__get_u32(p, end, &kind)) < 0 || (err = hs__get_u32(p, end, &nv)) < 0 ||
        (err = hs__get_u64(p, end, &count)) < 0)
        return err;
    if (nv > 2 || (size_t)(end - *p) / sizeof(float) / v->d < nv)
        return hs__err(HS_EFORMAT, "model snapshot: optimizer state of %u vectors, %zu bytes "
                                   "left",
                       nv, (size_t)(end - *p));
    *p += sizeof(float) * v->d * nv;
    return 0;
}

/* The optimizer state a trainer's snapshot may carry after the model is the caller's business
 * (hearsay/node.h): it is not read. */
static int v_adopt(void *c, const uint8_t *p, size_t len) {
    caller_vec *v = c;
    const uint8_t *end = p + len, *z = NULL;
    uint64_t steps;
    int err = hs__state_get_head(&p, end, HS__SNAPSHOT_MAGIC, 0, v->d, "model snapshot", &steps);
    if (err < 0) return err;
    const uint8_t *mom = NULL;
    if ((err = hs__skip_floats(&p, end, v->d, &z)) < 0 ||
        (p != end && !hs__outer_at(p, end) && (err = skip_optim(v, &p, end)) < 0) ||
        (err = hs__outer_parse(v->outer, &p, end, "model snapshot", &mom)) < 0)
        return err;
    if (p != end)
        return hs__err(HS_EFORMAT, "model snapshot: %zu bytes after the model", (size_t)(end - p));
    /* A snapshot of a job that has run no round yet leaves the caller's vector: its peers may
     * start apart on purpose (same-start 0), and otherwise start equal anyway. */
    if (steps > 0) {
        memcpy(v->x, z, sizeof(float) * v->d);
        hs_algo_reset_x(v->algo, v->x);
        v->steps = (long)steps;
        hs__outer_install(v->outer, mom);
    }
    return 0;
}

static int v_save(void *c, hs_buf *out) {
    hs__state_parts s = parts(c);
    return hs__state_put_checkpoint(out, HS__VEC_STATE_MAGIC, HS__VEC_STATE_VERSION, &s);
}

static int v_load(void *c, const uint8_t *p, size_t len, int with_algo) {
    caller_vec *v = c;
    const uint8_t *end = p + len, *z = NULL;
    uint64_t steps, alen;
    const uint8_t *mom = NULL;
    int err = hs__state_get_head(&p, end, HS__VEC_STATE_MAGIC, HS__VEC_STATE_VERSION, v->d,
                                 "node state", &steps);
    if (err < 0) return err;
    if ((err = hs__skip_floats(&p, end, v->d, &z)) < 0 ||
        (err = hs__outer_parse(v->outer, &p, end, "node state", &mom)) < 0 ||
        (err = hs__get_u64(&p, end, &alen)) < 0)
        return err;
    if (alen != (uint64_t)(end - p))
        return hs__err(HS_EFORMAT, "node state: algorithm state of %llu bytes, %zu left",
                       (unsigned long long)alen, (size_t)(end - p));
    /* The algorithm validates its whole state before changing anything. */
    if (with_algo && (err = hs_algo_load(v->algo, p, (size_t)alen)) < 0) return err;
    memcpy(v->x, z, sizeof(float) * v->d);
    if (with_algo) hs_algo_from_eval_point(v->algo, v->x); /* x = w z, the restored weight */
    hs_algo_reset_x(v->algo, v->x);
    hs__outer_install(v->outer, mom);
    v->steps = (long)steps;
    return 0;
}

static int v_round_begin(void *c, uint64_t r) {
    (void)r;
    caller_vec *v = c;
    hs__outer_open(v->outer, v->algo, v->x);
    return 0;
}

/* After the gossip: the outer step, before the caller is given the vector back. */
static int v_round_end(void *c, uint64_t r) {
    (void)r;
    caller_vec *v = c;
    int err = hs__outer_step(v->outer, v->algo, v->x);
    if (err == 0) v->steps++;
    return err;
}

static int v_renew(void *c, uint32_t self) {
    caller_vec *v = c;
    hs_algo_free(v->algo);
    v->algo = NULL;
    return hs_algo_new(&v->algo, &v->acfg, self, v->d, v->x);
}

static const hs__node_model vec_model_ops = {
    NULL, v_algo, v_x, v_eval_ms, v_steps, NULL, v_snapshot, v_adopt, v_save, v_load,
    v_round_begin, v_round_end, v_renew,
};

/* The caller's vector from the node's: the model as evaluated (z for SGP). Lent, it is the
 * caller's already: what the node reads of it until the next call is what the algorithm holds
 * of the round (or, with no round open, a copy). */
static int give_back(caller_vec *v, float *x, int err) {
    if (v->split) {
        v->cz = NULL;
        hs__algo_eval_range(v->algo, x, v->x, 0, v->d);
        return err;
    }
    if (!v->lend) {
        memcpy(x, v_eval(v), sizeof(float) * v->d);
        return err;
    }
    v->in_call = 0;
    v->x = NULL;
    if ((v->between = hs__algo_round_x(v->algo))) return err;
    float *idle = hs__algo_idle_vector(v->algo);
    if (idle) {
        /* Read by a checkpoint between calls; the next push overwrites it, in a call. */
        memcpy(idle, x, sizeof(float) * v->d);
        v->between = idle;
        return err;
    }
    if (!v->keep && !(v->keep = malloc(sizeof(float) * v->d)))
        return err < 0 ? err : hs__err(HS_ENOMEM, "node: out of memory for the final vector");
    memcpy(v->keep, x, sizeof(float) * v->d);
    v->between = v->keep;
    return err;
}

/* Lent: x is the algorithm's for the call. */
static void lend(caller_vec *v, float *x) {
    if (!v->lend) return;
    v->x = x;
    v->in_call = 1;
}

static int check_call(hs_node *n, const float *x, size_t d, const char *what) {
    if (!n || !x) return hs__err(HS_EINVAL, "%s: no %s", what, n ? "vector" : "node");
    if (d != hs__node_dim(n))
        return hs__err(HS_EINVAL, "%s: a vector of %zu floats, the node was made for %zu", what,
                       d, hs__node_dim(n));
    return 0;
}

int hs_node_start(hs_node *n, float *x, size_t d) {
    int err = check_call(n, x, d, "hs_node_start");
    if (err < 0) return err;
    if (hs__node_vec(n)) return hs__err(HS_EINVAL, "hs_node_start: the node was started before");
    if ((err = hs__node_connect(n)) < 0) return err;
    caller_vec *v = calloc(1, sizeof(*v));
    if (!v) return hs__err(HS_ENOMEM, "node: out of memory");
    hs__node_set_vec(n, v, vec_free);
    v->d = d;
    v->acfg = hs__node_config(n)->algo;
    /* Replicas start equal to x only for a peer that begins with the job (hs__node_begin). */
    v->acfg.same_start = 0;
    v->split = hs_algo_kind_split_eval(v->acfg.kind);
    if ((err = hs_algo_new(&v->algo, &v->acfg, hs__node_self(n), d, x)) < 0 ||
        (err = hs__outer_new(&v->outer, &hs__node_config(n)->outer, d)) < 0)
        return err;
    v->lend = !v->split && (hs__algo_lends_round_x(v->algo) || hs__algo_idle_vector(v->algo));
    if (v->lend) {
        lend(v, x);
    } else {
        if (!(v->x = malloc(sizeof(float) * d))) return hs__err(HS_ENOMEM, "node: out of memory");
        memcpy(v->x, x, sizeof(float) * d);
        if (v->split) v->cz = x; /* taken: the caller's vector is the node's until it returns */
    }
    hs__node_model m = vec_model_ops;
    m.ctx = v;
    err = hs__node_begin(n, &m);
    return give_back(v, x, err);
}

int hs_node_step(hs_node *n, float *x, size_t d) {
    int err = check_call(n, x, d, "hs_node_step");
    if (err < 0) return err;
    caller_vec *v = hs__node_vec(n);
    if (!v) return hs__err(HS_EINVAL, "hs_node_step before hs_node_start");
    /* This thread's lines are about this node (several nodes may share a process). */
    hs__log_set_thread_peer(hs__node_rank(n), hs__node_self(n));
    if (v->split) {
        /* SGP: the caller stepped z, and z takes that change as it is: x += w (z_new - z_prev),
         * as `hearsay run`'s trainer (x = w z after the local steps) and the reference SGP,
         * whose optimizer steps the de-biased parameters. Unscaled, z moved by the change / w:
         * a 14x step at the w 0.07 of a peer that shares reached late (issue 19). z_prev is the
         * z of x, given back at the last call; a block of it at a time. */
        enum { RUN = 1024 }; /* values of z on the stack at a time */
        float t[RUN];
        for (size_t k = 0; k < d; k += RUN) {
            size_t m = d - k < RUN ? d - k : RUN;
            hs__algo_eval_range(v->algo, t, v->x + k, k, m);
            for (size_t i = 0; i < m; i++) t[i] = x[k + i] - t[i];
            hs__algo_from_eval_range(v->algo, t, k, m);
            for (size_t i = 0; i < m; i++) v->x[k + i] += t[i];
        }
    } else if (v->lend) {
        lend(v, x);
    } else {
        memcpy(v->x, x, sizeof(float) * d);
    }
    /* the caller's vector is the model as evaluated (z for SGP), as the outer step wants it */
    if ((err = hs__outer_local_done(v->outer, v->algo, x)) == 0) {
        if (v->split) v->cz = x; /* its change taken: the node's until the call returns */
        err = hs__node_step(n);
    }
    /* The job's end: give_back copies x, which no round holds any more; the last message first
     * leaves (it may still be queued over a slow link: three vectors alive at once). */
    if (err == 1 && hs__node_net(n)) hs__algo_settle(v->algo, hs_net_exchange(hs__node_net(n)), -1);
    return give_back(v, x, err);
}
