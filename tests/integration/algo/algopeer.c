/* algopeer: a consensus-only peer for the network tests of the algorithms. It joins a job
 * through the peer runtime (TLS with a run secret), starts from its own random vector of
 * --dim floats (seeded by its id), and runs --rounds rounds of --algo with learning rate 0:
 * begin, push, pull, as hearsay run does, but with no model. Before the first round and after
 * every round it appends the evaluation point (x, or x / w for sgp) and the push-sum weight to
 * --out: per record a u64 round, an f64 weight and dim f32 values. Exit 0 when done. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "hearsay/algo.h"
#include "hearsay/error.h"
#include "hearsay/net.h"

static const char *arg(int argc, char **argv, const char *name, const char *def) {
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], name)) return argv[i + 1];
    return def;
}

static int record(FILE *f, uint64_t r, double w, const float *z, size_t d) {
    return fwrite(&r, 8, 1, f) == 1 && fwrite(&w, 8, 1, f) == 1 && fwrite(z, 4, d, f) == d ? 0 : -1;
}

int main(int argc, char **argv) {
    size_t d = (size_t)atol(arg(argc, argv, "--dim", "1000"));
    long rounds = atol(arg(argc, argv, "--rounds", "100"));
    int wait = atoi(arg(argc, argv, "--wait-members", "4"));
    const char *out = arg(argc, argv, "--out", NULL);
    hs_algo_cfg ac;
    hs_algo_cfg_default(&ac);
    if (hs_algo_kind_parse(arg(argc, argv, "--algo", "dpsgd"), &ac.kind) < 0) {
        fprintf(stderr, "algopeer: %s\n", hs_error_message());
        return 2;
    }
    ac.compress = arg(argc, argv, "--compress", "none");
    ac.gamma_c = (float)atof(arg(argc, argv, "--gamma-c", "0.5"));
    /* Generous: every peer runs all its rounds and leaves with a BYE, so no timeout is part of
     * the test, and one that fired on a busy machine would break the exact average it checks. */
    ac.recv_timeout_ms = 30000;
    ac.staleness = atoi(arg(argc, argv, "--staleness", "0"));
    ac.same_start = 0;
    ac.seed = 7;
    hs_net_config nc;
    hs_net_config_init(&nc);
    nc.listen = arg(argc, argv, "--listen", "127.0.0.1:0");
    nc.bootstrap = arg(argc, argv, "--bootstrap", NULL);
    nc.secret_file = arg(argc, argv, "--secret-file", NULL);
    nc.security = nc.secret_file ? HS_NET_SECRET : HS_NET_INSECURE;
    nc.topo_spec = arg(argc, argv, "--topo", "ring");
    nc.model_sig = "consensus";
    nc.n_params = d;
    nc.algo = hs_algo_kind_name(ac.kind);
    nc.codec = ac.compress;
    nc.join_timeout_ms = 60000;
    nc.peer_timeout_ms = 15000;
    hs_net *net = NULL;
    hs_net_welcome w;
    memset(&w, 0, sizeof(w));
    hs_algo *a = NULL;
    float *x = malloc(sizeof(float) * d);
    FILE *f = NULL;
    int rc = 1;
    if (!out || !x) {
        fprintf(stderr, "algopeer: --out FILE is required\n");
        return 2;
    }
    /* A snapshot is published before waiting: a member welcomes joiners with the newest one
     * and would otherwise hold their WELCOME until its timeout. */
    hs_buf *snap = NULL;
    if (hs_net_start(&net, &nc, &w) < 0 || hs_buf_new(&snap, 8) < 0 ||
        hs_buf_append(snap, "empty", 5) < 0 || hs_net_publish_snapshot(net, 0, snap) < 0 ||
        hs_net_wait_members(net, wait, 60000) < 0) {
        hs_buf_unref(snap);
        fprintf(stderr, "algopeer: %s\n", hs_error_message());
        goto done;
    }
    hs_buf_unref(snap);
    uint32_t self = hs_net_self(net);
    hs_rng r;
    hs__rng_init(&r, 99, HS_RNG_TEST, self, 0);
    for (size_t k = 0; k < d; k++) x[k] = (float)hs__rng_normal(&r) + (float)self;
    if (hs_algo_new(&a, &ac, self, d, x) < 0) {
        fprintf(stderr, "algopeer: %s\n", hs_error_message());
        goto done;
    }
    uint64_t start = 0;
    hs_net_member *mem;
    int nm;
    if (hs_net_members(net, &mem, &nm, NULL, &start) < 0) goto done;
    free(mem);
    char path[4096];
    snprintf(path, sizeof(path), "%s-%u.bin", out, self);
    if (!(f = fopen(path, "wb"))) goto done;
    hs_exchange *ex = hs_net_exchange(net);
    hs_algo_stats st;
    if (record(f, start, 1.0, hs_algo_eval_point(a, x), d) < 0) goto done;
    for (uint64_t rr = start; rr < start + (uint64_t)rounds; rr++) {
        if (hs_algo_begin(a, ex, rr, x) < 0 || hs_algo_push(a, ex, rr, x) < 0 ||
            hs_algo_pull(a, ex, rr, x) < 0) {
            fprintf(stderr, "algopeer %u: round %llu: %s\n", self, (unsigned long long)rr,
                    hs_error_message());
            goto done;
        }
        hs_algo_get_stats(a, &st);
        if (getenv("ALGOPEER_DEBUG")) {
            hs_peer_view v;
            ex->ops->view(ex, rr, &v);
            fprintf(stderr, "peer %u round %llu epoch %llu members %d self %.4f missing %d:", self,
                    (unsigned long long)rr, (unsigned long long)v.epoch, v.n_members, v.self_w,
                    st.missing);
            for (int i = 0; i < v.n_in; i++) fprintf(stderr, " %u:%.4f", v.in[i].id, v.in[i].w);
            fprintf(stderr, "\n");
        }
        if (record(f, rr + 1, st.push_weight, hs_algo_eval_point(a, x), d) < 0) goto done;
    }
    hs_net_leave(net, 5000);
    rc = 0;
done:
    if (f) fclose(f);
    hs_algo_free(a);
    hs_net_free(net);
    hs_net_welcome_clear(&w);
    free(x);
    return rc;
}
