/* Virtual link time of the simulator (sim/linktime.h): each rate-limited stage remembers when
 * it is busy, so messages that share an uplink, a downlink or a pipe between clusters queue
 * behind each other the way the emulator's token buckets make packets do. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error_internal.h"
#include "sim/linktime.h"

/* The intervals a rate-limited stage is busy, sorted and disjoint. Messages are costed in
 * the order they are sent, which is not the order they reach a receiver's downlink (a message
 * over a slow link is sent first and arrives last), so a stage books each message into the
 * first gap long enough from its arrival on, rather than after the last one booked. Only the
 * latest KEEP intervals are kept: far older ones no longer matter to messages being sent. */
#define KEEP 256

typedef struct busy {
    double a[KEEP], b[KEEP];
    int flow[KEEP]; /* the connection each interval carries (a stage's other end) */
    int n;
} busy;

/* The share of a stage's rate TCP gets once the stage is congested, one connection alone or
 * two or more taking turns, and what makes it congested: for reno a message that overflows the
 * drop-tail queue, for bbr any message that has to wait behind another (its pacing rate is its
 * bandwidth estimate, which sharing lowers, with drops or without). Measured on the emulator at
 * 20 Mbit/s and 100 ms RTT with SGP's traffic (docs/WAN.md, "TCP on a busy link"). */
static const hs__linktime_tcp tcp_models[] = {
    {"fluid", 1.0, 1.0, 0},
    {"reno", 0.83, 0.57, 1},
    {"bbr", 0.90, 0.74, 0},
};

struct hs__linktime {
    const hs__wan_profile *p;
    busy *up, *down, *link;
    int headers; /* IP + TCP header bytes per packet; 0: messages cost their payload only */
    const hs__linktime_tcp *tcp;
};

int hs__linktime_new(hs__linktime **out, const hs__wan_profile *p) {
    hs__linktime *lt = calloc(1, sizeof(*lt));
    *out = NULL;
    if (!lt) return hs__err(HS_ENOMEM, "link time: out of memory");
    lt->p = p;
    lt->tcp = &tcp_models[0];
    lt->up = calloc((size_t)p->n, sizeof(busy));
    lt->down = calloc((size_t)p->n, sizeof(busy));
    lt->link = calloc((size_t)p->nbuckets + 1, sizeof(busy));
    if (!lt->up || !lt->down || !lt->link) {
        hs__linktime_free(lt);
        return hs__err(HS_ENOMEM, "link time: out of memory");
    }
    *out = lt;
    return 0;
}

void hs__linktime_set_headers(hs__linktime *lt, int headers) {
    lt->headers = headers > 0 && headers < lt->p->mtu ? headers : 0;
}

int hs__linktime_set_tcp(hs__linktime *lt, const char *name) {
    for (size_t k = 0; k < sizeof(tcp_models) / sizeof(tcp_models[0]); k++)
        if (!strcmp(name, tcp_models[k].name)) {
            lt->tcp = &tcp_models[k];
            return 0;
        }
    return hs__err(HS_EINVAL, "link TCP model '%s': use fluid, reno or bbr", name);
}

const hs__linktime_tcp *hs__linktime_tcp_model(const hs__linktime *lt) { return lt->tcp; }

double hs__linktime_wire_bytes(const hs__linktime *lt, double bytes) {
    if (!lt->headers || bytes <= 0) return bytes;
    /* The emulator's rates count IP bytes: TCP cuts the payload into packets of at most
     * mtu - headers bytes (the MSS), and each carries its headers on top. */
    double mss = lt->p->mtu - lt->headers;
    return bytes + ceil(bytes / mss) * lt->headers;
}

void hs__linktime_free(hs__linktime *lt) {
    if (!lt) return;
    free(lt->up);
    free(lt->down);
    free(lt->link);
    free(lt);
}

/* The first moment at or after t that the stage is free for dur seconds, and the position its
 * interval goes in; *other: it waits behind an interval of another connection than flow. */
static double first_gap(const busy *q, double t, double dur, int flow, int *k, int *other) {
    *other = 0;
    for (*k = 0; *k < q->n; (*k)++) {
        if (q->b[*k] <= t) continue;    /* ends before we start */
        if (q->a[*k] >= t + dur) break; /* the gap before it is long enough */
        t = q->b[*k];
        *other |= q->flow[*k] != flow;
    }
    return t;
}

/* The message reaches a stage of rate bps at *s (its first byte) and has left the stage
 * before at *e (its last byte). It occupies the stage for bits / bps from the first free
 * moment at or after *s, and leaves it no sooner than *e; once the stage is congested (the TCP
 * model's rule, with rtt the path's round trip) for bits / (share x bps). */
static void stage(const hs__linktime *lt, double *s, double *e, busy *q, double bps, double bits,
                  int flow, double rtt) {
    if (bps <= 0) return;
    const hs__linktime_tcp *m = lt->tcp;
    double dur = bits / bps;
    int k, other;
    double t = first_gap(q, *s, dur, flow, &k, &other);
    if (hs__linktime_congested(m, t - *s, dur, lt->p->queue_s, rtt)) {
        double share = other ? m->share_shared : m->share_alone;
        int other2;
        dur /= share;
        t = first_gap(q, *s, dur, flow, &k, &other2);
    }
    if (q->n == KEEP) { /* forget the oldest */
        memmove(q->a, q->a + 1, sizeof(double) * (KEEP - 1));
        memmove(q->b, q->b + 1, sizeof(double) * (KEEP - 1));
        memmove(q->flow, q->flow + 1, sizeof(int) * (KEEP - 1));
        q->n--;
        k = k > 0 ? k - 1 : 0;
    }
    memmove(q->a + k + 1, q->a + k, sizeof(double) * (size_t)(q->n - k));
    memmove(q->b + k + 1, q->b + k, sizeof(double) * (size_t)(q->n - k));
    memmove(q->flow + k + 1, q->flow + k, sizeof(int) * (size_t)(q->n - k));
    q->a[k] = t;
    q->b[k] = t + dur;
    q->flow[k] = flow;
    q->n++;
    *s = t;
    if (t + dur > *e) *e = t + dur;
}

int hs__linktime_congested(const hs__linktime_tcp *m, double wait, double dur, double queue_s,
                           double rtt) {
    if (m->share_alone >= 1.0 && m->share_shared >= 1.0) return 0;
    /* A window-limited TCP puts what waits at a stage into the network, which holds a round
     * trip's worth in flight and queue_s in the drop-tail queue; beyond that, drops. */
    if (m->on_overflow) return wait + dur > queue_s + rtt;
    return wait > 0;
}

double hs__linktime_arrival(hs__linktime *lt, int i, int j, size_t bytes, double t) {
    const hs__wan_profile *p = lt->p;
    const hs__wan_pair *pr = &p->pair[i * p->n + j];
    double bits = 8.0 * hs__linktime_wire_bytes(lt, (double)bytes), s = t, e = t;
    /* The round trip of a message's connection: its delay there and the ACKs' back. */
    double rtt = pr->delay_s + p->pair[j * p->n + i].delay_s;
    stage(lt, &s, &e, &lt->up[i], p->up_bps[i], bits, j, rtt);
    if (pr->bucket >= 0)
        stage(lt, &s, &e, &lt->link[pr->bucket], p->bucket_bps[pr->bucket], bits, i * p->n + j,
              rtt);
    s += pr->delay_s;
    e += pr->delay_s;
    stage(lt, &s, &e, &lt->down[j], p->down_bps[j], bits, i, rtt);
    return e;
}

static double min_rate(double a, double b) { return a <= 0 ? b : b <= 0 ? a : a < b ? a : b; }

double hs__linktime_allreduce(const hs__linktime *lt, size_t bytes) {
    const hs__wan_profile *p = lt->p;
    int n = p->n;
    if (n < 2) return 0;
    double chunk = 8.0 * hs__linktime_wire_bytes(lt, (double)bytes / n), slowest = 0;
    /* Ring links that cross the same pipe (between clusters) share its rate. */
    int *users = calloc((size_t)p->nbuckets + 1, sizeof(int));
    if (!users) return -1;
    for (int i = 0; i < n; i++) {
        int b = p->pair[i * n + (i + 1) % n].bucket;
        if (b >= 0) users[b]++;
    }
    for (int i = 0; i < n; i++) {
        int j = (i + 1) % n;
        const hs__wan_pair *pr = &p->pair[i * n + j];
        double r = min_rate(p->up_bps[i], p->down_bps[j]);
        if (pr->bucket >= 0) r = min_rate(r, p->bucket_bps[pr->bucket] / users[pr->bucket]);
        /* Two one-way delays: gloo's TCP transport sends a buffer only once the receiver has
         * announced the matching receive (NOTIFY_RECV_READY), and its ring posts that receive
         * when the step starts, so every step waits for the notice to travel upstream, then
         * for the data to come down. */
        double step = 2 * pr->delay_s + (r > 0 ? chunk / r : 0);
        if (step > slowest) slowest = step;
    }
    free(users);
    return 2.0 * (n - 1) * slowest;
}
