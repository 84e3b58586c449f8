/* --config FILE: a whole run as JSON, turned into command-line options that flags override. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

/* Files larger than this are not configurations. */
#define CONFIG_MAX (1 << 20)

static const hs_cli_opt *find_opt(const hs_cli_opt *const *tables, const char *name) {
    for (int t = 0; tables[t]; t++)
        for (const hs_cli_opt *o = tables[t]; o->name; o++)
            if (!strcmp(o->name, name)) return o;
    return NULL;
}

static char *xstrdup(const char *s) {
    char *d = strdup(s);
    if (!d) {
        fprintf(stderr, "hearsay: out of memory\n");
        exit(HS_EXIT_FAIL);
    }
    return d;
}

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = malloc(CONFIG_MAX + 1);
    size_t n = buf ? fread(buf, 1, CONFIG_MAX + 1, f) : 0;
    fclose(f);
    if (!buf || n > CONFIG_MAX) {
        free(buf);
        errno = EFBIG;
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

int hs__cli_expand_config(int *argc, char ***argv, const hs_cli_opt *const *tables) {
    int at = -1;
    const char *path = NULL;
    for (int i = 1; i < *argc; i++) {
        if (!strcmp((*argv)[i], "--")) break;
        if (!strcmp((*argv)[i], "--config")) {
            if (i + 1 >= *argc) return hs__cli_usage_error("option '--config' needs a value");
            at = i;
            path = (*argv)[i + 1];
            break;
        }
        if (!strncmp((*argv)[i], "--config=", 9)) {
            at = i;
            path = (*argv)[i] + 9;
            break;
        }
    }
    if (at < 0) return 0;
    int skip = strchr((*argv)[at], '=') ? 1 : 2;
    size_t len;
    char *text = read_file(path, &len);
    if (!text) return hs__cli_usage_error("--config %s: %s", path, strerror(errno));
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return hs__cli_usage_error("--config %s: not a JSON object", path);
    }
    int cap = *argc + 2 * cJSON_GetArraySize(root) + 1, n = 0;
    char **out = calloc((size_t)cap, sizeof(char *));
    if (!out) {
        cJSON_Delete(root);
        return hs__cli_usage_error("out of memory");
    }
    out[n++] = (*argv)[0];
    int rc = 0;
    for (cJSON *it = root->child; it && rc == 0; it = it->next) {
        const hs_cli_opt *o = it->string ? find_opt(tables, it->string) : NULL;
        if (!o || !strcmp(it->string, "config")) {
            rc = hs__cli_usage_error("--config %s: unknown key \"%s\" (keys are the long options of "
                                    "hearsay %s --help)", path, it->string ? it->string : "",
                                    hs__cli_cmd);
            break;
        }
        char opt[128], val[1024];
        snprintf(opt, sizeof(opt), "--%s", o->name);
        if (cJSON_IsNull(it) || cJSON_IsFalse(it)) continue;
        if (!o->arg) {
            if (!cJSON_IsTrue(it))
                rc = hs__cli_usage_error("--config %s: \"%s\" is a switch: true or false", path, o->name);
            else
                out[n++] = xstrdup(opt);
            continue;
        }
        if (cJSON_IsString(it)) {
            if (strlen(it->valuestring) >= sizeof(val)) {
                rc = hs__cli_usage_error("--config %s: the value of \"%s\" is longer than %zu "
                                        "characters", path, o->name, sizeof(val) - 1);
                break;
            }
            snprintf(val, sizeof(val), "%s", it->valuestring);
        } else if (cJSON_IsNumber(it)) {
            double d = it->valuedouble;
            if (d == (double)(long long)d)
                snprintf(val, sizeof(val), "%lld", (long long)d);
            else
                snprintf(val, sizeof(val), "%.17g", d);
        } else if (cJSON_IsArray(it)) {
            size_t o2 = 0;
            val[0] = '\0';
            for (cJSON *e = it->child; e && rc == 0; e = e->next) {
                if (!cJSON_IsNumber(e) && !cJSON_IsString(e)) {
                    rc = hs__cli_usage_error("--config %s: \"%s\" holds a list of numbers or strings",
                                            path, o->name);
                    break;
                }
                double dv = cJSON_IsNumber(e) ? e->valuedouble : 0;
                int w = !cJSON_IsNumber(e)
                            ? snprintf(val + o2, sizeof(val) - o2, "%s%s", o2 ? "," : "", e->valuestring)
                        : dv == (double)(long long)dv
                            ? snprintf(val + o2, sizeof(val) - o2, "%s%lld", o2 ? "," : "", (long long)dv)
                            : snprintf(val + o2, sizeof(val) - o2, "%s%.17g", o2 ? "," : "", dv);
                if (w < 0 || (size_t)w >= sizeof(val) - o2) {
                    rc = hs__cli_usage_error("--config %s: \"%s\" is too long", path, o->name);
                    break;
                }
                o2 += (size_t)w;
            }
        } else {
            rc = hs__cli_usage_error("--config %s: \"%s\" must be a string, a number or a list",
                                    path, o->name);
        }
        if (rc == 0) {
            out[n++] = xstrdup(opt);
            out[n++] = xstrdup(val);
        }
    }
    cJSON_Delete(root);
    if (rc < 0) {
        free(out);
        return rc;
    }
    for (int i = 1; i < *argc; i++)
        if (i < at || i >= at + skip) out[n++] = (*argv)[i];
    out[n] = NULL;
    *argc = n;
    *argv = out;
    return 0;
}
