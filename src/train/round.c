/* The round engine (train/round.h). The order below is the one that makes the simulator and
 * the network compute the same floats in the same order (algo-sim-equals-net): begin's
 * messages leave before the local steps, every push of a lockstep round precedes every pull,
 * and the outer step and the optimizer's hook see x after the pull. */
#include <string.h>

#include "train/round.h"

void hs__round_init(hs__round *e, const hs__round_model *m, hs_exchange *ex, uint64_t r) {
    memset(e, 0, sizeof(*e));
    e->m = *m;
    e->ex = ex;
    e->r = r;
    e->next = HS__PH_OPEN;
}

void hs__round_restart(hs__round *e, uint64_t r) {
    e->r = r;
    e->next = HS__PH_OPEN;
}

static int run_phase(hs__round *e, hs__phase ph) {
    void *c = e->m.ctx;
    hs_algo *a = e->m.algo ? e->m.algo(c) : NULL;
    int err;
    switch (ph) {
    case HS__PH_OPEN:
        if (e->m.open && (err = e->m.open(c, e->r)) < 0) return err;
        return a ? hs_algo_begin(a, e->ex, e->r, e->m.x(c)) : 0;
    case HS__PH_LOCAL:
        return e->m.local ? e->m.local(c, e->r, &e->st) : 0;
    case HS__PH_PUSH:
        return a ? hs_algo_push(a, e->ex, e->r, e->m.x(c)) : 0;
    case HS__PH_PULL:
        return a ? hs_algo_pull(a, e->ex, e->r, e->m.x(c)) : 0;
    case HS__PH_CLOSE:
        return e->m.close ? e->m.close(c, e->r) : 0;
    case HS__PH_END:
        return e->m.end ? e->m.end(c, e->r) : 0;
    default:
        return 0;
    }
}

int hs__round_run(hs__round *e, hs__phase until) {
    do {
        hs__phase ph = e->next;
        int rc = run_phase(e, ph);
        if (rc < 0) return rc;
        e->next = (hs__phase)((ph + 1) % HS__PH_COUNT);
        if (ph == HS__PH_END) e->r++;
        if (rc > 0) return rc;
    } while (e->next != until);
    return 0;
}
