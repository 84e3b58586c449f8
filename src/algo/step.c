/* The automatic consensus step of CHOCO and BEER (gamma_c when --gamma-c is not given): a rule
 * of the compressor alone, computed once at start from quantities every peer has, so every
 * peer of a job gets the same float (CHOCO keeps the network average only when all use one step)
 * and the simulator and the network compute the same bits. docs/RESULTS.md, "CHOCO consensus
 * step", has the measurements it rests on.
 *
 * Why this rule (Koloskova, Stich and Jaggi 2019, CHOCO-Gossip; measured with
 * tools/bench/gamma.c, pure gossip, 5,000 rounds):
 * - Theorem 2's step, rho^2 delta / (16 rho + rho^2 + 4 beta^2 + 2 rho beta^2 - 8 rho delta)
 *   (rho the spectral gap, beta = ||I - W||_2), holds for every compressor of worst-case
 *   contraction delta, and is 1,000x below the measured limits; it shrinks as rho^2 where the
 *   measured limits do not move (a ring of 64, gap 0.003, takes the step of a ring of 8, gap
 *   0.2; the densest graphs take the smallest). So the rule does not use the gap.
 * - The theorem's delta is a worst case: E||C(x) - x||^2 <= (1 - delta) ||x||^2 for every x.
 *   It is tight for unscaled random-k (its limit is 1.0-1.3 delta), but top-k keeps the
 *   largest entries, far more than k/d of the energy of a dense vector, and tolerates 2.4-5.6
 *   delta; sign and QSGD 1.4-3.1 delta. One rule of delta must then be sized for random-k and is
 *   5x too cautious for top-k on a ring (the 0.005 against a limit of 0.056).
 * - What the operator does to a vector with many comparable entries (what a gossip difference
 *   x - xhat is) is measured here on a probe: delta_p = 1 - ||C(v) - v||^2 / ||v||^2 for a
 *   seeded bell-shaped v of the compressor's own d. The effective contraction is the geometric
 *   mean of the worst case and the probe, delta_e = sqrt(delta max(delta, delta_p)): the
 *   measured limits are 0.77-2.2 delta_e for every compressor and topology measured (top-k,
 *   sign, QSGD, random-k; rings, tori, exponential, complete, random regular, 8-64 peers),
 *   where they were 1.0-5.6 delta.
 * - gamma_c = delta_e / (2 - delta_e), the old rule's shape (1 at delta_e = 1, exact
 *   messages, plain gossip that is stable for every step in (0, 1]): about delta_e / 2 for
 *   small delta_e, so a margin of 1.49 or more below every measured limit (0.0135 for top-1%,
 *   3x the old default), and unchanged for random-k.
 * - The degree is the one topology input (hs_algo_scale_gamma_c): the limits fall as peers get
 *   more neighbours (each adds its compression error to the mix) and then level off, so the rule
 *   above is sized for the densest graphs (complete, exponential, 6-regular), and a ring (at most
 *   2 neighbours) takes 1.5x it, up to 0.15. Measured ring limits (8 and 64 peers, d = 1,000)
 *   are 2.6-3.1x the rule for top-k and unscaled random-k (a margin of 1.7 or more at 1.5x),
 *   whose steps are small; the quantizers' steps (sign, QSGD) are above the cap and keep the
 *   rule (their ring limits are only 1.3-2.1x it). Worth 0.15-0.25 points at the end of 5 epochs
 *   on the default MLP's ring of 8 (docs/RESULTS.md, "Defaults that train, part 2"). Nodes and
 *   the simulator take the degree from what every peer knows alike, not the job's size (a
 *   joiner may not know it): a ring's 2, a topology file's own (hs_algo_cfg_set_step_degree).
 * The probe uses only exact IEEE operations (sums of uniform draws), so machines with different
 * math libraries compute the same step. */
#include <math.h>
#include <stdlib.h>

#include "algo/algo_internal.h"
#include "compress/codec.h"
#include "core/error_internal.h"
#include "core/philox.h"
#include "core/rng.h"

/* Key of the probe vector: fixed, so the step depends only on the compressor (spec, d, seed). */
#define PROBE_SEED 0x5eed0c0c0ULL

float hs_algo_default_gamma_c(double delta, double delta_probe) {
    if (!(delta > 1e-9)) delta = 1e-9; /* not a contraction: refused before a step is needed */
    if (delta > 1.0) delta = 1.0;
    double dp = delta_probe > delta ? delta_probe : delta; /* NaN compares false: delta */
    if (dp > 1.0) dp = 1.0;
    double de = sqrt(delta * dp);
    return (float)(de / (2.0 - de));
}

/* Ring-like graphs: at most this many neighbours per peer. */
#define SPARSE_DEGREE 2
#define SPARSE_SCALE 1.5f
/* The most the ring's factor raises a step to: the sparsifiers' rule steps (top-k and random-k
 * up to 10%, 0.005-0.113) have ring limits 2.6-3.1x the rule; the quantizers' (sign, QSGD:
 * 0.2-0.36) have 1.3-2.1x. (QSGD with 4 levels in buckets of 64 diverged at 1.5x its 0.2 on a
 * ring of 4 in training; that was before its messages were rescaled, and it diverged at every
 * step then: hs__compress_replica_scale.) */
#define SPARSE_CAP 0.15f

float hs_algo_scale_gamma_c(float gamma_c, int max_degree) {
    if (max_degree >= 1 && max_degree <= SPARSE_DEGREE && gamma_c < SPARSE_CAP) {
        float up = gamma_c * SPARSE_SCALE;
        gamma_c = up < SPARSE_CAP ? up : SPARSE_CAP;
    }
    return gamma_c;
}

int hs__algo_probe_delta(const hs_compressor *c, float *v, float *out, double *delta_probe) {
    size_t d = hs_compressor_dim(c);
    hs_rng r;
    hs__rng_init(&r, PROBE_SEED, HS_RNG_PROBE, 0, 0);
    /* Irwin-Hall of order 4: bell-shaped, bounded, from additions only. */
    for (size_t k = 0; k < d; k++)
        v[k] = (float)((hs__rng_double(&r) + hs__rng_double(&r)) +
                       (hs__rng_double(&r) + hs__rng_double(&r)) - 2.0);
    int err = hs_compress_apply(c, v, d, 0, 0, out);
    if (err < 0) return hs__err_prefix(err, "consensus step: probing %s", hs_compressor_name(c));
    double e = 0, n = 0, scale = hs__compress_replica_scale(c);
    for (size_t k = 0; k < d; k++) {
        double dk = scale * (double)out[k] - (double)v[k];
        e += dk * dk;
        n += (double)v[k] * (double)v[k];
    }
    *delta_probe = n > 0 ? 1.0 - e / n : 0.0;
    return 0;
}

int hs_algo_auto_gamma_c(const hs_compressor *c, float *gamma_c, double *delta_probe) {
    size_t d = hs_compressor_dim(c);
    float *v = malloc(sizeof(float) * d), *out = malloc(sizeof(float) * d);
    int err = 0;
    double dp = 0;
    if (!v || !out)
        err = hs__err(HS_ENOMEM, "consensus step: out of memory for a probe of %zu values", d);
    else if ((err = hs__algo_probe_delta(c, v, out, &dp)) == 0) {
        *gamma_c = hs_algo_default_gamma_c(hs_compressor_delta(c), dp);
        if (delta_probe) *delta_probe = dp;
    }
    free(v);
    free(out);
    return err;
}
