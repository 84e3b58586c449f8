/* hearsay: where the library's log lines go.
 *
 * By default each line goes to stderr as "HH:MM:SS.mmm TAG LEVEL: message" (TAG "peer N", the
 * peer's id, once a node knows it). A program that has a logging system of its own (Python's
 * logging module, a service's journal) installs a callback instead: it then receives every line
 * that passes the level, as a record with the level, the rank and id of the peer it is about
 * and the bare message, and nothing goes to stderr.
 *
 * The level is the process's: lines above it are dropped before any formatting. It starts at
 * info, or at the HEARSAY_LOG environment variable's level (error|warn|info|debug|trace); a
 * node with the option quiet 1 lowers it to warn unless HEARSAY_LOG is set.
 *
 * Threading: the callback runs on the thread that logs (the caller's, or a node's network
 * thread), possibly on several threads at once; it must not call back into hearsay. Installing
 * or removing it is safe while others log; after hs_log_set_callback returns, the previous
 * callback may still be running on another thread for a line it had started. */
#ifndef HEARSAY_LOG_H
#define HEARSAY_LOG_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum hs_log_level {
    HS_LOG_ERROR = 0,
    HS_LOG_WARN = 1,
    HS_LOG_INFO = 2,
    HS_LOG_DEBUG = 3,
    HS_LOG_TRACE = 4,
} hs_log_level;

/* No peer known (a line logged before a node has joined, or outside any node). */
#define HS_LOG_NO_RANK (-1)
#define HS_LOG_NO_PEER UINT32_MAX

typedef struct hs_log_record {
    hs_log_level level;
    int rank;            /* the peer's rank (its shard), HS_LOG_NO_RANK when none */
    uint32_t peer;       /* the peer's id in its job, HS_LOG_NO_PEER when none */
    double time;         /* seconds since the epoch (CLOCK_REALTIME) */
    const char *message; /* the line without time, tag or level; valid during the call only */
} hs_log_record;

typedef void (*hs_log_callback)(const hs_log_record *record, void *user);

/* Sends every line to fn(record, user) from now on; fn NULL goes back to stderr. */
void hs_log_set_callback(hs_log_callback fn, void *user);

void hs_log_set_level(hs_log_level level);
hs_log_level hs_log_get_level(void);

#ifdef __cplusplus
}
#endif
#endif
