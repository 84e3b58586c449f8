/* The metrics record (hearsay/metrics.h): the one table of field names and kinds, the JSON
 * line every command writes, and the metrics file. docs/METRICS.md documents each field; a
 * unit test holds the two lists equal. */
#include "hearsay/metrics.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "core/error_internal.h"
#include "core/log.h"

_Static_assert(HS_MF_COUNT <= 64, "hs_metrics_rec.set has one bit per field");

/* Numbers are written with 9 significant digits, enough for any float; a timestamp needs its
 * microseconds, and virtual time all of a double's digits (tests compare it to the model's
 * formula). */
static const struct {
    const char *name;
    hs_metrics_kind kind;
    const char *fmt;
} fields[HS_MF_COUNT] = {
    [HS_MF_PEER] = {"peer", HS_MK_INT},
    [HS_MF_EVENT] = {"event", HS_MK_STR},
    [HS_MF_REASON] = {"reason", HS_MK_STR},
    [HS_MF_ADVICE] = {"advice", HS_MK_STR},
    [HS_MF_ROUND] = {"round", HS_MK_NUM},
    [HS_MF_STEP] = {"step", HS_MK_INT},
    [HS_MF_EPOCH] = {"epoch", HS_MK_NUM},
    [HS_MF_TIME] = {"time", HS_MK_NUM},
    [HS_MF_UNIX_TIME] = {"unix_time", HS_MK_NUM, "%.6f"},
    [HS_MF_TRAIN_TIME] = {"train_time", HS_MK_NUM},
    [HS_MF_LOSS] = {"loss", HS_MK_NUM},
    [HS_MF_LR] = {"lr", HS_MK_NUM},
    [HS_MF_TEST_ACC] = {"test_acc", HS_MK_NUM},
    [HS_MF_TEST_ACC_MIN] = {"test_acc_min", HS_MK_NUM},
    [HS_MF_TEST_ACC_MAX] = {"test_acc_max", HS_MK_NUM},
    [HS_MF_TEST_LOSS] = {"test_loss", HS_MK_NUM},
    [HS_MF_CONSENSUS] = {"consensus", HS_MK_NUM},
    [HS_MF_MISSING] = {"missing", HS_MK_INT},
    [HS_MF_RESYNCS] = {"resyncs", HS_MK_INT},
    [HS_MF_BYTES_SENT] = {"bytes_sent", HS_MK_INT},
    [HS_MF_BYTES_RECV] = {"bytes_recv", HS_MK_INT},
    [HS_MF_WIRE_BYTES_SENT] = {"wire_bytes_sent", HS_MK_INT},
    [HS_MF_WIRE_BYTES_RECV] = {"wire_bytes_recv", HS_MK_INT},
    [HS_MF_MEMBERS] = {"members", HS_MK_INT},
    [HS_MF_CONNS] = {"conns", HS_MK_INT},
    [HS_MF_PEERS_DEAD] = {"peers_dead", HS_MK_INT},
    [HS_MF_RESEND_ASKED] = {"resend_asked", HS_MK_INT},
    [HS_MF_RECV_TIMEOUTS] = {"recv_timeouts", HS_MK_INT},
    [HS_MF_ROUNDS_PER_S] = {"rounds_per_s", HS_MK_NUM},
    [HS_MF_SAMPLES_PER_S] = {"samples_per_s", HS_MK_NUM},
    [HS_MF_PUSH_WEIGHT] = {"push_weight", HS_MK_NUM},
    [HS_MF_STALENESS_MAX] = {"staleness_max", HS_MK_INT},
    [HS_MF_STALENESS_MEAN] = {"staleness_mean", HS_MK_NUM},
    [HS_MF_WAITS] = {"waits", HS_MK_INT},
    [HS_MF_ROUNDS_MIN] = {"rounds_min", HS_MK_INT},
    [HS_MF_ROUNDS_MAX] = {"rounds_max", HS_MK_INT},
    [HS_MF_VTIME] = {"vtime", HS_MK_NUM, "%.17g"},
    [HS_MF_VTIME_DDP] = {"vtime_ddp", HS_MK_NUM, "%.17g"},
};

const char *hs_metrics_field_name(int f) {
    return f >= 0 && f < HS_MF_COUNT ? fields[f].name : NULL;
}

int hs_metrics_field_kind(int f) {
    return f >= 0 && f < HS_MF_COUNT ? (int)fields[f].kind : -1;
}

int hs_metrics_field_find(const char *name) {
    for (int f = 0; name && f < HS_MF_COUNT; f++)
        if (!strcmp(fields[f].name, name)) return f;
    return -1;
}

void hs_metrics_init(hs_metrics_rec *m) {
    memset(m, 0, sizeof(*m));
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    hs_metrics_set(m, HS_MF_UNIX_TIME, (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec);
}

void hs_metrics_set(hs_metrics_rec *m, hs_metrics_field f, double v) {
    if ((int)f < 0 || f >= HS_MF_COUNT || fields[f].kind == HS_MK_STR) return;
    m->num[f] = v;
    m->set |= 1ull << f;
}

void hs_metrics_set_str(hs_metrics_rec *m, hs_metrics_field f, const char *v) {
    if ((int)f < 0 || f >= HS_MF_COUNT || fields[f].kind != HS_MK_STR) return;
    m->str[f] = v ? v : "";
    m->set |= 1ull << f;
}

static int is_set(const hs_metrics_rec *m, int f) { return (m->set >> f) & 1; }

double hs_metrics_get(const hs_metrics_rec *m, hs_metrics_field f) {
    return (int)f >= 0 && f < HS_MF_COUNT && is_set(m, f) && fields[f].kind != HS_MK_STR ? m->num[f]
                                                                                         : NAN;
}

const char *hs_metrics_get_str(const hs_metrics_rec *m, hs_metrics_field f) {
    return (int)f >= 0 && f < HS_MF_COUNT && is_set(m, f) ? m->str[f] : NULL;
}

/* An algorithm's own metric: its field when the table has one, else an extra under its name. */
static void take_algo_metric(void *ctx, const char *name, double v, int is_int) {
    hs_metrics_rec *m = ctx;
    int f = hs_metrics_field_find(name);
    if (f >= 0) {
        hs_metrics_set(m, (hs_metrics_field)f, v);
    } else if (m->n_extra < HS_METRICS_EXTRA_MAX) {
        m->extra[m->n_extra].name = name;
        m->extra[m->n_extra].v = v;
        m->extra[m->n_extra].is_int = is_int;
        m->n_extra++;
    }
}

void hs_metrics_from_algo(hs_metrics_rec *m, const hs_algo *a) {
    hs_algo_stats as;
    hs_algo_get_stats(a, &as);
    hs_metrics_set(m, HS_MF_BYTES_SENT, (double)as.bytes_sent);
    hs_metrics_set(m, HS_MF_BYTES_RECV, (double)as.bytes_recv);
    hs_metrics_set(m, HS_MF_CONSENSUS, as.disagreement);
    hs_metrics_set(m, HS_MF_MISSING, as.missing);
    hs_metrics_set(m, HS_MF_RESYNCS, (double)as.resyncs);
    hs_algo_metrics(a, take_algo_metric, m);
}

void hs_metrics_from_net(hs_metrics_rec *m, const hs_net_stats *ns) {
    hs_metrics_set(m, HS_MF_WIRE_BYTES_SENT, (double)ns->bytes_sent);
    hs_metrics_set(m, HS_MF_WIRE_BYTES_RECV, (double)ns->bytes_recv);
    hs_metrics_set(m, HS_MF_MEMBERS, ns->n_members);
    hs_metrics_set(m, HS_MF_CONNS, ns->n_conns);
    hs_metrics_set(m, HS_MF_PEERS_DEAD, (double)ns->peers_dead);
    hs_metrics_set(m, HS_MF_RESEND_ASKED, (double)ns->resend_asked);
    hs_metrics_set(m, HS_MF_RECV_TIMEOUTS, (double)ns->recv_timeouts);
}

/* ------------------------------------------------------------------ the JSON line */

/* snprintf's contract over several appends: len counts everything, buf holds what fits. */
typedef struct out {
    char *buf;
    size_t cap, len;
} out;

static void put(out *o, const char *fmt, ...) HS__PRINTF(2, 3);
static void put(out *o, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    size_t room = o->len < o->cap ? o->cap - o->len : 0;
    int n = vsnprintf(room ? o->buf + o->len : NULL, room, fmt, ap);
    va_end(ap);
    if (n > 0) o->len += (size_t)n;
}

static void put_str(out *o, const char *s) {
    put(o, "\"");
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') put(o, "\\%c", c);
        else if (c < 0x20) put(o, "\\u%04x", c);
        else put(o, "%c", c);
    }
    put(o, "\"");
}

static void put_value(out *o, const char *key, double v, int is_int, const char *fmt,
                      int *first) {
    put(o, *first ? "\"%s\":" : ",\"%s\":", key);
    *first = 0;
    if (!isfinite(v)) put(o, "null");
    else if (is_int) put(o, "%.0f", nearbyint(v));
    else put(o, fmt ? fmt : "%.9g", v);
}

size_t hs_metrics_format(const hs_metrics_rec *m, char *buf, size_t cap) {
    out o = {buf, cap, 0};
    int first = 1;
    put(&o, "{");
    for (int f = 0; f < HS_MF_COUNT; f++) {
        if (!is_set(m, f)) continue;
        if (fields[f].kind == HS_MK_STR) {
            put(&o, first ? "\"%s\":" : ",\"%s\":", fields[f].name);
            first = 0;
            put_str(&o, m->str[f]);
        } else {
            put_value(&o, fields[f].name, m->num[f], fields[f].kind == HS_MK_INT, fields[f].fmt,
                      &first);
        }
    }
    for (int i = 0; i < m->n_extra && i < HS_METRICS_EXTRA_MAX; i++)
        put_value(&o, m->extra[i].name, m->extra[i].v, m->extra[i].is_int, NULL, &first);
    for (int i = 0; m->peer_rounds && i < m->n_peer_rounds; i++) {
        char k[32];
        snprintf(k, sizeof(k), "rounds_%d", i);
        put_value(&o, k, (double)m->peer_rounds[i], 1, NULL, &first);
    }
    put(&o, "}");
    return o.len;
}

/* ------------------------------------------------------------------ the file */

struct hs_metrics_file {
    FILE *f;
    char *line;
    size_t cap;
};

/* A new run never writes over the records of an earlier one, nor appends to them (a file of
 * two runs would plot as one): a non-empty file in the way moves to the first free PATH.N, and
 * the log says where. A resumed run appends, its records continuing the same run's. */
static int move_aside(const char *path) {
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size == 0) return 0;
    char old[4200];
    for (int i = 1; i < 1000; i++) {
        snprintf(old, sizeof(old), "%s.%d", path, i);
        if (lstat(old, &sb) == 0) continue;
        if (rename(path, old) != 0)
            return hs__err(HS_EIO, "metrics file %s exists and cannot be moved to %s: %s", path,
                           old, strerror(errno));
        HS_LOGW("metrics file %s exists: the earlier records moved to %s", path, old);
        return 0;
    }
    return hs__err(HS_EIO, "metrics file %s exists, and so do %s.1 to .999: remove some", path,
                   path);
}

int hs_metrics_open(hs_metrics_file **out_f, const char *path, int append) {
    *out_f = NULL;
    int err;
    if (!append && strcmp(path, "-") != 0 && (err = move_aside(path)) < 0) return err;
    hs_metrics_file *mf = calloc(1, sizeof(*mf));
    if (!mf) return hs__err(HS_ENOMEM, "metrics file %s: out of memory", path);
    mf->f = !strcmp(path, "-") ? stdout : fopen(path, append ? "a" : "w");
    if (!mf->f) {
        int e = errno;
        free(mf);
        return hs__err(HS_EIO, "metrics file %s: %s", path, strerror(e));
    }
    *out_f = mf;
    return 0;
}

int hs_metrics_write(hs_metrics_file *mf, const hs_metrics_rec *m) {
    size_t n = hs_metrics_format(m, mf->line, mf->cap);
    if (n + 2 > mf->cap) {
        /* Grown to the longest line so far: a long run reallocates a handful of times. */
        size_t cap = n + 2 > 2 * mf->cap ? n + 2 : 2 * mf->cap;
        char *nl = realloc(mf->line, cap);
        if (!nl) return hs__err(HS_ENOMEM, "metrics line of %zu bytes: out of memory", n + 1);
        mf->line = nl;
        mf->cap = cap;
        hs_metrics_format(m, mf->line, mf->cap);
    }
    mf->line[n] = '\n';
    if (fwrite(mf->line, 1, n + 1, mf->f) != n + 1 || fflush(mf->f) != 0)
        return hs__err(HS_EIO, "metrics file: write failed: %s", strerror(errno));
    return 0;
}

void hs_metrics_close(hs_metrics_file *mf) {
    if (!mf) return;
    if (mf->f && mf->f != stdout) fclose(mf->f);
    free(mf->line);
    free(mf);
}
