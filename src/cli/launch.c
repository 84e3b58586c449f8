/* hearsay launch: N real peer processes (`hearsay run`) on this machine, on loopback, TLS on by
 * default with a generated run secret, one live view of all of them, one run directory with
 * every peer's metrics and log, a summary and plots at the end. Ctrl-C stops every peer
 * cleanly (each finishes its round and leaves); a peer that dies is reported with its exit
 * status and the end of its log; the exit status says whether every peer succeeded. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli/launch_config.h"
#include "cli/precheck.h"
#include "cli/launch_script.h"
#include "cli/launch_view.h"
#include "cli/rundir.h"
#include "cli/runopts.h"
#include "hearsay/error.h"

/* Keys of launch's own options: above those of `hearsay run` (256..) and below the shared ones
 * (512..), since all three tables are parsed together. */
enum { L_N = 'n', L_NAME = 448, L_RUNS_DIR, L_NO_PLOT, L_REFRESH, L_PEER_FLAG, L_DEVICES };

/* Most GPUs --devices may list. */
#define MAX_DEVICES 64

static const hs_cli_opt launch_opts[] = {
    {"peers", L_N, "N", "number of peer processes (default: 8)"},
    {"name", L_NAME, "NAME",
     "run directory name, refused if it exists (default: DATE-TIME-ALGO-nN, with -2, -3, ... "
     "added when another launch took it)"},
    {"runs-dir", L_RUNS_DIR, "DIR", "where run directories go (default: runs)"},
    {"refresh", L_REFRESH, "S", "seconds between refreshes of the live view (default: 1)"},
    {"no-plot", L_NO_PLOT, NULL, "do not draw plots at the end"},
    {"devices", L_DEVICES, "N,N,..",
     "CUDA devices for the peers, round-robin: peer i runs with --device cuda:N, N the (i mod "
     "count)-th of the list (implies --device cuda; default: every peer on --device's)"},
    {"slowdown", RO_SLOWDOWN, "F|I:F,..", "stragglers: F slows peer 0 F-fold; I:F slows peer I"},
    {NULL, 0, NULL, NULL},
};

/* Options of `hearsay run` that the launcher decides itself. */
static const char *const owned[] = {"listen", "advertise", "bootstrap", "world", "wait-peers",
                                    "rank", "rendezvous", "metrics", "resume", "quiet", NULL};

typedef struct launch_args {
    int n;
    const char *name, *runs_dir;
    double refresh;
    int no_plot;
    hs_runopts ro; /* to validate the shared options and name the run */
    int insecure, certs, secret;
    int devices[MAX_DEVICES], ndevices; /* --devices */
    const char *device;                 /* --device as given, passed on unless --devices */
    char **pass; /* options handed to every peer */
    int npass, cappass;
    const hs_cli_opt *const *tables;
    hs_launch_given given[128]; /* every option as given, for config.json */
    int n_given;
} launch_args;

static const hs_cli_opt *opt_by_key(const hs_cli_opt *const *tables, int key) {
    for (int t = 0; tables[t]; t++)
        for (const hs_cli_opt *o = tables[t]; o->name; o++)
            if (o->key == key) return o;
    return NULL;
}

static int pass(launch_args *a, const char *s) {
    if (a->npass + 1 >= a->cappass) {
        int cap = a->cappass ? 2 * a->cappass : 64;
        char **p = realloc(a->pass, sizeof(char *) * (size_t)cap);
        if (!p) return hs__cli_usage_error("out of memory");
        a->pass = p;
        a->cappass = cap;
    }
    a->pass[a->npass++] = (char *)s;
    a->pass[a->npass] = NULL;
    return 0;
}

/* "0,1,3": device numbers as --device cuda:N takes them. */
static int parse_devices(launch_args *a, const char *v) {
    a->ndevices = 0;
    const char *p = v;
    for (;;) {
        size_t len = strcspn(p, ",");
        char tok[16], dev[32];
        hs_device d;
        if (a->ndevices == MAX_DEVICES)
            return hs__cli_usage_error("--devices %s: more than %d devices", v, MAX_DEVICES);
        snprintf(tok, sizeof(tok), "%.*s", len < sizeof(tok) ? (int)len : 15, p);
        snprintf(dev, sizeof(dev), "cuda:%s", tok);
        if (len == 0 || len >= sizeof(tok) ||
            hs_device_parse_id(dev, &d, &a->devices[a->ndevices]) < 0)
            return hs__cli_usage_error("--devices %s: '%.*s' is not a CUDA device number (0..%d)",
                                      v, (int)len, p, HS_DEVICE_ID_MAX);
        a->ndevices++;
        if (!p[len]) return 0;
        p += len + 1;
    }
}

static int handle(void *ctx, int key, const char *v) {
    launch_args *a = ctx;
    const hs_cli_opt *given = opt_by_key(a->tables, key);
    if (given && a->n_given < (int)(sizeof(a->given) / sizeof(a->given[0])))
        a->given[a->n_given++] = (hs_launch_given){given->name, v};
    switch (key) {
    case L_N: return hs__cli_int("--peers", v, 1, 1024, &a->n);
    case L_NAME:
        a->name = v;
        return hs__cli_check_run_name(v);
    case L_RUNS_DIR: a->runs_dir = v; return 0;
    case L_REFRESH: return hs__cli_double("--refresh", v, 0.05, 3600, &a->refresh);
    case L_NO_PLOT: a->no_plot = 1; return 0;
    case L_DEVICES: return parse_devices(a, v);
    }
    const hs_cli_opt *o = opt_by_key(a->tables, key);
    if (!o) return hs__cli_usage_error("internal: unhandled option %d", key);
    for (int i = 0; owned[i]; i++)
        if (!strcmp(o->name, owned[i]))
            return hs__cli_usage_error("--%s is set by hearsay launch for each peer", o->name);
    /* Shared options are checked here, so a typo fails before any process starts. */
    int rc = hs__runopts_handle(&a->ro, key, v);
    if (rc < 0) return rc;
    /* Stragglers are chosen per peer ("0:4"), not passed to every one; so is the device when
     * --devices is given, which may come later: --device is passed on after parsing. */
    if (key == RO_SLOWDOWN) return 0;
    if (key == RO_DEVICE) {
        a->device = v;
        return 0;
    }
    if (!strcmp(o->name, "insecure")) a->insecure = 1;
    if (!strcmp(o->name, "ca") || !strcmp(o->name, "cert") || !strcmp(o->name, "key")) a->certs = 1;
    if (!strcmp(o->name, "secret-file")) a->secret = 1;
    char *flag = malloc(strlen(o->name) + 3);
    if (!flag) return hs__cli_usage_error("out of memory");
    sprintf(flag, "--%s", o->name);
    if ((rc = pass(a, flag)) < 0) return rc;
    return v ? pass(a, v) : 0;
}

typedef struct proc {
    pid_t pid;
    int rank;
    int exited, status;
    char log[4096];
} proc;

/* ---------------------------------------------------------------- processes */

static volatile sig_atomic_t interrupted, stop_signal;
static void on_int(int sig) {
    /* The peers get the same signal: SIGTERM (a scheduler's preemption) makes them checkpoint. */
    if (!stop_signal) stop_signal = sig;
    interrupted++;
}

static void log_tail(const char *path, int lines) {
    FILE *f = fopen(path, "r");
    if (!f) return;
    char buf[64][512];
    int n = 0;
    while (fgets(buf[n % 64], sizeof(buf[0]), f)) n++;
    fclose(f);
    int from = n > lines ? n - lines : 0;
    for (int i = from; i < n; i++) fprintf(stderr, "    %s", buf[i % 64]);
}

int hs__cmd_launch(int argc, char **argv) {
    if (hs__launch_script_wanted(argc, argv)) return hs__cmd_launch_script(argc, argv);
    launch_args a;
    memset(&a, 0, sizeof(a));
    a.n = 8;
    a.runs_dir = "runs";
    a.refresh = 1.0;
    hs__runopts_default(&a.ro);
    /* The run options the launcher sets itself are neither accepted nor listed in --help. */
    static hs_cli_opt peer_opts[128];
    int np = 0;
    const hs_cli_opt *const src[] = {hs_run_opts_table, hs_runopts_table};
    for (int t = 0; t < 2; t++)
        for (const hs_cli_opt *o = src[t]; o->name && np < 127; o++) {
            int mine = 0;
            for (int i = 0; owned[i] && !mine; i++) mine = !strcmp(o->name, owned[i]);
            if (!mine) peer_opts[np++] = *o;
        }
    peer_opts[np] = (hs_cli_opt){NULL, 0, NULL, NULL};
    const hs_cli_opt *tables[] = {launch_opts, peer_opts, NULL};
    a.tables = tables;
    int rc = hs__cli_expand_config(&argc, &argv, tables);
    if (rc < 0) return -rc;
    rc = hs__cli_parse(argc, argv, "launch", "[options] [run options]",
                      "Start N peers (hearsay run) on this machine, on loopback with TLS, show "
                      "their progress live, and collect their metrics, a summary and plots in one "
                      "run directory. The options of hearsay run below are passed to every peer; "
                      "the launcher sets the others (addresses, ranks, metrics files) itself. The "
                      "summary's accuracy is over the peers that finished; peers that died are "
                      "listed apart. Exit status: 0 when every peer finished, 3 when the runs "
                      "diverged, 1 otherwise. With -- COMMAND it starts copies of a script "
                      "instead (hearsay launch --help -- lists those options).",
                      tables, handle, &a, NULL, 0, NULL);
    if (rc == 1) return HS_EXIT_OK;
    if (rc < 0) return -rc;
    if ((rc = hs__runopts_finish(&a.ro)) < 0) return -rc;
    if ((rc = hs__cli_precheck(a.ro.model, NULL, a.ro.topology, a.n, a.ro.seed)) < 0) return -rc;
    double *slow = calloc((size_t)a.n, sizeof(double));
    if (!slow || (rc = hs__runopts_slowdown(a.ro.slowdown, a.n, slow)) < 0) {
        free(slow);
        return slow ? -rc : HS_EXIT_FAIL;
    }
    if (a.insecure + a.certs + a.secret > 1)
        return -hs__cli_usage_error("choose one of --secret-file, --ca/--cert/--key and --insecure");
    if (a.ndevices && a.device && strcmp(a.device, "cuda") != 0)
        return -hs__cli_usage_error("--devices places peers on CUDA devices: it cannot be combined "
                                   "with --device %s", a.device);
    /* Refused here rather than by every peer at its start. */
    if (a.ro.precision != HS_PRECISION_FP32 && !a.ndevices && a.ro.device != HS_DEVICE_CUDA)
        return -hs__cli_usage_error("--precision %s needs --device cuda or --devices: the CPU "
                                   "computes in fp32 only", hs_precision_name(a.ro.precision));
    if (!a.ndevices && a.device &&
        ((rc = pass(&a, "--device")) < 0 || (rc = pass(&a, a.device)) < 0))
        return -rc;

    char base[200], name[256], dir[3000], path[4096];
    if (a.name) {
        snprintf(base, sizeof(base), "%s", a.name);
    } else {
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        snprintf(base, sizeof(base), "%04d%02d%02d-%02d%02d%02d-%s-n%d", tm.tm_year + 1900,
                 tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                 hs_algo_kind_name(a.ro.algo.kind), a.n);
    }
    /* The name is also the run id of the peers. */
    if ((rc = hs__cli_claim_run_dir(a.runs_dir, base, a.name != NULL, name, sizeof(name), dir,
                                    sizeof(dir))) < 0)
        return -rc;
    char secret[4096] = "";
    if (!a.insecure && !a.certs && !a.secret) {
        snprintf(secret, sizeof(secret), "%s/secret", dir);
        if (hs__cli_write_secret(secret) != 0) {
            fprintf(stderr, "hearsay launch: cannot write %s: %s\n", secret, strerror(errno));
            return HS_EXIT_FAIL;
        }
    }
    snprintf(path, sizeof(path), "%s/config.json", dir);
    hs_launch_resolved res = {a.n, a.runs_dir, a.refresh, a.no_plot, a.n, a.ndevices > 0};
    if (hs__launch_write_config(path, tables, &a.ro, &res, a.given, a.n_given) != 0)
        fprintf(stderr, "hearsay launch: cannot write %s: %s\n", path, strerror(errno));

    char exe[4096];
    ssize_t en = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (en <= 0) {
        fprintf(stderr, "hearsay launch: cannot find the hearsay binary\n");
        return HS_EXIT_FAIL;
    }
    exe[en] = '\0';
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_int;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    proc *ps = calloc((size_t)a.n, sizeof(proc));
    hs__lview_peer *pv = calloc((size_t)a.n * 2, sizeof(hs__lview_peer));
    if (!ps || !pv) return HS_EXIT_FAIL;
    char nbuf[16], rbuf[16], rv[4096], metrics[4096];
    snprintf(nbuf, sizeof(nbuf), "%d", a.n);
    snprintf(rv, sizeof(rv), "%s/rendezvous", dir);
    snprintf(metrics, sizeof(metrics), "%s/peer-{id}.jsonl", dir);
    printf("hearsay launch: %d peers, %s, %s, topology %s, %s shards, run directory %s\n", a.n,
           hs_algo_kind_name(a.ro.algo.kind), a.ro.compress, a.ro.topology, a.ro.partition_spec,
           dir);
    fflush(stdout);
    int user_pending_limit = 0;
    for (int j = 0; j < a.npass; j++)
        if (!strcmp(a.pass[j], "--max-pending-per-addr")) user_pending_limit = 1;
    double t0 = hs__cli_now();
    for (int i = 0; i < a.n; i++) {
        snprintf(rbuf, sizeof(rbuf), "%d", i);
        snprintf(ps[i].log, sizeof(ps[i].log), "%s/peer-%d.log", dir, i);
        char *args[256];
        int k = 0;
        args[k++] = exe;
        args[k++] = "run";
        for (int j = 0; j < a.npass && k < 200; j++) args[k++] = a.pass[j];
        char *mine[] = {"--listen", "127.0.0.1:0", "--world", nbuf, "--wait-peers", nbuf,
                        "--rank", rbuf, "--rendezvous", rv, "--metrics", metrics, "--run-id",
                        name, NULL};
        for (int j = 0; mine[j]; j++) args[k++] = mine[j];
        if (secret[0]) {
            args[k++] = "--secret-file";
            args[k++] = secret;
        }
        /* Every peer here dials from 127.0.0.1: the joins of a large launch arrive at once
         * from one address, more than the limit on strangers meant for another machine's. */
        char pbuf[32];
        if (!user_pending_limit) {
            snprintf(pbuf, sizeof(pbuf), "%d", a.n * 2 > 16 ? a.n * 2 : 16);
            args[k++] = "--max-pending-per-addr";
            args[k++] = pbuf;
        }
        char dbuf[32];
        if (a.ndevices) {
            snprintf(dbuf, sizeof(dbuf), "cuda:%d", a.devices[i % a.ndevices]);
            args[k++] = "--device";
            args[k++] = dbuf;
        }
        char sbuf[32];
        if (slow[i] > 1.0) {
            snprintf(sbuf, sizeof(sbuf), "%g", slow[i]);
            args[k++] = "--slowdown";
            args[k++] = sbuf;
        }
        args[k] = NULL;
        pid_t pid = fork();
        if (pid < 0) {
            fprintf(stderr, "hearsay launch: fork: %s\n", strerror(errno));
            interrupted = 1;
            break;
        }
        if (pid == 0) {
            int fd = open(ps[i].log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
            if (fd >= 0) {
                dup2(fd, STDOUT_FILENO);
                dup2(fd, STDERR_FILENO);
                close(fd);
            }
            signal(SIGINT, SIG_DFL);
            signal(SIGTERM, SIG_DFL);
            /* Its own process group: the terminal's Ctrl-C reaches the launcher only, which
             * stops the peers itself, in order. */
            setpgid(0, 0);
            execv(exe, args);
            _exit(127);
        }
        ps[i].pid = pid;
        ps[i].rank = i;
        ps[i].status = -1;
    }
    int tty = isatty(STDOUT_FILENO), drawn = 0, npv = 0, alive = 0, failed = 0, diverged = 0;
    for (int i = 0; i < a.n; i++) alive += ps[i].pid > 0; /* only the peers that were forked */
    double last_draw = 0, stop_sent = 0;
    while (alive > 0) {
        if (interrupted && stop_sent == 0) {
            printf("\nhearsay launch: stopping every peer (they finish their round and leave)...\n");
            fflush(stdout);
            drawn = 0;
            for (int i = 0; i < a.n; i++)
                if (ps[i].pid > 0 && !ps[i].exited) kill(ps[i].pid, stop_signal ? stop_signal : SIGINT);
            stop_sent = hs__cli_now();
        }
        if (stop_sent > 0 && hs__cli_now() - stop_sent > 10.0) {
            for (int i = 0; i < a.n; i++)
                if (ps[i].pid > 0 && !ps[i].exited) {
                    fprintf(stderr, "hearsay launch: peer %d (pid %d) did not stop in 10 s: killed\n",
                            i, (int)ps[i].pid);
                    kill(ps[i].pid, SIGKILL);
                }
            stop_sent = 1e300;
        }
        int st;
        pid_t w;
        while ((w = waitpid(-1, &st, WNOHANG)) > 0) {
            for (int i = 0; i < a.n; i++) {
                if (ps[i].pid != w) continue;
                ps[i].exited = 1;
                ps[i].status = st;
                alive--;
                int ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
                if (WIFEXITED(st) && WEXITSTATUS(st) == HS_EXIT_DIVERGED) {
                    /* Expected under the guard: the why is in the summary, not a log tail. */
                    diverged++;
                    if (tty && drawn) printf("\n");
                    drawn = 0;
                    fprintf(stderr, "hearsay launch: peer %d (pid %d) stopped: its run diverged "
                                    "(exit status %d)\n", i, (int)w, HS_EXIT_DIVERGED);
                } else if (!ok) {
                    failed++;
                    if (tty && drawn) printf("\n");
                    drawn = 0;
                    if (WIFEXITED(st))
                        fprintf(stderr, "hearsay launch: peer %d (pid %d) exited with status %d; "
                                        "the end of %s:\n", i, (int)w, WEXITSTATUS(st), ps[i].log);
                    else
                        fprintf(stderr, "hearsay launch: peer %d (pid %d) was killed by signal %d; "
                                        "the end of %s:\n", i, (int)w, WTERMSIG(st), ps[i].log);
                    log_tail(ps[i].log, 10);
                }
            }
        }
        double now = hs__cli_now();
        if (now - last_draw >= (tty ? a.refresh : 10 * a.refresh) || alive == 0) {
            hs__lview_scan(dir, pv, &npv, a.n * 2);
            if (!tty && alive == 0) break;
            drawn = hs__lview_draw(pv, npv, a.n, alive, tty, drawn, now - t0);
            last_draw = now;
        }
        if (alive > 0) usleep(50 * 1000);
    }
    double wall = hs__cli_now() - t0;
    hs__lview_scan(dir, pv, &npv, a.n * 2);
    if (tty) drawn = hs__lview_draw(pv, npv, a.n, alive, tty, drawn, wall);
    /* The accuracy is that of the peers that finished (their final report); a peer that died
     * holds a model the job left behind, listed apart, never averaged in. */
    double sum = 0, mn = 1, mx = 0;
    long long bytes = 0;
    int nacc = 0, ndead = 0;
    for (int i = 0; i < npv; i++) {
        bytes += pv[i].bytes;
        ndead += !pv[i].done;
        double acc = pv[i].final_acc;
        if (!pv[i].done || isnan(acc)) continue;
        sum += acc;
        mn = acc < mn ? acc : mn;
        mx = acc > mx ? acc : mx;
        nacc++;
    }
    char summary[1024], dv[32] = "", dd[48] = "";
    if (diverged) snprintf(dv, sizeof(dv), ", %d diverged", diverged);
    if (ndead) snprintf(dd, sizeof(dd), ", %d died before the end", ndead);
    if (nacc)
        snprintf(summary, sizeof(summary),
                 "summary: %d peers (%d failed%s%s%s); final test accuracy mean %.2f%% min %.2f%% "
                 "max %.2f%% over the %d that finished; %.1f MB sent in total (%.2f MB per peer); "
                 "wall time %.1f s",
                 a.n, failed, dv, dd, interrupted ? ", interrupted" : "", 100 * sum / nacc,
                 100 * mn, 100 * mx, nacc, bytes / 1e6, bytes / 1e6 / (npv ? npv : 1), wall);
    else
        snprintf(summary, sizeof(summary),
                 "summary: %d peers (%d failed%s%s%s); no peer finished with a test accuracy; "
                 "wall time %.1f s",
                 a.n, failed, dv, dd, interrupted ? ", interrupted" : "", wall);
    snprintf(path, sizeof(path), "%s/summary.txt", dir);
    FILE *f = fopen(path, "w");
    for (int pass = 0; pass < 2; pass++) {
        FILE *out = pass ? f : stdout;
        if (!out) continue;
        fprintf(out, "%s\n", summary);
        for (int i = 0; i < npv; i++) {
            if (pv[i].done) continue;
            char acc[48] = "no test accuracy";
            if (!isnan(pv[i].acc))
                snprintf(acc, sizeof(acc), "last test accuracy %.2f%%", 100 * pv[i].acc);
            fprintf(out, "dead: peer %d after round %.0f (%s; not in the summary)\n", pv[i].id,
                    pv[i].round, acc);
        }
        /* Why each peer stopped, and the knob (the same for every peer: one configuration). */
        const char *advice = NULL;
        for (int i = 0; i < npv; i++) {
            if (!pv[i].diverged) continue;
            fprintf(out, "diverged: peer %d at round %.0f: %s\n", pv[i].id, pv[i].diverged_round,
                    pv[i].reason);
            if (pv[i].advice[0]) advice = pv[i].advice;
        }
        if (advice) fprintf(out, "to fix: %s\n", advice);
    }
    if (f) fclose(f);
    if (!a.no_plot && npv > 0) hs__lview_plot(dir);
    fflush(stdout);
    free(ps);
    free(pv);
    free(slow);
    if (interrupted) return HS_EXIT_SIGINT;
    return failed ? HS_EXIT_FAIL : diverged ? HS_EXIT_DIVERGED : HS_EXIT_OK;
}
