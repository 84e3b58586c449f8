/* A simulated job from its first round to its end: the simulator's rounds, the convergence
 * guard over the exact consensus of all peers, the test evaluations and the job's metrics
 * record (docs/METRICS.md), so that `hearsay sim` only parses options and prints. */
#ifndef HS_SIM_JOB_H
#define HS_SIM_JOB_H

#include "hearsay/guard.h"
#include "hearsay/metrics.h"
#include "hearsay/sim.h"

typedef struct hs__sim_job_cfg {
    long rounds;      /* rounds of a normal-speed peer the job runs */
    long rpe;         /* rounds per epoch */
    int local_steps;  /* per round (DDP's steps for the same job) */
    long eval_every;  /* rounds between test evaluations */
    const hs_dataset *test;
    hs_guard_cfg guard;
    hs_metrics_file *metrics; /* NULL: none; borrowed */
    /* Progress: each evaluated round's record, the guard's warnings (--on-divergence warn),
     * and whether to stop after the current round (Ctrl-C). Any may be NULL. */
    void (*on_record)(void *ctx, const hs_metrics_rec *rec);
    void (*on_warning)(void *ctx, double round, const char *reason, const char *advice);
    int (*interrupted)(void);
    double (*now)(void); /* wall clock in seconds */
    void *ctx;
} hs__sim_job_cfg;

typedef struct hs__sim_job_result {
    int stopped, diverged;
    double diverged_round;
    char reason[400], advice[400];
    double acc_mean, acc_min, acc_max, consensus;
    uint64_t rounds_min, rounds_max;
    double sent_per_peer;     /* bytes, mean over the peers */
    double time_s;            /* wall clock from the first round */
    double step_time_s;       /* in the rounds only: training and gossip, not evaluation */
    /* With links (hs__sim_set_links), else NaN: the virtual time reached, DDP's modelled time
     * for the job's steps, and one of its all-reduces. */
    double vtime_s, ddp_vtime_s, ddp_allreduce_s;
} hs__sim_job_result;

/* Runs sim until cfg->rounds, an interruption or a divergence (res says which; the guard's
 * verdict also ends the metrics file with a "diverged" record, the others with "done" or
 * "interrupted"). Returns 0 or a negative HS_E* for a failure that is not the run's own. */
int hs__sim_job_run(hs_sim *sim, const hs__sim_job_cfg *cfg, hs__sim_job_result *res);

#endif
