/* hearsay-wanemu: a userspace link emulator between peer network namespaces (docs/WAN.md).
 * It owns one TUN interface per peer (peer i is 10.77.0.<i+1>/24 inside its namespace); every
 * IPv4 packet a peer sends to another peer's address is read here, passed through the sender's
 * uplink token bucket, the pair's own link bucket (if the profile gives one), the pair's
 * one-way delay with jitter (never reordering a pair's packets), the receiver's downlink
 * bucket, and written to the receiver's TUN. Loss is drawn once per packet at entry.
 * Single-threaded: epoll over the TUNs and a signalfd, woken (epoll_pwait2, nanoseconds) at the
 * earliest release time of a binary heap of packets; no busy loop. */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <time.h>
#include <unistd.h>

#include "core/rng.h"
#include "hearsay/error.h"
#include "tun.h"
#include "wan/profile.h"

#define SUBNET 0x0a4d0000u /* 10.77.0.0/24 */
#define READ_BATCH 64      /* packets read from one TUN before looking at the others */
#define POOL_BYTES (256u << 20)

enum { ST_UP, ST_LINK, ST_PROP, ST_DOWN, ST_OUT };

typedef struct pkt {
    double t;     /* when the packet reaches stage */
    uint64_t seq; /* ties in t keep arrival order */
    struct pkt *next_free;
    int src, dst, stage;
    uint32_t len;
    unsigned char data[];
} pkt;

/* A token bucket in front of a FIFO: the departure of each packet is computed when it
 * arrives (arrivals come in time order), so the queue itself is only the heap. */
typedef struct bucket {
    double rate;   /* bytes per second; 0: unlimited */
    double burst;  /* bytes */
    double tokens; /* at t_last */
    double t_last; /* departure of the last packet */
    uint64_t drops;
} bucket;

typedef struct pair_stats {
    uint64_t packets, bytes, lost, dropped;
    double last_prop; /* release of the pair's last packet from the delay stage */
} pair_stats;

typedef struct emu {
    hs__wan_profile *p;
    int n, *fd;
    bucket *up, *down, *link;
    pair_stats *ps;
    hs_rng *rng; /* per sender: loss and jitter draws */
    pkt **heap;
    size_t nheap, cap;
    pkt *free_list;
    size_t npkts, max_pkts;
    uint64_t seq, unroutable, write_drops, pool_drops;
} emu;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---------------------------------------------------------------- heap of release times */
static int before(const pkt *a, const pkt *b) {
    return a->t < b->t || (a->t == b->t && a->seq < b->seq);
}

static void heap_push(emu *e, pkt *x) {
    size_t i = e->nheap++;
    while (i > 0) {
        size_t up = (i - 1) / 2;
        if (!before(x, e->heap[up])) break;
        e->heap[i] = e->heap[up];
        i = up;
    }
    e->heap[i] = x;
}

static pkt *heap_pop(emu *e) {
    pkt *top = e->heap[0], *last = e->heap[--e->nheap];
    size_t i = 0, n = e->nheap;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && before(e->heap[c + 1], e->heap[c])) c++;
        if (!before(e->heap[c], last)) break;
        e->heap[i] = e->heap[c];
        i = c;
    }
    if (n) e->heap[i] = last;
    return top;
}

/* ---------------------------------------------------------------- packets */
static pkt *pkt_get(emu *e) {
    pkt *x = e->free_list;
    if (x) {
        e->free_list = x->next_free;
        return x;
    }
    if (e->npkts >= e->max_pkts) return NULL;
    if (!(x = malloc(sizeof(*x) + (size_t)e->p->mtu))) return NULL;
    e->npkts++;
    return x;
}

static void pkt_put(emu *e, pkt *x) {
    x->next_free = e->free_list;
    e->free_list = x;
}

/* Sets x->t to the packet's departure from b; 0 when it would wait longer than the queue
 * allows (the bucket is then left as it was: the packet is dropped). */
static int bucket_pass(const emu *e, bucket *b, pkt *x) {
    if (b->rate <= 0) return 1;
    double t = x->t > b->t_last ? x->t : b->t_last;
    double tok = b->tokens + (t - b->t_last) * b->rate;
    if (tok > b->burst) tok = b->burst;
    if (tok < x->len) {
        t += (x->len - tok) / b->rate;
        tok = x->len;
    }
    if (t - x->t > e->p->queue_s) {
        b->drops++;
        return 0;
    }
    b->tokens = tok - x->len;
    b->t_last = t;
    x->t = t;
    return 1;
}

/* Moves x through its stages up to the first one in the future (then it waits in the heap)
 * or its delivery. Times are the packet's own, not the clock's, so a late timer does not add
 * to the emulated delay of what comes after. */
static void advance(emu *e, pkt *x, double now) {
    int n = e->n, ij = x->src * n + x->dst;
    const hs__wan_pair *pr = &e->p->pair[ij];
    pair_stats *ps = &e->ps[ij];
    while (x->t <= now) {
        int ok = 1;
        switch (x->stage++) {
        case ST_UP:
            ok = bucket_pass(e, &e->up[x->src], x);
            break;
        case ST_LINK:
            if (pr->bucket >= 0) ok = bucket_pass(e, &e->link[pr->bucket], x);
            break;
        case ST_PROP: {
            double d = pr->delay_s;
            if (pr->jitter_s > 0) d += (2 * hs__rng_double(&e->rng[x->src]) - 1) * pr->jitter_s;
            x->t += d > 0 ? d : 0;
            if (x->t < ps->last_prop) x->t = ps->last_prop;
            ps->last_prop = x->t;
            break;
        }
        case ST_DOWN:
            ok = bucket_pass(e, &e->down[x->dst], x);
            break;
        default:
            if (write(e->fd[x->dst], x->data, x->len) == (ssize_t)x->len) {
                ps->packets++;
                ps->bytes += x->len;
            } else {
                e->write_drops++;
            }
            pkt_put(e, x);
            return;
        }
        if (!ok) {
            ps->dropped++;
            pkt_put(e, x);
            return;
        }
    }
    x->seq = e->seq++;
    heap_push(e, x);
}

/* The peer a packet is for, or -1 when it is not an IPv4 packet between two peers. */
static int route(const emu *e, const unsigned char *d, size_t len, int src) {
    if (len < 20 || (d[0] >> 4) != 4) return -1;
    size_t ihl = (size_t)(d[0] & 15) * 4, tot = (size_t)d[2] << 8 | d[3];
    if (ihl < 20 || tot < ihl || tot > len) return -1;
    uint32_t dst = (uint32_t)d[16] << 24 | (uint32_t)d[17] << 16 | (uint32_t)d[18] << 8 | d[19];
    if ((dst & 0xffffff00u) != SUBNET) return -1;
    int j = (int)(dst & 0xff) - 1;
    return j >= 0 && j < e->n && j != src ? j : -1;
}

static void read_peer(emu *e, int i) {
    for (int k = 0; k < READ_BATCH; k++) {
        pkt *x = pkt_get(e);
        if (!x) {
            /* Out of buffers: read and drop, so the TUN does not stay readable forever. */
            unsigned char sink[65536];
            if (read(e->fd[i], sink, sizeof(sink)) < 0) return;
            e->pool_drops++;
            continue;
        }
        ssize_t r = read(e->fd[i], x->data, (size_t)e->p->mtu);
        if (r <= 0) {
            pkt_put(e, x);
            return;
        }
        int j = route(e, x->data, (size_t)r, i);
        if (j < 0) {
            e->unroutable++;
            pkt_put(e, x);
            continue;
        }
        x->src = i;
        x->dst = j;
        x->len = (uint32_t)r;
        x->stage = ST_UP;
        x->t = now_s();
        const hs__wan_pair *pr = &e->p->pair[i * e->n + j];
        if (pr->loss > 0 && hs__rng_double(&e->rng[i]) < pr->loss) {
            e->ps[i * e->n + j].lost++;
            pkt_put(e, x);
            continue;
        }
        advance(e, x, x->t);
    }
}

/* ---------------------------------------------------------------- setup, stats, loop */
static int emu_init(emu *e, hs__wan_profile *p) {
    int n = p->n;
    memset(e, 0, sizeof(*e));
    e->p = p;
    e->n = n;
    e->max_pkts = POOL_BYTES / ((size_t)p->mtu + sizeof(pkt));
    e->cap = e->max_pkts;
    e->fd = malloc((size_t)n * sizeof(int));
    e->up = calloc((size_t)n, sizeof(bucket));
    e->down = calloc((size_t)n, sizeof(bucket));
    e->link = calloc((size_t)p->nbuckets + 1, sizeof(bucket));
    e->ps = calloc((size_t)n * (size_t)n, sizeof(pair_stats));
    e->rng = calloc((size_t)n, sizeof(hs_rng));
    e->heap = malloc(e->cap * sizeof(pkt *));
    for (int i = 0; e->fd && i < n; i++) e->fd[i] = -1;
    if (!e->fd || !e->up || !e->down || !e->link || !e->ps || !e->rng || !e->heap) return -1;
    /* A burst of one MTU: packets leave back to back at the line rate, never faster. */
    double burst = p->mtu;
    for (int i = 0; i < n; i++) {
        e->up[i] = (bucket){p->up_bps[i] / 8, burst, burst, 0, 0};
        e->down[i] = (bucket){p->down_bps[i] / 8, burst, burst, 0, 0};
        hs__rng_init(&e->rng[i], p->seed, 0x77616e, (uint32_t)i, 0);
    }
    for (int b = 0; b < p->nbuckets; b++)
        e->link[b] = (bucket){p->bucket_bps[b] / 8, burst, burst, 0, 0};
    return 0;
}

static void emu_free(emu *e) {
    for (int i = 0; e->fd && i < e->n; i++)
        if (e->fd[i] >= 0) close(e->fd[i]);
    while (e->nheap) pkt_put(e, heap_pop(e));
    for (pkt *x = e->free_list, *nx; x; x = nx) {
        nx = x->next_free;
        free(x);
    }
    free(e->fd);
    free(e->up);
    free(e->down);
    free(e->link);
    free(e->ps);
    free(e->rng);
    free(e->heap);
}

/* Counters as JSON: what each direction delivered, lost (drawn) and dropped (queue full). */
static void write_stats(const emu *e, const char *path) {
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "hearsay-wanemu: %s: %s\n", path, strerror(errno));
        return;
    }
    fprintf(f,
            "{\"unroutable\": %" PRIu64 ", \"write_drops\": %" PRIu64 ", \"pool_drops\": %" PRIu64
            ", \"pairs\": [",
            e->unroutable, e->write_drops, e->pool_drops);
    int first = 1;
    for (int i = 0; i < e->n; i++)
        for (int j = 0; j < e->n; j++) {
            const pair_stats *s = &e->ps[i * e->n + j];
            if (i == j || !(s->packets | s->lost | s->dropped)) continue;
            fprintf(f,
                    "%s\n  {\"from\": %d, \"to\": %d, \"packets\": %" PRIu64 ", \"bytes\": %" PRIu64
                    ", \"lost\": %" PRIu64 ", \"dropped\": %" PRIu64 "}",
                    first ? "" : ",", i, j, s->packets, s->bytes, s->lost, s->dropped);
            first = 0;
        }
    fprintf(f, "\n]}\n");
    fclose(f);
}

static int loop(emu *e, int sfd) {
    int ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN}, evs[64];
    if (ep < 0) return -1;
    for (int i = 0; i <= e->n; i++) {
        ev.data.u32 = (uint32_t)i;
        if (epoll_ctl(ep, EPOLL_CTL_ADD, i < e->n ? e->fd[i] : sfd, &ev) < 0) return -1;
    }
    for (;;) {
        double now = now_s();
        while (e->nheap && e->heap[0]->t <= now) advance(e, heap_pop(e), now);
        /* epoll_pwait2 takes a timeout in nanoseconds: one system call per wake-up, where a
         * timerfd costs two more (arm and read) and epoll_wait rounds to milliseconds. */
        struct timespec ts, *tsp = NULL;
        if (e->nheap) {
            double w = e->heap[0]->t - now;
            ts.tv_sec = (time_t)w;
            ts.tv_nsec = (long)((w - (double)ts.tv_sec) * 1e9);
            tsp = &ts;
        }
        int k = epoll_pwait2(ep, evs, 64, tsp, NULL);
        if (k < 0 && errno != EINTR) return -1;
        for (int m = 0; m < k; m++) {
            uint32_t id = evs[m].data.u32;
            if (id < (uint32_t)e->n) {
                read_peer(e, (int)id);
            } else {
                close(ep);
                return 0;
            }
        }
    }
}

static void usage(FILE *f) {
    fprintf(f, "usage: hearsay-wanemu --profile FILE --netns NS0,NS1,... [--ifname NAME]\n"
               "                      [--stats FILE] [--check]\n"
               "Routes IPv4 between one TUN interface per network namespace (peer i is\n"
               "10.77.0.<i+1>/24 in NSi) through the links of the profile (docs/WAN.md).\n"
               "Prints \"ready\" once every interface is up; runs until SIGTERM or SIGINT,\n"
               "then writes per-direction counters to the --stats file.\n"
               "  --check  only read and validate the profile, print what it says per peer, exit.\n"
               "tools/wan creates the namespaces and runs this; use it instead.\n");
}

int main(int argc, char **argv) {
    const char *profile = NULL, *netns = NULL, *ifname = "wan0", *stats = NULL;
    int check = 0;
    for (int a = 1; a < argc; a++) {
        const char *s = argv[a];
        const char **dst = !strcmp(s, "--profile")  ? &profile
                           : !strcmp(s, "--netns")  ? &netns
                           : !strcmp(s, "--ifname") ? &ifname
                           : !strcmp(s, "--stats")  ? &stats
                                                    : NULL;
        if (dst && a + 1 < argc) {
            *dst = argv[++a];
        } else if (!strcmp(s, "--check")) {
            check = 1;
        } else if (!strcmp(s, "--help") || !strcmp(s, "-h")) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "hearsay-wanemu: %s: unknown option or missing value\n", s);
            usage(stderr);
            return 2;
        }
    }
    if (!profile || (!netns && !check)) {
        usage(stderr);
        return 2;
    }
    hs__wan_profile *p;
    if (hs__wan_profile_load(&p, profile) < 0) {
        fprintf(stderr, "hearsay-wanemu: %s\n", hs_error_message());
        return 2;
    }
    if (check) {
        /* One line per fact, for tools/wan to read. */
        printf("name %s\npeers %d\nmtu %d\nqueue_ms %g\nlink_buckets %d\n", p->name, p->n, p->mtu,
               p->queue_s * 1e3, p->nbuckets);
        for (int i = 0; i < p->n; i++)
            printf("peer %d up_mbit %g down_mbit %g compute %g\n", i, p->up_bps[i] * 1e-6,
                   p->down_bps[i] * 1e-6, p->compute[i]);
        for (int i = 0; i < p->n; i++)
            for (int j = 0; j < p->n; j++) {
                const hs__wan_pair *pr = &p->pair[i * p->n + j];
                if (i == j) continue;
                printf("pair %d %d delay_ms %g jitter_ms %g loss %g bucket %d rate_mbit %g\n", i, j,
                       pr->delay_s * 1e3, pr->jitter_s * 1e3, pr->loss, pr->bucket,
                       pr->bucket >= 0 ? p->bucket_bps[pr->bucket] * 1e-6 : 0);
            }
        hs__wan_profile_free(p);
        return 0;
    }
    emu e;
    int rc = 1, sfd = -1;
    char err[256];
    if (emu_init(&e, p) < 0) {
        fprintf(stderr, "hearsay-wanemu: out of memory\n");
        goto out;
    }
    /* Release times are honoured to the microsecond, not the default 50 us of timer slack. */
    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP);
    sigprocmask(SIG_BLOCK, &set, NULL);
    if ((sfd = signalfd(-1, &set, SFD_CLOEXEC)) < 0) {
        perror("hearsay-wanemu: signalfd");
        goto out;
    }
    char *list = strdup(netns), *save = NULL, *tok = strtok_r(list, ",", &save);
    int i = 0;
    for (; tok && i < p->n; tok = strtok_r(NULL, ",", &save), i++)
        if ((e.fd[i] = hs__wan_tun_open(tok, ifname, SUBNET + (uint32_t)i + 1, p->mtu, err,
                                        sizeof(err))) < 0) {
            fprintf(stderr, "hearsay-wanemu: namespace %s: %s\n", tok, err);
            free(list);
            goto out;
        }
    free(list);
    if (i != p->n || tok) {
        fprintf(stderr, "hearsay-wanemu: --netns names %s namespaces; profile %s has %d peers\n",
                tok ? "more" : "fewer", profile, p->n);
        goto out;
    }
    printf("ready\n");
    fflush(stdout);
    if (loop(&e, sfd) < 0) {
        perror("hearsay-wanemu: event loop");
        goto out;
    }
    rc = 0;
out:
    if (stats && e.ps) write_stats(&e, stats);
    if (sfd >= 0) close(sfd);
    emu_free(&e);
    hs__wan_profile_free(p);
    return rc;
}
