/* hearsay: error codes and the per-thread error message.
 *
 * Every fallible call returns 0 (or a non-negative count) on success and a negative HS_E* code on
 * failure. Codes are -(errno) where errno has a fitting value, plus hearsay's own below -4000.
 * Alongside the code, the failing call leaves a sentence on the calling thread that names the
 * thing that was wrong ("train-images-idx3-ubyte.gz: truncated after 1200 of 47040000 bytes");
 * hs_error_message() returns it. Thread-safe: the message is thread-local. */
#ifndef HEARSAY_ERROR_H
#define HEARSAY_ERROR_H

#include <errno.h>

#ifdef __cplusplus
extern "C" {
#endif

/* X(name, value, description): one list generates the enum and hs_strerror(). */
#define HS_ERRNO_MAP(X)                                                                            \
    X(EINVAL, -EINVAL, "invalid argument")                                                         \
    X(ENOMEM, -ENOMEM, "out of memory")                                                            \
    X(EIO, -EIO, "input/output error")                                                             \
    X(ENOENT, -ENOENT, "no such file or directory")                                                \
    X(EEXIST, -EEXIST, "already exists")                                                           \
    X(ERANGE, -ERANGE, "value out of range")                                                       \
    X(EAGAIN, -EAGAIN, "try again")                                                                \
    X(EBUSY, -EBUSY, "busy")                                                                       \
    X(ETIMEDOUT, -ETIMEDOUT, "timed out")                                                          \
    X(ECANCELED, -ECANCELED, "canceled")                                                           \
    X(ECONNREFUSED, -ECONNREFUSED, "connection refused")                                           \
    X(ECONNRESET, -ECONNRESET, "connection reset")                                                 \
    X(EPIPE, -EPIPE, "broken pipe")                                                                \
    X(ENOTSUP, -ENOTSUP, "not supported")                                                          \
    X(EOVERFLOW, -EOVERFLOW, "value too large")                                                    \
    X(ENODEV, -ENODEV, "no such device")                                                           \
    X(EPROTO, -4001, "protocol error")                                                             \
    X(ETLS, -4002, "TLS error")                                                                    \
    X(ECUDA, -4003, "CUDA error")                                                                  \
    X(EFORMAT, -4004, "malformed data")                                                            \
    X(EMISMATCH, -4005, "configuration mismatch")                                                  \
    X(EDIVERGED, -4006, "training diverged")                                                       \
    X(EAUTH, -4007, "authentication failed")                                                       \
    X(EINTR, -4008, "interrupted by signal")

typedef enum hs_errno {
#define HS__ERR_ENUM(name, value, desc) HS_##name = (value),
    HS_ERRNO_MAP(HS__ERR_ENUM)
#undef HS__ERR_ENUM
} hs_errno;

/* A short description of a code ("protocol error"); never NULL, also for unknown codes. */
const char *hs_strerror(int err);

/* The symbolic name of a code ("HS_EPROTO"); never NULL. */
const char *hs_err_name(int err);

/* The detailed message left by the last failing hearsay call on this thread, or
 * hs_strerror(last code) when the call left none. Valid until the next failing call on this
 * thread. Returns "" when nothing failed yet. */
const char *hs_error_message(void);

#ifdef __cplusplus
}
#endif
#endif
