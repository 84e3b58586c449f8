/* hearsay train: one peer alone, the single-node baseline every decentralized run is compared
 * with. Loads the data, trains the model (--model) with SGD or AdamW through a trainer with no
 * neighbours, whose rounds the round engine runs (train/round.h: the same phases and local-step
 * loop as sim and run; no gossip, and a round's local steps are those up to the next report),
 * evaluates on the test set, prints progress and writes JSON-lines metrics. Ctrl-C stops after
 * the current step (on a device, after the steps queued up to the next report) and still prints
 * the summary. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/precheck.h"
#include "cli/runopts.h"
#include "core/rng.h"
#include "hearsay/data.h"
#include "hearsay/error.h"
#include "hearsay/model.h"
#include "hearsay/tensor.h"
#include "hearsay/metrics.h"
#include "hearsay/trainer.h"
#include "train/round.h"
#include "hs_config.h"

enum {
    O_DATA = 256,
    O_EPOCHS,
    O_BATCH,
    O_LR,
    O_MOMENTUM,
    O_NESTEROV,
    O_WD,
    O_SCHED,
    O_WARMUP,
    O_STEP_SIZE,
    O_STEP_GAMMA,
    O_HIDDEN,
    O_SEED,
    O_THREADS,
    O_DEVICE,
    O_METRICS,
    O_EVAL_EVERY,
    O_NO_EVAL,
    O_SUBSET,
    O_TEST_SUBSET,
    O_SYNTHETIC,
    O_MAX_STEPS,
    O_LOG_EVERY,
    O_QUIET,
    O_SAVE,
    O_AUGMENT,
    O_OPTIMIZER,
    O_MODEL,
    O_PRECISION,
};

static const hs_cli_opt train_opts[] = {
    {"data", O_DATA, "DIR", "image set: IDX files or CIFAR-10 binary batches (default: "
                            "Fashion-MNIST in " HS_DATA_DEFAULT_DIR ")"},
    {"synthetic", O_SYNTHETIC, NULL, "train on a synthetic Gaussian-cluster set instead"},
    {"augment", O_AUGMENT, NULL, "seeded random crops (4-pixel padding) and horizontal flips"},
    {"epochs", O_EPOCHS, "N", "passes over the training set (default: 10)"},
    {"batch", O_BATCH, "N", "examples per step (default: 128)"},
    {"optimizer", O_OPTIMIZER, "O", "sgd or adamw (default: sgd)"},
    {"lr", O_LR, "F", "peak learning rate (default: 0.05 for sgd, 0.001 for adamw)"},
    {"momentum", O_MOMENTUM, "F", "sgd momentum in [0, 1) (default: 0.9)"},
    {"nesterov", O_NESTEROV, NULL, "Nesterov momentum instead of heavy ball"},
    {"weight-decay", O_WD, "F", "weight decay, L2 for sgd, decoupled for adamw (default: 0.0001)"},
    {"lr-schedule", O_SCHED, "S", "const, cosine or step (default: cosine)"},
    {"warmup", O_WARMUP, "N", "linear warm-up steps (default: 0 for mlp, a tenth of the steps "
                              "for other models)"},
    {"step-size", O_STEP_SIZE, "N", "steps between decays of the step schedule (default: 1 epoch)"},
    {"step-gamma", O_STEP_GAMMA, "F", "decay factor of the step schedule (default: 0.1)"},
    {"model", O_MODEL, "M", "mlp, mlp:W-W-..-W, cnn-small, resnet20 or FILE.json (default: mlp)"},
    {"hidden", O_HIDDEN, "W,W", "hidden layer widths of --model mlp (default: 256,128)"},
    {"seed", O_SEED, "N", "seed of initialisation and shuffling (default: 1)"},
    {"threads", O_THREADS, "N", "CPU threads; above 1, each batch is split into N parts "
                              "computed at once (default: 1)"},
    {"device", O_DEVICE, "D", "cpu, cuda or cuda:N, the CUDA device numbered N (default: cpu)"},
    {"precision", O_PRECISION, "P", HS_PRECISION_HELP},
    {"metrics", O_METRICS, "FILE", "write JSON-lines metrics to FILE"},
    {"eval-every", O_EVAL_EVERY, "N", "evaluate every N steps (default: at each epoch's end)"},
    {"no-eval", O_NO_EVAL, NULL, "skip evaluation until the end (for timing)"},
    {"subset", O_SUBSET, "N", "train on a seeded subset of N examples"},
    {"test-subset", O_TEST_SUBSET, "N", "evaluate on the first N test examples"},
    {"max-steps", O_MAX_STEPS, "N", "stop after N steps"},
    {"log-every", O_LOG_EVERY, "N", "progress line every N steps when not a terminal (default: 100)"},
    {"save", O_SAVE, "FILE", "write the final parameters to FILE (raw little-endian float32)"},
    {"quiet", O_QUIET, NULL, "print only the final line"},
    {NULL, 0, NULL, NULL},
};

typedef struct train_args {
    const char *data, *metrics, *save, *hidden, *model;
    int synthetic, epochs, batch, threads, no_eval, quiet, log_every, augment, lr_set;
    long eval_every, subset, test_subset, max_steps;
    unsigned long long seed;
    hs_device device;
    int device_id; /* N of --device cuda:N */
    hs_precision precision;
    hs_optim_cfg opt;
    int step_size_set, warmup_set;
} train_args;

/* The trainer as the engine's owner, with rounds of n local steps (the steps up to the next
 * report) rather than its local_steps. */
typedef struct local_ctx {
    hs_trainer *t;
    int n;
} local_ctx;

static int local_of(void *c, uint64_t r, hs_round_stats *st) {
    (void)r;
    local_ctx *lc = c;
    return hs_trainer_local_n(lc->t, lc->n, st);
}
static int open_of(void *c, uint64_t r) {
    (void)r;
    return hs_trainer_round_open(((local_ctx *)c)->t);
}
static int close_of(void *c, uint64_t r) {
    (void)r;
    return hs_trainer_round_close(((local_ctx *)c)->t);
}

static int handle(void *ctx, int key, const char *v) {
    train_args *a = ctx;
    switch (key) {
    case O_DATA: a->data = v; return 0;
    case O_SYNTHETIC: a->synthetic = 1; return 0;
    case O_EPOCHS: return hs__cli_int("--epochs", v, 1, 100000, &a->epochs);
    case O_BATCH: return hs__cli_int("--batch", v, 1, 1 << 16, &a->batch);
    case O_LR: a->lr_set = 1; return hs__cli_float("--lr", v, 0.0, 100.0, &a->opt.lr);
    case O_AUGMENT: a->augment = 1; return 0;
    case O_OPTIMIZER:
        if (hs_optim_kind_parse(v, &a->opt.kind) < 0)
            return hs__cli_usage_error("%s", hs_error_message());
        return 0;
    case O_MOMENTUM: return hs__cli_float("--momentum", v, 0.0, 0.9999, &a->opt.momentum);
    case O_NESTEROV: a->opt.nesterov = 1; return 0;
    case O_WD: return hs__cli_float("--weight-decay", v, 0.0, 1.0, &a->opt.weight_decay);
    case O_SCHED:
        if (hs_lr_sched_parse(v, &a->opt.sched) < 0)
            return hs__cli_usage_error("%s", hs_error_message());
        return 0;
    case O_WARMUP:
        a->warmup_set = 1;
        return hs__cli_long("--warmup", v, 0, 1L << 40, &a->opt.warmup_steps);
    case O_STEP_SIZE:
        a->step_size_set = 1;
        return hs__cli_long("--step-size", v, 1, 1L << 40, &a->opt.step_size);
    case O_STEP_GAMMA: return hs__cli_float("--step-gamma", v, 0.0, 1.0, &a->opt.step_gamma);
    case O_HIDDEN: a->hidden = v; return 0;
    case O_MODEL: a->model = v; return 0;
    case O_SEED: return hs__cli_u64("--seed", v, &a->seed);
    case O_THREADS: return hs__cli_int("--threads", v, 1, 1024, &a->threads);
    case O_DEVICE:
        if (hs_device_parse_id(v, &a->device, &a->device_id) < 0)
            return hs__cli_usage_error("--device: %s", hs_error_message());
        return 0;
    case O_PRECISION:
        if (hs_precision_parse(v, &a->precision) < 0)
            return hs__cli_usage_error("--precision: %s", hs_error_message());
        return 0;
    case O_METRICS: a->metrics = v; return 0;
    case O_EVAL_EVERY: return hs__cli_long("--eval-every", v, 1, 1L << 40, &a->eval_every);
    case O_NO_EVAL: a->no_eval = 1; return 0;
    case O_SUBSET: return hs__cli_long("--subset", v, 1, 1L << 32, &a->subset);
    case O_TEST_SUBSET: return hs__cli_long("--test-subset", v, 1, 1L << 32, &a->test_subset);
    case O_MAX_STEPS: return hs__cli_long("--max-steps", v, 1, 1L << 40, &a->max_steps);
    case O_LOG_EVERY: return hs__cli_int("--log-every", v, 1, 1 << 30, &a->log_every);
    case O_SAVE: a->save = v; return 0;
    case O_QUIET: a->quiet = 1; return 0;
    }
    return hs__cli_usage_error("internal: unhandled option %d", key);
}


/* Reads the running loss (hs__lossacc_read), saying on stderr what stopped the run. */
/* Steps from `step` to the next one that reports (an epoch's end, a log or evaluation step, the
 * last): a device queues them and waits for their losses only there. */
static int steps_to_report(long step, long total, long spe, long log_every, long eval_every) {
    long next = total;
    const long every[3] = {spe, log_every, eval_every};
    for (int i = 0; i < 3; i++) {
        long e = every[i] > 0 ? (step / every[i] + 1) * every[i] : total;
        if (e < next) next = e;
    }
    return next - step < (1L << 30) ? (int)(next - step) : 1 << 30;
}

int hs__cmd_train(int argc, char **argv) {
    train_args a;
    memset(&a, 0, sizeof(a));
    a.epochs = 10;
    a.batch = 128;
    a.threads = 1;
    a.seed = 1;
    a.log_every = 100;
    a.device = HS_DEVICE_CPU;
    hs_optim_cfg_default(&a.opt);
    a.opt.weight_decay = 1e-4f;
    const hs_cli_opt *tables[] = {train_opts, NULL};
    int rc = hs__cli_parse(argc, argv, "train", "[options]",
                          "Train one peer alone on an image set (Fashion-MNIST by default) or a "
                          "synthetic set: the single-node baseline.",
                          tables, handle, &a, NULL, 0, NULL);
    if (rc == 1) return HS_EXIT_OK;
    if (rc < 0) return -rc;
    if (a.synthetic && a.data)
        return -hs__cli_usage_error("--synthetic and --data exclude each other");
    if ((rc = hs__runopts_check_hidden(a.model, a.hidden != NULL)) < 0) return -rc;
    if ((rc = hs__cli_precheck(a.model, a.metrics, NULL, 0, a.seed)) < 0) return -rc;
    if (a.synthetic && a.augment)
        return -hs__cli_usage_error("--augment: the synthetic set has no spatial structure "
                                   "(crops and flips need images)");
    if (a.opt.kind == HS_OPTIM_ADAMW) {
        if (!a.lr_set) a.opt.lr = 1e-3f;
        if (a.opt.nesterov) return -hs__cli_usage_error("--nesterov applies to --optimizer sgd only");
    }

    hs__cli_install_signals();
    int exit_code = HS_EXIT_FAIL, err;
    hs_backend *be = NULL;
    hs_dataset *train = NULL, *test = NULL;
    hs_trainer *tr = NULL;
    hs_metrics_file *metrics = NULL;
    int tty = isatty(STDOUT_FILENO) && !a.quiet;

    if (hs__cli_open_backend(a.device, a.device_id, a.threads, a.precision, &be) < 0) {
        exit_code = HS_EXIT_USAGE;
        goto out;
    }
    if (a.synthetic) {
        hs_synth_cfg sc = {a.subset > 0 ? (size_t)a.subset : 20000, 784, 10, 6.0f, a.seed, 0};
        hs_synth_cfg tc = sc;
        tc.n = a.test_subset > 0 ? (size_t)a.test_subset : 5000;
        tc.split = 1;
        if ((err = hs_dataset_synthetic(&train, &sc)) < 0 ||
            (err = hs_dataset_synthetic(&test, &tc)) < 0) {
            fprintf(stderr, "hearsay train: %s\n", hs_error_message());
            goto out;
        }
    } else {
        if ((err = hs_data_load(a.data, &train, &test)) < 0) {
            fprintf(stderr, "hearsay train: %s\n", hs_error_message());
            exit_code = HS_EXIT_USAGE;
            goto out;
        }
        if (!a.quiet) hs__runopts_print_data(train);
        if ((err = hs_dataset_keep(&train, (size_t)a.subset, a.seed, 1)) < 0 ||
            (err = hs_dataset_keep(&test, (size_t)a.test_subset, a.seed, 0)) < 0) {
            fprintf(stderr, "hearsay train: subset: %s\n", hs_error_message());
            goto out;
        }
    }
    hs_model_spec mspec;
    if ((err = hs_model_spec_parse(&mspec, a.model, a.hidden, train->channels, train->height,
                                   train->width, train->classes)) < 0) {
        fprintf(stderr, "hearsay train: %s\n", hs_error_message());
        exit_code = HS_EXIT_USAGE;
        goto out;
    }
    /* Every example once per epoch, the last batch short (the trainer's batcher says so too). */
    long spe = (long)((train->n + (size_t)a.batch - 1) / (size_t)a.batch);
    long total = spe * a.epochs;
    if (a.max_steps > 0 && a.max_steps < total) total = a.max_steps;
    a.opt.total_steps = spe * a.epochs;
    if (!a.warmup_set) a.opt.warmup_steps = hs_model_default_warmup(&mspec, a.opt.total_steps);
    if (!a.step_size_set) a.opt.step_size = spe;
    hs_trainer_cfg tc;
    memset(&tc, 0, sizeof(tc));
    tc.model = mspec;
    tc.optim = a.opt;
    tc.batch = a.batch;
    tc.local_steps = 1;
    tc.seed = a.seed;
    tc.augment = a.augment;
    if ((err = hs_trainer_new(&tr, be, &tc, train, NULL, 0)) < 0) {
        fprintf(stderr, "hearsay train: %s\n", hs_error_message());
        if (err == HS_ENOTSUP || err == HS_EINVAL) exit_code = HS_EXIT_USAGE;
        goto out;
    }
    if (hs_trainer_steps_per_epoch(tr) != spe) {
        fprintf(stderr, "hearsay train: internal: %ld steps per epoch, the batcher has %ld\n", spe,
                hs_trainer_steps_per_epoch(tr));
        goto out;
    }
    if (a.metrics && (err = hs_metrics_open(&metrics, a.metrics, 0)) < 0) {
        fprintf(stderr, "hearsay train: %s\n", hs_error_message());
        exit_code = HS_EXIT_USAGE;
        goto out;
    }
    char arch[128];
    hs_model_spec_format(&mspec, arch, sizeof(arch));
    if (!a.quiet)
        printf("hearsay train: %s, %zu parameters, %s; %zu training / %zu test examples of "
               "%dx%dx%d, %d classes; %d epochs of %ld steps, batch %d, %s%s\n",
               arch, hs_trainer_dim(tr), be->description, train->n, test->n,
               train->channels, train->height, train->width, train->classes, a.epochs, spe,
               a.batch, hs_optim_kind_name(a.opt.kind), a.augment ? ", augmented" : "");
    fflush(stdout);

    /* A round of this engine is the steps up to the next report (local_of). */
    local_ctx lc = {tr, 1};
    hs__round_model rm = {&lc, NULL, NULL, open_of, local_of, close_of, NULL};
    hs__round eng;
    hs__round_init(&eng, &rm, NULL, 0);
    double t_train = 0, t_last_print = 0;
    long samples = 0, step = 0;
    double loss_sum = 0; /* the running loss: a sum over the steps since the last restart */
    long loss_n = 0;
    double test_loss = NAN, test_acc = NAN;
    int stopped = 0;
    while (step < total) {
        if (hs__cli_interrupted()) {
            stopped = 1;
            break;
        }
        double t0 = hs__cli_now();
        /* One step at a time on the host (its losses are read at once anyway); on a device the
         * steps up to the next report, which wait for their losses only at their end. */
        int n = lc.n = be->host_memory ? 1 : steps_to_report(step, total, spe, a.log_every,
                                                              a.eval_every);
        const hs_round_stats *sp = &eng.st;
        if ((err = hs__round_run(&eng, HS__PH_OPEN)) < 0) {
            if (err == HS_EDIVERGED)
                fprintf(stderr, "hearsay train: %s: training diverged (lower --lr)\n",
                        hs_error_message());
            else
                fprintf(stderr, "hearsay train: step %ld: %s\n", step, hs_error_message());
            goto out;
        }
        double t1 = hs__cli_now();
        t_train += t1 - t0;
        samples += sp->samples;
        step += n;
        loss_sum += sp->loss * n;
        loss_n += n;
        float lr = sp->lr;
        int epoch_end = step % spe == 0;
        int do_eval = !a.no_eval && (a.eval_every > 0 ? step % a.eval_every == 0 : epoch_end);
        int write_now = metrics && (do_eval || step % a.log_every == 0 || epoch_end);
        int print_now = tty ? (t1 - t_last_print > 0.25 || do_eval)
                            : (!a.quiet && (step % a.log_every == 0 || do_eval));
        /* The running loss restarts with each epoch and evaluation. */
        double loss = loss_sum / (double)loss_n;
        if (epoch_end || do_eval) loss_sum = 0, loss_n = 0;
        if (do_eval) {
            if ((err = hs_trainer_evaluate(tr, test, &test_loss, &test_acc)) < 0) {
                fprintf(stderr, "hearsay train: evaluate: %s\n", hs_error_message());
                goto out;
            }
        }
        /* The one source of the metrics line and the progress line (docs/METRICS.md). */
        hs_metrics_rec rec;
        hs_metrics_init(&rec);
        hs_metrics_set(&rec, HS_MF_STEP, (double)step);
        hs_metrics_set(&rec, HS_MF_EPOCH, (double)step / spe);
        hs_metrics_set(&rec, HS_MF_LOSS, loss);
        hs_metrics_set(&rec, HS_MF_LR, lr);
        hs_metrics_set(&rec, HS_MF_SAMPLES_PER_S, t_train > 0 ? samples / t_train : 0);
        hs_metrics_set(&rec, HS_MF_TRAIN_TIME, t_train);
        if (do_eval) {
            hs_metrics_set(&rec, HS_MF_TEST_LOSS, test_loss);
            hs_metrics_set(&rec, HS_MF_TEST_ACC, test_acc);
        }
        if (write_now && (err = hs_metrics_write(metrics, &rec)) < 0) {
            fprintf(stderr, "hearsay train: %s\n", hs_error_message());
            goto out;
        }
        if (print_now) {
            char accs[32] = "";
            if (!isnan(test_acc)) snprintf(accs, sizeof(accs), "  test acc %.2f%%", 100 * test_acc);
            printf("%sepoch %ld/%d  step %ld/%ld  loss %.4f%s  %.0f samples/s%s", tty ? "\r\033[K" : "",
                   (step - 1) / spe + 1, a.epochs, step, total, hs_metrics_get(&rec, HS_MF_LOSS),
                   accs, hs_metrics_get(&rec, HS_MF_SAMPLES_PER_S), tty ? "" : "\n");
            if (tty && do_eval) printf("\n");
            fflush(stdout);
            t_last_print = t1;
        }
    }
    if (tty) printf("\n");
    /* The final line always reports a fresh evaluation of the final parameters. */
    if ((err = hs_trainer_evaluate(tr, test, &test_loss, &test_acc)) < 0) {
        fprintf(stderr, "hearsay train: evaluate: %s\n", hs_error_message());
        goto out;
    }
    hs_metrics_rec rec;
    hs_metrics_init(&rec);
    hs_metrics_set_str(&rec, HS_MF_EVENT, stopped ? "interrupted" : "done");
    hs_metrics_set(&rec, HS_MF_STEP, (double)step);
    hs_metrics_set(&rec, HS_MF_EPOCH, (double)step / spe);
    hs_metrics_set(&rec, HS_MF_TEST_LOSS, test_loss);
    hs_metrics_set(&rec, HS_MF_TEST_ACC, test_acc);
    hs_metrics_set(&rec, HS_MF_SAMPLES_PER_S, t_train > 0 ? samples / t_train : 0);
    hs_metrics_set(&rec, HS_MF_TRAIN_TIME, t_train);
    if (metrics && hs_metrics_write(metrics, &rec) < 0)
        fprintf(stderr, "hearsay train: %s\n", hs_error_message());
    if (a.save && (err = hs_trainer_write_params(tr, a.save)) < 0) {
        fprintf(stderr, "hearsay train: --save: %s\n", hs_error_message());
        goto out;
    }
    printf("%s: test accuracy %.2f%% (loss %.4f) after %ld steps (%.2f epochs), %.1f s training, "
           "%.0f samples/s\n",
           stopped ? "interrupted" : "final", 100 * test_acc, test_loss, step,
           hs_metrics_get(&rec, HS_MF_EPOCH), t_train, hs_metrics_get(&rec, HS_MF_SAMPLES_PER_S));
    fflush(stdout);
    exit_code = stopped ? HS_EXIT_SIGINT : HS_EXIT_OK;
out:
    hs_metrics_close(metrics);
    hs_trainer_free(tr);
    hs_dataset_free(train);
    hs_dataset_free(test);
    hs_backend_close(be);
    return exit_code;
}
