/* hearsay launch's runs/NAME/config.json: the resolved configuration (src/cli/launch_config.c). */
#ifndef HS_CLI_LAUNCH_CONFIG_H
#define HS_CLI_LAUNCH_CONFIG_H

#include "cli/runopts.h"

/* An option as given on the command line (or by --config): the last value wins; NULL for a
 * switch. */
typedef struct hs_launch_given {
    const char *name;
    const char *value;
} hs_launch_given;

/* What the launcher resolved that is not in hs_runopts. */
typedef struct hs_launch_resolved {
    int n;
    const char *runs_dir;
    double refresh;
    int no_plot;
    int job_n;       /* peers of the job, for the automatic consensus step */
    int devices;     /* --devices places the peers: no shared --device to write */
} hs_launch_resolved;

/* Writes path: one key per option of `tables` (launch's own and those passed to the peers),
 * with the value given or, when none was, the value that applies (the defaults resolved as the
 * peers resolve them); keys whose default is "decided later" (--rounds against --epochs, the
 * model-dependent warm-up) are left out, which means the same. `hearsay launch --config path`
 * runs the same job again (--name aside). 0, or -1 with errno. */
int hs__launch_write_config(const char *path, const hs_cli_opt *const *tables,
                           const hs_runopts *ro, const hs_launch_resolved *lr,
                           const hs_launch_given *given, int n_given);

#endif
