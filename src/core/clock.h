/* Seconds on the host's monotonic clock, for deadlines and durations (never the wall clock,
 * which steps). One definition for the library and the CLI. */
#ifndef HS_CORE_CLOCK_H
#define HS_CORE_CLOCK_H

#include <time.h>

static inline double hs__mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#endif
