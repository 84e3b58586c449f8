/* The algorithm front end: the table of algorithms, configuration, the neighbour table every
 * algorithm shares, payload framing and replicas (checkpoints are in algo_save.c). Each
 * algorithm's arithmetic and state are in its own file (dpsgd.c, dcd.c, choco.c, sgp.c,
 * beer.c). One thread per algorithm object. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algo/algo_internal.h"
#include "compress/compress_ew.h"
#include "compress/codec.h"
#include "core/clock.h"
#include "core/hd.h"
#include "core/error_internal.h"
#include "core/log.h"
#include "tensor/gossip_ops.h"

/* Every algorithm, indexed by hs_algo_kind: adding one is an entry here. */
static const hs__algo_ops *const algo_table[] = {
    [HS_ALGO_DPSGD] = &hs__algo_dpsgd,
    [HS_ALGO_DCD] = &hs__algo_dcd,
    [HS_ALGO_CHOCO] = &hs__algo_choco,
    [HS_ALGO_SGP] = &hs__algo_sgp,
    [HS_ALGO_BEER] = &hs__algo_beer,
};
#define N_ALGOS (sizeof(algo_table) / sizeof(algo_table[0]))

const hs__algo_ops *hs__algo_ops_of(hs_algo_kind k) {
    return (unsigned)k < N_ALGOS ? algo_table[k] : NULL;
}

const char *hs_algo_kind_name(hs_algo_kind k) {
    const hs__algo_ops *o = hs__algo_ops_of(k);
    return o ? o->name : "unknown";
}

int hs_algo_kind_parse(const char *s, hs_algo_kind *out) {
    char names[160] = "";
    size_t len = 0;
    for (size_t i = 0; i < N_ALGOS; i++) {
        if (s && !strcmp(s, algo_table[i]->name)) {
            *out = (hs_algo_kind)i;
            return 0;
        }
        /* "a, b, c or d" */
        const char *sep = i == 0 ? "" : i + 1 == N_ALGOS ? " or " : ", ";
        int w = snprintf(names + len, sizeof(names) - len, "%s%s", sep, algo_table[i]->name);
        if (w > 0 && (size_t)w < sizeof(names) - len) len += (size_t)w;
    }
    return hs__err(HS_EINVAL, "--algo '%s': expected %s", s ? s : "", names);
}

int hs_algo_kind_synchronous(hs_algo_kind k) {
    const hs__algo_ops *o = hs__algo_ops_of(k);
    return o && o->synchronous;
}

int hs_algo_kind_uses_gamma_c(hs_algo_kind k) {
    const hs__algo_ops *o = hs__algo_ops_of(k);
    return o && o->uses_gamma_c;
}

int hs_algo_kind_split_eval(hs_algo_kind k) {
    const hs__algo_ops *o = hs__algo_ops_of(k);
    return o && o->eval_point;
}

int hs_algo_kind_qg_momentum(hs_algo_kind k) {
    const hs__algo_ops *o = hs__algo_ops_of(k);
    return o && o->qg_momentum;
}

int hs_algo_kind_drifts_with_compression(hs_algo_kind k) {
    const hs__algo_ops *o = hs__algo_ops_of(k);
    return o && o->drifts_with_compression;
}

int hs_algo_kind_any(hs_algo_kind k) { return hs__algo_ops_of(k) != NULL; }

int hs_algo_kind_names(int (*has)(hs_algo_kind), int want, char *out, size_t cap) {
    size_t m = 0, len = 0;
    for (size_t i = 0; i < N_ALGOS; i++) m += !has((hs_algo_kind)i) == !want;
    if (cap) out[0] = 0;
    int k = 0;
    for (size_t i = 0; i < N_ALGOS; i++) {
        if (!has((hs_algo_kind)i) != !want) continue;
        /* "a", "a and b", "a, b and c" */
        const char *sep = k == 0 ? "" : (size_t)k + 1 == m ? " and " : ", ";
        int w = snprintf(out + len, cap - len, "%s%s", sep, algo_table[i]->name);
        if (w > 0 && (size_t)w < cap - len) len += (size_t)w;
        k++;
    }
    return k;
}

const char *hs_algo_kind_default_compress(hs_algo_kind k) {
    const hs__algo_ops *o = hs__algo_ops_of(k);
    return o && o->default_compress ? o->default_compress : "none";
}

int hs_algo_kind_default_staleness(hs_algo_kind k) {
    const hs__algo_ops *o = hs__algo_ops_of(k);
    return o ? o->default_staleness : 0;
}

const char *hs_algo_kind_default_topology(hs_algo_kind k) {
    const hs__algo_ops *o = hs__algo_ops_of(k);
    return o && o->default_topology ? o->default_topology : "ring";
}

void hs_algo_cfg_default(hs_algo_cfg *cfg) {
    memset(cfg, 0, sizeof(*cfg));
    cfg->kind = HS_ALGO_CHOCO;
    cfg->compress = "none";
    cfg->gamma_c = 0; /* automatic */
    cfg->staleness = 0;
    cfg->recv_timeout_ms = 10000;
    cfg->same_start = 1;
}

int hs_algo_check_topology(hs_algo_kind k, int directed, int period, const char *name) {
    if (hs_algo_kind_synchronous(k) && directed)
        return hs__err(HS_EINVAL, "--algo %s needs an undirected (symmetric) topology; %s is "
                                  "directed (use --algo sgp)",
                       hs_algo_kind_name(k), name);
    const hs__algo_ops *o = hs__algo_ops_of(k);
    if (o && o->fixed_neighbours && period != 1)
        return hs__err(HS_EINVAL, "--algo %s keeps replicas of fixed neighbours; topology %s "
                                  "changes every round (use dpsgd or sgp)",
                       hs_algo_kind_name(k), name);
    return 0;
}

/* The gap is a dense eigenproblem, O(n^3): beyond this many peers it is left unknown, which the
 * automatic step does not need (step.c). */
#define GAP_MAX_PEERS 1024

int hs_algo_cfg_set_topology(hs_algo_cfg *cfg, const hs_topo *t) {
    hs_topo_report rep;
    cfg->gap = 0;
    cfg->max_degree = 0;
    int err = hs_topo_check(t, hs_topo_n(t) > GAP_MAX_PEERS ? HS_TOPO_CHECK_NOGAP : 0, &rep);
    if (err < 0) return err;
    if (rep.gap_computed && rep.gap > 0 && rep.gap <= 1) cfg->gap = rep.gap;
    cfg->max_degree = rep.in_max > rep.out_max ? rep.in_max : rep.out_max;
    return 0;
}

void hs_algo_cfg_set_step_degree(hs_algo_cfg *cfg, const char *topology) {
    if (!topology || !hs_topo_spec_is_file(topology))
        cfg->max_degree = topology && !strcmp(topology, "ring") ? 2 : 0;
}

int hs_algo_check_compressor(hs_algo_kind k, const hs_compressor *c) {
    const hs__algo_ops *o = hs__algo_ops_of(k);
    return o && o->check_compressor ? o->check_compressor(c) : 0;
}

void hs_algo_free(hs_algo *a) {
    if (!a) return;
    if (a->ops && a->ops->fini) a->ops->fini(a);
    free(a->priv);
    for (int i = 0; i < a->n_nbrs; i++) free(a->nbrs[i].rep);
    free(a->nbrs);
    free(a->own);
    free(a->tmp);
    free(a->tmp2);
    free(a->present);
    for (int i = 0; i < 4; i++) hs_buf_unref(a->pool[i]);
    hs_compressor_free(a->comp);
    free(a);
}

int hs_algo_new(hs_algo **out, const hs_algo_cfg *cfg, uint32_t self, size_t d, const float *x0) {
    const hs__algo_ops *ops = hs__algo_ops_of(cfg->kind);
    if (!ops) return hs__err(HS_EINVAL, "algorithm: unknown kind %d", (int)cfg->kind);
    if (d == 0) return hs__err(HS_EINVAL, "algorithm: empty parameter vector");
    if (ops->uses_gamma_c && !(cfg->gamma_c >= 0.0f && cfg->gamma_c <= 1.0f))
        return hs__err(HS_EINVAL, "--gamma-c %g: must be in (0, 1] (or 0: automatic)",
                       (double)cfg->gamma_c);
    if (cfg->staleness < 0)
        return hs__err(HS_EINVAL, "--staleness %d: must be >= 0", cfg->staleness);
    if (cfg->recv_timeout_ms < 0)
        return hs__err(HS_EINVAL, "receive timeout %d ms: must be >= 0", cfg->recv_timeout_ms);
    hs_algo *a = calloc(1, sizeof(*a));
    if (!a) return hs__err(HS_ENOMEM, "algorithm: out of memory");
    a->cfg = *cfg;
    snprintf(a->compress_spec, sizeof(a->compress_spec), "%s", cfg->compress ? cfg->compress : "none");
    a->cfg.compress = a->compress_spec;
    a->self = self;
    a->d = d;
    a->stats.push_weight = 1.0;
    a->reps_dirty = 1;
    int err = hs_compressor_new(&a->comp, a->compress_spec, d, cfg->seed);
    if (err < 0) {
        hs__err_prefix(err, "--compress %s", a->compress_spec);
        goto fail;
    }
    if ((err = hs_algo_check_compressor(cfg->kind, a->comp)) < 0) goto fail;
    a->rscale = ops->uses_gamma_c ? hs__compress_replica_scale(a->comp) : 1.0f;
    a->dpub = d * (size_t)(ops->pub_vectors > 1 ? ops->pub_vectors : 1);
    if (!(a->own = calloc(a->dpub, sizeof(float))) || !(a->tmp = calloc(d, sizeof(float))) ||
        !(a->tmp2 = calloc(d, sizeof(float)))) {
        err = hs__err(HS_ENOMEM, "algorithm: out of memory for %zu parameters", d);
        goto fail;
    }
    /* Without replicas own is the algorithm's scratch, written before it is read (D-PSGD: x
     * at a round's start): left untouched, a large one takes no memory until then; so do the
     * scratch vectors of an algorithm that does not use them (D-PSGD with one neighbour),
     * zeroed by calloc, not written (malloc's debug fill, MALLOC_PERTURB_, would touch them). */
    if (ops->uses_gamma_c && cfg->gamma_c == 0.0f) {
        double delta = hs_compressor_delta(a->comp), dp = 0;
        /* The probe's two vectors are tmp and own, which x0 then overwrites (every algorithm
         * with a consensus step keeps replicas), not tmp2: CHOCO never uses tmp2 otherwise,
         * and written once it would stay resident all run (a vector of 4 GB at 1B). */
        if ((err = hs__algo_probe_delta(a->comp, a->tmp, a->own, &dp)) < 0) goto fail;
        a->cfg.gamma_c =
            hs_algo_scale_gamma_c(hs_algo_default_gamma_c(delta, dp), cfg->max_degree);
        /* The CLI prints the value once per process (hs__runopts_choco_step). */
        HS_LOGD("%s: gamma_c %g (automatic: %s, delta %.4g, on a probe %.4g, degree %d)",
                ops->name, (double)a->cfg.gamma_c, hs_compressor_name(a->comp), delta, dp,
                cfg->max_degree);
    }
    if (ops->needs_replicas) memcpy(a->own, x0, sizeof(float) * d);
    if (ops->priv_size && !(a->priv = calloc(1, ops->priv_size))) {
        err = hs__err(HS_ENOMEM, "%s: out of memory", ops->name);
        goto fail;
    }
    a->ops = ops;
    if (ops->init && (err = ops->init(a, x0)) < 0) goto fail;
    *out = a;
    return 0;
fail:
    /* fini frees what init allocated, even in part; priv is freed either way. */
    hs_algo_free(a);
    return err;
}

int hs__algo_scale_diff(hs_algo *a, float *diff) {
    if (a->rscale == 1.0f) return 0;
    if (a->be) return a->be->ops->gossip->scale_to(a->be, diff, diff, a->d, a->rscale);
    for (size_t k = 0; k < a->d; k++) diff[k] = diff[k] * a->rscale;
    return 0;
}

hs_algo_kind hs_algo_kind_of(const hs_algo *a) { return a->cfg.kind; }
float hs_algo_gamma_c(const hs_algo *a) { return a->ops->uses_gamma_c ? a->cfg.gamma_c : 0.0f; }
const char *hs_algo_compressor_name(const hs_algo *a) { return hs_compressor_name(a->comp); }

const float *hs_algo_eval_point(hs_algo *a, const float *x) {
    return a->ops->eval_point ? a->ops->eval_point(a, x) : x;
}

void hs_algo_set_same_start(hs_algo *a, int same_start) {
    if (!a->have_view) a->cfg.same_start = same_start;
}

void hs_algo_set_first_round(hs_algo *a, uint64_t r) { a->round0 = r; }

void hs_algo_reset_x(hs_algo *a, const float *x) {
    if (a->have_view) return;
    /* vectors past the first keep their zeros; own is a replica's start only with replicas */
    if (a->ops->needs_replicas) memcpy(a->own, x, sizeof(float) * a->d);
    a->reps_dirty = 1;
    if (a->ops->reset_x) a->ops->reset_x(a, x);
}

void hs_algo_from_eval_point(hs_algo *a, float *z) { hs__algo_from_eval_range(a, z, 0, a->d); }

void hs__algo_eval_range(const hs_algo *a, float *z, const float *x, size_t first, size_t n) {
    if (a->ops->eval_range)
        a->ops->eval_range(a, z, x, first, n);
    else if (z != x)
        memcpy(z, x, sizeof(float) * n);
}

void hs__algo_from_eval_range(const hs_algo *a, float *z, size_t first, size_t n) {
    if (a->ops->from_eval_range) a->ops->from_eval_range(a, z, first, n);
}

int hs__algo_lends_round_x(const hs_algo *a) { return a && a->ops->round_x != NULL; }

const void *hs__algo_round_x(const hs_algo *a) {
    return a && a->ops->round_x ? a->ops->round_x(a) : NULL;
}

float *hs__algo_idle_vector(hs_algo *a) { return a && a->ops->tmp_idle ? a->tmp : NULL; }

int hs_algo_begin(hs_algo *a, hs_exchange *ex, uint64_t r, const float *x) {
    return a->ops->begin ? a->ops->begin(a, ex, r, x) : 0;
}

int hs_algo_push(hs_algo *a, hs_exchange *ex, uint64_t r, float *x) {
    return a->ops->push ? a->ops->push(a, ex, r, x) : 0;
}

int hs_algo_pull(hs_algo *a, hs_exchange *ex, uint64_t r, float *x) {
    return a->ops->pull ? a->ops->pull(a, ex, r, x) : 0;
}

int hs_algo_end(hs_algo *a, hs_exchange *ex, uint64_t r, float *x) {
    int err = hs_algo_push(a, ex, r, x);
    return err < 0 ? err : hs_algo_pull(a, ex, r, x);
}

void hs_algo_get_stats(const hs_algo *a, hs_algo_stats *out) { *out = a->stats; }

void hs_algo_metrics(const hs_algo *a, hs_algo_metric_fn emit, void *ctx) {
    if (a->ops->metrics) a->ops->metrics(a, emit, ctx);
}

double hs_algo_payload_weight(const hs_buf *payload) {
    double w = 0;
    for (size_t i = 0; i < N_ALGOS; i++)
        if (algo_table[i]->payload_weight)
            w += algo_table[i]->payload_weight(payload->data, payload->len);
    return w;
}

hs__nbr *hs__algo_nbr(hs_algo *a, uint32_t id) {
    for (int i = 0; i < a->n_nbrs; i++)
        if (a->nbrs[i].id == id) return &a->nbrs[i];
    return NULL;
}

static int in_list(const hs_nbr *l, int n, uint32_t id) {
    for (int i = 0; i < n; i++)
        if (l[i].id == id) return 1;
    return 0;
}

/* 1 when the table already matches the view's in- and out-neighbour sets. */
static int table_matches(const hs_algo *a, const hs_peer_view *v) {
    for (int i = 0; i < a->n_nbrs; i++) {
        const hs__nbr *n = &a->nbrs[i];
        if (n->is_in != in_list(v->in, v->n_in, n->id) || n->is_out != in_list(v->out, v->n_out, n->id))
            return 0;
    }
    /* Every listed neighbour has an entry (entries of neighbours no longer listed fail above). */
    for (int i = 0; i < v->n_in; i++)
        if (!hs__algo_nbr((hs_algo *)a, v->in[i].id)) return 0;
    for (int i = 0; i < v->n_out; i++)
        if (!hs__algo_nbr((hs_algo *)a, v->out[i].id)) return 0;
    return 1;
}

int hs__algo_view(hs_algo *a, hs_exchange *ex, uint64_t r, hs_peer_view *v, const float *x0) {
    int err = ex->ops->view(ex, r, v);
    if (err < 0) return err;
    /* Time-varying topologies change the neighbour sets within one membership epoch, so the
     * table is compared with every view, not only when the epoch changes. Weights are taken
     * from every view too (a loaded state has none yet). */
    if (a->have_view && v->epoch == a->epoch && table_matches(a, v)) {
        for (int i = 0; i < v->n_in; i++) {
            hs__nbr *n = hs__algo_nbr(a, v->in[i].id);
            if (n->w_in != (float)v->in[i].w) {
                n->w_in = (float)v->in[i].w;
                a->reps_dirty = 1;
            }
        }
        return 0;
    }
    int first = !a->have_view, oom = 0;
    /* Drop neighbours that are neither in- nor out-neighbours any more. */
    int k = 0;
    for (int i = 0; i < a->n_nbrs; i++) {
        hs__nbr *n = &a->nbrs[i];
        int is_in = in_list(v->in, v->n_in, n->id), is_out = in_list(v->out, v->n_out, n->id);
        if (!is_in && !is_out) {
            free(n->rep);
            continue;
        }
        /* A neighbour that was only an out-neighbour and becomes an in-neighbour needs its
         * replica: it arrives as a full payload. */
        if (is_in && !n->is_in) {
            n->synced = 0;
            n->next_round = r;
            /* Out of memory: the entry stays, unsynced and without a replica, so the table
             * remains consistent (it is left out of the gossip step) and the error returns. */
            if (a->ops->needs_replicas && !n->rep && !(n->rep = calloc(a->dpub, sizeof(float))))
                oom = 1;
        }
        if (is_out && !n->is_out) n->sent_full = 0;
        n->is_in = is_in;
        n->is_out = is_out;
        a->nbrs[k++] = *n;
    }
    a->n_nbrs = k;
    if (oom) return hs__err(HS_ENOMEM, "algorithm: out of memory for a replica");
    int need = v->n_in + v->n_out;
    if (a->n_nbrs + need > a->cap_nbrs) {
        int cap = a->n_nbrs + need + 4;
        hs__nbr *nb = realloc(a->nbrs, sizeof(*nb) * (size_t)cap);
        if (!nb) return hs__err(HS_ENOMEM, "algorithm: out of memory for neighbours");
        a->nbrs = nb;
        a->cap_nbrs = cap;
    }
    for (int pass = 0; pass < 2; pass++) {
        const hs_nbr *l = pass ? v->out : v->in;
        int nl = pass ? v->n_out : v->n_in;
        for (int i = 0; i < nl; i++) {
            if (l[i].id == a->self)
                return hs__err(HS_EPROTO, "view of round %llu lists this peer (%u) as its own neighbour",
                               (unsigned long long)r, a->self);
            if (hs__algo_nbr(a, l[i].id)) continue;
            hs__nbr *n = &a->nbrs[a->n_nbrs];
            memset(n, 0, sizeof(*n));
            n->id = l[i].id;
            n->is_in = in_list(v->in, v->n_in, n->id);
            n->is_out = in_list(v->out, v->n_out, n->id);
            n->next_round = r;
            /* Peers that all start from x0 know each other's first replica without a word. */
            int known = first && a->cfg.same_start && x0;
            if (a->ops->needs_replicas && n->is_in) {
                if (!(n->rep = calloc(a->dpub, sizeof(float))))
                    return hs__err(HS_ENOMEM, "algorithm: out of memory for a replica");
                if (known) memcpy(n->rep, x0, sizeof(float) * a->d);
            }
            n->synced = known;
            n->sent_full = known;
            a->n_nbrs++;
        }
    }
    for (int i = 0; i < v->n_in; i++) hs__algo_nbr(a, v->in[i].id)->w_in = (float)v->in[i].w;
    a->reps_dirty = 1;
    if (!first && v->epoch != a->epoch)
        HS_LOGI("round %llu: neighbourhood changed (epoch %llu -> %llu): %d in, %d out of %d members",
                (unsigned long long)r, (unsigned long long)a->epoch, (unsigned long long)v->epoch,
                v->n_in, v->n_out, v->n_members);
    a->epoch = v->epoch;
    a->have_view = 1;
    return 0;
}

int hs__algo_send(hs_algo *a, hs_exchange *ex, uint32_t to, uint64_t r, hs_buf *payload) {
    int err = ex->ops->send(ex, to, r, payload);
    if (err == HS_ECONNRESET || err == HS_EAGAIN) {
        /* Gone, or a link so slow that its queue is full: the message is not sent (a replica
         * neighbour then asks for a full replica; SGP keeps the share). */
        HS_LOGD("round %llu: message to peer %u not sent: %s", (unsigned long long)r, to,
                hs_error_message());
        return 1;
    }
    if (err < 0) return err;
    a->stats.bytes_sent += payload->len;
    return 0;
}

static void wait_room_ms(hs_exchange *ex, const hs_peer_view *v, size_t bytes, int ms) {
    double deadline = hs__mono_s() + 1e-3 * ms;
    for (int i = 0; i < v->n_out; i++) {
        double left = deadline - hs__mono_s();
        /* Whatever it answers, send() decides: a link still full refuses the message there. */
        (void)ex->ops->wait_room(ex, v->out[i].id, bytes, left > 0 ? (int)(left * 1e3) : 0);
    }
}

void hs__algo_wait_room(hs_algo *a, hs_exchange *ex, const hs_peer_view *v, uint64_t r,
                        size_t bytes) {
    if (!ex->ops->wait_room) return;
    a->room_bytes = bytes;
    a->room_round = r;
    wait_room_ms(ex, v, bytes, a->cfg.recv_timeout_ms > 0 ? a->cfg.recv_timeout_ms : 0);
}

void hs__algo_settle(hs_algo *a, hs_exchange *ex, int max_ms) {
    hs_peer_view v;
    int ms = a && a->cfg.recv_timeout_ms > 0 ? a->cfg.recv_timeout_ms : 0;
    if (max_ms >= 0 && max_ms < ms) ms = max_ms;
    if (a && a->room_bytes && ex->ops->wait_room && ex->ops->view(ex, a->room_round, &v) == 0)
        wait_room_ms(ex, &v, a->room_bytes, ms);
}

int hs__payload_new(hs_algo *a, hs_buf **out, int type, size_t reserve) {
    hs_buf *b = NULL;
    int free_slot = -1;
    for (int i = 0; i < 4 && !b && reserve <= HS__POOL_MAX_BYTES; i++) {
        if (!a->pool[i]) {
            if (free_slot < 0) free_slot = i;
        } else if (__atomic_load_n(&a->pool[i]->refs, __ATOMIC_ACQUIRE) == 1) {
            /* Only the pool holds it: no send is pending, its bytes may be overwritten. */
            b = hs_buf_ref(a->pool[i]);
            b->len = 0;
        }
    }
    int err;
    if (!b) {
        if ((err = hs_buf_new(&b, reserve + 16)) < 0) return err;
        /* A payload of a large model is not kept for the next round: kept, it would stay a
         * copy of the model between rounds (when a checkpoint is written), for the price of
         * its allocation once a round. */
        if (free_slot >= 0 && reserve <= HS__POOL_MAX_BYTES) a->pool[free_slot] = hs_buf_ref(b);
    } else if ((err = hs_buf_reserve(b, reserve + 16)) < 0) {
        hs_buf_unref(b);
        return err;
    }
    uint8_t t = (uint8_t)type;
    if ((err = hs_buf_append(b, &t, 1)) < 0) {
        hs_buf_unref(b);
        return err;
    }
    *out = b;
    return 0;
}

int hs__payload_full(hs_algo *a, hs_buf **out, const float *v, size_t d) {
    int err = hs__payload_new(a, out, HS_PAYLOAD_FULL, sizeof(float) * d);
    if (err < 0) return err;
    /* Into the room hs__payload_new made; not memcpy one byte past the tag (hs__cf32_put). */
    hs__cf32_put(v, d, (*out)->data + (*out)->len);
    (*out)->len += sizeof(float) * d;
    return 0;
}

int hs__payload_read_full(const uint8_t *p, size_t len, float *dst, size_t d, uint32_t from) {
    if (len != 1 + sizeof(float) * d)
        return hs__err(HS_EFORMAT, "full replica from peer %u: %zu bytes, expected %zu", from,
                       len, 1 + sizeof(float) * d);
    const uint8_t *q = p + 1;
    /* Checked before the copy, which then cannot fail: dst stays unchanged on error. */
    int bad = hs__cf32_max_key(q, d) >= HS_CW_KEY_INF;
    for (size_t i = 0; bad && i < d; i++) {
        float f;
        memcpy(&f, q + 4 * i, 4);
        if (!isfinite(f))
            return hs__err(HS_EFORMAT, "full replica from peer %u: value %zu is not finite", from, i);
    }
    hs__cf32_get(q, d, dst);
    return 0;
}

/* A neighbour's replica can no longer follow its deltas (one was lost or malformed): drop it
 * from the gossip step and ask the neighbour for its full replica. */
void hs__algo_nbr_lost(hs_algo *a, hs__nbr *n) {
    if (!n->rep) return;
    if (n->synced) HS_LOGW("lost the replica of peer %u: asking it for a full one", n->id);
    if (!n->want_full) a->stats.resyncs++;
    n->synced = 0;
    n->want_full = 1;
    a->reps_dirty = 1;
}

/* The neighbour left (a BYE) or was declared dead, while the view in force still lists it: the
 * view that drops it comes into force only after the membership change went round the job (5 to
 * 90 rounds in the networked runs of docs/RESULTS.md). Its replica stays frozen at its last message. Kept in the
 * CHOCO/BEER mix, it would pull this peer toward a model no peer holds any more, every round, by
 * gamma_c W_ij (xhat_j - xhat_i), and the consensus estimate would measure this peer's own drift
 * from that copy as it trains, which the guard read as divergence (issue 19, docs/RESULTS.md).
 * So it leaves the mix now, its weight W_ij going to this peer's own term as a late neighbour's
 * does in D-PSGD and DCD: the row stays stochastic. The edges between the survivors keep their
 * weights on both sides, so the mix among them stays symmetric and keeps their average; the
 * leaver's side of its edges no longer exists. One declared dead by mistake that is heard from
 * again comes back through a full replica, asked for then. */
void hs__algo_nbr_gone(hs_algo *a, hs__nbr *n, uint64_t r) {
    if (n->gone) return;
    n->gone = 1;
    a->stats.gone++;
    HS_LOGI("round %llu: peer %u is gone: out of the mix until the membership drops it",
            (unsigned long long)r, n->id);
    if (n->synced) a->reps_dirty = 1;
    n->synced = 0;
}

int hs__algo_catch_up(hs_algo *a, hs_exchange *ex, hs__nbr *n, uint64_t r, int timeout_ms,
                      hs__apply_fn apply, void *ctx) {
    while (n->next_round <= r) {
        hs_buf *b = NULL;
        int err = ex->ops->recv(ex, n->id, n->next_round, timeout_ms, &b);
        if (err == HS_ENOENT) {
            /* It will never come: a replica that missed a delta must be replaced. */
            HS_LOGD("round %llu: the message of round %llu from peer %u was lost",
                    (unsigned long long)r, (unsigned long long)n->next_round, n->id);
            hs__algo_nbr_lost(a, n);
            n->next_round++;
            continue;
        }
        if (err == HS_ETIMEDOUT || err == HS_ECONNRESET) {
            HS_LOGD("round %llu: no message of round %llu from peer %u (%s)",
                    (unsigned long long)r, (unsigned long long)n->next_round, n->id, hs_strerror(err));
            if (err == HS_ECONNRESET) hs__algo_nbr_gone(a, n, r);
            return 0;
        }
        if (err < 0) return err;
        if (n->gone) {
            /* Back after all: its replica missed what it sent meanwhile. */
            n->gone = 0;
            n->want_full = n->rep != NULL;
        }
        a->stats.bytes_recv += b->len;
        /* The neighbour asks for this peer's full replica: it goes out with the next push. */
        if (b->len > 0 && (b->data[0] & HS_PAYLOAD_WANT_FULL)) {
            n->sent_full = 0;
            b->data[0] &= (uint8_t)~HS_PAYLOAD_WANT_FULL;
        }
        err = apply(a, n, n->next_round, b->data, b->len, ctx);
        hs_buf_unref(b);
        /* A device that failed to decode it (device mode) failed, not the message: taken for a
         * lost one, every message would be dropped while the failure lasts, the run going on. */
        if (err == HS_ECUDA) return err;
        if (err < 0) {
            /* A payload that fails validation is dropped as a lost one would be. */
            HS_LOGW("round %llu: dropped the message of peer %u: %s", (unsigned long long)r, n->id,
                    hs_error_message());
            hs__algo_nbr_lost(a, n);
        }
        n->next_round++;
    }
    return 1;
}

/* ---------------------------------------------------------------- mixing */

HS_VECTOR_CLONES
void hs__acc_diff(float *acc, const float *a, const float *b, size_t d, float w) {
    for (size_t k = 0; k < d; k++) acc[k] = acc[k] + w * (a[k] - b[k]);
}

float hs__mix_rebuild(hs_algo *a, const hs_peer_view *v, float *mix) {
    float wsum = 0;
    memset(mix, 0, sizeof(float) * a->dpub);
    for (int i = 0; i < v->n_in; i++) {
        hs__nbr *n = hs__algo_nbr(a, v->in[i].id);
        if (!n->synced) continue;
        hs__acc_diff(mix, n->rep, a->own, a->dpub, n->w_in);
        wsum = wsum + n->w_in;
    }
    a->reps_dirty = 0;
    return wsum;
}

HS_VECTOR_CLONES
double hs__step_sq(float *x, const float *m, float g, size_t d) {
    float lane[16] = {0};
    size_t k = 0;
    for (; k + 16 <= d; k += 16)
        for (int l = 0; l < 16; l++) {
            x[k + l] = x[k + l] + g * m[k + l];
            lane[l] = lane[l] + m[k + l] * m[k + l];
        }
    double s = 0;
    for (; k < d; k++) {
        x[k] = x[k] + g * m[k];
        s += (double)m[k] * m[k];
    }
    for (int l = 0; l < 16; l++) s += lane[l];
    return s;
}

double hs__sum_sq(const float *x, size_t d) {
    double s = 0;
    for (size_t k = 0; k < d; k++) s += (double)x[k] * x[k];
    return s;
}

/* ---------------------------------------------------------------- replicas */

/* One compressor message into the replica's vector at offset `at`, and into the accumulator's
 * (weighted by W_ij) when there is one to keep current. */
static int decode_part(hs_algo *a, hs__nbr *n, uint64_t key, const uint8_t *p, size_t len,
                       size_t at, float *acc) {
    if (acc && !a->reps_dirty && n->is_in && a->be)
        return hs__algo_decode_dev(a, n, key, p, len, at, acc);
    if (acc && !a->reps_dirty && n->is_in)
        return hs_compress_decode_add2(a->comp, p, len, n->id, key, n->rep + at, 1.0f, acc + at,
                                       n->w_in, a->d);
    return hs_compress_decode_add(a->comp, p, len, n->id, key, n->rep + at, a->d, 1.0f);
}

int hs__apply_replica(hs_algo *a, hs__nbr *n, uint64_t round, const uint8_t *p, size_t len,
                      void *ctx) {
    if (len < 1) return hs__err(HS_EPROTO, "peer %u sent an empty payload", n->id);
    if (p[0] == HS_PAYLOAD_FULL) {
        int err = hs__payload_read_full(p, len, n->rep, a->dpub, n->id);
        if (err == 0) {
            n->synced = 1;
            n->want_full = 0;
        }
        a->reps_dirty = 1; /* the replica jumped: accumulators are rebuilt */
        return err;
    }
    size_t nv = a->dpub / a->d;
    if (p[0] != (nv > 1 ? HS_PAYLOAD_DELTA_PARTS : HS_PAYLOAD_DELTA))
        return hs__err(HS_EPROTO, "peer %u sent a payload of type %d", n->id, p[0]);
    /* Deltas that arrive before the full replica they apply to are discarded. */
    if (!n->synced) return 0;
    if (nv > 1) {
        /* The lengths are checked before any part is decoded; a part that fails to decode
         * after an earlier one was applied loses the replica (the caller asks for a full one). */
        size_t off = 1 + 4 * (nv - 1), at = off, plen[8];
        if (nv > 8 || len < off)
            return hs__err(HS_EFORMAT, "peer %u sent a %zu-byte message of %zu parts", n->id, len, nv);
        for (size_t k = 0; k + 1 < nv; k++) {
            uint32_t l;
            memcpy(&l, p + 1 + 4 * k, 4);
            if (l > len - at)
                return hs__err(HS_EFORMAT, "peer %u: part %zu of %u bytes overruns the message",
                               n->id, k, l);
            plen[k] = l;
            at += l;
        }
        plen[nv - 1] = len - at;
        at = off;
        for (size_t k = 0; k < nv; k++) {
            int err = decode_part(a, n, hs__part_round(hs__algo_key(a, round), (int)k), p + at,
                                  plen[k], k * a->d, ctx);
            if (err < 0) return err;
            at += plen[k];
        }
        return 0;
    }
    return decode_part(a, n, hs__algo_key(a, round), p + 1, len - 1, 0, ctx);
}

/* Sends q to out-neighbours that hold this peer's replica and the full replica to the others. */
int hs__algo_send_replica(hs_algo *a, hs_exchange *ex, const hs_peer_view *v, uint64_t r,
                          hs_buf *delta) {
    hs_buf *full = NULL;
    int err = 0;
    for (int i = 0; i < v->n_out && err >= 0; i++) {
        hs__nbr *n = hs__algo_nbr(a, v->out[i].id);
        hs_buf *msg = delta, *own = NULL;
        if (!n->sent_full) {
            if (!full && (err = hs__payload_full(a, &full, a->own, a->dpub)) < 0) break;
            msg = full;
        }
        if (n->want_full) {
            /* The request rides on this round's message to the neighbour: on a copy, since the
             * payload is shared with the other neighbours. */
            if ((err = hs_buf_new(&own, msg->len)) < 0 ||
                (err = hs_buf_append(own, msg->data, msg->len)) < 0) {
                hs_buf_unref(own);
                break;
            }
            own->data[0] |= HS_PAYLOAD_WANT_FULL;
            msg = own;
        }
        int full_now = !n->sent_full;
        if ((err = hs__algo_send(a, ex, n->id, r, msg)) == 0 && full_now) n->sent_full = 1;
        hs_buf_unref(own);
    }
    hs_buf_unref(full);
    return err;
}

/* Brings every in-neighbour's replica up to round r; returns how many are current and marks
 * the others in `present`. */
int hs__algo_recv_replicas(hs_algo *a, hs_exchange *ex, const hs_peer_view *v, uint64_t r,
                           uint8_t *present, float *acc) {
    int ok = 0;
    for (int i = 0; i < v->n_in; i++) {
        hs__nbr *n = hs__algo_nbr(a, v->in[i].id);
        int got = hs__algo_replica_streams(a, ex, n, r)
                      ? hs__algo_recv_replica_pieces(a, ex, n, r, acc)
                      : hs__algo_catch_up(a, ex, n, r, a->cfg.recv_timeout_ms, hs__apply_replica,
                                          acc);
        if (got < 0) return got;
        present[i] = (uint8_t)(got && n->synced);
        ok += present[i];
    }
    return ok;
}

int hs__algo_present(hs_algo *a, int n, uint8_t **out) {
    if (n > a->present_cap) {
        uint8_t *p = realloc(a->present, (size_t)n);
        if (!p) return hs__err(HS_ENOMEM, "algorithm: out of memory");
        a->present = p;
        a->present_cap = n;
    }
    *out = a->present;
    return 0;
}
