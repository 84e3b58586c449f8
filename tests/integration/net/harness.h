/* A small harness for the multi-process network tests: spawn netpeer (or any program) with
 * its output in files, wait with deadlines, kill by PID, read JSON-lines logs, and an internal
 * deadline (alarm) after which everything started is killed and the test fails. Every process
 * spawned is remembered and killed at exit, so a failing test leaks nothing. */
#ifndef HS_TEST_HARNESS_H
#define HS_TEST_HARNESS_H

#include <cjson/cJSON.h>
#include <sys/types.h>

typedef struct hproc {
    pid_t pid;
    int status; /* exit status once reaped, -1 before */
    int exited;
    char out[512], err[512];
} hproc;

/* Sets the test's name (messages), a private scratch directory, a unique loopback prefix, and
 * an alarm after deadline_s seconds that kills all and exits 1. */
void h_init(const char *name, int deadline_s);
const char *h_dir(void);
/* A loopback IP unique to this test process ("127.a.b.c"); k varies the last octet. */
const char *h_ip(int k);
/* Paths to the netpeer binary and the source tree (from HS_BUILD_ROOT / HS_SOURCE_ROOT). */
const char *h_netpeer(void);
const char *h_source(void);

/* Writes the start of a netpeer command line to argv: the program, --listen, and --bootstrap
 * when boot is non-NULL. Returns the number of entries written (3 or 5). */
int h_netpeer_argv(char **argv, const char *listen, const char *boot);

/* Starts argv (NULL-terminated) with stdout to out and stderr to err (paths; NULL = /dev/null).
 * Returns 0 or -1. */
int h_spawn(hproc *p, char *const argv[], const char *out, const char *err);
/* Waits up to timeout_s for p to exit; returns its exit code (128 + signal if killed), or -1
 * on timeout. */
int h_wait(hproc *p, double timeout_s);
void h_kill(hproc *p, int sig);
void h_kill_all(void);
/* The test passed: kills leftovers and removes the scratch directory. */
void h_done(void);
/* Writes a file in the scratch directory and returns its path (static buffer per call site
 * is not kept: copy it). */
const char *h_file(const char *name, const char *content);

double h_now(void); /* CLOCK_MONOTONIC seconds, the clock netpeer logs with */
void h_sleep(double s);

/* The file's contents (malloc'd, NUL-terminated), or NULL. */
char *h_read(const char *path);
int h_contains(const char *path, const char *needle);
/* Waits until path contains needle (or timeout); 1 if it does. */
int h_wait_for(const char *path, const char *needle, double timeout_s);

/* The JSON objects of a JSON-lines file whose "event" is event (NULL: all), in order; returns
 * their count and an array to free with h_free_events. */
int h_events(const char *path, const char *event, cJSON ***out);
void h_free_events(cJSON **ev, int n);
double h_num(const cJSON *o, const char *key);
const char *h_str(const cJSON *o, const char *key);

/* Reports a failed check and exits 1 (after killing what was started). */
#define H_CHECK(cond, ...)                                                                         \
    do {                                                                                           \
        if (!(cond))                                                                               \
            h_fail(__FILE__, __LINE__, #cond, __VA_ARGS__);                                        \
    } while (0)
void h_fail(const char *file, int line, const char *cond, const char *fmt, ...)
    __attribute__((format(printf, 4, 5), noreturn));
void h_note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
