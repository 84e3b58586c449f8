/* hearsay topo: generate topology files, check them (stochasticity, connectivity, spectral
 * gap) and show them as a weight listing or Graphviz DOT. Exit codes: 0 valid / done, 1 the
 * topology parses but is invalid, 2 usage errors and files that cannot be read or are not
 * JSON at all. */
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "hearsay/error.h"
#include "hearsay/topo.h"

#define MAX_FILES 1024

enum {
    O_PEERS = 'n',
    O_OUTPUT = 'o',
    O_ROWS = 256,
    O_COLS,
    O_DEGREE,
    O_BRIDGES,
    O_SEED,
    O_NAME,
    O_WEIGHTS,
    O_NOGAP,
    O_QUIET,
    O_DOT,
    O_ROUND,
    O_MATRIX,
};

static const hs_cli_opt gen_opts[] = {
    {"peers", O_PEERS, "N", "number of peers (torus: rows * cols when those are given)"},
    {"rows", O_ROWS, "R", "torus rows"},
    {"cols", O_COLS, "C", "torus columns"},
    {"degree", O_DEGREE, "D", "degree of a random regular graph"},
    {"bridges", O_BRIDGES, "B", "edges between the two clusters of two-cluster (default: 2)"},
    {"seed", O_SEED, "N", "seed of random generators (default: 1)"},
    {"name", O_NAME, "NAME", "the topology's name in the file (default: KIND-N...)"},
    {"weights", O_WEIGHTS, NULL, "write every weight, even where they are the defaults"},
    {"output", O_OUTPUT, "FILE", "write to FILE instead of standard output"},
    {NULL, 0, NULL, NULL},
};

static const hs_cli_opt spec_opts[] = {
    {"peers", O_PEERS, "N", "peers, when TOPO is a generator spec instead of a file"},
    {"seed", O_SEED, "N", "seed of random generators (default: 1)"},
    {NULL, 0, NULL, NULL},
};

static const hs_cli_opt check_opts[] = {
    {"no-gap", O_NOGAP, NULL, "skip the spectral gap (the O(n^3) part)"},
    {"quiet", O_QUIET, NULL, "one line per topology: valid, or invalid and why"},
    {NULL, 0, NULL, NULL},
};

static const hs_cli_opt show_opts[] = {
    {"dot", O_DOT, NULL, "print Graphviz DOT instead of the listing"},
    {"round", O_ROUND, "R", "show only round R of a time-varying schedule"},
    {"matrix", O_MATRIX, NULL, "also print the dense matrix W (up to 32 peers)"},
    {NULL, 0, NULL, NULL},
};

typedef struct topo_args {
    int peers, rows, cols, degree, bridges, weights, nogap, quiet, dot, matrix;
    long round;
    unsigned long long seed;
    const char *name, *output;
} topo_args;

static int handle(void *ctx, int key, const char *v) {
    topo_args *a = ctx;
    switch (key) {
    case O_PEERS: return hs__cli_int("--peers", v, 1, HS_TOPO_MAX_PEERS, &a->peers);
    case O_ROWS: return hs__cli_int("--rows", v, 1, HS_TOPO_MAX_PEERS, &a->rows);
    case O_COLS: return hs__cli_int("--cols", v, 1, HS_TOPO_MAX_PEERS, &a->cols);
    case O_DEGREE: return hs__cli_int("--degree", v, 0, HS_TOPO_MAX_PEERS, &a->degree);
    case O_BRIDGES: return hs__cli_int("--bridges", v, 1, HS_TOPO_MAX_PEERS, &a->bridges);
    case O_SEED: return hs__cli_u64("--seed", v, &a->seed);
    case O_NAME: a->name = v; return 0;
    case O_WEIGHTS: a->weights = 1; return 0;
    case O_OUTPUT: a->output = v; return 0;
    case O_NOGAP: a->nogap = 1; return 0;
    case O_QUIET: a->quiet = 1; return 0;
    case O_DOT: a->dot = 1; return 0;
    case O_ROUND: return hs__cli_long("--round", v, 0, 1L << 40, &a->round);
    case O_MATRIX: a->matrix = 1; return 0;
    }
    return hs__cli_usage_error("unhandled option");
}

static void usage(FILE *f) {
    fprintf(f, "usage: hearsay topo COMMAND [options]\n\n"
               "Topologies and their mixing matrices (docs/TOPOLOGY.md).\n\n"
               "commands:\n"
               "  gen KIND     write a generated topology as a JSON file\n"
               "  check TOPO   validate: stochastic, symmetric, connected, spectral gap\n"
               "  show TOPO    list neighbours and weights, or export Graphviz DOT\n\n"
               "TOPO is a topology file (*.json) or a generator spec with -n.\n"
               "KIND: ring, torus, hypercube, exponential, onepeer-exp, complete, regular,\n"
               "two-cluster (or a full spec: torus:4x4, regular:4, two-cluster:3).\n"
               "exit status: 0 valid, 1 invalid topology, 2 usage error or unreadable file.\n\n"
               "  hearsay topo COMMAND --help   options of one command\n");
}

/* Maps a library error to an exit code: the file was JSON but not a valid topology (1), or it
 * could not be read at all (2). */
static int load_exit(int err) { return err == HS_EINVAL || err == HS_ENOMEM ? 1 : 2; }

static int is_file(const char *s) {
    size_t k = strlen(s);
    return (k >= 5 && !strcmp(s + k - 5, ".json")) || strchr(s, '/');
}

/* A topology from a file (lenient: check and show report what is wrong) or a spec. Returns 0,
 * or an exit code after printing why. */
static int open_topo(const char *what, const topo_args *a, hs_topo **t) {
    int err;
    if (is_file(what)) {
        if ((err = hs_topo_load(t, what, HS_TOPO_LENIENT)) < 0) {
            int code = load_exit(err);
            fprintf(stderr, "hearsay %s: %s%s\n", hs__cli_cmd, code == 1 ? "invalid topology: " : "",
                    hs_error_message());
            return code;
        }
        return 0;
    }
    if ((err = hs_topo_generate(t, what, a->peers, a->seed)) < 0) {
        hs__cli_usage_error("%s", hs_error_message());
        return HS_EXIT_USAGE;
    }
    return 0;
}

static void print_report(const char *what, const hs_topo *t, const hs_topo_report *r,
                         int nogap) {
    printf("topology      %s", hs_topo_name(t));
    if (strcmp(what, hs_topo_name(t))) printf(" (%s)", what);
    printf("\npeers         %d\n", r->n);
    printf("directed      %s\n", r->directed ? "yes (push-sum: columns are a sender's shares)"
                                             : "no");
    if (r->period == 1) printf("period        1 (static)\n");
    else printf("period        %d rounds (time-varying)\n", r->period);
    printf("edges         %ld%s\n", r->edges, r->period > 1 ? " (union over one period)" : "");
    if (r->directed)
        printf("degree        in %d..%d, out %d..%d\n", r->in_min, r->in_max, r->out_min,
               r->out_max);
    else
        printf("degree        %d..%d\n", r->in_min, r->in_max);
    printf("symmetric     %s\n", r->symmetric ? "yes" : "no");
    const char *st = r->row_stochastic && r->col_stochastic ? "doubly"
                     : r->col_stochastic                   ? "column only"
                     : r->row_stochastic                   ? "row only"
                                                           : "no";
    printf("stochastic    %s (max |row sum - 1| %.2g, max |column sum - 1| %.2g)\n", st,
           r->row_err, r->col_err);
    printf("non-negative  %s\n", r->nonnegative ? "yes" : "no");
    printf("connected     %s\n", r->connected ? (r->directed ? "yes (strongly)" : "yes") : "no");
    if (r->period == 1) printf("aperiodic     %s\n", r->aperiodic ? "yes" : "no");
    if (r->gap_computed) {
        printf("spectral gap  %.9g (|lambda_2| %.9g", r->gap, r->lambda2);
        if (r->period > 1) printf(" of the product of one period's %d matrices", r->period);
        printf(", %s)\n", r->method);
    } else {
        if (nogap) printf("spectral gap  not computed (--no-gap)\n");
        else if (r->n > HS_TOPO_GAP_MAX_N)
            printf("spectral gap  not computed (more than %d peers)\n", HS_TOPO_GAP_MAX_N);
        else printf("spectral gap  not computed (W is not non-negative and stochastic)\n");
    }
    if (r->valid) printf("result        valid\n");
    else printf("result        invalid: %s\n", r->reason);
}

static int cmd_check(int argc, char **argv) {
    static const hs_cli_opt *const tables[] = {spec_opts, check_opts, NULL};
    const char *usage_s = "TOPO... [options]";
    const char *summary =
        "Validates topologies (files, or generator specs with -n): every peer has a neighbour,\n"
        "W is non-negative and doubly stochastic (undirected, also symmetric) or column\n"
        "stochastic (directed) within 1e-6, the graph is (strongly) connected and aperiodic,\n"
        "and the spectral gap 1 - |lambda_2| is positive (time-varying: of one period's\n"
        "product). Exit status: 0 all valid, 1 some invalid, 2 usage error or unreadable file.";
    topo_args a = {.seed = 1};
    const char *pos[MAX_FILES];
    int npos = 0;
    int rc = hs__cli_parse(argc, argv, "topo check", usage_s, summary, tables, handle, &a, pos,
                          MAX_FILES, &npos);
    if (rc == 1) return HS_EXIT_OK;
    if (rc < 0) return -rc;
    if (npos == 0) {
        hs__cli_usage_error("check needs a topology file (see hearsay topo check --help)");
        return HS_EXIT_USAGE;
    }
    int worst = HS_EXIT_OK;
    for (int k = 0; k < npos; k++) {
        hs_topo *t = NULL;
        hs_topo_report r;
        int code = open_topo(pos[k], &a, &t);
        if (code == 0) {
            int err = hs_topo_check(t, a.nogap ? HS_TOPO_CHECK_NOGAP : 0, &r);
            if (err < 0) {
                fprintf(stderr, "hearsay %s: %s\n", hs__cli_cmd, hs_error_message());
                code = HS_EXIT_FAIL;
            } else {
                if (a.quiet) {
                    if (r.valid) printf("%s: valid\n", pos[k]);
                    else printf("%s: invalid: %s\n", pos[k], r.reason);
                } else {
                    if (k) printf("\n");
                    print_report(pos[k], t, &r, a.nogap);
                }
                code = r.valid ? HS_EXIT_OK : HS_EXIT_FAIL;
            }
        }
        hs_topo_free(t);
        if (code > worst) worst = code;
    }
    fflush(stdout);
    return worst;
}

static int cmp_int(const void *x, const void *y) {
    int a = *(const int *)x, b = *(const int *)y;
    return (a > b) - (a < b);
}

static void print_edges(const hs_edge *e, int n, const char *arrow) {
    printf("  %s", arrow);
    if (!n) printf(" -");
    for (int k = 0; k < n; k++) printf(" %d:%.6g", e[k].peer, e[k].w);
}

static int show_round(const hs_topo *t, long round) {
    int n = hs_topo_n(t), dir = hs_topo_directed(t);
    for (int i = 0; i < n; i++) {
        hs_view v;
        if (hs_topo_view(t, i, (uint64_t)round, &v) < 0) return -1;
        printf("  %5d  self %-9.6g", i, v.self_w);
        if (dir) {
            print_edges(v.in, v.n_in, "<-");
            print_edges(v.out, v.n_out, "->");
        } else {
            print_edges(v.in, v.n_in, "--");
        }
        const char *ad = hs_topo_address(t, i);
        if (ad) printf("  @ %s", ad);
        printf("\n");
        hs_view_free(&v);
    }
    return 0;
}

/* The emulation spec of every link of the union graph (each sender's out-neighbours over one
 * period, ascending). */
static int show_emulation(const hs_topo *t) {
    int n = hs_topo_n(t);
    int *seen = malloc((size_t)n * sizeof(int)), *peers = malloc((size_t)n * sizeof(int));
    if (!seen || !peers) {
        free(seen);
        free(peers);
        fprintf(stderr, "hearsay %s: out of memory\n", hs__cli_cmd);
        return HS_EXIT_FAIL;
    }
    for (int j = 0; j < n; j++) seen[j] = -1;
    printf("link emulation (from -> to: spec)\n");
    for (int i = 0; i < n; i++) {
        int k = 0;
        for (int r = 0; r < hs_topo_period(t); r++) {
            hs_view v;
            if (hs_topo_view(t, i, (uint64_t)r, &v) < 0) continue;
            for (int q = 0; q < v.n_out; q++)
                if (seen[v.out[q].peer] != i) {
                    seen[v.out[q].peer] = i;
                    peers[k++] = v.out[q].peer;
                }
            hs_view_free(&v);
        }
        qsort(peers, (size_t)k, sizeof(int), cmp_int);
        for (int q = 0; q < k; q++) {
            const char *s = hs_topo_link_emulation(t, i, peers[q]);
            if (s) printf("  %d -> %d: %s\n", i, peers[q], s);
        }
    }
    free(seen);
    free(peers);
    return HS_EXIT_OK;
}

static int cmd_show(int argc, char **argv) {
    static const hs_cli_opt *const tables[] = {spec_opts, show_opts, NULL};
    const char *summary =
        "Lists each peer's self weight, neighbours and weights (undirected: --; directed:\n"
        "<- receives from, -> sends to, with the sender's share), addresses and link\n"
        "emulation, or writes the graph as Graphviz DOT (--dot). Files are shown even when\n"
        "they fail hearsay topo check.";
    topo_args a = {.seed = 1, .round = -1};
    const char *pos[1];
    int npos = 0;
    int rc = hs__cli_parse(argc, argv, "topo show", "TOPO [options]", summary, tables, handle, &a,
                          pos, 1, &npos);
    if (rc == 1) return HS_EXIT_OK;
    if (rc < 0) return -rc;
    if (npos == 0) {
        hs__cli_usage_error("show needs a topology file (see hearsay topo show --help)");
        return HS_EXIT_USAGE;
    }
    hs_topo *t = NULL;
    int code = open_topo(pos[0], &a, &t);
    if (code) return code;
    int n = hs_topo_n(t), period = hs_topo_period(t), dir = hs_topo_directed(t);
    if (a.round >= period) {
        hs_topo_free(t);
        hs__cli_usage_error("--round %ld: the schedule has %d rounds (0..%d)", a.round, period,
                           period - 1);
        return HS_EXIT_USAGE;
    }
    if (a.dot) {
        char *s = NULL;
        if (hs_topo_to_dot(t, &s) < 0) {
            fprintf(stderr, "hearsay %s: %s\n", hs__cli_cmd, hs_error_message());
            hs_topo_free(t);
            return HS_EXIT_FAIL;
        }
        fputs(s, stdout);
        free(s);
        hs_topo_free(t);
        return HS_EXIT_OK;
    }
    printf("%s: %d peers, %s, %s\n", hs_topo_name(t), n, dir ? "directed" : "undirected",
           period == 1 ? "static" : "time-varying");
    for (int r = 0; r < period; r++) {
        if (a.round >= 0 && r != a.round) continue;
        if (period > 1) printf("round %d (used at rounds t with t mod %d = %d)\n", r, period, r);
        if (show_round(t, r) < 0) {
            fprintf(stderr, "hearsay %s: %s\n", hs__cli_cmd, hs_error_message());
            hs_topo_free(t);
            return HS_EXIT_FAIL;
        }
        if (a.matrix && n <= 32) {
            double *W = malloc((size_t)n * (size_t)n * sizeof(double));
            if (W) {
                hs_topo_matrix(t, (uint64_t)r, W);
                printf("  W =\n");
                for (int i = 0; i < n; i++) {
                    printf("   ");
                    for (int j = 0; j < n; j++) printf(" %6.4f", W[(size_t)i * n + j]);
                    printf("\n");
                }
            }
            free(W);
        }
    }
    if (a.matrix && n > 32) printf("(--matrix: more than 32 peers, not printed)\n");
    code = hs_topo_has_emulation(t) ? show_emulation(t) : HS_EXIT_OK;
    hs_topo_free(t);
    return code;
}

static int cmd_gen(int argc, char **argv) {
    static const hs_cli_opt *const tables[] = {gen_opts, NULL};
    const char *summary =
        "Writes a generated topology as a JSON file (valid by construction; weights are\n"
        "Metropolis-Hastings, uniform 1/(d+1) on regular graphs, uniform shares when directed).\n"
        "KIND: ring, torus (--rows, --cols), hypercube (n a power of 2), exponential (i linked\n"
        "to i +/- 2^k), onepeer-exp (time-varying, directed: round t, i sends to\n"
        "i + 2^(t mod ceil(log2 n))), complete, regular (--degree, --seed), two-cluster\n"
        "(--bridges), or a full spec such as torus:4x4.";
    topo_args a = {.seed = 1, .degree = -1};
    const char *pos[1];
    int npos = 0;
    int rc = hs__cli_parse(argc, argv, "topo gen", "KIND [options]", summary, tables, handle, &a,
                          pos, 1, &npos);
    if (rc == 1) return HS_EXIT_OK;
    if (rc < 0) return -rc;
    if (npos == 0) {
        hs__cli_usage_error("gen needs a KIND (see hearsay topo gen --help)");
        return HS_EXIT_USAGE;
    }
    const char *kind = pos[0];
    if (is_file(kind)) {
        hs__cli_usage_error("gen: '%s' is a file name, not a generator KIND", kind);
        return HS_EXIT_USAGE;
    }
    int has_par = strchr(kind, ':') != NULL;
    size_t klen = has_par ? (size_t)(strchr(kind, ':') - kind) : strlen(kind);
    char spec[128];
    int is_torus = klen == 5 && !strncmp(kind, "torus", 5);
    int is_reg = klen == 7 && !strncmp(kind, "regular", 7);
    int is_two = klen == 11 && !strncmp(kind, "two-cluster", 11);
    if ((a.rows || a.cols) && !is_torus) {
        hs__cli_usage_error("--rows/--cols apply to torus only");
        return HS_EXIT_USAGE;
    }
    if (a.degree >= 0 && !is_reg) {
        hs__cli_usage_error("--degree applies to regular only");
        return HS_EXIT_USAGE;
    }
    if (a.bridges && !is_two) {
        hs__cli_usage_error("--bridges applies to two-cluster only");
        return HS_EXIT_USAGE;
    }
    if (has_par && (a.rows || a.cols || a.degree >= 0 || a.bridges)) {
        hs__cli_usage_error("'%s' already has parameters; drop the flag", kind);
        return HS_EXIT_USAGE;
    }
    snprintf(spec, sizeof(spec), "%.100s", kind);
    if (is_torus && (a.rows || a.cols)) {
        if (!a.rows || !a.cols) {
            hs__cli_usage_error("torus: give both --rows and --cols");
            return HS_EXIT_USAGE;
        }
        snprintf(spec, sizeof(spec), "torus:%dx%d", a.rows, a.cols);
    } else if (is_reg && !has_par) {
        if (a.degree < 0) {
            hs__cli_usage_error("regular: give --degree D");
            return HS_EXIT_USAGE;
        }
        snprintf(spec, sizeof(spec), "regular:%d", a.degree);
    } else if (is_two && a.bridges) {
        snprintf(spec, sizeof(spec), "two-cluster:%d", a.bridges);
    }
    int torus_sized = is_torus && (a.rows || has_par);
    if (!a.peers && !torus_sized) {
        hs__cli_usage_error("%s: give the number of peers with -n", kind);
        return HS_EXIT_USAGE;
    }
    hs_topo *t = NULL;
    if (hs_topo_new(&t, spec, a.peers, a.seed) < 0) {
        hs__cli_usage_error("%s", hs_error_message());
        return HS_EXIT_USAGE;
    }
    char *json = NULL;
    int err = 0;
    if (a.name && hs_topo_set_name(t, a.name) < 0) {
        hs__cli_usage_error("--name: %s", hs_error_message());
        hs_topo_free(t);
        return HS_EXIT_USAGE;
    }
    err = hs_topo_to_json(t, a.weights ? HS_TOPO_JSON_WEIGHTS : 0, &json);
    hs_topo_free(t);
    if (err < 0) {
        fprintf(stderr, "hearsay %s: out of memory\n", hs__cli_cmd);
        free(json);
        return HS_EXIT_FAIL;
    }
    FILE *f = a.output ? fopen(a.output, "w") : stdout;
    if (!f) {
        fprintf(stderr, "hearsay %s: %s: cannot create\n", hs__cli_cmd, a.output);
        free(json);
        return HS_EXIT_FAIL;
    }
    size_t len = strlen(json);
    int bad = fwrite(json, 1, len, f) != len;
    bad |= a.output ? fclose(f) != 0 : fflush(f) != 0;
    free(json);
    if (bad) {
        fprintf(stderr, "hearsay %s: %s: write failed\n", hs__cli_cmd,
                a.output ? a.output : "standard output");
        return HS_EXIT_FAIL;
    }
    return HS_EXIT_OK;
}

int hs__cmd_topo(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return HS_EXIT_USAGE;
    }
    const char *c = argv[1];
    if (!strcmp(c, "--help") || !strcmp(c, "-h") || !strcmp(c, "help")) {
        usage(stdout);
        return HS_EXIT_OK;
    }
    if (!strcmp(c, "gen")) {
        hs__cli_cmd = "topo gen";
        return cmd_gen(argc - 1, argv + 1);
    }
    if (!strcmp(c, "check")) {
        hs__cli_cmd = "topo check";
        return cmd_check(argc - 1, argv + 1);
    }
    if (!strcmp(c, "show")) {
        hs__cli_cmd = "topo show";
        return cmd_show(argc - 1, argv + 1);
    }
    fprintf(stderr, "hearsay topo: unknown command '%s'\n\n", c);
    usage(stderr);
    return HS_EXIT_USAGE;
}
