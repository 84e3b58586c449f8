/* One networked peer: glues the network runtime (its own loop thread) to a trainer on the
 * calling thread. Start or join, adopt the welcome snapshot, run rounds, log, publish snapshots
 * for joiners, checkpoint, leave with BYE. The training thread never touches a socket; the loop
 * thread never computes. */
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/error_internal.h"
#include "core/log.h"
#include "hearsay/checkpoint.h"
#include "hearsay/metrics.h"
#include "hearsay/model.h"
#include "hearsay/peer.h"

static volatile sig_atomic_t stop_requested, checkpoint_requested;

void hs_peer_request_stop(int checkpoint) {
    if (checkpoint) checkpoint_requested = 1;
    stop_requested = 1;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void sleep_s(double s) {
    if (s <= 0) return;
    struct timespec ts = {(time_t)s, (long)((s - floor(s)) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR && !stop_requested) {
    }
}

/* ---------------------------------------------------------------- checkpoints
 * hearsay/checkpoint.h holds the file format; a peer's checkpoint is its trainer state, named
 * by its shard (a resumed peer knows its rank, not the id it had), with the members it knew. */

/* Refusals that no retry through another member can change (wrong secret, model, job). */
static int refusal_is_final(int err) {
    return err == HS_EMISMATCH || err == HS_EAUTH || err == HS_ETLS || err == HS_EINVAL;
}

static int write_checkpoint(const char *dir, int rank, uint64_t round, uint64_t end_round,
                            uint32_t id, const char *sig, hs_net *net, hs_trainer *t) {
    hs_buf *state = NULL;
    hs_net_member *mem = NULL;
    uint32_t *ids = NULL;
    const char **addrs = NULL;
    int nm = 0, err;
    if ((err = hs_buf_new(&state, 0)) < 0) return err;
    if ((err = hs_trainer_save(t, state)) < 0) goto out;
    if (net && hs_net_members(net, &mem, &nm, NULL, NULL) < 0) nm = 0;
    if (nm && (!(ids = calloc((size_t)nm, sizeof(*ids))) || !(addrs = calloc((size_t)nm, sizeof(*addrs))))) {
        err = hs__err(HS_ENOMEM, "checkpoint: out of memory");
        goto out;
    }
    for (int i = 0; i < nm; i++) {
        ids[i] = mem[i].id;
        addrs[i] = mem[i].addr;
    }
    hs_checkpoint_info info = {round, end_round, rank, id, sig, nm, ids, addrs};
    size_t bytes = 0;
    if ((err = hs_checkpoint_write(dir, &info, state->data, state->len, &bytes)) == 0)
        HS_LOGI("checkpoint of round %llu in %s (%zu bytes)", (unsigned long long)round, dir, bytes);
out:
    free(ids);
    free(addrs);
    free(mem);
    hs_buf_unref(state);
    return err;
}

/* ---------------------------------------------------------------- rendezvous */

/* The address others dial: the advertised or listen host (the host name when listening on a
 * wildcard), with the port actually bound. */
static void own_address(const hs_net_config *nc, hs_net *net, char *out, size_t cap) {
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

static int write_rendezvous(const char *path, const char *run_id, const char *addr) {
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
                           char *addr, size_t cap, struct timespec *mtime) {
    double end = now_s() + timeout_ms / 1000.0;
    while (!stop_requested) {
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
        if (now_s() > end) break;
        sleep_s(0.1);
    }
    if (stop_requested)
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
static int join_rendezvous(const char *path, const char *run_id, hs_net_config *nc, int timeout_ms,
                           char *addr, size_t cap, hs_net **net, hs_net_welcome *w) {
    struct timespec started;
    clock_gettime(CLOCK_REALTIME, &started);
    double end = now_s() + timeout_ms / 1000.0;
    int err = HS_ETIMEDOUT;
    for (int tries = 0;; tries++) {
        int left = (int)((end - now_s()) * 1000);
        struct timespec mtime = {0, 0};
        if (left <= 0 && tries > 0) break;
        if ((err = read_rendezvous(path, run_id, left > 0 ? left : 0, started.tv_sec - 120, addr,
                                   cap, &mtime)) < 0)
            return err;
        int fresh = mtime.tv_sec > started.tv_sec ||
                    (mtime.tv_sec == started.tv_sec && mtime.tv_nsec >= started.tv_nsec);
        hs_net_config nk = *nc;
        nk.bootstrap = addr;
        left = (int)((end - now_s()) * 1000);
        /* A stale address is given a short try: the right one may appear meanwhile. */
        if (!fresh && left > 2000) left = 2000;
        nk.join_timeout_ms = left > 100 ? left : 100;
        if ((err = hs_net_start(net, &nk, w)) == 0) return 0;
        if (stop_requested)
            return hs__err(HS_EINTR, "--rendezvous %s: stopped by a signal while joining %s",
                           path, addr);
        if (fresh && refusal_is_final(err)) return err;
        HS_LOGW("--rendezvous %s: %s did not let this peer in (%s): %s", path, addr,
                fresh ? "written by this job" : "written before this peer started",
                hs_error_message());
        hs_net_welcome_clear(w);
        sleep_s(0.2);
    }
    return err;
}

/* ---------------------------------------------------------------- the run */

/* Expands "{id}" in a path to the peer's id, so every peer of a job can be given the same
 * command line (srun, mpirun) and still write its own files. */
static int expand_id(const char *in, uint32_t id, char *out, size_t cap) {
    const char *at = strstr(in, "{id}");
    int n = at ? snprintf(out, cap, "%.*s%u%s", (int)(at - in), in, id, at + 4)
               : snprintf(out, cap, "%s", in);
    if (n < 0 || (size_t)n >= cap) return hs__err(HS_EINVAL, "path too long: %s", in);
    return 0;
}

/* Mean square of the model (z = x / w for SGP, the space its consensus estimate is measured
 * in): the scale the guard compares that estimate with; non-finite when a parameter is. */
static double mean_square(const float *x, size_t d) {
    double s = 0;
    for (size_t k = 0; k < d; k++) s += (double)x[k] * x[k];
    return s / (double)(d ? d : 1);
}

/* What this peer is at after `round` rounds: the one source of its metrics line and of its
 * progress line, so that the two agree (docs/METRICS.md). */
static void peer_record(hs_metrics_rec *m, uint32_t self, uint64_t round, hs_trainer *t,
                        hs_net *net, double time) {
    hs_net_stats ns;
    hs_net_stats_get(net, &ns);
    hs_metrics_init(m);
    hs_metrics_set(m, HS_MF_PEER, self);
    hs_metrics_set(m, HS_MF_ROUND, (double)round);
    /* Passes over this peer's shard, counting steps adopted from a snapshot. */
    hs_metrics_set(m, HS_MF_EPOCH,
                   (double)hs_trainer_steps(t) / (double)hs_trainer_steps_per_epoch(t));
    hs_metrics_set(m, HS_MF_TIME, time);
    hs_metrics_from_algo(m, hs_trainer_algo(t));
    hs_metrics_from_net(m, &ns);
}

/* What a joiner must know to end with the job: the end round (0 while the job waits for its
 * members and has not decided it), and the rule the first peers follow until then: how many
 * members they wait for and how many rounds they train from the round at which those are in. */
typedef struct job_terms {
    uint64_t end;
    int64_t rounds, wait;
} job_terms;
#define JOB_TERMS_BYTES 24

static int publish_snapshot(hs_net *net, hs_trainer *t, uint64_t round, const job_terms *jt) {
    hs_buf *b;
    int err = hs_buf_new(&b, sizeof(float) * hs_trainer_dim(t) + 64);
    if (err < 0) return err;
    if ((err = hs_buf_append(b, &jt->end, 8)) == 0 &&
        (err = hs_buf_append(b, &jt->rounds, 8)) == 0 &&
        (err = hs_buf_append(b, &jt->wait, 8)) == 0 && (err = hs_trainer_snapshot(t, b)) == 0)
        err = hs_net_publish_snapshot(net, round, b);
    hs_buf_unref(b);
    return err;
}

/* Peers that do not split the data (no --world) each train on all of it: the usual mistake
 * when peers are started by hand, and nothing else would ever show it. Said once. */
static void warn_unsharded(hs_net *net, int world, int *warned) {
    if (*warned || world > 1) return;
    hs_net_stats ns;
    hs_net_stats_get(net, &ns);
    if (ns.n_members < 2) return;
    *warned = 1;
    HS_LOGW("the job has %d members but this peer has --world 1: it trains on the whole "
            "dataset, as does every member started without --world; give every peer --world N "
            "(and --rank R) to split the data into N shards",
            ns.n_members);
}

/* hs_net_wait_members in slices, so that SIGINT/SIGTERM end the wait within a fraction of a
 * second (a signal handler cannot wake the condition variable it sleeps on). */
static int wait_members(hs_net *net, int n, int timeout_ms) {
    double end = now_s() + timeout_ms / 1000.0;
    for (;;) {
        if (stop_requested) {
            hs_net_stats ns;
            hs_net_stats_get(net, &ns);
            return hs__err(HS_EINTR, "stopped by a signal while %d of %d members were there",
                           ns.n_members, n);
        }
        double left = end - now_s();
        int slice = left > 0.2 ? 200 : left > 0 ? (int)(left * 1000) + 1 : 0;
        double t = now_s();
        int err = hs_net_wait_members(net, n, slice);
        if (err != HS_ETIMEDOUT) return err;
        /* Back at once: the peer is stopping or was removed, not a slice that ran out. */
        if (now_s() - t < slice / 2000.0 || now_s() >= end) {
            hs_net_stats ns;
            hs_net_stats_get(net, &ns);
            return hs__err(HS_ETIMEDOUT, "%d members after %d ms, waiting for %d", ns.n_members,
                           timeout_ms, n);
        }
    }
}

/* Reads the job's terms at the head of a welcome snapshot, validated. */
static int read_job_terms(const hs_net_welcome *w, job_terms *jt) {
    if (w->snapshot->len < JOB_TERMS_BYTES)
        return hs__err(HS_EFORMAT, "welcome snapshot: %zu bytes", w->snapshot->len);
    memcpy(&jt->end, w->snapshot->data, 8);
    memcpy(&jt->rounds, w->snapshot->data + 8, 8);
    memcpy(&jt->wait, w->snapshot->data + 16, 8);
    if (jt->rounds < 1 || jt->wait < 0 || jt->wait > (1 << 20))
        return hs__err(HS_EFORMAT, "welcome snapshot: %lld rounds, waiting for %lld peers",
                       (long long)jt->rounds, (long long)jt->wait);
    return 0;
}

/* Adopts the job's state from a welcome snapshot (whose terms were read), as every joiner does:
 * the model, the optimizer and the step; its neighbours send it full replicas (same_start off). */
static int adopt_welcome(hs_trainer *t, const hs_net_welcome *w) {
    int err = hs_trainer_adopt(t, w->snapshot->data + JOB_TERMS_BYTES,
                               w->snapshot->len - JOB_TERMS_BYTES);
    if (err < 0) return hs__err_prefix(err, "welcome snapshot");
    HS_LOGI("joined at round %llu with the model of round %llu (local step %ld)",
            (unsigned long long)w->join_round, (unsigned long long)w->snapshot_round,
            hs_trainer_steps(t));
    return 0;
}

/* Runs no round while this peer is cut off from a majority of the job, which would make it (or
 * its minority) a second job: 0 once in touch again (or on a stop request); HS_ECANCELED once the
 * job removed it; HS_ETIMEDOUT after bound_ms cut off. */
static int await_job(hs_net *net, int bound_ms) {
    int in = hs_net_in_job(net, 1000); /* a new connection to the sequencer learns it at once */
    if (in != 0) return in < 0 ? in : 0;
    HS_LOGW("cut off from the job: not training; trying to reach it for up to %d ms", bound_ms);
    double end = now_s() + bound_ms / 1000.0;
    while (!stop_requested) {
        if ((in = hs_net_in_job(net, 200)) < 0) return in;
        if (in) {
            HS_LOGI("back in the job: training again");
            return 0;
        }
        if (now_s() > end)
            return hs__err(HS_ETIMEDOUT,
                           "cut off from the job (no majority of its members in reach) for %d ms",
                           bound_ms);
    }
    return 0;
}

/* The job removed this peer (it was cut off long enough to be declared dead, and went on without
 * it): join again as a new peer through the members it knew, each tried briefly, for up to
 * bound_ms. On success *netp is the new runtime and w its welcome. */
static int rejoin(hs_net **netp, const hs_net_config *nc, hs_net_welcome *w, int bound_ms) {
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
    double end = now_s() + bound_ms / 1000.0;
    err = 0;
    while (!*netp && !stop_requested && now_s() < end && !refusal_is_final(err)) {
        for (int i = 0; i < nm && !*netp && !refusal_is_final(err); i++) {
            if (mem[i].id == self) continue;
            HS_LOGI("rejoining the job through peer %u (%s)", mem[i].id, mem[i].addr);
            nk.bootstrap = mem[i].addr;
            err = hs_net_start(netp, &nk, w);
        }
        if (!*netp) sleep_s(0.5);
    }
    free(mem);
    if (*netp) return 0;
    return hs__err(err < 0 && refusal_is_final(err) ? err : HS_ECANCELED,
                   "%s; it could not join the job again within %d ms (last: %s)", why, bound_ms,
                   err < 0 ? hs_error_message() : "no member it knew");
}

int hs_peer_run(const hs_peer_cfg *cfg, hs_backend *be, const hs_dataset *train,
                const hs_dataset *test, hs_peer_result *res) {
    memset(res, 0, sizeof(*res));
    stop_requested = checkpoint_requested = 0;
    hs_net *net = NULL;
    hs_net_welcome w;
    memset(&w, 0, sizeof(w));
    hs_trainer *t = NULL;
    hs_dataset *shard = NULL;
    hs_metrics_file *metrics = NULL;
    hs_checkpoint ck = {0};
    hs_guard *guard = NULL;
    int err, have_ck = 0, diverged = 0, told = 0, warned_unsharded = 0;
    char sig[128];
    hs_model_spec_format(&cfg->trainer.model, sig, sizeof(sig));
    double t0 = now_s();

    if (cfg->resume) {
        if (!cfg->checkpoint_dir) return hs__err(HS_EINVAL, "--resume needs --checkpoint-dir");
        /* Files are named by shard: a resumed peer knows its rank, not the id it had. */
        if ((err = hs_checkpoint_newest(cfg->checkpoint_dir, cfg->rank, sig, &ck)) < 0) return err;
        have_ck = 1;
    }
    hs_net_config nc = cfg->net;
    nc.model_sig = sig;
    nc.n_params = hs_model_spec_nparams(&cfg->trainer.model);
    nc.algo = hs_algo_kind_name(cfg->algo.kind);
    nc.codec = cfg->algo.compress;
    const char *run_id = nc.run_id ? nc.run_id : "hearsay";
    char rv_addr[320];
    int join_ms = nc.join_timeout_ms > 0 ? nc.join_timeout_ms : 30000;
    /* The first peer of a job: no address to join, and (with a rank) rank 0. A resumed peer is
     * never first while a member it knew still answers: it rejoins the running job. */
    int first = !nc.bootstrap && cfg->rank <= 0;
    if (cfg->rendezvous && !nc.bootstrap && (!first || have_ck)) {
        err = join_rendezvous(cfg->rendezvous, run_id, &nc, first ? 2000 : join_ms, rv_addr,
                              sizeof(rv_addr), &net, &w);
        if (err == 0) {
            nc.bootstrap = rv_addr;
            first = 0;
        } else if (!first || err == HS_EINTR) {
            goto out;
        }
    }
    err = HS_ENOENT;
    if (net) err = 0;
    else if (!have_ck || nc.bootstrap) err = hs_net_start(&net, &nc, &w);
    int alone = 0; /* resumed with no member answering: the job goes on from the checkpoint */
    if (have_ck && !net) {
        /* Resuming: rejoin through the members the checkpoint knew, each tried briefly; not
         * through this peer's own old entry (it is not a member until it has rejoined). */
        hs_net_config nk = nc;
        nk.join_timeout_ms = join_ms < 3000 ? join_ms : 3000;
        for (int i = 0; i < ck.n_members && !net && !refusal_is_final(err); i++) {
            if (ck.ids[i] == ck.id) continue;
            HS_LOGI("rejoining through %s, a member in the checkpoint", ck.addrs[i]);
            nk.bootstrap = ck.addrs[i];
            if ((err = hs_net_start(&net, &nk, &w)) == 0) nc.bootstrap = nk.bootstrap;
        }
        if (!net && first && !refusal_is_final(err)) {
            HS_LOGW("no member of the checkpoint's job answers: going on from its round %llu",
                    (unsigned long long)ck.round);
            nc.bootstrap = NULL;
            err = hs_net_start(&net, &nc, &w);
            alone = 1;
        } else {
            first = 0;
        }
    }
    if (err < 0) goto out;
    if (cfg->rendezvous && first) {
        char addr[320];
        own_address(&nc, net, addr, sizeof(addr));
        if ((err = write_rendezvous(cfg->rendezvous, run_id, addr)) < 0) goto out;
        HS_LOGI("wrote %s to %s", addr, cfg->rendezvous);
    }
    uint32_t self = hs_net_self(net);
    res->id = self;
    {
        char tag[32];
        snprintf(tag, sizeof(tag), "peer %u", self);
        hs_log_set_tag(tag);
    }
    int world = cfg->world > 0 ? cfg->world : 1;
    /* A resumed peer keeps the shard it trained on (named in its checkpoint). */
    int rank = cfg->rank >= 0 ? cfg->rank % world
               : have_ck      ? ck.rank % world
                              : (int)(self % (uint32_t)world);
    /* A writer killed mid-write left its temporary behind: it is of no use to anyone. */
    if (cfg->checkpoint_dir) hs_checkpoint_clean_tmp(cfg->checkpoint_dir, rank);
    uint32_t *idx;
    size_t cnt;
    if ((err = hs_shard(train, &cfg->partition, rank, world, cfg->trainer.seed, &idx, &cnt)) < 0)
        goto out;
    err = hs_dataset_subset(&shard, train, idx, cnt);
    free(idx);
    if (err < 0) goto out;
    hs_trainer_cfg tc = cfg->trainer;
    tc.stream = (uint32_t)rank;
    /* Snapshots are [job_terms][trainer snapshot]. This peer's own terms hold until it learns
     * the job's. */
    job_terms jt = {0, cfg->rounds, cfg->wait_peers};
    if (!have_ck && w.snapshot) {
        if ((err = read_job_terms(&w, &jt)) < 0) goto out;
        if (jt.rounds != cfg->rounds)
            HS_LOGW("--rounds %ld: the job trains %lld rounds (the count of the peer that started "
                    "it); this peer follows the job's count and ends with it",
                    cfg->rounds, (long long)jt.rounds);
    }
    /* The learning-rate schedule spans the job's rounds, as on the peer that started it. */
    if (jt.rounds != cfg->rounds && cfg->rounds > 0)
        tc.optim.total_steps = tc.optim.total_steps / cfg->rounds * jt.rounds;
    /* Replicas may start equal to the common initialisation only for a peer that begins with
     * the job, before anyone trained; a joiner of a running job or a resumed peer makes its
     * neighbours send it full replicas, and sends its own. */
    hs_algo_cfg acfg = cfg->algo;
    acfg.same_start = 0;
    if ((err = hs_trainer_new(&t, be, &tc, shard, &acfg, self)) < 0) goto out;
    if (have_ck) {
        if ((err = hs_trainer_load(t, ck.state, ck.state_len, 0)) < 0) goto out;
        jt.end = ck.end_round;
        HS_LOGI("resumed model and optimizer at local step %ld", hs_trainer_steps(t));
    } else if (w.snapshot && (err = adopt_welcome(t, &w)) < 0) {
        goto out;
    }
    hs_algo_set_same_start(hs_trainer_algo(t), !have_ck && hs_trainer_steps(t) == 0);
    if ((err = hs_guard_new(&guard, &cfg->guard)) < 0) goto out;
    uint64_t r = alone ? ck.round : w.join_round;
    /* The wait: a peer that starts a job or joins one still waiting follows the job's rule
     * (the first peer's count); one joining a running job or resuming waits only when told to
     * explicitly. */
    int fresh = !have_ck && jt.end == 0;
    int n_wait = fresh ? (int)jt.wait : cfg->wait_new_only ? 0 : cfg->wait_peers;
    /* Without a wait the job's end is known now (its first round is this one). */
    if (!jt.end && n_wait <= 1) jt.end = (uint64_t)((long)r + jt.rounds);
    /* Members welcome joiners with the newest snapshot and hold a WELCOME until there is one:
     * publish before waiting for the others, or their joins stall. */
    if ((err = publish_snapshot(net, t, r, &jt)) < 0) goto out;
    if (n_wait > 1) {
        if (!cfg->quiet)
            HS_LOGI("waiting for %d peers before the first round (at most %d ms: --join-timeout)",
                    n_wait, cfg->wait_timeout_ms);
        if ((err = wait_members(net, n_wait, cfg->wait_timeout_ms)) < 0) {
            hs__err_prefix(err, "waiting for %d peers", n_wait);
            if (err == HS_EINTR && hs_net_leave(net, 2000) < 0)
                HS_LOGW("leave: %s", hs_error_message());
            goto out;
        }
        /* Everyone starts at the round from which the full member list is in force, so the
         * first round already mixes with every neighbour. */
        uint64_t eff = 0;
        hs_net_member *mem;
        int nm;
        if ((err = hs_net_members(net, &mem, &nm, NULL, &eff)) < 0) goto out;
        free(mem);
        if (eff > r) r = eff;
        /* Every peer that waited computes the same first round, hence the same end; joiners
         * arriving from now on learn it from the snapshot, published again at once. */
        if (!jt.end) {
            jt.end = (uint64_t)((long)r + jt.rounds);
            if ((err = publish_snapshot(net, t, r, &jt)) < 0) goto out;
        }
    }
    res->first_round = r;
    long end_round = (long)jt.end;
    char path[4096];
    if (cfg->metrics && ((err = expand_id(cfg->metrics, self, path, sizeof(path))) < 0 ||
                         (err = hs_metrics_open(&metrics, path, cfg->resume)) < 0))
        goto out;
    hs_exchange *ex = hs_net_exchange(net);
    if (!cfg->quiet)
        HS_LOGI("starting at round %llu, ending at round %ld: shard %d of %d (%zu examples), %s, %s",
                (unsigned long long)r, end_round, rank, world, shard->n,
                hs_algo_kind_name(cfg->algo.kind), cfg->algo.compress);
    double test_loss = NAN, test_acc = NAN, last_print = now_s(), t_round0 = now_s();
    uint64_t rounds_done = 0;
    for (; (long)r < end_round; r++) {
        if (stop_requested) {
            res->stopped = 1;
            break;
        }
        warn_unsharded(net, world, &warned_unsharded);
        if ((err = await_job(net, join_ms)) < 0) goto job_lost;
        if (hs_net_snapshot_wanted(net) && (err = publish_snapshot(net, t, r, &jt)) < 0)
            goto out;
        hs_round_stats st;
        if ((err = hs_trainer_begin(t, ex, r)) < 0) goto job_lost;
        if ((err = hs_trainer_local(t, r, &st)) < 0) {
            if (err != HS_EDIVERGED) goto out;
            hs_guard_fail(guard, (double)r + 1, hs_error_message());
            diverged = 1;
            break;
        }
        /* A straggler: this peer's compute takes `slowdown` times as long. */
        if (cfg->slowdown > 1.0) sleep_s((cfg->slowdown - 1.0) * st.compute_s);
        if ((err = hs_trainer_push(t, ex, r)) < 0 || (err = hs_trainer_pull(t, ex, r)) < 0)
            goto job_lost;
        rounds_done++;
        int last = (long)r + 1 == end_round;
        int do_eval = cfg->eval_every > 0 && ((long)r + 1) % cfg->eval_every == 0;
        if (do_eval && (err = hs_trainer_evaluate(t, test, &test_loss, &test_acc)) < 0) goto out;
        if (cfg->checkpoint_dir && cfg->checkpoint_every > 0 &&
            ((long)r + 1) % cfg->checkpoint_every == 0 && !last &&
            (err = write_checkpoint(cfg->checkpoint_dir, rank, r + 1, jt.end, self, sig, net,
                                    t)) < 0)
            HS_LOGW("%s", hs_error_message()); /* training goes on without this checkpoint */
        hs_algo_stats as;
        hs_algo_get_stats(hs_trainer_algo(t), &as);
        hs_guard_obs ob = {(double)r + 1, as.disagreement,
                           mean_square(hs_trainer_eval_x(t), hs_trainer_dim(t)), st.loss,
                           do_eval ? test_acc : NAN};
        hs_guard_verdict verdict = hs_guard_observe(guard, &ob);
        if (verdict == HS_GUARD_DIVERGING)
            HS_LOGW("round %llu: the run is diverging: %s; %s; going on (--on-divergence warn)",
                    (unsigned long long)r + 1, hs_guard_reason(guard), hs_guard_advice(guard));
        double now = now_s();
        double rate = rounds_done / (now - t_round0 > 1e-9 ? now - t_round0 : 1e-9);
        hs_metrics_rec rec;
        peer_record(&rec, self, r + 1, t, net, now - t0);
        hs_metrics_set(&rec, HS_MF_LOSS, st.loss);
        hs_metrics_set(&rec, HS_MF_LR, st.lr);
        hs_metrics_set(&rec, HS_MF_ROUNDS_PER_S, rate);
        if (do_eval) {
            hs_metrics_set(&rec, HS_MF_TEST_ACC, test_acc);
            hs_metrics_set(&rec, HS_MF_TEST_LOSS, test_loss);
        }
        if (metrics && (err = hs_metrics_write(metrics, &rec)) < 0) goto out;
        if (!cfg->quiet && (do_eval || now - last_print > 5.0)) {
            char accs[32] = "";
            if (!isnan(test_acc)) snprintf(accs, sizeof(accs), "  test acc %.2f%%", 100 * test_acc);
            HS_LOGI("round %.0f/%ld  loss %.4f%s  consensus %.3g  sent %.3f MB  %.1f rounds/s",
                    hs_metrics_get(&rec, HS_MF_ROUND), end_round, hs_metrics_get(&rec, HS_MF_LOSS),
                    accs, hs_metrics_get(&rec, HS_MF_CONSENSUS),
                    hs_metrics_get(&rec, HS_MF_BYTES_SENT) / 1e6,
                    hs_metrics_get(&rec, HS_MF_ROUNDS_PER_S));
            last_print = now;
        }
        if (verdict == HS_GUARD_DIVERGED) {
            diverged = 1;
            r++; /* the round is complete */
            break;
        }
        /* A neighbour that diverged ran with the same settings: under policy stop the whole
         * job stops, each peer telling its own neighbours in turn. */
        uint32_t who;
        char why[400];
        if (!told && hs_net_nbr_diverged(net, &who, why, sizeof(why))) {
            told = 1;
            if (cfg->guard.policy == HS_GUARD_STOP) {
                char reason[480];
                snprintf(reason, sizeof(reason), "peer %u diverged: %s", who, why);
                hs_guard_fail(guard, (double)r + 1, reason);
                diverged = 1;
                r++;
                break;
            }
            HS_LOGW("peer %u diverged (%s); going on (--on-divergence warn)", who, why);
        }
        continue;
    job_lost:
        /* Removed by the job: the state of this peer is of no use to it; start over as a new
         * member with the job's (a failed exchange for any other reason ends the run). */
        if (hs_net_in_job(net, 0) != HS_ECANCELED) goto out;
        if ((err = rejoin(&net, &nc, &w, join_ms)) < 0) goto out;
        self = hs_net_self(net);
        res->id = self;
        snprintf(path, sizeof(path), "peer %u", self);
        hs_log_set_tag(path);
        hs_trainer_free(t);
        t = NULL;
        if ((err = hs_trainer_new(&t, be, &tc, shard, &acfg, self)) < 0 ||
            (err = read_job_terms(&w, &jt)) < 0 || (err = adopt_welcome(t, &w)) < 0)
            goto out;
        hs_algo_set_same_start(hs_trainer_algo(t), 0);
        if (jt.end) end_round = (long)jt.end;
        ex = hs_net_exchange(net);
        if ((err = publish_snapshot(net, t, w.join_round, &jt)) < 0) goto out;
        r = w.join_round - 1; /* the loop's r++ makes it the join round */
    }
    /* Exit status 0 says this peer was a member of the one job until the end. */
    if (!stop_requested && (err = hs_net_in_job(net, 0)) == HS_ECANCELED) goto out;
    if (diverged) {
        res->diverged = 1;
        res->diverged_round = hs_guard_round(guard);
        snprintf(res->reason, sizeof(res->reason), "%s", hs_guard_reason(guard));
        snprintf(res->advice, sizeof(res->advice), "%s", hs_guard_advice(guard));
        HS_LOGE("diverged at round %.0f: %s; %s", res->diverged_round, res->reason, res->advice);
    }
    if (checkpoint_requested && cfg->checkpoint_dir &&
        (err = write_checkpoint(cfg->checkpoint_dir, rank, r, jt.end, self, sig, net, t)) < 0)
        HS_LOGW("%s", hs_error_message());
    if ((err = hs_trainer_evaluate(t, test, &test_loss, &test_acc)) < 0) goto out;
    hs_metrics_rec rec;
    peer_record(&rec, self, r, t, net, now_s() - t0);
    res->bytes_sent = (uint64_t)hs_metrics_get(&rec, HS_MF_BYTES_SENT);
    res->bytes_recv = (uint64_t)hs_metrics_get(&rec, HS_MF_BYTES_RECV);
    res->last_round = r;
    if (cfg->save && ((err = expand_id(cfg->save, self, path, sizeof(path))) < 0 ||
                      (err = hs_trainer_write_params(t, path)) < 0))
        goto out;
    res->test_acc = test_acc;
    res->test_loss = test_loss;
    res->wall_s = now_s() - t0;
    if (metrics) {
        hs_metrics_set_str(&rec, HS_MF_EVENT,
                           diverged ? "diverged" : res->stopped ? "stopped" : "done");
        if (diverged) {
            hs_metrics_set_str(&rec, HS_MF_REASON, res->reason);
            hs_metrics_set_str(&rec, HS_MF_ADVICE, res->advice);
        }
        hs_metrics_set(&rec, HS_MF_TIME, res->wall_s);
        hs_metrics_set(&rec, HS_MF_TEST_ACC, test_acc);
        hs_metrics_set(&rec, HS_MF_TEST_LOSS, test_loss);
        if (hs_metrics_write(metrics, &rec) < 0) HS_LOGW("%s", hs_error_message());
    }
    /* Graceful leave: the round is complete, neighbours re-weight at once on BYE. */
    if ((diverged ? hs_net_leave_diverged(net, 5000, res->reason) : hs_net_leave(net, 5000)) < 0)
        HS_LOGW("leave: %s", hs_error_message());
    err = 0;
out:
    hs_metrics_close(metrics);
    hs_guard_free(guard);
    hs_trainer_free(t);
    hs_dataset_free(shard);
    hs_net_free(net);
    hs_net_welcome_clear(&w);
    hs_checkpoint_clear(&ck);
    return err;
}
