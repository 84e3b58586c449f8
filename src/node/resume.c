/* --resume across a job's restarts (hearsay/checkpoint.h, "Timelines"): which checkpoint a
 * resumed peer may continue from once it knows the job's timeline and round, and the timeline
 * as it travels at the head of every welcome snapshot. */
#include <stdio.h>
#include <string.h>

#include "core/error_internal.h"
#include "core/log.h"
#include "node/node_internal.h"

size_t hs__node_timeline_put(const hs_timeline *t, uint8_t *out) {
    memcpy(out, &t->id, 8);
    uint32_t n = (uint32_t)t->n_anc;
    memcpy(out + 8, &n, 4);
    memset(out + 12, 0, 16 * HS_TIMELINE_ANCESTORS);
    for (int i = 0; i < t->n_anc; i++) {
        memcpy(out + 12 + 16 * i, &t->anc_id[i], 8);
        memcpy(out + 20 + 16 * i, &t->anc_round[i], 8);
    }
    return HS__NODE_TIMELINE_BYTES;
}

int hs__node_timeline_get(const uint8_t *p, hs_timeline *t) {
    uint32_t n;
    memset(t, 0, sizeof(*t));
    memcpy(&t->id, p, 8);
    memcpy(&n, p + 8, 4);
    if (n > HS_TIMELINE_ANCESTORS)
        return hs__err(HS_EFORMAT, "welcome snapshot: %u ancestor timelines (at most %d)", n,
                       HS_TIMELINE_ANCESTORS);
    t->n_anc = (int)n;
    for (int i = 0; i < t->n_anc; i++) {
        memcpy(&t->anc_id[i], p + 12 + 16 * i, 8);
        memcpy(&t->anc_round[i], p + 20 + 16 * i, 8);
    }
    return 0;
}

int hs__node_resume_pick(const hs__node_cfg *cfg, int rank, const char *sig,
                         const hs_timeline *t, uint64_t round, int job_model, hs_checkpoint *ck) {
    const char *dir = cfg->checkpoint_dir;
    uint64_t every = cfg->checkpoint_every > 0 ? (uint64_t)cfg->checkpoint_every
                                               : (uint64_t)HS__NODE_CHECKPOINT_EVERY;
    uint64_t own = ck->round, own_tl = ck->timeline.id;
    int kept = own <= round && hs_timeline_has(t, own_tl, own);
    if (!kept) {
        hs_checkpoint_clear(ck);
        kept = hs_checkpoint_find(dir, rank, sig, t, round, ck) == 0;
    }
    /* More than one interval behind the job: the job's model is newer than anything here
     * (when the welcome has one: a job that has not taken its first snapshot yet has not
     * trained since its restart either). */
    if (kept && job_model && round - ck->round > every) {
        hs_checkpoint_clear(ck);
        kept = 0;
    }
    char why[200];
    if (own > round)
        snprintf(why, sizeof(why), "its newest (round %llu) is ahead of the job, of a timeline "
                 "the job left at an earlier round", (unsigned long long)own);
    else if (!hs_timeline_has(t, own_tl, own))
        snprintf(why, sizeof(why), "its newest (round %llu) is of a timeline the job abandoned",
                 (unsigned long long)own);
    else
        snprintf(why, sizeof(why), "its newest is of round %llu", (unsigned long long)own);
    if (!kept)
        HS_LOGW("--resume: the job is at round %llu; no checkpoint of shard %d within %llu rounds "
                "(--checkpoint-every) of it on the job's timeline (%s): %s",
                (unsigned long long)round, rank, (unsigned long long)every, why,
                job_model ? "taking the job's model instead" : "starting from the initial model");
    else if (ck->round != own)
        HS_LOGW("--resume: the job is at round %llu; going back to this shard's checkpoint of "
                "round %llu (%s)",
                (unsigned long long)round, (unsigned long long)ck->round, why);
    int gone = hs_checkpoint_drop_abandoned(dir, rank, t, round);
    if (gone > 0)
        HS_LOGI("--resume: removed %d checkpoint(s) of shard %d that the job will never load",
                gone, rank);
    return kept;
}
