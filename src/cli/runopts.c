/* Shared options of the decentralized commands (see runopts.h). */
#include "cli/runopts.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "hearsay/compress.h"
#include "hearsay/error.h"
#include "hearsay/topo.h"
#include "node/node_internal.h"
#include "train/outer.h"

const hs_cli_opt hs_runopts_table[] = {
    {"algo", RO_ALGO, "A", "dpsgd, dcd, choco, sgp or beer (default: choco)"},
    /* Continuation lines start under the first column of the help text. */
#define HELP_PAD "\n                               "
    {"compress", RO_COMPRESS, "C",
     "none, fp16, bf16, topk:K[:fp16|:fp8], randk:K[:fp16][:unscaled], qsgd:S[:B], sign[:B],"
     HELP_PAD "ef:C"
     HELP_PAD "(K: a fraction such as 0.01, or a count; S: levels; B: bucket size, default 512"
     HELP_PAD "for qsgd, the whole vector for sign). Refused: choco with randk:K (rescaled: use"
     HELP_PAD ":unscaled) or ef:; sgp with ef:; dpsgd with topk, sign or unscaled randk without"
     HELP_PAD "ef:; dcd with a biased one (default: sign:512 for choco, topk:0.01 for beer,"
     HELP_PAD "qsgd:16 for dcd, none otherwise)"},
    {"gamma-c", RO_GAMMA_C, "F", "CHOCO and BEER consensus step in (0, 1] (default: from the "
                                 "compressor's contraction, times 1.5 up to 0.15 on a ring: 0.295 "
                                 "for sign:512 on every graph, 0.02 for topk:0.01 on a ring; "
                                 "printed at start)"},
    {"local-steps", RO_LOCAL_STEPS, "N", "optimizer steps per communication round (default: 1)"},
    {"outer-lr", RO_OUTER_LR, "F",
     "outer optimizer (SlowMo, DiLoCo) after each round's gossip: Nesterov step of rate F in"
     HELP_PAD "[0, 10] on the round's pseudo-gradient (model at the round's start minus the"
     HELP_PAD "model after the gossip for choco and beer; before it for the others, whose"
     HELP_PAD "mixing is then applied once). Not given, nor --outer-momentum: no outer step; either"
     HELP_PAD "given: the other makes them sum to 1 (rate / (1 - momentum) = 1: the momentum"
     HELP_PAD "smooths the rounds, does not amplify them; 0.5 with 0.5 worked best), and 1 with"
     HELP_PAD "0 gives the plain algorithm's bits. DiLoCo's 0.7 with momentum 0.9 is for hundreds"
     HELP_PAD "of local steps or --momentum 0: over a few local steps of SGD with momentum it"
     HELP_PAD "overshoots"},
    {"outer-momentum", RO_OUTER_MOMENTUM, "F",
     "outer optimizer's Nesterov momentum in [0, 1); --outer-lr alone: 1 minus it, at least 0"},
    {"topology", RO_TOPOLOGY, "T",
     "ring, torus:RxC, hypercube, exponential, onepeer-exp, complete, regular:D, two-cluster, "
     "or a topology file (default: ring; onepeer-exp for sgp)"},
    {"partition", RO_PARTITION, "P", "iid or dirichlet:ALPHA (default: iid)"},
    {"staleness", RO_STALENESS, "N", "sgp: wait for shares N rounds old from peers that keep up; "
                                     "0: never wait (default: 1 for sgp)"},
    {"recv-timeout", RO_RECV_TIMEOUT, "MS", "how long a round waits for a neighbour (default: 10000)"},
    {"data", RO_DATA, "DIR", "image set: IDX files or CIFAR-10 binary batches (default: "
                             "Fashion-MNIST in " HS_DATA_DEFAULT_DIR ")"},
    {"synthetic", RO_SYNTHETIC, NULL, "use a synthetic Gaussian-cluster dataset instead"},
    {"augment", RO_AUGMENT, NULL, "seeded random crops (4-pixel padding) and horizontal flips"},
    {"subset", RO_SUBSET, "N", "use a seeded subset of N training examples"},
    {"test-subset", RO_TEST_SUBSET, "N", "evaluate on the first N test examples"},
    {"model", RO_MODEL, "M", "mlp, mlp:W-W-..-W, cnn-small, resnet20 or FILE.json (default: mlp)"},
    {"hidden", RO_HIDDEN, "W,W", "hidden layer widths of --model mlp (default: 256,128)"},
    {"epochs", RO_EPOCHS, "E", "passes over each peer's shard (default: 10)"},
    {"rounds", RO_ROUNDS, "N", "communication rounds (instead of --epochs)"},
    {"batch", RO_BATCH, "N", "examples per local step (default: 128)"},
    {"optimizer", RO_OPTIMIZER, "O", "sgd or adamw (default: sgd)"},
    {"lr", RO_LR, "F", "peak learning rate (default: 0.05 for sgd, 0.001 for adamw)"},
    {"momentum", RO_MOMENTUM, "F", "sgd momentum in [0, 1) (default: 0.9)"},
    {"nesterov", RO_NESTEROV, NULL, "Nesterov momentum"},
    {"momentum-kind", RO_MOMENTUM_KIND, "K",
     "local (heavy ball on the local gradients), qg: quasi-global momentum, whose buffer"
     HELP_PAD "follows each round's model change, gossip included (Lin et al. 2021), or hybrid:"
     HELP_PAD "the heavy ball on the gradients and a qg buffer of the gossip's share; qg and"
     HELP_PAD "hybrid need dpsgd or choco, sgd and --momentum > 0 (default: local)"},
#undef HELP_PAD
    {"weight-decay", RO_WD, "F", "weight decay, L2 for sgd, decoupled for adamw (default: 0.0001)"},
    {"lr-schedule", RO_SCHED, "S", "const, cosine or step (default: cosine)"},
    {"warmup", RO_WARMUP, "N", "linear warm-up steps (default: 0 for mlp, a tenth of the steps "
                               "for other models)"},
    {"seed", RO_SEED, "N", "seed of initialisation, sharding, batches, compression (default: 1)"},
    {"threads", RO_THREADS, "N", "CPU threads; above 1, each batch is split into N parts "
                               "computed at once (default: 1)"},
    {"device", RO_DEVICE, "D", "cpu, cuda or cuda:N, the CUDA device numbered N (default: cpu)"},
    {"precision", RO_PRECISION, "P", HS_PRECISION_HELP},
    {"metrics", RO_METRICS, "FILE", "write JSON-lines metrics to FILE ({id}: the peer id, for run)"},
    {"eval-every", RO_EVAL_EVERY, "N", "evaluate every N rounds (default: once per epoch)"},
    {"quiet", RO_QUIET, NULL, "print only the final summary"},
    {"on-divergence", RO_ON_DIVERGENCE, "P",
     "warn or stop (exit status 3) when the run diverges; non-finite values always stop "
     "(default: stop)"},
    {"config", RO_CONFIG, "FILE", "options from a JSON object {\"option\": value}; flags override"},
    {NULL, 0, NULL, NULL},
};

void hs__runopts_default(hs_runopts *o) {
    memset(o, 0, sizeof(*o));
    o->hidden = "256,128";
    o->epochs = 10;
    o->batch = 128;
    hs_optim_cfg_default(&o->optim);
    o->optim.weight_decay = 1e-4f;
    o->seed = 1;
    o->threads = 1;
    o->device = HS_DEVICE_CPU;
    hs_algo_cfg_default(&o->algo);
    o->local_steps = 1;
    hs__outer_cfg_default(&o->outer);
    o->partition_spec = "iid";
}

static int usage_from_error(const char *flag) {
    return hs__cli_usage_error("%s: %s", flag, hs_error_message());
}

int hs__runopts_handle(hs_runopts *o, int key, const char *v) {
    switch (key) {
    case RO_DATA: o->data = v; return 0;
    case RO_SYNTHETIC: o->synthetic = 1; return 0;
    case RO_SUBSET: return hs__cli_long("--subset", v, 1, 1L << 32, &o->subset);
    case RO_TEST_SUBSET: return hs__cli_long("--test-subset", v, 1, 1L << 32, &o->test_subset);
    case RO_HIDDEN:
        o->hidden = v;
        o->hidden_set = 1;
        return 0;
    case RO_MODEL: o->model = v; return 0;
    case RO_EPOCHS: return hs__cli_double("--epochs", v, 1e-6, 1e6, &o->epochs);
    case RO_ROUNDS: return hs__cli_long("--rounds", v, 1, 1L << 40, &o->rounds);
    case RO_BATCH: return hs__cli_int("--batch", v, 1, 1 << 16, &o->batch);
    case RO_LR: o->lr_set = 1; return hs__cli_float("--lr", v, 0.0, 100.0, &o->optim.lr);
    case RO_AUGMENT: o->augment = 1; return 0;
    case RO_OPTIMIZER:
        return hs_optim_kind_parse(v, &o->optim.kind) < 0
                   ? hs__cli_usage_error("%s", hs_error_message())
                   : 0;
    case RO_MOMENTUM: return hs__cli_float("--momentum", v, 0.0, 0.9999, &o->optim.momentum);
    case RO_NESTEROV: o->optim.nesterov = 1; return 0;
    case RO_MOMENTUM_KIND:
        return hs_momentum_kind_parse(v, &o->optim.momentum_kind) < 0
                   ? hs__cli_usage_error("%s", hs_error_message())
                   : 0;
    case RO_WD: return hs__cli_float("--weight-decay", v, 0.0, 1.0, &o->optim.weight_decay);
    case RO_SCHED:
        return hs_lr_sched_parse(v, &o->optim.sched) < 0 ? usage_from_error("--lr-schedule") : 0;
    case RO_WARMUP:
        o->warmup_set = 1;
        return hs__cli_long("--warmup", v, 0, 1L << 40, &o->optim.warmup_steps);
    case RO_SEED: return hs__cli_u64("--seed", v, &o->seed);
    case RO_THREADS: return hs__cli_int("--threads", v, 1, 1024, &o->threads);
    case RO_DEVICE:
        return hs_device_parse_id(v, &o->device, &o->device_id) < 0 ? usage_from_error("--device")
                                                                    : 0;
    case RO_PRECISION:
        return hs_precision_parse(v, &o->precision) < 0 ? usage_from_error("--precision") : 0;
    case RO_ALGO: return hs_algo_kind_parse(v, &o->algo.kind) < 0 ? usage_from_error("--algo") : 0;
    case RO_COMPRESS:
        if (strlen(v) >= sizeof(o->compress))
            return hs__cli_usage_error("--compress '%s': too long", v);
        snprintf(o->compress, sizeof(o->compress), "%s", v);
        return 0;
    case RO_GAMMA_C:
        o->gamma_c_set = 1;
        return hs__cli_float("--gamma-c", v, 1e-6, 1.0, &o->algo.gamma_c);
    case RO_LOCAL_STEPS: return hs__cli_int("--local-steps", v, 1, 1 << 20, &o->local_steps);
    case RO_OUTER_LR:
        o->outer.on = 1;
        return hs__cli_float("--outer-lr", v, 0.0, 10.0, &o->outer.lr);
    case RO_OUTER_MOMENTUM: {
        o->outer.on = 1;
        int rc = hs__cli_float("--outer-momentum", v, 0.0, 1.0, &o->outer.momentum);
        if (rc < 0) return rc;
        return o->outer.momentum < 1.0f
                   ? 0
                   : hs__cli_usage_error("--outer-momentum %s: must be in [0, 1)", v);
    }
    case RO_TOPOLOGY: o->topology = v; return 0;
    case RO_PARTITION:
        o->partition_spec = v;
        return hs_partition_parse(v, &o->partition) < 0 ? usage_from_error("--partition") : 0;
    case RO_SLOWDOWN: o->slowdown = v; return 0;
    case RO_STALENESS:
        o->staleness_set = 1;
        return hs__cli_int("--staleness", v, 0, 1 << 20, &o->algo.staleness);
    case RO_RECV_TIMEOUT:
        return hs__cli_int("--recv-timeout", v, 1, 3600 * 1000, &o->algo.recv_timeout_ms);
    case RO_METRICS: o->metrics = v; return 0;
    case RO_EVAL_EVERY: return hs__cli_long("--eval-every", v, 1, 1L << 40, &o->eval_every);
    case RO_QUIET: o->quiet = 1; return 0;
    case RO_CONFIG: return 0; /* expanded before parsing (hs__cli_expand_config) */
    case RO_ON_DIVERGENCE:
        return hs_guard_policy_parse(v, &o->on_divergence) < 0 ? usage_from_error("--on-divergence")
                                                               : 0;
    }
    return 1;
}

float hs__runopts_choco_step(hs_runopts *o, int n, size_t d, char *why, size_t why_len) {
    /* The node's rule, so that `run` and a library node given the same options agree. */
    return hs__node_auto_gamma_c(&o->algo, o->topology, n, d, o->seed, why, why_len);
}

int hs__runopts_check_hidden(const char *model, int hidden_set) {
    /* Only the plain MLP takes its widths from --hidden; anywhere else they would be dropped
     * without a word, and the run would not be the model the user described. */
    if (hidden_set && model && strcmp(model, "mlp") != 0)
        return hs__cli_usage_error("--hidden applies to --model mlp only, not --model %s%s", model,
                                  !strncmp(model, "mlp:", 4) ? " (whose widths are given in it)"
                                                              : "");
    return 0;
}

int hs__runopts_finish(hs_runopts *o) {
    if (o->synthetic && o->data) return hs__cli_usage_error("--synthetic and --data exclude each other");
    int err = hs__runopts_check_hidden(o->model, o->hidden_set);
    if (err < 0) return err;
    if (o->optim.kind == HS_OPTIM_ADAMW) {
        if (!o->lr_set) o->optim.lr = 1e-3f;
        if (o->optim.nesterov) return hs__cli_usage_error("--nesterov applies to --optimizer sgd only");
    }
    if (!o->compress[0])
        snprintf(o->compress, sizeof(o->compress), "%s",
                 hs_algo_kind_default_compress(o->algo.kind));
    if (!o->topology) o->topology = hs_algo_kind_default_topology(o->algo.kind);
    /* The spec is checked here, so a typo fails before any data is loaded; against a large
     * vector, so that any count k the model could take passes (the model checks it exactly). */
    hs_compressor *c;
    if (hs_compressor_new(&c, o->compress, (size_t)1 << 24, 1) < 0)
        return hs__cli_usage_error("--compress %s: %s", o->compress, hs_error_message());
    err = hs_algo_check_compressor(o->algo.kind, c);
    hs_compressor_free(c);
    if (err < 0) return hs__cli_usage_error("%s", hs_error_message());
    /* The algorithm and the topology are checked together before any data is loaded: a file
     * is read for its shape; of the generators only onepeer-exp is directed and time-varying. */
    if (hs_algo_kind_synchronous(o->algo.kind)) {
        hs_topo *t = NULL;
        const char *spec = o->topology;
        int is_file = strlen(spec) > 5 && !strcmp(spec + strlen(spec) - 5, ".json");
        if (is_file && hs_topo_new(&t, spec, 0, o->seed) < 0)
            return hs__cli_usage_error("--topology %s: %s", spec, hs_error_message());
        int directed = t ? hs_topo_directed(t) : !strncmp(spec, "onepeer-exp", 11);
        int period = t ? hs_topo_period(t) : directed ? 2 : 1;
        hs_topo_free(t);
        if (hs_algo_check_topology(o->algo.kind, directed, period, spec) < 0)
            return hs__cli_usage_error("%s", hs_error_message());
    }
    o->algo.compress = o->compress;
    if (!o->gamma_c_set) o->algo.gamma_c = 0; /* automatic: hs_algo_new resolves it */
    /* Which algorithms an option applies to comes from their ops table, so that adding one
     * changes no message here. */
    char ok[96];
    if (o->gamma_c_set && !hs_algo_kind_uses_gamma_c(o->algo.kind)) {
        hs_algo_kind_names(hs_algo_kind_uses_gamma_c, 1, ok, sizeof(ok));
        return hs__cli_usage_error("--gamma-c applies to --algo %s only", ok);
    }
    /* The algorithm's own default, as for its compressor and topology. */
    if (!o->staleness_set) o->algo.staleness = hs_algo_kind_default_staleness(o->algo.kind);
    if (o->optim.momentum_kind != HS_MOMENTUM_LOCAL) {
        const char *mk = hs_momentum_kind_name(o->optim.momentum_kind);
        /* The paper covers a mixing step that keeps the average of the models; SGP steps
         * x / w, DCD mixes compressed differences, BEER tracks the steps themselves. */
        if (!hs_algo_kind_qg_momentum(o->algo.kind)) {
            hs_algo_kind_names(hs_algo_kind_qg_momentum, 1, ok, sizeof(ok));
            return hs__cli_usage_error("--momentum-kind %s applies to --algo %s only (not %s: its "
                                      "mixing step does not keep the average of the models)",
                                      mk, ok, hs_algo_kind_name(o->algo.kind));
        }
        if (o->optim.kind != HS_OPTIM_SGD || o->optim.momentum == 0.0f)
            return hs__cli_usage_error("--momentum-kind %s needs --optimizer sgd and --momentum > 0",
                                      mk);
    }
    if (o->algo.staleness && hs_algo_kind_synchronous(o->algo.kind)) {
        hs_algo_kind_names(hs_algo_kind_synchronous, 0, ok, sizeof(ok));
        return hs__cli_usage_error("--staleness applies to --algo %s only", ok);
    }
    o->algo.seed = o->seed;
    o->algo.same_start = 1;
    return 0;
}

void hs__runopts_print_data(const hs_dataset *ds) {
    printf("hearsay %s: %s: %zu examples of %dx%dx%d, %d classes; normalised per channel with "
           "mean",
           hs__cli_cmd, ds->name, ds->n, ds->channels, ds->height, ds->width, ds->classes);
    for (int c = 0; c < ds->channels && c < HS_DATA_MAX_CHANNELS; c++)
        printf("%s%.4f", c ? "," : " ", (double)ds->mean[c]);
    printf(" std");
    for (int c = 0; c < ds->channels && c < HS_DATA_MAX_CHANNELS; c++)
        printf("%s%.4f", c ? "," : " ", (double)ds->std[c]);
    printf("\n");
    fflush(stdout);
}

int hs__runopts_load_data(const hs_runopts *o, hs_dataset **train, hs_dataset **test) {
    *train = *test = NULL;
    int err;
    if (o->synthetic) {
        hs_synth_cfg sc = {o->subset > 0 ? (size_t)o->subset : 20000, 784, 10, 6.0f, o->seed, 0};
        hs_synth_cfg tc = sc;
        tc.n = o->test_subset > 0 ? (size_t)o->test_subset : 5000;
        tc.split = 1;
        if ((err = hs_dataset_synthetic(train, &sc)) < 0 ||
            (err = hs_dataset_synthetic(test, &tc)) < 0)
            goto fail;
        if (o->augment) {
            hs_dataset_free(*train);
            hs_dataset_free(*test);
            *train = *test = NULL;
            return hs__cli_usage_error("--augment: the synthetic set has no spatial structure "
                                      "(crops and flips need images)");
        }
        return 0;
    }
    if ((err = hs_data_load(o->data, train, test)) < 0) {
        fprintf(stderr, "hearsay %s: %s\n", hs__cli_cmd, hs_error_message());
        return -HS_EXIT_USAGE;
    }
    if (!o->quiet) hs__runopts_print_data(*train);
    if ((err = hs_dataset_keep(train, (size_t)o->subset, o->seed, 1)) < 0 ||
        (err = hs_dataset_keep(test, (size_t)o->test_subset, o->seed, 0)) < 0)
        goto fail;
    return 0;
fail:
    fprintf(stderr, "hearsay %s: %s\n", hs__cli_cmd, hs_error_message());
    hs_dataset_free(*train);
    hs_dataset_free(*test);
    *train = *test = NULL;
    return -HS_EXIT_FAIL;
}

long hs__runopts_rounds(const hs_runopts *o, size_t shard_n) {
    if (o->rounds > 0) return o->rounds;
    double steps = ceil((double)shard_n / o->batch) * o->epochs;
    long r = (long)ceil(steps / o->local_steps);
    return r > 0 ? r : 1;
}

int hs__runopts_trainer_cfg(const hs_runopts *o, const hs_dataset *train, long rounds,
                           hs_trainer_cfg *out) {
    memset(out, 0, sizeof(*out));
    if (hs_model_spec_parse(&out->model, o->model, o->hidden, train->channels, train->height,
                            train->width, train->classes) < 0)
        return hs__cli_usage_error("%s", hs_error_message());
    out->optim = o->optim;
    out->optim.total_steps = rounds * o->local_steps;
    if (!o->warmup_set)
        out->optim.warmup_steps = hs_model_default_warmup(&out->model, out->optim.total_steps);
    if (!o->step_size_set && out->optim.step_size == 0)
        out->optim.step_size = out->optim.total_steps / 3 > 0 ? out->optim.total_steps / 3 : 1;
    out->batch = o->batch;
    out->local_steps = o->local_steps;
    out->outer = o->outer;
    out->seed = o->seed;
    out->augment = o->augment;
    return 0;
}

int hs__runopts_slowdown(const char *s, int n, double *out) {
    for (int i = 0; i < n; i++) out[i] = 1.0;
    if (!s) return 0;
    if (!strchr(s, ':')) {
        double f;
        if (hs__cli_double("--slowdown", s, 1.0, 1e6, &f) < 0) return -HS_EXIT_USAGE;
        out[0] = f;
        return 0;
    }
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", s);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        char *colon = strchr(tok, ':');
        int peer;
        double f;
        if (!colon) return hs__cli_usage_error("--slowdown '%s': '%s' is not PEER:FACTOR", s, tok);
        *colon = '\0';
        if (hs__cli_int("--slowdown peer", tok, 0, n - 1, &peer) < 0 ||
            hs__cli_double("--slowdown factor", colon + 1, 1.0, 1e6, &f) < 0)
            return -HS_EXIT_USAGE;
        out[peer] = f;
    }
    return 0;
}


int hs__cli_open_backend(hs_device device, int device_id, int threads, hs_precision p,
                         hs_backend **be) {
    hs_backend_cfg bcfg = {threads, device_id};
    *be = NULL;
    if (hs_backend_open(be, device, &bcfg) < 0 || hs_backend_set_precision(*be, p) < 0) {
        fprintf(stderr, "hearsay %s: %s\n", hs__cli_cmd, hs_error_message());
        hs_backend_close(*be);
        *be = NULL;
        return -HS_EXIT_USAGE;
    }
    return 0;
}

int hs__runopts_open(const hs_runopts *o, hs_backend **be, hs_dataset **train, hs_dataset **test) {
    int rc = hs__cli_open_backend(o->device, o->device_id, o->threads, o->precision, be);
    if (rc < 0) return rc;
    rc = hs__runopts_load_data(o, train, test);
    if (rc < 0) {
        hs_backend_close(*be);
        *be = NULL;
    }
    return rc;
}

void hs__runopts_guard_cfg(const hs_runopts *o, long rounds_per_epoch, hs_guard_cfg *out) {
    memset(out, 0, sizeof(*out));
    out->policy = o->on_divergence;
    out->algo = o->algo.kind;
    out->compress = o->algo.compress ? o->algo.compress : o->compress;
    out->gamma_c = o->algo.gamma_c;
    out->lr = o->optim.lr;
    /* A quarter epoch (the scale on which the measured diverging runs grew 1.3-1.6x), at
     * least 5 rounds so that a window averages out a round's noise; the warm-up (the peers
     * drifting apart from their common start) is the guard's default, four windows. */
    out->window = rounds_per_epoch / 4 > 5 ? rounds_per_epoch / 4 : 5;
}
