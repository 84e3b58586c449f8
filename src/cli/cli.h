/* Shared pieces of the hearsay subcommands: a declarative option table from which both the
 * parser and --help are generated (so --help cannot drift from what is accepted), value parsers
 * that report the flag by name, and exit codes. */
#ifndef HS_CLI_CLI_H
#define HS_CLI_CLI_H

#include <stdio.h>

/* Exit codes of every subcommand. */
enum {
    HS_EXIT_OK = 0,
    HS_EXIT_FAIL = 1,     /* the run failed */
    HS_EXIT_USAGE = 2,    /* bad flags, bad values, bad or missing input files */
    HS_EXIT_DIVERGED = 3, /* the convergence guard stopped the run (hearsay/guard.h) */
    HS_EXIT_SIGINT = 130, /* stopped by Ctrl-C after a clean shutdown */
};

typedef struct hs_cli_opt {
    const char *name; /* long name without dashes; NULL ends a table */
    int key;          /* passed to the handler; >= 256 for long-only options */
    const char *arg;  /* metavariable ("N", "FILE"); NULL for a switch */
    const char *help; /* one line; "(default: ...)" included where there is one */
} hs_cli_opt;

/* Calls handle(ctx, key, value) for each option in argv, in order; value is NULL for switches.
 * tables is a NULL-terminated list of option tables (shared groups first). --help / -h prints
 * the help and returns 1 (the caller exits 0). Unknown options, missing values and stray
 * positional arguments print an error naming them and return -HS_EXIT_USAGE; a handler's
 * negative return is passed through. Positional arguments are collected into pos (up to
 * max_pos) when pos is non-NULL. Returns 0 when all went well. */
typedef int (*hs_cli_handler)(void *ctx, int key, const char *value);
int hs__cli_parse(int argc, char **argv, const char *cmd, const char *usage, const char *summary,
                 const hs_cli_opt *const *tables, hs_cli_handler handle, void *ctx,
                 const char **pos, int max_pos, int *npos);

void hs__cli_help(FILE *f, const char *cmd, const char *usage, const char *summary,
                 const hs_cli_opt *const *tables);

/* --config FILE: finds "--config FILE" (or --config=FILE) in argv, reads FILE (a JSON object
 * whose keys are long option names of `tables`; true switches the option on, false and null
 * leave it out, arrays become comma-separated lists) and replaces argv by the program name,
 * the file's options, then the other arguments, so that flags on the command line win.
 * Returns 0 (argv untouched when there is no --config) or -HS_EXIT_USAGE with the file and key
 * named. The new argv lives until exit. */
int hs__cli_expand_config(int *argc, char ***argv, const hs_cli_opt *const *tables);

/* Value parsers: on failure they print "hearsay CMD: --flag VALUE: reason" and return
 * -HS_EXIT_USAGE. */
int hs__cli_long(const char *flag, const char *s, long min, long max, long *out);
int hs__cli_int(const char *flag, const char *s, int min, int max, int *out);
int hs__cli_u64(const char *flag, const char *s, unsigned long long *out);
int hs__cli_float(const char *flag, const char *s, double min, double max, float *out);
int hs__cli_double(const char *flag, const char *s, double min, double max, double *out);

/* s in capitals into out (cap bytes, truncated): an algorithm's name as the messages write it. */
void hs__cli_upper(char *out, size_t cap, const char *s);

/* Prints "hearsay CMD: message" to stderr and returns -HS_EXIT_USAGE. */
int hs__cli_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The subcommand name used in messages ("train"); set by main. */
extern const char *hs__cli_cmd;

/* Ctrl-C handling: the first SIGINT/SIGTERM sets the flag (the work loop stops at the next
 * safe point); a second one exits at once with 130. */
void hs__cli_install_signals(void);
int hs__cli_interrupted(void);
/* The signal that set the flag (SIGINT or SIGTERM), 0 if none. */
int hs__cli_signal(void);

/* Seconds on a monotonic clock. */
double hs__cli_now(void);

/* Subcommands. Each returns an exit code. */
int hs__cmd_train(int argc, char **argv);
int hs__cmd_topo(int argc, char **argv);
int hs__cmd_sim(int argc, char **argv);
int hs__cmd_run(int argc, char **argv);
int hs__cmd_launch(int argc, char **argv);

#endif
