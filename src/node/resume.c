/* --resume across a job's restarts (hearsay/checkpoint.h, "Timelines"): the newest checkpoint,
 * rejoining through the members it names, which checkpoint a resumed peer may continue from
 * once it knows the job's timeline and round, and the timeline as it travels at the head of
 * every welcome snapshot. */
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

int hs__node_resume_load(const hs__node_cfg *cfg, const char *sig, hs_checkpoint *ck) {
    if (!cfg->checkpoint_dir) return hs__err(HS_EINVAL, "--resume needs --checkpoint-dir");
    /* Files are named by shard: a resumed peer knows its rank, not the id it had. A job
     * stopped before its first checkpoint restarts with the same command, from the start. */
    int err = hs_checkpoint_newest(cfg->checkpoint_dir, cfg->rank, sig, ck);
    if (err == HS_ENOENT && cfg->resume != HS__NODE_RESUME_REQUIRE) {
        HS_LOGW("%s: starting without one, as a new peer (--resume=require refuses this)",
                hs_error_message());
        return 0;
    }
    return err < 0 ? err : 1;
}

int hs__node_resume_rejoin(const hs_checkpoint *ck, hs_net_config *nc, int join_ms, int first,
                           int err, hs_net **net, hs_net_welcome *w, char *addr, size_t cap,
                           int *alone) {
    /* Rejoin through the members the checkpoint knew, each tried briefly; not through this
     * peer's own old entry (it is not a member until it has rejoined). */
    hs_net_config nk = *nc;
    nk.join_timeout_ms = join_ms < 3000 ? join_ms : 3000;
    for (int i = 0; i < ck->n_members && !*net && !hs__node_refusal_final(err); i++) {
        if (ck->ids[i] == ck->id) continue;
        HS_LOGI("rejoining through %s, a member in the checkpoint", ck->addrs[i]);
        nk.bootstrap = ck->addrs[i];
        if ((err = hs_net_start(net, &nk, w)) == 0) {
            snprintf(addr, cap, "%s", nk.bootstrap);
            nc->bootstrap = addr;
        }
    }
    if (!*net && first && !hs__node_refusal_final(err)) {
        HS_LOGW("no member of the checkpoint's job answers: going on from its round %llu",
                (unsigned long long)ck->round);
        nc->bootstrap = NULL;
        err = hs_net_start(net, nc, w);
        *alone = 1;
    }
    return err;
}

int hs__node_resume_timeline(const hs__node_cfg *cfg, int rank, const char *sig,
                             const uint8_t *welcome_tl, uint64_t join_round, int job_model,
                             int *have_ck, hs_checkpoint *ck, hs_timeline *tl) {
    if (welcome_tl) {
        int err = hs__node_timeline_get(welcome_tl, tl);
        if (err < 0) return err;
        if (*have_ck && cfg->checkpoint_dir)
            *have_ck = hs__node_resume_pick(cfg, rank, sig, tl, join_round, job_model, ck);
        return 0;
    }
    hs_timeline_new(tl, *have_ck ? &ck->timeline : NULL, *have_ck ? ck->round : 0);
    if (*have_ck) hs_checkpoint_drop_abandoned(cfg->checkpoint_dir, rank, tl, ck->round);
    return 0;
}
