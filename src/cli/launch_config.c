/* runs/NAME/config.json is the resolved configuration of a launch: every option with the value
 * it had, defaults included, under the option's own name, so that `hearsay launch --config
 * runs/NAME/config.json` is the same run (the file used to list the peers' raw flags under
 * "peer_args", which --config refused, and said "auto" for values a flag cannot take). */
#include "cli/launch_config.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hearsay/data.h"
#include "hearsay/model.h"
#include "node/node_internal.h"

static const char *sched_name(hs_lr_sched s) {
    return s == HS_LR_CONST ? "const" : s == HS_LR_STEP ? "step" : "cosine";
}

/* A float as the shortest decimal that reads back to the same float. */
static void add_float(cJSON *o, const char *k, float v) {
    char b[32];
    for (int p = 6; p <= 9; p++) {
        snprintf(b, sizeof(b), "%.*g", p, (double)v);
        if (strtof(b, NULL) == v) break;
    }
    cJSON_AddRawToObject(o, k, b);
}

/* The automatic consensus step the peers will compute, when the model's size is known without
 * reading the data (the synthetic set, or the default Fashion-MNIST); 0 otherwise. */
static float auto_gamma_c(const hs_runopts *ro, int job_n) {
    if (ro->data) return 0;
    /* The shapes of hs_dataset_synthetic (784 features, 10 classes) and of Fashion-MNIST. */
    hs_model_spec spec;
    int h = ro->synthetic ? 1 : 28, w = ro->synthetic ? 784 : 28;
    if (hs_model_spec_parse(&spec, ro->model, ro->hidden, 1, h, w, 10) < 0) return 0;
    hs_algo_cfg ac = ro->algo;
    char why[320];
    return hs__node_auto_gamma_c(&ac, ro->topology, job_n, hs_model_spec_nparams(&spec),
                                 ro->seed, why, sizeof(why));
}

/* The value of a shared option when it was not given: from the resolved options. Returns 0
 * when it was added, 1 when the option has no value to write (left out: the same run). */
static int add_default(cJSON *o, const hs_cli_opt *opt, const hs_runopts *ro,
                       const hs_launch_resolved *lr) {
    const char *k = opt->name;
    const hs_optim_cfg *op = &ro->optim;
    switch (opt->key) {
    case RO_ALGO: cJSON_AddStringToObject(o, k, hs_algo_kind_name(ro->algo.kind)); return 0;
    case RO_COMPRESS: cJSON_AddStringToObject(o, k, ro->compress); return 0;
    case RO_GAMMA_C: {
        if (!hs_algo_kind_uses_gamma_c(ro->algo.kind)) return 1;
        float g = ro->gamma_c_set ? ro->algo.gamma_c : auto_gamma_c(ro, lr->job_n);
        if (!(g > 0)) return 1;
        add_float(o, k, g);
        return 0;
    }
    case RO_LOCAL_STEPS: cJSON_AddNumberToObject(o, k, ro->local_steps); return 0;
    case RO_TOPOLOGY: cJSON_AddStringToObject(o, k, ro->topology); return 0;
    case RO_PARTITION: cJSON_AddStringToObject(o, k, ro->partition_spec); return 0;
    case RO_STALENESS:
        if (hs_algo_kind_synchronous(ro->algo.kind)) return 1; /* sgp only */
        cJSON_AddNumberToObject(o, k, ro->algo.staleness);
        return 0;
    case RO_RECV_TIMEOUT: cJSON_AddNumberToObject(o, k, ro->algo.recv_timeout_ms); return 0;
    case RO_DATA:
        if (ro->synthetic) return 1;
        cJSON_AddStringToObject(o, k, ro->data ? ro->data : HS_DATA_DEFAULT_DIR);
        return 0;
    case RO_SYNTHETIC: cJSON_AddBoolToObject(o, k, ro->synthetic); return 0;
    case RO_AUGMENT: cJSON_AddBoolToObject(o, k, ro->augment); return 0;
    case RO_MODEL: cJSON_AddStringToObject(o, k, ro->model ? ro->model : "mlp"); return 0;
    case RO_HIDDEN:
        if (ro->model && strcmp(ro->model, "mlp") != 0) return 1;
        cJSON_AddStringToObject(o, k, ro->hidden);
        return 0;
    case RO_EPOCHS:
        if (ro->rounds > 0) return 1;
        cJSON_AddNumberToObject(o, k, ro->epochs);
        return 0;
    case RO_BATCH: cJSON_AddNumberToObject(o, k, ro->batch); return 0;
    case RO_OPTIMIZER: cJSON_AddStringToObject(o, k, hs_optim_kind_name(op->kind)); return 0;
    case RO_LR: add_float(o, k, op->lr); return 0;
    case RO_MOMENTUM: add_float(o, k, op->momentum); return 0;
    case RO_NESTEROV: cJSON_AddBoolToObject(o, k, op->nesterov); return 0;
    case RO_MOMENTUM_KIND:
        cJSON_AddStringToObject(o, k, hs_momentum_kind_name(op->momentum_kind));
        return 0;
    case RO_WD: add_float(o, k, op->weight_decay); return 0;
    case RO_SCHED: cJSON_AddStringToObject(o, k, sched_name(op->sched)); return 0;
    case RO_SEED: {
        /* A string: a JSON number is a double, and seeds are 64 bits. */
        char b[32];
        snprintf(b, sizeof(b), "%llu", ro->seed);
        cJSON_AddStringToObject(o, k, b);
        return 0;
    }
    case RO_THREADS: cJSON_AddNumberToObject(o, k, ro->threads); return 0;
    case RO_DEVICE: {
        if (lr->devices) return 1; /* --devices cannot be combined with --device */
        char b[32];
        if (ro->device == HS_DEVICE_CPU) snprintf(b, sizeof(b), "cpu");
        else snprintf(b, sizeof(b), "%s:%d", hs_device_name(ro->device), ro->device_id);
        cJSON_AddStringToObject(o, k, b);
        return 0;
    }
    case RO_OUTER_LR:
    case RO_OUTER_MOMENTUM:
        /* Off unless one of them was given; writing either would turn the outer step on. A
         * value not given (NaN) is left to the node, which fills it in as `run` does. */
        if (!ro->outer.on || isnan(opt->key == RO_OUTER_LR ? ro->outer.lr : ro->outer.momentum))
            return 1;
        add_float(o, k, opt->key == RO_OUTER_LR ? ro->outer.lr : ro->outer.momentum);
        return 0;
    case RO_ON_DIVERGENCE:
        cJSON_AddStringToObject(o, k, hs_guard_policy_name(ro->on_divergence));
        return 0;
    }
    return 1;
}

/* The value of one of `hearsay run`'s own options or of launch's when not given. */
static int add_other_default(cJSON *o, const char *k, const hs_launch_resolved *lr) {
    hs__node_cfg dc;
    hs__node_cfg_defaults(&dc);
    const hs_net_config *n = &dc.net;
    struct {
        const char *name;
        double v;
    } nums[] = {
        {"peers", lr->n},
        {"refresh", lr->refresh},
        {"max-frame", (double)n->max_frame},
        {"peer-timeout", n->peer_timeout_ms},
        {"join-timeout", n->join_timeout_ms},
        {"handshake-timeout", n->handshake_timeout_ms},
        {"max-pending", n->max_conns},
        {"checkpoint-every", (double)dc.checkpoint_every},
    };
    for (size_t i = 0; i < sizeof(nums) / sizeof(nums[0]); i++)
        if (!strcmp(k, nums[i].name)) {
            if (!(nums[i].v > 0)) return 1;
            cJSON_AddNumberToObject(o, k, nums[i].v);
            return 0;
        }
    if (!strcmp(k, "runs-dir")) {
        cJSON_AddStringToObject(o, k, lr->runs_dir);
        return 0;
    }
    if (!strcmp(k, "no-plot") || !strcmp(k, "insecure")) {
        cJSON_AddBoolToObject(o, k, !strcmp(k, "no-plot") && lr->no_plot);
        return 0;
    }
    /* No default (secret, certificates, emulation, checkpoints, --save, stragglers, devices),
     * or per peer: left out. --max-pending-per-addr is the launcher's own choice per size. */
    return 1;
}

/* A given value in the JSON type the option reads back: switches as true, numbers as
 * numbers, the rest as strings. */
static void add_given(cJSON *o, const hs_cli_opt *opt, const char *v) {
    if (!opt->arg) {
        cJSON_AddBoolToObject(o, opt->name, 1);
        return;
    }
    char *end;
    strtod(v, &end);
    int number = *v && !*end && strcmp(opt->name, "hidden") != 0 && strcmp(opt->name, "seed") != 0;
    if (number) cJSON_AddRawToObject(o, opt->name, v);
    else cJSON_AddStringToObject(o, opt->name, v);
}

int hs__launch_write_config(const char *path, const hs_cli_opt *const *tables,
                           const hs_runopts *ro, const hs_launch_resolved *lr,
                           const hs_launch_given *given, int n_given) {
    cJSON *o = cJSON_CreateObject();
    if (!o) {
        errno = ENOMEM;
        return -1;
    }
    for (int t = 0; tables[t]; t++)
        for (const hs_cli_opt *opt = tables[t]; opt->name; opt++) {
            if (!strcmp(opt->name, "config") || !strcmp(opt->name, "name") ||
                cJSON_GetObjectItemCaseSensitive(o, opt->name))
                continue;
            const hs_launch_given *g = NULL;
            for (int i = 0; i < n_given; i++)
                if (!strcmp(given[i].name, opt->name)) g = &given[i];
            /* The values a peer resolves from others are written resolved, whatever was given
             * (a topology or compressor defaulted from the algorithm). */
            if (g && opt->key != RO_COMPRESS && opt->key != RO_TOPOLOGY)
                add_given(o, opt, g->value);
            else if (opt->key >= RO_DATA && add_default(o, opt, ro, lr) == 0)
                continue;
            else if (!g && opt->key < RO_DATA)
                add_other_default(o, opt->name, lr);
        }
    char *s = cJSON_Print(o);
    cJSON_Delete(o);
    FILE *f = s ? fopen(path, "w") : NULL;
    int ok = f && fprintf(f, "%s\n", s) > 0;
    if (f && fclose(f) != 0) ok = 0;
    free(s);
    return ok ? 0 : -1;
}
