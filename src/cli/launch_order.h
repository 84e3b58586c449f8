/* hearsay launch: peers started one at a time (src/cli/launch_order.c). */
#ifndef HS_CLI_LAUNCH_ORDER_H
#define HS_CLI_LAUNCH_ORDER_H

#include <signal.h>
#include <sys/types.h>

/* Waits until the peer of launch index `index` (process pid, logging to `log`) is a member of
 * the job under id `index`. 0: it is; 1: the process exited (not reaped: the caller's wait
 * reports it); -1: it joined under another id, or not within timeout_s, or *interrupted (said
 * on stderr, except the interruption). */
int hs_launch_await_member(const char *log, int index, pid_t pid, double timeout_s,
                           const volatile sig_atomic_t *interrupted);

#endif
