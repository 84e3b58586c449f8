/* A writer of JSON-lines metrics files: one object per line, flushed per line so a crash or
 * Ctrl-C loses at most the line being written. Not thread-safe per object. */
#ifndef HS_CORE_JSONL_H
#define HS_CORE_JSONL_H

#include <stdint.h>
#include <stdio.h>

typedef struct hs_jsonl {
    FILE *f;
    char line[4096];
    size_t len;
    int first;
    int overflow;
} hs_jsonl;

/* Opens path for appending (append = 1) or truncates it. "-" writes to stdout. Errors name the
 * path. */
int hs_jsonl_open(hs_jsonl *j, const char *path, int append);
void hs_jsonl_close(hs_jsonl *j); /* accepts a zeroed or closed object */

void hs_jsonl_begin(hs_jsonl *j);
void hs_jsonl_str(hs_jsonl *j, const char *key, const char *v);
void hs_jsonl_int(hs_jsonl *j, const char *key, long long v);
/* Non-finite values are written as null (JSON has no NaN). */
void hs_jsonl_num(hs_jsonl *j, const char *key, double v);
void hs_jsonl_bool(hs_jsonl *j, const char *key, int v);
/* Ends the object, writes the line and flushes. */
int hs_jsonl_end(hs_jsonl *j);

#endif
