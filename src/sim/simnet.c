/* The in-process exchange: per-destination queues of refcounted payloads, views from the
 * topology (restricted to the survivors after a kill), and virtual time for asynchronous runs.
 * Deterministic: messages are delivered in (arrival time, send order). Single-threaded. */
#include <stdlib.h>
#include <string.h>

#include "hearsay/algo.h"
#include "core/philox.h"
#include "core/error_internal.h"
#include "hearsay/sim.h"
#include "sim/linktime.h"

typedef struct qmsg {
    uint32_t from;
    uint64_t round;
    hs_buf *payload;
    double arrival;
    uint64_t seq;
} qmsg;

typedef struct endpoint {
    hs_exchange ex;
    hs_simnet *net;
    int id;
    qmsg *q;
    int nq, capq;
    double clock;
    hs_exchange_stats st;
    hs_nbr *in, *out;
    int cap_in, cap_out;
    /* Newest round each sender sent here (whether or not it was dropped). */
    struct {
        uint32_t from;
        uint64_t round;
    } *seen;
    int n_seen;
} endpoint;

struct hs_simnet {
    int n;
    const hs_topo *base;
    hs_topo *restricted; /* survivors' topology after a kill, or NULL */
    uint8_t *alive;
    int *rank_of;        /* id -> rank in the current topology, -1 when dead */
    uint64_t epoch;
    double latency;
    uint64_t seq;
    double loss;
    uint64_t loss_seed;
    hs__linktime *links; /* per-link delay and rate, or NULL: every message takes latency */
    endpoint *ep;
};

static endpoint *ep_of(hs_exchange *ex) { return (endpoint *)ex->impl; }

static int grow(hs_nbr **p, int *cap, int need) {
    if (need <= *cap) return 0;
    hs_nbr *n = realloc(*p, sizeof(hs_nbr) * (size_t)need);
    if (!n) return hs__err(HS_ENOMEM, "simulator: out of memory");
    *p = n;
    *cap = need;
    return 0;
}

static int sim_view(hs_exchange *ex, uint64_t round, hs_peer_view *out) {
    endpoint *e = ep_of(ex);
    hs_simnet *s = e->net;
    if (!s->alive[e->id]) return hs__err(HS_ECONNRESET, "simulated peer %d has left", e->id);
    const hs_topo *t = s->restricted ? s->restricted : s->base;
    hs_view v;
    int err = hs_topo_view(t, s->rank_of[e->id], round, &v);
    if (err < 0) return err;
    if ((err = grow(&e->in, &e->cap_in, v.n_in + 1)) < 0 ||
        (err = grow(&e->out, &e->cap_out, v.n_out + 1)) < 0) {
        hs_view_free(&v);
        return err;
    }
    /* Ranks of the current topology are the survivors in id order. */
    int *id_of_rank = malloc(sizeof(int) * (size_t)s->n);
    if (!id_of_rank) {
        hs_view_free(&v);
        return hs__err(HS_ENOMEM, "simulator: out of memory");
    }
    for (int i = 0; i < s->n; i++)
        if (s->rank_of[i] >= 0) id_of_rank[s->rank_of[i]] = i;
    for (int i = 0; i < v.n_in; i++) e->in[i] = (hs_nbr){(uint32_t)id_of_rank[v.in[i].peer], v.in[i].w};
    for (int i = 0; i < v.n_out; i++) e->out[i] = (hs_nbr){(uint32_t)id_of_rank[v.out[i].peer], v.out[i].w};
    free(id_of_rank);
    out->epoch = s->epoch;
    out->self = (uint32_t)e->id;
    out->n_members = v.n;
    out->self_w = v.self_w;
    out->n_in = v.n_in;
    out->n_out = v.n_out;
    out->in = e->in;
    out->out = e->out;
    hs_view_free(&v);
    return 0;
}

static int sim_send(hs_exchange *ex, uint32_t to, uint64_t round, hs_buf *payload) {
    endpoint *e = ep_of(ex);
    hs_simnet *s = e->net;
    if (to >= (uint32_t)s->n) return hs__err(HS_EINVAL, "simulator: no peer %u", to);
    e->st.bytes_sent += payload->len;
    e->st.msgs_sent++;
    if (!s->alive[to]) return 0; /* lost with the peer */
    endpoint *d = &s->ep[to];
    int k;
    for (k = 0; k < d->n_seen && d->seen[k].from != (uint32_t)e->id; k++) {
    }
    if (k == d->n_seen) {
        void *ns = realloc(d->seen, sizeof(*d->seen) * (size_t)(d->n_seen + 1));
        if (!ns) return hs__err(HS_ENOMEM, "simulator: out of memory");
        d->seen = ns;
        d->seen[d->n_seen].from = (uint32_t)e->id;
        d->n_seen++;
    }
    d->seen[k].round = round;
    if (s->loss > 0) {
        uint64_t q = s->seq++;
        uint32_t u = hs_rng_at(s->loss_seed, HS_RNG_NET, (uint32_t)e->id, (uint32_t)to, q);
        if (hs_rng_u01(u) < s->loss) return 0; /* dropped on the way */
    }
    if (d->nq == d->capq) {
        int cap = d->capq ? d->capq * 2 : 16;
        qmsg *q = realloc(d->q, sizeof(qmsg) * (size_t)cap);
        if (!q) return hs__err(HS_ENOMEM, "simulator: out of memory");
        d->q = q;
        d->capq = cap;
    }
    double arrival = s->links ? hs__linktime_arrival(s->links, e->id, (int)to, payload->len,
                                                     e->clock)
                              : e->clock + s->latency;
    d->q[d->nq++] = (qmsg){(uint32_t)e->id, round, hs_buf_ref(payload), arrival, s->seq++};
    return 0;
}

static void take(endpoint *e, int k, hs_buf **out) {
    *out = e->q[k].payload;
    e->st.bytes_recv += (*out)->len;
    e->st.msgs_recv++;
    memmove(&e->q[k], &e->q[k + 1], sizeof(qmsg) * (size_t)(e->nq - k - 1));
    e->nq--;
}

/* The sender's message of `round`. In virtual time a message already sent but not yet arrived
 * is waited for: the receiver's clock moves to its arrival, or with links (clocks in seconds)
 * by timeout_ms when it arrives later than that (HS_ETIMEDOUT; it stays queued). One not sent
 * at all cannot be waited for in a single-threaded simulation and times out at once. */
static int sim_recv(hs_exchange *ex, uint32_t from, uint64_t round, int timeout_ms, hs_buf **out) {
    endpoint *e = ep_of(ex);
    for (int k = 0; k < e->nq; k++)
        if (e->q[k].from == from && e->q[k].round == round) {
            double limit = e->clock + timeout_ms * 1e-3;
            if (e->net->links && timeout_ms >= 0 && e->q[k].arrival > limit) {
                e->clock = limit;
                return HS_ETIMEDOUT;
            }
            if (e->q[k].arrival > e->clock) e->clock = e->q[k].arrival;
            take(e, k, out);
            return 0;
        }
    if (from >= (uint32_t)e->net->n || !e->net->alive[from]) return HS_ECONNRESET;
    for (int k = 0; k < e->n_seen; k++)
        if (e->seen[k].from == from && e->seen[k].round > round) return HS_ENOENT;
    return HS_ETIMEDOUT;
}

static int sim_drain(hs_exchange *ex, hs_msg *out, int max) {
    endpoint *e = ep_of(ex);
    int n = 0;
    while (n < max) {
        int best = -1;
        for (int k = 0; k < e->nq; k++) {
            if (e->q[k].arrival > e->clock) continue;
            if (best < 0 || e->q[k].arrival < e->q[best].arrival ||
                (e->q[k].arrival == e->q[best].arrival && e->q[k].seq < e->q[best].seq))
                best = k;
        }
        if (best < 0) break;
        out[n].from = e->q[best].from;
        out[n].round = e->q[best].round;
        take(e, best, &out[n].payload);
        n++;
    }
    return n;
}

static void sim_stats(hs_exchange *ex, hs_exchange_stats *out) { *out = ep_of(ex)->st; }
static double sim_now(hs_exchange *ex) { return ep_of(ex)->clock; }

static const hs_exchange_ops sim_ops = {.view = sim_view,
                                        .send = sim_send,
                                        .recv = sim_recv,
                                        .drain = sim_drain,
                                        .stats = sim_stats,
                                        .now = sim_now};

void hs_simnet_free(hs_simnet *s) {
    if (!s) return;
    for (int i = 0; s->ep && i < s->n; i++) {
        endpoint *e = &s->ep[i];
        for (int k = 0; k < e->nq; k++) hs_buf_unref(e->q[k].payload);
        free(e->q);
        free(e->seen);
        free(e->in);
        free(e->out);
    }
    free(s->ep);
    free(s->alive);
    free(s->rank_of);
    hs_topo_free(s->restricted);
    free(s);
}

int hs_simnet_new(hs_simnet **out, const hs_topo *topo) {
    int n = hs_topo_n(topo);
    hs_simnet *s = calloc(1, sizeof(*s));
    if (!s) return hs__err(HS_ENOMEM, "simulator: out of memory");
    s->n = n;
    s->base = topo;
    s->ep = calloc((size_t)n, sizeof(endpoint));
    s->alive = malloc((size_t)n);
    s->rank_of = malloc(sizeof(int) * (size_t)n);
    if (!s->ep || !s->alive || !s->rank_of) {
        hs_simnet_free(s);
        return hs__err(HS_ENOMEM, "simulator: out of memory");
    }
    for (int i = 0; i < n; i++) {
        s->alive[i] = 1;
        s->rank_of[i] = i;
        s->ep[i].ex.ops = &sim_ops;
        s->ep[i].ex.impl = &s->ep[i];
        s->ep[i].net = s;
        s->ep[i].id = i;
    }
    *out = s;
    return 0;
}

hs_exchange *hs_simnet_exchange(hs_simnet *s, int i) { return &s->ep[i].ex; }
void hs_simnet_set_clock(hs_simnet *s, int i, double t) { s->ep[i].clock = t; }
void hs__simnet_set_links(hs_simnet *s, hs__linktime *lt) { s->links = lt; }
double hs_simnet_clock(const hs_simnet *s, int i) { return s->ep[i].clock; }
void hs_simnet_set_latency(hs_simnet *s, double latency) { s->latency = latency; }
void hs_simnet_set_loss(hs_simnet *s, double p, uint64_t seed) {
    s->loss = p;
    s->loss_seed = seed;
}
int hs_simnet_alive(const hs_simnet *s, int i) { return i >= 0 && i < s->n && s->alive[i]; }

/* Peer i is gone for messages; its queue goes with it. */
static void depart(hs_simnet *s, int i) {
    s->alive[i] = 0;
    endpoint *e = &s->ep[i];
    for (int k = 0; k < e->nq; k++) hs_buf_unref(e->q[k].payload);
    e->nq = 0;
}

int hs_simnet_leave(hs_simnet *s, int i) {
    if (!hs_simnet_alive(s, i)) return hs__err(HS_EINVAL, "simulator: peer %d is not alive", i);
    depart(s, i);
    return 0;
}

int hs_simnet_kill(hs_simnet *s, int i) {
    /* A peer that left (hs_simnet_leave) is still a member of the views until now. */
    if (i < 0 || i >= s->n || s->rank_of[i] < 0)
        return hs__err(HS_EINVAL, "simulator: peer %d is not a member", i);
    uint8_t was = s->alive[i];
    s->alive[i] = 0;
    hs_topo *r;
    int err = hs_topo_restrict(&r, s->base, s->alive);
    if (err < 0) {
        s->alive[i] = was;
        return err;
    }
    hs_topo_free(s->restricted);
    s->restricted = r;
    int rank = 0;
    for (int k = 0; k < s->n; k++) s->rank_of[k] = s->alive[k] ? rank++ : -1;
    s->epoch++;
    depart(s, i);
    return 0;
}

double hs_simnet_inflight_weight(const hs_simnet *s) {
    double w = 0;
    for (int i = 0; i < s->n; i++)
        for (int k = 0; k < s->ep[i].nq; k++) {
            w += hs_algo_payload_weight(s->ep[i].q[k].payload);
        }
    return w;
}

size_t hs_simnet_queued(const hs_simnet *s) {
    size_t n = 0;
    for (int i = 0; i < s->n; i++) n += (size_t)s->ep[i].nq;
    return n;
}
