/* Error table and the per-thread error message. Thread-safe: all state is thread-local. */
#include "core/error_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char msgbuf[1024];
static _Thread_local int last_code;

const char *hs_strerror(int err) {
    switch (err) {
#define HS__ERR_DESC(name, value, desc)                                                            \
    case value:                                                                                    \
        return desc;
        HS_ERRNO_MAP(HS__ERR_DESC)
#undef HS__ERR_DESC
    case 0:
        return "success";
    default:
        return "unknown error";
    }
}

const char *hs_err_name(int err) {
    switch (err) {
#define HS__ERR_NAME(name, value, desc)                                                            \
    case value:                                                                                    \
        return "HS_" #name;
        HS_ERRNO_MAP(HS__ERR_NAME)
#undef HS__ERR_NAME
    case 0:
        return "HS_OK";
    default:
        return "HS_UNKNOWN";
    }
}

int hs__err(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msgbuf, sizeof(msgbuf), fmt, ap);
    va_end(ap);
    last_code = code;
    return code;
}

int hs__err_code(int code) {
    msgbuf[0] = '\0';
    last_code = code;
    return code;
}

int hs__err_prefix(int code, const char *fmt, ...) {
    char prefix[512];
    char old[sizeof(msgbuf)];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof(prefix), fmt, ap);
    va_end(ap);
    memcpy(old, msgbuf, sizeof(old));
    /* A message longer than the buffer is cut short and ends in "..."; checking the length
     * also tells GCC's -Wformat-truncation (an error under -Dwerror=true) that this is known. */
    int len;
    /* A stale message from an unrelated earlier failure must not be blamed on this one. */
    if (old[0] && last_code == code)
        len = snprintf(msgbuf, sizeof(msgbuf), "%s: %s", prefix, old);
    else
        len = snprintf(msgbuf, sizeof(msgbuf), "%s: %s", prefix, hs_strerror(code));
    if (len >= (int)sizeof(msgbuf)) memcpy(msgbuf + sizeof(msgbuf) - 4, "...", 4);
    last_code = code;
    return code;
}

const char *hs_error_message(void) {
    if (msgbuf[0]) return msgbuf;
    if (last_code) return hs_strerror(last_code);
    return "";
}
