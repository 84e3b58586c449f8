/* netpeer: a test peer that runs N rounds of plain averaging over the hs_exchange of the peer
 * runtime (x_i <- self_w x_i + sum_j w_ij x_j with the view's weights; a neighbour whose round
 * did not come counts as x_i), and writes JSON lines: start, every new view, misses, done. The
 * multi-process tests and the network benchmark drive it.
 *
 *   netpeer --listen 127.0.0.1:7070 [--bootstrap HOST:PORT] [--insecure | --secret-file F |
 *           --ca F --cert F --key F] [--topo ring] [--rounds 20] [--dim 1024] [--wait-members N]
 *           [--log FILE] ... (see usage())
 *
 * Exit status: 0 done, 1 runtime error (logged as {"event":"error"}), 2 usage, 3 timed out
 * waiting for members, 4 removed from the run. */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "hearsay/error.h"
#include "hearsay/exchange.h"
#include "hearsay/net.h"

static FILE *logf_;
static volatile sig_atomic_t stop_flag;

static void on_signal(int sig) {
    (void)sig;
    stop_flag = 1;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void jlog(const char *fmt, ...) {
    char line[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    fprintf(logf_, "{\"t\":%.6f,%s}\n", now_s(), line);
    fflush(logf_);
}

static void usage(void) {
    fprintf(
        stderr,
        "usage: netpeer --listen ADDR [--bootstrap ADDR] [--advertise ADDR]\n"
        "  security: --insecure | --secret-file F | --ca F --cert F --key F\n"
        "  job: --topo SPEC --seed N --run-id S --algo S --codec S --model-sig S --params N\n"
        "  rounds: --rounds N --dim N --wait-members N --wait-timeout-ms N --recv-timeout-ms N\n"
        "          --round-sleep-ms N --until-members N (stop once the list has N members)\n"
        "  net: --peer-timeout-ms N --handshake-timeout-ms N --join-timeout-ms N\n"
        "       --max-frame N --sock-buf N --emulate S --change-rounds N\n"
        "  other: --log FILE --ping N --no-leave --linger-ms N\n");
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void log_view(uint64_t round, const hs_peer_view *v) {
    char in[4096], out[4096];
    size_t o = 0;
    in[0] = out[0] = '\0';
    for (int i = 0; i < v->n_in && o + 64 < sizeof(in); i++)
        o += (size_t)snprintf(in + o, sizeof(in) - o, "%s[%u,%.17g]", i ? "," : "", v->in[i].id,
                              v->in[i].w);
    o = 0;
    for (int i = 0; i < v->n_out && o + 64 < sizeof(out); i++)
        o += (size_t)snprintf(out + o, sizeof(out) - o, "%s[%u,%.17g]", i ? "," : "", v->out[i].id,
                              v->out[i].w);
    jlog("\"event\":\"view\",\"round\":%llu,\"epoch\":%llu,\"self\":%u,\"n\":%d,\"self_w\":%.17g,"
         "\"in\":[%s],\"out\":[%s]",
         (unsigned long long)round, (unsigned long long)v->epoch, v->self, v->n_members, v->self_w,
         in, out);
}

static void log_members(hs_net *net, const char *event) {
    hs_net_member *m;
    int n;
    uint64_t ver, eff;
    if (hs_net_members(net, &m, &n, &ver, &eff) < 0)
        return;
    char ids[4096];
    size_t o = 0;
    ids[0] = '\0';
    for (int i = 0; i < n && o + 300 < sizeof(ids); i++)
        o += (size_t)snprintf(ids + o, sizeof(ids) - o, "%s[%u,\"%s\"]", i ? "," : "", m[i].id,
                              m[i].addr);
    jlog("\"event\":\"%s\",\"version\":%llu,\"eff_round\":%llu,\"n\":%d,\"members\":[%s]", event,
         (unsigned long long)ver, (unsigned long long)eff, n, ids);
    free(m);
}

int main(int argc, char **argv) {
    hs_net_config cfg;
    hs_net_config_init(&cfg);
    cfg.security = HS_NET_SECRET;
    long rounds = 20, dim = 1024, wait_members = 0, wait_timeout_ms = 20000, recv_timeout_ms = 5000;
    long round_sleep_ms = 0, ping = 0, linger_ms = 0, until_members = 0;
    int leave = 1;
    const char *log_path = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define OPT(name) (!strcmp(a, name) && v && (i++, 1))
        if (OPT("--listen"))
            cfg.listen = v;
        else if (OPT("--bootstrap"))
            cfg.bootstrap = v;
        else if (OPT("--advertise"))
            cfg.advertise = v;
        else if (!strcmp(a, "--insecure"))
            cfg.security = HS_NET_INSECURE;
        else if (OPT("--secret-file"))
            cfg.secret_file = v, cfg.security = HS_NET_SECRET;
        else if (OPT("--ca"))
            cfg.ca_file = v, cfg.security = HS_NET_CERT;
        else if (OPT("--cert"))
            cfg.cert_file = v, cfg.security = HS_NET_CERT;
        else if (OPT("--key"))
            cfg.key_file = v, cfg.security = HS_NET_CERT;
        else if (OPT("--topo"))
            cfg.topo_spec = v;
        else if (OPT("--seed"))
            cfg.seed = cfg.topo_seed = strtoull(v, NULL, 10);
        else if (OPT("--run-id"))
            cfg.run_id = v;
        else if (OPT("--algo"))
            cfg.algo = v;
        else if (OPT("--codec"))
            cfg.codec = v;
        else if (OPT("--model-sig"))
            cfg.model_sig = v;
        else if (OPT("--params"))
            cfg.n_params = strtoull(v, NULL, 10);
        else if (OPT("--rounds"))
            rounds = atol(v);
        else if (OPT("--dim"))
            dim = atol(v);
        else if (OPT("--wait-members"))
            wait_members = atol(v);
        else if (OPT("--until-members"))
            until_members = atol(v);
        else if (OPT("--wait-timeout-ms"))
            wait_timeout_ms = atol(v);
        else if (OPT("--recv-timeout-ms"))
            recv_timeout_ms = atol(v);
        else if (OPT("--round-sleep-ms"))
            round_sleep_ms = atol(v);
        else if (OPT("--peer-timeout-ms"))
            cfg.peer_timeout_ms = atoi(v);
        else if (OPT("--handshake-timeout-ms"))
            cfg.handshake_timeout_ms = atoi(v);
        else if (OPT("--join-timeout-ms"))
            cfg.join_timeout_ms = atoi(v);
        else if (OPT("--change-rounds"))
            cfg.change_rounds = atoi(v);
        else if (OPT("--max-frame"))
            cfg.max_frame = (size_t)atol(v);
        else if (OPT("--sock-buf"))
            cfg.sock_buf = atoi(v);
        else if (OPT("--emulate")) {
            if (hs_net_emulation_parse(v, &cfg.emulate) < 0) {
                fprintf(stderr, "netpeer: --emulate %s: %s\n", v, hs_error_message());
                return 2;
            }
        } else if (OPT("--log"))
            log_path = v;
        else if (OPT("--ping"))
            ping = atol(v);
        else if (OPT("--linger-ms"))
            linger_ms = atol(v);
        else if (!strcmp(a, "--no-leave"))
            leave = 0;
        else {
            fprintf(stderr, "netpeer: unknown or incomplete option %s\n", a);
            usage();
            return 2;
        }
#undef OPT
    }
    if (dim < 1 || rounds < 0) {
        usage();
        return 2;
    }
    logf_ = log_path ? fopen(log_path, "w") : stdout;
    if (!logf_) {
        fprintf(stderr, "netpeer: cannot write %s\n", log_path);
        return 2;
    }
    /* SIGPIPE is left alone: the runtime blocks it on its loop thread. */
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    if ((size_t)dim * 4 > cfg.max_frame)
        cfg.max_frame = (size_t)dim * 4;

    hs_net *net;
    hs_net_welcome w;
    double t0 = now_s();
    int err = hs_net_start(&net, &cfg, &w);
    if (err < 0) {
        jlog("\"event\":\"error\",\"stage\":\"start\",\"code\":\"%s\",\"message\":\"%s\"",
             hs_err_name(err), hs_error_message());
        return 1;
    }
    uint32_t self = hs_net_self(net);
    jlog("\"event\":\"start\",\"self\":%u,\"port\":%d,\"join_round\":%llu,\"version\":%llu,"
         "\"snapshot_bytes\":%zu,\"snapshot_round\":%llu,\"start_s\":%.6f",
         self, hs_net_listen_port(net), (unsigned long long)w.join_round,
         (unsigned long long)w.version, w.snapshot ? w.snapshot->len : 0,
         (unsigned long long)w.snapshot_round, now_s() - t0);
    uint64_t r0 = w.join_round;
    hs_net_welcome_clear(&w);

    /* x lives in an hs_buf that is sent as it is (no copy): each round's result goes to a new
     * buffer, and the old one is freed when its last write is done. */
    hs_buf *xb;
    if (hs_buf_new(&xb, (size_t)dim * sizeof(float)) < 0)
        return 1;
    xb->len = (size_t)dim * sizeof(float);
    float *x = (float *)xb->data, *acc = NULL;
    for (long k = 0; k < dim; k++)
        x[k] = (float)self;
    hs_buf *snap;
    if (hs_buf_new(&snap, (size_t)dim * 4) == 0) {
        hs_buf_append(snap, x, (size_t)dim * 4);
        hs_net_publish_snapshot(net, r0, snap);
        hs_buf_unref(snap);
    }

    int rc = 0;
    if (wait_members > 0) {
        double deadline = now_s() + (double)wait_timeout_ms / 1000;
        while (hs_net_wait_members(net, (int)wait_members, 20) < 0) {
            if (hs_net_snapshot_wanted(net) && hs_buf_new(&snap, (size_t)dim * 4) == 0) {
                hs_buf_append(snap, x, (size_t)dim * 4);
                hs_net_publish_snapshot(net, r0, snap);
                hs_buf_unref(snap);
            }
            if (now_s() > deadline || stop_flag) {
                jlog("\"event\":\"error\",\"stage\":\"wait\",\"code\":\"HS_ETIMEDOUT\","
                     "\"message\":\"%s\"",
                     hs_error_message());
                rc = 3;
                goto out;
            }
        }
        hs_net_member *m;
        int n;
        uint64_t ver, eff;
        if (hs_net_members(net, &m, &n, &ver, &eff) == 0) {
            free(m);
            if (eff > r0)
                r0 = eff;
        }
        log_members(net, "members");
    }

    hs_exchange *ex = hs_net_exchange(net);
    uint64_t epoch = 0;
    int have_epoch = 0;
    long misses = 0, done_rounds = 0;
    double *round_ms = calloc((size_t)(rounds > 0 ? rounds : 1), sizeof(double));
    int last_n = 0;
    for (long k = 0; k < rounds && !stop_flag; k++) {
        uint64_t r = r0 + (uint64_t)k;
        double tr = now_s();
        hs_peer_view v;
        if ((err = ex->ops->view(ex, r, &v)) < 0) {
            jlog("\"event\":\"error\",\"stage\":\"view\",\"round\":%llu,\"code\":\"%s\","
                 "\"message\":\"%s\"",
                 (unsigned long long)r, hs_err_name(err), hs_error_message());
            rc = err == HS_ENOENT ? 4 : 1;
            break;
        }
        last_n = v.n_members;
        if (!have_epoch || v.epoch != epoch) {
            log_view(r, &v);
            epoch = v.epoch;
            have_epoch = 1;
        }
        hs_buf *b = xb;
        for (int i = 0; i < v.n_out; i++)
            if ((err = ex->ops->send(ex, v.out[i].id, r, b)) < 0)
                jlog("\"event\":\"send_error\",\"round\":%llu,\"to\":%u,\"code\":\"%s\"",
                     (unsigned long long)r, v.out[i].id, hs_err_name(err));
        /* Take every neighbour's vector (a missing one counts as our own), then mix in one
         * pass: x_j <- self_w x_j + sum_k w_k y_k[j]. */
        hs_buf *ins[64];
        const float *ys[64];
        float ws[64];
        int nin = v.n_in < 64 ? v.n_in : 64;
        for (int i = 0; i < nin; i++) {
            ins[i] = NULL;
            err = ex->ops->recv(ex, v.in[i].id, r, (int)recv_timeout_ms, &ins[i]);
            ys[i] = x;
            ws[i] = (float)v.in[i].w;
            if (err == 0 && ins[i]->len == (size_t)dim * 4) {
                ys[i] = (const float *)ins[i]->data;
            } else {
                misses++;
                jlog("\"event\":\"miss\",\"round\":%llu,\"from\":%u,\"code\":\"%s\","
                     "\"message\":\"%s\"",
                     (unsigned long long)r, v.in[i].id, err < 0 ? hs_err_name(err) : "size",
                     err < 0 ? hs_error_message() : "");
            }
        }
        hs_buf *nb;
        if (hs_buf_new(&nb, (size_t)dim * sizeof(float)) < 0)
            break;
        nb->len = (size_t)dim * sizeof(float);
        acc = (float *)nb->data;
        float sw = (float)v.self_w;
        if (nin == 2) {
            const float *restrict y0 = ys[0], *restrict y1 = ys[1], *restrict xx = x;
            float *restrict out = acc, w0 = ws[0], w1 = ws[1];
            for (long j = 0; j < dim; j++)
                out[j] = sw * xx[j] + w0 * y0[j] + w1 * y1[j];
        } else {
            for (long j = 0; j < dim; j++) {
                float sum = sw * x[j];
                for (int i = 0; i < nin; i++)
                    sum += ws[i] * ys[i][j];
                acc[j] = sum;
            }
        }
        for (int i = 0; i < nin; i++)
            hs_buf_unref(ins[i]);
        hs_buf_unref(xb); /* the writes of this round hold their own references */
        xb = nb;
        x = acc;
        if (hs_net_snapshot_wanted(net) && hs_buf_new(&snap, (size_t)dim * 4) == 0) {
            hs_buf_append(snap, x, (size_t)dim * 4);
            hs_net_publish_snapshot(net, r, snap);
            hs_buf_unref(snap);
        }
        round_ms[done_rounds++] = (now_s() - tr) * 1e3;
        if (until_members > 0) {
            hs_net_member *m;
            int n;
            if (hs_net_members(net, &m, &n, NULL, NULL) == 0) {
                free(m);
                if (n == until_members && v.n_members == until_members)
                    break;
            }
        }
        if (round_sleep_ms > 0)
            usleep((useconds_t)round_sleep_ms * 1000);
    }
    qsort(round_ms, (size_t)done_rounds, sizeof(double), cmp_double);
    double med = done_rounds ? round_ms[done_rounds / 2] : 0;
    double mean = 0;
    for (long k = 0; k < done_rounds; k++)
        mean += round_ms[k];
    mean = done_rounds ? mean / (double)done_rounds : 0;
    free(round_ms);

    if (ping > 0 && rc == 0) {
        hs_peer_view v;
        if (ex->ops->view(ex, r0 + (uint64_t)(done_rounds > 0 ? done_rounds - 1 : 0), &v) == 0 &&
            v.n_out > 0) {
            uint32_t to = v.out[0].id;
            double *rtt = calloc((size_t)ping, sizeof(double));
            long got = 0;
            for (long k = 0; k < ping && rtt; k++)
                if (hs_net_ping(net, to, 2000, &rtt[got]) == 0)
                    got++;
            if (got) {
                qsort(rtt, (size_t)got, sizeof(double), cmp_double);
                jlog("\"event\":\"ping\",\"to\":%u,\"n\":%ld,\"rtt_us_median\":%.3f,"
                     "\"rtt_us_min\":%.3f",
                     to, got, rtt[got / 2], rtt[0]);
            }
            free(rtt);
        }
    }
    hs_net_stats st;
    hs_net_stats_get(net, &st);
    jlog("\"event\":\"done\",\"self\":%u,\"rounds\":%ld,\"first_round\":%llu,\"x0\":%.9g,"
         "\"misses\":%ld,\"epoch\":%llu,\"n_members\":%d,\"round_ms_median\":%.4f,"
         "\"round_ms_mean\":%.4f,\"bytes_sent\":%llu,\"bytes_recv\":%llu,\"msgs_sent\":%llu,"
         "\"msgs_recv\":%llu,\"dropped_emulated\":%llu,\"peers_dead\":%llu,"
         "\"conns_refused\":%llu,\"conns_malformed\":%llu,\"rc\":%d",
         self, done_rounds, (unsigned long long)r0, (double)x[0], misses, (unsigned long long)epoch,
         last_n, med, mean, (unsigned long long)st.ex.bytes_sent,
         (unsigned long long)st.ex.bytes_recv, (unsigned long long)st.ex.msgs_sent,
         (unsigned long long)st.ex.msgs_recv, (unsigned long long)st.dropped_emulated,
         (unsigned long long)st.peers_dead, (unsigned long long)st.conns_refused,
         (unsigned long long)st.conns_malformed, rc);
    if (linger_ms > 0) {
        double end = now_s() + (double)linger_ms / 1000;
        while (now_s() < end && !stop_flag)
            usleep(10000);
    }
out:
    if (leave) {
        double tl = now_s();
        err = hs_net_leave(net, 10000);
        jlog("\"event\":\"left\",\"code\":\"%s\",\"leave_s\":%.4f", err < 0 ? hs_err_name(err) : "",
             now_s() - tl);
    }
    hs_net_free(net);
    hs_buf_unref(xb);
    if (logf_ != stdout)
        fclose(logf_);
    return rc;
}
