/* Resident memory of this test process, for the memory tests of SGP's shares, and whether a
 * sanitizer is built in (its allocator keeps freed blocks resident, so those tests are left out
 * under one: left out rather than skipped, since cmocka's TAP output writes a skip as
 * "not ok # SKIP", which meson counts as a failure). */
#ifndef HS_TEST_RESIDENT_H
#define HS_TEST_RESIDENT_H

#include <stdio.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define SANITIZED 1
#endif
#endif
#ifndef SANITIZED
#define SANITIZED 0
#endif

/* Resident bytes of this process. */
static inline double rss(void) {
    long pages = 0, res = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f && fscanf(f, "%ld %ld", &pages, &res) != 2) res = 0;
    if (f) fclose(f);
    return (double)res * (double)sysconf(_SC_PAGESIZE);
}

#endif
