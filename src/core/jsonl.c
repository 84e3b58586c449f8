/* JSON-lines writer; keys and string values are escaped. */
#include "core/jsonl.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <string.h>

#include "core/error_internal.h"

int hs_jsonl_open(hs_jsonl *j, const char *path, int append) {
    memset(j, 0, sizeof(*j));
    if (!strcmp(path, "-")) {
        j->f = stdout;
        return 0;
    }
    j->f = fopen(path, append ? "a" : "w");
    if (!j->f) return hs__err(HS_EIO, "metrics file %s: %s", path, strerror(errno));
    return 0;
}

void hs_jsonl_close(hs_jsonl *j) {
    if (j->f && j->f != stdout) fclose(j->f);
    j->f = NULL;
}

static void put(hs_jsonl *j, const char *fmt, ...) {
    if (j->overflow) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(j->line + j->len, sizeof(j->line) - j->len, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof(j->line) - j->len) j->overflow = 1;
    else j->len += (size_t)n;
}

static void put_escaped(hs_jsonl *j, const char *s) {
    put(j, "\"");
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') put(j, "\\%c", c);
        else if (c < 0x20) put(j, "\\u%04x", c);
        else put(j, "%c", c);
    }
    put(j, "\"");
}

static void key(hs_jsonl *j, const char *k) {
    if (!j->first) put(j, ",");
    j->first = 0;
    put_escaped(j, k);
    put(j, ":");
}

void hs_jsonl_begin(hs_jsonl *j) {
    j->len = 0;
    j->first = 1;
    j->overflow = 0;
    put(j, "{");
}

void hs_jsonl_str(hs_jsonl *j, const char *k, const char *v) {
    key(j, k);
    put_escaped(j, v ? v : "");
}

void hs_jsonl_int(hs_jsonl *j, const char *k, long long v) {
    key(j, k);
    put(j, "%lld", v);
}

void hs_jsonl_num(hs_jsonl *j, const char *k, double v) {
    key(j, k);
    if (isfinite(v)) put(j, "%.9g", v);
    else put(j, "null");
}

void hs_jsonl_bool(hs_jsonl *j, const char *k, int v) {
    key(j, k);
    put(j, v ? "true" : "false");
}

int hs_jsonl_end(hs_jsonl *j) {
    put(j, "}\n");
    if (!j->f) return 0;
    if (j->overflow) return hs__err(HS_EOVERFLOW, "metrics line longer than %zu bytes", sizeof(j->line));
    if (fwrite(j->line, 1, j->len, j->f) != j->len || fflush(j->f) != 0)
        return hs__err(HS_EIO, "metrics file: write failed: %s", strerror(errno));
    return 0;
}
