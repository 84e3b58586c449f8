/* Logging inside the library: the level, the peer a line is about, and hs__log, which writes a
 * line to stderr or hands it to the callback of hearsay/log.h. Thread-safe: each line is
 * formatted into a local buffer and written with one call. */
#ifndef HS_CORE_LOG_H
#define HS_CORE_LOG_H

#include <stdint.h>

#include "core/error_internal.h"
#include "hearsay/log.h"

/* A program's or a node's "quiet": info lines are dropped from now on (level warn), unless
 * HEARSAY_LOG chose a level, which the user set on purpose. The level is the process's: this
 * silences every thread, and nothing undoes it but hs_log_set_level. */
void hs__log_quiet(void);

/* A short tag printed on every line ("peer 3"); copied; NULL clears it. */
void hs__log_set_tag(const char *tag);

/* The peer the lines are about: the process's (the last node to say so) and the calling
 * thread's, which wins for lines logged on that thread (several nodes, one per thread). */
void hs__log_set_peer(int rank, uint32_t peer);
void hs__log_set_thread_peer(int rank, uint32_t peer);

void hs__log(hs_log_level level, const char *fmt, ...) HS__PRINTF(2, 3);

#define HS_LOGE(...) hs__log(HS_LOG_ERROR, __VA_ARGS__)
#define HS_LOGW(...) hs__log(HS_LOG_WARN, __VA_ARGS__)
#define HS_LOGI(...) hs__log(HS_LOG_INFO, __VA_ARGS__)
#define HS_LOGD(...)                                                                               \
    do {                                                                                           \
        if (hs_log_get_level() >= HS_LOG_DEBUG) hs__log(HS_LOG_DEBUG, __VA_ARGS__);                 \
    } while (0)

#endif
