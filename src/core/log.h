/* Logging to stderr with a level, a wall-clock timestamp and an optional tag (the peer id).
 * Thread-safe: each line is formatted into a local buffer and written with one call. */
#ifndef HS_CORE_LOG_H
#define HS_CORE_LOG_H

#include "core/error_internal.h"

typedef enum hs_log_level {
    HS_LOG_ERROR = 0,
    HS_LOG_WARN = 1,
    HS_LOG_INFO = 2,
    HS_LOG_DEBUG = 3,
    HS_LOG_TRACE = 4,
} hs_log_level;

/* Lines above level are dropped. Default HS_LOG_INFO; the HEARSAY_LOG environment variable
 * (error|warn|info|debug|trace) overrides it at the first log call. */
void hs_log_set_level(hs_log_level level);
hs_log_level hs_log_get_level(void);

/* A program's or a node's "quiet": info lines are dropped from now on (level warn), unless
 * HEARSAY_LOG chose a level, which the user set on purpose. The level is the process's: this
 * silences every thread, and nothing undoes it but hs_log_set_level. */
void hs_log_quiet(void);

/* A short tag printed on every line ("peer 3"); copied; NULL clears it. */
void hs_log_set_tag(const char *tag);

void hs_log(hs_log_level level, const char *fmt, ...) HS__PRINTF(2, 3);

#define HS_LOGE(...) hs_log(HS_LOG_ERROR, __VA_ARGS__)
#define HS_LOGW(...) hs_log(HS_LOG_WARN, __VA_ARGS__)
#define HS_LOGI(...) hs_log(HS_LOG_INFO, __VA_ARGS__)
#define HS_LOGD(...)                                                                               \
    do {                                                                                           \
        if (hs_log_get_level() >= HS_LOG_DEBUG) hs_log(HS_LOG_DEBUG, __VA_ARGS__);                 \
    } while (0)

#endif
