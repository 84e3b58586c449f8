/* Refusals before any data is loaded (src/cli/precheck.c): what a run would otherwise find
 * only after reading its data set, or hours later. */
#ifndef HS_CLI_PRECHECK_H
#define HS_CLI_PRECHECK_H

#include <stdint.h>

/* The directory of an output file (--save, --metrics; {id} stands for any peer id, "-" is
 * stdout) exists and is writable. 0 or -HS_EXIT_USAGE (printed, naming the option). */
int hs__cli_check_out_path(const char *opt, const char *path);

/* --model names a known model (or a readable model file), --metrics can be written, and
 * --topology builds for a job of n peers (n <= 1: not known yet; NULL: none). 0 or
 * -HS_EXIT_USAGE (printed). */
int hs__cli_precheck(const char *model, const char *metrics, const char *topology, int n,
                    uint64_t seed);

#endif
