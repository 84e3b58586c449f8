/* Logging. The level is an atomic and the tag, the peer and the callback are under a lock, so
 * that any thread may change them while others log (a peer sets its tag once it knows its id,
 * while its loop thread is already logging). */
#include "core/log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

static atomic_int log_level = -1;
static pthread_mutex_t tag_lock = PTHREAD_MUTEX_INITIALIZER;
static char log_tag[64];
static int log_rank = HS_LOG_NO_RANK;
static uint32_t log_peer = HS_LOG_NO_PEER;
static hs_log_callback log_fn;
static void *log_user;
/* The calling thread's peer (a node on this thread); has_peer 0: the process's. */
static _Thread_local struct {
    int has_peer, rank;
    uint32_t peer;
} thread_peer;

static int level_from_env(void) {
    const char *e = getenv("HEARSAY_LOG");
    if (!e) return HS_LOG_INFO;
    static const char *names[] = {"error", "warn", "info", "debug", "trace"};
    for (int i = 0; i < 5; i++)
        if (!strcasecmp(e, names[i])) return i;
    return HS_LOG_INFO;
}

void hs_log_set_level(hs_log_level level) { atomic_store(&log_level, (int)level); }

hs_log_level hs_log_get_level(void) {
    int l = atomic_load(&log_level);
    if (l < 0) {
        l = level_from_env();
        atomic_store(&log_level, l);
    }
    return (hs_log_level)l;
}

void hs__log_quiet(void) {
    if (!getenv("HEARSAY_LOG") && hs_log_get_level() > HS_LOG_WARN) hs_log_set_level(HS_LOG_WARN);
}

void hs__log_set_tag(const char *tag) {
    if (!tag) tag = "";
    pthread_mutex_lock(&tag_lock);
    snprintf(log_tag, sizeof(log_tag), "%s", tag);
    pthread_mutex_unlock(&tag_lock);
}

void hs__log_set_peer(int rank, uint32_t peer) {
    pthread_mutex_lock(&tag_lock);
    log_rank = rank;
    log_peer = peer;
    pthread_mutex_unlock(&tag_lock);
    hs__log_set_thread_peer(rank, peer);
}

void hs__log_set_thread_peer(int rank, uint32_t peer) {
    thread_peer.has_peer = 1;
    thread_peer.rank = rank;
    thread_peer.peer = peer;
}

void hs_log_set_callback(hs_log_callback fn, void *user) {
    pthread_mutex_lock(&tag_lock);
    log_fn = fn;
    log_user = user;
    pthread_mutex_unlock(&tag_lock);
}

/* Hands the message to the callback; the lock is not held during the call, which may take
 * long (a Python handler waits for the interpreter). */
static void to_callback(hs_log_callback fn, void *user, hs_log_level level, int rank,
                        uint32_t peer, const struct timespec *ts, const char *fmt, va_list ap) {
    char msg[2048];
    if (vsnprintf(msg, sizeof(msg), fmt, ap) < 0) return;
    hs_log_record rec = {level, rank, peer, (double)ts->tv_sec + ts->tv_nsec / 1e9, msg};
    fn(&rec, user);
}

void hs__log(hs_log_level level, const char *fmt, ...) {
    if ((int)level > (int)hs_log_get_level()) return;
    static const char *lv[] = {"error", "warn", "info", "debug", "trace"};
    char line[2048];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    char tag[sizeof(log_tag)];
    pthread_mutex_lock(&tag_lock);
    memcpy(tag, log_tag, sizeof(tag));
    hs_log_callback fn = log_fn;
    void *user = log_user;
    int rank = thread_peer.has_peer ? thread_peer.rank : log_rank;
    uint32_t peer = thread_peer.has_peer ? thread_peer.peer : log_peer;
    pthread_mutex_unlock(&tag_lock);
    if (fn) {
        va_list ap;
        va_start(ap, fmt);
        to_callback(fn, user, level, rank, peer, &ts, fmt, ap);
        va_end(ap);
        return;
    }
    /* A node's own thread says which node it is, whichever node set the process's tag last. */
    if (thread_peer.has_peer && thread_peer.peer != HS_LOG_NO_PEER)
        snprintf(tag, sizeof(tag), "peer %u", (unsigned)thread_peer.peer);
    localtime_r(&ts.tv_sec, &tm);
    int n = snprintf(line, sizeof(line), "%02d:%02d:%02d.%03ld %s%s%s: ", tm.tm_hour, tm.tm_min,
                     tm.tm_sec, ts.tv_nsec / 1000000, tag, tag[0] ? " " : "", lv[level]);
    if (n < 0) return;
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
    va_end(ap);
    if (m < 0) return;
    size_t len = (size_t)n + (size_t)m;
    if (len > sizeof(line) - 2) len = sizeof(line) - 2;
    line[len++] = '\n';
    /* One write(2) per line keeps lines from different threads and processes whole. */
    ssize_t w = write(STDERR_FILENO, line, len);
    (void)w;
}
