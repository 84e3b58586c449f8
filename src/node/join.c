/* How a node reaches its job and stays in it: the rendezvous file, waiting for the members,
 * waiting while cut off from a majority, joining again when removed. Every wait polls the
 * node's stop flag, which a signal handler may set. Called from the node's thread only. */
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <math.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/error_internal.h"
#include "core/log.h"
#include "node/node_internal.h"

double hs__node_now(void) { return hs__mono_s(); }

static void sleep_s(atomic_int *stop, double s) {
    if (s <= 0) return;
    struct timespec ts = {(time_t)s, (long)((s - floor(s)) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR && !*stop) {
    }
}

/* How long a refusal for good from a rendezvous address older than this peer waits for the
 * file to change before it is believed. */
#define STALE_REFUSAL_S 2.0

/* Refusals that no retry through another member can change (wrong secret, model, job). */
int hs__node_refusal_final(int err) {
    return err == HS_EMISMATCH || err == HS_EAUTH || err == HS_ETLS || err == HS_EINVAL;
}

/* The address others dial: the advertised or listen host (the host name when listening on a
 * wildcard), with the port actually bound. */
void hs__node_own_address(const hs_net_config *nc, hs_net *net, char *out, size_t cap) {
    const char *src = nc->advertise ? nc->advertise : nc->listen;
    char host[256];
    const char *colon = strrchr(src, ':');
    size_t hl = colon ? (size_t)(colon - src) : strlen(src);
    if (hl >= sizeof(host)) hl = sizeof(host) - 1;
    memcpy(host, src, hl);
    host[hl] = '\0';
    if (!strcmp(host, "0.0.0.0") || !strcmp(host, "[::]") || !strcmp(host, "::") || !host[0]) {
        /* Listening everywhere: others dial this host's first non-loopback IPv4 address (its
         * name may resolve to 127.0.1.1, as on Debian, which other nodes cannot dial). */
        struct ifaddrs *ifs = NULL;
        snprintf(host, sizeof(host), "127.0.0.1");
        if (getifaddrs(&ifs) == 0) {
            for (struct ifaddrs *i = ifs; i; i = i->ifa_next) {
                if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
                const struct sockaddr_in *sin = (const struct sockaddr_in *)i->ifa_addr;
                if ((ntohl(sin->sin_addr.s_addr) >> 24) == 127) continue;
                inet_ntop(AF_INET, &sin->sin_addr, host, sizeof(host));
                break;
            }
            freeifaddrs(ifs);
        }
    }
    int port = nc->advertise && colon ? atoi(colon + 1) : hs_net_listen_port(net);
    snprintf(out, cap, "%s:%d", host, port);
}

int hs__node_write_rendezvous(const char *path, const char *run_id, const char *addr) {
    char tmp[4096];
    if (snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, (int)getpid()) >= (int)sizeof(tmp))
        return hs__err(HS_EINVAL, "--rendezvous %s: path too long", path);
    FILE *f = fopen(tmp, "w");
    if (!f || fprintf(f, "%s %s\n", run_id, addr) < 0 || fclose(f) != 0) {
        if (f) fclose(f);
        unlink(tmp);
        return hs__err(HS_EIO, "--rendezvous %s: %s", path, strerror(errno));
    }
    /* Readers see the whole line or nothing. */
    if (rename(tmp, path) != 0) {
        unlink(tmp);
        return hs__err(HS_EIO, "--rendezvous %s: %s", path, strerror(errno));
    }
    return 0;
}

/* Waits for the rendezvous file of this run. A file of another run id is ignored, and so is
 * one older than two minutes before this peer started (a requeued job keeps its id). *mtime
 * says when the address was written. */
static int read_rendezvous(const char *path, const char *run_id, int timeout_ms, time_t oldest,
                           char *addr, size_t cap, struct timespec *mtime,
                           atomic_int *stop) {
    double end = hs__node_now() + timeout_ms / 1000.0;
    while (!*stop) {
        struct stat sb;
        FILE *f = stat(path, &sb) == 0 && sb.st_mtime >= oldest ? fopen(path, "r") : NULL;
        if (f) {
            char id[256], a[300];
            int n = fscanf(f, "%255s %299s", id, a);
            fclose(f);
            if (n == 2 && !strcmp(id, run_id)) {
                snprintf(addr, cap, "%s", a);
                *mtime = sb.st_mtim;
                return 0;
            }
        }
        if (hs__node_now() > end) break;
        sleep_s(stop, 0.1);
    }
    if (*stop)
        return hs__err(HS_EINTR, "--rendezvous %s: stopped by a signal while waiting for run %s",
                       path, run_id);
    return hs__err(HS_ETIMEDOUT, "--rendezvous %s: no address of run %s within %d ms", path,
                   run_id, timeout_ms);
}

/* Joins through the address in the rendezvous file. A file left by an earlier job of the same
 * id (its address dead, or taken by someone else) must not fail this one: while an address does
 * not let us in, the file is read again and the address tried again (it changes once this
 * job's first peer writes it) until the deadline. Only an address written after this peer
 * started, which is this job's, is believed when it refuses for good. */
int hs__node_join_rendezvous(const char *path, const char *run_id, hs_net_config *nc,
                             int timeout_ms, char *addr, size_t cap, hs_net **net,
                             hs_net_welcome *w, atomic_int *stop) {
    struct timespec started;
    clock_gettime(CLOCK_REALTIME, &started);
    double end = hs__node_now() + timeout_ms / 1000.0;
    int err = HS_ETIMEDOUT;
    for (int tries = 0;; tries++) {
        int left = (int)((end - hs__node_now()) * 1000);
        struct timespec mtime = {0, 0};
        if (left <= 0 && tries > 0) break;
        if ((err = read_rendezvous(path, run_id, left > 0 ? left : 0, started.tv_sec - 120, addr,
                                   cap, &mtime, stop)) < 0)
            return err;
        int fresh = mtime.tv_sec > started.tv_sec ||
                    (mtime.tv_sec == started.tv_sec && mtime.tv_nsec >= started.tv_nsec);
        hs_net_config nk = *nc;
        nk.bootstrap = addr;
        left = (int)((end - hs__node_now()) * 1000);
        /* A stale address is given a short try: the right one may appear meanwhile. */
        if (!fresh && left > 2000) left = 2000;
        nk.join_timeout_ms = left > 100 ? left : 100;
        if ((err = hs_net_start(net, &nk, w)) == 0) return 0;
        if (*stop)
            return hs__err(HS_EINTR, "--rendezvous %s: stopped by a signal while joining %s",
                           path, addr);
        if (fresh && hs__node_refusal_final(err)) return err;
        HS_LOGW("--rendezvous %s: %s did not let this peer in (%s): %s", path, addr,
                fresh ? "written by this job" : "written before this peer started",
                hs_error_message());
        hs_net_welcome_clear(w);
        if (hs__node_refusal_final(err)) {
            /* A refusal for good (a wrong secret) from an address older than this peer: it is
             * this job's unless the file changes within a moment. Not asked again meanwhile,
             * which would only repeat the refusal and its log lines. */
            char msg[1024];
            snprintf(msg, sizeof(msg), "%s", hs_error_message());
            struct timespec now_m = mtime;
            double until = hs__node_now() + STALE_REFUSAL_S;
            while (!*stop && hs__node_now() < until && now_m.tv_sec == mtime.tv_sec &&
                   now_m.tv_nsec == mtime.tv_nsec) {
                sleep_s(stop, 0.1);
                if (read_rendezvous(path, run_id, 0, started.tv_sec - 120, addr, cap, &now_m,
                                    stop) < 0)
                    now_m = mtime;
            }
            if (now_m.tv_sec == mtime.tv_sec && now_m.tv_nsec == mtime.tv_nsec)
                return hs__err(err, "%s", msg);
            continue;
        }
        sleep_s(stop, 0.2);
    }
    return err;
}

/* Peers of a rendezvous join in rank order, so that peer ids, which give the places in the
 * topology, follow --rank rather than the race of simultaneous joins (ring neighbours, and so
 * the results of one seed, changed from launch to launch). Rank r waits for PATH.joined-(r-1),
 * which rank r-1 writes once it is a member, naming this job's address (a marker of an
 * earlier job names another). The price is one join's latency per rank. */
static void marker(const char *path, int rank, char *out, size_t cap) {
    snprintf(out, cap, "%s.joined-%d", path, rank);
}

int hs__node_rendezvous_turn(const char *path, const char *run_id, int rank, int timeout_ms,
                             atomic_int *stop) {
    if (rank <= 1) return 0; /* rank 1 follows rank 0, whose mark is the rendezvous itself */
    char m[4200], want[600], got[600];
    marker(path, rank - 1, m, sizeof(m));
    double end = hs__node_now() + timeout_ms / 1000.0;
    while (!*stop) {
        FILE *f = fopen(path, "r");
        char id[256], a[300];
        int n = f ? fscanf(f, "%255s %299s", id, a) : 0;
        if (f) fclose(f);
        snprintf(want, sizeof(want), "%s %s", n == 2 ? id : "", n == 2 ? a : "");
        got[0] = '\0';
        if ((f = fopen(m, "r"))) {
            if (!fgets(got, sizeof(got), f)) got[0] = '\0';
            fclose(f);
            got[strcspn(got, "\n")] = '\0';
        }
        if (n == 2 && !strcmp(id, run_id) && !strcmp(got, want)) return 0;
        if (hs__node_now() > end) {
            HS_LOGW("--rendezvous %s: rank %d is not a member after %d ms: joining anyway (places "
                    "in the topology follow the join order)", path, rank - 1, timeout_ms);
            return 0;
        }
        sleep_s(stop, 0.02);
    }
    return hs__err(HS_EINTR, "--rendezvous %s: stopped by a signal while waiting for rank %d",
                   path, rank - 1);
}

void hs__node_rendezvous_mark(const char *path, const char *run_id, int rank, const char *addr) {
    char m[4200];
    marker(path, rank, m, sizeof(m));
    /* The same atomic write as the rendezvous: a reader sees the whole line or nothing. */
    if (hs__node_write_rendezvous(m, run_id, addr) < 0) HS_LOGW("%s", hs_error_message());
}

/* hs_net_wait_members in slices, so that SIGINT/SIGTERM end the wait within a fraction of a
 * second (a signal handler cannot wake the condition variable it sleeps on). */
int hs__node_wait_members(hs_net *net, int n, int timeout_ms, atomic_int *stop) {
    double end = hs__node_now() + timeout_ms / 1000.0;
    for (;;) {
        if (*stop) {
            hs_net_stats ns;
            hs_net_stats_get(net, &ns);
            return hs__err(HS_EINTR, "stopped by a signal while %d of %d members were there",
                           ns.n_members, n);
        }
        double left = end - hs__node_now();
        int slice = left > 0.2 ? 200 : left > 0 ? (int)(left * 1000) + 1 : 0;
        double t = hs__node_now();
        int err = hs_net_wait_members(net, n, slice);
        if (err != HS_ETIMEDOUT) return err;
        /* Back at once: the peer is stopping or was removed, not a slice that ran out. */
        if (hs__node_now() - t < slice / 2000.0 || hs__node_now() >= end) {
            hs_net_stats ns;
            hs_net_stats_get(net, &ns);
            return hs__err(HS_ETIMEDOUT, "%d members after %d ms, waiting for %d", ns.n_members,
                           timeout_ms, n);
        }
    }
}

int hs__node_start_round(hs_net *net, uint64_t *r) {
    uint64_t eff = 0;
    hs_net_member *mem;
    int nm, err = hs_net_members(net, &mem, &nm, NULL, &eff);
    if (err < 0) return err;
    free(mem);
    if (eff > *r) *r = eff;
    return 0;
}

/* Runs no round while this peer is cut off from a majority of the job, which would make it (or
 * its minority) a second job: 0 once in touch again (or on a stop request); HS_ECANCELED once the
 * job removed it; HS_ECONNRESET once it woke from a stop to find the job gone; HS_ETIMEDOUT after
 * bound_ms cut off. */
int hs__node_await_job(hs_net *net, int bound_ms, atomic_int *stop) {
    int in = hs_net_in_job(net, 1000); /* a new connection to the sequencer learns it at once */
    if (in != 0) return in < 0 ? in : 0;
    HS_LOGW("cut off from the job: not training; trying to reach it for up to %d ms", bound_ms);
    double end = hs__node_now() + bound_ms / 1000.0;
    while (!*stop) {
        if ((in = hs_net_in_job(net, 200)) < 0) return in;
        if (in) {
            HS_LOGI("back in the job: training again");
            return 0;
        }
        if (hs__node_now() > end)
            return hs__err(HS_ETIMEDOUT,
                           "cut off from the job (no majority of its members in reach) for %d ms",
                           bound_ms);
    }
    return 0;
}

/* The job removed this peer (it was cut off long enough to be declared dead, and went on without
 * it): join again as a new peer through the members it knew, each tried briefly, for up to
 * bound_ms. On success *netp is the new runtime and w its welcome. */
int hs__node_rejoin(hs_net **netp, const hs_net_config *nc, hs_net_welcome *w, int bound_ms,
                    atomic_int *stop) {
    hs_net_member *mem = NULL;
    int nm = 0;
    uint32_t self = hs_net_self(*netp);
    char why[512];
    hs_net_in_job(*netp, 0); /* its message says who removed this peer */
    snprintf(why, sizeof(why), "%s", hs_error_message());
    int err = hs_net_members(*netp, &mem, &nm, NULL, NULL);
    hs_net_free(*netp); /* its listener goes: the new runtime listens on the same address */
    *netp = NULL;
    hs_net_welcome_clear(w);
    if (err < 0) return err;
    hs_net_config nk = *nc;
    nk.join_timeout_ms = bound_ms < 3000 ? bound_ms : 3000;
    double end = hs__node_now() + bound_ms / 1000.0;
    err = 0;
    while (!*netp && !*stop && hs__node_now() < end && !hs__node_refusal_final(err)) {
        for (int i = 0; i < nm && !*netp && !hs__node_refusal_final(err); i++) {
            if (mem[i].id == self) continue;
            HS_LOGI("rejoining the job through peer %u (%s)", mem[i].id, mem[i].addr);
            nk.bootstrap = mem[i].addr;
            err = hs_net_start(netp, &nk, w);
        }
        if (!*netp) sleep_s(stop, 0.5);
    }
    free(mem);
    if (*netp) return 0;
    return hs__err(err < 0 && hs__node_refusal_final(err) ? err : HS_ECANCELED,
                   "%s; it could not join the job again within %d ms (last: %s)", why, bound_ms,
                   err < 0 ? hs_error_message() : "no member it knew");
}

/* Expands "{id}" in a path to the peer's id, so every peer of a job can be given the same
 * command line (srun, mpirun) and still write its own files. */
int hs__node_expand_id(const char *in, uint32_t id, char *out, size_t cap) {
    const char *at = strstr(in, "{id}");
    int len = at ? snprintf(out, cap, "%.*s%u%s", (int)(at - in), in, id, at + 4)
                 : snprintf(out, cap, "%s", in);
    if (len < 0 || (size_t)len >= cap) return hs__err(HS_EINVAL, "path too long: %s", in);
    return 0;
}

int hs__node_await_unheld(hs_net *net, hs_buf *b, int holders, int timeout_ms,
                          atomic_int *stop) {
    double end = hs__node_now() + 1e-3 * timeout_ms;
    while (b && (__atomic_load_n(&b->refs, __ATOMIC_ACQUIRE) > holders ||
                 hs_net_welcomes_pending(net) > 0) && !*stop) {
        if (hs__node_now() >= end) return 0;
        sleep_s(stop, 0.01);
    }
    return 1;
}

void hs__node_set_tag(uint32_t self) {
    char tag[32];
    snprintf(tag, sizeof(tag), "peer %u", self);
    hs__log_set_tag(tag);
}
