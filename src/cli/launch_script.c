/* hearsay launch [options] -- COMMAND...: N copies of the user's own program (a Python training
 * script using hearsay.Node or hearsay.torch), each told its place the way torchrun tells it
 * (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...) plus a generated run secret, with one run
 * directory for their logs and metrics, the live view of the nodes' metrics and plots at the
 * end (launch_view.c, as for `hearsay launch` of peers). Ctrl-C (or SIGTERM) is passed to
 * every copy, which stops it; a copy that has not exited after --grace seconds is killed. The
 * exit status is 0 only when every copy exited 0. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/launch_script.h"
#include "cli/launch_view.h"
#include "cli/rundir.h"

enum { S_N = 'n', S_NAME = 256, S_RUNS_DIR, S_MASTER, S_GRACE, S_REFRESH, S_NO_PLOT };

static const hs_cli_opt script_opts[] = {
    {"peers", S_N, "N", "number of processes (default: 2)"},
    {"name", S_NAME, "NAME",
     "run directory name, refused if it exists (default: DATE-TIME-script-nN, with -2, -3, ... "
     "added when another launch took it)"},
    {"runs-dir", S_RUNS_DIR, "DIR", "where run directories go (default: runs)"},
    {"master-addr", S_MASTER, "IP",
     "address rank 0 listens on, as MASTER_ADDR (default: 127.0.0.1)"},
    {"grace", S_GRACE, "S",
     "seconds the processes have to stop after Ctrl-C before they are killed (default: 10)"},
    {"refresh", S_REFRESH, "S",
     "live view refresh period on a terminal; a line every 10x that in a log (default: 1)"},
    {"no-plot", S_NO_PLOT, NULL, "do not plot the nodes' metrics at the end"},
    {NULL, 0, NULL, NULL},
};

typedef struct script_args {
    int n;
    const char *name, *runs_dir, *master;
    double grace, refresh;
    int no_plot;
} script_args;

static int handle(void *ctx, int key, const char *v) {
    script_args *a = ctx;
    switch (key) {
    case S_N: return hs__cli_int("--peers", v, 1, 4096, &a->n);
    case S_NAME:
        a->name = v;
        return hs__cli_check_run_name(v);
    case S_RUNS_DIR: a->runs_dir = v; return 0;
    case S_MASTER: {
        struct in_addr ip;
        if (inet_pton(AF_INET, v, &ip) != 1)
            return hs__cli_usage_error("--master-addr '%s': an IPv4 address", v);
        a->master = v;
        return 0;
    }
    case S_GRACE: return hs__cli_double("--grace", v, 0.1, 3600, &a->grace);
    case S_REFRESH: return hs__cli_double("--refresh", v, 0.05, 3600, &a->refresh);
    case S_NO_PLOT: a->no_plot = 1; return 0;
    }
    return hs__cli_usage_error("internal: unhandled option %d", key);
}

int hs__launch_script_wanted(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--")) return i;
    return 0;
}

static volatile sig_atomic_t interrupted, stop_signal;
static void on_stop(int sig) {
    if (!stop_signal) stop_signal = sig;
    interrupted++;
}

/* A port free on addr now, for MASTER_PORT; 0 if none could be had. Another program may take
 * it before rank 0 binds it: rank 0 then fails with "address in use", named in its log. */
static int free_port(const char *addr) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return 0;
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    inet_pton(AF_INET, addr, &sa.sin_addr);
    socklen_t len = sizeof(sa);
    int port = 0;
    if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
        getsockname(fd, (struct sockaddr *)&sa, &len) == 0)
        port = ntohs(sa.sin_port);
    close(fd);
    return port;
}

/* The run directory's name: --name, or DATE-TIME-script-nN. */
static void base_name(const script_args *a, char *out, size_t cap) {
    if (a->name) {
        snprintf(out, cap, "%s", a->name);
        return;
    }
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    snprintf(out, cap, "%04d%02d%02d-%02d%02d%02d-script-n%d", tm.tm_year + 1900, tm.tm_mon + 1,
             tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, a->n);
}

/* In the child: its place in the job, then the command. Never returns. */
static void exec_rank(char **cmd, int rank, const script_args *a, int port, const char *name,
                      const char *dir, const char *secret, const char *log) {
    char r[16], n[16], p[16], metrics[4096], rv[4096], listen[80];
    snprintf(r, sizeof(r), "%d", rank);
    snprintf(n, sizeof(n), "%d", a->n);
    snprintf(p, sizeof(p), "%d", port);
    snprintf(metrics, sizeof(metrics), "%s/peer-{id}.jsonl", dir);
    /* The nodes meet through a rendezvous file, which lets them in in rank order (through
     * MASTER_ADDR they would join in the order they happen to get there): peer R is rank R in
     * every file name and log line. MASTER_ADDR and MASTER_PORT stay for the script's own use. */
    snprintf(rv, sizeof(rv), "%s/rendezvous.addr", dir);
    snprintf(listen, sizeof(listen), "%s:0", a->master);
    /* Another launcher's variables would win over these in hearsay.Node: not in a copy of ours. */
    const char *unset[] = {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "SLURM_PROCID",
                           "SLURM_NTASKS", "TORCHELASTIC_USE_AGENT_STORE", "HEARSAY_MASTER_PORT",
                           "HEARSAY_LISTEN", "HEARSAY_RENDEZVOUS", NULL};
    for (int i = 0; unset[i]; i++) unsetenv(unset[i]);
    const char *set[][2] = {{"RANK", r},           {"LOCAL_RANK", r},       {"WORLD_SIZE", n},
                            {"LOCAL_WORLD_SIZE", n}, {"MASTER_ADDR", a->master}, {"MASTER_PORT", p},
                            {"HEARSAY_RUN_ID", name}, {"HEARSAY_RUN_DIR", dir},
                            {"HEARSAY_SECRET_FILE", secret}, {"HEARSAY_METRICS", metrics},
                            {"HEARSAY_RENDEZVOUS", rv},   {"HEARSAY_LISTEN", listen}};
    for (size_t i = 0; i < sizeof(set) / sizeof(set[0]); i++) setenv(set[i][0], set[i][1], 1);
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
        dup2(fd, STDOUT_FILENO);
        dup2(fd, STDERR_FILENO);
        close(fd);
    }
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    execvp(cmd[0], cmd);
    fprintf(stderr, "hearsay launch: cannot run %s: %s\n", cmd[0], strerror(errno));
    _exit(127);
}

typedef struct child {
    pid_t pid;
    int status, exited;
} child;

/* Waits for every child, drawing the live view from the nodes' metrics files in dir; on a stop
 * signal passes it to each one's process group (the script and whatever it started), and
 * kills the groups still there after the grace period. */
static void supervise(child *ps, const script_args *a, const char *dir, hs__lview_peer *pv,
                      int *npv) {
    int n = a->n, alive = 0, tty = isatty(STDOUT_FILENO), drawn = 0;
    double grace = a->grace;
    for (int i = 0; i < n; i++) alive += ps[i].pid > 0;
    double stop_sent = 0, t0 = hs__cli_now(), last_draw = t0;
    while (alive > 0) {
        if (interrupted && stop_sent == 0) {
            printf("\nhearsay launch: stopping every process...\n");
            fflush(stdout);
            drawn = 0;
            for (int i = 0; i < n; i++)
                if (ps[i].pid > 0 && !ps[i].exited) kill(-ps[i].pid, stop_signal ? stop_signal : SIGINT);
            stop_sent = hs__cli_now();
        }
        if (stop_sent > 0 && hs__cli_now() - stop_sent > grace) {
            for (int i = 0; i < n; i++)
                if (ps[i].pid > 0 && !ps[i].exited) {
                    fprintf(stderr, "hearsay launch: rank %d (pid %d) did not stop in %g s: killed\n",
                            i, (int)ps[i].pid, grace);
                    kill(-ps[i].pid, SIGKILL);
                }
            stop_sent = 1e300;
        }
        int st;
        pid_t w;
        while ((w = waitpid(-1, &st, WNOHANG)) > 0)
            for (int i = 0; i < n; i++)
                if (ps[i].pid == w) {
                    ps[i].exited = 1;
                    ps[i].status = st;
                    alive--;
                    if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0) && !interrupted) {
                        if (tty && drawn) printf("\n");
                        drawn = 0;
                        fprintf(stderr, "hearsay launch: rank %d (pid %d) %s %d\n", i, (int)w,
                                WIFEXITED(st) ? "exited with status" : "was killed by signal",
                                WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
                    }
                }
        double now = hs__cli_now();
        if (alive > 0 && now - last_draw >= (tty ? a->refresh : 10 * a->refresh)) {
            hs__lview_scan(dir, pv, npv, 2 * n);
            drawn = hs__lview_draw(pv, *npv, n, alive, tty, drawn, now - t0);
            last_draw = now;
        }
        if (alive > 0) usleep(50 * 1000);
    }
    hs__lview_scan(dir, pv, npv, 2 * n);
    if (tty && *npv) hs__lview_draw(pv, *npv, n, 0, tty, drawn, hs__cli_now() - t0);
}

int hs__cmd_launch_script(int argc, char **argv) {
    int dd = hs__launch_script_wanted(argc, argv);
    script_args a = {.n = 2, .runs_dir = "runs", .master = "127.0.0.1", .grace = 10, .refresh = 1};
    const hs_cli_opt *const tables[] = {script_opts, NULL};
    int rc = hs__cli_parse(dd, argv, "launch", "[options] -- COMMAND [ARG...]",
                          "Start N copies of COMMAND (a training script using hearsay.Node or "
                          "hearsay.torch) on this machine, as torchrun would: each gets RANK, "
                          "LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT, "
                          "and HEARSAY_SECRET_FILE (a generated run secret), HEARSAY_RUN_ID, "
                          "HEARSAY_RUN_DIR and HEARSAY_METRICS (the nodes' metrics files, shown "
                          "live and plotted at the end), and HEARSAY_RENDEZVOUS and HEARSAY_LISTEN "
                          "(the nodes meet through a file in RUN_DIR, in rank order, so that peer "
                          "R is rank R). Each one's output goes to "
                          "RUN_DIR/rank-R.log. Ctrl-C stops them all. Exit "
                          "status: 0 when every copy exited 0, 130 after Ctrl-C, 1 otherwise.",
                          tables, handle, &a, NULL, 0, NULL);
    if (rc == 1) return HS_EXIT_OK;
    if (rc < 0) return -rc;
    char **cmd = argv + dd + 1;
    if (!cmd[0]) return -hs__cli_usage_error("nothing to run after --");
    int port = free_port(a.master);
    if (!port) return -hs__cli_usage_error("--master-addr %s: no free port there", a.master);
    char base[200], name[256], dir[3000], secret[3100], log[3100];
    base_name(&a, base, sizeof(base));
    if ((rc = hs__cli_claim_run_dir(a.runs_dir, base, a.name != NULL, name, sizeof(name), dir,
                                    sizeof(dir))) < 0)
        return -rc;
    snprintf(secret, sizeof(secret), "%s/secret", dir);
    if (hs__cli_write_secret(secret) != 0) {
        fprintf(stderr, "hearsay launch: cannot write %s: %s\n", secret, strerror(errno));
        return HS_EXIT_FAIL;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_stop;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    child *ps = calloc((size_t)a.n, sizeof(child));
    hs__lview_peer *pv = calloc((size_t)a.n * 2, sizeof(hs__lview_peer));
    int npv = 0;
    if (!ps || !pv) {
        free(ps);
        free(pv);
        return HS_EXIT_FAIL;
    }
    printf("hearsay launch: %d copies of %s, MASTER_ADDR %s, MASTER_PORT %d, run directory %s\n",
           a.n, cmd[0], a.master, port, dir);
    fflush(stdout);
    for (int i = 0; i < a.n && !interrupted; i++) {
        snprintf(log, sizeof(log), "%s/rank-%d.log", dir, i);
        pid_t pid = fork();
        if (pid < 0) {
            fprintf(stderr, "hearsay launch: fork: %s\n", strerror(errno));
            interrupted = 1;
            break;
        }
        if (pid == 0) {
            /* Its own process group: the terminal's Ctrl-C reaches the launcher only, which
             * passes it on to every rank at once. */
            setpgid(0, 0);
            exec_rank(cmd, i, &a, port, name, dir, secret, log);
        }
        setpgid(pid, pid); /* whichever of the two runs first */
        ps[i].pid = pid;
    }
    supervise(ps, &a, dir, pv, &npv);
    int failed = 0;
    snprintf(log, sizeof(log), "%s/summary.txt", dir);
    FILE *f = fopen(log, "w");
    for (int i = 0; i < a.n; i++) {
        if (ps[i].pid <= 0) continue;
        int st = ps[i].status, ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
        failed += !ok;
        if (f)
            fprintf(f, "rank %d: %s %d\n", i, WIFEXITED(st) ? "exit status" : "killed by signal",
                    WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
    }
    if (f) fclose(f);
    printf("hearsay launch: %d of %d exited 0%s; logs and metrics in %s\n", a.n - failed, a.n,
           interrupted ? " (interrupted)" : "", dir);
    if (!a.no_plot && npv > 0) hs__lview_plot(dir);
    free(ps);
    free(pv);
    if (interrupted) return HS_EXIT_SIGINT;
    return failed ? HS_EXIT_FAIL : HS_EXIT_OK;
}
