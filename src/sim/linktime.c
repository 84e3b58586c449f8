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
    int n;
} busy;

struct hs__linktime {
    const hs__wan_profile *p;
    busy *up, *down, *link;
    int headers; /* IP + TCP header bytes per packet; 0: messages cost their payload only */
};

int hs__linktime_new(hs__linktime **out, const hs__wan_profile *p) {
    hs__linktime *lt = calloc(1, sizeof(*lt));
    *out = NULL;
    if (!lt) return hs__err(HS_ENOMEM, "link time: out of memory");
    lt->p = p;
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

/* The message reaches a stage of rate bps at *s (its first byte) and has left the stage
 * before at *e (its last byte). It occupies the stage for bits / bps from the first free
 * moment at or after *s, and leaves it no sooner than *e. */
static void stage(double *s, double *e, busy *q, double bps, double bits) {
    if (bps <= 0) return;
    double dur = bits / bps, t = *s;
    int k = 0;
    for (; k < q->n; k++) {
        if (q->b[k] <= t) continue;    /* ends before we start */
        if (q->a[k] >= t + dur) break; /* the gap before it is long enough */
        t = q->b[k];
    }
    if (q->n == KEEP) { /* forget the oldest */
        memmove(q->a, q->a + 1, sizeof(double) * (KEEP - 1));
        memmove(q->b, q->b + 1, sizeof(double) * (KEEP - 1));
        q->n--;
        k = k > 0 ? k - 1 : 0;
    }
    memmove(q->a + k + 1, q->a + k, sizeof(double) * (size_t)(q->n - k));
    memmove(q->b + k + 1, q->b + k, sizeof(double) * (size_t)(q->n - k));
    q->a[k] = t;
    q->b[k] = t + dur;
    q->n++;
    *s = t;
    if (t + dur > *e) *e = t + dur;
}

double hs__linktime_arrival(hs__linktime *lt, int i, int j, size_t bytes, double t) {
    const hs__wan_profile *p = lt->p;
    const hs__wan_pair *pr = &p->pair[i * p->n + j];
    double bits = 8.0 * hs__linktime_wire_bytes(lt, (double)bytes), s = t, e = t;
    stage(&s, &e, &lt->up[i], p->up_bps[i], bits);
    if (pr->bucket >= 0) stage(&s, &e, &lt->link[pr->bucket], p->bucket_bps[pr->bucket], bits);
    s += pr->delay_s;
    e += pr->delay_s;
    stage(&s, &e, &lt->down[j], p->down_bps[j], bits);
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
