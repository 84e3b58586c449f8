/* Internal helpers to set the per-thread error message. */
#ifndef HS_CORE_ERROR_INTERNAL_H
#define HS_CORE_ERROR_INTERNAL_H

#include "hearsay/error.h"

#if defined(__GNUC__)
#define HS__PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define HS__PRINTF(a, b)
#endif

/* Sets this thread's message from fmt and returns code, so that `return hs__err(HS_EINVAL, ...)`
 * reports and fails in one statement. */
int hs__err(int code, const char *fmt, ...) HS__PRINTF(2, 3);

/* Records code with no detail (hs_error_message() falls back to hs_strerror(code)). */
int hs__err_code(int code);

/* Prepends context to the message a callee already left ("topo/ring-8.json: " + "edge 3: ...")
 * and returns code. */
int hs__err_prefix(int code, const char *fmt, ...) HS__PRINTF(2, 3);

#endif
