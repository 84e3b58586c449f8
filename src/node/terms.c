/* The job's terms (hs__node_terms: its end round, its round count, the members its first peers
 * wait for) as a peer learns them: at the head of a welcome snapshot, or its own until then,
 * and which of them a starting, joining, resumed or restarted peer goes by. The job's first
 * round (end - rounds) is what random compressors' keys and a topology's schedule count from:
 * every member must hold the same one. */
#include <string.h>

#include "core/error_internal.h"
#include "core/log.h"
#include "node/node_internal.h"

int hs__node_same_start(int same_start, int have_ck, int restart, uint64_t job_end,
                        int64_t rounds, uint64_t start_round, long steps) {
    int first = job_end == 0 ||
                (rounds >= 0 && job_end >= (uint64_t)rounds && start_round <= job_end - (uint64_t)rounds);
    return same_start && !have_ck && !restart && first && steps == 0;
}

/* Reads the job's terms at the head of a welcome snapshot, validated. */
int hs__node_terms_read(const hs_net_welcome *w, hs__node_terms *jt) {
    if (!w->snapshot || w->snapshot->len < HS__NODE_TERMS_BYTES)
        return hs__err(HS_EFORMAT, "welcome snapshot: %zu bytes (the job's terms are %d)",
                       w->snapshot ? w->snapshot->len : 0, HS__NODE_TERMS_BYTES);
    memcpy(jt, w->snapshot->data, 24);
    if (jt->rounds < 1 || jt->wait < -(1 << 20) || jt->wait > (1 << 20))
        return hs__err(HS_EFORMAT, "welcome snapshot: %lld rounds, waiting for %lld peers",
                       (long long)jt->rounds, (long long)jt->wait);
    return 0;
}

/* The job's round count a resumed peer goes by: the welcome's (the running job's, or that of
 * the peer restarting it); else its checkpoint's; else (a version-4 checkpoint, which does not
 * record it) its own, said. With another count than the job's its keys and place in a schedule
 * would be offset from its neighbours' (randk messages refused, QSGD decoded otherwise). */
static int64_t resumed_rounds(const hs__node_cfg *cfg, const hs__node_terms *wj, int has_wj,
                              const hs_checkpoint *ck, int64_t own) {
    if (has_wj) return wj->rounds;
    /* Modulo 2^64, as written: the count comes back even where end - rounds wrapped. */
    int64_t c = (int64_t)(ck->end_round - ck->first_round);
    if (ck->has_first_round && c >= 1 && c <= HS__NODE_NO_END) return c;
    HS_LOGW("--resume: the checkpoint of round %llu does not record the job's first round (%s): "
            "taking the job's round count from this peer's --rounds %ld; give the job's own "
            "(another count draws random compressors and follows a schedule out of step with "
            "the job's)",
            (unsigned long long)ck->round,
            ck->has_first_round ? "an impossible one" : "a version-4 file", cfg->rounds);
    return own;
}

int hs__node_terms_pick(const hs__node_cfg *cfg, const hs_net_welcome *w,
                        const hs__node_terms *wj, int has_wj, int restart, int have_ck,
                        const hs_checkpoint *ck, hs__node_terms *jt) {
    int64_t own = cfg->rounds > 0 ? cfg->rounds : HS__NODE_NO_END;
    *jt = (hs__node_terms){0, own, cfg->wait_peers};
    if (have_ck) jt->rounds = resumed_rounds(cfg, wj, has_wj, ck, own);
    if (restart) {
        *jt = have_ck ? (hs__node_terms){ck->end_round, jt->rounds, has_wj ? wj->wait : -jt->wait}
                      : *wj;
    } else if (!have_ck && w->snapshot) {
        int err = hs__node_terms_read(w, jt);
        if (err < 0) return err;
    }
    if ((have_ck || w->snapshot) && jt->rounds != own)
        HS_LOGW("--rounds %ld: the job trains %lld rounds (the count of the peer that started "
                "it); this peer follows the job's count and ends with it",
                cfg->rounds, (long long)jt->rounds);
    return 0;
}
