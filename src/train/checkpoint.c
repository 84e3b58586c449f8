/* Checkpoint files (see hearsay/checkpoint.h): atomic writes, rotation, validation on read. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "core/error_internal.h"
#include "core/log.h"
#include "hearsay/buf.h"
#include "hearsay/checkpoint.h"

#define CK_MAGIC "HSCK"
#define CK_VERSION 5u
/* Version 4 lacks the job's first round; it is still read (hearsay/checkpoint.h). */
#define CK_VERSION_OLD 4u
#define CK_VERSION_READ(v) ((v) == CK_VERSION || (v) == CK_VERSION_OLD) /* what this build reads */
#define CK_LIST_MAX 256
#define CK_NAME_MAX 64

static int write_all(int fd, const uint8_t *p, size_t n) {
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* The round in a file name "ckpt-RANK-ROUND.hsck", or -1 when it is not one of ours. */
static long long name_round(const char *name) {
    const char *dash = strrchr(name, '-'), *dot = strrchr(name, '.');
    if (strncmp(name, "ckpt-", 5) != 0 || !dash || !dot || dot < dash || strcmp(dot, ".hsck"))
        return -1;
    char *e;
    long long r = strtoll(dash + 1, &e, 10);
    return e == dot && r >= 0 ? r : -1;
}

/* The checkpoint files of shard `rank` in dir (every shard's when rank < 0), newest first.
 * Returns their number, or -1 when dir cannot be read. */
static int list_checkpoints(const char *dir, int rank, char (*names)[CK_NAME_MAX], int max) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    char prefix[32] = "ckpt-";
    if (rank >= 0) snprintf(prefix, sizeof(prefix), "ckpt-%d-", rank);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < max)
        if (!strncmp(e->d_name, prefix, strlen(prefix)) && name_round(e->d_name) >= 0 &&
            strlen(e->d_name) < CK_NAME_MAX)
            snprintf(names[n++], CK_NAME_MAX, "%s", e->d_name);
    closedir(d);
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (name_round(names[i]) < name_round(names[j])) {
                char t[CK_NAME_MAX];
                memcpy(t, names[i], sizeof(t));
                memcpy(names[i], names[j], sizeof(t));
                memcpy(names[j], t, sizeof(t));
            }
    return n;
}

int hs_checkpoint_dir_check(const char *dir) {
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return hs__err(HS_EIO, "--checkpoint-dir %s: %s", dir, strerror(errno));
    char probe[4096];
    if (snprintf(probe, sizeof(probe), "%s/.probe.%d", dir, (int)getpid()) >= (int)sizeof(probe))
        return hs__err(HS_EINVAL, "--checkpoint-dir %s: path too long", dir);
    int fd = open(probe, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return hs__err(HS_EIO, "--checkpoint-dir %s: cannot write there: %s", dir, strerror(errno));
    close(fd);
    unlink(probe);
    return 0;
}

int hs_checkpoint_clean_tmp(const char *dir, int rank) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    char prefix[32], own[32];
    snprintf(prefix, sizeof(prefix), ".ckpt-%d-", rank);
    snprintf(own, sizeof(own), ".%d.tmp", (int)getpid());
    int removed = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (strncmp(e->d_name, prefix, strlen(prefix)) != 0 || l < 4 ||
            strcmp(e->d_name + l - 4, ".tmp") != 0)
            continue;
        if (l >= strlen(own) && !strcmp(e->d_name + l - strlen(own), own)) continue;
        char p[4096];
        if (snprintf(p, sizeof(p), "%s/%s", dir, e->d_name) < (int)sizeof(p) && unlink(p) == 0) {
            HS_LOGI("removed %s, left by a writer that did not finish", p);
            removed++;
        }
    }
    closedir(d);
    return removed;
}

static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

void hs_timeline_new(hs_timeline *out, const hs_timeline *from, uint64_t round) {
    hs_timeline t;
    memset(&t, 0, sizeof(t));
    /* Unique, not reproducible (a name, not an input of the training): the clock, the process
     * and what it branches from. 0 stays the id of files written without a timeline. */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t z = mix64((uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec);
    z = mix64(z ^ ((uint64_t)getpid() << 20) ^ (from ? mix64(from->id + round) : 0));
    t.id = z ? z : 1;
    if (from) {
        t.anc_id[0] = from->id;
        t.anc_round[0] = round;
        t.n_anc = 1;
        for (int i = 0; i < from->n_anc && t.n_anc < HS_TIMELINE_ANCESTORS; i++, t.n_anc++) {
            t.anc_id[t.n_anc] = from->anc_id[i];
            t.anc_round[t.n_anc] = from->anc_round[i];
        }
    }
    *out = t;
}

int hs_timeline_has(const hs_timeline *t, uint64_t id, uint64_t round) {
    if (id == t->id) return 1;
    for (int i = 0; i < t->n_anc; i++)
        if (id == t->anc_id[i] && round <= t->anc_round[i]) return 1;
    return 0;
}

/* The timeline and round of a file, from its header (not yet validated: enough to decide
 * whether to look at it or remove it, never to load it). 0, or -1 when unreadable. */
static int read_head(const char *path, uint64_t *round, uint64_t *tl) {
    uint8_t h[44];
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    size_t n = fread(h, 1, sizeof(h), f);
    fclose(f);
    uint32_t ver;
    if (n < sizeof(h)) return -1;
    memcpy(&ver, h + 4, 4);
    if (memcmp(h, CK_MAGIC, 4) != 0 || !CK_VERSION_READ(ver)) return -1;
    memcpy(round, h + 8, 8);
    memcpy(tl, h + 32, 8);
    return 0;
}

/* Whether dir/name is of t's history at a round at most max_round (1), or a file of ours that
 * is not (0), or unreadable (-1). */
static int of_history(const char *dir, const char *name, const hs_timeline *t,
                      uint64_t max_round) {
    char p[4096];
    uint64_t r, id;
    if (snprintf(p, sizeof(p), "%s/%s", dir, name) >= (int)sizeof(p) || read_head(p, &r, &id) < 0)
        return -1;
    return r <= max_round && hs_timeline_has(t, id, r);
}

/* Removes the shard's files off t's history (all of a later round than max_round too), then
 * keeps the newest HS_CHECKPOINT_KEEP of the rest, never removing `written` (the file just
 * written) or one of a later round. */
static int prune(const char *dir, int rank, const hs_timeline *t, uint64_t max_round,
                 uint64_t written) {
    /* On the heap, not static: nodes on several threads of a process checkpoint at once. */
    char (*names)[CK_NAME_MAX] = malloc(sizeof(*names) * CK_LIST_MAX);
    if (!names) return 0; /* the old files stay until the next checkpoint */
    int n = list_checkpoints(dir, rank, names, CK_LIST_MAX), kept = 0, removed = 0;
    for (int i = 0; i < n; i++) {
        char p[4096];
        if (snprintf(p, sizeof(p), "%s/%s", dir, names[i]) >= (int)sizeof(p)) continue;
        int mine = of_history(dir, names[i], t, max_round);
        if (mine == 0) {
            if (unlink(p) == 0) {
                HS_LOGI("removed %s: of a timeline the job abandoned", p);
                removed++;
            }
            continue;
        }
        if (kept++ < HS_CHECKPOINT_KEEP || (uint64_t)name_round(names[i]) >= written) continue;
        if (unlink(p) == 0) removed++;
    }
    free(names);
    return removed;
}

int hs_checkpoint_drop_abandoned(const char *dir, int rank, const hs_timeline *t,
                                 uint64_t max_round) {
    return prune(dir, rank, t, max_round, 0);
}

/* The file's head: everything before the state's bytes, the state's length included. */
static int put_head(hs_buf *file, const hs_checkpoint_info *in, size_t len) {
    int err;
    uint32_t ver = CK_VERSION, sl = (uint32_t)strlen(in->sig), un = (uint32_t)in->n_members;
    uint64_t slen = len;
    if ((err = hs_buf_append(file, CK_MAGIC, 4)) < 0 || (err = hs_buf_append(file, &ver, 4)) < 0 ||
        (err = hs_buf_append(file, &in->round, 8)) < 0 ||
        (err = hs_buf_append(file, &in->end_round, 8)) < 0 ||
        (err = hs_buf_append(file, &in->id, 4)) < 0 || (err = hs_buf_append(file, &sl, 4)) < 0)
        return err;
    hs_timeline none;
    memset(&none, 0, sizeof(none));
    const hs_timeline *tl = in->timeline ? in->timeline : &none;
    uint32_t na = (uint32_t)tl->n_anc;
    if ((err = hs_buf_append(file, &tl->id, 8)) < 0 || (err = hs_buf_append(file, &na, 4)) < 0)
        return err;
    for (uint32_t i = 0; i < na; i++)
        if ((err = hs_buf_append(file, &tl->anc_id[i], 8)) < 0 ||
            (err = hs_buf_append(file, &tl->anc_round[i], 8)) < 0)
            return err;
    if ((err = hs_buf_append(file, in->sig, sl)) < 0 || (err = hs_buf_append(file, &un, 4)) < 0)
        return err;
    for (int i = 0; i < in->n_members; i++) {
        uint16_t al = (uint16_t)strnlen(in->member_addrs[i], 255);
        if ((err = hs_buf_append(file, &in->member_ids[i], 4)) < 0 ||
            (err = hs_buf_append(file, &al, 2)) < 0 ||
            (err = hs_buf_append(file, in->member_addrs[i], al)) < 0)
            return err;
    }
    if ((err = hs_buf_append(file, &in->first_round, 8)) < 0) return err;
    return hs_buf_append(file, &slen, 8);
}

int hs_checkpoint_write(const char *dir, const hs_checkpoint_info *in, const uint8_t *state,
                        size_t len, size_t *bytes_out) {
    hs_buf *head = NULL;
    int err, fd = -1;
    char tmp[4096], final_path[4096];
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return hs__err(HS_EIO, "checkpoint directory %s: %s", dir, strerror(errno));
    if ((err = hs_buf_new(&head, 4096)) < 0) return err;
    if ((err = put_head(head, in, len)) < 0) goto out;
    /* The state goes to the file from where it is, not through a copy of the whole file (a
     * model of several GB would need twice its size): the checksum follows the bytes written. */
    uint32_t crc = (uint32_t)crc32_z(0L, head->data, head->len);
    crc = (uint32_t)crc32_z(crc, state, len);
    snprintf(final_path, sizeof(final_path), "%s/ckpt-%d-%012llu.hsck", dir, in->rank,
             (unsigned long long)in->round);
    snprintf(tmp, sizeof(tmp), "%s/.ckpt-%d-%012llu.%d.tmp", dir, in->rank,
             (unsigned long long)in->round, (int)getpid());
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || write_all(fd, head->data, head->len) != 0 || write_all(fd, state, len) != 0 ||
        write_all(fd, (const uint8_t *)&crc, 4) != 0 || fsync(fd) != 0) {
        err = hs__err(HS_EIO, "checkpoint %s: %s", tmp, strerror(errno));
        goto out;
    }
    close(fd);
    fd = -1;
    if (rename(tmp, final_path) != 0) {
        err = hs__err(HS_EIO, "checkpoint %s: rename: %s", final_path, strerror(errno));
        unlink(tmp);
        goto out;
    }
    /* The rename is durable once the directory is synced. */
    int dfd = open(dir, O_RDONLY | O_DIRECTORY);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    const hs_timeline *tl = in->timeline;
    hs_timeline none;
    memset(&none, 0, sizeof(none));
    prune(dir, in->rank, tl ? tl : &none, UINT64_MAX, in->round);
    if (bytes_out) *bytes_out = head->len + len + 4;
out:
    if (fd >= 0) {
        close(fd);
        unlink(tmp);
    }
    hs_buf_unref(head);
    return err;
}

void hs_checkpoint_clear(hs_checkpoint *ck) {
    free(ck->data);
    memset(ck, 0, sizeof(*ck));
}

/* Reads n bytes of f into d, which holds zeros (calloc): runs of zeros in the file (an
 * algorithm's scratch saved as zeros, a model's zero weights) are left as they are instead of
 * written, so that the pages of a large zeroed buffer stay untouched and take no memory (a
 * resumed 100M-parameter peer would otherwise hold its scratch's 400 MB while it loads). */
static int read_sparse(FILE *f, uint8_t *d, size_t n) {
    enum { CHUNK = 1 << 16 };
    static const uint8_t zero[CHUNK];
    uint8_t *buf = malloc(CHUNK);
    int err = buf ? 0 : -1;
    for (size_t at = 0; at < n && err == 0; at += CHUNK) {
        size_t k = n - at < CHUNK ? n - at : CHUNK;
        if (fread(buf, 1, k, f) != k) err = -1;
        else if (memcmp(buf, zero, k) != 0) memcpy(d + at, buf, k);
    }
    free(buf);
    return err;
}

int hs_checkpoint_read(const char *path, const char *sig, hs_checkpoint *ck) {
    memset(ck, 0, sizeof(*ck));
    FILE *f = fopen(path, "rb");
    if (!f) return hs__err(HS_EIO, "%s: %s", path, strerror(errno));
    uint8_t *d = NULL;
    int err = 0;
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0) n = ftell(f);
    if (n < 0 || n > (1L << 34) || fseek(f, 0, SEEK_SET) != 0) {
        err = hs__err(HS_EFORMAT, "%s: unreadable size", path);
        goto fail;
    }
    if (!(d = calloc(1, n ? (size_t)n : 1)) || read_sparse(f, d, (size_t)n) < 0) {
        err = hs__err(HS_EIO, "%s: cannot read", path);
        goto fail;
    }
    if (n < 4 || memcmp(d, CK_MAGIC, 4) != 0) {
        err = hs__err(HS_EFORMAT, "%s: not a hearsay checkpoint", path);
        goto fail;
    }
    if (n < 48) {
        err = hs__err(HS_EFORMAT, "%s: truncated", path);
        goto fail;
    }
    uint32_t ver;
    memcpy(&ver, d + 4, 4);
    if (!CK_VERSION_READ(ver)) {
        err = hs__err(HS_EFORMAT, "%s: version %u (this build reads %u and %u)", path, ver,
                      CK_VERSION_OLD, CK_VERSION);
        goto fail;
    }
    /* Every byte is covered: check before trusting any length inside. A file cut short fails
     * here too, but is named for what it most likely is when its lengths do not add up. */
    const uint8_t *p = d + 32, *end = d + n - 4;
    uint32_t crc, sl, nm;
    memcpy(&crc, end, 4);
    int crc_ok = (uint32_t)crc32_z(0L, d, (size_t)(n - 4)) == crc;
#define NEED(k)                                                                                    \
    do {                                                                                           \
        if ((size_t)(end - p) < (size_t)(k)) {                                                     \
            err = hs__err(HS_EFORMAT, "%s: truncated", path);                                      \
            goto fail;                                                                             \
        }                                                                                          \
    } while (0)
    memcpy(&ck->round, d + 8, 8);
    memcpy(&ck->end_round, d + 16, 8);
    memcpy(&ck->id, d + 24, 4);
    memcpy(&sl, d + 28, 4);
    uint32_t na;
    NEED(12);
    memcpy(&ck->timeline.id, p, 8);
    memcpy(&na, p + 8, 4);
    p += 12;
    if (na > HS_TIMELINE_ANCESTORS) {
        err = hs__err(HS_EFORMAT, "%s: %u ancestor timelines", path, na);
        goto fail;
    }
    NEED(16 * (size_t)na);
    for (uint32_t i = 0; i < na; i++, p += 16) {
        memcpy(&ck->timeline.anc_id[i], p, 8);
        memcpy(&ck->timeline.anc_round[i], p + 8, 8);
    }
    ck->timeline.n_anc = (int)na;
    NEED(sl);
    const uint8_t *file_sig = p;
    p += sl;
    NEED(4);
    memcpy(&nm, p, 4);
    p += 4;
    if (nm > 1u << 16) {
        err = hs__err(HS_EFORMAT, "%s: %u members", path, nm);
        goto fail;
    }
    for (uint32_t i = 0; i < nm; i++) {
        uint16_t al;
        NEED(6);
        memcpy(&al, p + 4, 2);
        p += 6;
        NEED(al);
        if (ck->n_members < HS_CHECKPOINT_MAX_ADDRS && al < 256) {
            memcpy(&ck->ids[ck->n_members], p - 6, 4);
            memcpy(ck->addrs[ck->n_members], p, al);
            ck->addrs[ck->n_members][al] = '\0';
            ck->n_members++;
        }
        p += al;
    }
    if (ver != CK_VERSION_OLD) {
        NEED(8);
        memcpy(&ck->first_round, p, 8);
        ck->has_first_round = 1;
        p += 8;
    }
    uint64_t slen;
    NEED(8);
    memcpy(&slen, p, 8);
    p += 8;
#undef NEED
    if (slen != (uint64_t)(end - p)) {
        err = hs__err(HS_EFORMAT, "%s: truncated (state of %llu bytes, %zu present)", path,
                      (unsigned long long)slen, (size_t)(end - p));
        goto fail;
    }
    if (!crc_ok) {
        err = hs__err(HS_EFORMAT, "%s: checksum mismatch (corrupt)", path);
        goto fail;
    }
    if (sl != strlen(sig) || memcmp(file_sig, sig, sl) != 0) {
        err = hs__err(HS_EMISMATCH, "%s: saved for model %.*s, this run uses %s", path,
                      (int)(sl > 100 ? 100 : sl), (const char *)file_sig, sig);
        goto fail;
    }
    fclose(f);
    ck->data = d;
    ck->len = (size_t)n;
    ck->state = p;
    ck->state_len = (size_t)slen;
    return 0;
fail:
    fclose(f);
    free(d);
    memset(ck, 0, sizeof(*ck));
    return err;
}

/* The newest valid checkpoint of the shard, of t's history up to max_round when t is given. */
static int newest(const char *dir, int rank, const char *sig, const hs_timeline *t,
                  uint64_t max_round, hs_checkpoint *ck) {
    char (*names)[CK_NAME_MAX] = malloc(sizeof(*names) * CK_LIST_MAX); /* as in prune */
    if (!names) return hs__err(HS_ENOMEM, "--resume: out of memory");
    int n = list_checkpoints(dir, rank, names, CK_LIST_MAX), err = 0;
    if (n < 0)
        err = hs__err(HS_ENOENT, "--resume: checkpoint directory %s: %s", dir, strerror(errno));
    for (int i = 0; i < n; i++) {
        char p[4096];
        if (snprintf(p, sizeof(p), "%s/%s", dir, names[i]) >= (int)sizeof(p)) continue;
        if (t && of_history(dir, names[i], t, max_round) == 0) continue;
        if (hs_checkpoint_read(p, sig, ck) == 0) {
            ck->rank = atoi(names[i] + 5);
            HS_LOGI("resuming from %s (round %llu) of timeline %016llx", p,
                    (unsigned long long)ck->round, (unsigned long long)ck->timeline.id);
            free(names);
            return 0;
        }
        HS_LOGW("skipping checkpoint: %s", hs_error_message());
    }
    if (n >= 0)
        err = hs__err(HS_ENOENT, "--resume: no valid checkpoint%s%s in %s",
                      rank >= 0 ? " of this shard" : "", t ? " of the job's timeline" : "", dir);
    free(names);
    return err;
}

int hs_checkpoint_newest(const char *dir, int rank, const char *sig, hs_checkpoint *ck) {
    return newest(dir, rank, sig, NULL, 0, ck);
}

int hs_checkpoint_find(const char *dir, int rank, const char *sig, const hs_timeline *t,
                       uint64_t max_round, hs_checkpoint *ck) {
    return newest(dir, rank, sig, t, max_round, ck);
}
