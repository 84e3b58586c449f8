/* Writers: a topology as the JSON file format (docs/TOPOLOGY.md) that the reader turns back
 * into the same matrices, and as Graphviz DOT. No cJSON: the layout (one edge per line) is
 * chosen for diffs, and the strings written were validated as printable on the way in. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error_internal.h"
#include "topo/topo_internal.h"

/* 1 when the self weights are what "auto" recomputes (same summation order as the builder). */
static int self_is_auto(const hs_topo *t, const hs__tgraph *g) {
    for (int i = 0; i < t->n; i++) {
        double s = 0;
        if (t->directed)
            for (size_t q = g->cp[i]; q < g->cp[i + 1]; q++) s += g->cw[q];
        else
            for (size_t q = g->rp[i]; q < g->rp[i + 1]; q++) s += g->rw[q];
        if (g->self[i] != 1.0 - s) return 0;
    }
    return 1;
}

/* The edge list of one round: undirected [i, j] with i < j; directed [from, to] (from = the
 * sender j of W[to][j]). */
static void write_edges(hs__sbuf *b, const hs_topo *t, const hs__tgraph *g, int weights,
                        const char *indent) {
    int first = 1;
    hs__sb_printf(b, "[");
    for (int j = 0; j < t->n; j++)
        for (size_t q = g->cp[j]; q < g->cp[j + 1]; q++) {
            int i = g->ci[q];
            if (!t->directed && i < j) continue;
            hs__sb_printf(b, "%s\n%s[%d, %d", first ? "" : ",", indent, j, i);
            if (weights) hs__sb_printf(b, ", %.17g", g->cw[q]);
            hs__sb_printf(b, "]");
            first = 0;
        }
    if (!first) hs__sb_printf(b, "\n%.*s", (int)strlen(indent) - 2, indent);
    hs__sb_printf(b, "]");
}

static void write_self(hs__sbuf *b, const hs_topo *t, const hs__tgraph *g) {
    if (self_is_auto(t, g)) {
        hs__sb_printf(b, "\"auto\"");
        return;
    }
    hs__sb_printf(b, "[");
    for (int i = 0; i < t->n; i++) hs__sb_printf(b, "%s%.17g", i ? ", " : "", g->self[i]);
    hs__sb_printf(b, "]");
}

int hs_topo_to_json(const hs_topo *t, unsigned flags, char **out) {
    hs__sbuf b = {0};
    int weights = !t->default_weights || (flags & HS_TOPO_JSON_WEIGHTS);
    *out = NULL;
    hs__sb_printf(&b, "{\n  \"name\": ");
    hs__sb_json_str(&b, t->name);
    hs__sb_printf(&b, ",\n  \"peers\": %d,\n  \"directed\": %s,\n", t->n,
                  t->directed ? "true" : "false");
    if (t->period == 1) {
        hs__sb_printf(&b, "  \"edges\": ");
        write_edges(&b, t, &t->g[0], weights, "    ");
        if (weights) {
            hs__sb_printf(&b, ",\n  \"self_weight\": ");
            write_self(&b, t, &t->g[0]);
        }
    } else {
        hs__sb_printf(&b, "  \"schedule\": [");
        for (int r = 0; r < t->period; r++) {
            hs__sb_printf(&b, "%s\n    {\"edges\": ", r ? "," : "");
            write_edges(&b, t, &t->g[r], weights, "      ");
            if (weights) {
                hs__sb_printf(&b, ", \"self_weight\": ");
                write_self(&b, t, &t->g[r]);
            }
            hs__sb_printf(&b, "}");
        }
        hs__sb_printf(&b, "\n  ]");
    }
    if (t->addr) {
        hs__sb_printf(&b, ",\n  \"addresses\": [");
        for (int i = 0; i < t->n; i++) {
            hs__sb_printf(&b, "%s\n    ", i ? "," : "");
            hs__sb_json_str(&b, t->addr[i] ? t->addr[i] : "");
        }
        hs__sb_printf(&b, "\n  ]");
    }
    if (hs_topo_has_emulation(t)) {
        const char *sep = "";
        hs__sb_printf(&b, ",\n  \"emulate\": {");
        if (t->emu_default) {
            hs__sb_printf(&b, "\n    \"default\": ");
            hs__sb_json_str(&b, t->emu_default);
            sep = ",";
        }
        if (t->emu_peer) {
            int first = 1;
            hs__sb_printf(&b, "%s\n    \"peers\": {", sep);
            for (int i = 0; i < t->n; i++) {
                if (!t->emu_peer[i]) continue;
                hs__sb_printf(&b, "%s\n      \"%d\": ", first ? "" : ",", i);
                hs__sb_json_str(&b, t->emu_peer[i]);
                first = 0;
            }
            hs__sb_printf(&b, "\n    }");
            sep = ",";
        }
        if (t->n_emu) {
            int first = 1;
            hs__sb_printf(&b, "%s\n    \"edges\": [", sep);
            for (size_t k = 0; k < t->n_emu; k++) {
                const hs__emu_link *l = &t->emu[k];
                /* An undirected entry is stored both ways; write it once. */
                if (!t->directed && l->from > l->to) continue;
                hs__sb_printf(&b, "%s\n      [%d, %d, ", first ? "" : ",", l->from, l->to);
                hs__sb_json_str(&b, l->spec);
                hs__sb_printf(&b, "]");
                first = 0;
            }
            hs__sb_printf(&b, "\n    ]");
        }
        hs__sb_printf(&b, "\n  }");
    }
    hs__sb_printf(&b, "\n}\n");
    if (b.oom) {
        free(b.p);
        return hs__err(HS_ENOMEM, "topology %s: out of memory writing JSON", t->name);
    }
    *out = b.p;
    return 0;
}

int hs_topo_to_dot(const hs_topo *t, char **out) {
    hs__sbuf b = {0};
    int *rounds = NULL;
    *out = NULL;
    hs__sb_printf(&b, "%s ", t->directed ? "digraph" : "graph");
    hs__sb_json_str(&b, t->name);
    hs__sb_printf(&b, " {\n  node [shape=circle];\n");
    if (t->period == 1)
        for (int i = 0; i < t->n; i++)
            hs__sb_printf(&b, "  %d [label=\"%d\\nself %.4g\"];\n", i, i, t->g[0].self[i]);
    else
        for (int i = 0; i < t->n; i++) hs__sb_printf(&b, "  %d;\n", i);
    /* Union of the rounds, each edge labelled with its weight or with the rounds using it: a
     * merge over the rounds' columns (each sorted by receiver) with one cursor per round. */
    size_t *cur = malloc((size_t)t->period * sizeof(size_t));
    if (!(rounds = malloc((size_t)t->period * sizeof(int))) || !cur) {
        free(cur);
        free(rounds);
        free(b.p);
        return hs__err(HS_ENOMEM, "topology %s: out of memory", t->name);
    }
    const char *arrow = t->directed ? "->" : "--";
    for (int j = 0; j < t->n; j++) {
        for (int r = 0; r < t->period; r++) cur[r] = t->g[r].cp[j];
        for (;;) {
            int best = t->n, nr = 0;
            double w = 0;
            for (int r = 0; r < t->period; r++) {
                const hs__tgraph *g = &t->g[r];
                if (cur[r] < g->cp[j + 1] && g->ci[cur[r]] < best) best = g->ci[cur[r]];
            }
            if (best == t->n) break;
            for (int r = 0; r < t->period; r++) {
                const hs__tgraph *g = &t->g[r];
                if (cur[r] < g->cp[j + 1] && g->ci[cur[r]] == best) {
                    rounds[nr++] = r;
                    w = g->cw[cur[r]++];
                }
            }
            if (!t->directed && best < j) continue;
            if (t->period == 1) {
                hs__sb_printf(&b, "  %d %s %d [label=\"%.4g\"];\n", j, arrow, best, w);
                continue;
            }
            hs__sb_printf(&b, "  %d %s %d [label=\"t=", j, arrow, best);
            for (int k = 0; k < nr; k++) hs__sb_printf(&b, "%s%d", k ? "," : "", rounds[k]);
            hs__sb_printf(&b, "\"];\n");
        }
    }
    free(cur);
    hs__sb_printf(&b, "}\n");
    free(rounds);
    if (b.oom) {
        free(b.p);
        return hs__err(HS_ENOMEM, "topology %s: out of memory writing DOT", t->name);
    }
    *out = b.p;
    return 0;
}

int hs_topo_write(const hs_topo *t, const char *path, unsigned flags) {
    char *s = NULL;
    int err = hs_topo_to_json(t, flags, &s);
    if (err < 0) return err;
    FILE *f = fopen(path, "w");
    if (!f) {
        err = hs__err(HS_EIO, "%s: cannot create: %s", path, strerror(errno));
        free(s);
        return err;
    }
    size_t len = strlen(s);
    int bad = fwrite(s, 1, len, f) != len;
    bad |= fclose(f) != 0;
    free(s);
    if (bad) return hs__err(HS_EIO, "%s: write failed: %s", path, strerror(errno));
    return 0;
}
