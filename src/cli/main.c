/* The hearsay command: dispatches to one subcommand per file in src/cli/. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "hearsay/tensor.h"
#include "hs_config.h"

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *summary;
} cmds[] = {
    {"train", hs__cmd_train, "train one peer alone (the single-node baseline)"},
    {"run", hs__cmd_run, "run one peer of a decentralized job on the network"},
    {"launch", hs__cmd_launch, "start N peers on this machine and watch them train"},
    {"sim", hs__cmd_sim, "simulate N peers in one process, deterministically"},
    {"topo", hs__cmd_topo, "generate, check and show topologies (mixing matrices)"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: hearsay COMMAND [options]\n\n"
               "hearsay is a decentralized training peer: it trains its own replica of a model\n"
               "and gossips compressed updates with a few neighbours instead of a server.\n\n"
               "commands:\n");
    for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++)
        fprintf(f, "  %-8s %s\n", cmds[i].name, cmds[i].summary);
    fprintf(f, "\n  hearsay COMMAND --help   options of one command\n"
               "  hearsay --version        version and the compute backends built in\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return HS_EXIT_USAGE;
    }
    const char *c = argv[1];
    if (!strcmp(c, "--help") || !strcmp(c, "-h") || !strcmp(c, "help")) {
        if (!strcmp(c, "help") && argc > 2) {
            char help[] = "--help";
            char *sub[] = {argv[2], help, NULL};
            for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++)
                if (!strcmp(argv[2], cmds[i].name)) {
                    hs__cli_cmd = cmds[i].name;
                    return cmds[i].fn(2, sub);
                }
        }
        usage(stdout);
        return HS_EXIT_OK;
    }
    if (!strcmp(c, "--version") || !strcmp(c, "-V") || !strcmp(c, "version")) {
        printf("hearsay %s\nbackends: %s\n", HS_VERSION, hs_backends_built());
        return HS_EXIT_OK;
    }
    for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++)
        if (!strcmp(c, cmds[i].name)) {
            hs__cli_cmd = cmds[i].name;
            return cmds[i].fn(argc - 1, argv + 1);
        }
    fprintf(stderr, "hearsay: unknown command '%s'\n\n", c);
    usage(stderr);
    return HS_EXIT_USAGE;
}
