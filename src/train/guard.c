/* The convergence guard (see hearsay/guard.h): decides from a run's observations whether it
 * diverged, why, and which knob to turn. Pure computation, one thread.
 *
 * What the thresholds rest on (hearsay sim -n 8, ring, Fashion-MNIST, 10 epochs of 59 rounds,
 * top-1% CHOCO unless said; consensus as the exact mean squared distance per parameter,
 * geometric means over windows of 15 rounds):
 *  - gamma_c 0.4 diverges: the consensus distance grows 1.5x, 1.6x, 1.7x, 1.9x, 2.0x, 2.1x per
 *    30 rounds from round 35 on (2e-5 at round 35, 7e-4 at 215, 124 at 575); the test accuracy
 *    peaks at 85% near round 125 and falls below half of that after round 380; the training
 *    loss leaves its minimum of 0.33 near round 215 and passes 1 at 275. The guard stops it at
 *    round 154 (83.7%). With 4 networked peers each peer's own estimate grows 2x per 20
 *    rounds; all four stop at round 232 (79-84%, best 85-86%).
 *  - gamma_c 0.3 grows 1.3x, 1.3x, 1.4x, 1.4x, 1.5x, 1.6x per 30 rounds and ends at 15%
 *    (stopped at round 210, 85%); gamma_c 0.2 grows 1.05-1.10x per 15 rounds, speeding up, and
 *    ends at 81% mean, 65% worst peer (stopped at round 364, 87%).
 *  - Healthy runs: gamma_c 0.1 and 0.05, dpsgd, dcd qsgd:16, sgp (n 8), gamma_c 0.05 and 0.1 at
 *    n 4, gamma_c 0.1 on exponential n 16: the consensus distance rises from 0 in the first
 *    45 rounds (5x from the first window), then levels off and falls with the learning rate;
 *    after the warm-up the largest growth over increasing windows was 1.24x (gamma_c 0.1, the
 *    last epoch), 1.16x dpsgd, 1.08x sgp, 1.07x dcd. The windowed training loss never came back
 *    above its best by more than a few tenths.
 * So a run is diverged after RUN_MIN windows in a row of growth that add up to GROWTH_MIN and
 * keep their pace: geometric growth passes all three within a few windows, an early rise that
 * levels off or follows a power of the rounds does not, and noise on a plateau does not add up.
 *
 * A networked peer's distance is its own estimate against its neighbours' replicas, so it
 * changes meaning when the membership does: in a 3-peer CHOCO job (automatic gamma_c 0.005,
 * windows of 5 rounds) that lost a peer at round 39, a survivor's estimate stepped from 1.36e-4
 * to 1.93e-4 (1.42x in one round, the ring on 3 becoming the pair) on top of the slow rise from
 * the common start, and the windows across the step read as 4.04x over 25 rounds at a kept pace
 * (a false stop at round 50). Windows are therefore compared only under one membership, and each
 * start (first round, resume, rejoin: replicas rebuilt from full copies, a model of another
 * round) or change of membership (a newcomer's distance rises from its snapshot as the job's
 * did from the common start) gets the warm-up again: hs_guard_restart, counted from that
 * round's window. So does a neighbour found gone before the view that drops it comes into force
 * (hs_guard_follow): it leaves the mix at once, and the estimate with it (issue 19).
 */
#include "hearsay/guard.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error_internal.h"

/* Windows of growth in a row, and their total, that make divergence. */
#define RUN_MIN 3
#define GROWTH_MIN 4.0
/* Geometric growth keeps its pace (or speeds up); a rise from zero that follows a power of the
 * rounds (t, t^2) or levels off slows down: the second half of its run grows by less than
 * this fraction of the first half's growth (at most half of it for a rise from zero that
 * adds up to GROWTH_MIN). */
#define PACE_KEPT 0.75
#define HIST 256
/* Peers whose models differ by more than the models' own size share nothing: once they have
 * shared something, that is drift. Peers that start apart on purpose (the node API's
 * same-start 0: 0.44 against a mean square of 0.11 at the first round of 4 averaging peers)
 * are judged from where they started instead, until they come together below RELATIVE_MAX:
 * only GROWTH_MIN times further apart than at their first round is drift. */
#define RELATIVE_MAX 1.0
/* Below this relative distance the peers agree to float precision's order; changes down there
 * (a run whose consensus distance decays to 1e-12 with the learning rate) are not growth. */
#define RELATIVE_FLOOR 1e-7
/* The training loss (window means) this far above its best, and this factor above it. */
#define LOSS_RISE_ABS 1.0
#define LOSS_RISE_FACTOR 4.0
/* Test accuracy below this fraction of its best (once the best beat ACC_MEANINGFUL). */
#define ACC_COLLAPSE 0.5
#define ACC_MEANINGFUL 0.2

struct hs_guard {
    hs_guard_cfg cfg;
    char compress[96];
    long window, warmup;
    /* The first round of the window the warm-up counts from: 0, or that of the last
     * hs_guard_restart (whole windows, so that a job whose first round is 4 is judged from
     * the same window as one that starts at 0). */
    double start;
    /* The window being filled: its index and sums. */
    long blk;
    double sum_logc, sum_loss;
    int n_c, n_loss;
    /* Completed windows after the warm-up: their mean log consensus (a ring of the newest
     * HIST), and how many in a row ended higher than the one before. */
    double hist[HIST];
    long n_hist;
    int run_len;
    /* The highest window mean log consensus since the last start or restart, warm-up
     * windows included (-inf before the first). */
    double peak;
    double best_loss;
    int have_loss, loss_high; /* windows in a row with the loss far above its best */
    double best_acc, best_acc_round;
    /* The relative distance of the first round (NaN before it), and whether the peers have
     * stayed further apart than their own size since it. */
    double rel0;
    int apart;
    /* The neighbourhood of the last hs_guard_follow: membership epoch, neighbours gone. */
    uint64_t nb_epoch, nb_gone;
    int nb_known;
    hs_guard_verdict state;
    double verdict_round;
    char reason[320], advice[256];
};

const char *hs_guard_policy_name(hs_guard_policy p) { return p == HS_GUARD_WARN ? "warn" : "stop"; }

int hs_guard_policy_parse(const char *s, hs_guard_policy *out) {
    if (!strcmp(s, "stop")) *out = HS_GUARD_STOP;
    else if (!strcmp(s, "warn")) *out = HS_GUARD_WARN;
    else return hs__err(HS_EINVAL, "'%s': expected warn or stop", s);
    return 0;
}

void hs_guard_advice_for(const hs_guard_cfg *cfg, char *out, size_t cap) {
    const char *c = cfg->compress ? cfg->compress : "none";
    int compressed = strcmp(c, "none") != 0;
    char more[96];
    const char *less = compressed ? hs_compressor_spec_more(c, more, sizeof(more)) : NULL;
    double lr = cfg->lr, g = cfg->gamma_c;
    char lrs[64];
    /* 0: the node API, whose caller's optimizer owns the rate the node never sees. */
    if (lr > 0)
        snprintf(lrs, sizeof(lrs), "--lr (now %g; try %g)", lr, lr / 2);
    else
        snprintf(lrs, sizeof(lrs), "the learning rate (try half)");
    /* CHOCO's gossip (and BEER's, of the model and the tracker) is contractive only for
     * gamma_c small enough for the compressor's contraction and the spectral gap: the step, not
     * the compressor, is the knob. */
    if (hs_algo_kind_uses_gamma_c(cfg->algo)) {
        snprintf(out, cap, "lower --gamma-c (now %g; try %g), or %s", g, g / 2, lrs);
        return;
    }
    if (hs_algo_kind_drifts_with_compression(cfg->algo)) {
        /* Replicas that drift with the compression error (DCD): more bits is the cure. */
        if (less)
            snprintf(out, cap, "compress less than --compress %s (e.g. %s: more levels or a "
                               "larger kept fraction), or lower %s", c, less, lrs);
        else
            snprintf(out, cap, "compress less than --compress %s, or lower %s", c, lrs);
    } else if (less) {
        snprintf(out, cap, "lower %s, or compress less than --compress %s (e.g. %s)", lrs, c,
                 less);
    } else if (compressed) {
        snprintf(out, cap, "lower %s, or compress less than --compress %s", lrs, c);
    } else {
        snprintf(out, cap, "lower %s", lrs);
    }
}

int hs_guard_new(hs_guard **out, const hs_guard_cfg *cfg) {
    hs_guard *g = calloc(1, sizeof(*g));
    if (!g) return hs__err(HS_ENOMEM, "guard: out of memory");
    g->cfg = *cfg;
    snprintf(g->compress, sizeof(g->compress), "%s", cfg->compress ? cfg->compress : "none");
    g->cfg.compress = g->compress;
    g->window = cfg->window > 0 ? cfg->window : 15;
    /* Four windows, and at least the 60 rounds the thresholds were measured with (windows of 15):
     * a newcomer's pull-in lasted 30-40 rounds of steady rise in examples/churn, whose windows of
     * 5 rounds ended a 20-round warm-up mid-rise and read it as 4.7x of drift (a false stop). */
    g->warmup = cfg->warmup > 0 ? cfg->warmup : (4 * g->window > 60 ? 4 * g->window : 60);
    g->blk = -1;
    g->peak = -INFINITY;
    g->best_acc = 0;
    g->rel0 = NAN;
    g->verdict_round = NAN;
    hs_guard_advice_for(&g->cfg, g->advice, sizeof(g->advice));
    *out = g;
    return 0;
}

void hs_guard_free(hs_guard *g) { free(g); }

const char *hs_guard_reason(const hs_guard *g) { return g->reason; }
const char *hs_guard_advice(const hs_guard *g) { return g->advice; }
double hs_guard_round(const hs_guard *g) { return g->verdict_round; }

/* Records a verdict: a stop for non-finite values and under policy stop, else a warning once. */
static hs_guard_verdict decide(hs_guard *g, double round, int always_stop) {
    g->verdict_round = round;
    g->state = always_stop || g->cfg.policy == HS_GUARD_STOP ? HS_GUARD_DIVERGED
                                                             : HS_GUARD_DIVERGING;
    return g->state;
}

hs_guard_verdict hs_guard_fail(hs_guard *g, double round, const char *what) {
    snprintf(g->reason, sizeof(g->reason), "%s", what);
    return decide(g, round, 1);
}

/* Closes the window being filled: growth of the consensus distance and the loss. */
static hs_guard_verdict close_window(hs_guard *g) {
    hs_guard_verdict v = HS_GUARD_OK;
    if (g->n_loss) {
        double loss = g->sum_loss / g->n_loss;
        /* Sustained, not a jump: RUN_MIN windows in a row above the bar (a peer of SGP that
         * adds a straggler's stale share sees one or two such windows and recovers). */
        int high = g->have_loss && loss > g->best_loss + LOSS_RISE_ABS &&
                   loss > g->best_loss * LOSS_RISE_FACTOR;
        g->loss_high = high ? g->loss_high + 1 : 0;
        if (g->loss_high >= RUN_MIN) {
            snprintf(g->reason, sizeof(g->reason),
                     "the training loss rose from %.3g to %.3g and stayed up (means over %d "
                     "windows of %ld rounds)",
                     g->best_loss, loss, g->loss_high, g->window);
            v = HS_GUARD_DIVERGED;
        }
        if (!g->have_loss || loss < g->best_loss) g->best_loss = loss;
        g->have_loss = 1;
    }
    /* The rise from the common start (or the last restart) is not growth to judge. Nor is
     * any growth under an asynchronous algorithm (SGP): there the distance measures how far
     * peers are apart in progress as much as in agreement, and a straggler falling behind
     * makes it grow for as long as it falls behind (seen: 4.6x over 15 rounds of a healthy
     * 4-peer run with one peer at 4x). Its divergence still shows in the loss, the accuracy
     * and non-finite values. */
    double lc = g->n_c ? g->sum_logc / g->n_c : -INFINITY;
    /* A rise that stays below the highest window since the (re)start is the start's own
     * transient coming back, not drift: a peer that rejoined from a model 15-40 rounds old,
     * under sign:512 (one scale per 512 values: a large difference in a few values is sent at
     * its block's mean, over many rounds), is pulled in as a damped oscillation whose rises
     * from its troughs add up to 4x at a kept pace while its peaks fall (launch-resume:
     * 5.9e-8 at the rejoin, 1.1e-8, 2.6e-8 when it was stopped, 99.4% at the end with warn;
     * docs/RESULTS.md, "sign:512 after a resume"). Drift passes the peak and is judged from
     * its trough; a run that rises from its start is at its peak in every window. */
    int above_peak = lc > g->peak;
    if (g->n_c && lc > g->peak) g->peak = lc;
    if (g->n_c && hs_algo_kind_synchronous(g->cfg.algo) &&
        (double)g->blk * (double)g->window >= g->start + (double)g->warmup) {
        if (g->n_hist && lc > g->hist[(g->n_hist - 1) % HIST]) {
            g->run_len++;
        } else {
            g->run_len = 0;
        }
        g->hist[g->n_hist++ % HIST] = lc;
        int len = g->run_len < HIST - 1 ? g->run_len : HIST - 1;
        double first = g->hist[(g->n_hist - 1 - len) % HIST];
        double mid = g->hist[(g->n_hist - 1 - len / 2) % HIST];
        double growth = exp(lc - first);
        /* In log terms: the later half of the run grew at least PACE_KEPT times as much as
         * the earlier half (per window; the halves differ by one window when len is odd). */
        double early = (mid - first) / (double)(len - len / 2);
        double late = (lc - mid) / (double)(len / 2 > 0 ? len / 2 : 1);
        if (v == HS_GUARD_OK && above_peak && g->run_len >= RUN_MIN && growth >= GROWTH_MIN &&
            late >= PACE_KEPT * early) {
            snprintf(g->reason, sizeof(g->reason),
                     "the consensus distance grew %.3gx over %.0f rounds (%d windows of %ld rounds "
                     "in a row, not slowing down): the peers are drifting apart",
                     growth, (double)g->run_len * (double)g->window, g->run_len, g->window);
            v = HS_GUARD_DIVERGED;
        }
    }
    g->sum_logc = g->sum_loss = 0;
    g->n_c = g->n_loss = 0;
    return v;
}

void hs_guard_restart(hs_guard *g, double round) {
    /* Windows from before compared a different distance (other neighbours, weights, replicas):
     * the run of growth and its first window start over, and the window in progress, which
     * mixes both, falls inside the new warm-up. The loss and the accuracy keep their bests:
     * the model is the same one. */
    g->start = floor(round / (double)g->window) * (double)g->window;
    g->peak = -INFINITY;
    g->n_hist = 0;
    g->run_len = 0;
}

int hs_guard_follow(hs_guard *g, double round, uint64_t epoch, uint64_t gone) {
    if (g->nb_known && epoch == g->nb_epoch && gone == g->nb_gone) return 0;
    hs_guard_restart(g, round);
    g->nb_epoch = epoch;
    g->nb_gone = gone;
    g->nb_known = 1;
    return 1;
}

hs_guard_verdict hs_guard_observe(hs_guard *g, const hs_guard_obs *o) {
    if (g->state == HS_GUARD_DIVERGED) return HS_GUARD_DIVERGED;
    double r = o->round;
    const char *bad = !isfinite(o->loss)        ? "the training loss is"
                      : !isfinite(o->consensus) ? "the consensus distance is"
                      : !isfinite(o->param_ms)  ? "the parameters are"
                                                : NULL;
    if (bad) {
        snprintf(g->reason, sizeof(g->reason), "%s not finite at round %.0f", bad, r);
        return decide(g, r, 1);
    }
    if (g->state != HS_GUARD_OK) return HS_GUARD_OK; /* warned once already */
    hs_guard_verdict v = HS_GUARD_OK;
    long blk = (long)floor(r / (double)g->window);
    if (g->blk >= 0 && blk > g->blk) v = close_window(g);
    g->blk = blk;
    double c = o->consensus;
    if (c >= 0 && o->param_ms > 0) {
        c /= o->param_ms;
        if (isnan(g->rel0)) {
            g->rel0 = c;
            g->apart = c > RELATIVE_MAX;
        } else if (c <= RELATIVE_MAX) {
            g->apart = 0;
        }
        if (v == HS_GUARD_OK && !g->apart && c > RELATIVE_MAX) {
            snprintf(g->reason, sizeof(g->reason),
                     "the consensus distance (%.3g) exceeds the parameters' own mean square "
                     "(%.3g): the peers' models have drifted apart",
                     o->consensus, o->param_ms);
            v = HS_GUARD_DIVERGED;
        } else if (v == HS_GUARD_OK && g->apart && c > GROWTH_MIN * g->rel0) {
            snprintf(g->reason, sizeof(g->reason),
                     "the consensus distance (%.3g) is %.3g times the parameters' own mean "
                     "square (%.3g), %.3g times as far apart as the peers started: the peers' "
                     "models are drifting apart",
                     o->consensus, c, o->param_ms, c / g->rel0);
            v = HS_GUARD_DIVERGED;
        }
    }
    if (o->consensus >= 0) {
        /* 0 (peers still equal) counts as a very small distance, not as log 0 = -inf. */
        double floor_c = o->param_ms > 0 ? RELATIVE_FLOOR : 1e-300;
        g->sum_logc += log(c > floor_c ? c : floor_c);
        g->n_c++;
    }
    if (o->loss >= 0) {
        g->sum_loss += o->loss;
        g->n_loss++;
    }
    if (!isnan(o->test_acc)) {
        if (o->test_acc > g->best_acc) {
            g->best_acc = o->test_acc;
            g->best_acc_round = r;
        } else if (v == HS_GUARD_OK && g->best_acc >= ACC_MEANINGFUL &&
                   o->test_acc < ACC_COLLAPSE * g->best_acc) {
            snprintf(g->reason, sizeof(g->reason),
                     "the test accuracy fell from %.2f%% (round %.0f) to %.2f%%",
                     100 * g->best_acc, g->best_acc_round, 100 * o->test_acc);
            v = HS_GUARD_DIVERGED;
        }
    }
    return v == HS_GUARD_OK ? HS_GUARD_OK : decide(g, r, 0);
}
