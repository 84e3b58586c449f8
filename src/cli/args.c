/* Option parsing over getopt_long, driven by the same tables that print --help. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "core/clock.h"

const char *hs__cli_cmd = "";

int hs__cli_usage_error(const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "hearsay %s: ", hs__cli_cmd);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    return -HS_EXIT_USAGE;
}

void hs__cli_help(FILE *f, const char *cmd, const char *usage, const char *summary,
                 const hs_cli_opt *const *tables) {
    fprintf(f, "usage: hearsay %s %s\n\n%s\n\noptions:\n", cmd, usage, summary);
    for (int t = 0; tables[t]; t++)
        for (const hs_cli_opt *o = tables[t]; o->name; o++) {
            /* A command may redefine a shared option's meaning in its own (earlier) table. */
            int seen = 0;
            for (int t2 = 0; t2 <= t && !seen; t2++)
                for (const hs_cli_opt *p = tables[t2]; p->name && p != o && !seen; p++)
                    seen = !strcmp(p->name, o->name);
            if (seen) continue;
            char left[64];
            if (o->key > 0 && o->key < 128)
                snprintf(left, sizeof(left), "-%c, --%s%s%s", o->key, o->name, o->arg ? " " : "",
                         o->arg ? o->arg : "");
            else
                snprintf(left, sizeof(left), "    --%s%s%s", o->name,
                         o->arg && o->arg[0] != '[' ? " " : "", o->arg ? o->arg : "");
            fprintf(f, "  %-28s %s\n", left, o->help);
        }
    fprintf(f, "  %-28s %s\n", "-h, --help", "print this help and exit");
}

int hs__cli_parse(int argc, char **argv, const char *cmd, const char *usage, const char *summary,
                 const hs_cli_opt *const *tables, hs_cli_handler handle, void *ctx,
                 const char **pos, int max_pos, int *npos) {
    int n = 0;
    for (int t = 0; tables[t]; t++)
        for (const hs_cli_opt *o = tables[t]; o->name; o++) n++;
    struct option *lo = calloc((size_t)n + 2, sizeof(*lo));
    char shorts[256] = ":h";
    size_t sl = 2;
    if (!lo) return hs__cli_usage_error("out of memory");
    int k = 0;
    for (int t = 0; tables[t]; t++)
        for (const hs_cli_opt *o = tables[t]; o->name; o++) {
            lo[k].name = o->name;
            /* An argument named "[=WORD]" is optional: --name or --name=WORD. */
            lo[k].has_arg = !o->arg ? no_argument
                            : o->arg[0] == '[' ? optional_argument
                                               : required_argument;
            lo[k].val = o->key;
            k++;
            if (o->key > 0 && o->key < 128 && sl + 3 < sizeof(shorts)) {
                shorts[sl++] = (char)o->key;
                if (o->arg) shorts[sl++] = ':';
            }
        }
    lo[k].name = "help";
    lo[k].val = 'h';
    shorts[sl] = '\0';
    int np = 0, rc = 0;
    optind = 1;
    opterr = 0;
    /* '+' would stop at the first positional; "-" returns positionals in order as key 1. */
    char spec[260];
    snprintf(spec, sizeof(spec), "-%s", shorts);
    for (;;) {
        int li = -1;
        int c = getopt_long(argc, argv, spec, lo, &li);
        if (c == -1) break;
        if (c == 'h') {
            hs__cli_help(stdout, cmd, usage, summary, tables);
            rc = 1;
            break;
        }
        if (c == '?') {
            if (optopt && optopt < 128 && optopt > 0)
                rc = hs__cli_usage_error("unknown option '-%c' (see hearsay %s --help)", optopt, cmd);
            else
                rc = hs__cli_usage_error("unknown option '%s' (see hearsay %s --help)",
                                        argv[optind - 1], cmd);
            break;
        }
        if (c == ':') {
            rc = hs__cli_usage_error("option '%s' needs a value", argv[optind - 1]);
            break;
        }
        if (c == 1) {
            if (!pos || np >= max_pos) {
                rc = hs__cli_usage_error("unexpected argument '%s' (see hearsay %s --help)",
                                        optarg, cmd);
                break;
            }
            pos[np++] = optarg;
            continue;
        }
        rc = handle(ctx, c, optarg);
        if (rc < 0) break;
    }
    free(lo);
    if (npos) *npos = np;
    return rc;
}

int hs__cli_long(const char *flag, const char *s, long min, long max, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end || errno)
        return hs__cli_usage_error("%s '%s': not an integer", flag, s);
    if (v < min || v > max)
        return hs__cli_usage_error("%s %ld: must be in %ld..%ld", flag, v, min, max);
    *out = v;
    return 0;
}

int hs__cli_int(const char *flag, const char *s, int min, int max, int *out) {
    long v = 0;
    int rc = hs__cli_long(flag, s, min, max, &v);
    if (rc < 0) return rc;
    *out = (int)v;
    return 0;
}

int hs__cli_u64(const char *flag, const char *s, unsigned long long *out) {
    char *end;
    errno = 0;
    if (*s == '-') return hs__cli_usage_error("%s '%s': must not be negative", flag, s);
    unsigned long long v = strtoull(s, &end, 0);
    if (end == s || *end || errno) return hs__cli_usage_error("%s '%s': not an integer", flag, s);
    *out = v;
    return 0;
}

int hs__cli_double(const char *flag, const char *s, double min, double max, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end || errno || !isfinite(v))
        return hs__cli_usage_error("%s '%s': not a finite number", flag, s);
    if (v < min || v > max)
        return hs__cli_usage_error("%s %g: must be in [%g, %g]", flag, v, min, max);
    *out = v;
    return 0;
}

int hs__cli_float(const char *flag, const char *s, double min, double max, float *out) {
    double v = 0;
    int rc = hs__cli_double(flag, s, min, max, &v);
    if (rc < 0) return rc;
    *out = (float)v;
    return 0;
}

static volatile sig_atomic_t got_signal;

static void on_signal(int sig) {
    if (got_signal) {
        /* A second Ctrl-C: the user wants out now. */
        static const char msg[] = "\nhearsay: interrupted again, exiting now\n";
        ssize_t w = write(STDERR_FILENO, msg, sizeof(msg) - 1);
        (void)w;
        _exit(HS_EXIT_SIGINT);
    }
    got_signal = sig;
}

void hs__cli_install_signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}

int hs__cli_interrupted(void) { return got_signal != 0; }
int hs__cli_signal(void) { return (int)got_signal; }

double hs__cli_now(void) { return hs__mono_s(); }

void hs__cli_upper(char *out, size_t cap, const char *s) {
    size_t i = 0;
    for (; cap && i + 1 < cap && s[i]; i++)
        out[i] = (char)(s[i] >= 'a' && s[i] <= 'z' ? s[i] - 'a' + 'A' : s[i]);
    if (cap) out[i] = '\0';
}
