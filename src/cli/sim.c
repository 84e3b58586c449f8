/* hearsay sim: placeholder until its issue lands. */
#include <stdio.h>

#include "cli/cli.h"

int hs_cmd_sim(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "hearsay sim: not built yet\n");
    return HS_EXIT_FAIL;
}
