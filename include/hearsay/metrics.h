/* hearsay: the metrics record, one definition of every number a run reports.
 *
 * `hearsay sim`, `hearsay train`, `hearsay run` (and a library node) describe their progress with
 * the same record: a set of named fields, each with one meaning and one unit, documented in
 * docs/METRICS.md. A record is written as one JSON object per line (JSON lines), and the
 * progress lines the commands print read their numbers from the record they write, so the two
 * always agree. Fields are written in the order of hs_metrics_field; a field not set is left
 * out of the line (a non-finite number that is set is written as null).
 * Threading: a record and a file are used by one thread at a time. */
#ifndef HEARSAY_METRICS_H
#define HEARSAY_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "hearsay/algo.h"
#include "hearsay/net.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The fields, in the order they are written. The numbering is not a file format: readers go
 * by name (hs_metrics_field_name). */
typedef enum hs_metrics_field {
    HS_MF_PEER,            /* int: the peer's id (run) */
    HS_MF_EVENT,           /* string: absent on progress records; done, stopped, interrupted,
                              diverged on the last record */
    HS_MF_REASON,          /* string: why the run diverged */
    HS_MF_ADVICE,          /* string: what to change */
    HS_MF_ROUND,           /* number: rounds completed (in the job's numbering for run) */
    HS_MF_STEP,            /* int: optimizer steps completed (train) */
    HS_MF_EPOCH,           /* number: passes over the peer's shard */
    HS_MF_TIME,            /* number, s: since the run started (monotonic clock) */
    HS_MF_UNIX_TIME,       /* number, s: wall clock when the record was made (Unix time) */
    HS_MF_TRAIN_TIME,      /* number, s: spent in training steps only (train) */
    HS_MF_LOSS,            /* number: mean training loss of the round (or of the steps since
                              the last record, train) */
    HS_MF_LR,              /* number: learning rate of the last step */
    HS_MF_TEST_ACC,        /* number in [0, 1] */
    HS_MF_TEST_ACC_MIN,    /* number: sim, the lowest peer */
    HS_MF_TEST_ACC_MAX,    /* number: sim, the highest peer */
    HS_MF_TEST_LOSS,       /* number */
    HS_MF_CONSENSUS,       /* number: consensus distance per parameter (hs_algo_stats) */
    HS_MF_MISSING,         /* int: neighbours whose message of the round did not come */
    HS_MF_RESYNCS,         /* int, cumulative: replicas asked for again in full */
    HS_MF_BYTES_SENT,      /* int, bytes, cumulative: algorithm payload handed to the exchange,
                              once per destination; no framing, no transport overhead */
    HS_MF_BYTES_RECV,      /* int, bytes, cumulative: algorithm payload taken from it */
    HS_MF_WIRE_BYTES_SENT, /* int, bytes, cumulative: every frame sent, 24-byte headers
                              included (DATA, resends, heartbeats, membership, snapshots); TLS
                              records and TCP/IP headers not included */
    HS_MF_WIRE_BYTES_RECV, /* int, bytes, cumulative: every frame received, the same way */
    HS_MF_MEMBERS,         /* int: members in the newest member list */
    HS_MF_CONNS,           /* int: authenticated connections */
    HS_MF_PEERS_DEAD,      /* int, cumulative: peers this peer declared dead */
    HS_MF_RESEND_ASKED,    /* int, cumulative: RESEND requests for lost DATA */
    HS_MF_RECV_TIMEOUTS,   /* int, cumulative: waits for a neighbour that ran to --recv-timeout */
    HS_MF_ROUNDS_PER_S,    /* number: rounds completed per second since the first round */
    HS_MF_SAMPLES_PER_S,   /* number: training examples per second of training time (train) */
    HS_MF_PUSH_WEIGHT,     /* number: sgp's push-sum weight */
    HS_MF_STALENESS_MAX,   /* int, rounds: sgp, oldest share added in the round */
    HS_MF_STALENESS_MEAN,  /* number, rounds: sgp */
    HS_MF_WAITS,           /* int, cumulative: sgp, receives that blocked (--staleness) */
    HS_MF_ROUNDS_MIN,      /* int: sim, rounds of the slowest peer */
    HS_MF_ROUNDS_MAX,      /* int: sim, rounds of the fastest peer */
    HS_MF_VTIME,           /* number, s: sim --links, virtual time of the latest peer */
    HS_MF_VTIME_DDP,       /* number, s: sim --links, DDP's modelled time for the same steps */
    HS_MF_COUNT
} hs_metrics_field;

typedef enum hs_metrics_kind { HS_MK_INT, HS_MK_NUM, HS_MK_STR } hs_metrics_kind;

/* The name a field has in the JSON line, and its kind; NULL and -1 for an unknown field. */
const char *hs_metrics_field_name(int f);
int hs_metrics_field_kind(int f);
/* The field of that name, or -1. */
int hs_metrics_field_find(const char *name);

/* Fields an algorithm reports that have no hs_metrics_field of their own (written after the
 * others, under their own names). */
#define HS_METRICS_EXTRA_MAX 8

typedef struct hs_metrics_rec {
    uint64_t set; /* bit f: field f is set */
    double num[HS_MF_COUNT];
    const char *str[HS_MF_COUNT]; /* borrowed until the record is written */
    struct {
        const char *name; /* borrowed */
        double v;
        int is_int;
    } extra[HS_METRICS_EXTRA_MAX];
    int n_extra;
    /* sim with asynchronous peers: rounds_0 .. rounds_{n-1}, each peer's rounds (borrowed) */
    const uint64_t *peer_rounds;
    int n_peer_rounds;
} hs_metrics_rec;

/* An empty record, with unix_time set to now. */
void hs_metrics_init(hs_metrics_rec *m);
/* Sets a number or int field (an int field is written rounded to the nearest integer; ints are
 * exact up to 2^53). A string field is not set this way. */
void hs_metrics_set(hs_metrics_rec *m, hs_metrics_field f, double v);
/* Sets a string field; v is borrowed until the record is written. */
void hs_metrics_set_str(hs_metrics_rec *m, hs_metrics_field f, const char *v);
/* The value of a set field; NaN (or NULL) when it is not set. */
double hs_metrics_get(const hs_metrics_rec *m, hs_metrics_field f);
const char *hs_metrics_get_str(const hs_metrics_rec *m, hs_metrics_field f);

/* What an algorithm knows: bytes_sent, bytes_recv (payload), consensus, missing, resyncs, and
 * the algorithm's own metrics (hs_algo_metrics). */
void hs_metrics_from_algo(hs_metrics_rec *m, const hs_algo *a);
/* What the network runtime knows: wire bytes, members, connections, dead peers and the
 * lost-DATA counters. */
void hs_metrics_from_net(hs_metrics_rec *m, const hs_net_stats *ns);

/* Renders the record as one JSON object, without the newline, into buf (NUL-terminated) as
 * snprintf does: returns the length of the whole object, which is cap or more when it did not
 * fit (hs_metrics_format(m, NULL, 0) asks for the length). Strings are escaped; a number that
 * is set but not finite is written as null. The metrics file holds exactly this text, then a
 * newline. */
size_t hs_metrics_format(const hs_metrics_rec *m, char *buf, size_t cap);

/* A metrics file: one record per line, each line flushed as written, so a crash loses at most
 * the line being written. */
typedef struct hs_metrics_file hs_metrics_file;
/* Opens path for appending (append = 1), or as a new file: a non-empty file already there is
 * moved to PATH.N (the first free N; a warning says so), never truncated. "-" is standard
 * output. HS_EIO with the path named. */
int hs_metrics_open(hs_metrics_file **out, const char *path, int append);
/* Writes the record as one line. HS_ENOMEM, HS_EIO. */
int hs_metrics_write(hs_metrics_file *f, const hs_metrics_rec *m);
void hs_metrics_close(hs_metrics_file *f); /* accepts NULL */

#ifdef __cplusplus
}
#endif
#endif
