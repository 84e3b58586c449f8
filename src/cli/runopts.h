/* The options `hearsay sim`, `hearsay run` and `hearsay launch` share (algorithm, compression,
 * topology, data, optimizer, output), their defaults, parsing and validation, and the loading
 * of the data they describe. One table, so the three commands' --help agree. */
#ifndef HS_CLI_RUNOPTS_H
#define HS_CLI_RUNOPTS_H

#include "cli/cli.h"
#include "hearsay/algo.h"
#include "hearsay/data.h"
#include "hearsay/guard.h"
#include "hearsay/model.h"
#include "hearsay/tensor.h"
#include "hearsay/trainer.h"

typedef struct hs_runopts {
    /* data and model */
    const char *data;
    int synthetic;
    int augment;
    long subset, test_subset;
    const char *hidden;
    int hidden_set;    /* --hidden given: refused unless the model is the plain mlp */
    const char *model; /* --model; NULL: the MLP of --hidden */
    /* training */
    double epochs;
    long rounds; /* overrides epochs when > 0 */
    int batch;
    hs_optim_cfg optim;
    int step_size_set;
    int lr_set;
    int warmup_set; /* --warmup given: no model-dependent default */
    unsigned long long seed;
    int threads;
    hs_device device;
    int device_id; /* N of --device cuda:N */
    hs_precision precision; /* --precision */
    /* algorithm */
    hs_algo_cfg algo;
    char compress[96];
    int gamma_c_set;
    int staleness_set;     /* --staleness given: else the algorithm's default */
    int local_steps;
    hs_outer_cfg outer; /* --outer-lr / --outer-momentum (on when either is given) */
    const char *topology;
    hs_partition partition;
    const char *partition_spec;
    const char *slowdown;
    /* output */
    const char *metrics;
    long eval_every; /* rounds; 0 = once per epoch */
    int quiet;
    hs_guard_policy on_divergence;
} hs_runopts;

/* Keys of the shared options (>= 512; commands use 256..511 for their own). */
enum {
    RO_DATA = 512,
    RO_SYNTHETIC,
    RO_SUBSET,
    RO_TEST_SUBSET,
    RO_HIDDEN,
    RO_EPOCHS,
    RO_ROUNDS,
    RO_BATCH,
    RO_LR,
    RO_MOMENTUM,
    RO_NESTEROV,
    RO_WD,
    RO_SCHED,
    RO_WARMUP,
    RO_SEED,
    RO_THREADS,
    RO_DEVICE,
    RO_ALGO,
    RO_COMPRESS,
    RO_GAMMA_C,
    RO_LOCAL_STEPS,
    RO_TOPOLOGY,
    RO_PARTITION,
    RO_SLOWDOWN,
    RO_STALENESS,
    RO_RECV_TIMEOUT,
    RO_METRICS,
    RO_EVAL_EVERY,
    RO_QUIET,
    RO_CONFIG,
    RO_AUGMENT,
    RO_OPTIMIZER,
    RO_ON_DIVERGENCE,
    RO_MODEL,
    RO_MOMENTUM_KIND,
    RO_OUTER_LR,
    RO_OUTER_MOMENTUM,
    RO_PRECISION,
};

/* --precision's help, shared by train and the decentralized commands. */
#define HS_PRECISION_HELP                                                                          \
    "GEMM arithmetic on --device cuda: fp32, tf32 (tensor cores) or bf16 (BF16 inputs, FP32\n"   \
    "                               sums; parameters, gradients and gossip stay FP32); the CPU\n"  \
    "                               has fp32 only (default: fp32)"


extern const hs_cli_opt hs_runopts_table[];
/* The options of `hearsay run` alone (network, security, sharding, checkpoints). */
extern const hs_cli_opt hs_run_opts_table[];

void hs__runopts_default(hs_runopts *o);

/* Handles one shared option; returns 1 when key is not one of them. */
int hs__runopts_handle(hs_runopts *o, int key, const char *v);

/* After hs__runopts_finish: the CHOCO consensus step a job of n peers (n <= 1: not known) with a
 * model of d parameters will use, the value hs_algo_new resolves. For an automatic step it also
 * sets o->algo.gap to the topology's spectral gap at n peers (a topology file: at its own size),
 * so every peer given the same options computes the same float. why gets a sentence saying how
 * the value was chosen. 0 when the algorithm is not CHOCO (or the compressor fails at d). */
float hs__runopts_choco_step(hs_runopts *o, int n, size_t d, char *why, size_t why_len);

/* Checks combinations and fills derived values (the compressor in algo, gamma_c). Prints the
 * problem and returns -HS_EXIT_USAGE. */
int hs__runopts_finish(hs_runopts *o);
/* -HS_EXIT_USAGE (printed) when --hidden was given for a model other than the plain mlp (model
 * NULL is the mlp); hearsay train shares it. */
int hs__runopts_check_hidden(const char *model, int hidden_set);

/* Loads the training and test sets the options describe (an image set as hs_data_load finds it,
 * or synthetic, with the subsets) and prints the normalisation unless quiet. Prints the problem
 * and returns -HS_EXIT_USAGE or -HS_EXIT_FAIL. */
/* One line: the set's size, shape, classes and per-channel normalisation (the numbers every
 * peer must agree on). */
void hs__runopts_print_data(const hs_dataset *ds);
int hs__runopts_load_data(const hs_runopts *o, hs_dataset **train, hs_dataset **test);

/* Opens the backend (at --precision) and loads the data the options describe; prints the
 * problem and returns -HS_EXIT_USAGE (bad device or precision, missing dataset) or
 * -HS_EXIT_FAIL. */
int hs__runopts_open(const hs_runopts *o, hs_backend **be, hs_dataset **train, hs_dataset **test);

/* Opens the backend of device / device_id with `threads` at precision p, or prints why not
 * (prefixed "hearsay CMD: ") and returns -HS_EXIT_USAGE. train shares it. */
int hs__cli_open_backend(hs_device device, int device_id, int threads, hs_precision p,
                         hs_backend **be);

/* The trainer configuration for the model of --model resolved for train's example shape and
 * classes, and `rounds` rounds in total (for the learning-rate schedule). */
int hs__runopts_trainer_cfg(const hs_runopts *o, const hs_dataset *train, long rounds,
                           hs_trainer_cfg *out);

/* Per-peer slowdown factors from --slowdown for n peers: "F" slows peer 0, "I:F,J:G" peers I
 * and J; the others get 1. NULL gives all 1. Prints the problem and returns -HS_EXIT_USAGE. */
int hs__runopts_slowdown(const char *s, int n, double *out);

/* The convergence guard's configuration for these options, with growth windows of a quarter
 * of `rounds_per_epoch`. */
void hs__runopts_guard_cfg(const hs_runopts *o, long rounds_per_epoch, hs_guard_cfg *out);

/* Rounds for o->epochs passes over a shard of `shard_n` examples (or o->rounds). */
long hs__runopts_rounds(const hs_runopts *o, size_t shard_n);

#endif
