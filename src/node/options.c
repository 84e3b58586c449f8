/* A node's options by name: one table of names, defaults and parsers. Values are validated when
 * set and kept as the strings given, so hs_node_new resolves them in one place (the combination
 * checks, the algorithm's defaults, CHOCO's automatic step). Not thread-safe per object. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error_internal.h"
#include "hearsay/checkpoint.h"
#include "hearsay/compress.h"
#include "hearsay/topo.h"
#include "node/node_internal.h"
#include "train/outer.h"

/* What one option does to the resolved configuration; v is never NULL. */
typedef int (*opt_apply)(hs__node_cfg *c, const char *name, const char *v);

typedef struct opt_def {
    const char *name;
    const char *def; /* the value it has unless set (NULL: unset) */
    opt_apply apply;
} opt_def;

static int bad(const char *name, const char *v, const char *accepts) {
    return hs__err(HS_EINVAL, "node option %s: '%s' is not %s", name, v, accepts);
}

static int parse_long(const char *name, const char *v, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long l = strtol(v, &end, 10);
    if (!*v || *end || errno || l < lo || l > hi) {
        char acc[96];
        snprintf(acc, sizeof(acc), "an integer in %ld..%ld", lo, hi);
        return bad(name, v, acc);
    }
    *out = l;
    return 0;
}

static int parse_int(const char *name, const char *v, int lo, int hi, int *out) {
    long l = 0;
    int err = parse_long(name, v, lo, hi, &l);
    if (err == 0) *out = (int)l;
    return err;
}

static int parse_flag(const char *name, const char *v, int *out) {
    if (strcmp(v, "0") && strcmp(v, "1")) return bad(name, v, "1 or 0");
    *out = v[0] == '1';
    return 0;
}

static int o_algo(hs__node_cfg *c, const char *name, const char *v) {
    if (hs_algo_kind_parse(v, &c->algo.kind) < 0) {
        char names[160] = "one of ";
        hs_algo_kind_names(hs_algo_kind_any, 1, names + 7, sizeof(names) - 7);
        return bad(name, v, names);
    }
    return 0;
}
static int o_compress(hs__node_cfg *c, const char *name, const char *v) {
    hs_compressor *k;
    /* Checked against a large vector so any count k passes; the node checks it at its d. The
     * compressor's message is kept by prefixing it: formatting hs_error_message() into
     * hs__err would write the buffer it reads from. */
    int err = hs_compressor_new(&k, v, (size_t)1 << 24, 1);
    if (err < 0) return hs__err_prefix(err, "node option %s: '%s'", name, v);
    hs_compressor_free(k);
    c->algo.compress = v;
    return 0;
}
static int o_gamma_c(hs__node_cfg *c, const char *name, const char *v) {
    char *end;
    double g = strtod(v, &end);
    if (!*v || *end || !(g >= 1e-6 && g <= 1.0)) return bad(name, v, "a number in (0, 1]");
    c->algo.gamma_c = (float)g;
    return 0;
}
static int o_topology(hs__node_cfg *c, const char *name, const char *v) {
    if (!*v) return bad(name, v, "a topology (ring, torus:RxC, exponential, ... or a file)");
    c->net.topo_spec = v;
    return 0;
}
static int o_staleness(hs__node_cfg *c, const char *name, const char *v) {
    return parse_int(name, v, 0, 1 << 20, &c->algo.staleness);
}
static int o_recv_timeout(hs__node_cfg *c, const char *name, const char *v) {
    return parse_int(name, v, 1, 3600 * 1000, &c->algo.recv_timeout_ms);
}
static int o_seed(hs__node_cfg *c, const char *name, const char *v) {
    char *end;
    errno = 0;
    unsigned long long s = strtoull(v, &end, 10);
    if (!*v || *end || errno || v[0] == '-') return bad(name, v, "an unsigned integer");
    c->algo.seed = c->net.seed = c->net.topo_seed = s;
    return 0;
}
static int o_rounds(hs__node_cfg *c, const char *name, const char *v) {
    return parse_long(name, v, 0, 1L << 40, &c->rounds);
}
static int o_metrics(hs__node_cfg *c, const char *name, const char *v) {
    (void)name;
    c->metrics = *v ? v : NULL;
    return 0;
}
static int o_quiet(hs__node_cfg *c, const char *name, const char *v) {
    return parse_flag(name, v, &c->quiet);
}
static int o_on_divergence(hs__node_cfg *c, const char *name, const char *v) {
    return hs_guard_policy_parse(v, &c->guard.policy) < 0 ? bad(name, v, "warn or stop") : 0;
}
static int o_str(const char **dst, const char *v) {
    *dst = *v ? v : NULL;
    return 0;
}
static int o_listen(hs__node_cfg *c, const char *name, const char *v) {
    return strrchr(v, ':') ? o_str(&c->net.listen, v) : bad(name, v, "HOST:PORT");
}
static int o_advertise(hs__node_cfg *c, const char *name, const char *v) {
    return !*v || strrchr(v, ':') ? o_str(&c->net.advertise, v) : bad(name, v, "HOST:PORT");
}
static int o_bootstrap(hs__node_cfg *c, const char *name, const char *v) {
    return !*v || strrchr(v, ':') ? o_str(&c->net.bootstrap, v) : bad(name, v, "HOST:PORT");
}
static int o_secret(hs__node_cfg *c, const char *name, const char *v) {
    (void)name;
    return o_str(&c->net.secret_file, v);
}
static int o_ca(hs__node_cfg *c, const char *name, const char *v) {
    (void)name;
    return o_str(&c->net.ca_file, v);
}
static int o_cert(hs__node_cfg *c, const char *name, const char *v) {
    (void)name;
    return o_str(&c->net.cert_file, v);
}
static int o_key(hs__node_cfg *c, const char *name, const char *v) {
    (void)name;
    return o_str(&c->net.key_file, v);
}
static int o_insecure(hs__node_cfg *c, const char *name, const char *v) {
    int on = 0, err = parse_flag(name, v, &on);
    if (err == 0 && on) c->net.security = HS_NET_INSECURE;
    return err;
}
static int o_run_id(hs__node_cfg *c, const char *name, const char *v) {
    return *v ? o_str(&c->net.run_id, v) : bad(name, v, "a name");
}
static int o_emulate(hs__node_cfg *c, const char *name, const char *v) {
    int err = *v ? hs_net_emulation_parse(v, &c->net.emulate) : 0;
    return err < 0 ? hs__err_prefix(err, "node option %s: '%s'", name, v) : 0;
}
static int o_max_frame(hs__node_cfg *c, const char *name, const char *v) {
    long l = 0;
    int err = parse_long(name, v, 1024, 256L << 20, &l);
    if (err == 0) c->net.max_frame = (size_t)l;
    return err;
}
static int o_peer_timeout(hs__node_cfg *c, const char *name, const char *v) {
    return parse_int(name, v, 100, 3600000, &c->net.peer_timeout_ms);
}
static int o_join_timeout(hs__node_cfg *c, const char *name, const char *v) {
    int err = parse_int(name, v, 100, 3600000, &c->net.join_timeout_ms);
    c->wait_timeout_ms = c->net.join_timeout_ms;
    return err;
}
static int o_handshake_timeout(hs__node_cfg *c, const char *name, const char *v) {
    return parse_int(name, v, 100, 3600000, &c->net.handshake_timeout_ms);
}
static int o_max_pending(hs__node_cfg *c, const char *name, const char *v) {
    return parse_int(name, v, 1, 1 << 20, &c->net.max_conns);
}
static int o_max_pending_addr(hs__node_cfg *c, const char *name, const char *v) {
    return parse_int(name, v, 1, 1 << 20, &c->net.max_conns_per_addr);
}
static int o_world(hs__node_cfg *c, const char *name, const char *v) {
    return parse_int(name, v, 1, 1 << 20, &c->world);
}
static int o_rank(hs__node_cfg *c, const char *name, const char *v) {
    return parse_int(name, v, -1, 1 << 20, &c->rank);
}
static int o_rendezvous(hs__node_cfg *c, const char *name, const char *v) {
    (void)name;
    return o_str(&c->rendezvous, v);
}
/* Given: the count holds for joiners and resumed peers too; unset: --world's, new jobs only. */
static int o_wait_peers(hs__node_cfg *c, const char *name, const char *v) {
    c->wait_new_only = 0;
    return parse_int(name, v, 0, 1 << 20, &c->wait_peers);
}
static int o_ck_dir(hs__node_cfg *c, const char *name, const char *v) {
    (void)name;
    return o_str(&c->checkpoint_dir, v);
}
static int o_ck_every(hs__node_cfg *c, const char *name, const char *v) {
    return parse_long(name, v, 1, 1L << 40, &c->checkpoint_every);
}
/* 0: the peers start from different vectors (a consensus experiment), so replicas cannot be
 * assumed equal to a common start: the first round sends them in full. */
static int o_same_start(hs__node_cfg *c, const char *name, const char *v) {
    return parse_flag(name, v, &c->algo.same_start);
}
/* Either given turns the outer step on (the other stays not given, NaN: outer.c fills it in). */
static int o_outer(hs__node_cfg *c, const char *name, const char *v, double hi, float *out) {
    char *end;
    double f = strtod(v, &end);
    if (!*v || *end || !(f >= 0.0 && f <= hi) || (hi < 10.0 && f >= hi))
        return bad(name, v, hi < 10.0 ? "a number in [0, 1)" : "a number in [0, 10]");
    *out = (float)f;
    c->outer.on = 1;
    return 0;
}
static int o_outer_lr(hs__node_cfg *c, const char *name, const char *v) {
    return o_outer(c, name, v, 10.0, &c->outer.lr);
}
static int o_outer_momentum(hs__node_cfg *c, const char *name, const char *v) {
    return o_outer(c, name, v, 1.0, &c->outer.momentum);
}
static int o_resume(hs__node_cfg *c, const char *name, const char *v) {
    if (!strcmp(v, "require")) {
        c->resume = HS__NODE_RESUME_REQUIRE;
        return 0;
    }
    return parse_flag(name, v, &c->resume);
}

static const opt_def opts[] = {
    {"algo", NULL, o_algo},
    {"compress", NULL, o_compress},
    {"gamma-c", NULL, o_gamma_c},
    {"topology", NULL, o_topology},
    {"staleness", NULL, o_staleness},
    {"recv-timeout", NULL, o_recv_timeout},
    {"seed", "1", o_seed},
    {"rounds", "0", o_rounds},
    {"metrics", NULL, o_metrics},
    {"quiet", "0", o_quiet},
    {"on-divergence", NULL, o_on_divergence},
    {"listen", NULL, o_listen},
    {"advertise", NULL, o_advertise},
    {"bootstrap", NULL, o_bootstrap},
    {"secret-file", NULL, o_secret},
    {"ca", NULL, o_ca},
    {"cert", NULL, o_cert},
    {"key", NULL, o_key},
    {"insecure", "0", o_insecure},
    {"run-id", NULL, o_run_id},
    {"emulate", NULL, o_emulate},
    {"max-frame", NULL, o_max_frame},
    {"peer-timeout", NULL, o_peer_timeout},
    {"join-timeout", NULL, o_join_timeout},
    {"handshake-timeout", NULL, o_handshake_timeout},
    {"max-pending", NULL, o_max_pending},
    {"max-pending-per-addr", NULL, o_max_pending_addr},
    {"world", "1", o_world},
    {"rank", NULL, o_rank},
    {"rendezvous", NULL, o_rendezvous},
    {"wait-peers", NULL, o_wait_peers},
    {"checkpoint-dir", NULL, o_ck_dir},
    {"checkpoint-every", HS__NODE_STR(HS__NODE_CHECKPOINT_EVERY), o_ck_every},
    {"resume", "0", o_resume},
    {"same-start", "1", o_same_start},
    {"outer-lr", NULL, o_outer_lr},
    {"outer-momentum", NULL, o_outer_momentum},
};
#define N_OPTS (sizeof(opts) / sizeof(opts[0]))

const char *hs__node_option(size_t i, const char **def) {
    if (i >= N_OPTS) return NULL;
    if (def) *def = opts[i].def;
    return opts[i].name;
}

struct hs_node_options {
    char *val[N_OPTS]; /* as set (owned); NULL: the default */
};

int hs_node_options_new(hs_node_options **out) {
    if (!(*out = calloc(1, sizeof(**out))))
        return hs__err(HS_ENOMEM, "node options: out of memory");
    return 0;
}

void hs_node_options_free(hs_node_options *o) {
    if (!o) return;
    for (size_t i = 0; i < N_OPTS; i++) free(o->val[i]);
    free(o);
}

hs_node_options *hs__node_options_dup(const hs_node_options *o) {
    hs_node_options *c;
    if (hs_node_options_new(&c) < 0) return NULL;
    for (size_t i = 0; i < N_OPTS; i++)
        if (o->val[i] && !(c->val[i] = strdup(o->val[i]))) {
            hs_node_options_free(c);
            hs__err(HS_ENOMEM, "node options: out of memory");
            return NULL;
        }
    return c;
}

/* The defaults under the table's: those of hs_net_config_init and hs_algo_cfg_default, which
 * `hearsay run` starts from too, and the values no option sets. */
static void cfg_base(hs__node_cfg *c) {
    memset(c, 0, sizeof(*c));
    hs_net_config_init(&c->net);
    hs_algo_cfg_default(&c->algo);
    /* The algorithm's own compressor and topology, once it is known. */
    c->algo.compress = NULL;
    c->net.topo_spec = NULL;
    c->rank = -1;
    c->wait_new_only = 1;
    c->wait_timeout_ms = c->net.join_timeout_ms > 0 ? c->net.join_timeout_ms
                                                    : HS__NODE_JOIN_TIMEOUT_MS;
    c->net.security = HS_NET_SECRET;
    hs__outer_cfg_default(&c->outer);
}

void hs__node_cfg_defaults(hs__node_cfg *c) {
    cfg_base(c);
    for (size_t i = 0; i < N_OPTS; i++)
        if (opts[i].def) opts[i].apply(c, opts[i].name, opts[i].def);
}

int hs_node_options_set(hs_node_options *o, const char *name, const char *value) {
    if (!o || !name || !value)
        return hs__err(HS_EINVAL, "node option %s: no %s", name ? name : "(null)",
                       o ? "value" : "options object");
    for (size_t i = 0; i < N_OPTS; i++) {
        if (strcmp(opts[i].name, name)) continue;
        hs__node_cfg scratch;
        cfg_base(&scratch);
        int err = opts[i].apply(&scratch, name, value);
        if (err < 0) return err;
        char *s = strdup(value);
        if (!s) return hs__err(HS_ENOMEM, "node options: out of memory");
        free(o->val[i]);
        o->val[i] = s;
        return 0;
    }
    /* Every name, so that the message is the reference: a guess ("lr", "epochs") is usually
     * a training option, which belongs to the caller's own loop. */
    char names[700];
    size_t at = 0;
    for (size_t i = 0; i < N_OPTS && at < sizeof(names); i++) {
        int w = snprintf(names + at, sizeof(names) - at, "%s%s", i ? ", " : "", opts[i].name);
        if (w > 0) at += (size_t)w;
    }
    return hs__err(HS_EINVAL,
                   "node option '%s' is unknown; a node's options are: %s (training options "
                   "such as lr or epochs belong to the caller's own loop)",
                   name, names);
}

/* The typed forms write the value as its text and go through the one parser above. */
int hs_node_options_set_int(hs_node_options *o, const char *name, long long value) {
    char v[32];
    snprintf(v, sizeof(v), "%lld", value);
    return hs_node_options_set(o, name, v);
}

int hs_node_options_set_double(hs_node_options *o, const char *name, double value) {
    char v[40];
    snprintf(v, sizeof(v), "%.17g", value);
    return hs_node_options_set(o, name, v);
}

int hs_node_options_set_bool(hs_node_options *o, const char *name, int value) {
    return hs_node_options_set(o, name, value ? "1" : "0");
}

const char *hs_node_option_name(size_t i, const char **default_value) {
    return hs__node_option(i, default_value);
}

float hs__node_auto_gamma_c(hs_algo_cfg *acfg, const char *topology, int n, size_t d,
                            uint64_t seed, char *why, size_t why_len) {
    if (why) snprintf(why, why_len, "set by --gamma-c");
    if (!hs_algo_kind_uses_gamma_c(acfg->kind)) return 0.0f;
    if (acfg->gamma_c > 0) return acfg->gamma_c;
    hs_topo *t = NULL;
    hs_compressor *c = NULL;
    acfg->gap = 0;
    acfg->max_degree = 0;
    /* A file fixes its own size; a generator needs the job's. */
    int is_file = hs_topo_spec_is_file(topology);
    if ((is_file || n > 1) && hs_topo_new(&t, topology, is_file ? 0 : n, seed) == 0)
        hs_algo_cfg_set_topology(acfg, t);
    /* Also at a peer that joined without the job's size (--bootstrap alone). */
    hs_algo_cfg_set_step_degree(acfg, topology);
    float g = 0.0f;
    double dp = 0;
    if (hs_compressor_new(&c, acfg->compress, d, seed) == 0 &&
        hs_algo_auto_gamma_c(c, &g, &dp) == 0) {
        double delta = hs_compressor_delta(c);
        float g0 = g;
        g = hs_algo_scale_gamma_c(g0, acfg->max_degree);
        /* The rule uses the degree but not the gap (src/algo/step.c says why); the gap is
         * shown because it says what the step was chosen for. */
        char gs[64] = "not known";
        if (acfg->gap > 0)
            snprintf(gs, sizeof(gs), "%.4g (%s on %d peers)", acfg->gap, topology,
                     t ? hs_topo_n(t) : n);
        char sc[64] = "";
        if (g != g0) snprintf(sc, sizeof(sc), ", x %.3g for at most %d neighbours", g / g0,
                              acfg->max_degree);
        if (why)
            snprintf(why, why_len,
                     "automatic: delta_e / (2 - delta_e) for %s, delta_e = sqrt(delta %.4g x "
                     "%.4g on a probe)%s; spectral gap %s",
                     acfg->compress, delta, dp > delta ? dp : delta, sc, gs);
    }
    hs_compressor_free(c);
    hs_topo_free(t);
    return g;
}

static int option_given(const hs_node_options *o, const char *name) {
    for (size_t i = 0; i < N_OPTS; i++)
        if (!strcmp(opts[i].name, name)) return o->val[i] != NULL;
    return 0;
}

int hs__node_options_resolve(const hs_node_options *o, size_t d, hs__node_cfg *c) {
    cfg_base(c);
    int err;
    for (size_t i = 0; i < N_OPTS; i++) {
        const char *v = o->val[i] ? o->val[i] : opts[i].def;
        if (v && (err = opts[i].apply(c, opts[i].name, v)) < 0) return err;
    }
    hs_algo_kind k = c->algo.kind;
    if (!c->algo.compress) c->algo.compress = hs_algo_kind_default_compress(k);
    if (!option_given(o, "staleness")) c->algo.staleness = hs_algo_kind_default_staleness(k);
    if (!c->net.topo_spec) c->net.topo_spec = hs_algo_kind_default_topology(k);
    hs_compressor *cm;
    if ((err = hs_compressor_new(&cm, c->algo.compress, d, c->algo.seed)) < 0)
        return hs__err_prefix(err, "node option compress %s", c->algo.compress);
    err = hs_algo_check_compressor(k, cm);
    hs_compressor_free(cm);
    if (err < 0) return err;
    char ok[96]; /* which algorithms an option applies to, from their table */
    if (c->algo.gamma_c > 0 && !hs_algo_kind_uses_gamma_c(k)) {
        hs_algo_kind_names(hs_algo_kind_uses_gamma_c, 1, ok, sizeof(ok));
        return hs__err(HS_EINVAL, "node option gamma-c applies to algo %s only", ok);
    }
    if (c->algo.staleness && hs_algo_kind_synchronous(k)) {
        hs_algo_kind_names(hs_algo_kind_synchronous, 0, ok, sizeof(ok));
        return hs__err(HS_EINVAL, "node option staleness applies to algo %s only", ok);
    }
    if (hs_algo_kind_synchronous(k)) {
        const char *spec = c->net.topo_spec;
        hs_topo *t = NULL;
        if (hs_topo_spec_is_file(spec) && (err = hs_topo_new(&t, spec, 0, c->algo.seed)) < 0)
            return hs__err_prefix(err, "node option topology %s", spec);
        int directed = t ? hs_topo_directed(t) : !strncmp(spec, "onepeer-exp", 11);
        int period = t ? hs_topo_period(t) : directed ? 2 : 1;
        hs_topo_free(t);
        if ((err = hs_algo_check_topology(k, directed, period, spec)) < 0) return err;
    }
    int modes = (c->net.secret_file != NULL) +
                (c->net.ca_file || c->net.cert_file || c->net.key_file) +
                (c->net.security == HS_NET_INSECURE);
    if (modes != 1)
        return hs__err(HS_EINVAL, modes ? "node options: choose one of secret-file, ca/cert/key "
                                          "and insecure"
                                        : "node options: no security mode: set secret-file, or "
                                          "ca, cert and key, or insecure 1 for plain TCP");
    if (c->net.ca_file || c->net.cert_file || c->net.key_file) {
        if (!c->net.ca_file || !c->net.cert_file || !c->net.key_file)
            return hs__err(HS_EINVAL, "node options: certificates need all of ca, cert and key");
        c->net.security = HS_NET_CERT;
    } else if (c->net.secret_file) {
        c->net.security = HS_NET_SECRET;
    }
    /* Files are checked now, not when the job is being joined. */
    const char *files[][2] = {{"secret-file", c->net.secret_file}, {"ca", c->net.ca_file},
                              {"cert", c->net.cert_file}, {"key", c->net.key_file}};
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++)
        if (files[i][1] && access(files[i][1], R_OK) != 0)
            return hs__err(HS_EINVAL, "node option %s %s: %s", files[i][0], files[i][1],
                           strerror(errno));
    if (c->rank >= c->world)
        return hs__err(HS_EINVAL, "node option rank %d is outside 0..%d (world %d)", c->rank,
                       c->world - 1, c->world);
    if (c->resume && !c->checkpoint_dir)
        return hs__err(HS_EINVAL, "node option resume needs checkpoint-dir");
    if (c->checkpoint_dir && (err = hs_checkpoint_dir_check(c->checkpoint_dir)) < 0) return err;
    /* world N alone: a new job waits for its N peers before round 0. */
    if (c->wait_new_only) c->wait_peers = c->world;
    int job_n = c->wait_peers > 1 ? c->wait_peers : c->world > 1 ? c->world : 0;
    /* The gap at the job's size is an input of the automatic step, which hs_algo_new resolves
     * (gamma_c stays 0); every peer given the same options computes the same float. */
    c->guard.gamma_c = hs__node_auto_gamma_c(&c->algo, c->net.topo_spec, job_n, d, c->algo.seed,
                                             NULL, 0);
    c->guard.algo = k;
    c->guard.compress = c->algo.compress;
    return 0;
}
