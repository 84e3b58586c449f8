/* A launch's run directory: claiming a fresh one and writing the run secret into it. */
#ifndef HS_CLI_RUNDIR_H
#define HS_CLI_RUNDIR_H

#include <stddef.h>

/* --name V: a plain directory name (not empty, no '/'), so the run stays under --runs-dir.
 * 0, or a usage error naming the value. */
int hs__cli_check_run_name(const char *v);

/* Creates runs_dir (with its parents) and claims runs_dir/base: mkdir is the claim, so of two
 * launches started at once exactly one gets a directory. A chosen name (chosen 1) that exists
 * is refused; a generated one takes the next free suffix (-2, -3, ...). Writes the name and the
 * directory's path; prints the reason and returns -HS_EXIT_USAGE on failure. */
int hs__cli_claim_run_dir(const char *runs_dir, const char *base, int chosen, char *name,
                          size_t ncap, char *dir, size_t dcap);

/* Writes a new random secret (32 bytes as hex) to path, mode 0600; -1 with errno on failure. */
int hs__cli_write_secret(const char *path);

#endif
