/* --resume across a job's restarts (hearsay/checkpoint.h, "Timelines"): the newest checkpoint,
 * rejoining through the members it names, which checkpoint a resumed peer may continue from
 * once it knows the job's timeline and round, and the timeline as it travels at the head of
 * every welcome snapshot. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
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

/* The shard of a checkpoint file name "ckpt-RANK-ROUND.hsck" other than `rank` in dir, or -1.
 * Names only: no file is read. */
static int other_shard(const char *dir, int rank) {
    DIR *d = opendir(dir);
    struct dirent *e;
    int found = -1;
    while (d && found < 0 && (e = readdir(d))) {
        int r, len = 0;
        unsigned long long round;
        if (sscanf(e->d_name, "ckpt-%d-%llu.hsck%n", &r, &round, &len) == 2 &&
            e->d_name[len] == '\0' && r >= 0 && r != rank)
            found = r;
    }
    if (d) closedir(d);
    return found;
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
    if (err < 0) return err;
    /* Without a rank the shard is the checkpoint's; in a directory shared by several shards
     * every peer would take the newest file's, and those peers would restart as one shard,
     * each removing the others' files. */
    int other = cfg->rank < 0 ? other_shard(cfg->checkpoint_dir, ck->rank) : -1;
    if (other >= 0) {
        int mine = ck->rank;
        hs_checkpoint_clear(ck);
        return hs__err(HS_EINVAL, "--resume: %s holds checkpoints of shards %d and %d: which one "
                       "is this peer's is unknown without a rank; give --rank (or a checkpoint "
                       "directory of its own to each peer)",
                       cfg->checkpoint_dir, mine, other);
    }
    return 1;
}

void hs__node_ck_shed(hs_checkpoint *ck) {
    free(ck->data);
    ck->data = NULL, ck->state = NULL, ck->state_len = 0, ck->len = 0;
}

int hs__node_ck_state(const hs__node_cfg *cfg, const char *sig, hs_checkpoint *ck) {
    if (ck->data) return 0;
    hs_checkpoint c;
    memset(&c, 0, sizeof(c));
    hs_timeline t = ck->timeline;
    int err = cfg->checkpoint_dir ? hs_checkpoint_find(cfg->checkpoint_dir, ck->rank, sig, &t,
                                                       ck->round, &c)
                                  : HS_ENOENT;
    if (err == 0 && (c.round != ck->round || c.timeline.id != ck->timeline.id)) {
        hs_checkpoint_clear(&c);
        err = HS_ENOENT;
    }
    if (err < 0)
        return hs__err(err == HS_ENOENT ? HS_ENOENT : err,
                       "--resume: the checkpoint of shard %d, round %llu, in %s is gone or "
                       "changed since the start", ck->rank, (unsigned long long)ck->round,
                       cfg->checkpoint_dir ? cfg->checkpoint_dir : "(no directory)");
    hs_checkpoint_clear(ck);
    *ck = c;
    return 0;
}

int hs__node_resume_rejoin(const hs_checkpoint *ck, hs_net_config *nc, int join_ms, int first,
                           int hold, int err, hs_net **net, hs_net_welcome *w, char *addr,
                           size_t cap, int *alone) {
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
        /* The whole job stopped: it restarts once its members are in, from the newest round
         * any of them holds (hs__node_restart_agree), not from this peer's alone. */
        if (hold > 1)
            HS_LOGW("no member of the checkpoint's job answers: restarting the job, from its "
                    "round %llu or a member's newer one, once %d members are in",
                    (unsigned long long)ck->round, hold);
        else
            HS_LOGW("no member of the checkpoint's job answers: going on from its round %llu",
                    (unsigned long long)ck->round);
        nc->bootstrap = NULL;
        if (hold > 1) nc->hold_members = hold;
        err = hs_net_start(net, nc, w);
        *alone = 1;
    }
    return err;
}

int hs__node_resume_timeline(const hs__node_cfg *cfg, int rank, const char *sig,
                             const uint8_t *welcome_tl, uint64_t join_round, int job_model,
                             int restart, int *have_ck, hs_checkpoint *ck, hs_timeline *tl) {
    if (welcome_tl) {
        int err = hs__node_timeline_get(welcome_tl, tl);
        if (err < 0) return err;
        /* A restart's round is not known yet: a checkpoint of its history waits for it. */
        if (restart && *have_ck && hs_timeline_has(tl, ck->timeline.id, ck->round)) return 1;
        if (*have_ck && cfg->checkpoint_dir)
            *have_ck = hs__node_resume_pick(cfg, rank, sig, tl, join_round, job_model, ck);
        return 0;
    }
    /* The first peer of a restart: its checkpoint's timeline until the job branches from it. */
    if (restart && *have_ck) {
        *tl = ck->timeline;
        return 1;
    }
    hs_timeline_new(tl, *have_ck ? &ck->timeline : NULL, *have_ck ? ck->round : 0);
    if (*have_ck) hs_checkpoint_drop_abandoned(cfg->checkpoint_dir, rank, tl, ck->round);
    return 0;
}

/* splitmix64's finalizer: ids of branches that every member computes alike. */
static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* The newest checkpoint of another shard of t's history at most `every` rounds before
 * `round`, from a checkpoint directory the shards share, into *ck; its shard, or -1. */
static int other_shard_near(const hs__node_cfg *cfg, int rank, const char *sig,
                            const hs_timeline *t, uint64_t round, uint64_t every,
                            hs_checkpoint *ck) {
    int best = -1;
    for (int r = 0; r < cfg->world && cfg->checkpoint_dir; r++) {
        hs_checkpoint c;
        memset(&c, 0, sizeof(c));
        if (r == rank || hs_checkpoint_find(cfg->checkpoint_dir, r, sig, t, round, &c) < 0)
            continue;
        if (round - c.round <= every && (best < 0 || c.round > ck->round)) {
            hs_checkpoint_clear(ck);
            *ck = c;
            best = r;
        } else {
            hs_checkpoint_clear(&c);
        }
    }
    return best;
}

int hs__node_restart_agree(const hs__node_cfg *cfg, int rank, const char *sig, hs_timeline *tl,
                           uint64_t round, hs_checkpoint *ck, int have_ck, int members) {
    hs_timeline from = *tl;
    hs_timeline_new(tl, &from, round);
    /* Every member branches from the same timeline at the same round: one id at all of them,
     * so that the files they write from now on are of one timeline. */
    uint64_t z = mix64(from.id ^ mix64(round + 0x9e3779b97f4a7c15ULL));
    tl->id = z ? z : 1;
    uint64_t every = cfg->checkpoint_every > 0 ? (uint64_t)cfg->checkpoint_every
                                               : (uint64_t)HS__NODE_CHECKPOINT_EVERY;
    uint64_t own = have_ck ? ck->round : 0;
    int took = -1;
    /* Ahead of the job (its round reached it through another member, not the sequencer): back
     * to a checkpoint of this shard within an interval of the round, when there is one. */
    if (have_ck && own > round && cfg->checkpoint_dir) {
        hs_checkpoint c;
        memset(&c, 0, sizeof(c));
        if (hs_checkpoint_find(cfg->checkpoint_dir, rank, sig, &from, round, &c) == 0 &&
            round - c.round <= every) {
            hs_checkpoint_clear(ck);
            *ck = c;
            took = rank;
        } else {
            hs_checkpoint_clear(&c);
        }
    }
    if (took < 0 && (!have_ck || own > round || round - own > every)) {
        hs_checkpoint near;
        memset(&near, 0, sizeof(near));
        if ((took = other_shard_near(cfg, rank, sig, &from, round, every, &near)) >= 0) {
            hs_checkpoint_clear(ck);
            *ck = near;
        }
    }
    char mine[96] = "it has no checkpoint";
    if (have_ck)
        snprintf(mine, sizeof(mine), "its newest is of round %llu", (unsigned long long)own);
    if (took == rank)
        HS_LOGW("--resume: the job restarts at round %llu, before this shard's newest checkpoint "
                "(round %llu: its round reached the job through another member, not the "
                "sequencer): going back to its checkpoint of round %llu",
                (unsigned long long)round, (unsigned long long)own, (unsigned long long)ck->round);
    else if (took >= 0)
        HS_LOGW("--resume: the job restarts at round %llu, the newest checkpoint round of its %d "
                "members; shard %d is more than --checkpoint-every %llu rounds behind it (%s): "
                "resuming from shard:%d (round %llu), that shard's checkpoint in %s, instead",
                (unsigned long long)round, members, rank, (unsigned long long)every, mine, took,
                (unsigned long long)ck->round, cfg->checkpoint_dir);
    else if (!have_ck)
        HS_LOGW("--resume: the job restarts at round %llu, the newest checkpoint round of its %d "
                "members; shard %d has no checkpoint of it: it goes on from the job's model",
                (unsigned long long)round, members, rank);
    else if (own > round)
        HS_LOGW("--resume: the job restarts at round %llu, before this shard's checkpoint of round "
                "%llu (its round reached the job through another member, not the sequencer), and "
                "no checkpoint within --checkpoint-every %llu rounds of the job's is in %s: going "
                "on from it", (unsigned long long)round, (unsigned long long)own,
                (unsigned long long)every, cfg->checkpoint_dir);
    else if (round - own > every)
        HS_LOGW("--resume: the job restarts at round %llu, the newest checkpoint round of its %d "
                "members; this shard's newest is of round %llu, %llu rounds (more than "
                "--checkpoint-every %llu) behind, and no shard's checkpoint near the job's round "
                "is in %s: it goes on from that model",
                (unsigned long long)round, members, (unsigned long long)own,
                (unsigned long long)(round - own), (unsigned long long)every,
                cfg->checkpoint_dir);
    else
        HS_LOGI("--resume: the job restarts at round %llu, the newest checkpoint round of its %d "
                "members; this shard goes on from its checkpoint of round %llu",
                (unsigned long long)round, members, (unsigned long long)own);
    if (cfg->checkpoint_dir && !(have_ck && own > round && took < 0)) {
        int gone = hs_checkpoint_drop_abandoned(cfg->checkpoint_dir, rank, tl, round);
        if (gone > 0)
            HS_LOGI("--resume: removed %d checkpoint(s) of shard %d that the job will never load",
                    gone, rank);
    }
    return took >= 0;
}
