/* Joins in the order given (src/cli/launch_order.c). */
#ifndef HS_CLI_LAUNCH_ORDER_H
#define HS_CLI_LAUNCH_ORDER_H

#include <signal.h>

/* The launcher's side: when the peer of launch index `index` (logging to `log`) is a member of
 * the job, creates `gate` (the next peer's --join-after) and returns 1; 0 while it is not.
 * Says on stderr when the peer got another id than its index. */
int hs_launch_gate(const char *gate, const char *log, int index);

/* The peer's side (--join-after): waits until `path` exists, at most timeout_s (then joins
 * anyway, saying so). -1 when *stop was set while waiting, else 0. */
int hs_cli_wait_gate(const char *path, double timeout_s, const volatile sig_atomic_t *stop);

#endif
