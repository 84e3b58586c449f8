/* hearsay: checkpoint files of one peer's training state.
 *
 * A checkpoint is one file DIR/ckpt-<shard>-<round, 12 digits>.hsck holding an opaque state
 * (hs_trainer_save), the round it was taken at, the job's end round, the peer's id, the model
 * signature it is valid for, the members the peer knew (to rejoin through), and the job's first
 * round (random compressors and a topology's schedule count rounds from it). Files are
 * written to a temporary name, fsync'd and renamed, so a crash leaves the old file or the new
 * one, never half of one; a CRC-32 over every byte before it makes any flipped bit detectable.
 * Peers sharing a directory keep their own files (by shard); one process writes a shard at a
 * time. Layout (little-endian), version 5:
 *   "HSCK" | u32 version | u64 round | u64 end round | u32 peer id | u32 signature length |
 *   u64 timeline | u32 ancestor count | per ancestor: u64 timeline, u64 round |
 *   signature | u32 member count | per member: u32 id, u16 address length, address |
 *   u64 first round | u64 state length | state | u32 crc32 of all preceding bytes
 * The first round is the end round less the job's round count (modulo 2^64). Version 4, the
 * same without it, is still read (has_first_round 0): a peer resumed from one without a
 * running job to tell it the job's count counts from its own --rounds, as before version 5.
 *
 * Timelines: a job that restarts from checkpoints (every peer stopped, then --resume) goes on
 * from one round of its past; what its peers wrote after that round belongs to a timeline the
 * job abandoned. Each start of a job or restart gets a new timeline id, and remembers the ones
 * it branched from and at which round: a file is of the job's history when it is of the job's
 * timeline, or of an ancestor at or before the round the job branched from it. Only such files
 * are ever loaded into a running job; the others are removed when a peer learns the job's.
 *
 * Threading: no shared state; call from one thread per directory and shard. */
#ifndef HEARSAY_CHECKPOINT_H
#define HEARSAY_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* How many checkpoints of a shard are kept: older ones are removed after each write. */
#define HS_CHECKPOINT_KEEP 3
/* Members' addresses a read checkpoint keeps (to rejoin through). */
#define HS_CHECKPOINT_MAX_ADDRS 16

/* Ancestors a timeline remembers (older branchings are forgotten: their files are long
 * pruned). */
#define HS_TIMELINE_ANCESTORS 8

typedef struct hs_timeline {
    uint64_t id;
    int n_anc; /* ancestors, the one this timeline branched from first */
    uint64_t anc_id[HS_TIMELINE_ANCESTORS];
    uint64_t anc_round[HS_TIMELINE_ANCESTORS]; /* the round the child branched at */
} hs_timeline;

/* A new timeline: of a new job (from NULL), or branching from `from` at `round` (a job
 * restarting from a checkpoint of that round). The id is unique, not reproducible. */
void hs_timeline_new(hs_timeline *out, const hs_timeline *from, uint64_t round);
/* 1 when a checkpoint of timeline `id` at `round` is part of t's history, else 0. */
int hs_timeline_has(const hs_timeline *t, uint64_t id, uint64_t round);

/* What a checkpoint says besides the state. */
typedef struct hs_checkpoint_info {
    uint64_t round;     /* the next round to run */
    uint64_t end_round; /* the job's end round */
    int rank;           /* the shard, which names the file */
    uint32_t id;        /* the peer's id when it was written */
    const char *sig;    /* model signature */
    int n_members;      /* members' ids and addresses (borrowed) */
    const uint32_t *member_ids;
    const char *const *member_addrs;
    const hs_timeline *timeline; /* the job's (NULL: id 0, no ancestors) */
    uint64_t first_round;        /* the job's first round (end round - its round count) */
} hs_checkpoint_info;

/* Checks at start that dir can hold checkpoints: creates it when missing and writes and
 * removes a probe file. HS_EIO naming the directory and the reason. */
int hs_checkpoint_dir_check(const char *dir);

/* Removes temporaries of shard `rank` that a writer killed mid-write left in dir (those of
 * other processes: one process writes a shard at a time). Returns how many were removed. */
int hs_checkpoint_clean_tmp(const char *dir, int rank);

/* Writes state (len bytes) atomically, then keeps the HS_CHECKPOINT_KEEP newest of the shard's
 * files of the writer's history and removes those off it (abandoned timelines); neither this
 * file nor one of a later round of the history is ever removed (newer progress must survive a
 * peer that somehow restarted behind it). *bytes_out (may be NULL) is the file's size.
 * HS_EIO naming the file. */
int hs_checkpoint_write(const char *dir, const hs_checkpoint_info *info, const uint8_t *state,
                        size_t len, size_t *bytes_out);

/* A checkpoint read back, validated completely. */
typedef struct hs_checkpoint {
    uint64_t round, end_round;
    uint64_t first_round; /* the job's, when has_first_round (0: a version-4 file) */
    int has_first_round;
    int rank; /* from the file name */
    uint32_t id;
    hs_timeline timeline;
    const uint8_t *state; /* into data */
    size_t state_len;
    int n_members;
    uint32_t ids[HS_CHECKPOINT_MAX_ADDRS];
    char addrs[HS_CHECKPOINT_MAX_ADDRS][256];
    uint8_t *data; /* the whole file, owned */
    size_t len;
} hs_checkpoint;

/* Reads and validates one file against the model signature sig: HS_EFORMAT (truncated,
 * checksum mismatch, not a checkpoint, other version), HS_EMISMATCH (another model), HS_EIO. */
int hs_checkpoint_read(const char *path, const char *sig, hs_checkpoint *out);

/* The newest valid checkpoint of shard `rank` (every shard's when rank < 0) in dir; corrupt or
 * foreign files are logged with their reason and skipped. HS_ENOENT when there is none. */
int hs_checkpoint_newest(const char *dir, int rank, const char *sig, hs_checkpoint *out);

/* The newest valid checkpoint of shard `rank` in dir that is of t's history and of a round
 * at most max_round: the one a peer may resume from in a job of timeline t at round max_round.
 * HS_ENOENT when there is none (without a message logged for each file that is not). */
int hs_checkpoint_find(const char *dir, int rank, const char *sig, const hs_timeline *t,
                       uint64_t max_round, hs_checkpoint *out);
/* Removes the files of shard `rank` that are not of t's history or are of a round after
 * max_round: a job at round max_round of timeline t will never load them. Returns how many. */
int hs_checkpoint_drop_abandoned(const char *dir, int rank, const hs_timeline *t,
                                 uint64_t max_round);
/* Frees what a read checkpoint owns and zeroes it; accepts a zeroed one. */
void hs_checkpoint_clear(hs_checkpoint *ck);

#ifdef __cplusplus
}
#endif
#endif
