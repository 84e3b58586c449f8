/* The live view of a launch (launch_view.h): the peers' JSON-lines metrics files followed as
 * they grow, one table (a terminal) or one line (a log), and the plots at the end. */
#include "cli/launch_view.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hs_config.h"

static double num(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

/* Reads the lines appended to one metrics file since the last call. */
static void follow(hs__lview_peer *p) {
    FILE *f = fopen(p->file, "r");
    if (!f) return;
    if (fseek(f, p->off, SEEK_SET) != 0) {
        fclose(f);
        return;
    }
    char line[8192];
    while (fgets(line, sizeof(line), f)) {
        size_t len = strlen(line);
        if (!len || line[len - 1] != '\n') break; /* a line being written: read it next time */
        p->off += (long)len;
        cJSON *o = cJSON_Parse(line);
        if (!o) continue;
        double v;
        if (!isnan(v = num(o, "peer"))) p->id = (int)v;
        const cJSON *ev = cJSON_GetObjectItemCaseSensitive(o, "event");
        if (cJSON_IsString(ev)) {
            p->done = 1;
            if (!strcmp(ev->valuestring, "diverged")) {
                const cJSON *why = cJSON_GetObjectItemCaseSensitive(o, "reason");
                const cJSON *adv = cJSON_GetObjectItemCaseSensitive(o, "advice");
                p->diverged = 1;
                p->diverged_round = num(o, "round");
                snprintf(p->reason, sizeof(p->reason), "%s",
                         cJSON_IsString(why) ? why->valuestring : "no reason given");
                snprintf(p->advice, sizeof(p->advice), "%s",
                         cJSON_IsString(adv) ? adv->valuestring : "");
            }
            p->final_acc = num(o, "test_acc");
            if (!isnan(v = num(o, "bytes_sent"))) p->bytes = (long long)v;
        } else {
            if (!isnan(v = num(o, "round"))) p->round = v;
            if (!isnan(v = num(o, "epoch"))) p->epoch = v;
            if (!isnan(v = num(o, "loss"))) p->loss = v;
            if (!isnan(v = num(o, "test_acc"))) p->acc = v;
            if (!isnan(v = num(o, "bytes_sent"))) {
                p->mb = v / 1e6;
                p->bytes = (long long)v;
            }
            if (!isnan(v = num(o, "rounds_per_s"))) p->rate = v;
            if (!isnan(v = num(o, "consensus"))) p->consensus = v;
            if (!isnan(v = num(o, "time"))) p->time = v;
        }
        cJSON_Delete(o);
    }
    fclose(f);
}

int hs__lview_scan(const char *dir, hs__lview_peer *pv, int *npv, int cap) {
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            if (strncmp(e->d_name, "peer-", 5) || !strstr(e->d_name, ".jsonl")) continue;
            char path[512];
            if (snprintf(path, sizeof(path), "%s/%s", dir, e->d_name) >= (int)sizeof(path)) continue;
            int known = 0;
            for (int i = 0; i < *npv && !known; i++) known = !strcmp(pv[i].file, path);
            if (known || *npv >= cap) continue;
            hs__lview_peer *p = &pv[(*npv)++];
            memset(p, 0, sizeof(*p));
            snprintf(p->file, sizeof(p->file), "%s", path);
            p->id = atoi(e->d_name + 5);
            p->acc = p->loss = p->epoch = p->consensus = p->final_acc = NAN;
        }
        closedir(d);
    }
    for (int i = 0; i < *npv; i++) follow(&pv[i]);
    /* By id, for a stable table. */
    for (int i = 0; i < *npv; i++)
        for (int j = i + 1; j < *npv; j++)
            if (pv[j].id < pv[i].id) {
                hs__lview_peer t = pv[i];
                pv[i] = pv[j];
                pv[j] = t;
            }
    return 0;
}

int hs__lview_draw(const hs__lview_peer *pv, int npv, int n, int running, int tty, int drawn,
                   double wall) {
    if (tty && drawn) printf("\033[%dA", drawn);
    int lines = 0;
    double acc_sum = 0, acc_min = 1, cons = 0, mb = 0;
    int nacc = 0, ncons = 0;
    for (int i = 0; i < npv; i++) {
        double a = pv[i].done && !isnan(pv[i].final_acc) ? pv[i].final_acc : pv[i].acc;
        if (!isnan(a)) {
            acc_sum += a;
            acc_min = a < acc_min ? a : acc_min;
            nacc++;
        }
        if (!isnan(pv[i].consensus)) {
            cons += pv[i].consensus;
            ncons++;
        }
        mb += pv[i].mb;
    }
    if (tty) {
        printf("\033[K%-6s %8s %7s %8s %9s %9s %9s %11s\n", "peer", "round", "epoch", "loss",
               "test acc", "MB sent", "rounds/s", "consensus");
        lines++;
        for (int i = 0; i < npv; i++) {
            const hs__lview_peer *p = &pv[i];
            char acc[16] = "-";
            double a = p->done && !isnan(p->final_acc) ? p->final_acc : p->acc;
            if (!isnan(a)) snprintf(acc, sizeof(acc), "%.2f%%", 100 * a);
            /* A node API job reports no epoch or loss (the script owns its training). */
            char epoch[16] = "-", loss[16] = "-";
            if (!isnan(p->epoch)) snprintf(epoch, sizeof(epoch), "%.2f", p->epoch);
            if (!isnan(p->loss)) snprintf(loss, sizeof(loss), "%.4f", p->loss);
            printf("\033[K%-6d %8.0f %7s %8s %9s %9.2f %9.1f %11.3g%s\n", p->id, p->round, epoch,
                   loss, acc, p->mb, p->rate, p->consensus,
                   p->diverged ? "  diverged" : p->done ? "  done" : "");
            lines++;
        }
        char accs[64] = "test acc -";
        if (nacc)
            snprintf(accs, sizeof(accs), "test acc mean %.2f%% min %.2f%%", 100 * acc_sum / nacc,
                     100 * acc_min);
        printf("\033[K%d/%d peers running, %d reporting; %s; mean consensus %.3g; %.1f MB sent; "
               "%.0f s\n",
               running, n, npv, accs, ncons ? cons / ncons : NAN, mb, wall);
        lines++;
    } else {
        double round = 0;
        for (int i = 0; i < npv; i++) round = pv[i].round > round ? pv[i].round : round;
        printf("[%.0f s] %d/%d peers running, round %.0f", wall, running, n, round);
        if (nacc) printf(", test acc mean %.2f%% min %.2f%%", 100 * acc_sum / nacc, 100 * acc_min);
        printf(", consensus %.3g, %.1f MB sent", ncons ? cons / ncons : NAN, mb);
        int div = 0;
        for (int i = 0; i < npv; i++) div += pv[i].diverged;
        if (div) printf(", %d diverged", div);
        printf("\n");
    }
    fflush(stdout);
    return lines;
}

/* The plotting script: from the environment, the source tree, or beside the binary. */
static int find_plot(char *out, size_t cap) {
    const char *env = getenv("HEARSAY_PLOT");
    if (env && access(env, X_OK) == 0) return snprintf(out, cap, "%s", env), 0;
    snprintf(out, cap, "%s/tools/plot", HS_SOURCE_ROOT);
    if (access(out, X_OK) == 0) return 0;
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n > 0) {
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) *slash = '\0';
        snprintf(out, cap, "%.3000s/../tools/plot", exe);
        if (access(out, X_OK) == 0) return 0;
    }
    return -1;
}
void hs__lview_plot(const char *dir) {
    char plot[4096];
    if (find_plot(plot, sizeof(plot)) != 0) {
        printf("hearsay launch: no plots (tools/plot not found; set HEARSAY_PLOT)\n");
    } else if (system("command -v gnuplot >/dev/null 2>&1") != 0) {
        printf("hearsay launch: no plots (gnuplot is not installed: apt-get install gnuplot-nox)\n");
    } else {
        char cmd[9000];
        snprintf(cmd, sizeof(cmd), "'%s' '%s' >/dev/null 2>&1", plot, dir);
        if (system(cmd) == 0) printf("plots: %s/plots/\n", dir);
        else printf("hearsay launch: plotting failed (%s %s)\n", plot, dir);
    }
    fflush(stdout);
}
