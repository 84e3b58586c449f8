/* A fixed set of worker threads that run one function on every lane of a pool at once, the
 * caller's thread running lane 0. Used by the CPU backend to split a training batch.
 * Threading: one thread at a time calls hs__pool_run on a pool; the workers only run the
 * function they are handed and sleep between runs (no thread is created per run). */
#ifndef HS_CORE_POOL_H
#define HS_CORE_POOL_H

typedef struct hs__pool hs__pool;

/* Runs lane `lane` of a job; what it computes and where it reports errors is up to arg. */
typedef void (*hs__pool_fn)(void *arg, int lane);

/* A pool of `lanes` lanes (1..HS__POOL_MAX_LANES): lanes - 1 worker threads. HS_EINVAL for a
 * count out of range, HS_ENOMEM when a thread cannot be started (those started are joined). */
#define HS__POOL_MAX_LANES 1024
int hs__pool_new(hs__pool **out, int lanes);

/* Stops and joins the workers; accepts NULL. No run may be in progress. */
void hs__pool_free(hs__pool *p);

int hs__pool_lanes(const hs__pool *p);

/* Calls fn(arg, k) for every k in [0, lanes), lane 0 on the calling thread, and returns when
 * all have returned. Everything written before the call is visible to every lane, and
 * everything a lane wrote is visible to the caller after it. */
void hs__pool_run(hs__pool *p, hs__pool_fn fn, void *arg);

#endif
