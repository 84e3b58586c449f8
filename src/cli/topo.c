/* hearsay topo: placeholder until its issue lands. */
#include <stdio.h>

#include "cli/cli.h"

int hs_cmd_topo(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "hearsay topo: not built yet\n");
    return HS_EXIT_FAIL;
}
