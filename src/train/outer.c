/* The outer optimizer over any gossip algorithm: every round (= H = --local-steps inner steps
 * of the peer's own optimizer, SGD or AdamW), the gossip averages, then an outer Nesterov step
 * on the pseudo-gradient moves the model from the round's anchor.
 *
 *   SlowMo:  Wang, Tantia, Ballas, Rabbat, "SlowMo: Improving communication-efficient
 *            distributed SGD with slow momentum", ICLR 2020, Algorithm 1: the base algorithm
 *            (local SGD, SGP, D-PSGD) runs tau inner steps from x_{t,0}, the peers average,
 *            u_{t+1} = beta u_t + (x_{t,0} - x_{t,tau}) / gamma_t, and
 *            x_{t+1,0} = x_{t,0} - alpha gamma_t u_{t+1}.
 *   DiLoCo:  Douillard et al., "DiLoCo: Distributed low-communication training of language
 *            models", 2023, Algorithm 1: Delta = theta^(t-1) - mean_i theta_i^(t) (the
 *            "outer gradient", all-reduced), theta^(t) = OuterOpt(theta^(t-1), Delta) with
 *            OuterOpt = SGD with Nesterov momentum (lr 0.7, momentum 0.9).
 *   NoLoCo:  Kolehmainen et al., "NoLoCo: No-all-reduce low communication training method for
 *            large models", 2025: no all-reduce; replicas average with a few others, and the
 *            outer momentum gets, besides the group's mean pseudo-gradient, a term that pulls
 *            a replica's weights towards its group's mean weights.
 *
 * What we implement, per peer i and element, with a_i the anchor (the model at the round's
 * open), x_i the model after the H inner steps, x~_i what the gossip algorithm makes of x_i
 * (its pull), alpha = --outer-lr, beta = --outer-momentum:
 *
 *   g_i = a_i - x~_i   (damped mix: CHOCO, BEER)    (the pseudo-gradient, after the gossip)
 *   g_i = a_i - x_i    (exact mix: D-PSGD, DCD, SGP) (before it)
 *   u_i <- beta u_i + g_i                      (SlowMo's u, without SlowMo's 1 / gamma)
 *   x_i <- x~_i + (1 - alpha) g_i - alpha beta u_i
 *
 * and the next round's anchor is the new x_i. With g after the gossip the last line is
 * a_i - alpha (g_i + beta u_i), Nesterov as PyTorch's SGD(nesterov=True) on the whole
 * pseudo-gradient; with g before it, it is a_i - c_i - alpha (g_i + beta u_i), c_i = x_i - x~_i
 * the gossip's correction, applied once and kept out of the momentum. At alpha = 1 and
 * beta = 0 both add exactly 0: x_i = x~_i bit for bit, today's local-steps algorithm (a term
 * that is 0 is not added at all, so not even a zero's sign changes; a test holds it).
 *
 * Why two: the momentum multiplies what it sums by up to alpha / (1 - beta) (7 at DiLoCo's
 * 0.7 / 0.9). CHOCO and BEER move x by gamma_c times their mixing difference, a damped step
 * (gamma_c about 0.1-0.2) that the momentum accelerates: their correction also carries the
 * neighbours' compressed progress of this round, DiLoCo's averaged Delta. D-PSGD's, DCD's and
 * SGP's correction is a whole mixing step of the round's start models (sum_j W_ij a_j - a_i,
 * or its push-sum), already a full step; the neighbours' progress reaches them only next
 * round. Summed into the momentum and amplified, it overshot: D-PSGD on a ring of 8 at H=32
 * ended at 73.4 / 81.1 / 79.1% (seeds 0 / 1 / 2) with it, 82.0 / 82.8 / 83.1% with it kept
 * out, while keeping CHOCO's out cost it 0.6 points (docs/RESULTS.md, "Outer optimizer 300x").
 * Both rules give the network mean the same step wherever the mix keeps the mean
 * (mean_i c_i = 0).
 *
 * What travels is the model, as without the outer step; the pseudo-gradient is formed here,
 * from the model before or after the gossip. Gossip, unlike DiLoCo's all-reduce, leaves the peers' anchors apart, and only
 * the model's gossip brings them together: for a gossip x~_i = sum_j W_ij x_j (W doubly
 * stochastic),
 *   g_i = (a_i - sum_j W_ij a_j) + sum_j W_ij (a_j - x_j),
 * the neighbourhood's mean pseudo-gradient (DiLoCo's Delta, exactly so on a complete graph
 * with equal anchors) plus a pull of the anchor towards the neighbours' (NoLoCo's term, here
 * with its weight tied to the outer learning rate); our D-PSGD mixes the round's starting
 * models and adds the local change (dpsgd.c), so there the first term stays and the second is
 * the peer's own a_i - x_i: the first is the correction the exact rule applies once, the
 * second its momentum's pseudo-gradient. For a mixing that keeps the network's mean
 * (D-PSGD, CHOCO), mean_i g_i = mean_i (a_i - x_i): the momentum averages the peers' own
 * pseudo-gradients and the network mean moves exactly as in DiLoCo; in a consensus-only run
 * (inner lr 0, x_i = a_i) mean g = 0, so the outer step keeps the network average. Compressed
 * gossip (CHOCO) sends C(x_i - x^_i) against the replica x^_i, which followed the model to the
 * last round: that difference is this round's pseudo-gradient plus the compression's
 * remainder, so the compressor works on the pseudo-gradient with error feedback.
 *
 * The defaults (hs__outer_resolve: rate 0.5 and momentum 0.5 when neither is given; one given,
 * the other makes them sum to 1) give the step a gain alpha / (1 - beta) of 1 on a
 * pseudo-gradient that repeats: the momentum smooths the rounds' pseudo-gradients and does not
 * amplify them. DiLoCo's 0.7 / 0.9 (gain 7) is tuned for H = 500 steps of AdamW; hearsay's
 * users run a few local steps of SGD with momentum 0.9, whose buffer carries each round's
 * velocity into the next round's steps, and an outer momentum that amplifies sums that velocity
 * a second time. SlowMo keeps the rate 1 and its reference (fairseq) the momentum 0 up to 16
 * workers, the plain algorithm. On the CNN at n = 4 (tools/bench/wan --loopback, 100 steps, 96
 * at H = 8, seeds 1-3; docs/RESULTS.md, "Outer optimizer defaults"), 0.5/0.5 reached 70% as
 * soon as 1/0 or sooner (evaluated every 10 steps; H = 4: steps 50/40/40 against 50/40/50;
 * H = 8: 50/40/40 against 50/50/50) and
 * ended 2.0 points above it at H = 4 (84.4%, DDP 83.9%), 0.35 below at H = 8; 0.7/0.9 reached it
 * 0-20 steps later and ended 7-13 points lower at H = 4, and rate 1 with momentum 0.2-0.5
 * (gain 1.25-2) was no sooner than 1/0. Under `hearsay sim` (MLP, n = 8, 10 epochs, D-PSGD and
 * CHOCO top-10% at H = 8 and 32, 2 seeds) 0.5/0.5 ended at or above the plain algorithm in all
 * 8 runs, by up to 2.2 points.
 *
 * Algorithms that evaluate elsewhere than x (SGP: z = x / w) take the step on the evaluation
 * point, as SlowMo's reference de-biases the parameters around it: the anchor and the
 * momentum live in z, and x = w z afterwards (elements the step leaves alone keep their x).
 * One thread per object. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "algo/algo_internal.h"
#include "core/error_internal.h"
#include "train/outer.h"

#define OUTER_VERSION 1u

struct hs__outer {
    float lr, mom;
    size_t d;
    float *anchor; /* the model as evaluated at the round's open */
    float *u;      /* the outer momentum */
    /* Under an exact mix, the model as evaluated after the local steps (pre_set: taken this
     * round); under split evaluation, once the step is computed, the new z turned into x. */
    float *tmp;
    int pre_set;
};

/* The pseudo-gradient the momentum takes (the file's opening says why): measured to the model
 * before the gossip for algorithms that mix exactly (no consensus step gamma_c: D-PSGD, DCD,
 * SGP), after it for those whose consensus step damps the mix (CHOCO, BEER). */
static int exact_mix(hs_algo *a) { return a && !hs_algo_kind_uses_gamma_c(hs_algo_kind_of(a)); }

void hs__outer_cfg_default(hs_outer_cfg *c) {
    c->on = 0;
    c->lr = NAN;
    c->momentum = NAN;
}

void hs__outer_resolve(const hs_outer_cfg *c, float *lr, float *momentum) {
    float a = c->lr, b = c->momentum;
    if (isnan(a) && isnan(b)) {
        a = HS__OUTER_LR_DEFAULT;
        b = HS__OUTER_MOMENTUM_DEFAULT;
    } else if (isnan(a)) {
        a = 1.0f - b;
    } else if (isnan(b)) {
        b = a < 1.0f ? 1.0f - a : 0.0f;
    }
    *lr = a;
    *momentum = b;
}

int hs__outer_check(const hs_outer_cfg *c) {
    if (!c->on) return 0;
    float lr, m;
    hs__outer_resolve(c, &lr, &m);
    /* the momentum first: a rate not given is made from it */
    if (!(m >= 0.0f && m < 1.0f))
        return hs__err(HS_EINVAL, "--outer-momentum %g: must be in [0, 1)", (double)m);
    if (!(lr >= 0.0f && lr <= 10.0f))
        return hs__err(HS_EINVAL, "--outer-lr %g: must be in [0, 10] (1 with --outer-momentum 0 "
                                  "is the plain algorithm)",
                       (double)lr);
    return 0;
}

void hs__outer_free(hs__outer *o) {
    if (!o) return;
    free(o->anchor);
    free(o->u);
    free(o->tmp);
    free(o);
}

int hs__outer_new(hs__outer **out, const hs_outer_cfg *c, size_t d) {
    *out = NULL;
    int err = hs__outer_check(c);
    if (err < 0 || !c->on) return err;
    hs__outer *o = calloc(1, sizeof(*o));
    if (!o || !(o->anchor = malloc(sizeof(float) * d)) || !(o->u = calloc(d, sizeof(float)))) {
        hs__outer_free(o);
        return hs__err(HS_ENOMEM, "outer optimizer: out of memory");
    }
    hs__outer_resolve(c, &o->lr, &o->mom);
    o->d = d;
    *out = o;
    return 0;
}

void hs__outer_open(hs__outer *o, hs_algo *a, const float *x) {
    if (!o) return;
    memcpy(o->anchor, hs_algo_eval_point(a, x), sizeof(float) * o->d);
    o->pre_set = 0;
}

int hs__outer_local_done(hs__outer *o, hs_algo *a, const float *z) {
    if (!o || !exact_mix(a)) return 0;
    if (!o->tmp && !(o->tmp = malloc(sizeof(float) * o->d)))
        return hs__err(HS_ENOMEM, "outer optimizer: out of memory");
    memcpy(o->tmp, z, sizeof(float) * o->d);
    o->pre_set = 1;
    return 0;
}

int hs__outer_step(hs__outer *o, hs_algo *a, float *x) {
    if (!o) return 0;
    const float *xt = hs_algo_eval_point(a, x);
    const int split = xt != x;
    if (split && !o->tmp && !(o->tmp = malloc(sizeof(float) * o->d)))
        return hs__err(HS_ENOMEM, "outer optimizer: out of memory");
    const float one_m = 1.0f - o->lr, ab = o->lr * o->mom, beta = o->mom;
    /* Split evaluation: the new z goes to the anchor's buffer (the next open refills it). */
    float *z = split ? o->anchor : x, *u = o->u;
    const float *an = o->anchor, *to = o->pre_set && exact_mix(a) ? o->tmp : xt;
    size_t bad = o->d;
    for (size_t k = 0; k < o->d; k++) {
        float g = an[k] - to[k];
        float uk = beta * u[k] + g;
        float c = one_m * g - ab * uk;
        u[k] = uk;
        z[k] = c == 0.0f ? xt[k] : xt[k] + c;
        if (bad == o->d && !isfinite(uk)) bad = k;
    }
    o->pre_set = 0;
    if (bad < o->d)
        return hs__err(HS_EDIVERGED, "the outer momentum is not finite (parameter %zu: %g; "
                                     "--outer-lr %g, --outer-momentum %g)",
                       bad, (double)u[bad], (double)o->lr, (double)o->mom);
    if (split) {
        memcpy(o->tmp, z, sizeof(float) * o->d);
        hs_algo_from_eval_point(a, o->tmp);
        for (size_t k = 0; k < o->d; k++)
            if (z[k] != xt[k]) x[k] = o->tmp[k];
    }
    return 0;
}

int hs__outer_save(const hs__outer *o, hs_buf *out) {
    int err;
    if ((err = hs__put_u32(out, HS__OUTER_MAGIC)) < 0 ||
        (err = hs__put_u32(out, OUTER_VERSION)) < 0 || (err = hs__put_u32(out, o != NULL)) < 0 ||
        !o)
        return err;
    if ((err = hs__put_f64(out, o->lr)) < 0 || (err = hs__put_f64(out, o->mom)) < 0 ||
        (err = hs__put_u64(out, o->d)) < 0)
        return err;
    return hs__put_floats(out, o->u, o->d);
}

int hs__outer_at(const uint8_t *p, const uint8_t *end) {
    uint32_t m;
    return hs__get_u32(&p, end, &m) == 0 && m == HS__OUTER_MAGIC;
}

int hs__outer_parse(const hs__outer *o, const uint8_t **p, const uint8_t *end, const char *what,
                    const uint8_t **mom) {
    uint32_t magic, version, on;
    uint64_t d;
    double lr, m;
    int err;
    *mom = NULL;
    if (*p == end) /* a snapshot's optional section: absent */
        return o ? hs__err(HS_EMISMATCH, "%s has no outer step, this run has one (--outer-lr "
                                         "and --outer-momentum must be given alike)",
                           what)
                 : 0;
    if ((err = hs__get_u32(p, end, &magic)) < 0) return err;
    if (magic != HS__OUTER_MAGIC)
        return hs__err(HS_EFORMAT, "%s: outer optimizer state: bad magic 0x%08x", what, magic);
    if ((err = hs__get_u32(p, end, &version)) < 0 || (err = hs__get_u32(p, end, &on)) < 0)
        return err;
    if (version != OUTER_VERSION)
        return hs__err(HS_EFORMAT, "%s: outer optimizer state version %u (this build reads %u)",
                       what, version, OUTER_VERSION);
    if (on > 1) return hs__err(HS_EFORMAT, "%s: outer optimizer state: flag %u", what, on);
    if (on != (o != NULL))
        return hs__err(HS_EMISMATCH, "%s: %s an outer step, this run %s (--outer-lr and "
                                     "--outer-momentum must be given alike)",
                       what, on ? "has" : "has no", o ? "has one" : "has none");
    if (!on) return 0;
    if ((err = hs__get_f64(p, end, &lr)) < 0 || (err = hs__get_f64(p, end, &m)) < 0 ||
        (err = hs__get_u64(p, end, &d)) < 0)
        return err;
    if (d != o->d)
        return hs__err(HS_EMISMATCH, "%s: outer momentum of %llu floats, the model has %zu", what,
                       (unsigned long long)d, o->d);
    if ((size_t)(end - *p) / sizeof(float) < o->d)
        return hs__err(HS_EFORMAT, "%s: outer momentum truncated (%zu bytes left)", what,
                       (size_t)(end - *p));
    for (size_t k = 0; k < o->d; k++) {
        float f;
        memcpy(&f, *p + sizeof(float) * k, sizeof(f));
        if (!isfinite(f))
            return hs__err(HS_EFORMAT, "%s: outer momentum %zu is not finite", what, k);
    }
    *mom = *p;
    *p += sizeof(float) * o->d;
    return 0;
}

void hs__outer_install(hs__outer *o, const uint8_t *mom) {
    if (o && mom) memcpy(o->u, mom, sizeof(float) * o->d);
}
