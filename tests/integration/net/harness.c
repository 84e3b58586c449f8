/* The multi-process test harness (see harness.h). */
#include "harness.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAXPROC 64

static const char *test_name = "test";
static char scratch[256];
/* Every child by PID (copies: callers' hproc structs may be gone), until reaped. */
static volatile pid_t pids[MAXPROC];
static int nprocs;

static void forget(pid_t pid) {
    for (int i = 0; i < nprocs; i++)
        if (pids[i] == pid)
            pids[i] = 0;
}
static char ipbuf[8][32];
static int ipk;

static void on_alarm(int sig) {
    (void)sig;
    static const char msg[] = "harness: internal deadline reached; killing everything\n";
    ssize_t w = write(2, msg, sizeof(msg) - 1);
    (void)w;
    for (int i = 0; i < nprocs; i++)
        if (pids[i] > 0)
            kill(pids[i], SIGKILL);
    _exit(1);
}

static void at_exit(void) { h_kill_all(); }

void h_init(const char *name, int deadline_s) {
    test_name = name;
    const char *tmp = getenv("TMPDIR");
    snprintf(scratch, sizeof(scratch), "%s/hs-%s-XXXXXX", tmp ? tmp : "/tmp", name);
    if (!mkdtemp(scratch)) {
        perror("mkdtemp");
        exit(1);
    }
    signal(SIGALRM, on_alarm);
    signal(SIGPIPE, SIG_IGN);
    alarm((unsigned)deadline_s);
    atexit(at_exit);
    fprintf(stderr, "%s: scratch directory %s\n", name, scratch);
}

const char *h_dir(void) { return scratch; }

const char *h_ip(int k) {
    pid_t pid = getpid();
    char *b = ipbuf[ipk++ % 8];
    snprintf(b, 32, "127.%d.%d.%d", 1 + (int)((pid >> 8) % 250), (int)(pid & 0xff), 1 + (k % 250));
    return b;
}

const char *h_netpeer(void) {
    static char path[512];
    const char *b = getenv("HS_BUILD_ROOT");
    snprintf(path, sizeof(path), "%s/tests/integration/net/netpeer", b ? b : "build");
    return path;
}

const char *h_source(void) {
    const char *s = getenv("HS_SOURCE_ROOT");
    return s ? s : ".";
}

int h_spawn(hproc *p, char *const argv[], const char *out, const char *err) {
    memset(p, 0, sizeof(*p));
    p->status = -1;
    snprintf(p->out, sizeof(p->out), "%s", out ? out : "/dev/null");
    snprintf(p->err, sizeof(p->err), "%s", err ? err : "/dev/null");
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        int fo = open(p->out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int fe = open(p->err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int fi = open("/dev/null", O_RDONLY);
        if (fo < 0 || fe < 0 || fi < 0)
            _exit(127);
        signal(SIGPIPE, SIG_DFL); /* the peers get default dispositions, not the harness's */
        dup2(fi, 0);
        dup2(fo, 1);
        dup2(fe, 2);
        execv(argv[0], argv);
        execvp(argv[0], argv);
        _exit(127);
    }
    p->pid = pid;
    if (nprocs < MAXPROC)
        pids[nprocs++] = pid;
    return 0;
}

static int decode_status(int st) {
    if (WIFEXITED(st))
        return WEXITSTATUS(st);
    if (WIFSIGNALED(st))
        return 128 + WTERMSIG(st);
    return 255;
}

int h_wait(hproc *p, double timeout_s) {
    if (p->exited)
        return p->status;
    double end = h_now() + timeout_s;
    for (;;) {
        int st;
        pid_t r = waitpid(p->pid, &st, WNOHANG);
        if (r == p->pid) {
            p->exited = 1;
            p->status = decode_status(st);
            forget(p->pid);
            return p->status;
        }
        if (r < 0 && errno != EINTR) {
            p->exited = 1;
            forget(p->pid);
            return p->status = 255;
        }
        if (h_now() >= end)
            return -1;
        h_sleep(0.005);
    }
}

void h_kill(hproc *p, int sig) {
    if (!p->exited && p->pid > 0)
        kill(p->pid, sig);
}

void h_kill_all(void) {
    for (int i = 0; i < nprocs; i++) {
        pid_t pid = pids[i];
        if (pid <= 0)
            continue;
        kill(pid, SIGKILL);
        int st;
        waitpid(pid, &st, 0);
        pids[i] = 0;
    }
}

double h_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void h_sleep(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

char *h_read(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 4096, n = 0;
    char *b = malloc(cap);
    for (;;) {
        if (n + 1 >= cap)
            b = realloc(b, cap *= 2);
        size_t r = fread(b + n, 1, cap - n - 1, f);
        if (r == 0)
            break;
        n += r;
    }
    fclose(f);
    b[n] = '\0';
    return b;
}

int h_contains(const char *path, const char *needle) {
    char *s = h_read(path);
    int r = s && strstr(s, needle);
    free(s);
    return r;
}

int h_wait_for(const char *path, const char *needle, double timeout_s) {
    double end = h_now() + timeout_s;
    while (h_now() < end) {
        if (h_contains(path, needle))
            return 1;
        h_sleep(0.01);
    }
    return h_contains(path, needle);
}

int h_events(const char *path, const char *event, cJSON ***out) {
    char *s = h_read(path);
    int n = 0, cap = 16;
    cJSON **ev = malloc((size_t)cap * sizeof(*ev));
    for (char *line = s ? strtok(s, "\n") : NULL; line; line = strtok(NULL, "\n")) {
        cJSON *o = cJSON_Parse(line);
        if (!o)
            continue;
        const char *e = h_str(o, "event");
        if (event && (!e || strcmp(e, event))) {
            cJSON_Delete(o);
            continue;
        }
        if (n == cap)
            ev = realloc(ev, (size_t)(cap *= 2) * sizeof(*ev));
        ev[n++] = o;
    }
    free(s);
    *out = ev;
    return n;
}

void h_free_events(cJSON **ev, int n) {
    for (int i = 0; i < n; i++)
        cJSON_Delete(ev[i]);
    free(ev);
}

double h_num(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : -1e300;
}

const char *h_str(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

void h_fail(const char *file, int line, const char *cond, const char *fmt, ...) {
    fprintf(stderr, "%s: FAILED at %s:%d: %s\n  ", test_name, file, line, cond);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n  (logs kept in %s)\n", scratch);
    h_kill_all();
    exit(1);
}

void h_note(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: ", test_name);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
}

void h_done(void) {
    h_kill_all();
    if (getenv("HS_KEEP"))
        return;
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", scratch);
    if (system(cmd) != 0)
        fprintf(stderr, "%s: could not remove %s\n", test_name, scratch);
}

const char *h_file(const char *name, const char *content) {
    static char path[8][600];
    static int k;
    char *p = path[k++ % 8];
    snprintf(p, 600, "%s/%s", scratch, name);
    FILE *f = fopen(p, "w");
    if (!f || fputs(content, f) < 0)
        h_fail(__FILE__, __LINE__, "write", "cannot write %s", p);
    fclose(f);
    chmod(p, 0600);
    return p;
}

int h_netpeer_argv(char **argv, const char *listen, const char *boot) {
    int a = 0;
    argv[a++] = (char *)h_netpeer();
    argv[a++] = "--listen";
    argv[a++] = (char *)listen;
    if (boot) {
        argv[a++] = "--bootstrap";
        argv[a++] = (char *)boot;
    }
    return a;
}
